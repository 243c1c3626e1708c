"""GET /metrics: what the gateway decides and what its engines do, in Prometheus text format.

Two kinds of metric, in one registry per app (never the process-global one, so several apps
in one process do not collide):

- live state, read at scrape time from the app's state by `LiveCollector` (no bookkeeping
  that could drift): KV blocks, running and queued requests, and the counters that
  admission, routing, quotas and the engines already keep;
- request outcomes and latencies, counted by the lifecycle's hooks (`Metrics.not_started`,
  `admitted`, `finished`): histograms per model, SLO attainment per class, usage per user and
  team.

Label values come from bounded sets only: configured model names, admission and quota reason
labels, SLO classes, routing decisions, outcomes, and at most `metrics.max_users` users (the
rest are `other`). No request id, user agent or client text ever becomes a label.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.settings import MetricsSettings

if TYPE_CHECKING:
    from gateway.lifecycle.job import Job
    from gateway.state import AppState

OTHER_USER = "other"
NO_TEAM = "none"

# Seconds: from a queue slot of milliseconds to a document's minutes.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300, 600)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1)
TOKEN_BUCKETS = (1, 8, 32, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)

# Outcomes of `sparkgate_requests_total` (every request that reached the run phase ends in one).
COMPLETED, FAILED, CLIENT_LEFT = "completed", "failed", "client_left"
LEFT_QUEUED, REJECTED_ADMISSION, REJECTED_QUOTA = "client_left_queued", "rejected_admission", "rejected_quota"
QUOTA_UNAVAILABLE, CANCELLED = "quota_unavailable", "cancelled"


class UserLabels:
    """The `user` label: the first `limit` distinct users by name, everyone after as `other`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._known: set[str] = set()

    def __call__(self, user: str) -> str:
        if user in self._known:
            return user
        if len(self._known) < self.limit:
            self._known.add(user)
            return user
        return OTHER_USER


class Metrics:
    """One app's registry, its request-outcome metrics and the hooks that update them."""

    def __init__(self, settings: MetricsSettings) -> None:
        self.settings = settings
        self.registry = CollectorRegistry()
        self.user = UserLabels(settings.max_users)
        self.team = UserLabels(settings.max_users)
        r = self.registry
        self.requests = Counter(
            "sparkgate_requests",
            "Requests that reached the run phase, by how they ended.",
            ["model", "outcome"],
            registry=r,
        )
        self.queue_wait = Histogram(
            "sparkgate_queue_wait_seconds",
            "Admission queue wait of admitted requests.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "sparkgate_ttft_seconds",
            "From the run's start (quota, routing hold, queue) to the first output token.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "sparkgate_tpot_seconds",
            "Time per output token after the first (completed requests).",
            ["model"],
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "sparkgate_e2e_seconds",
            "From the run's start to the last output token (completed requests).",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Histogram(
            "sparkgate_prompt_tokens",
            "Prompt tokens of completed requests.",
            ["model"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.output_tokens = Histogram(
            "sparkgate_output_tokens",
            "Output tokens of completed requests.",
            ["model"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.slo = Counter(
            "sparkgate_slo_requests",
            "Routed, completed requests by SLO class: objectives attained or missed.",
            ["slo_class", "outcome"],
            registry=r,
        )
        self.slo_missed = Counter(
            "sparkgate_slo_objective_missed",
            "Objectives missed by routed, completed requests.",
            ["slo_class", "objective"],
            registry=r,
        )
        self.user_requests = Counter(
            "sparkgate_user_requests", "Requests charged to a user (they reached the engine).", ["user"], registry=r
        )
        self.user_tokens = Counter("sparkgate_user_tokens", "Tokens charged to a user.", ["user", "type"], registry=r)
        self.team_requests = Counter("sparkgate_team_requests", "Requests charged to a team.", ["team"], registry=r)
        self.team_tokens = Counter("sparkgate_team_tokens", "Tokens charged to a team.", ["team", "type"], registry=r)

    def bind(self, state: AppState) -> None:
        """Read the app's live state at every scrape."""
        self.registry.register(LiveCollector(state))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # -- the lifecycle's hooks -------------------------------------------------------------

    def not_started(self, job: Job, outcome: str) -> None:
        """The job ended before it was admitted (refused by its quota or admission, or left)."""
        self.requests.labels(job.served.name, outcome).inc()

    def admitted(self, job: Job, waited_s: float) -> None:
        self.queue_wait.labels(job.served.name).observe(waited_s)

    def finished(self, job: Job, outcome: str, slo: Any = None) -> None:
        """An admitted job's answer ended (`outcome`); `slo`: its SLO class's objectives."""
        model = job.served.name
        m = job.meter
        self.requests.labels(model, outcome).inc()
        charged = m.prompt_tokens + m.completion_tokens
        if charged > 0:  # what the quota charges (a request that never reached the engine is free)
            user = self.user(job.principal.name)
            self.user_requests.labels(user).inc()
            self.user_tokens.labels(user, "prompt").inc(m.prompt_tokens)
            self.user_tokens.labels(user, "completion").inc(m.completion_tokens)
            team = self.team(job.principal.team) if job.principal.team is not None else NO_TEAM
            self.team_requests.labels(team).inc()
            self.team_tokens.labels(team, "prompt").inc(m.prompt_tokens)
            self.team_tokens.labels(team, "completion").inc(m.completion_tokens)
        if m.started is None or m.first_token is None:
            return
        ttft = m.first_token - m.started
        self.ttft.labels(model).observe(ttft)
        if outcome != COMPLETED or m.last_token is None:
            return
        e2e = m.last_token - m.started
        per_sequence = m.completion_tokens / max(1, job.n * len(job.requests))
        tpot = (m.last_token - m.first_token) / (per_sequence - 1) if per_sequence > 1 else 0.0
        self.e2e.labels(model).observe(e2e)
        if per_sequence > 1:
            self.tpot.labels(model).observe(tpot)
        self.prompt_tokens.labels(model).observe(m.prompt_tokens)
        self.output_tokens.labels(model).observe(m.completion_tokens)
        if job.route is None or slo is None:
            return
        missed = []
        if slo.ttft_s is not None and ttft > slo.ttft_s:
            missed.append("ttft")
        if slo.tpot_s is not None and per_sequence > 1 and tpot > slo.tpot_s:
            missed.append("tpot")
        if slo.deadline_s is not None and e2e > slo.deadline_s:
            missed.append("deadline")
        self.slo.labels(job.route.slo, "missed" if missed else "attained").inc()
        for objective in missed:
            self.slo_missed.labels(job.route.slo, objective).inc()


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
