"""GET /metrics: Prometheus text format (gateway/metrics.py), with the app's live state read
at each scrape (`LiveCollector`, registered by `bind`).

Access: with `metrics.token` unset, only loopback clients may scrape (no key); with it set,
anyone presenting `Authorization: Bearer <token>`, and nobody without it. The token is
compared in constant time and its failures count toward the client's failed-auth block. The route exists
only when `metrics.enabled` (else 404, like any unknown path).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Iterable, Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.auth import bearer
from gateway.errors import AuthenticationFailed, PermissionDenied
from gateway.http.deps import State, client_address
from gateway.metrics import Metrics
from gateway.state import AppState

router = APIRouter()


def _loopback(request: Request) -> bool:
    host = request.client.host if request.client is not None else ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@router.get("/metrics", include_in_schema=False)
async def metrics(state: State, request: Request, authorization: Annotated[str | None, Header()] = None) -> Response:
    m = state.metrics
    assert m is not None  # the route is mounted only when metrics are enabled
    token = m.settings.token
    if token is not None:

        async def check() -> None:
            # Digests of equal length: the comparison's time tells nothing, not even the length.
            given = hashlib.sha256(bearer(authorization).encode()).digest()
            if not hmac.compare_digest(given, hashlib.sha256(token.encode()).digest()):
                raise AuthenticationFailed("A valid metrics token is required: Authorization: Bearer <metrics.token>.")

        await state.failed_auth.guarded(client_address(request), check)
    elif not _loopback(request):
        raise PermissionDenied("/metrics is served to loopback clients only unless metrics.token is set.")
    return Response(m.render(), media_type=CONTENT_TYPE_LATEST)


def bind(metrics: Metrics, state: AppState) -> None:
    """Read the app's live state at every scrape."""
    metrics.registry.register(LiveCollector(state))


def _gauge(name: str, doc: str, labels: list[str], values: Iterable[tuple[list[str], float]]) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=labels)
    for lv, v in values:
        g.add_metric(lv, v)
    return g


def _counter(name: str, doc: str, labels: list[str], values: Iterable[tuple[list[str], float]]) -> CounterMetricFamily:
    c = CounterMetricFamily(name, doc, labels=labels)
    for lv, v in values:
        c.add_metric(lv, v)
    return c


def _engine_families(engine: Any) -> list[Metric]:
    """The engine's own Prometheus metrics (vLLM's `vllm:*`), when it has any."""
    while hasattr(engine, "inner"):  # a paced engine wraps the real one
        engine = engine.inner
    families = getattr(engine, "metric_families", None)
    return list(families()) if families is not None else []


