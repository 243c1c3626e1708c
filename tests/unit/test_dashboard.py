"""The dashboard's rings and SLO verdicts (gateway/dashboard.py)."""

from __future__ import annotations

import pytest

from gateway import dashboard
from gateway.errors import Overloaded, RateLimited
from gateway.http import dashboard_data
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
    recent.add_rejection(err, "/v1/chat/completions", "alice")
    first = recent.rejections[0]
    assert (first.reason, first.status, first.user) == ("queue_full", 503, "alice")
    recent.add_rejection(RateLimited("slow down"), "/v1/completions")
    recent.add_rejection(RateLimited("x"), "/sparkgate/dashboard/data")  # not an API request
    recent.add_rejection(RateLimited("y"), "/v1/responses")
    assert [(r.status, r.path) for r in recent.rejections] == [(429, "/v1/completions"), (429, "/v1/responses")]


async def test_the_quota_store_shows_redis_down_without_its_password() -> None:
    from types import SimpleNamespace

    from gateway.quota import QuotaGate
    from gateway.settings import QuotaSettings
    from tests.conftest import free_port

    settings = QuotaSettings(store="redis", redis_url=f"redis://:secret@127.0.0.1:{free_port()}/0")
    gate = QuotaGate.from_settings(settings)
    await gate.start()  # nothing listens there: down
    try:
        shown = dashboard_data._quota(SimpleNamespace(quota=gate))  # type: ignore[arg-type]
    finally:
        await gate.close()
    assert shown["status"] == "down" and shown["store"] == "redis" and shown["outages"] == 1
    assert "secret" not in shown["redis_url"] and shown["redis_url"].startswith("redis://***@127.0.0.1:")
    memory = QuotaGate.from_settings(QuotaSettings())
    assert dashboard_data._quota(SimpleNamespace(quota=memory))["status"] == "memory"  # type: ignore[arg-type]
