"""policies/admission.py: the ledger, the fair queue and every decision branch."""

from __future__ import annotations

import itertools

import pytest

from policies.admission import Admission
from policies.demand import Admit, Demand, PoolLimits, Queue, QueueLimits, Reject, RejectReason

_ids = itertools.count()


def demand(
    user: str = "u",
    blocks: int = 1,
    *,
    pool: str = "m",
    priority: int = 0,
    sequences: int = 1,
    keys: tuple[str, ...] = (),
    tokens: int = 10,
    cap: int | None = None,
    id: str | None = None,
) -> Demand:
    return Demand(
        id=id or f"{user}-{next(_ids)}",
        pool=pool,
        user=user,
        priority=priority,
        sequences=sequences,
        private_blocks=blocks,
        shared_keys=keys,
        tokens=tokens,
        user_max_running=cap,
    )


def make(blocks: int = 10, slots: int = 4, **limits: int) -> Admission:
    return Admission([PoolLimits(name="m", blocks=blocks, max_sequences=slots)], QueueLimits(**limits))


def offer(a: Admission, d: Demand) -> Admit | Queue | Reject:
    decision, _ = a.offer(d)
    return decision


def test_admits_while_it_fits_then_queues() -> None:
    a = make(blocks=10)
    assert isinstance(offer(a, demand(blocks=6)), Admit)
    q = offer(a, demand(blocks=6))
    assert q == Queue(q.id, 0)
    snap = a.snapshot("m")
    assert (snap.used_blocks, snap.admitted, snap.queued, snap.queued_tokens) == (6, 1, 1, 10)


def test_release_admits_the_waiting_and_is_idempotent() -> None:
    a = make(blocks=10)
    first = demand(blocks=6)
    offer(a, first)
    second = demand(blocks=6)
    offer(a, second)
    assert a.release(first.id) == [Admit(second.id, 6, 0)]
    assert a.release(first.id) == []
    assert a.release("never-seen") == []
    assert a.release(second.id) == []
    snap = a.snapshot("m")
    assert (snap.used_blocks, snap.running_sequences, snap.admitted, snap.queued) == (0, 0, 0, 0)
    assert a.user_running("u") == 0


def test_slots_bound_sequences() -> None:
    a = make(blocks=100, slots=3)
    assert isinstance(offer(a, demand(sequences=2)), Admit)
    assert isinstance(offer(a, demand(sequences=2)), Queue)
    assert isinstance(offer(a, demand(sequences=1)), Queue)  # behind: the slots are the limit, not KV


def test_too_large_for_the_pool_or_the_slots() -> None:
    a = make(blocks=10, slots=2)
    r = offer(a, demand(blocks=11))
    assert isinstance(r, Reject) and r.reason is RejectReason.REQUEST_TOO_LARGE and r.retry_after is None
    assert "KV-cache blocks" in r.message
    r = offer(a, demand(sequences=3))
    assert isinstance(r, Reject) and r.reason is RejectReason.REQUEST_TOO_LARGE and "sequences" in r.message
    assert (r.reason.label, r.reason.status, r.reason.code) == ("request_too_large", 400, "request_too_large")


def test_queue_full_by_count_and_by_tokens() -> None:
    a = make(blocks=1, max_queued=2, max_queued_tokens=100)
    offer(a, demand("a"))
    offer(a, demand("b"))
    offer(a, demand("c"))
    r = offer(a, demand("d"))
    assert isinstance(r, Reject) and r.reason is RejectReason.QUEUE_FULL
    assert r.retry_after is not None and r.retry_after >= 1
    a2 = make(blocks=1, max_queued_tokens=100)
    offer(a2, demand("a"))
    offer(a2, demand("b", tokens=60))
    r = offer(a2, demand("c", tokens=50))
    assert isinstance(r, Reject) and r.reason is RejectReason.QUEUE_TOKENS_FULL
    assert (r.reason.status, r.reason.code) == (503, "server_overloaded")


def test_per_user_queue_bound() -> None:
    a = make(blocks=1, max_queued_per_user=1)
    offer(a, demand("a"))
    offer(a, demand("a"))
    r = offer(a, demand("a"))
    assert isinstance(r, Reject) and r.reason is RejectReason.USER_QUEUE_FULL
    assert (r.reason.status, r.reason.code) == (429, "rate_limit_exceeded")
    assert isinstance(offer(a, demand("b")), Queue)


def test_full_queue_displaces_the_heaviest_user_not_the_light_newcomer() -> None:
    a = make(blocks=1, max_queued=3)
    offer(a, demand("heavy"))  # running
    queued = [demand("heavy") for _ in range(3)]
    for d in queued:
        offer(a, d)
    light = demand("light")
    decision, others = a.offer(light)
    assert isinstance(decision, Queue)
    assert len(others) == 1 and isinstance(others[0], Reject)
    assert others[0].id == queued[-1].id and others[0].reason is RejectReason.DISPLACED
    # Now heavy has 2 queued and light 1: another heavy request gets no room.
    r = offer(a, demand("heavy"))
    assert isinstance(r, Reject) and r.reason is RejectReason.QUEUE_FULL


