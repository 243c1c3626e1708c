"""gateway/plan/fleet.py: the simulated boxes in virtual time, with the gateway's own load model.

Deterministic (virtual time, seeded arrivals): these check the mechanics, not performance
(benchmarks/routing.py compares the strategies)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

import pytest

from engine_adapter.spark import H200, MODELS, Serving
from gateway.plan.fleet import Arrival, Deployed, Fleet, Placement, RequestKind, arrivals, simulate
from gateway.settings import LatencyProfile, RoutingSettings, SloClass
from policies.latency import Prediction
from policies.load import RESERVE_HOLD_SHARE, LoadModel, RouteInfo, RouteQuery
from policies.routing import NoRoute

A3B = LatencyProfile(
    prefill_tokens_per_s=7575,
    ttft_overhead_s=0.08,
    prefill_s_per_ktoken2=0.0015,
    tpot_s=0.00585,
    tpot_per_sequence_s=0.00074,
)
DENSE = LatencyProfile(
    prefill_tokens_per_s=3016,
    ttft_overhead_s=0.08,
    prefill_s_per_ktoken2=0.00378,
    tpot_s=0.0127,
    tpot_per_sequence_s=0.00245,
)
ROUTING = RoutingSettings(
    enabled=True,
    classes={
        "interactive": SloClass(ttft_s=2.0, tpot_s=0.06),
        "document": SloClass(ttft_s=60.0, tpot_s=0.06),
        "batch": SloClass(deadline_s=300.0),
    },
)
TWO_BOXES = Placement(
    "two",
    (
        Deployed("dense", "Qwen3.8-27B", "box-1", 65.0, quality=34, latency=DENSE),
        Deployed("moe", "Qwen3.6-35B-A3B", "box-2", 65.0, quality=25, latency=A3B),
    ),
)
# Two engines sharing one box's bandwidth.
ONE_BOX = Placement(
    "pair",
    (
        Deployed("dense", "Qwen3.8-27B", "box", 30.0, latency=DENSE),
        Deployed("moe", "Qwen3.6-35B-A3B", "box", 30.0, latency=A3B),
    ),
)
CHAT = RequestKind("chat", 1.0, (1_000, 2_000), 100, "interactive", shared_prefix=500)


def test_arrivals_are_seeded_and_share_their_kind_s_prefix() -> None:
    a, b = arrivals([CHAT], 1.0, 60, seed=3), arrivals([CHAT], 1.0, 60, seed=3)
    assert [x.prompt for x in a] == [x.prompt for x in b] and 30 < len(a) < 90
    assert all(x.prompt[:500] == a[0].prompt[:500] and 1_000 <= len(x.prompt) <= 2_000 for x in a)


def test_every_offered_request_is_served_or_turned_away() -> None:
    for strategy in ("router", "round-robin", "moe"):
        s = simulate(TWO_BOXES, ROUTING, strategy, [CHAT], 0.5, 120, seed=1)
        assert s.offered == s.completed + s.rejected
        assert sum(s.by_model.values()) == s.offered - s.rejected
    rr = simulate(TWO_BOXES, ROUTING, "round-robin", [CHAT], 0.5, 120, seed=1)
    assert abs(rr.by_model["dense"] - rr.by_model["moe"]) <= 1


def test_an_idle_fleet_routes_to_the_better_model_and_meets_the_slo() -> None:
    s = simulate(TWO_BOXES, ROUTING, "router", [CHAT], 0.05, 300, seed=1)
    assert s.by_model == {"dense": s.offered} and s.attainment == 1.0


def test_a_document_arriving_on_a_busy_chat_engine_is_held_back() -> None:
    solo = Placement("one", (Deployed("dense", "Qwen3.8-27B", "box", 65.0, latency=DENSE),))
    fleet = Fleet(solo, ROUTING, "router")
    doc = RequestKind("document", 1.0, (40_000, 40_000), 100, "document")
    chat = Arrival("chat", 0.0, CHAT, tuple(range(1_000, 2_500)))
    document = Arrival("doc", 0.5, doc, tuple(range(3_000, 43_000)))
    fleet.run([chat, document])
    out = fleet.outcomes
    assert out["chat"].first is not None and out["doc"].first is not None
    # The document's 15 s prefill would have stalled the chat's decode: it waited for the chat.
    assert out["doc"].first > out["chat"].last  # type: ignore[operator]
    chat_tpot = (out["chat"].last - out["chat"].first) / (out["chat"].tokens - 1)  # type: ignore[operator]
    assert chat_tpot < 0.06
    assert MODELS["Qwen3.8-27B"].kv_budget_gib == 65.0


def test_host_time_lengthens_every_step_of_its_model_by_its_sequences() -> None:
    """A machine whose host takes longer per engine step (a calibration probe's fit) adds that
    time to each step, and its per-sequence time for each sequence in it: one chat alone, one
    prefill step and one per token after it; three at once, three sequences a step."""
    chat = CHAT

    def run(n: int, step: float, seq: float) -> tuple[float, float]:
        d = Deployed("dense", "Qwen3.8-27B", "box", 65.0, latency=DENSE, host_step_s=step, host_seq_s=seq)
        # one token a step (no drafts), as on the GPU runs
        fleet = Fleet(Placement("one", (d,), serving=Serving(spec_decode=False)), ROUTING, "dense")
        load = [Arrival(f"c{i}", 0.0, chat, tuple(range(1_000 * i, 1_000 * i + 1_500))) for i in range(n)]
        fleet.run(load)
        o = fleet.outcomes["c0"]
        assert o.first is not None and o.last is not None and o.tokens == chat.output_tokens
        return o.first, (o.last - o.first) / (o.tokens - 1)

    (ttft, tpot), (slow_ttft, slow_tpot) = run(1, 0.0, 0.0), run(1, 0.002, 0.001)
    # (two prefill steps: the prompt's cacheable blocks, then the rest of it)
    assert slow_ttft == pytest.approx(ttft + 2 * 0.003) and slow_tpot == pytest.approx(tpot + 0.003)
    (_, tpot3), (_, slow_tpot3) = run(3, 0.0, 0.0), run(3, 0.002, 0.001)
    # (about: its first steps share the others' prefills)
    assert slow_tpot3 == pytest.approx(tpot3 + 0.002 + 3 * 0.001, abs=1e-4)


def _route(ttft_s: float, tpot_s: float | None = 0.06, hold_s: float = 0.0) -> RouteInfo:
    return RouteInfo("dense", "document", "test", Prediction(1.0, 0.01), tpot_s, ttft_s, hold_s, output_tokens=100)


def _ask(
    load: LoadModel, requested: str, names: Sequence[str], slo: str, prompt: range, output: int
) -> RouteInfo | NoRoute:
    query = RouteQuery(requested=requested, candidates=names, slo_class=slo, prompt_ids=prompt, output_tokens=output)
    return load.route(query)


def _routed(load: LoadModel, *query: Any) -> tuple[str, RouteInfo]:
    info = _ask(load, *query)
    assert isinstance(info, RouteInfo), info
    return info.model, info


def _turned_away(load: LoadModel, *query: Any) -> NoRoute:
    no = _ask(load, *query)
    assert isinstance(no, NoRoute) and no.kind != "unavailable", no
    return no


def test_a_held_request_is_held_again_while_it_would_still_stall_a_decode() -> None:
    fleet = Fleet(Placement("one", (Deployed("dense", "Qwen3.8-27B", "box", 65.0, latency=DENSE),)), ROUTING, "router")
    load, clock = fleet.model, fleet.clock
    assert load is not None
    decoding = load.start_flight("dense", range(2_000), 300, None, _route(60.0))
    decoding.admitted()
    clock.now = 1.0
    decoding.tokens(1, 0)
    held = load.start_flight("dense", range(40_000), 100, None, _route(54.0, hold_s=1.0))
    clock.now = 2.0  # its hold is over, but its ~20 s prefill would still stall the decode
    more = held.hold_again()
    assert more > 1.0 and held.not_before == clock.now + more
    clock.now = 50.0  # waiting longer would miss its own first-token objective: it goes
    assert held.hold_again() == 0.0
    clock.now = 3.0
    decoding.finish()  # nothing left to stall
    assert held.hold_again() == 0.0


def test_a_prefill_progresses_at_half_speed_while_a_box_mate_prefills() -> None:
    fleet = Fleet(ONE_BOX, ROUTING, "router")
    load, clock = fleet.model, fleet.clock
    assert load is not None
    lane = load.lanes["dense"]
    long = load.start_flight("dense", range(20_000), 10, None, _route(60.0))
    long.admitted()
    work = lane.prefill_s(20_000)
    clock.now = 4.0
    assert lane.prefill_backlog_s() == pytest.approx(work - 4.0)  # alone on the box: full speed
    mate = load.start_flight("moe", range(1_000), 10, None, _route(60.0))
    # Both steps longer than a time slice: they take turns slice by slice
    assert lane.turn_ratio(load.lanes["moe"].turn_s(), lane.prefill_step_s(20_000)) == 1.0
    clock.now = 8.0  # the mate has been busy for the last 4 s: they count half
    assert lane.prefill_backlog_s() == pytest.approx(work - 6.0)
    mate.finish()
    clock.now = 10.0
    assert lane.prefill_backlog_s() == pytest.approx(work - 8.0)
    assert lane.until_first_token(long, clock.now) == pytest.approx(work - 8.0)


def _tpots(placement: Placement, long: str) -> dict[str, float]:
    """Each model's decode time per token with one request each, `long`'s outlasting the other's."""
    fleet = Fleet(placement, ROUTING, "round-robin")
    load = [
        Arrival(name, 0.0, RequestKind(name, 1.0, (100, 100), 2_000 if name == long else 200, "batch"), (1,) * 100)
        for name in ("dense", "moe")
    ]
    fleet.run(load)
    return {
        a.id: (o.last - o.first) / (o.tokens - 1)
        for a in load
        if (o := fleet.outcomes[a.id]).last is not None and o.first is not None
    }


def _on_h200(placement: Placement, moe_host_s: float = 0.0) -> Placement:
    """`placement` on H200s, one token per step (no drafts: the 35B-A3B's step is shorter than a
    slice), with `moe_host_s` of host time per 35B-A3B step."""
    serving = Serving(weight_dtype="bf16", kv_dtype="fp8", spec_decode=False, routing_locality=1.0)
    models = tuple(dataclasses.replace(d, host_step_s=moe_host_s) if d.name == "moe" else d for d in placement.models)
    return dataclasses.replace(placement, models=models, box=H200, serving=serving)


def test_engines_on_one_box_take_turns_on_its_gpu() -> None:
    """Each slice of a step's work waits for a slice of a busy box-mate's (a step, or a time
    slice of a longer one), at most the box's mate wait: a short step beside a long one waits
    that long, a long one beside a short one loses that step's share."""
    alone = _tpots(_on_h200(TWO_BOXES), "dense")  # each on a box of its own
    q, wait = H200.gpu_timeslice_s, H200.mate_wait_s
    assert alone["moe"] < wait < q < alone["dense"]
    for short, long in (("moe", "dense"), ("dense", "moe")):
        shared = _tpots(_on_h200(ONE_BOX), long)[short]
        ratio = min(alone[long], wait) / min(alone[short], q)
        assert shared == pytest.approx(alone[short] * (1 + ratio), rel=0.02), (short, alone, shared)


def test_a_host_s_time_hides_in_its_waits_for_a_busy_box_mate() -> None:
    """While an engine's host works between its steps, the GPU runs a busy box-mate's kernels:
    the slice the engine would wait for. Beside a decoding 27B, the 35B-A3B's host time up to
    its wait costs nothing, and beyond it only the excess; alone, all of it."""

    def tpot(mate: bool, host_s: float) -> float:
        return _tpots(_on_h200(ONE_BOX if mate else TWO_BOXES, host_s), "dense")["moe"]

    wait = H200.mate_wait_s  # the 27B's decode step is longer: the 35B-A3B waits this long
    assert tpot(False, 0.002) == pytest.approx(tpot(False, 0.0) + 0.002)
    assert tpot(True, 0.002) == pytest.approx(tpot(True, 0.0))
    assert tpot(True, wait + 0.004) == pytest.approx(tpot(True, 0.0) + 0.004)


def _capped(cap: int, model: str = "Qwen3.8-27B", latency: LatencyProfile = DENSE) -> Fleet:
    """One engine, named "dense" whatever its model, with steps of 2,048 tokens and, with
    `cap`, vLLM's long-prefill cap."""
    one = Deployed(
        "dense", model, "box", 65.0, latency=latency, max_num_batched_tokens=2048, long_prefill_token_threshold=cap
    )
    return Fleet(Placement("one", (one,)), ROUTING, "router")


def test_with_a_chunk_cap_a_short_prompt_waits_for_a_chunk_of_a_long_one_not_all_of_it() -> None:
    capped, fcfs = _capped(1024), _capped(0)
    for fleet in (capped, fcfs):
        assert fleet.model is not None
        doc = fleet.model.start_flight("dense", range(30_000), 10, None, _route(60.0))
        doc.admitted()
    assert capped.model is not None and fcfs.model is not None
    lane, whole = capped.model.lanes["dense"], fcfs.model.lanes["dense"]
    doc = lane.flights[0]
    # First come, first served: all of the document's prefill.
    assert whole.prefill_ahead_s(1_500) == pytest.approx(whole.prefill_s(30_000))
    # Capped: a chunk of it for each of its own two steps, and the step under way, which a
    # prompt alone fills with a whole budget.
    assert lane.prefill_ahead_s(1_500) == pytest.approx(2 * lane.chunk_s(doc, 1024) + lane.chunk_s(doc, 2048))
    assert lane.prefill_ahead_s(1_500) < 0.2 * whole.prefill_ahead_s(1_500)
    # A long prompt still waits for all of it.
    assert lane.prefill_ahead_s(40_000) == pytest.approx(lane.prefill_s(30_000))


def test_with_a_chunk_cap_a_chat_is_served_beside_a_long_prefill_and_without_it_is_turned_away() -> None:
    doc = RequestKind("document", 1.0, (30_000, 30_000), 50, "document")
    load = [Arrival("doc", 0.0, doc, tuple(range(3_000, 33_000))), Arrival("chat", 1.0, CHAT, tuple(range(1_500)))]
    capped, fcfs = _capped(1024, "Qwen3.6-35B-A3B", A3B), _capped(0, "Qwen3.6-35B-A3B", A3B)
    capped.run(load)
    fcfs.run(load)
    assert fcfs.outcomes["chat"].model is None  # ~4 s behind the document's prompt: turned away
    chat = capped.outcomes["chat"]
    assert chat.model == "dense" and chat.first is not None and chat.first - chat.arrival < 2.0


def test_with_a_chunk_cap_a_prompt_that_would_delay_a_prefilling_chat_past_its_ttft_harms_it() -> None:
    fleet = _capped(1024)
    load, clock = fleet.model, fleet.clock
    assert load is not None
    lane = load.lanes["dense"]
    chat = load.start_flight("dense", range(5_000), 300, None, _route(2.0))
    chat.admitted()
    clock.now = 0.2  # ~1.5 s of its prefill left, 1.8 s to its objective
    harm = lane.harms(3_000, ())  # a second chat's ~1 s prefill would share its steps
    assert "past their TTFT objective" in harm.reason and harm.clears_s > 0
    assert not lane.harms(300, ()).reason  # a small one fits in the slack
    assert not _capped(0).model.lanes["dense"].harms(3_000, ()).reason  # type: ignore[union-attr]


def test_headroom_is_a_margin_to_prefer_not_a_reason_to_turn_away() -> None:
    fleet = Fleet(Placement("one", (Deployed("dense", "Qwen3.8-27B", "box", 65.0, latency=DENSE),)), ROUTING, "router")
    load = fleet.model
    assert load is not None and load.headroom == 0.9
    # Idle, a 5,200-token chat prefills in ~1.9 s: over 90% of the 2 s objective, within it.
    model, info = _routed(load, "auto", ["dense"], "interactive", range(5_200), 100)
    assert model == "dense" and 1.8 < info.predicted.ttft_s < 2.0
    assert info.ttft_objective == 2.0
    no = _turned_away(load, "auto", ["dense"], "interactive", range(6_000), 100)
    assert re.search(r"TTFT 2\.\d+s > 2s", no.message)  # ~2.2 s: the objective itself is missed


RESERVED = ROUTING.model_copy(
    update={"classes": {**ROUTING.classes, "interactive": SloClass(ttft_s=2.0, tpot_s=0.06, reserve_slots=2)}}
)


def _one(routing: RoutingSettings = RESERVED) -> Fleet:
    return Fleet(Placement("one", (Deployed("dense", "Qwen3.8-27B", "box", 65.0, latency=DENSE),)), routing, "router")


def test_lenient_work_that_can_wait_leaves_reserved_slots_free() -> None:
    fleet = _one()
    load, clock = fleet.model, fleet.clock
    assert load is not None and load.lanes["dense"].slots == 4
    for _ in range(2):  # two summaries decoding: two of the four slots
        s = load.start_flight("dense", range(10_000), 1_000, None, _route(60.0))
        s.admitted()
        s.tokens(1, 0)
    model, info = _routed(load, "auto", ["dense"], "batch", range(8_000), 1_000)
    # A third would leave one free: it waits until the first of them is predicted done.
    assert model == "dense" and info.hold_s > 5.0
    assert info.reason.endswith("(to keep 2 slots free for interactive requests)")
    # A chat takes the slot.
    _, chat = _routed(load, "auto", ["dense"], "interactive", range(1_000), 100)
    assert chat.hold_s == 0.0
    # Held, the summary defers: it is not ahead of the chat, nor does it count as work there.
    held = load.start_flight("dense", range(8_000), 1_000, None, info)
    lane = load.lanes["dense"]
    assert held not in lane.ahead() and lane.prefill_all_s() == 0.0
    # At its hold's end it is held again while the slots are still taken, and goes once one is free.
    clock.now = held.not_before
    assert held.hold_again() > 0.0
    lane.flights[0].finish()
    clock.now = held.not_before
    assert held.hold_again() == 0.0
    # Without a reserved class, nothing is held.
    plain = _one(ROUTING)
    assert plain.model is not None
    for _ in range(3):
        plain.model.start_flight("dense", range(10_000), 1_000, None, _route(60.0)).admitted()
    _, info = _routed(plain.model, "auto", ["dense"], "batch", range(8_000), 1_000)
    assert info.hold_s == 0.0


def test_a_reserve_hold_ends_once_half_the_held_request_s_deadline_is_spent() -> None:
    """Held for a reserved class, lenient work still goes while half its deadline is left:
    room for its prediction's error, which a request held to its last moment has none of."""
    fleet = _one()
    load, clock = fleet.model, fleet.clock
    assert load is not None
    for _ in range(2):  # two long decodes keep two of the four slots for ~90 s
        s = load.start_flight("dense", range(1_000), 5_000, None, _route(60.0))
        s.admitted()
        s.tokens(1, 0)
    _, info = _routed(load, "auto", ["dense"], "batch", range(8_000), 1_000)
    held = load.start_flight("dense", range(8_000), 1_000, None, info)
    assert info.hold_s > 0.0
    lane = load.lanes["dense"]
    with lane.as_if_absent(held):
        own = lane.predict_tokens(8_000, 0, 1_000).total_s(1_000)
    half = load.slo("batch").deadline_s * RESERVE_HOLD_SHARE  # 0.9 headroom x 300 s x 0.5
    assert half == pytest.approx(135.0) and own < half
    clock.now = held.routed_at + 1.0
    wait = held.hold_again()
    assert wait > 0.0  # the slots are still taken...
    clock.now = held.routed_at + half - own - wait + 0.5
    assert held.hold_again() == 0.0  # ...and it goes: waiting on would eat into the second half
    assert lane.running() == 2


def test_lenient_work_does_not_take_the_last_engine_ready_for_the_reserved_class() -> None:
    fleet = Fleet(TWO_BOXES, RESERVED, "router")
    load, clock = fleet.model, fleet.clock
    assert load is not None
    for t in (0.0, 1.0):  # what the chats look like, and how often they come
        clock.now = t
        name, info = _routed(load, "auto", ["dense", "moe"], "interactive", range(1_500), 100)
        assert name == "dense"
        load.start_flight(name, range(1_500), 100, None, info).finish()
    assert load.reference("interactive") == (1_500, 0, 100) and load.rate("interactive") == 1.0
    busy = load.start_flight("moe", range(60_000), 300, None, _route(60.0))  # a long prefill: no chat fits there
    busy.admitted()
    assert not load.ready(load.lanes["moe"], "interactive", (1_500, 0, 100))
    # A document on the 27B would leave no engine for chats for as long as it prefills; it can
    # wait until the 35B-A3B's prompt is in, and does.
    name, info = _routed(load, "dense", ["dense"], "document", range(20_000), 300)
    assert name == "dense" and info.hold_s > 5.0
    assert info.reason.endswith("(to keep an engine ready for interactive requests)")
    # One that cannot wait that long (~51 s of prefill) would cost more chats than itself:
    # turned away.
    no = _turned_away(load, "dense", ["dense"], "document", range(80_000), 300)
    assert re.search(r"cannot wait .* to keep an engine ready for interactive", no.message)
    # The one held: at its hold's end, held on while the 35B-A3B is still busy (another prompt
    # came) and its first token can still be in time.
    held = load.start_flight("dense", range(20_000), 300, None, info)
    more = load.start_flight("moe", range(30_000), 300, None, _route(60.0))  # another prompt there meanwhile
    more.admitted()
    clock.now = held.not_before
    assert held.hold_again() > 0.0  # held on: its first token can still be in time
    more.finish()
    held.finish()
    # Once the 35B-A3B is ready again, nothing is held.
    busy.finish()
    _, info = _routed(load, "dense", ["dense"], "document", range(20_000), 300)
    assert info.hold_s == 0.0


def test_a_box_mate_is_expected_as_busy_as_lately_beyond_its_work_now() -> None:
    fleet = Fleet(ONE_BOX, ROUTING, "router")
    load, clock = fleet.model, fleet.clock
    assert load is not None
    mate = load.lanes["moe"]
    for start in (0.0, 20.0, 40.0):  # busy 10 s of every 20 for the last minute
        clock.now = start
        f = load.start_flight("moe", range(1_000), 10, None, _route(60.0))
        clock.now = start + 10.0
        f.finish()
    clock.now = 60.0
    duty, gap = mate.duty()
    assert duty == pytest.approx(0.5) and gap == pytest.approx(10.0)
    # Idle now: nothing for the first idle gap, then half of the time.
    assert mate.busy_within(0.0, 5.0) == 0.0
    assert mate.busy_within(0.0, 30.0) == pytest.approx(10.0)
    # So a long prompt on the 27B is predicted slower than it would be on an idle box, by the
    # mate's steps it takes turns with for half of the time past the gap; a chat not.
    lane = load.lanes["dense"]
    alone = lane.latency.predict(prompt_tokens=40_000).ttft_s
    turns = lane.turn_ratio(mate.turn_s(), lane.prefill_step_s(40_000))
    assert 0 < turns < 1  # one of its decode steps per time slice of the 27B's prefill
    assert lane.predict_tokens(40_000, 0, 10).ttft_s == pytest.approx(alone + 0.5 * (alone - 10.0) * turns)
    assert lane.predict_tokens(1_000, 0, 10).ttft_s == pytest.approx(lane.latency.predict(prompt_tokens=1_000).ttft_s)


def test_a_deployed_block_size_is_the_engine_s_and_caches_whole_blocks_only() -> None:
    """A hybrid engine's stretched blocks: a shared prefix shorter than one block is never reused."""

    def second_ttft(block_size: int | None) -> float:
        d = Deployed("m", "Qwen3.6-35B-A3B", "b", 8.0, latency=A3B, block_size=block_size)
        fleet = Fleet(Placement("p", (d,)), ROUTING, "m")
        assert fleet.lanes["m"].sim.kv_spec().block_size == (block_size or 16)
        shared = tuple(range(1000, 2000))
        kind = RequestKind("chat", 1.0, (1200, 1200), 4, "interactive", shared_prefix=1000)
        first = Arrival("a", 0.0, kind, (*shared, *range(5000, 5200)))
        fleet.run([first, Arrival("b", 5.0, kind, (*shared, *range(6000, 6200)))])
        o = fleet.outcomes["b"]
        assert o.first is not None
        return o.first - o.arrival

    # 16-token blocks reuse 992 of the 1,000 shared tokens; one 2,096-token block reuses none
    assert second_ttft(None) < 0.7 * second_ttft(2096)
