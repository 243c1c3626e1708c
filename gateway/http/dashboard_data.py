"""The dashboard's data (GET /sparkgate/dashboard/data), built from the gateway's state and
its rings of recent requests (gateway/dashboard.py) on each poll."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from gateway.dashboard import ATTAINMENT_MINUTES, meets
from gateway.errors import GatewayError
from gateway.redaction import redacted_url
from gateway.state import AppState


def _round(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)


def _models(state: AppState) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in state.registry:
        spec = m.engine.kv_spec
        stats = m.engine.stats()
        pool = state.admission.snapshot(m.name)
        out.append(
            {
                "name": m.name,
                "healthy": m.engine.is_healthy,
                "block_size": spec.block_size,
                "kv": {
                    "pool_blocks": pool.capacity_blocks,  # what admission may hand out
                    "ledger_blocks": pool.used_blocks,  # reserved by admitted requests (worst case)
                    "shared_blocks": pool.shared_blocks,
                    "engine_blocks": round(stats.kv_cache_usage * spec.usable_blocks),  # in use now
                    "engine_usage": round(stats.kv_cache_usage, 4),
                },
                "running": {
                    "ledger": pool.running_sequences,
                    "engine": stats.running,
                    "max": pool.max_sequences,
                },
                "queued": {"gateway": pool.queued, "engine": stats.waiting, "tokens": pool.queued_tokens},
                "in_flight": state.counters.by_model_inflight.get(m.name, 0),
                "generation_tokens": stats.generation_tokens,
                "preemptions": stats.preemptions,
                # The canary found its cached answers wrong (gateway/canary.py): aliases avoid it.
                "degraded": m.name in state.canary.degraded(),
            }
        )
    return out


def _slo(state: AppState, now: float) -> dict[str, Any]:
    classes = state.settings.routing.classes if state.settings.routing.enabled else {}
    recent = []
    minutes: dict[str, list[dict[str, int]]] = {}
    start = now - ATTAINMENT_MINUTES * 60
    for f in state.recent.finished:
        met = meets(f, classes.get(f.slo) if f.slo is not None else None)
        recent.append(
            {
                "at": round(f.at, 3),
                "model": f.model,
                "user": f.user,
                "slo": f.slo,
                "ttft_s": _round(f.ttft_s),
                "tpot_s": _round(f.tpot_s, 5),
                "total_s": _round(f.total_s),
                "completion_tokens": f.completion_tokens,
                "returned": f.returned,
                "met": met,
            }
        )
        if met is None or f.at < start or f.slo is None:
            continue
        buckets = minutes.setdefault(f.slo, [{"met": 0, "total": 0} for _ in range(ATTAINMENT_MINUTES)])
        b = buckets[min(ATTAINMENT_MINUTES - 1, int((f.at - start) // 60))]
        b["total"] += 1
        b["met"] += int(met)
    attainment = {
        name: {
            "met": sum(b["met"] for b in buckets),
            "total": sum(b["total"] for b in buckets),
            "per_minute": buckets,  # oldest first; the last is the current minute
        }
        for name, buckets in minutes.items()
    }
    return {
        "classes": {
            name: {"ttft_s": c.ttft_s, "tpot_s": c.tpot_s, "deadline_s": c.deadline_s} for name, c in classes.items()
        },
        "window_minutes": ATTAINMENT_MINUTES,
        "attainment": attainment,
        "recent": recent[-200:],
    }


async def _users(state: AppState) -> tuple[list[dict[str, Any]], str | None]:
    """Tokens today per user against the daily budgets of the user's keys."""
    try:
        records = [*state.keys.configured, *await state.quota.list_keys()]
    except GatewayError as e:  # the quota store is away
        return [], e.message
    users: dict[str, dict[str, Any]] = {}
    for r in records:
        if r.revoked_at is not None:
            continue
        limits = state.keys.principal(r.id, r.user, r.team, r.limits).limits
        u = users.setdefault(r.user, {"user": r.user, "teams": set(), "keys": 0, "budgets": []})
        u["keys"] += 1
        if r.team is not None:
            u["teams"].add(r.team)
        u["budgets"].append(limits.daily_tokens)
    out: list[dict[str, Any]] = []
    for name, u in sorted(users.items()):
        try:
            usage = await state.quota.usage(f"user:{name}")
        except GatewayError as e:
            return out, e.message
        budgets = u["budgets"]
        out.append(
            {
                "user": name,
                "teams": sorted(u["teams"]),
                "keys": u["keys"],
                "tokens_today": usage.day.used,
                "reserved_today": usage.day.reserved_tokens,
                "requests_today": usage.day.requests,
                # The sum of the keys' daily budgets; None when a key has none (unlimited).
                "daily_budget": None if any(b is None for b in budgets) else sum(budgets),
                "in_flight": usage.live,
            }
        )
    return out, None


def _quota(state: AppState) -> dict[str, Any]:
    q = state.quota
    url = redacted_url(q.settings.redis_url) if q.shared else None  # never show a password
    status = "memory" if not q.shared else ("down" if q.is_down else "up")
    return {
        "store": q.settings.store,
        "status": status,
        "redis_url": url,
        "on_outage": q.settings.on_outage,
        "holds": q.snapshot()["holds"],
        "outbox": q.snapshot()["outbox"],
        "outages": q.metrics.outages,
        "refused": dict(q.metrics.refused),
    }


async def data(state: AppState) -> dict[str, Any]:
    """Everything the dashboard draws, now."""
    now = time.time()
    users, users_error = await _users(state)
    c, a = state.counters, state.admission.metrics
    return {
        "now": now,
        "counters": {"requests": c.requests, "completed": c.completed, "failed": c.failed},
        "admission": {"admitted": a.admitted, "queued": a.queued, "rejected": dict(a.rejected)},
        "routing": None if state.router is None else state.router.snapshot(),
        "models": _models(state),
        "slo": _slo(state, now),
        "users": users,
        "users_error": users_error,
        "rejections": [dataclasses.asdict(r) for r in reversed(state.recent.rejections)],
        "quota": _quota(state),
        # Each model's last canary result, where one ran (gateway/canary.py).
        "canary": {m.name: v for m in state.registry if (v := state.canary.view(m.name)) is not None},
        # The memory guard (gateway/host_memory.py); None without box.min_free.
        "host_memory": None if state.memory is None else state.memory.view(),
    }
