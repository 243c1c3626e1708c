"""The canary (gateway/canary.py) against replay engines with a simulated prefix cache: one
healthy, one that corrupts every answer served from its cache (replay.corrupt_cached), as a
hybrid model with speculative decoding and prefix caching does in vllm#53912. The corrupting
one is marked degraded: /ready, /metrics and the dashboard say so, and routing's aliases go to
the healthy one; the healthy one passes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.configs import shipped_config
from tests.conftest import App, in_process

ADMIN = {"Authorization": "Bearer sk-sparkgate-admin"}  # config/replay.yaml's demo keys
USER = {"Authorization": "Bearer sk-sparkgate-dev"}
METRICS_TOKEN = "metrics-scraper"  # the test client is no loopback scraper
HEALTHY, CORRUPT, PLAIN = "healthy", "corrupt", "plain"


def _config(**overrides: Any) -> dict[str, Any]:
    cfg = shipped_config("replay", metrics={"token": METRICS_TOKEN}, **overrides)
    base = cfg["models"][0]
    replay = {"recording": "call", "prefix_cache": True}
    cfg["models"] = [
        base | {"name": HEALTHY, "quality": 1, "replay": replay},
        # The better model on paper, so that `best` picks it unless the canary says otherwise.
        base | {"name": CORRUPT, "quality": 10, "replay": replay | {"corrupt_cached": True}},
        base | {"name": PLAIN, "quality": 0},  # no prefix cache: the canary means nothing here
    ]
    cfg["routing"] = {"enabled": True, "classes": {"interactive": {"deadline_s": 600.0}}}
    return cfg


@pytest.fixture(scope="module")
def app() -> Iterator[App]:
    with in_process(_config()) as app:
        yield app


def _canary(app: App, model: str | None = None) -> dict[str, Any]:
    r = app.http.post("/sparkgate/admin/canary", params={} if model is None else {"model": model}, headers=ADMIN)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def _metric(app: App, line_start: str) -> float:
    r = app.http.get("/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    r.raise_for_status()
    for line in r.text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{line_start} not in /metrics")


def _routed(app: App, model: str) -> str:
    r = app.http.post(
        "/v1/chat/completions",
        headers=USER,
        json={"model": model, "messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 64},
    )
    assert r.status_code == 200, r.text
    return r.json()["model"]  # type: ignore[no-any-return]


def test_a_healthy_engine_passes_with_the_call_and_a_cache_hit(app: App) -> None:
    result = _canary(app, HEALTHY)["results"][HEALTHY]
    assert result["status"] == "ok", result
    assert result["cold"]["tool_calls"] == [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    assert result["cold"]["cached_tokens"] == 0  # a fresh salt and nonce: cold
    assert result["cached"]["tool_calls"] == result["cold"]["tool_calls"]
    assert result["cached"]["cached_tokens"] > 0
    assert result["degraded"] is False


def test_an_engine_that_corrupts_its_cached_answer_is_degraded(app: App) -> None:
    body = _canary(app)
    corrupt = body["results"][CORRUPT]
    assert corrupt["status"] == "degraded", corrupt
    assert "tool calls differ" in corrupt["reason"]
    assert corrupt["cached"]["tool_calls"] == [{"name": "get_weather", "arguments": {"city": "Rome"}}]
    assert body["results"][HEALTHY]["status"] == "ok"
    assert body["results"][PLAIN]["status"] == "skipped"
    assert body["degraded"] == [CORRUPT]

    ready = app.http.get("/ready")
    assert ready.status_code == 200  # the others serve: degraded is a warning, not a refusal
    assert any(w.startswith(f"model {CORRUPT}: degraded") for w in ready.json()["warnings"])
    assert ready.json()["models"][CORRUPT]["canary"]["degraded"] is True
    assert ready.json()["models"][HEALTHY]["canary"]["degraded"] is False

    assert _metric(app, f'sparkgate_model_degraded{{model="{CORRUPT}"}}') == 1.0
    assert _metric(app, f'sparkgate_model_degraded{{model="{HEALTHY}"}}') == 0.0
    assert _metric(app, f'sparkgate_canary_runs_total{{model="{CORRUPT}",result="degraded"}}') >= 1

    dash = app.http.get("/sparkgate/dashboard/data", headers=ADMIN)
    assert dash.status_code == 200, dash.text
    assert dash.json()["canary"][CORRUPT]["degraded"] is True

    # Aliases avoid it (`best` would pick it for its quality); a request naming it is served.
    assert _routed(app, "best") == HEALTHY
    assert _routed(app, CORRUPT) == CORRUPT


def test_the_canary_is_for_admins_and_names_served_models(app: App) -> None:
    assert app.http.post("/sparkgate/admin/canary", headers=USER).status_code == 403
    r = app.http.post("/sparkgate/admin/canary", params={"model": "nope"}, headers=ADMIN)
    assert r.status_code == 404
    assert r.json()["error"]["param"] == "model"


def test_the_canary_bills_no_user(app: App) -> None:
    before = app.http.get("/sparkgate/usage", headers=USER).json()["user_total"]["day"]["total_tokens"]
    _canary(app, HEALTHY)
    after = app.http.get("/sparkgate/usage", headers=USER).json()["user_total"]["day"]["total_tokens"]
    assert after == before


def test_on_start_it_marks_the_corrupting_model_without_being_asked() -> None:
    with in_process(_config(canary={"on_start": True})) as app:
        for _ in range(10_000):  # poll: the start-up canary runs in the background
            models = app.http.get("/ready").json()["models"]
            if all("canary" in models[n] for n in (HEALTHY, CORRUPT, PLAIN)):
                break
        else:
            raise AssertionError(f"no start-up canary: {models}")
        assert models[CORRUPT]["canary"]["status"] == "degraded"
        assert models[HEALTHY]["canary"]["status"] == "ok"
        assert _routed(app, "best") == HEALTHY


def test_by_default_no_canary_runs_at_start() -> None:
    with in_process(_config()) as fresh:
        assert all("canary" not in m for m in fresh.http.get("/ready").json()["models"].values())
