"""GET /health (no auth: for load balancers) and GET /sparkgate/stats (auth)."""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from gateway.http.deps import Caller, State

router = APIRouter()


@router.get("/health")
async def health(state: State) -> JSONResponse:
    models = {m.name: ("ok" if m.engine.is_healthy else "unavailable") for m in state.registry}
    healthy = all(v == "ok" for v in models.values())
    return JSONResponse(
        {"status": "ok" if healthy else "degraded", "models": models},
        status_code=200 if healthy else 503,
    )


@router.get("/sparkgate/stats")
async def stats(state: State, caller: Caller) -> dict[str, Any]:
    engines = {}
    for m in state.registry:
        engines[m.name] = {
            "stats": dataclasses.asdict(m.engine.stats()),
            "kv": dataclasses.asdict(m.engine.kv_spec),
            "inflight": state.counters.by_model_inflight.get(m.name, 0),
            "admission": dataclasses.asdict(state.admission.snapshot(m.name)),
            "tokenizer": getattr(m.tokenizer, "backend", "huggingface"),
        }
    c = state.counters
    a = state.admission.metrics
    return {
        "requests": c.requests,
        "completed": c.completed,
        "failed": c.failed,
        "client_disconnects": c.client_disconnects,
        "admission": {
            "admitted": a.admitted,
            "queued": a.queued,
            "released": a.released,
            "rejected": dict(a.rejected),
            "queue_wait_s_total": a.queue_wait_s_total,
            "queue_wait_s_max": a.queue_wait_s_max,
            "kv_mispredicted_blocks": a.kv_mispredicted_blocks,
            "kv_refunded_blocks": a.kv_refunded_blocks,
        },
        "quota": state.quota.snapshot(),
        "routing": None if state.router is None else state.router.snapshot(),
        "engines": engines,
    }
