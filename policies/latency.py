"""Per-model latency prediction, learned online from what the gateway observes. Pure.

    TTFT = overhead + work,  work = (prompt - cached + queued_ahead) / prefill_rate
                                    + quadratic * (prompt_k^2 - cached_k^2)   (attention; k = 1,000 tokens)
    TPOT(concurrency, context) = step + per_sequence * (concurrency - 1) + per_ktoken * context / 1000

A profile (from config, e.g. fitted to a box's measurements) seeds the model.
Observations correct it with multiplicative factors, each the median of the last
`window` observed/predicted ratios: one slow outlier (a GC pause, a compile) moves
a median not at all, while a real shift (a co-resident engine started, thermal
throttling) wins within half a window. TTFT has separate factors for the fixed
overhead and for the prefill work, the latter per size band of the work (a factor
of 4 in tokens each): an observation corrects the term that dominates it, in its
band, so short chats cannot teach the model how long a 64K prompt takes, even
when the profile's split between linear and quadratic cost is off. A band with
too few observations borrows the factor of all bands together.
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Profile:
    """A model's latency on its box, before any observation."""

    prefill_tokens_per_s: float
    ttft_overhead_s: float = 0.05
    prefill_s_per_ktoken2: float = 0.0  # attention's quadratic share of prefill
    tpot_s: float = 0.02  # one decode step, one sequence, short context
    tpot_per_sequence_s: float = 0.0  # added per other running sequence
    tpot_per_ktoken_s: float = 0.0  # added per 1,000 tokens of context


@dataclass(frozen=True, slots=True)
class Prediction:
    ttft_s: float
    tpot_s: float

    def total_s(self, output_tokens: int) -> float:
        return self.ttft_s + self.tpot_s * max(0, output_tokens - 1)


@dataclass
class _RobustFactor:
    """The median of the last `window` ratios (1.0 before any)."""

    window: int
    recent: deque[float] = field(default_factory=deque)
    ordered: list[float] = field(default_factory=list)

    def add(self, ratio: float) -> None:
        self.recent.append(ratio)
        bisect.insort(self.ordered, ratio)
        if len(self.recent) > self.window:
            old = self.recent.popleft()
            del self.ordered[bisect.bisect_left(self.ordered, old)]

    @property
    def value(self) -> float:
        n = len(self.ordered)
        if n == 0:
            return 1.0
        mid = n // 2
        return self.ordered[mid] if n % 2 else (self.ordered[mid - 1] + self.ordered[mid]) / 2


