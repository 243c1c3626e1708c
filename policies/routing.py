"""Which model serves a request: the best one predicted to meet its latency SLO. Pure.

Candidates come ranked by quality (best first, from config) with their latency
predicted under the load right now (policies/latency.py). An alias routes:
`best` / `auto` take the best candidate that meets the SLO, degrading to faster
ones; `fast` takes the fastest. An explicit model name is honoured; only a key
that allows substitution gets another model when that one would miss. When no
candidate can meet the SLO the answer is `NoRoute` with how long to wait, so the
request is turned away before it queues.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from policies.latency import Prediction

# `fast` takes the model done soonest among those that would take at most this share of any
# running request's slack: a long prompt sent where a document is decoding would leave it
# no margin for the next, so another model that meets the SLO is better (docs/routing.md).
MAX_SLACK_TAKEN = 0.5


@dataclass(frozen=True, slots=True)
class Slo:
    """An SLO class: its objectives, and what routing does for it."""

    name: str
    ttft_s: float | None = None  # time to first token
    tpot_s: float | None = None  # time per output token
    deadline_s: float | None = None  # the whole response (batch work)
    prefer: str = "best"  # what `auto` means for it: "best" or "fast" (the strategies of `choose`)
    # Capacity kept from the other classes, which can wait: this many free slots on an engine,
    # and an engine ready for it (policies/load.py). 0: none.
    reserve_slots: int = 0

    def scaled(self, headroom: float) -> Slo:
        """Each objective times `headroom` (< 1: a margin for the predictions' errors)."""

        def scaled(x: float | None) -> float | None:
            return None if x is None else x * headroom

        return dataclasses.replace(
            self, ttft_s=scaled(self.ttft_s), tpot_s=scaled(self.tpot_s), deadline_s=scaled(self.deadline_s)
        )

    def misses(self, p: Prediction, output_tokens: int) -> list[str]:
        """Which objectives the prediction misses, as readable reasons (empty: it meets all)."""
        out = []
        if self.ttft_s is not None and p.ttft_s > self.ttft_s:
            out.append(f"TTFT {p.ttft_s:.2f}s > {self.ttft_s:g}s")
        if self.tpot_s is not None and p.tpot_s > self.tpot_s:
            out.append(f"TPOT {p.tpot_s * 1000:.0f}ms > {self.tpot_s * 1000:g}ms")
        if self.deadline_s is not None and p.total_s(output_tokens) > self.deadline_s:
            out.append(f"total {p.total_s(output_tokens):.1f}s > {self.deadline_s:g}s")
        return out


@dataclass(frozen=True, slots=True)
class Candidate:
    model: str
    prediction: Prediction
    available: bool = True  # the engine is up and the key may use it
    # Why sending it here now would make requests already running there miss their
    # objectives (empty: it would not), and in how many seconds that stops being so
    # (None: not soon). A request that can afford to wait that long is held, not sent.
    harms: str = ""
    harm_clears_s: float | None = None
    # The largest share of a running request's remaining slack (time it can still lose and
    # meet its objective) sending it here would take: >= 1 harms. `fast` passes over a
    # candidate that would take more than MAX_SLACK_TAKEN of it when another would not.
    slack_taken: float = 0.0
    # Seconds to hold it so as not to take a reserved SLO class's capacity here (0: it takes
    # none) and what holding keeps. Unlike a harm, a wish: a request that cannot wait that
    # long is sent now, unless that costs at least one request of that class
    # (`reserve_costs`, expected): then it misses here.
    reserve_s: float = 0.0
    reserve_why: str = ""
    reserve_costs: float = 0.0

    def hold(self, slo: Slo, output_tokens: int) -> float | None:
        """Seconds to hold the request before sending it here (0: none), or None: it misses."""
        if slo.misses(self.prediction, output_tokens):
            return None
        hold = 0.0
        if self.harms:
            if self.harm_clears_s is None or not self._can_wait(self.harm_clears_s, slo, output_tokens):
                return None
            hold = self.harm_clears_s
        if self.reserve_s > hold:
            if self._can_wait(self.reserve_s, slo, output_tokens):
                hold = self.reserve_s
            elif self._sheds(slo, output_tokens):
                return None
        return hold

    def _can_wait(self, seconds: float, slo: Slo, output_tokens: int) -> bool:
        later = Prediction(self.prediction.ttft_s + seconds, self.prediction.tpot_s)
        return not slo.misses(later, output_tokens)

    def _sheds(self, slo: Slo, output_tokens: int) -> bool:
        return self.reserve_costs >= 1 and not self._can_wait(self.reserve_s, slo, output_tokens)

    def hold_reason(self, hold_s: float) -> str:
        if self.harms and hold_s == self.harm_clears_s:
            return "not to stall running requests"
        return f"{self.reserve_why} requests"

    def misses(self, slo: Slo, output_tokens: int) -> list[str]:
        out = slo.misses(self.prediction, output_tokens)
        if self.harms:
            out.append(self.harms)
        if self._sheds(slo, output_tokens):
            out.append(f"it cannot wait {self.reserve_s:.1f}s {self.reserve_why} requests")
        return out


@dataclass(frozen=True, slots=True)
class Route:
    model: str
    reason: str
    hold_s: float = 0.0  # wait this long before sending it (so as not to stall running requests)


@dataclass(frozen=True, slots=True)
class NoRoute:
    """No candidate for the request, and whether retrying can help."""

    reason: str
    retry_after_s: float | None  # None (impossible only): retrying will not help
    # busy: retry after `retry_after_s`; impossible: not even an idle engine would meet it;
    # unavailable: every candidate's engine is down. `choose` cannot tell busy from
    # impossible: its caller does (policies/load.py).
    kind: Literal["busy", "impossible", "unavailable"] = "busy"
    message: str = ""  # for the client (the caller's words)


def choose(
    requested: str,
    candidates: Sequence[Candidate],
    slo: Slo,
    output_tokens: int,
    *,
    aliases: dict[str, str],
    allow_substitution: bool = False,
) -> Route | NoRoute:
    """`candidates` best first. `aliases` maps an alias to its strategy: "best" or "fast"."""
    live = [c for c in candidates if c.available]
    if not live:
        return NoRoute("no model is available", 5.0, "unavailable")
    strategy = aliases.get(requested)
    if strategy is None:  # an explicit model
        mine = next((c for c in live if c.model == requested), None)
        hold = None if mine is None else mine.hold(slo, output_tokens)
        if mine is not None and hold is not None:
            return _route(mine, f"requested; meets {slo.name}", hold)
        if not allow_substitution:
            why = "unavailable" if mine is None else "; ".join(mine.misses(slo, output_tokens))
            return NoRoute(f"{requested} would miss the {slo.name} objective ({why})", _wait(live, slo))
        order = [c for c in live if c.model != requested]
    elif strategy == "fast":
        order = sorted(live, key=lambda c: (c.slack_taken > MAX_SLACK_TAKEN, c.prediction.total_s(output_tokens)))
    else:
        order = list(live)
    passed: list[str] = []
    for c in order:
        hold = c.hold(slo, output_tokens)
        if hold is not None:
            if not passed:
                return _route(c, f"{strategy or 'substituted'}: meets {slo.name}", hold)
            return _route(c, f"degraded from {', '.join(passed)}: predicted to miss {slo.name}", hold)
        passed.append(f"{c.model} ({'; '.join(c.misses(slo, output_tokens))})")
    return NoRoute(f"no model meets the {slo.name} objective: {', '.join(passed)}", _wait(live, slo))


def _route(c: Candidate, reason: str, hold_s: float) -> Route:
    if hold_s > 0:
        reason += f" after a {hold_s:.1f}s hold ({c.hold_reason(hold_s)})"
    return Route(c.model, reason, hold_s)


def _wait(live: Sequence[Candidate], slo: Slo) -> float:
    """How long until the least loaded candidate's queue could have drained enough."""
    if slo.ttft_s is None:
        return 5.0
    excess = min(max(0.0, c.prediction.ttft_s - slo.ttft_s) for c in live)
    return max(1.0, math.ceil(excess))
