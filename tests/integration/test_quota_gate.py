"""QuotaGate against a real redis-server that goes away and comes back: fail-closed,
fail-open on local limits, settlements kept in an outbox and applied on return."""

from __future__ import annotations

import asyncio
import gc
import uuid
from collections.abc import AsyncIterator

import pytest

from gateway.auth import Principal
from gateway.errors import QuotaUnavailable, RateLimited
from gateway.quota import MemoryQuotaStore, QuotaGate
from gateway.settings import KeyLimits, QuotaSettings
from tests.conftest import RedisServer

ALICE = Principal("alice", "key_a", None, KeyLimits(rpm=2, daily_tokens=1000))


@pytest.fixture
async def own_redis(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RedisServer]:
    srv = RedisServer(tmp_path_factory.mktemp("redis-gate"))
    srv.start()
    yield srv
    srv.stop()


async def gate_for(srv: RedisServer, on_outage: str) -> QuotaGate:
    settings = QuotaSettings(
        store="redis",
        redis_url=srv.url,
        key_prefix=f"g{uuid.uuid4().hex[:6]}:",
        on_outage=on_outage,  # type: ignore[arg-type]
        window_s=60,
        lease_s=1.5,
        redis_timeout_s=0.3,
    )
    gate = QuotaGate.from_settings(settings)
    await gate.start()
    return gate


async def until(cond: object, timeout: float = 10) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_fail_closed_then_recovers_and_applies_the_outbox(own_redis: RedisServer) -> None:
    gate = await gate_for(own_redis, "closed")
    try:
        hold = await gate.reserve(ALICE, "r1", 100)
        own_redis.stop()
        with pytest.raises(QuotaUnavailable) as e:
            await gate.reserve(ALICE, "r2", 100)
        assert e.value.status == 503 and e.value.headers["Retry-After"] == "2"
        with pytest.raises(QuotaUnavailable):
            await gate.lookup_key("ab" * 32)
        hold.settle(30, 20)  # Redis is away: kept in the outbox
        await until(lambda: gate.snapshot()["outbox"] == 1)
        assert gate.is_down
        own_redis.start()
        await until(lambda: not gate.is_down and gate.snapshot()["outbox"] == 0)
        u = await gate.usage("key:key_a")
        assert (u.day.used, u.day.requests, u.day.reserved_tokens, u.live) == (50, 1, 0, 0)
        (await gate.reserve(ALICE, "r3", 100)).release()  # serving again, no restart
    finally:
        await gate.close()


async def test_fail_open_serves_on_local_limits_and_replays_usage(own_redis: RedisServer) -> None:
    gate = await gate_for(own_redis, "open")
    try:
        own_redis.stop()
        a = await gate.reserve(ALICE, "r1", 100)
        b = await gate.reserve(ALICE, "r2", 100)
        with pytest.raises(RateLimited):  # rpm 2 holds locally too
            await gate.reserve(ALICE, "r3", 100)
        assert isinstance(a.store, MemoryQuotaStore) and gate.metrics.local_reserves == 3
        a.settle(10, 5)
        b.release()
        own_redis.start()
        await until(lambda: not gate.is_down and gate.snapshot()["outbox"] == 0)
        u = await gate.usage("key:key_a")
        assert (u.day.used, u.day.requests, u.day.reserved_tokens) == (15, 1, 0)  # served locally, recorded
        assert gate.metrics.replayed == 1
    finally:
        await gate.close()


async def test_a_hold_left_unsettled_is_released_by_the_gc(own_redis: RedisServer) -> None:
    gate = await gate_for(own_redis, "closed")
    try:
        await gate.reserve(ALICE, "lost", 100)  # dropped on the floor: a bug, but nothing leaks
        gc.collect()
        await until(lambda: gate.metrics.released == 1)
        await until(lambda: gate.snapshot()["holds"] == 0)
        await asyncio.sleep(0.1)
        assert (await gate.usage("key:key_a")).day.reserved_tokens == 0
    finally:
        await gate.close()


async def test_leases_are_renewed_while_requests_run(own_redis: RedisServer) -> None:
    gate = await gate_for(own_redis, "closed")
    try:
        hold = await gate.reserve(ALICE, "long", 100)
        await asyncio.sleep(4)  # well past the 1.5 s lease
        assert (await gate.store.stats()).expired == 0
        assert (await gate.usage("key:key_a")).live == 1
        hold.settle(1, 1)
        await until(lambda: gate.snapshot()["holds"] == 0)
    finally:
        await gate.close()


async def test_a_hold_keeps_its_lease_until_its_settlement_is_applied(own_redis: RedisServer) -> None:
    """A settlement waiting on a busy loop (here: held back past the lease) must not find the
    reservation swept: its room would go to another request, then be charged anyway."""
    gate = await gate_for(own_redis, "closed")
    store = gate.store
    go = asyncio.Event()
    settle = store.settle

    async def held_back(*args: object) -> bool:
        await go.wait()
        return await settle(*args)  # type: ignore[arg-type]

    try:
        hold = await gate.reserve(ALICE, "slow-settle", 100)
        store.settle = held_back  # type: ignore[method-assign]
        hold.settle(1, 1)
        await asyncio.sleep(4)  # well past the 1.5 s lease, the settlement still waiting
        assert (await store.stats()).expired == 0
        go.set()
        await until(lambda: gate.snapshot()["holds"] == 0)
        assert gate.metrics.late_settles == 0 and (await store.stats()).late == 0
        u = await gate.usage("key:key_a")
        assert (u.day.used, u.day.reserved_tokens, u.live) == (2, 0, 0)
    finally:
        go.set()  # the close waits for settlements in flight
        await gate.close()


async def test_after_redis_restarts_no_pooled_connection_trips_it_again(own_redis: RedisServer) -> None:
    """The connections pooled before the outage point at the old server: each would fail its
    first command after the recovery and take the gate down again (503s on a closed replica)."""
    gate = await gate_for(own_redis, "closed")
    try:
        await asyncio.gather(*(gate.usage(f"key:k{i}") for i in range(8)))  # 8 pooled connections
        own_redis.stop()
        with pytest.raises(QuotaUnavailable):
            await gate.usage("key:k0")
        own_redis.start()
        await until(lambda: not gate.is_down)
        holds = await asyncio.gather(*(gate.reserve(ALICE, f"after{i}", 1) for i in range(2)))
        await asyncio.gather(*(gate.usage(f"key:k{i}") for i in range(8)))
        for h in holds:
            h.release()
        assert not gate.is_down and gate.metrics.outages == 1
    finally:
        await gate.close()


async def test_a_redis_restart_between_commands_is_no_outage(own_redis: RedisServer) -> None:
    """Redis restarts while the replica sends nothing: the connections it pooled before point at
    the old server, and the next commands still get answers, with no outage in between."""
    gate = await gate_for(own_redis, "closed")
    try:
        await asyncio.gather(*(gate.usage(f"key:k{i}") for i in range(8)))  # 8 pooled connections
        own_redis.stop()
        own_redis.start()
        hold = await gate.reserve(ALICE, "after", 1)
        await asyncio.gather(*(gate.usage(f"key:k{i}") for i in range(8)))
        hold.release()
        assert not gate.is_down and gate.metrics.outages == 0
    finally:
        await gate.close()
