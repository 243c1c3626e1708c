"""Caches stay in the configured directory, except where a socket path could not hold it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway import runtime_env

KEYS = ["VLLM_CACHE_ROOT", "VLLM_RPC_BASE_PATH", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"]
KEYS += ["TIKTOKEN_CACHE_DIR", "HF_HOME", "XDG_CACHE_HOME"]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in KEYS:
        monkeypatch.delenv(key, raising=False)


@pytest.mark.usefixtures("clean_env")
def test_every_cache_goes_under_the_cache_dir(tmp_path: Path) -> None:
    runtime_env.configure(tmp_path / "c")
    for key in KEYS:
        assert Path(os.environ[key]).is_relative_to(tmp_path / "c") and Path(os.environ[key]).is_dir(), key


@pytest.mark.usefixtures("clean_env")
def test_a_deep_cache_dir_keeps_engine_sockets_short(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / "cache"
    runtime_env.configure(deep)
    rpc = Path(os.environ["VLLM_RPC_BASE_PATH"])
    # vLLM's IPC socket: <base>/<uuid4>, at most 107 bytes.
    assert len(str(rpc / ("x" * 36))) <= 107 and rpc.is_dir()
    assert Path(os.environ["VLLM_CACHE_ROOT"]) == deep.resolve() / "vllm"  # the rest stays put
