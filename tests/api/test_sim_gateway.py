"""The whole gateway on config/sim-dgx-spark.yaml: three simulated DGX Spark engines
(the box model), routed by latency SLO, through the real openai SDK (the app in this process)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.configs import EVERY, shipped_config
from tests.conftest import App, in_process

KEY = "sk-sparkgate-dev"  # the config's demo key: interactive by default, may substitute
SPEEDUP = 50.0
MESSAGES = [{"role": "user", "content": "What is a DGX Spark?"}]


# An app per test: the router learns from what it observes, and at 50x speed-up a loaded
# machine's scheduling delays become seconds of box time, so one test's traffic must not
# teach the router what the next test's routes see. In this process: each starts in a second.
@pytest.fixture
def sim() -> Iterator[App]:
    with in_process(shipped_config("sim-dgx-spark", models={EVERY: {"simulated": {"speedup": SPEEDUP}}})) as app:
        yield app


def client(app: App) -> openai.OpenAI:
    return app.sdk(KEY)


def routing_stats(app: App) -> dict[str, Any]:
    return app.stats(KEY)["routing"]  # type: ignore[no-any-return]


def test_auto_takes_the_class_preference_and_best_the_best_model_on_an_idle_box(sim: App) -> None:
    def ask(model: str) -> Any:
        return client(sim).chat.completions.with_raw_response.create(
            model=model,
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=32,
        )

    # The interactive class prefers the model done soonest (config: `prefer: fast`).
    raw = ask("auto")
    assert raw.headers["x-sparkgate-model"] == "qwen3.6-35b-a3b"
    assert raw.headers["x-sparkgate-route"] == "fast: meets interactive"
    # Predicted in the box's seconds: a short prompt's first token well under a second.
    assert 0 < int(raw.headers["x-sparkgate-predicted-ttft-ms"]) < 1000
    done = raw.parse()
    assert done.model == "qwen3.6-35b-a3b" and done.usage is not None and done.usage.completion_tokens == 32
    # `best` asks for quality: the 27B, which meets the objective on an idle box.
    raw = ask("best")
    assert raw.headers["x-sparkgate-model"] == "qwen3.8-27b"
    assert raw.headers["x-sparkgate-route"] == "best: meets interactive"
    assert raw.parse().model == "qwen3.8-27b"


def test_fast_streams_from_the_fastest_model(sim: App) -> None:
    with client(sim).chat.completions.with_streaming_response.create(
        model="fast",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
    ) as resp:
        assert resp.headers["x-sparkgate-model"] == "qwen3.6-35b-a3b"
        events = [line for line in resp.iter_lines() if line]
    assert events[-1] == "data: [DONE]" and len(events) > 3


def test_a_long_document_cannot_be_interactive_but_can_be_a_document(sim: App) -> None:
    doc = [{"role": "user", "content": "Summarize: " + "lorem ipsum dolor sit amet " * 9000}]  # ~45K tokens
    with pytest.raises(openai.RateLimitError) as err:
        client(sim).chat.completions.create(model="auto", messages=doc, max_tokens=16)  # type: ignore[arg-type]
    body: dict[str, Any] = err.value.response.json()["error"]
    assert body["code"] == "slo_unattainable" and "even when idle" in body["message"]
    assert err.value.response.headers["x-should-retry"] == "false"

    raw = client(sim).chat.completions.with_raw_response.create(
        model="auto",
        messages=doc,  # type: ignore[arg-type]
        max_tokens=16,
        extra_headers={"X-Sparkgate-SLO": "document"},
    )
    assert raw.headers["x-sparkgate-slo"] == "document"
    # The document class prefers the model done soonest (config: `prefer: fast`): the 35B-A3B
    # prefills it in a fraction of the 27B's time, leaving the 27B to interactive requests.
    assert raw.headers["x-sparkgate-model"] == "qwen3.6-35b-a3b"
    assert raw.headers["x-sparkgate-route"] == "fast: meets document"
    assert raw.parse().usage.prompt_tokens > 40_000  # type: ignore[union-attr]
    # Asking for the best model explicitly still gets the best one that meets the objective.
    best = client(sim).chat.completions.with_raw_response.create(
        model="best",
        messages=doc,  # type: ignore[arg-type]
        max_tokens=16,
        extra_headers={"X-Sparkgate-SLO": "document"},
    )
    assert best.headers["x-sparkgate-model"] == "qwen3.8-27b"
    assert best.headers["x-sparkgate-route"] == "best: meets document"


def test_stats_show_routing(sim: App) -> None:
    client(sim).chat.completions.create(model="auto", messages=MESSAGES, max_tokens=4)  # type: ignore[arg-type]
    routing = routing_stats(sim)
    assert set(routing["models"]) == {"qwen3.8-27b", "qwen3.8-flash-next", "qwen3.6-35b-a3b"}
    assert sum(routing["routed"].values()) >= 1