class LatencyModel:
    """One model's predicted TTFT and time per output token, corrected by observation."""

    def __init__(self, profile: Profile, *, window: int = 32, max_ratio: float = 20.0) -> None:
        self.profile = profile
        self.max_ratio = max_ratio  # ratios beyond this (either way) are measurement errors: ignored
        self._overhead = _RobustFactor(window)
        self._bands: dict[int, _RobustFactor] = {}
        self._window = window
        self._tpot = _RobustFactor(window)
        self.observations = 0
        # Predictions since the last observation: routing asks for the same ones many times
        # per decision (every prompt on an engine, for every candidate), and they change
        # only when an observation does.
        self._memo: dict[tuple[int, int, int, int, int | None], Prediction] = {}

    def _base_work(self, prompt_tokens: int, cached_tokens: int, queued_ahead_tokens: int) -> float:
        p = self.profile
        cached = min(max(0, cached_tokens), prompt_tokens)
        tokens = prompt_tokens - cached + max(0, queued_ahead_tokens)
        return tokens / p.prefill_tokens_per_s + p.prefill_s_per_ktoken2 * (
            (prompt_tokens / 1000) ** 2 - (cached / 1000) ** 2
        )

    def _base_tpot(self, concurrency: int, context_tokens: int) -> float:
        p = self.profile
        return p.tpot_s + p.tpot_per_sequence_s * max(0, concurrency - 1) + p.tpot_per_ktoken_s * context_tokens / 1000

    def predict(
        self,
        *,
        prompt_tokens: int,
        cached_tokens: int = 0,
        queued_ahead_tokens: int = 0,
        concurrency: int = 1,
        context_tokens: int | None = None,
    ) -> Prediction:
        key = (prompt_tokens, cached_tokens, queued_ahead_tokens, concurrency, context_tokens)
        memo = self._memo.get(key)
        if memo is not None:
            return memo
        ctx = prompt_tokens if context_tokens is None else context_tokens
        out = Prediction(
            ttft_s=self.profile.ttft_overhead_s * self._overhead.value
            + self._base_work(prompt_tokens, cached_tokens, queued_ahead_tokens)
            * self._work_factor(prompt_tokens - cached_tokens + queued_ahead_tokens),
            tpot_s=self._base_tpot(concurrency, ctx) * self._tpot.value,
        )
        if len(self._memo) >= _MEMO_MAX:
            self._memo.clear()
        self._memo[key] = out
        return out

    def observe_ttft(
        self, seconds: float, *, prompt_tokens: int, cached_tokens: int = 0, queued_ahead_tokens: int = 0
    ) -> None:
        """Correct the term that dominates this observation, holding the other at its estimate."""
        overhead = self.profile.ttft_overhead_s
        work = self._base_work(prompt_tokens, cached_tokens, queued_ahead_tokens)
        tokens = prompt_tokens - cached_tokens + queued_ahead_tokens
        if work >= overhead:
            band = self._bands.setdefault(_band(tokens), _RobustFactor(self._window))
            self._add(band, seconds - overhead * self._overhead.value, work)
        else:
            self._add(self._overhead, seconds - work * self._work_factor(tokens), overhead)

    def _work_factor(self, tokens: int) -> float:
        """The band's own factor once it has an observation, else a neighbouring band's
        well-observed one (the larger band first), else the profile's (1.0): a band two
        factors of 4 away says little (a short prefill is bound by other things than a long)."""
        want = _band(tokens)
        own = self._bands.get(want)
        if own is not None and own.ordered:
            return own.value
        for b in (want + 1, want - 1):
            near = self._bands.get(b)
            if near is not None and len(near.ordered) >= _MIN_BAND:
                return near.value
        return 1.0

    def learned(self) -> dict[str, object]:
        """What observation has taught the model so far: each correction factor (1.0: the
        profile as it was) with the observations behind it, the prefill work per size band
        (keyed by the band's lowest token count)."""
        return {
            "observations": self.observations,
            "overhead": {"factor": self._overhead.value, "n": len(self._overhead.ordered)},
            "tpot": {"factor": self._tpot.value, "n": len(self._tpot.ordered)},
            "prefill": {
                _band_floor(b): {"factor": f.value, "n": len(f.ordered)} for b, f in sorted(self._bands.items())
            },
        }

    def observe_tpot(self, seconds: float, *, concurrency: int, context_tokens: int) -> None:
        self._add(self._tpot, seconds, self._base_tpot(concurrency, context_tokens))

    def _add(self, factor: _RobustFactor, observed: float, base: float) -> None:
        """Add observed/base to the factor, unless it is a measurement error."""
        if observed <= 0 or base <= 0:
            return
        ratio = observed / base
        if not 1 / self.max_ratio <= ratio <= self.max_ratio:
            return
        factor.add(ratio)
        self.observations += 1
        self._memo.clear()


_MEMO_MAX = 8192  # predictions remembered between observations (bounded memory)
_MIN_BAND = 3  # observations before a band's factor is lent to its neighbours


def _band(tokens: int) -> int:
    """Size band of prefill work: 0 below 1K tokens, then one per factor of 4 (1K, 4K, 16K, 64K...)."""
    band = 0
    while tokens >= 1000 * 4**band:
        band += 1
    return band


def _band_floor(band: int) -> int:
    """The fewest tokens of prefill work in `band`."""
    return 0 if band == 0 else 1000 * 4 ** (band - 1)


def slot_wait(running_remaining_s: Sequence[float], queued_service_s: Sequence[float], slots: int) -> float:
    """Seconds until a new request gets a running slot on an engine with `slots` of them.

    The running requests free their slots as they finish; the requests queued ahead of
    it (in order) each take the first slot to free and hold it for their service time.
    """
    if slots < 1:
        raise ValueError("an engine has at least one slot")
    free_at = sorted(max(0.0, r) for r in running_remaining_s)
    free_at = [0.0] * max(0, slots - len(free_at)) + free_at
    heapq.heapify(free_at)
    for service in queued_service_s:
        start = heapq.heappop(free_at)
        heapq.heappush(free_at, start + max(0.0, service))
    # More running than slots (a config change): the extra ones must finish first.
    while len(free_at) > slots:
        heapq.heappop(free_at)
    return free_at[0]
