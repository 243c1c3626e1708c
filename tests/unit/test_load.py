"""policies/load.py and policies/lanes.py: routing's load model on a hand-driven clock, with
no gateway (tests/unit/test_fleet.py drives it on the simulated boxes)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from policies.lanes import BUSY_HISTORY_S, MAX_PREFILL_SHARE, PREFILL_WINDOW_S, LaneSpec
from policies.latency import Prediction, Profile
from policies.load import LoadModel, RouteInfo, RouteQuery
from policies.routing import NoRoute, Slo

SLOW = Profile(  # the 27B's fit: best, slow
    prefill_tokens_per_s=3016,
    ttft_overhead_s=0.08,
    prefill_s_per_ktoken2=0.00378,
    tpot_s=0.0127,
    tpot_per_sequence_s=0.00245,
)
FAST = Profile(  # the 35B-A3B's fit
    prefill_tokens_per_s=7575,
    ttft_overhead_s=0.08,
    prefill_s_per_ktoken2=0.0015,
    tpot_s=0.00585,
    tpot_per_sequence_s=0.00074,
)
CLASSES = {
    "interactive": Slo("interactive", ttft_s=2.0, tpot_s=0.06),
    "document": Slo("document", ttft_s=60.0, tpot_s=0.06, prefer="fast"),
    "batch": Slo("batch", deadline_s=300.0, prefer="fast"),
}
RESERVED = {**CLASSES, "interactive": Slo("interactive", ttft_s=2.0, tpot_s=0.06, reserve_slots=2)}
ALIASES = {"auto": "class", "best": "best", "fast": "fast"}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def lane(name: str, clock: Clock, profile: Profile = SLOW, **kw: Any) -> LaneSpec:
    return LaneSpec(name=name, profile=profile, slots=4, clock=clock, **kw)


def two(clock: Clock, classes: dict[str, Slo] = CLASSES, **kw: Any) -> LoadModel:
    """The slow best model and the fast one, on boxes of their own."""
    specs = [lane("moe", clock, FAST, quality=25, box="b", **kw), lane("dense", clock, quality=34, box="a", **kw)]
    return LoadModel(specs, classes, aliases=ALIASES, headroom=0.9)


def ask(
    model: LoadModel, requested: str, slo: str, prompt: int, output: int = 100, names: Sequence[str] = ()
) -> RouteInfo | NoRoute:
    query = RouteQuery(
        requested=requested,
        candidates=list(names or model.lanes),
        slo_class=slo,
        prompt_ids=range(prompt),
        output_tokens=output,
    )
    return model.route(query)


def info(model: str = "dense", slo: str = "document", ttft_s: float | None = 60.0, hold_s: float = 0.0) -> RouteInfo:
    return RouteInfo(
        model,
        slo,
        "test",
        Prediction(1.0, 0.01),
        tpot_objective=0.06,
        ttft_objective=ttft_s,
        hold_s=hold_s,
        output_tokens=100,
    )


def test_lanes_go_best_first_and_box_mates_share_a_box() -> None:
    clock = Clock()
    model = two(clock)
    assert list(model.lanes) == ["dense", "moe"]
    assert model.lanes["dense"].mates == [] and model.lanes["moe"].mates == []
    one_box = LoadModel([lane("a", clock), lane("b", clock)], CLASSES, aliases=ALIASES)
    assert one_box.lanes["a"].mates == [one_box.lanes["b"]] and one_box.headroom == 1.0
    assert model.slo("interactive") == Slo("interactive", ttft_s=2.0 * 0.9, tpot_s=0.06 * 0.9)


def test_aliases_route_by_their_strategy_and_a_name_by_itself() -> None:
    model = two(Clock())
    best = ask(model, "best", "batch", 1_000)
    assert isinstance(best, RouteInfo) and best.model == "dense" and best.reason == "best: meets batch"
    fast = ask(model, "fast", "interactive", 1_000)
    assert isinstance(fast, RouteInfo) and fast.model == "moe"
    by_class = ask(model, "auto", "document", 1_000)  # documents prefer fast
    assert isinstance(by_class, RouteInfo) and by_class.model == "moe" and by_class.slo == "document"
    named = ask(model, "moe", "interactive", 1_000, names=["moe"])
    assert isinstance(named, RouteInfo) and named.ttft_objective == 2.0 * 0.9 and named.tpot_objective == 0.06 * 0.9
    assert ask(model, "dense", "batch", 1_000, names=["dense"]) == RouteInfo(
        "dense",
        "batch",
        "requested; meets batch",
        model.lanes["dense"].predict_tokens(1_000, 0, 100),
        None,
        None,
        output_tokens=100,
    )
    assert model.routed == {"dense": 2, "moe": 3} and model.rejected == 0


def test_no_route_when_every_engine_is_down_is_no_slo_verdict() -> None:
    clock = Clock()
    model = LoadModel([lane("a", clock, healthy=lambda: False)], CLASSES, aliases=ALIASES)
    assert ask(model, "auto", "interactive", 1_000) == NoRoute(
        "no model is available", 5.0, "unavailable", "No engine that can serve 'auto' is available now (a)."
    )
    assert model.rejected == 0


def test_turned_away_busy_when_load_is_the_reason_and_impossible_when_idle_would_not_do() -> None:
    clock = Clock()
    model = LoadModel([lane("a", clock)], CLASSES, aliases=ALIASES, headroom=0.9)
    never = ask(model, "auto", "interactive", 60_000)
    assert isinstance(never, NoRoute) and never.kind == "impossible" and never.retry_after_s is None
    assert never.message.startswith("No model can meet the 'interactive' latency objective for this request even when")
    assert never.message.endswith("Use a less urgent SLO class (e.g. batch) or a shorter prompt.")
    model.start_flight("a", range(30_000), 300)  # a long prompt queued ahead: a chat would wait ~15 s
    busy = ask(model, "auto", "interactive", 1_000)
    assert isinstance(busy, NoRoute) and busy.kind == "busy" and busy.retry_after_s is not None
    assert f"under the current load: {busy.reason}. Retry in about {busy.retry_after_s:g} s" in busy.message
    assert model.rejected == 2 and model.routed == {}


def test_a_flight_s_cached_prefix_and_its_shadow_of_the_engine_s_cache() -> None:
    clock = Clock()
    specs = [lane("small", clock, cache_blocks=4), lane("big", clock, cache_blocks=8), lane("none", clock)]
    model = LoadModel(specs, CLASSES, aliases=ALIASES)
    prompt = range(100)  # 6 whole blocks of 16 before the last token's
    for name in ("small", "big", "none"):
        f = model.start_flight(name, prompt, 10, "team:a")
        f.admitted()
        f.tokens(1, 0)
    small, big, none = (model.lanes[n] for n in ("small", "big", "none"))
    assert len(small.cache) == 4 and small.cached_tokens(small.keys(prompt, "team:a")) == 0  # its first blocks evicted
    assert big.cached_tokens(big.keys(prompt, "team:a")) == 6 * 16
    assert big.cached_tokens(big.keys(prompt, "team:b")) == 0  # another tenant's cache
    assert none.keys(prompt, "team:a") == () and none.cached_tokens(()) == 0


def test_a_flight_finishes_once_and_old_busy_spans_are_dropped() -> None:
    clock = Clock()
    model = LoadModel([lane("a", clock)], CLASSES, aliases=ALIASES)
    a = model.lanes["a"]
    f = model.start_flight("a", range(1_000), 10)
    clock.now = 1.0
    f.finish()
    f.finish()
    assert a.flights == [] and list(a.busy_spans) == [(0.0, 1.0)]
    clock.now = BUSY_HISTORY_S + 10.0
    g = model.start_flight("a", range(1_000), 10)
    clock.now += 1.0
    g.finish()
    assert list(a.busy_spans) == [(BUSY_HISTORY_S + 10.0, BUSY_HISTORY_S + 11.0)]


def test_busy_time_and_duty_count_only_the_spans_that_reach_into_the_window() -> None:
    clock = Clock()
    model = LoadModel([lane("a", clock)], CLASSES, aliases=ALIASES)
    a = model.lanes["a"]
    for start in range(0, 200, 2):  # busy 1 s of every 2, up to 199
        clock.now = float(start)
        f = model.start_flight("a", range(100), 10)
        clock.now += 1.0
        f.finish()
    clock.now = 200.0
    model.start_flight("a", range(100), 10)  # busy again since 200
    clock.now = 200.5

    def overlap(t0: float, t1: float) -> float:  # the definition, over every span
        spans = [*a.busy_spans, (200.0, t1)]
        return sum(max(0.0, min(e, t1) - max(s, t0)) for s, e in spans)

    for t0, t1 in ((190.5, 200.5), (0.0, 3.5), (150.2, 160.7), (199.5, 200.1)):
        assert a.busy_between(t0, t1) == pytest.approx(overlap(t0, t1))
    assert a.busy_between(190.5, 200.5) == pytest.approx(0.5 + 4 + 0.5)
    share, gap = a.duty()  # the last 60 s: from 140.5, 0.5 + 29 closed spans' 1 s + the open 0.5
    assert share == pytest.approx(30.0 / PREFILL_WINDOW_S)
    assert gap == pytest.approx((PREFILL_WINDOW_S - 30.0) / (30 + 1))


def test_a_busy_box_mate_s_share_is_taken_out_of_what_the_model_learns() -> None:
    """On a shared box almost every request overlaps a busy box-mate: its timing still teaches
    the model its own speed, the overlapped time counting half (as the predictions stretch it)."""
    clock = Clock()
    model = LoadModel([lane("a", clock, box="x"), lane("b", clock, box="x")], CLASSES, aliases=ALIASES)
    a = model.lanes["a"]
    own = a.latency.predict(prompt_tokens=3_000)
    mate = model.start_flight("b", range(100), 1_000)
    mate.admitted()  # busy from 0 to the end
    f = model.start_flight("a", range(3_000), 11)
    f.admitted()
    clock.now = 2 * 1.5 * own.ttft_s  # 1.5x slower than the profile, and the mate doubled it
    f.tokens(1, 0)
    step = a.latency.predict(prompt_tokens=1, context_tokens=3_005).tpot_s
    clock.now += 10 * 2 * 1.2 * step  # decode 1.2x slower than the profile, doubled likewise
    f.tokens(10)
    f.finish()
    learned = a.latency.learned()
    assert learned["observations"] == 2
    assert a.latency.predict(prompt_tokens=3_000).ttft_s == pytest.approx(1.5 * own.ttft_s)
    assert learned["tpot"] == {"factor": pytest.approx(1.2), "n": 1}


def test_other_prompts_prefilling_beside_a_request_teach_no_ttft_and_come_out_of_its_tpot() -> None:
    clock = Clock()
    model = LoadModel([lane("a", clock)], CLASSES, aliases=ALIASES)
    a = model.lanes["a"]
    step = a.latency.predict(prompt_tokens=1, concurrency=2, context_tokens=300).tpot_s  # g runs beside it
    f = model.start_flight("a", range(100), 401)
    f.admitted()
    g = model.start_flight("a", range(8_000), 5)
    g.admitted()  # prefills beside f's prefill...
    clock.now = 0.2
    f.tokens(1, 0)
    assert a.latency.observations == 0  # ...which taught nothing: how they share steps is predicted
    clock.now = 3.2
    g.tokens(1, 0)  # a prefill of its own from 0 to 3.2, shared with f's until 0.2: nothing either
    assert a.latency.observations == 0 and [(s, e) for s, e, _ in a.prefill_spans] == [(0.0, 0.2), (0.0, 3.2)]
    assert a.prefilling_within(0.1, 5.0, f) == pytest.approx(3.1)
    assert a.prefilling_within(0.1, 5.0, g) == pytest.approx(0.1)
    h = model.start_flight("a", range(500), 5)
    a.prefilled(h, 1.0, 2.0)  # inside g's: counted once
    assert a.prefilling_within(0.1, 5.0, f) == pytest.approx(3.1)
    clock.now = 3.2 + 400 * step  # f's decode: 3 s of g's prefill, then its own speed
    f.tokens(400)
    f.finish()
    assert a.latency.learned()["tpot"] == {"factor": pytest.approx(1.0), "n": 1}
    h = model.start_flight("a", range(100), 11)  # a decode mostly beside a prefill teaches nothing
    h.admitted()
    clock.now += 0.1
    h.tokens(1, 0)
    model.start_flight("a", range(8_000), 5).admitted()
    clock.now += 3.0
    h.tokens(10)
    h.finish()
    assert a.latency.learned()["tpot"]["n"] == 1
    # Spans older than the busy history go; a first token without an admission is no span.
    clock.now += BUSY_HISTORY_S + 10.0
    late = model.start_flight("a", range(100), 5)
    late.admitted()
    unseen = model.start_flight("a", range(100), 5)
    clock.now += 0.1
    late.tokens(1, 0)
    unseen.tokens(1, 0)
    assert [(s, e) for s, e, _ in a.prefill_spans] == [(clock.now - 0.1, clock.now)]


def test_the_prefill_share_is_the_last_window_s_prefills() -> None:
    clock = Clock()
    model = LoadModel([lane("a", clock)], CLASSES, aliases=ALIASES)
    a = model.lanes["a"]
    one = a.prefill_s(6_000)
    for _ in range(3):
        model.start_flight("a", range(6_000), 10)
        clock.now += 10.0
    assert a.prefill_share() == pytest.approx(3 * one / PREFILL_WINDOW_S)
    clock.now = PREFILL_WINDOW_S + 15.0  # the first two have left the window
    assert a.prefill_share() == pytest.approx(one / PREFILL_WINDOW_S)
    clock.now += PREFILL_WINDOW_S
    assert a.prefill_share() == 0.0 and a.prefills_s == 0.0
    for _ in range(200):  # capped: the engine still decodes between prompts
        model.start_flight("a", range(6_000), 10)
    assert a.prefill_share() == MAX_PREFILL_SHARE


def test_prefill_ahead_of_a_queued_or_held_flight() -> None:
    clock = Clock()
    model = LoadModel([lane("a", clock), lane("b", clock)], CLASSES, aliases=ALIASES)  # one box
    a, b = model.lanes["a"], model.lanes["b"]
    first = model.start_flight("a", range(5_000), 100)
    queued = model.start_flight("a", range(2_000), 100)
    held = model.start_flight("a", range(3_000), 100, None, info("a", hold_s=10.0))
    assert a.prefilled_s(queued, clock.now) == 0.0  # not admitted: nothing done
    assert a.until_first_token(queued, 0.0) == pytest.approx(a.prefill_s(5_000) + a.prefill_s(2_000))
    # A held one comes after everything there now.
    assert a.until_first_token(held, 0.0) == pytest.approx(a.prefill_s(7_000) + a.prefill_s(3_000))
    # Busy: the engine beside it on the box expects it busy until its work is done.
    assert a.busy_s() > a.prefill_all_s() > 0 and b.mates_turns() == [(a.busy_s(), a.turn_s())]
    assert a.busy_within(0.0, 1.0) == 1.0
    first.admitted()
    assert first.prefilling and a.until_first_token(first, 0.0) == pytest.approx(a.prefill_s(5_000))


def test_a_held_request_waiting_its_turn_to_be_rechecked_is_still_held() -> None:
    """The gateway re-checks one held request of a class per engine at a time; the others wait
    their turn past their own hold's end. A newcomer is not predicted to prefill behind them
    (issue 21: chats predicted 1.5 s behind summaries in line took 0.12 s)."""
    clock = Clock()
    model = LoadModel([lane("a", clock)], CLASSES, aliases=ALIASES)
    a = model.lanes["a"]
    summary = model.start_flight("a", range(16_000), 1000, None, info("a", "batch", ttft_s=None, hold_s=1.0))
    clock.now = 2.0  # its hold is over
    with summary.waiting_for_recheck():
        assert a.ahead() == []
        waiting = a.predict_tokens(1_000, 0, 300).ttft_s
    assert summary.not_before == 1.0 and a.ahead() == [summary]
    assert waiting < a.prefill_s(16_000) < a.predict_tokens(1_000, 0, 300).ttft_s


def test_a_newcomer_waits_behind_its_own_queue_not_a_flood_s() -> None:
    """The admission queue takes users in turn: a light user's request is predicted to start
    at the next free slot, not after every request a flood has queued."""
    clock = Clock()
    model = LoadModel([lane("a", clock)], CLASSES, aliases=ALIASES)
    a = model.lanes["a"]
    for _ in range(4):  # every slot
        model.start_flight("a", range(200), 20, user="heavy").admitted()
        clock.now += 0.1
    flood = [model.start_flight("a", range(200), 100, user="heavy") for _ in range(12)]
    assert a.queued_ahead() == a.queued_ahead("heavy") == flood
    assert a.queued_ahead("light") == []  # served less recently than heavy: first in line
    chat = RouteQuery(requested="a", candidates=["a"], slo_class="interactive", prompt_ids=range(200), output_tokens=50)
    light, heavy = model.route(replace(chat, user="light")), model.route(replace(chat, user="heavy"))
    assert isinstance(light, RouteInfo) and isinstance(heavy, NoRoute)
    assert isinstance(model.route(chat), NoRoute)  # no user: first come, first served
    # Served more recently than heavy, with one request queued: heavy's next two go first.
    model.start_flight("a", range(200), 100, user="light").admitted()
    mine = model.start_flight("a", range(200), 100, user="light")
    assert a.queued_ahead("light") == [*flood[:2], mine]


def test_with_a_chunk_cap_requests_past_their_first_token_or_without_one_due_are_no_ttft_victims() -> None:
    clock = Clock()
    model = LoadModel([lane("a", clock, chunk_tokens=1024, step_tokens=2048)], CLASSES, aliases=ALIASES)
    a = model.lanes["a"]
    decoding = model.start_flight("a", range(1_000), 300, None, info("a", ttft_s=2.0))
    decoding.admitted()
    clock.now = 0.5
    decoding.tokens(1, 0)
    model.start_flight("a", range(5_000), 300).admitted()  # prefilling, no objective
    assert "TTFT" not in a.harms(3_000, ()).reason


def test_a_held_request_goes_when_waiting_longer_would_miss_its_own_first_token() -> None:
    clock = Clock()
    model = LoadModel([lane("a", clock)], CLASSES, aliases=ALIASES)
    decoding = model.start_flight("a", range(2_000), 300, None, info("a"))
    decoding.admitted()
    clock.now = 1.0
    decoding.tokens(1, 0)
    held = model.start_flight("a", range(40_000), 100, None, info("a", ttft_s=22.0, hold_s=1.0))
    clock.now = 2.0  # its ~19 s prefill would still stall the decode, but it is due by 23 s
    assert model.lanes["a"].harms(40_000, (), skip=held).reason
    assert held.hold_again() == 0.0


def test_lenient_work_before_any_reserved_request_or_beside_a_ready_engine_is_not_held() -> None:
    clock = Clock()
    model = two(clock, RESERVED)
    sent = ask(model, "auto", "batch", 1_000)  # no chat seen yet: nothing to keep an engine ready for
    assert isinstance(sent, RouteInfo) and sent.hold_s == 0.0
    for t in (1.0, 2.0):
        clock.now = t
        chat = ask(model, "auto", "interactive", 1_500)
        assert isinstance(chat, RouteInfo) and chat.model == "dense"
        model.start_flight(chat.model, range(1_500), 100, None, chat).finish()
    assert model.reference("interactive") == (1_500, 0, 100) and model.rate("interactive") == 1.0
    model.start_flight("moe", range(60_000), 300).admitted()  # no chat fits there now
    assert not model.ready(model.lanes["moe"], "interactive", (1_500, 0, 100))
    # A short summary on the ready 27B leaves it ready; on the other it takes no ready engine.
    for names in (["dense", "moe"], ["moe", "dense"]):
        summary = ask(model, names[0], "batch", 1_000, names=names)
        assert isinstance(summary, RouteInfo) and summary.hold_s == 0.0


def test_with_aligned_chunks_a_prompt_longer_than_a_steps_room_waits_for_the_prefill_ahead() -> None:
    # The 35B-A3B with FP8 KV on vLLM: 2,096-token blocks (and chunks), 4,096-token steps. Beside
    # a document's 2,096-token chunk a step has 2,000 tokens of room: a 2,400-token chat's first
    # chunk would end short of its first block boundary, so vLLM holds it until the document has
    # prefilled; a 1,500-token chat (no boundary before its end) prefills beside it.
    clock = Clock()
    shape = {"chunk_tokens": 2096, "step_tokens": 4096, "block_size": 2096}
    aligned = LoadModel([lane("a", clock, FAST, aligned_chunks=True, **shape)], CLASSES, aliases=ALIASES)
    free = LoadModel([lane("a", clock, FAST, **shape)], CLASSES, aliases=ALIASES)
    for model in (aligned, free):
        model.start_flight("a", range(50_000), 300).admitted()
    a, f = aligned.lanes["a"], free.lanes["a"]
    document = a.prefill_s(50_000)
    assert a.prefill_ahead_s(2_400) == pytest.approx(document)
    assert f.prefill_ahead_s(2_400) < 0.3 * document
    assert a.prefill_ahead_s(1_500) == pytest.approx(f.prefill_ahead_s(1_500))
    assert a.prefill_ahead_s(1_500) < 0.3 * document
    # The 27B's 1,568-token blocks: a step has room for a chunk beside one prompt, not two.
    narrow = {"chunk_tokens": 1568, "step_tokens": 4096, "block_size": 1568}
    dense = LoadModel([lane("d", clock, SLOW, aligned_chunks=True, **narrow)], CLASSES, aliases=ALIASES)
    dense.start_flight("d", range(30_000), 300).admitted()
    d = dense.lanes["d"]
    beside_one = d.prefill_ahead_s(2_400)
    assert beside_one < 0.3 * d.prefill_s(30_000)
    dense.start_flight("d", range(20_000), 300).admitted()
    assert d.prefill_ahead_s(2_400) >= d.prefill_s(30_000)  # the first of the two, whole
