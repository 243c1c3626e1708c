"""gateway/metrics.py without a server: label caps, routing decisions, SLO attainment."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gateway.job import Meter
from gateway.metrics import COMPLETED, FAILED, Metrics, UserLabels
from gateway.router import route_decision
from gateway.settings import MetricsSettings, SloClass
from policies.latency import Prediction
from policies.load import RouteInfo
from policies.routing import NoRoute


def samples(m: Metrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = m.render().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def job(user: str = "alice", route: RouteInfo | None = None, **meter: Any) -> Any:
    return SimpleNamespace(
        served=SimpleNamespace(name="m"),
        principal=SimpleNamespace(name=user, team=None),
        meter=Meter(**meter),
        n=1,
        requests=(None,),
        route=route,
    )


def test_users_beyond_the_cap_are_other() -> None:
    labels = UserLabels(2)
    assert [labels(u) for u in ["a", "b", "c", "a", "d", "b"]] == ["a", "b", "other", "a", "other", "b"]


def test_routing_decisions_become_bounded_labels() -> None:
    p = Prediction(0.1, 0.01)
    chosen = RouteInfo("m1", "interactive", "best: meets interactive", p, output_tokens=10)
    assert route_decision(chosen) == ("m1", "chosen")
    degraded = RouteInfo("m2", "interactive", "degraded from m1 (...): x", p, output_tokens=10)
    assert route_decision(degraded) == ("m2", "degraded")
    held = RouteInfo("m1", "batch", "substituted: meets batch after a 2.0s hold (...)", p, hold_s=2.0, output_tokens=10)
    assert route_decision(held) == ("m1", "substituted_held")
    assert route_decision(NoRoute("x", 3.0, "busy")) == ("none", "refused_busy")
    assert route_decision(NoRoute("x", None, "impossible")) == ("none", "refused_impossible")
    assert route_decision(NoRoute("x", 5.0, "unavailable")) == ("none", "unavailable")


def test_slo_attained_and_missed_per_objective() -> None:
    m = Metrics(MetricsSettings())
    slo = SloClass(ttft_s=1.0, tpot_s=0.05)
    route = RouteInfo("m", "interactive", "best", Prediction(0.5, 0.02), output_tokens=11)
    # 11 tokens: TTFT 0.5 s, then 10 tokens in 0.3 s (30 ms each): attained.
    fast = job(route=route, prompt_tokens=10, completion_tokens=11, started=0.0, first_token=0.5, last_token=0.8)
    m.finished(fast, COMPLETED, slo)
    # TTFT 2 s and 100 ms per token: both objectives missed.
    slow = job(route=route, prompt_tokens=10, completion_tokens=11, started=0.0, first_token=2.0, last_token=3.0)
    m.finished(slow, COMPLETED, slo)
    # A failed request counts its TTFT and usage, not its SLO or its end-to-end latency.
    m.finished(job(route=route, prompt_tokens=10, completion_tokens=3, started=0.0, first_token=0.1), FAILED, slo)
    s = samples(m)
    assert s["sparkgate_slo_requests_total", frozenset({("slo_class", "interactive"), ("outcome", "attained")})] == 1
    assert s["sparkgate_slo_requests_total", frozenset({("slo_class", "interactive"), ("outcome", "missed")})] == 1
    for objective in ("ttft", "tpot"):
        key = (
            "sparkgate_slo_objective_missed_total",
            frozenset({("slo_class", "interactive"), ("objective", objective)}),
        )
        assert s[key] == 1
    model = frozenset({("model", "m")})
    assert s["sparkgate_ttft_seconds_count", model] == 3
    assert s["sparkgate_e2e_seconds_count", model] == 2 and s["sparkgate_e2e_seconds_sum", model] == 3.8
    assert abs(s["sparkgate_tpot_seconds_sum", model] - 0.13) < 1e-9
    assert s["sparkgate_user_tokens_total", frozenset({("user", "alice"), ("type", "completion")})] == 25
    assert s["sparkgate_requests_total", frozenset({("model", "m"), ("outcome", "failed")})] == 1


def test_a_request_that_never_reached_the_engine_is_not_charged() -> None:
    m = Metrics(MetricsSettings())
    m.finished(job(started=0.0), FAILED)
    s = samples(m)
    assert not any(name == "sparkgate_user_requests_total" for name, _ in s)
    assert s["sparkgate_requests_total", frozenset({("model", "m"), ("outcome", "failed")})] == 1
