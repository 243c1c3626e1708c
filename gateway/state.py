"""What the running gateway holds, built once by the app's lifespan: no HTTP here, so the
request lifecycle can take it as it is."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.admission import AdmissionControl
from gateway.auth import KeyRing
from gateway.canary_state import Book as CanaryBook
from gateway.dashboard import Recent
from gateway.drain import Drain
from gateway.failed_auth import FailedAuthTable
from gateway.host_memory import MemoryWatch
from gateway.metrics import Metrics
from gateway.quota import QuotaGate
from gateway.registry import ModelRegistry
from gateway.responses_store import MemoryResponseStore, ResponseStore
from gateway.router import Router
from gateway.settings import FailedAuthSettings, Settings
from gateway.supervisor import Supervisor


@dataclass
class Counters:
    """Gateway-side request outcomes, exposed at /sparkgate/stats."""

    requests: int = 0
    completed: int = 0
    failed: int = 0
    client_disconnects: int = 0
    by_model_inflight: dict[str, int] = field(default_factory=dict)


@dataclass
class AppState:
    settings: Settings
    registry: ModelRegistry
    keys: KeyRing
    counters: Counters
    admission: AdmissionControl
    quota: QuotaGate
    router: Router | None = None  # latency-SLO routing (settings.routing.enabled)
    # SIGTERM's drain (gateway/drain.py): while it runs, new requests get 503 and /ready says
    # 503 so load balancers stop sending; it aborts the running requests it tracks.
    drain: Drain = field(default_factory=Drain)
    # Stored responses (/v1/responses); the app's lifespan builds it from the settings.
    responses: ResponseStore = field(default_factory=lambda: MemoryResponseStore(ttl_s=3600, max_stored=1000))
    # The last finished requests and rejections, for /dashboard (gateway/dashboard.py).
    recent: Recent = field(default_factory=Recent)
    metrics: Metrics | None = None  # GET /metrics (settings.metrics.enabled)
    # Failed authentications per client address; the app's lifespan builds it from auth.failed.
    failed_auth: FailedAuthTable = field(default_factory=lambda: FailedAuthTable(FailedAuthSettings()))
    # Engine deaths and restarts (gateway/supervisor.py); the app's lifespan starts it.
    supervisor: Supervisor | None = None
    # What the canary found per model (gateway/canary.py): degraded models are avoided by routing.
    canary: CanaryBook = field(default_factory=CanaryBook)
    # The run-time memory guard (gateway/host_memory.py): None without box.min_free.
    memory: MemoryWatch | None = None

    @property
    def draining(self) -> bool:
        return self.drain.draining
