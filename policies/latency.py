"""Per-model latency prediction, learned online from what the gateway observes. Pure.

    TTFT(prompt, cached, queued_ahead) = overhead + (prompt - cached + queued_ahead) / prefill_rate
    TPOT(concurrency, context)         = step + per_sequence * (concurrency - 1) + per_ktoken * context / 1000

A profile (from config, e.g. fitted to a box's measurements) seeds the model.
Observations correct it with a multiplicative factor per quantity, the median of
the last `window` observed/predicted ratios: one slow outlier (a GC pause, a
compile) moves a median not at all, while a real shift (a co-resident engine
started, thermal throttling) wins within half a window.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Profile:
    """A model's latency on its box, before any observation."""

    prefill_tokens_per_s: float
    ttft_overhead_s: float = 0.05
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
        self._ttft = _RobustFactor(window)
        self._tpot = _RobustFactor(window)
        self.observations = 0

    def _base_ttft(self, prompt_tokens: int, cached_tokens: int, queued_ahead_tokens: int) -> float:
        work = max(0, prompt_tokens - cached_tokens) + max(0, queued_ahead_tokens)
        return self.profile.ttft_overhead_s + work / self.profile.prefill_tokens_per_s

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
        ctx = prompt_tokens if context_tokens is None else context_tokens
        return Prediction(
            ttft_s=self._base_ttft(prompt_tokens, cached_tokens, queued_ahead_tokens) * self._ttft.value,
            tpot_s=self._base_tpot(concurrency, ctx) * self._tpot.value,
        )

    def observe_ttft(
        self, seconds: float, *, prompt_tokens: int, cached_tokens: int = 0, queued_ahead_tokens: int = 0
    ) -> None:
        self._add(self._ttft, seconds, self._base_ttft(prompt_tokens, cached_tokens, queued_ahead_tokens))

    def observe_tpot(self, seconds: float, *, concurrency: int, context_tokens: int) -> None:
        self._add(self._tpot, seconds, self._base_tpot(concurrency, context_tokens))

    def _add(self, factor: _RobustFactor, observed: float, base: float) -> None:
        if observed <= 0 or base <= 0:
            return
        ratio = observed / base
        if not 1 / self.max_ratio <= ratio <= self.max_ratio:
            return
        factor.add(ratio)
        self.observations += 1
