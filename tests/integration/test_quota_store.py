"""One suite, two stores: MemoryQuotaStore and RedisQuotaStore (a real redis-server)
must give the same answers, including under concurrency and when leases run out.

Time is a stepped clock shared by the test and both stores (for Redis, passed to its scripts):
windows pass and leases run out when a test says so, never because the machine was slow."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from gateway.quota import KeyRecord, MemoryQuotaStore, QuotaStore, RedisQuotaStore, Refused, Reserved
from gateway.settings import KeyLimits
from policies import quotas
from policies.quotas import DenyReason, Limits
from tests.conftest import RedisServer

WINDOW_S = 1.0
LEASE_S = 0.4
_ids = itertools.count()


class SteppedClock:
    """Epoch milliseconds that move only when told (noon UTC, 2026-06-15, to start)."""

    def __init__(self) -> None:
        self.ms = 1_781_524_800_000

    def __call__(self) -> int:
        return self.ms

    def advance(self, seconds: float) -> None:
        self.ms += round(seconds * 1000)


@pytest.fixture
def clock() -> SteppedClock:
    return SteppedClock()


StoreFactory = Callable[[], Awaitable[QuotaStore]]


@pytest.fixture(params=["memory", "redis"])
async def make_store(request: pytest.FixtureRequest, clock: SteppedClock) -> AsyncIterator[StoreFactory]:
    """Stores sharing one state: for Redis, separate clients (as separate replicas) on one prefix."""
    made: list[QuotaStore] = []
    if request.param == "memory":
        shared = MemoryQuotaStore(window_s=WINDOW_S, lease_s=LEASE_S, clock=clock)

        async def factory() -> QuotaStore:
            return shared

    else:
        redis_server: RedisServer = request.getfixturevalue("redis_server")
        prefix = f"t{uuid.uuid4().hex[:8]}:"

        async def factory() -> QuotaStore:
            s = RedisQuotaStore(
                redis_server.url, prefix=prefix, window_s=WINDOW_S, lease_s=LEASE_S, timeout_s=5, clock=clock
            )
            made.append(s)
            return s

    yield factory
    for s in made:
        await s.close()


def rid() -> str:
    return f"r{next(_ids)}"


async def ok(store: QuotaStore, scopes: list[tuple[str, Limits]], cost: int) -> Reserved:
    out = await store.reserve(rid(), scopes, cost)
    assert isinstance(out, Reserved), out
    return out


async def refused(store: QuotaStore, scopes: list[tuple[str, Limits]], cost: int) -> Refused:
    out = await store.reserve(rid(), scopes, cost)
    assert isinstance(out, Refused), out
    return out


async def test_settle_charges_actual_and_refunds_the_rest(make_store: StoreFactory, clock: SteppedClock) -> None:
    store = await make_store()
    r = await ok(store, [("key:a", Limits(daily_tokens=1000))], 100)
    u = await store.usage("key:a")
    assert (u.day.reserved_tokens, u.day.used, u.live, u.window_requests, u.window_tokens) == (100, 0, 1, 1, 100)
    assert await store.settle(r, 30, 20)
    u = await store.usage("key:a")
    assert (u.day.reserved_tokens, u.day.prompt_tokens, u.day.completion_tokens, u.day.requests) == (0, 30, 20, 1)
    assert (u.month.used, u.month.requests, u.live, u.window_requests, u.window_tokens) == (50, 1, 0, 1, 50)
    assert u.day.label == quotas.day_label(quotas.day_index(clock()))


async def test_release_counts_nothing(make_store: StoreFactory) -> None:
    store = await make_store()
    r = await ok(store, [("key:a", Limits(rpm=5))], 100)
    assert await store.settle(r, 0, 0)
    u = await store.usage("key:a")
    assert (u.day.requests, u.day.used, u.day.reserved_tokens, u.window_requests, u.live) == (0, 0, 0, 0, 0)


async def test_daily_budget_in_flight_then_exhausted(make_store: StoreFactory, clock: SteppedClock) -> None:
    store = await make_store()
    scopes = [("key:a", Limits(daily_tokens=1000))]
    held = [await ok(store, scopes, 100) for _ in range(10)]
    # Held by requests in flight: they may refund, so "retry soon", not "quota exhausted".
    soft = await refused(store, scopes, 100)
    assert soft.deny.reason is DenyReason.DAILY_IN_FLIGHT and soft.deny.retry_after_ms == quotas.IN_FLIGHT_RETRY_MS
    assert soft.deny.current == 1000 and soft.scope == "key:a"
    for r in held:
        await store.settle(r, 50, 50)
    hard = await refused(store, scopes, 1)
    assert hard.deny.reason is DenyReason.DAILY and hard.deny.reason.code == "insufficient_quota"
    assert 0 < hard.deny.retry_after_ms <= quotas.DAY_MS
    assert hard.deny.retry_after_ms == quotas.day_end_ms(clock()) - clock()


async def test_settling_below_the_reservation_makes_room(make_store: StoreFactory) -> None:
    store = await make_store()
    scopes = [("key:a", Limits(monthly_tokens=300))]
    a = await ok(store, scopes, 200)
    assert (await refused(store, scopes, 200)).deny.reason is DenyReason.MONTHLY_IN_FLIGHT
    await store.settle(a, 40, 10)
    await ok(store, scopes, 200)
    assert (await refused(store, scopes, 51)).deny.reason is DenyReason.MONTHLY_IN_FLIGHT


async def test_rpm_sliding_window_and_retry_after(make_store: StoreFactory, clock: SteppedClock) -> None:
    store = await make_store()
    scopes = [("key:a", Limits(rpm=3))]
    for _ in range(3):
        await store.settle(await ok(store, scopes, 1), 1, 0)
    d = (await refused(store, scopes, 1)).deny
    assert d.reason is DenyReason.RPM and d.reason.code == "rate_limit_exceeded" and d.limit == 3
    assert 0 < d.retry_after_ms <= WINDOW_S * 1000
    clock.advance(d.retry_after_ms / 1000 - 0.001)
    assert (await refused(store, scopes, 1)).deny.reason is DenyReason.RPM  # not a moment early
    clock.advance(0.001)
    await ok(store, scopes, 1)  # the oldest entry left the window exactly when promised


async def test_tpm_counts_actual_tokens_after_settle(make_store: StoreFactory) -> None:
    store = await make_store()
    scopes = [("key:a", Limits(tpm=100))]
    a = await ok(store, scopes, 60)
    d = (await refused(store, scopes, 60)).deny
    assert d.reason is DenyReason.TPM and 0 < d.retry_after_ms <= WINDOW_S * 1000 and d.current == 60
    big = (await refused(store, scopes, 101)).deny
    assert big.reason is DenyReason.TPM_TOO_LARGE and not big.reason.retryable
    await store.settle(a, 5, 5)  # the window now holds 10, not 60
    await ok(store, scopes, 60)
    assert (await store.usage("key:a")).window_tokens == 70


async def test_max_concurrency(make_store: StoreFactory) -> None:
    store = await make_store()
    scopes = [("key:a", Limits(max_concurrency=2))]
    a = await ok(store, scopes, 1)
    await ok(store, scopes, 1)
    d = (await refused(store, scopes, 1)).deny
    assert (d.reason, d.limit, d.current) == (DenyReason.CONCURRENCY, 2, 2)
    await store.settle(a, 1, 1)
    await ok(store, scopes, 1)


async def test_team_pool_spans_keys_and_refusal_charges_nothing(make_store: StoreFactory) -> None:
    store = await make_store()
    team = ("team:t", Limits(daily_tokens=150))
    await ok(store, [("key:a", Limits()), team], 100)
    out = await refused(store, [("key:b", Limits()), team], 100)
    assert out.scope == "team:t" and out.deny.reason is DenyReason.DAILY_IN_FLIGHT
    # All or nothing: the key scope checked before the team's was not charged.
    u = await store.usage("key:b")
    assert (u.day.reserved_tokens, u.window_requests, u.live) == (0, 0, 0)


async def test_expired_lease_is_released_and_a_late_settle_still_counts(
    make_store: StoreFactory, clock: SteppedClock
) -> None:
    store = await make_store()
    scopes = [("key:a", Limits(max_concurrency=1, daily_tokens=1000))]
    r = await ok(store, scopes, 500)
    clock.advance(LEASE_S + 0.1)  # the replica holding it "crashed": no renewals
    assert await store.sweep() == 1
    u = await store.usage("key:a")
    assert (u.live, u.day.reserved_tokens, u.window_requests) == (0, 0, 0)
    assert (await store.stats()).expired >= 1
    await ok(store, scopes, 500)  # the slot is free again
    assert not await store.settle(r, 7, 3)  # the stalled replica comes back: its usage is charged
    u = await store.usage("key:a")
    assert (u.day.used, u.day.requests, u.day.reserved_tokens) == (10, 1, 500)
    assert (await store.stats()).late >= 1


async def test_renewed_leases_survive(make_store: StoreFactory, clock: SteppedClock) -> None:
    store = await make_store()
    r = await ok(store, [("key:a", Limits(max_concurrency=1))], 1)
    for _ in range(8):
        clock.advance(LEASE_S / 2)
        assert await store.renew([r.rid]) == []
    await store.sweep()
    assert (await store.usage("key:a")).live == 1
    assert await store.renew(["nope"]) == ["nope"]
    assert await store.settle(r, 1, 0)
    assert (await store.stats()).leases == 0


async def test_concurrent_reservations_from_two_replicas_never_overshoot(make_store: StoreFactory) -> None:
    a, b = await make_store(), await make_store()
    budget, cost, n = 1000, 7, 400
    scopes = [("key:hot", Limits(daily_tokens=budget, rpm=10_000)), ("team:t", Limits(monthly_tokens=5000))]
    outs = await asyncio.gather(*(s.reserve(rid(), scopes, cost) for s in [a, b] * (n // 2)))
    won = [o for o in outs if isinstance(o, Reserved)]
    assert len(won) == budget // cost  # exactly as many as fit: no race let one more in, none was lost
    assert all(o.deny.reason is DenyReason.DAILY_IN_FLIGHT for o in outs if isinstance(o, Refused))
    u = await a.usage("key:hot")
    assert u.day.reserved_tokens == len(won) * cost <= budget and u.live == len(won)
    await asyncio.gather(*((a if i % 2 else b).settle(r, 3, 4) for i, r in enumerate(won)))
    u = await b.usage("key:hot")
    assert (u.day.used, u.day.requests, u.day.reserved_tokens, u.live) == (len(won) * cost, len(won), 0, 0)
    assert (await a.stats()).leases == 0


async def test_keys_are_stored_by_hash(make_store: StoreFactory) -> None:
    store = await make_store()
    rec = KeyRecord(id="key_1", sha256="ab" * 32, user="alice", team="t", created_at=1.0, limits=KeyLimits(rpm=5))
    await store.put_key(rec)
    assert await store.get_key("ab" * 32) == rec
    assert await store.get_key("cd" * 32) is None
    await store.put_key(rec.model_copy(update={"revoked_at": 2.0}))
    keys = await store.list_keys()
    assert [k.id for k in keys if k.id == "key_1"] == ["key_1"]
    assert next(k for k in keys if k.id == "key_1").revoked_at == 2.0


async def test_repeats_change_nothing(make_store: StoreFactory, clock: SteppedClock) -> None:
    """A retried call (its first reply lost) must not charge twice: reserve and settle are idempotent."""
    store = await make_store()
    scopes = [("key:a", Limits(daily_tokens=1000))]
    r = await ok(store, scopes, 100)
    again = await store.reserve(r.rid, scopes, 100)
    assert again == r
    assert (await store.usage("key:a")).day.reserved_tokens == 100
    assert await store.settle(r, 10, 10)
    assert await store.settle(r, 10, 10)
    u = await store.usage("key:a")
    assert (u.day.used, u.day.requests, u.day.reserved_tokens, u.window_tokens) == (20, 1, 0, 20)
    # After an expiry, the first late settle counts and a repeat of it does not.
    late = await ok(store, scopes, 100)
    clock.advance(LEASE_S + 0.1)
    await store.sweep()
    assert not await store.settle(late, 5, 0)
    await store.settle(late, 5, 0)
    assert (await store.usage("key:a")).day.used == 25


async def test_tpm_window_empties_and_released_tokens_leave_it(make_store: StoreFactory, clock: SteppedClock) -> None:
    store = await make_store()
    scopes = [("key:a", Limits(tpm=100))]
    await store.settle(await ok(store, scopes, 60), 30, 30)
    released = await ok(store, scopes, 40)
    await store.settle(released, 0, 0)  # never ran: its tokens leave the window at once
    await store.settle(await ok(store, scopes, 40), 20, 20)
    assert (await refused(store, scopes, 1)).deny.reason is DenyReason.TPM
    clock.advance(WINDOW_S + 0.1)  # every entry is older than the window now
    await store.settle(await ok(store, scopes, 100), 50, 50)  # the whole limit is free again
    assert (await store.usage("key:a")).window_tokens == 100
