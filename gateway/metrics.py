"""GET /metrics: what the gateway decides and what its engines do, in Prometheus text format.

Two kinds of metric, in one registry per app (never the process-global one, so several apps
in one process do not collide):

- live state, read at scrape time from the app's state by `LiveCollector`
  (gateway/http/metrics.py; no bookkeeping
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

from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from gateway.settings import MetricsSettings

if TYPE_CHECKING:
    from gateway.job import Job

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
