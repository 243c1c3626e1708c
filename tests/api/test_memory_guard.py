"""The run-time memory guard (issue 51) through the in-process replay gateway: below
box.min_free every API surface refuses new work (503 `server_overloaded` with Retry-After;
529 `overloaded_error` on Anthropic's Messages API), /ready, /metrics and the dashboard's data
say so, and it admits again only above the floor plus the resume margin.

The gateway reads a memory source the test holds (no real memory pressure), and the test
takes each reading itself (`MemoryWatch.sample`) instead of waiting for the poll, whose
interval is set far beyond any test's length.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai
import pytest
from fastapi.testclient import TestClient

from engine_adapter.base import Engine, EngineChunk, EngineRequest
from gateway.app import create_app, replay_engine
from gateway.host_memory import MemoryWatch
from gateway.settings import ModelSettings, Settings
from tests.configs import EVERY, shipped_config
from tests.conftest import App

GiB = 1024**3
MODEL = "sparkgate-replay"  # config/replay.yaml's model
USER_KEY = "sk-sparkgate-dev"  # its demo user key
ADMIN_KEY = "sk-sparkgate-admin"  # its demo admin key
METRICS_TOKEN = "metrics-scraper"  # the test client is no loopback scraper
FLOOR, MARGIN, RETRY_AFTER_S = 6 * GiB, 2 * GiB, 7


class HeldMemory:
    """The host's available memory, as the test sets it."""

    def __init__(self, available: int | None) -> None:
        self.value = available

    def available(self) -> int | None:
        return self.value


