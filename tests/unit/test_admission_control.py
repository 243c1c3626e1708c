"""gateway/admission.py: the async shell releases every hold exactly once, whatever happens to a waiter."""

from __future__ import annotations

import asyncio
import gc

import pytest

from gateway.admission import AdmissionControl
from gateway.errors import GatewayError, Overloaded
from policies.demand import Demand, PoolLimits, QueueLimits


def control(blocks: int = 2, timeout: float = 5.0, **limits: int) -> AdmissionControl:
    return AdmissionControl(
        [PoolLimits(name="m", blocks=blocks, max_sequences=8)], QueueLimits(**limits), timeouts_s={0: timeout}
    )


def d(id: str, user: str = "u", blocks: int = 1) -> Demand:
    return Demand(id=id, pool="m", user=user, private_blocks=blocks)


def used(c: AdmissionControl) -> tuple[int, int, int]:
    s = c.snapshot("m")
    return s.used_blocks, s.admitted, s.queued


async def test_waiter_gets_the_room_when_it_frees() -> None:
    c = control(blocks=1)
    first = await c.acquire(d("a"))
    waiting = asyncio.ensure_future(c.acquire(d("b")))
    await asyncio.sleep(0)
    assert used(c) == (1, 1, 1)
    first.release()
    second = await waiting
    assert second.id == "b" and second.waited_s >= 0 and second.seq == 2
    second.release()
    second.release()  # idempotent
    assert used(c) == (0, 0, 0) and c.metrics.released == 2


async def test_cancelled_waiter_leaves_the_queue() -> None:
    c = control(blocks=1)
    first = await c.acquire(d("a"))
    waiting = asyncio.ensure_future(c.acquire(d("b")))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert used(c) == (1, 1, 0)
    first.release()
    assert used(c) == (0, 0, 0)


async def test_waiter_cancelled_after_admission_gives_the_room_back() -> None:
    c = control(blocks=1)
    first = await c.acquire(d("a"))
    waiting = asyncio.ensure_future(c.acquire(d("b")))
    await asyncio.sleep(0)
    first.release()  # admits b: its future is resolved, its task not resumed yet
    waiting.cancel()
    try:
        ticket = await waiting
    except asyncio.CancelledError:
        pass  # the shell gave the room back
    else:
        ticket.release()  # asyncio.wait_for let the result win over the cancel: the caller releases
    assert used(c) == (0, 0, 0)


async def test_queue_timeout_raises_a_503_with_retry_after() -> None:
    c = control(blocks=1, timeout=0.05)
    first = await c.acquire(d("a"))
    with pytest.raises(Overloaded) as e:
        await c.acquire(d("b"))
    assert e.value.status == 503 and e.value.code == "queue_timeout" and e.value.reason == "queue_timeout"
    assert int(e.value.headers["Retry-After"]) >= 1
    assert c.metrics.rejected["queue_timeout"] == 1
    first.release()
    assert used(c) == (0, 0, 0)


async def test_displaced_waiter_gets_its_rejection() -> None:
    c = control(blocks=1, max_queued=2)
    first = await c.acquire(d("a", user="x"))
    heavy = [asyncio.ensure_future(c.acquire(d(f"h{i}", user="heavy"))) for i in range(2)]
    await asyncio.sleep(0)
    light = asyncio.ensure_future(c.acquire(d("l", user="light")))
    await asyncio.sleep(0)
    with pytest.raises(GatewayError) as e:
        await heavy[1]
    assert e.value.status == 503 and e.value.reason == "displaced_by_fair_share"
    first.release()
    (await heavy[0]).release()  # neither user was served yet: arrival order
    (await light).release()
    assert used(c) == (0, 0, 0)


async def test_prefilled_reconciles_and_refunds() -> None:
    c = control(blocks=10)
    keys = ("k0", "k1")
    a = await c.acquire(Demand(id="a", pool="m", user="u", private_blocks=1, shared_keys=keys))
    b = await c.acquire(Demand(id="b", pool="m", user="v", private_blocks=1, shared_keys=keys))
    assert used(c)[0] == 6
    a.prefilled(0)
    b.prefilled(2)  # the engine found b's prompt blocks cached (a holds them)
    b.prefilled(2)  # once only
    assert used(c)[0] == 4 and c.metrics.kv_refunded_blocks == 2
    a.release()
    b.release()
    b.prefilled(2)  # after release: ignored
    assert used(c) == (0, 0, 0)


async def test_a_forgotten_ticket_is_released_when_collected(caplog: pytest.LogCaptureFixture) -> None:
    c = control(blocks=1)
    await c.acquire(d("a"))  # dropped on the floor
    gc.collect()
    assert used(c) == (0, 0, 0)
    assert "never released" in caplog.text


async def test_closed_pool_rejects_waiters() -> None:
    c = control(blocks=1)
    first = await c.acquire(d("a"))
    waiting = asyncio.ensure_future(c.acquire(d("b")))
    await asyncio.sleep(0)
    c.close("m")
    with pytest.raises(GatewayError) as e:
        await waiting
    assert e.value.status == 503 and e.value.code == "engine_unavailable"
    first.release()
