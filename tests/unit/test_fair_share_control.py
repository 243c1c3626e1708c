"""gateway/admission.py with fair share: the timer that frees an idle user's room, and the settings."""

from __future__ import annotations

import asyncio

import pydantic
import pytest

from gateway.admission import AdmissionControl
from gateway.settings import AdmissionSettings, FairShareSettings
from policies.demand import Demand, PoolLimits, QueueLimits
from policies.fair import FairShare


def d(id: str, user: str) -> Demand:
    return Demand(id=id, pool="m", user=user, private_blocks=1)


def control(fair: FairShare, clock: list[float]) -> AdmissionControl:
    return AdmissionControl(
        [PoolLimits(name="m", blocks=10, max_sequences=2)],
        QueueLimits(),
        timeouts_s={0: 60.0},
        fair=fair,
        clock=lambda: clock[0],
    )


async def test_room_kept_for_an_idle_user_falls_free_on_its_timer() -> None:
    now = [0.0]  # the policy's clock; the timer's delay is real (0.2 s)
    c = control(FairShare(idle_s=0.2), now)
    (await c.acquire(d("l1", "light"))).release()  # light is owed a slot until 0.2
    now[0] = 0.1
    first = await c.acquire(d("h1", "heavy"))
    second = asyncio.ensure_future(c.acquire(d("h2", "heavy")))
    await asyncio.sleep(0)
    assert not second.done() and c.snapshot("m").owed_slots == 1  # the free slot is light's
    now[0] = 0.2
    ticket = await asyncio.wait_for(second, 30)  # the timer admits it: no other event comes
    assert ticket.id == "h2" and c.snapshot("m").active_users == 1
    first.release()
    ticket.release()


async def test_the_timer_moves_and_stops_with_what_is_owed() -> None:
    now = [0.0]
    c = control(FairShare(idle_s=50.0), now)
    a = await c.acquire(d("a", "x"))
    a.release()  # x idle until 50
    first = c._expiry
    assert first is not None and first[0] == 50.0
    now[0] = 10.0
    b = await c.acquire(d("b", "x"))  # busy again: no timer
    assert c._expiry is None and first[1].cancelled()
    b.release()  # idle until 60
    assert c._expiry is not None and c._expiry[0] == 60.0
    c.close("m")  # another event: the same timer stays
    assert c._expiry is not None and c._expiry[0] == 60.0
    c.reopen("m")


def test_without_a_loop_the_next_event_expires_it() -> None:
    now = [0.0]
    c = control(FairShare(idle_s=5.0), now)
    c.state.offer(d("a", "x"), 0.0)
    c._dispatch(c.state.release("a", 0.0))
    assert c._expiry is None  # no running loop to set a timer on
    assert c.state.next_expiry() == 5.0


def test_settings_default_on_and_validated() -> None:
    a = AdmissionSettings()
    assert a.fair_share.enabled and a.fair_share.policy() == FairShare()
    off = AdmissionSettings(
        fair_share={"enabled": False, "reserve_slots": 2, "idle_s": 0, "max_share": 0.5, "newcomer_s": 60}
    )
    assert off.fair_share.policy() == FairShare(
        enabled=False, reserve_slots=2, idle_s=0.0, max_share=0.5, newcomer_s=60.0
    )
    bads = ({"reserve_slots": 0}, {"idle_s": -1}, {"max_share": 0}, {"max_share": 1.5}, {"newcomer_s": -1}, {"nope": 1})
    for bad in bads:
        with pytest.raises(pydantic.ValidationError):
            FairShareSettings(**bad)  # type: ignore[arg-type]