def test_displacement_respects_classes_and_token_bound() -> None:
    a = make(blocks=1, max_queued=2, max_queued_tokens=1000)
    offer(a, demand("x"))
    offer(a, demand("batch", priority=1))
    offer(a, demand("batch", priority=1))
    # An urgent newcomer displaces a batch entry even from a user with equal counts.
    decision, others = a.offer(demand("y", priority=0))
    assert isinstance(decision, Queue) and len(others) == 1
    # A batch newcomer cannot displace an interactive one.
    b = make(blocks=1, max_queued=1)
    offer(b, demand("x"))
    offer(b, demand("y", priority=0))
    r = offer(b, demand("z", priority=1))
    assert isinstance(r, Reject) and r.reason is RejectReason.QUEUE_FULL
    # Displacing would not free enough tokens: no displacement.
    c = make(blocks=1, max_queued=2, max_queued_tokens=100)
    offer(c, demand("x"))
    offer(c, demand("heavy", tokens=10))
    offer(c, demand("heavy", tokens=10))
    r = offer(c, demand("light", tokens=95))
    assert isinstance(r, Reject) and r.reason is RejectReason.QUEUE_FULL


def test_round_robin_light_user_waits_at_most_one_slot() -> None:
    a = make(blocks=1)
    running = demand("heavy")
    offer(a, running)
    flood = [demand("heavy") for _ in range(5)]
    for d in flood:
        offer(a, d)
    light = demand("light")
    offer(a, light)
    order = []
    current = running.id
    for _ in range(6):
        admitted = a.release(current)
        assert len(admitted) == 1
        current = admitted[0].id
        order.append(current)
    assert order[0] == light.id  # next slot: before the flood's second request
    assert order[1:] == [d.id for d in flood]


def test_least_recently_served_user_goes_first() -> None:
    a = make(blocks=1)
    offer(a, demand("a"))
    a_more = [demand("a"), demand("a")]
    b_more = [demand("b"), demand("b")]
    for d in (*a_more, *b_more):
        offer(a, d)
    first = a.release(next(iter(a._pools["m"].holdings)))
    assert first[0].id == b_more[0].id  # b was never served
    second = a.release(first[0].id)
    assert second[0].id == a_more[0].id
    third = a.release(second[0].id)
    assert third[0].id == b_more[1].id


def test_priority_classes_strict() -> None:
    a = make(blocks=1)
    running = demand("a")
    offer(a, running)
    batch = demand("b", priority=1)
    urgent = demand("c", priority=0)
    offer(a, batch)
    offer(a, urgent)
    assert a.release(running.id)[0].id == urgent.id


def test_lower_class_waits_while_an_urgent_one_does_not_fit() -> None:
    a = make(blocks=10)
    big_running = demand("a", blocks=6)
    offer(a, big_running)
    urgent_big = demand("b", blocks=6)
    assert isinstance(offer(a, urgent_big), Queue)
    small_batch = demand("c", blocks=1, priority=1)
    assert isinstance(offer(a, small_batch), Queue)  # would fit, but must not take the urgent one's room


def test_bounded_bypass_then_drain() -> None:
    a = make(blocks=10, slots=10, max_bypass=2)
    offer(a, demand("a", blocks=6))
    big = demand("big", blocks=6)
    assert isinstance(offer(a, big), Queue)
    # Small requests from other users may pass the big one twice...
    assert isinstance(offer(a, demand("s1", blocks=1)), Admit)
    assert isinstance(offer(a, demand("s2", blocks=1)), Admit)
    # ...then the pool drains for it.
    assert isinstance(offer(a, demand("s3", blocks=1)), Queue)


def test_user_concurrency_cap_skips_without_blocking_others() -> None:
    a = make(blocks=100, slots=10)
    assert isinstance(offer(a, demand("a", cap=1)), Admit)
    capped = demand("a", cap=1)
    assert isinstance(offer(a, capped), Queue)
    assert isinstance(offer(a, demand("b", cap=1)), Admit)  # not blocked by a's capped entry
    assert a.user_running("a") == 1
    running = next(h for h in a._pools["m"].holdings if h.startswith("a-"))
    assert a.release(running) == [Admit(capped.id, 1, 0)]


def test_cancel_waiting_and_admitted() -> None:
    a = make(blocks=1)
    running = demand()
    offer(a, running)
    w1, w2 = demand("x"), demand("x")
    offer(a, w1)
    offer(a, w2)
    assert a.cancel(w1.id) == []  # the new head gets a heap item: w2 is next
    assert a.cancel(running.id) == [Admit(w2.id, 1, 0)]
    assert a.snapshot("m").queued == 0


