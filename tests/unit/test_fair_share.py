"""policies/fair.py and its use in policies/admission.py: room kept for users who run
little, a lone user's every slot, idle grace and its expiry."""

from __future__ import annotations

import itertools

from policies.admission import Admission
from policies.demand import Admit, Demand, PoolLimits, Queue, QueueLimits, Reject
from policies.fair import OFF, FairShare, Shares

_ids = itertools.count()
ON = FairShare()  # the defaults: one slot owed per active user, 1 s of idle grace


def demand(user: str, blocks: int = 1, *, sequences: int = 1, pool: str = "m") -> Demand:
    return Demand(id=f"{user}-{next(_ids)}", pool=pool, user=user, sequences=sequences, private_blocks=blocks)


def make(slots: int = 4, blocks: int = 100, fair: FairShare = ON) -> Admission:
    return Admission([PoolLimits(name="m", blocks=blocks, max_sequences=slots)], QueueLimits(), fair)


def flood(a: Admission, user: str, n: int, now: float = 0.0, blocks: int = 1) -> list[tuple[Demand, object]]:
    out = []
    for _ in range(n):
        d = demand(user, blocks)
        out.append((d, a.offer(d, now)[0]))
    return out


# -- the policy alone -----------------------------------------------------------


def test_a_lone_user_may_take_everything() -> None:
    s = Shares(ON, slots=4, blocks=40)
    s.queued("heavy", 1, 10)
    s.started("heavy", 1)
    s.unqueued("heavy", 0.0)
    # Running its due, alone: nobody else is owed anything.
    assert s.allows("heavy", 1, 10, free_slots=1, free_blocks=10)
    assert s.owed() == (0, 0) and s.active() == 1


def test_others_are_owed_a_slot_and_a_short_requests_kv() -> None:
    s = Shares(ON, slots=4, blocks=40)  # a slot's share: 10 blocks
    s.queued("heavy", 1, 30)
    s.started("heavy", 1)
    s.unqueued("heavy", 0.0)
    s.queued("light", 2, 4)  # 2 blocks per sequence
    assert s.owed() == (1, 2)
    assert not s.allows("heavy", 1, 1, free_slots=1, free_blocks=30)  # the last slot is light's
    assert not s.allows("heavy", 1, 29, free_slots=3, free_blocks=30)  # so is light's KV
    assert s.allows("heavy", 1, 28, free_slots=3, free_blocks=30)
    assert s.allows("light", 2, 30, free_slots=3, free_blocks=30)  # it takes what it is owed
    s.queued("huge", 1, 1000)
    assert s.owed() == (2, 12)  # a long request is owed a slot's share only


def test_an_idle_user_keeps_its_room_for_idle_s_then_frees_it() -> None:
    s = Shares(FairShare(idle_s=2.0), slots=4, blocks=40)
    s.queued("light", 1, 1)
    s.started("light", 1)
    s.unqueued("light", 0.0)
    assert s.owed() == (0, 0)  # running: it claims what it is owed
    s.ended("light", 1, 10.0)
    assert s.owed() == (1, 1) and s.next_expiry() == 12.0
    assert not s.expire(11.9)
    # Busy again before its grace ends, then idle again: the first expiry is stale.
    s.queued("light", 1, 1)
    s.unqueued("light", 11.0)
    assert s.next_expiry() == 13.0
    assert not s.expire(12.5)
    assert s.expire(13.0)
    assert s.owed() == (0, 0) and s.active() == 0 and s.next_expiry() is None


def test_stale_expiries_of_a_user_already_gone() -> None:
    s = Shares(ON, slots=4, blocks=40)
    s.queued("u", 1, 1)
    s.unqueued("u", 5.0)
    s.queued("u", 1, 1)
    s.unqueued("u", 5.0)  # idle twice at the same time: two heap items, one user
    assert s.expire(6.0)
    assert s.next_expiry() is None and not s.expire(7.0)


def test_a_busy_users_old_expiry_is_skipped_when_asked_when() -> None:
    s = Shares(ON, slots=4, blocks=40)
    s.queued("u", 1, 1)
    s.unqueued("u", 0.0)
    s.queued("u", 1, 1)  # busy again
    assert s.next_expiry() is None


def test_off_allows_everything_and_asks_for_no_timer() -> None:
    s = Shares(OFF, slots=2, blocks=10)
    s.queued("heavy", 1, 1)
    s.started("heavy", 1)
    s.queued("light", 1, 1)
    s.unqueued("light", 0.0)
    assert s.allows("heavy", 1, 1, free_slots=1, free_blocks=9)
    assert s.next_expiry() is None
    assert s.active() == 2  # still counted, for /sparkgate/stats


