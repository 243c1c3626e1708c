"""The whole gateway on config/replay.yaml: the replay engine (recorded Qwen3 turns, no vLLM)
behind the real server, through the openai SDK."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
import yaml

from engine_adapter.recordings import RECORDINGS, tag
from tests.conftest import ROOT, Server, free_port, launch

KEY = "sk-sparkgate-dev"  # the config's demo key
MODEL = "sparkgate-replay"


@pytest.fixture(scope="module")
def replay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("replay")
    cfg = yaml.safe_load((ROOT / "config/replay.yaml").read_text())
    port = free_port()
    cfg["server"].update(port=port, cache_dir=str(ROOT / ".cache"))
    cfg["base_dir"] = str(ROOT)
    path = tmp / "replay.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with launch(path, tmp / "replay.log", port) as server:
        yield server


def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key=KEY, max_retries=0, timeout=60)


def test_a_plain_chat_gets_the_answer_recording(replay: Server) -> None:
    done = client(replay).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is the capital of France?"}], max_tokens=64
    )
    assert done.choices[0].message.content == RECORDINGS["answer"]
    assert done.choices[0].finish_reason == "stop"
    assert done.usage is not None and done.usage.completion_tokens > 1


def test_a_stream_is_cut_at_max_tokens(replay: Server) -> None:
    stream = client(replay).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": f"Go on. {tag('long')}"}], max_tokens=10, stream=True
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and RECORDINGS["long"].startswith(text)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