def test_cancel_non_head_and_timeout() -> None:
    a = make(blocks=1)
    offer(a, demand())
    w1, w2 = demand("x"), demand("x")
    offer(a, w1)
    offer(a, w2)
    a.cancel(w2.id)
    r = a.timeout(w1.id)
    assert isinstance(r, Reject) and r.reason is RejectReason.QUEUE_TIMEOUT and r.retry_after is not None
    assert a.timeout(w1.id) is None
    assert a.snapshot("m").queued == 0 and a.snapshot("m").queued_tokens == 0


def test_shared_prefix_blocks_counted_once_after_prefill() -> None:
    a = make(blocks=9)
    keys = ("k0", "k1", "k2")
    first = demand("a", blocks=2, keys=keys)
    assert offer(a, first) == Admit(first.id, 5, 0)
    # Not prefilled yet: a twin pays for its own copies (vLLM might not share them yet).
    twin = demand("b", blocks=2, keys=keys)
    assert isinstance(offer(a, twin), Queue)
    a.cancel(twin.id)
    a.prefilled(first.id)
    twin2 = demand("b", blocks=2, keys=keys)
    assert offer(a, twin2) == Admit(twin2.id, 2, 3)
    assert a.snapshot("m").used_blocks == 7 and a.snapshot("m").shared_blocks == 3
    # The owner leaves; the twin still holds the shared blocks.
    a.release(first.id)
    assert a.snapshot("m").used_blocks == 5
    a.release(twin2.id)
    assert a.snapshot("m").used_blocks == 0 and a.snapshot("m").shared_blocks == 0


def test_chain_hit_stops_at_first_missing_block() -> None:
    a = make(blocks=20)
    first = demand("a", blocks=1, keys=("k0", "k1"))
    offer(a, first)
    a.prefilled(first.id)
    other = demand("b", blocks=1, keys=("x0", "k1"))  # same second key, different first: no hit
    assert offer(a, other) == Admit(other.id, 3, 0)
    # k1 is in the table already, so `other` pays for it privately (a duplicate).
    assert a.snapshot("m").used_blocks == 3 + 3


def test_reconcile_refunds_duplicates_and_charges_misses() -> None:
    a = make(blocks=20)
    keys = ("k0", "k1")
    first = demand("a", blocks=1, keys=keys)
    offer(a, first)
    twin = demand("b", blocks=1, keys=keys)
    assert offer(a, twin) == Admit(twin.id, 3, 0)  # duplicates: first is not prefilled
    assert a.snapshot("m").used_blocks == 6
    # The engine did find them cached (vLLM caches blocks eagerly): refund.
    delta, admitted = a.reconcile(twin.id, 2)
    assert (delta, admitted) == (-2, [])
    assert a.snapshot("m").used_blocks == 4
    a.release(first.id)
    assert a.snapshot("m").used_blocks == 3  # the twin keeps the shared blocks alive
    # A misprediction the other way is charged.
    c = make(blocks=20)
    one = demand("a", blocks=1, keys=keys)
    offer(c, one)
    c.prefilled(one.id)
    two = demand("b", blocks=1, keys=keys)
    offer(c, two)
    assert c.reconcile(two.id, 0) == (2, [])
    assert c.snapshot("m").used_blocks == 3 + 3
    # Unknown ids and hits beyond the keys are harmless.
    assert c.reconcile("nope", 5) == (0, [])
    c.prefilled("nope")
    assert c.reconcile(two.id, 0) == (0, [])


def test_reconcile_refund_admits_the_waiting() -> None:
    a = make(blocks=6)
    keys = ("k0", "k1")
    first = demand("a", blocks=1, keys=keys)
    offer(a, first)
    twin = demand("b", blocks=1, keys=keys)
    offer(a, twin)  # 3 + 3 = 6: full
    waiting = demand("c", blocks=2)
    assert isinstance(offer(a, waiting), Queue)
    delta, admitted = a.reconcile(twin.id, 2)
    assert delta == -2 and admitted == [Admit(waiting.id, 2, 0)]


def test_revived_cache_hit_is_still_charged() -> None:
    """Hit blocks that nobody live holds come off vLLM's free list: they cost the pool."""
    a = make(blocks=20)
    d = demand("a", blocks=1, keys=("k0",))
    offer(a, d)
    assert a.reconcile(d.id, 1) == (0, [])
    assert a.snapshot("m").used_blocks == 2