def test_no_reserve_means_no_room_kept() -> None:
    s = Shares(FairShare(reserve_slots=0), slots=2, blocks=10)
    s.queued("light", 1, 1)
    s.queued("heavy", 1, 1)
    s.started("heavy", 1)
    assert s.owed() == (0, 0) and s.allows("heavy", 1, 9, free_slots=1, free_blocks=9)


# -- in admission ------------------------------------------------------------------


def test_a_flood_leaves_a_slot_for_a_light_user_who_gets_it_at_once() -> None:
    a = make(slots=4)
    light = demand("light")
    assert isinstance(a.offer(light, 0.0)[0], Admit)
    a.release(light.id, 0.1)  # light is between requests: still active
    decisions = [d for _, d in flood(a, "heavy", 8, now=0.2)]
    assert sum(isinstance(d, Admit) for d in decisions) == 3  # not 4: one slot is light's
    assert a.snapshot("m").owed_slots == 1 and a.snapshot("m").active_users == 2
    nxt = demand("light")
    assert isinstance(a.offer(nxt, 0.3)[0], Admit)  # no wait behind the flood
    assert a.snapshot("m").running_sequences == 4  # every slot busy while both run


def test_a_lone_user_gets_every_slot_once_the_others_grace_ends() -> None:
    a = make(slots=4)
    light = demand("light")
    a.offer(light, 0.0)
    a.release(light.id, 0.0)
    waiting = flood(a, "heavy", 5, now=0.5)
    assert [isinstance(d, Admit) for _, d in waiting] == [True, True, True, False, False]
    assert a.next_expiry() == 1.0
    assert a.expire(0.9) == []
    admitted = a.expire(1.0)
    assert [x.id for x in admitted] == [waiting[3][0].id]  # the slot light was owed
    assert a.snapshot("m").running_sequences == 4 and a.next_expiry() is None


def test_without_fair_share_the_flood_takes_every_slot() -> None:
    a = make(slots=4, fair=OFF)
    light = demand("light")
    a.offer(light, 0.0)
    a.release(light.id, 0.1)
    assert sum(isinstance(d, Admit) for _, d in flood(a, "heavy", 8, now=0.2)) == 4
    assert isinstance(a.offer(demand("light"), 0.3)[0], Queue)
    assert a.next_expiry() is None


def test_expiry_on_a_later_event_frees_the_room() -> None:
    a = make(slots=2)
    light = demand("light")
    a.offer(light, 0.0)
    a.release(light.id, 0.0)
    (h1, _), (h2, d2) = flood(a, "heavy", 2, now=0.1)
    assert isinstance(d2, Queue)
    # No timer fired, but the next event comes after the grace: it expires first.
    assert [x.id for x in a.release(h1.id, 5.0)] == [h2.id]
    later = demand("heavy")
    assert isinstance(a.offer(later, 6.0)[0], Admit)


def test_a_waiting_users_kv_is_kept_from_the_flood() -> None:
    a = make(slots=8, blocks=40)  # a slot's share: 5 blocks
    heavy = flood(a, "heavy", 4, now=0.0, blocks=10)
    assert all(isinstance(d, Admit) for _, d in heavy)  # alone: the whole pool
    big = demand("light", blocks=20)
    assert isinstance(a.offer(big, 0.1)[0], Queue)  # owed 1 slot and 5 blocks
    a.release(heavy[0][0].id, 0.2)  # 10 free: not enough for light's 20; heavy may not take them
    more = demand("heavy", blocks=10)
    assert isinstance(a.offer(more, 0.3)[0], Queue)
    small = demand("heavy", blocks=5)
    assert isinstance(a.offer(small, 0.3)[0], Queue)  # its FIFO: behind `more`
    assert [x.id for x in a.release(heavy[1][0].id, 0.4)] == [big.id]


def test_cancel_timeout_and_close_of_waiting_entries_start_the_grace() -> None:
    a = make(slots=1)
    (h, _), _ = flood(a, "heavy", 2, now=0.0)
    light = demand("light")
    a.offer(light, 0.0)
    assert a.cancel(light.id, 2.0) == []  # the only slot is heavy's
    assert a.next_expiry() == 3.0
    other = demand("other")
    a.offer(other, 2.5)
    assert a.timeout(other.id, 2.5) is not None
    a.close("m", now=2.5)
    assert a.snapshot("m").queued == 0 and a.snapshot("m").active_users == 3
    assert a.cancel(h.id, 4.0) == []  # a running one is released
    # light's and other's grace is over; heavy, idle now, has its own.
    assert a.snapshot("m").active_users == 1 and a.snapshot("m").owed_slots == 1


