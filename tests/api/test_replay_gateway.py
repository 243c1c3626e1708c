"""The whole gateway on config/replay.yaml as shipped: the replay engine (recorded Qwen3 turns,
no vLLM) behind the app, through the openai SDK."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from engine_adapter.recordings import RECORDINGS, tag
from tests.configs import shipped_config
from tests.conftest import App, in_process

KEY = "sk-sparkgate-dev"  # the config's demo key
MODEL = "sparkgate-replay"


@pytest.fixture(scope="module")
def replay() -> Iterator[App]:
    with in_process(shipped_config("replay")) as app:
        yield app


def client(app: App) -> openai.OpenAI:
    return app.sdk(KEY)


def test_a_plain_chat_gets_the_answer_recording(replay: App) -> None:
    done = client(replay).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is the capital of France?"}], max_tokens=64
    )
    assert done.choices[0].message.content == RECORDINGS["answer"]
    assert done.choices[0].finish_reason == "stop"
    assert done.usage is not None and done.usage.completion_tokens > 1


def test_a_stream_is_cut_at_max_tokens(replay: App) -> None:
    stream = client(replay).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": f"Go on. {tag('long')}"}], max_tokens=10, stream=True
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and RECORDINGS["long"].startswith(text)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