def test_pools_are_independent_but_user_caps_are_global() -> None:
    a = Admission(
        [PoolLimits(name="m", blocks=1, max_sequences=4), PoolLimits(name="n", blocks=1, max_sequences=4)],
    )
    x = demand("u", pool="m", cap=1)
    assert isinstance(offer(a, x), Admit)
    y = demand("u", pool="n", cap=1)
    assert isinstance(offer(a, y), Queue)  # room in n, but u is at its cap
    assert a.release(x.id) == [Admit(y.id, 1, 0)]


def test_close_rejects_waiters_and_new_requests() -> None:
    a = make(blocks=1)
    running = demand()
    offer(a, running)
    w = demand("x")
    offer(a, w)
    rejects = a.close("m")
    assert [r.id for r in rejects] == [w.id] and rejects[0].reason is RejectReason.POOL_CLOSED
    r = offer(a, demand())
    assert isinstance(r, Reject) and r.reason is RejectReason.POOL_CLOSED
    assert a.release(running.id) == []


def test_a_closed_pool_says_when_to_retry_and_reopens() -> None:
    a = make(blocks=1)
    running = demand()
    offer(a, running)
    a.close("m", 7.5)
    r = offer(a, demand())
    assert isinstance(r, Reject) and r.retry_after == 7.5 and a.is_closed("m")
    a.close("m", None)  # left down: no retry hint
    r = offer(a, demand())
    assert isinstance(r, Reject) and r.retry_after is None
    assert a.snapshot("m").admitted == 1  # holdings stay until their jobs release them
    assert a.pool_limits("m").blocks == 1  # what a restarted engine's pool must match
    assert a.reopen("m") == [] and not a.is_closed("m")
    assert isinstance(offer(a, demand("late")), Queue)  # the running one still holds the block
    assert a.release(running.id) != []  # ...and its release admits the newcomer


def test_position_counts_more_urgent_classes() -> None:
    a = make(blocks=1)
    offer(a, demand("a"))
    offer(a, demand("b", priority=1))
    q = offer(a, demand("c", priority=0))
    assert isinstance(q, Queue) and q.position == 0
    q = offer(a, demand("d", priority=1))
    assert isinstance(q, Queue) and q.position == 2


@pytest.mark.parametrize("reason", list(RejectReason))
def test_every_reason_has_a_label_status_and_code(reason: RejectReason) -> None:
    assert reason.label and reason.code and reason.status in (400, 429, 503)


def test_displacement_picks_the_heaviest_of_several_users() -> None:
    a = make(blocks=1, max_queued=5)
    offer(a, demand("x"))
    heavy = [demand("heavy") for _ in range(3)]
    for d in (*heavy, demand("mid"), demand("mid")):
        offer(a, d)
    decision, others = a.offer(demand("light"))
    assert isinstance(decision, Queue) and [o.id for o in others] == [heavy[-1].id]


def test_user_running_counts_each_job() -> None:
    a = make(blocks=10)
    one, two = demand("u"), demand("u")
    offer(a, one)
    offer(a, two)
    a.release(one.id)
    assert a.user_running("u") == 1


def test_scan_gives_up_after_max_scan_misfits() -> None:
    a = make(blocks=10, slots=10, max_scan=2, max_bypass=100)
    offer(a, demand("a", blocks=9))
    for u in ("b", "c"):
        assert isinstance(offer(a, demand(u, blocks=5)), Queue)
    # Two heads that do not fit are enough to stop looking: a small one behind them waits.
    assert isinstance(offer(a, demand("d", blocks=1)), Queue)
    b = make(blocks=10, slots=10, max_scan=3, max_bypass=100)
    offer(b, demand("a", blocks=9))
    for u in ("b", "c"):
        offer(b, demand(u, blocks=5))
    assert isinstance(offer(b, demand("d", blocks=1)), Admit)


def test_hybrid_hits_only_at_a_live_replay_boundary() -> None:
    """Measured (tiny Qwen3-Next, 640-token blocks): B sharing 1300 tokens with a running
    A of 1400 hit 1280 = A's replay boundary, and took 2 attention blocks from A for free."""
    a = make(blocks=50)
    owner = Demand(id="A", pool="m", user="a", private_blocks=3, shared_keys=("k0", "k1"), resume_at_end_only=True)
    offer(a, owner)
    a.prefilled("A")
    same = Demand(id="B", pool="m", user="b", private_blocks=3, shared_keys=("k0", "k1"), resume_at_end_only=True)
    assert offer(a, same) == Admit("B", 3, 2)
    # A prompt that stops between the owner's blocks has no state to resume from: no hit.
    short = Demand(id="C", pool="m", user="c", private_blocks=3, shared_keys=("k0",), resume_at_end_only=True)
    assert offer(a, short) == Admit("C", 4, 0)  # k0 is in the table: C pays for a duplicate
    a.release("A")
    a.release("B")
    a.release("C")
    assert a.snapshot("m").used_blocks == 0
