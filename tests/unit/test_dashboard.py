"""The dashboard's rings and SLO verdicts (gateway/dashboard.py)."""

from __future__ import annotations

import pytest

from gateway import dashboard
from gateway.errors import Overloaded, RateLimited
from gateway.settings import SloClass


def done(**kw: object) -> dashboard.Finished:
    args: dict[str, object] = {
        "model": "m",
        "user": "u",
        "slo": "interactive",
        "arrived": 10.0,
        "first": 11.0,
        "end": 20.0,
        "completion_tokens": 10,
        "choices": 1,
        "returned": True,
    }
    return dashboard.finished(**(args | kw))  # type: ignore[arg-type]


def test_timings_come_from_the_engine_clock() -> None:
    f = done()
    assert f.ttft_s == 1.0 and f.total_s == 10.0
    assert f.tpot_s == pytest.approx(1.0)  # 9 s over the 9 tokens after the first
    # n choices share the output: time per token is per choice.
    assert done(completion_tokens=20, choices=2).tpot_s == pytest.approx(1.0)
    assert done(first=None).ttft_s is None and done(first=None).tpot_s is None
    assert done(completion_tokens=1).tpot_s is None


def test_meets_checks_every_objective_the_class_sets() -> None:
    interactive = SloClass(ttft_s=2.0, tpot_s=1.5)
    assert dashboard.meets(done(), interactive) is True
    assert dashboard.meets(done(first=13.0), interactive) is False  # first token at 3 s
    assert dashboard.meets(done(), SloClass(deadline_s=5.0)) is False
    assert dashboard.meets(done(), None) is None
    assert dashboard.meets(done(returned=False), interactive) is None


def test_the_rings_are_bounded_and_keep_only_api_rejections() -> None:
    recent = dashboard.Recent(finished=3, rejections=2)
    for i in range(5):
        recent.add_finished(done(completion_tokens=10 + i))
    assert [f.completion_tokens for f in recent.finished] == [12, 13, 14]
    err = Overloaded("The queue is full.", code="server_overloaded")
    err.reason = "queue_full"
    recent.add_rejection(err, "/v1/chat/completions")
    assert recent.rejections[0].reason == "queue_full" and recent.rejections[0].status == 503
    recent.add_rejection(RateLimited("slow down"), "/v1/completions")
    recent.add_rejection(RateLimited("x"), "/sparkgate/dashboard/data")  # not an API request
    recent.add_rejection(RateLimited("y"), "/v1/responses")
    assert [(r.status, r.path) for r in recent.rejections] == [(429, "/v1/completions"), (429, "/v1/responses")]