class LiveCollector(Collector):
    """Gauges and counters read from the app's state at scrape time."""

    def __init__(self, state: AppState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        st = self.state
        models = list(st.registry)
        snaps = {m.name: st.admission.snapshot(m.name) for m in models}
        stats = {m.name: m.engine.stats() for m in models}
        by_pool = st.admission.metrics.by_pool
        per = [
            ("sparkgate_kv_pool_blocks", "KV blocks admission may hand out (the engine's pool).", "capacity_blocks"),
            (
                "sparkgate_kv_reserved_blocks",
                "KV blocks the admission ledger holds for admitted requests.",
                "used_blocks",
            ),
            (
                "sparkgate_kv_shared_blocks",
                "Prompt blocks shared through the prefix cache, in the ledger.",
                "shared_blocks",
            ),
            ("sparkgate_running_requests", "Admitted requests (holding KV and slots).", "admitted"),
            ("sparkgate_running_sequences", "Admitted sequences (n per request).", "running_sequences"),
            ("sparkgate_max_sequences", "Sequences the model may run at once.", "max_sequences"),
            ("sparkgate_queued_requests", "Requests waiting in the admission queue.", "queued"),
            ("sparkgate_queued_tokens", "Prompt + max tokens of the queued requests.", "queued_tokens"),
        ]
        for name, doc, attr in per:
            yield _gauge(name, doc, ["model"], (([n], float(getattr(s, attr))) for n, s in snaps.items()))
        yield _gauge(
            "sparkgate_kv_engine_used_blocks",
            "KV blocks the engine reports in use (kv_cache_usage x pool).",
            ["model"],
            (([n], round(stats[n].kv_cache_usage * snaps[n].capacity_blocks)) for n in snaps),
        )
        yield _gauge(
            "sparkgate_engine_running_requests",
            "Requests in the engine's running batch.",
            ["model"],
            (([n], float(s.running)) for n, s in stats.items()),
        )
        yield _gauge(
            "sparkgate_engine_waiting_requests",
            "Requests waiting inside the engine.",
            ["model"],
            (([n], float(s.waiting)) for n, s in stats.items()),
        )
        yield _gauge(
            "sparkgate_engine_up",
            "1 when the model's engine is healthy.",
            ["model"],
            (([m.name], float(m.engine.is_healthy)) for m in models),
        )
        health = st.supervisor.health if st.supervisor is not None else {}
        for name, doc, attr in [
            ("sparkgate_engine_deaths", "Times the model's engine died (or its host became unreachable).", "deaths"),
            ("sparkgate_engine_restarts", "Times the model's engine was restarted and served again.", "restarts"),
        ]:
            yield _counter(
                name,
                doc,
                ["model"],
                (([m.name], float(getattr(health[m.name], attr, 0))) for m in models if m.name in health),
            )
        yield _gauge(
            "sparkgate_inflight_requests",
            "Requests whose answer is being produced.",
            ["model"],
            (([n], float(st.counters.by_model_inflight.get(n, 0))) for n in snaps),
        )
        for name, doc, attr in [
            ("sparkgate_engine_preemptions", "Engine preemptions (admission keeps this at 0).", "preemptions"),
            ("sparkgate_engine_generation_tokens", "Output tokens the engine generated.", "generation_tokens"),
            (
                "sparkgate_prefix_cache_queried_tokens",
                "Prompt tokens looked up in the prefix cache.",
                "prefix_cache_queries",
            ),
            ("sparkgate_prefix_cache_hit_tokens", "Prompt tokens found in the prefix cache.", "prefix_cache_hits"),
        ]:
            yield _counter(name, doc, ["model"], (([n], float(getattr(s, attr))) for n, s in stats.items()))
        for name, doc, event in [
            ("sparkgate_admitted", "Requests admitted to their engine.", "admitted"),
            ("sparkgate_queued", "Requests that had to wait in the admission queue.", "queued"),
            (
                "sparkgate_kv_mispredicted_blocks",
                "Blocks the engine needed beyond the ledger's prediction.",
                "mispredicted_blocks",
            ),
            ("sparkgate_kv_refunded_blocks", "Blocks given back when the engine found more cached.", "refunded_blocks"),
        ]:
            yield _counter(name, doc, ["model"], (([n], float(by_pool[n, event])) for n in snaps))
        yield _counter(
            "sparkgate_admission_rejected",
            "Requests admission turned away, by reason.",
            ["model", "reason"],
            (
                ([pool, ev.removeprefix("rejected:")], float(v))
                for (pool, ev), v in sorted(by_pool.items())
                if ev.startswith("rejected:")
            ),
        )
        yield from self._quota()
        yield from self._auth()
        yield from self._routing()
        yield from self._canary()
        yield from self._memory()
        for m in models:
            yield from _engine_families(m.engine)

    def _quota(self) -> Iterator[Metric]:
        q = self.state.quota
        qm = q.metrics
        yield _counter(
            "sparkgate_quota_rejected",
            "Requests a quota refused (429), by limit.",
            ["reason"],
            (([k], float(v)) for k, v in sorted(qm.refused.items())),
        )
        yield _counter("sparkgate_quota_reserved", "Quota reservations granted.", [], [([], float(qm.reserved))])
        yield _counter(
            "sparkgate_quota_store_outages",
            "Times the shared quota store (Redis) became unreachable.",
            [],
            [([], float(qm.outages))],
        )
        yield _counter(
            "sparkgate_quota_store_outage_seconds",
            "Seconds the shared quota store was unreachable, in all.",
            [],
            [([], q.outage_seconds())],
        )
        yield _gauge(
            "sparkgate_quota_store_up",
            "0 while the shared quota store is unreachable.",
            [],
            [([], 0.0 if q.is_down else 1.0)],
        )
        yield _counter(
            "sparkgate_quota_local_reserves",
            "Reservations served on per-process limits during an outage.",
            [],
            [([], float(qm.local_reserves))],
        )

    def _auth(self) -> Iterator[Metric]:
        table = self.state.failed_auth
        yield _counter(
            "sparkgate_auth_failures",
            "Failed authentications: no key (missing), a wrong one (invalid), refused while blocked.",
            ["reason"],
            (([r], float(table.failures[r])) for r in ("missing", "invalid", "blocked")),
        )
        yield _gauge(
            "sparkgate_auth_blocked_clients",
            "Client addresses blocked now for too many failed authentications.",
            [],
            [([], float(table.blocked_clients))],
        )

    def _memory(self) -> Iterator[Metric]:
        watch = self.state.memory
        if watch is None:  # no box.min_free: no guard
            return
        s = watch.state
        yield _gauge(
            "sparkgate_host_memory_available_bytes",
            "The host's available memory (MemAvailable, what vLLM reads on a unified-memory GPU).",
            [],
            [] if s.available is None else [([], float(s.available))],  # no sample: unreadable
        )
        yield _gauge(
            "sparkgate_host_memory_min_free_bytes",
            "The memory guard's floor (box.min_free): below it no new requests are admitted.",
            [],
            [([], float(watch.limits.floor))],
        )
        yield _gauge(
            "sparkgate_memory_guard_admitting",
            "0 while host memory is below box.min_free and new requests are refused (503/529).",
            [],
            [([], float(s.admitting))],
        )
        yield _counter(
            "sparkgate_memory_guard_stops",
            "Times host memory fell below box.min_free and the gateway stopped admitting.",
            [],
            [([], float(s.stops))],
        )
        yield _counter(
            "sparkgate_memory_guard_refused",
            "Requests refused because host memory was below box.min_free.",
            [],
            [([], float(watch.refused))],
        )

    def _canary(self) -> Iterator[Metric]:
        book = getattr(self.state, "canary", None)  # (the docs generator's empty state has none)
        names = [m.name for m in self.state.registry]
        bad = set() if book is None else book.degraded()
        yield _gauge(
            "sparkgate_model_degraded",
            "1 when the canary found the model answering differently from its prefix cache.",
            ["model"],
            (([n], float(n in bad)) for n in names),
        )
        yield _counter(
            "sparkgate_canary_runs",
            "Canary runs per model, by result (ok, degraded, skipped, error).",
            ["model", "result"],
            (([m, r], float(v)) for (m, r), v in sorted((book.runs if book is not None else {}).items())),
        )

    def _routing(self) -> Iterator[Metric]:
        router = self.state.router
        if router is None:
            return
        yield _counter(
            "sparkgate_route_decisions",
            "Routing decisions: the model chosen and how (or why none).",
            ["model", "decision"],
            (([m, d], float(v)) for (m, d), v in sorted(router.decisions.items())),
        )
