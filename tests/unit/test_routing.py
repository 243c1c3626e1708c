"""policies/routing.py: the best model that meets the SLO, degrade, or turn away early."""

from policies.latency import Prediction
from policies.routing import Candidate, NoRoute, Route, Slo, choose

INTERACTIVE = Slo("interactive", ttft_s=2.0, tpot_s=0.060)
BATCH = Slo("batch", deadline_s=120.0)
DOCUMENT = Slo("document", ttft_s=60.0, tpot_s=0.060)
ALIASES = {"auto": "best", "best": "best", "fast": "fast"}


def cands(best_ttft: float, mid_ttft: float = 1.0, fast_ttft: float = 0.3) -> list[Candidate]:
    return [
        Candidate("qwen3.8-27b", Prediction(best_ttft, 0.013)),  # smartest, slow
        Candidate("flash-next", Prediction(mid_ttft, 0.018)),
        Candidate("qwen3.6-35b-a3b", Prediction(fast_ttft, 0.006)),  # fastest
    ]


def test_best_model_that_meets_the_slo() -> None:
    r = choose("auto", cands(1.5), INTERACTIVE, 200, aliases=ALIASES)
    assert r == Route("qwen3.8-27b", "best: meets interactive")


def test_degrades_under_load() -> None:
    r = choose("auto", cands(9.0), INTERACTIVE, 200, aliases=ALIASES)
    assert isinstance(r, Route) and r.model == "flash-next" and "degraded from qwen3.8-27b" in r.reason


def test_turned_away_early_when_nothing_meets_it() -> None:
    r = choose("auto", cands(9.0, 6.0, 3.4), INTERACTIVE, 200, aliases=ALIASES)
    assert isinstance(r, NoRoute) and r.retry_after_s == 2.0 and "TTFT 3.40s > 2s" in r.reason


def test_fast_alias_and_deadlines() -> None:
    assert choose("fast", cands(1.0), INTERACTIVE, 200, aliases=ALIASES).model == "qwen3.6-35b-a3b"  # type: ignore[union-attr]
    slow = [Candidate("a", Prediction(1.0, 1.0)), Candidate("b", Prediction(1.0, 0.1))]
    r = choose("auto", slow, BATCH, 1000, aliases=ALIASES)
    assert r == Route("b", "degraded from a (total 1000.0s > 120s): predicted to miss batch")
    assert isinstance(choose("auto", slow, Slo("x", deadline_s=1), 1000, aliases=ALIASES), NoRoute)
    assert choose("auto", slow, Slo("none"), 5, aliases=ALIASES).model == "a"  # type: ignore[union-attr]


def test_explicit_names_are_honoured_and_substituted_only_when_allowed() -> None:
    assert choose("qwen3.8-27b", cands(1.0), INTERACTIVE, 10, aliases=ALIASES).model == "qwen3.8-27b"  # type: ignore[union-attr]
    no = choose("qwen3.8-27b", cands(9.0), INTERACTIVE, 10, aliases=ALIASES)
    assert isinstance(no, NoRoute) and "qwen3.8-27b would miss" in no.reason
    sub = choose("qwen3.8-27b", cands(9.0), INTERACTIVE, 10, aliases=ALIASES, allow_substitution=True)
    assert sub == Route("flash-next", "substituted: meets interactive")
    gone = choose("nope", cands(1.0), INTERACTIVE, 10, aliases=ALIASES)
    assert isinstance(gone, NoRoute) and "unavailable" in gone.reason


def test_nothing_available() -> None:
    down = [Candidate("a", Prediction(0.1, 0.01), available=False)]
    assert choose("auto", down, INTERACTIVE, 10, aliases=ALIASES) == NoRoute(
        "no model is available", 5.0, "unavailable"
    )
    assert choose("auto", cands(9, 9, 9), Slo("t", tpot_s=0.001), 10, aliases=ALIASES).retry_after_s == 5.0  # type: ignore[union-attr]


def test_a_candidate_that_would_stall_running_requests_is_passed_over() -> None:
    c = cands(1.0)
    c[0] = Candidate("qwen3.8-27b", Prediction(1.0, 0.013), harms="its 20.0s prefill would stall 2 running requests")
    r = choose("auto", c, BATCH, 200, aliases=ALIASES)
    assert r == Route(
        "flash-next",
        "degraded from qwen3.8-27b (its 20.0s prefill would stall 2 running requests): predicted to miss batch",
    )


