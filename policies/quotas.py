"""Quota rules: may this reservation be taken now? Pure: counters in, `Allow | Deny` out.

A reservation holds its worst-case token cost (prompt + max output) from the
moment it is taken until it is settled with the actual usage, so every check
counts what has been used *plus* what is still in flight. That is what makes
the limits exact under concurrency: no check-then-count gap.

Per scope (a key, its team):
- max_concurrency: reservations held at once.
- rpm / tpm: requests and tokens in a sliding window (60 s unless configured);
  an entry enters the window when reserved, its tokens are corrected when
  settled, and it leaves `window_ms` after it was reserved.
- daily_tokens / monthly_tokens: UTC calendar day / month budgets.

`gateway/quota/` applies these rules in-process (MemoryQuotaStore) and inside
Redis (its Lua script, scripts/reserve.lua, mirrors `check` line by line); one
test suite runs against both.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

DAY_MS = 86_400_000
IN_FLIGHT_RETRY_MS = 1_000  # held by requests still running: they settle (and refund) soon
CONCURRENCY_RETRY_MS = 1_000


@dataclass(frozen=True, slots=True)
class Limits:
    """A scope's counted limits; None is unlimited."""

    rpm: int | None = None
    tpm: int | None = None
    daily_tokens: int | None = None
    monthly_tokens: int | None = None
    max_concurrency: int | None = None


@dataclass(frozen=True, slots=True)
class WindowEntry:
    at_ms: int  # when it was reserved
    tokens: int  # reserved, or actual once settled


@dataclass(frozen=True, slots=True)
class Period:
    """A day's or a month's tokens: settled (actual) and reserved (in flight)."""

    used: int = 0
    reserved: int = 0


@dataclass(frozen=True, slots=True)
class ScopeState:
    """What a scope holds right now (the window already trimmed to `now - window`).

    The window's count and token sum are kept as running totals by the stores, so a
    check costs O(1); its entries are read only to say how long a refused request waits.
    """

    live: int = 0
    window_requests: int = 0
    window_tokens: int = 0
    window: Sequence[WindowEntry] = ()  # oldest first
    day: Period = Period()
    month: Period = Period()


class DenyReason(enum.Enum):
    """Why a reservation was refused: (label, OpenAI code, retryable by waiting briefly)."""

    CONCURRENCY = ("concurrency", "rate_limit_exceeded", True)
    RPM = ("rpm", "rate_limit_exceeded", True)
    TPM = ("tpm", "rate_limit_exceeded", True)
    TPM_TOO_LARGE = ("tpm_too_large", "rate_limit_exceeded", False)
    DAILY_IN_FLIGHT = ("daily_in_flight", "rate_limit_exceeded", True)
    MONTHLY_IN_FLIGHT = ("monthly_in_flight", "rate_limit_exceeded", True)
    DAILY = ("daily", "insufficient_quota", False)
    MONTHLY = ("monthly", "insufficient_quota", False)

    @property
    def label(self) -> str:
        return self.value[0]

    @property
    def code(self) -> str:
        return self.value[1]

    @property
    def retryable(self) -> bool:
        return self.value[2]

    @classmethod
    def by_label(cls, label: str) -> DenyReason:
        return next(r for r in cls if r.label == label)


@dataclass(frozen=True, slots=True)
class Allow:
    pass


@dataclass(frozen=True, slots=True)
class Deny:
    reason: DenyReason
    retry_after_ms: int
    limit: int
    current: int  # what the scope holds against that limit (used + in flight)


ALLOW = Allow()


def check(limits: Limits, state: ScopeState, cost: int, now_ms: int, window_ms: int) -> Allow | Deny:
    """May a reservation of `cost` tokens be added to this scope now?"""
    if limits.max_concurrency is not None and state.live + 1 > limits.max_concurrency:
        return Deny(DenyReason.CONCURRENCY, CONCURRENCY_RETRY_MS, limits.max_concurrency, state.live)
    if limits.rpm is not None and state.window_requests + 1 > limits.rpm:
        # Room comes when enough of the oldest entries have left the window.
        oldest_needed = state.window[state.window_requests - limits.rpm]
        retry = oldest_needed.at_ms + window_ms - now_ms
        return Deny(DenyReason.RPM, max(1, retry), limits.rpm, state.window_requests)
    if limits.tpm is not None:
        held = state.window_tokens
        if cost > limits.tpm:
            return Deny(DenyReason.TPM_TOO_LARGE, 0, limits.tpm, cost)
        if held + cost > limits.tpm:
            retry = _tokens_free_in(state.window, held + cost - limits.tpm, now_ms, window_ms)
            return Deny(DenyReason.TPM, retry, limits.tpm, held)
    for budget, period, hard, soft, reset in (
        (limits.daily_tokens, state.day, DenyReason.DAILY, DenyReason.DAILY_IN_FLIGHT, day_end_ms(now_ms)),
        (limits.monthly_tokens, state.month, DenyReason.MONTHLY, DenyReason.MONTHLY_IN_FLIGHT, month_end_ms(now_ms)),
    ):
        if budget is None:
            continue
        if period.used + cost > budget:
            return Deny(hard, max(1, reset - now_ms), budget, period.used + period.reserved)
        if period.used + period.reserved + cost > budget:
            return Deny(soft, IN_FLIGHT_RETRY_MS, budget, period.used + period.reserved)
    return ALLOW


def _tokens_free_in(window: Sequence[WindowEntry], excess: int, now_ms: int, window_ms: int) -> int:
    """Milliseconds until the oldest entries holding `excess` tokens have left the window
    (they exist: `excess` <= what the window holds when the request alone fits)."""
    freed = itertools.accumulate(e.tokens for e in window)
    last = next(e for e, f in zip(window, freed, strict=True) if f >= excess)
    return max(1, last.at_ms + window_ms - now_ms)


# Calendar arithmetic on UTC epoch milliseconds, the same in Lua (no os.date in Redis).
# Howard Hinnant's civil-from-days / days-from-civil.


def civil_from_days(z: int) -> tuple[int, int, int]:
    """Days since 1970-01-01 -> (year, month 1-12, day 1-31)."""
    z += 719468
    era = (z if z >= 0 else z - 146096) // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    y = yoe + era * 400
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    return (y + 1 if m <= 2 else y), m, d


def days_from_civil(y: int, m: int, d: int) -> int:
    y -= m <= 2
    era = (y if y >= 0 else y - 399) // 400
    yoe = y - era * 400
    doy = (153 * (m - 3 if m > 2 else m + 9) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def day_index(now_ms: int) -> int:
    return now_ms // DAY_MS


def month_index(now_ms: int) -> int:
    """Months since year 0 (year * 12 + month - 1): one number per calendar month."""
    y, m, _ = civil_from_days(day_index(now_ms))
    return y * 12 + m - 1


def day_end_ms(now_ms: int) -> int:
    return (day_index(now_ms) + 1) * DAY_MS


def month_end_ms(now_ms: int) -> int:
    y, m, _ = civil_from_days(day_index(now_ms))
    y, m = (y + 1, 1) if m == 12 else (y, m + 1)
    return days_from_civil(y, m, 1) * DAY_MS


def day_label(day: int) -> str:
    y, m, d = civil_from_days(day)
    return f"{y:04d}-{m:02d}-{d:02d}"


def month_label(month: int) -> str:
    return f"{month // 12:04d}-{month % 12 + 1:02d}"
