"""A gateway for Codex CLI's tests: the replay engine (recorded Qwen turns, no weights) with an
agent's context. Codex sends a ~10K-token prompt and no max_output_tokens, so the model caps
the output (`max_output_tokens`) where the replay engine's fixed KV pool (4,096 blocks of 16)
still holds prompt and output."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import API_KEY, MODELS, Server, free_port, launch, server_section

MODEL = "codex-replay"
MAX_MODEL_LEN = 131072
MAX_OUTPUT_TOKENS = 32768


def config(tmp: Path, port: int) -> Path:
    from gateway.settings import hash_key

    cfg = {
        "server": server_section(port),
        "auth": {"required": True, "keys": [{"name": "tester", "sha256": hash_key(API_KEY)}]},
        "models": [
            {
                "name": MODEL,
                "engine": "replay",
                "path": str(MODELS / "tiny-qwen3"),
                "max_model_len": MAX_MODEL_LEN,
                "max_output_tokens": MAX_OUTPUT_TOKENS,
            }
        ],
    }
    out = tmp / "sparkgate-codex.yaml"
    out.write_text(yaml.safe_dump(cfg))
    return out


@contextlib.contextmanager
def codex_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("codex")
    port = free_port()
    with launch(config(tmp, port), tmp / "server.log", port) as srv:
        yield srv