class FallsWhileAnswering:
    """The replay engine, but host memory falls below the floor (and the guard reads it)
    right after a request's first output, while the request runs."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self.fall: Any = None  # set by the test: what runs after the first chunk

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        fall, self.fall = self.fall, None
        async for chunk in self.inner.generate(request):
            yield chunk
            if fall is not None:
                fall, _ = None, fall()


@dataclass
class Guarded:
    app: App
    memory: HeldMemory
    watch: MemoryWatch
    engine: FallsWhileAnswering

    def set(self, available: int | None) -> None:
        self.memory.value = available
        self.watch.sample()

    def low(self) -> None:
        """Below the floor, from whatever state the last test left."""
        self.set(FLOOR - GiB)

    def plenty(self) -> None:
        self.set(64 * GiB)

    def openai(self) -> openai.OpenAI:
        return self.app.sdk(USER_KEY)

    def anthropic(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(
            base_url=self.app.base_url, api_key=USER_KEY, http_client=self.app.http, max_retries=0
        )


@pytest.fixture(scope="module")
def guarded() -> Iterator[Guarded]:
    cfg = shipped_config(
        "replay",
        # weights_bytes: the memory plan's figure, which a box section asks of every local model.
        models={EVERY: {"weights_bytes": "1GiB"}},
        metrics={"token": METRICS_TOKEN},
        box={
            "memory": "128GiB",
            "min_free": FLOOR,
            "guard": {"poll_s": 60, "resume_margin": MARGIN, "retry_after_s": RETRY_AFTER_S},
        },
    )
    memory = HeldMemory(64 * GiB)
    engines: list[FallsWhileAnswering] = []

    def factory(settings: Settings, model: ModelSettings) -> Engine:
        engines.append(FallsWhileAnswering(replay_engine(settings, model)))
        return engines[-1]  # type: ignore[return-value]

    app = create_app(Settings(**cfg), engine_factory=factory, host_memory=memory)
    with TestClient(app, raise_server_exceptions=False) as http:
        yield Guarded(App(http), memory, http.app.state.sparkgate.memory, engines[0])  # type: ignore[attr-defined]


def chat(g: Guarded, **kw: Any) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20, **kw}
    return g.app.http.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {USER_KEY}"})


def assert_overloaded(r: httpx.Response) -> None:
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "server_overloaded"
    assert r.json()["error"]["type"] == "server_error"
    assert "low on memory" in r.json()["error"]["message"]
    assert r.headers["Retry-After"] == str(RETRY_AFTER_S)
    assert r.headers["retry-after-ms"] == str(RETRY_AFTER_S * 1000)


def test_below_the_floor_every_openai_surface_refuses_with_retry_after(guarded: Guarded) -> None:
    guarded.low()
    with pytest.raises(openai.InternalServerError) as refused:
        guarded.openai().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert refused.value.status_code == 503
    assert refused.value.code == "server_overloaded"
    assert refused.value.response.headers["Retry-After"] == str(RETRY_AFTER_S)
    assert_overloaded(chat(guarded, stream=True))  # a stream is refused before it starts
    with pytest.raises(openai.InternalServerError) as completion:
        guarded.openai().completions.create(model=MODEL, prompt="hi", max_tokens=5)
    assert completion.value.code == "server_overloaded"
    with pytest.raises(openai.InternalServerError) as response:
        guarded.openai().responses.create(model=MODEL, input="hi", max_output_tokens=20)
    assert response.value.code == "server_overloaded"
    assert_overloaded(chat(guarded))


def test_below_the_floor_the_messages_api_answers_529_overloaded(guarded: Guarded) -> None:
    guarded.low()
    with pytest.raises(anthropic.OverloadedError) as refused:
        guarded.anthropic().messages.create(model=MODEL, max_tokens=20, messages=[{"role": "user", "content": "hi"}])
    assert refused.value.status_code == 529
    body: Any = refused.value.body
    assert body["type"] == "error" and body["error"]["type"] == "overloaded_error"
    assert refused.value.response.headers["Retry-After"] == str(RETRY_AFTER_S)


def test_it_admits_again_only_above_the_floor_plus_the_margin(guarded: Guarded) -> None:
    guarded.low()
    assert_overloaded(chat(guarded))
    guarded.set(FLOOR + MARGIN - 1)  # above the floor, not yet past the margin: still refusing
    assert_overloaded(chat(guarded))
    guarded.set(FLOOR + MARGIN)
    assert chat(guarded).status_code == 200
    guarded.set(FLOOR)  # at the floor, not below it: admitting on
    assert chat(guarded).status_code == 200


def test_ready_metrics_and_dashboard_show_the_guard(guarded: Guarded) -> None:
    guarded.plenty()
    ready = guarded.app.http.get("/ready")
    assert ready.status_code == 200, ready.text
    assert ready.json()["host_memory"]["admitting"] is True
    before = metric(guarded, "sparkgate_memory_guard_refused_total")
    stops = metric(guarded, "sparkgate_memory_guard_stops_total")

    guarded.low()
    assert_overloaded(chat(guarded))
    ready = guarded.app.http.get("/ready")
    assert ready.status_code == 503 and ready.json()["ready"] is False
    assert any(r.startswith("host memory low: 5.0 GiB available") for r in ready.json()["reasons"])
    assert ready.json()["host_memory"] == {
        **ready.json()["host_memory"],
        "admitting": False,
        "available_bytes": FLOOR - GiB,
        "min_free_bytes": FLOOR,
        "resume_at_bytes": FLOOR + MARGIN,
    }
    assert metric(guarded, "sparkgate_memory_guard_admitting") == 0
    assert metric(guarded, "sparkgate_host_memory_available_bytes") == FLOOR - GiB
    assert metric(guarded, "sparkgate_host_memory_min_free_bytes") == FLOOR
    assert metric(guarded, "sparkgate_memory_guard_refused_total") == before + 1
    assert metric(guarded, "sparkgate_memory_guard_stops_total") == stops + 1
    shown = dashboard(guarded)
    assert shown["host_memory"]["admitting"] is False
    assert shown["rejections"][0]["reason"] == "host_memory_low"

    guarded.plenty()
    assert guarded.app.http.get("/ready").status_code == 200
    assert metric(guarded, "sparkgate_memory_guard_admitting") == 1


def test_an_unreadable_memory_admits(guarded: Guarded) -> None:
    guarded.low()
    guarded.set(None)
    assert chat(guarded).status_code == 200
    assert guarded.app.http.get("/ready").json()["host_memory"]["available_bytes"] is None


def test_a_request_running_when_memory_falls_finishes(guarded: Guarded) -> None:
    guarded.plenty()
    guarded.engine.fall = guarded.low
    r = chat(guarded, max_tokens=200)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] == "stop" and r.json()["choices"][0]["message"]["content"]
    assert not guarded.watch.admitting  # memory did fall while it ran
    assert_overloaded(chat(guarded))  # and the next one is refused


def metric(g: Guarded, name: str) -> float:
    r = g.app.http.get("/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    r.raise_for_status()
    text = r.text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def dashboard(g: Guarded) -> dict[str, Any]:
    r = g.app.http.get("/sparkgate/dashboard/data", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    r.raise_for_status()
    return r.json()  # type: ignore[no-any-return]
