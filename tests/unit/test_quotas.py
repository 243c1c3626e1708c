"""policies/quotas.py: the rules both stores apply (pure: counters in, verdict out)."""

import datetime

import pytest

from policies import quotas
from policies.quotas import ALLOW, Deny, DenyReason, Limits, Period, ScopeState, WindowEntry

NOW = 1_798_000_000_000  # 2026-12-23 (UTC)
W = 60_000


def win(entries: list[WindowEntry], **kw: object) -> ScopeState:
    """A scope state whose running totals match its window (as the stores keep them)."""
    return ScopeState(
        window_requests=len(entries),
        window_tokens=sum(e.tokens for e in entries),
        window=entries,
        **kw,  # type: ignore[arg-type]
    )


def test_unlimited_allows_anything() -> None:
    assert quotas.check(Limits(), ScopeState(live=10**6, day=Period(10**12, 10**12)), 10**9, NOW, W) is ALLOW


def test_concurrency() -> None:
    assert quotas.check(Limits(max_concurrency=2), ScopeState(live=1), 1, NOW, W) is ALLOW
    d = quotas.check(Limits(max_concurrency=2), ScopeState(live=2), 1, NOW, W)
    assert d == Deny(DenyReason.CONCURRENCY, quotas.CONCURRENCY_RETRY_MS, 2, 2)


def test_rpm_waits_for_the_entry_that_makes_room() -> None:
    window = [WindowEntry(NOW - 50_000, 1), WindowEntry(NOW - 20_000, 1), WindowEntry(NOW - 1_000, 1)]
    assert quotas.check(Limits(rpm=4), win(window), 1, NOW, W) is ALLOW
    d = quotas.check(Limits(rpm=3), win(window), 1, NOW, W)
    assert d == Deny(DenyReason.RPM, 10_000, 3, 3)  # the oldest leaves in 10 s
    d = quotas.check(Limits(rpm=2), win(window), 1, NOW, W)
    assert isinstance(d, Deny) and d.retry_after_ms == 40_000  # two must leave: the second in 40 s
    edge = [WindowEntry(NOW - W, 1)]  # leaves exactly now: never a zero wait
    assert quotas.check(Limits(rpm=1), win(edge), 1, NOW, W) == Deny(DenyReason.RPM, 1, 1, 1)


def test_tpm() -> None:
    window = [WindowEntry(NOW - 30_000, 40), WindowEntry(NOW - 10_000, 50)]
    assert quotas.check(Limits(tpm=100), win(window), 10, NOW, W) is ALLOW
    d = quotas.check(Limits(tpm=100), win(window), 20, NOW, W)
    assert d == Deny(DenyReason.TPM, 30_000, 100, 90)  # 10 too many: the first entry (40) frees enough
    d = quotas.check(Limits(tpm=100), win(window), 60, NOW, W)
    assert isinstance(d, Deny) and d.retry_after_ms == 50_000  # 50 too many: both must leave
    d = quotas.check(Limits(tpm=100), ScopeState(), 101, NOW, W)
    assert d == Deny(DenyReason.TPM_TOO_LARGE, 0, 100, 101) and not d.reason.retryable


@pytest.mark.parametrize(
    ("limits", "hard", "soft", "reset"),
    [
        (Limits(daily_tokens=100), DenyReason.DAILY, DenyReason.DAILY_IN_FLIGHT, quotas.day_end_ms(NOW)),
        (Limits(monthly_tokens=100), DenyReason.MONTHLY, DenyReason.MONTHLY_IN_FLIGHT, quotas.month_end_ms(NOW)),
    ],
)
def test_budgets(limits: Limits, hard: DenyReason, soft: DenyReason, reset: int) -> None:
    def state(used: int, reserved: int) -> ScopeState:
        p = Period(used, reserved)
        return ScopeState(day=p, month=p)

    assert quotas.check(limits, state(60, 30), 10, NOW, W) is ALLOW
    assert quotas.check(limits, state(60, 30), 11, NOW, W) == Deny(soft, quotas.IN_FLIGHT_RETRY_MS, 100, 90)
    assert quotas.check(limits, state(60, 30), 41, NOW, W) == Deny(hard, reset - NOW, 100, 90)
    assert hard.code == "insufficient_quota" and soft.code == "rate_limit_exceeded"
    assert not hard.retryable and soft.retryable


def test_checks_run_in_order_concurrency_first() -> None:
    everything = Limits(rpm=1, tpm=1, daily_tokens=1, monthly_tokens=1, max_concurrency=1)
    full = win([WindowEntry(NOW, 1)], live=1, day=Period(1), month=Period(1))
    d = quotas.check(everything, full, 1, NOW, W)
    assert isinstance(d, Deny) and d.reason is DenyReason.CONCURRENCY


def test_reason_labels_round_trip() -> None:
    for r in DenyReason:
        assert DenyReason.by_label(r.label) is r


@pytest.mark.parametrize("days", [-700_000, -1, 0, 59, 365 * 30 + 7, 20_000, 2_932_896])
def test_calendar_matches_datetime(days: int) -> None:
    d = datetime.date(1970, 1, 1) + datetime.timedelta(days=days)
    assert quotas.civil_from_days(days) == (d.year, d.month, d.day)
    assert quotas.days_from_civil(d.year, d.month, d.day) == days


def test_day_and_month_boundaries() -> None:
    assert quotas.day_label(quotas.day_index(NOW)) == "2026-12-23"
    assert quotas.month_label(quotas.month_index(NOW)) == "2026-12"
    assert quotas.day_end_ms(NOW) == int(datetime.datetime(2026, 12, 24, tzinfo=datetime.UTC).timestamp() * 1000)
    assert quotas.month_end_ms(NOW) == int(datetime.datetime(2027, 1, 1, tzinfo=datetime.UTC).timestamp() * 1000)
    feb = int(datetime.datetime(2028, 2, 10, tzinfo=datetime.UTC).timestamp() * 1000)
    assert quotas.month_end_ms(feb) == int(datetime.datetime(2028, 3, 1, tzinfo=datetime.UTC).timestamp() * 1000)
    assert quotas.month_index(feb) == 2028 * 12 + 1