def test_a_request_that_can_wait_is_held_until_it_no_longer_harms() -> None:
    harmful = Candidate(
        "qwen3.8-27b", Prediction(10.0, 0.013), harms="it would push 1 running request past", harm_clears_s=8.0
    )
    r = choose("auto", [harmful, *cands(1.0)[1:]], DOCUMENT, 300, aliases=ALIASES)
    assert r == Route(
        "qwen3.8-27b", "best: meets document after a 8.0s hold (not to stall running requests)", hold_s=8.0
    )
    # Interactive cannot wait 8 s: it degrades instead.
    r = choose("auto", [harmful, *cands(1.0)[1:]], INTERACTIVE, 300, aliases=ALIASES)
    assert isinstance(r, Route) and r.model == "flash-next" and r.hold_s == 0.0
    # A harm with no end in sight is a miss.
    forever = Candidate("qwen3.8-27b", Prediction(10.0, 0.013), harms="it would push 1 running request past")
    r = choose("auto", [forever, *cands(1.0)[1:]], DOCUMENT, 300, aliases=ALIASES)
    assert isinstance(r, Route) and r.model == "flash-next"


def test_an_explicit_model_can_be_held_too() -> None:
    harmful = Candidate("qwen3.8-27b", Prediction(10.0, 0.013), harms="it would stall", harm_clears_s=5.0)
    r = choose("qwen3.8-27b", [harmful], DOCUMENT, 300, aliases=ALIASES)
    assert r == Route("qwen3.8-27b", "requested; meets document after a 5.0s hold (not to stall running requests)", 5.0)


def test_fast_passes_over_a_candidate_that_would_crowd_a_running_request() -> None:
    quick = Candidate("qwen3.6-35b-a3b", Prediction(10.0, 0.006), slack_taken=0.8)  # would take 80% of one's slack
    slower = Candidate("flash-next", Prediction(20.0, 0.018), slack_taken=0.1)
    r = choose("fast", [slower, quick], DOCUMENT, 300, aliases=ALIASES)
    assert isinstance(r, Route) and r.model == "flash-next"
    # When every candidate would crowd someone, the soonest done still wins.
    crowded = Candidate("flash-next", Prediction(20.0, 0.018), slack_taken=0.9)
    r = choose("fast", [crowded, quick], DOCUMENT, 300, aliases=ALIASES)
    assert isinstance(r, Route) and r.model == "qwen3.6-35b-a3b"


def test_a_request_that_can_wait_is_held_so_as_not_to_take_a_reserved_class_s_capacity() -> None:
    keeping = Candidate(
        "qwen3.6-35b-a3b", Prediction(20.0, 0.006), reserve_s=10.0, reserve_why="to keep 2 slots free for interactive"
    )
    r = choose("fast", [keeping], DOCUMENT, 300, aliases=ALIASES)
    assert r == Route(
        "qwen3.6-35b-a3b",
        "fast: meets document after a 10.0s hold (to keep 2 slots free for interactive requests)",
        hold_s=10.0,
    )
    # A harm that clears later than the reserve sets the hold, and the reason.
    both = Candidate(
        "qwen3.6-35b-a3b",
        Prediction(20.0, 0.006),
        harms="it would push 1 running request past",
        harm_clears_s=12.0,
        reserve_s=10.0,
        reserve_why="to keep 2 slots free for interactive",
    )
    r = choose("fast", [both], DOCUMENT, 300, aliases=ALIASES)
    assert isinstance(r, Route) and r.hold_s == 12.0 and r.reason.endswith("(not to stall running requests)")


def test_a_request_that_cannot_wait_for_the_reserve_is_sent_unless_that_costs_the_class_more() -> None:
    def late(costs: float) -> Candidate:  # 52 s + 10 s of waiting misses the 60 s objective
        return Candidate(
            "qwen3.8-27b",
            Prediction(52.0, 0.013),
            reserve_s=10.0,
            reserve_why="to keep an engine ready for interactive",
            reserve_costs=costs,
        )

    assert choose("auto", [late(0.4)], DOCUMENT, 300, aliases=ALIASES) == Route("qwen3.8-27b", "best: meets document")
    r = choose("auto", [late(1.5)], DOCUMENT, 300, aliases=ALIASES)
    assert isinstance(r, NoRoute)
    assert "it cannot wait 10.0s to keep an engine ready for interactive requests" in r.reason