def test_a_displaced_entry_starts_its_users_grace() -> None:
    a = Admission([PoolLimits(name="m", blocks=100, max_sequences=1)], QueueLimits(max_queued=2), ON)
    a.offer(demand("runner"), 0.0)
    flood(a, "heavy", 2, now=0.0)
    _, others = a.offer(demand("light"), 0.5)
    assert len(others) == 1  # heavy's newest entry gives way
    assert a.snapshot("m").active_users == 3 and a.snapshot("m").owed_slots == 2


def test_multiple_sequences_count_as_slots() -> None:
    a = make(slots=4)
    light = demand("light")
    a.offer(light, 0.0)
    a.release(light.id, 0.0)
    two = demand("heavy", sequences=2)
    assert isinstance(a.offer(two, 0.0)[0], Admit)  # under its due: it may take what it is owed
    assert isinstance(a.offer(demand("heavy", sequences=2), 0.0)[0], Queue)  # would leave light 0
    assert isinstance(a.offer(demand("heavy"), 0.0)[0], Queue)  # its FIFO waits behind


def test_max_share_caps_a_user_only_while_others_are_active() -> None:
    s = Shares(FairShare(max_share=0.5), slots=4, blocks=40)  # 2 of 4 slots beside others
    s.queued("heavy", 1, 1)
    s.started("heavy", 1)
    s.started("heavy", 1)
    assert s.allows("heavy", 1, 1, free_slots=2, free_blocks=30)  # alone: every slot
    s.queued("light", 1, 1)
    s.started("light", 1)  # running its due: owed nothing
    assert s.owed() == (0, 0)
    assert not s.allows("heavy", 1, 1, free_slots=1, free_blocks=30)  # at its share
    assert s.allows("light", 1, 1, free_slots=1, free_blocks=30)  # under: may take more
    low = Shares(FairShare(max_share=0.1, reserve_slots=2), slots=4, blocks=40)  # never under its due
    low.queued("y", 1, 1)
    low.queued("x", 1, 1)
    low.started("x", 2)
    low.started("y", 2)
    assert low.allows("x", 0, 0, free_slots=0, free_blocks=40) and not low.allows("x", 1, 1, 0, 40)


def test_max_share_spares_the_user_asking_for_the_least() -> None:
    s = Shares(FairShare(max_share=0.5), slots=8, blocks=80)  # 4 of 8 slots beside others
    for user, running, waiting in (("heavy", 4, 20), ("light", 4, 1)):
        for _ in range(running):
            s.queued(user, 1, 1)
            s.started(user, 1)
            s.unqueued(user, 0.0)
        for _ in range(waiting):
            s.queued(user, 1, 1)
    assert not s.allows("heavy", 1, 1, free_slots=4, free_blocks=40)  # the flood: at its share
    assert s.allows("light", 1, 1, free_slots=4, free_blocks=40)  # asks for less: not capped
    for _ in range(19):  # light asks for as much as heavy now: capped alike
        s.queued("light", 1, 1)
    assert not s.allows("light", 1, 1, free_slots=4, free_blocks=40)


def _held_for_light(now: float = 0.5) -> tuple[Admission, Demand]:
    """Two slots: light idle (owed one until 1.0), heavy running one, its second waiting."""
    a = make(slots=2)
    light = demand("light")
    a.offer(light, 0.0)
    a.release(light.id, 0.0)
    _, (waiting, d) = flood(a, "heavy", 2, now=now)
    assert isinstance(d, Queue)
    return a, waiting


def test_any_event_after_the_grace_admits_who_the_freed_room_fits() -> None:
    a, waiting = _held_for_light()
    decision, others = a.offer(demand("light", blocks=1000), 5.0)  # rejected: too large
    assert isinstance(decision, Reject) and others == [Admit(waiting.id, 1, 0)]
    a, waiting = _held_for_light()
    assert a.release("no-such-job", 5.0) == [Admit(waiting.id, 1, 0)]
    a, waiting = _held_for_light()
    # Cancelled as the room fell free: it was admitted first (the shell gives it back).
    assert a.cancel(waiting.id, 5.0) == [Admit(waiting.id, 1, 0)]


# -- room for a newcomer ------------------------------------------------------------

NEWCOMER = FairShare(newcomer_s=30.0)  # one slot owed, 1 s of idle grace, 30 s of newcomer room


