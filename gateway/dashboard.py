"""What the dashboard (/dashboard) shows beyond the live counters: bounded rings of the
requests that finished lately and of the last rejections (the page's data is built from
them and the gateway's state on each poll: gateway/http/dashboard_data.py).

The rings are filled by two small hooks: `Running.release` (gateway/lifecycle/run.py)
records each finished request with its engine-clock timings, and the error handlers
(gateway/http/errors.py) record each error answered to an API request (/v1/...).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.errors import GatewayError

if TYPE_CHECKING:
    from gateway.settings import SloClass

FINISHED_KEPT = 512
REJECTIONS_KEPT = 50
ATTAINMENT_MINUTES = 5  # SLO attainment per minute over the last minutes


@dataclass(frozen=True, slots=True)
class Finished:
    """One request that ran. Durations are in the engine's seconds (a simulated box's
    clock runs at its speed-up), as the SLO objectives are."""

    at: float  # wall clock (epoch seconds) when it ended
    model: str
    user: str
    slo: str | None  # its SLO class (None: routing is off)
    ttft_s: float | None  # arrival to first output (queue and routing hold included)
    tpot_s: float | None  # per output token after the first (None: fewer than 2 tokens)
    total_s: float
    completion_tokens: int
    returned: bool  # the client got the whole answer


@dataclass(frozen=True, slots=True)
class Rejection:
    at: float
    status: int
    code: str | None
    reason: str | None  # the admission or quota reason label, when it is one
    message: str
    path: str
    user: str | None  # None: the caller was not authenticated (yet)


class Recent:
    """Bounded rings of finished requests and rejections (oldest dropped first)."""

    def __init__(self, finished: int = FINISHED_KEPT, rejections: int = REJECTIONS_KEPT) -> None:
        self.finished: deque[Finished] = deque(maxlen=finished)
        self.rejections: deque[Rejection] = deque(maxlen=rejections)

    def add_finished(self, f: Finished) -> None:
        self.finished.append(f)

    def add_rejection(self, err: GatewayError, path: str, user: str | None = None) -> None:
        """An error answered to an API request; the dashboard's own calls are not recorded."""
        if not path.startswith("/v1/"):
            return
        self.rejections.append(Rejection(time.time(), err.status, err.code, err.reason, err.message[:300], path, user))


def finished(
    *,
    model: str,
    user: str,
    slo: str | None,
    arrived: float,
    first: float | None,
    end: float,
    completion_tokens: int,
    choices: int,
    returned: bool,
) -> Finished:
    """A finished request's record from its engine-clock times (arrival, first output, end)."""
    per_choice = completion_tokens // max(1, choices)
    tpot = None if first is None or per_choice < 2 else (end - first) / (per_choice - 1)
    return Finished(
        at=time.time(),
        model=model,
        user=user,
        slo=slo,
        ttft_s=None if first is None else max(0.0, first - arrived),
        tpot_s=tpot,
        total_s=max(0.0, end - arrived),
        completion_tokens=completion_tokens,
        returned=returned,
    )


def meets(f: Finished, objective: SloClass | None) -> bool | None:
    """Did it meet its class's objectives? None: no objective to meet, or it did not finish."""
    if objective is None or not f.returned:
        return None
    checks = [
        (objective.ttft_s, f.ttft_s),
        (objective.tpot_s, f.tpot_s),
        (objective.deadline_s, f.total_s),
    ]
    return all(seen is None or seen <= goal for goal, seen in checks if goal is not None)