def test_a_user_expected_back_finds_a_slot_free_beside_a_flood() -> None:
    a = make(slots=2, fair=NEWCOMER)
    light = demand("light")
    a.offer(light, 0.0)
    a.release(light.id, 0.0)  # light reads the answer: idle, expected back until 30
    (_, first), (waiting, second) = flood(a, "heavy", 2, now=5.0)  # light's own room lapsed at 1
    assert isinstance(first, Admit) and isinstance(second, Queue)  # a slot kept for a newcomer
    assert a.snapshot("m").owed_slots == 1 and a.next_expiry() == 30.0
    back = demand("light")
    assert isinstance(a.offer(back, 20.0)[0], Admit)  # its next question starts at once
    a.release(back.id, 21.0)  # expected back until 51 now
    assert a.expire(22.0) == []  # light's grace ended at 22: the newcomer room holds
    assert a.next_expiry() == 51.0
    assert [x.id for x in a.expire(51.0)] == [waiting.id]  # nobody came: the flood takes it


def test_a_lone_user_still_gets_every_slot_and_a_stale_expiry_is_skipped() -> None:
    a = make(slots=2, fair=NEWCOMER)
    for now in (0.0, 10.0):  # bursts with pauses: it is never its own newcomer
        (d1, r1), (d2, r2) = flood(a, "heavy", 2, now=now)
        assert isinstance(r1, Admit) and isinstance(r2, Admit)
        a.release(d1.id, now + 1.0)
        a.release(d2.id, now + 1.0)
    assert a.next_expiry() == 12.0  # the first burst's items are stale: skipped
    assert a.expire(100.0) == [] and a.next_expiry() is None
    s = Shares(FairShare(newcomer_s=1.0, idle_s=1.0), slots=2, blocks=20)  # both lapse together
    s.queued("x", 1, 1)
    s.unqueued("x", 0.0)
    assert s.expire(1.0) and s.owed() == (0, 0)


def test_newcomer_room_lapses_with_the_last_time_a_user_was_seen() -> None:
    s = Shares(FairShare(newcomer_s=5.0), slots=2, blocks=20)
    s.queued("x", 1, 1)
    s.unqueued("x", 0.0)  # idle: active until 1, expected back until 5
    s.queued("x", 1, 1)  # busy again before either
    assert not s.expire(6.0) and s.owed() == (1, 1)  # expected back lapsed while active: its own room stays
    s.unqueued("x", 6.0)
    s.queued("x", 1, 1)
    s.unqueued("x", 8.0)  # expected back until 13; the entry until 11 is stale
    assert s.expire(10.0) and s.owed() == (1, 10)  # no longer active, still expected: a slot's share kept
    assert s.expire(20.0) and s.owed() == (0, 0) and s.next_expiry() is None


# -- a lone user's backlog in the engine's own queue ---------------------------------


def short(user: str, max_output: int = 1) -> Demand:
    return Demand(id=f"{user}-{next(_ids)}", pool="m", user=user, private_blocks=1, max_output=max_output)


def backlog_pool(fair: FairShare = ON) -> Admission:
    return Admission([PoolLimits(name="m", blocks=100, max_sequences=2)], QueueLimits(lone_backlog=1.0), fair)


def test_a_lone_user_s_short_requests_queue_in_the_engine_too() -> None:
    a = backlog_pool()
    got = [a.offer(short("solo"), 0.0)[0] for _ in range(5)]
    assert [type(x) for x in got] == [Admit, Admit, Admit, Admit, Queue]  # 2 slots + 2 waiting in vLLM
    assert a.snapshot("m").running_sequences == 4
    for max_output in (0, 17):  # not known to be short, or not short: the engine's slots only
        b = backlog_pool()
        assert [type(b.offer(short("solo", max_output), 0.0)[0]) for _ in range(3)] == [Admit, Admit, Queue]


def test_beside_another_user_or_one_expected_back_there_is_no_backlog() -> None:
    a = backlog_pool()
    for _ in range(2):
        a.offer(short("solo"), 0.0)
    a.offer(short("other"), 0.0)  # owed its slot: queued for it, and the pool is shared now
    assert isinstance(a.offer(short("solo"), 0.0)[0], Queue)
    b = backlog_pool(NEWCOMER)
    seen = short("other")
    b.offer(seen, 0.0)
    b.release(seen.id, 0.0)  # idle after 1 s, expected back until 30
    got = [b.offer(short("solo"), 5.0)[0] for _ in range(3)]
    assert [type(x) for x in got] == [Admit, Queue, Queue]  # one slot kept for it, no backlog
