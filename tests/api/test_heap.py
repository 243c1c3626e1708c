"""The gateway freezes its start-up heap while it serves (gateway/heap.py) and gives it back."""

from __future__ import annotations

import gc
import weakref
from typing import Any

from fastapi.testclient import TestClient

from gateway.engine_host import create_host_app
from gateway.settings import Settings
from tests.conftest import MODELS, in_process

CONFIG: dict[str, Any] = {
    "auth": {"required": False},
    "models": [{"name": "replay", "engine": "replay", "path": str(MODELS / "tiny-qwen3")}],
}


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


def test_the_start_up_heap_is_frozen_while_serving_and_unfrozen_after() -> None:
    gc.disable()  # else a young-generation pass could free the cycle before the start does
    try:
        garbage = _Node()
        gone = weakref.ref(garbage)
        del garbage
        with in_process(CONFIG) as app:
            # Collected before the freeze: garbage frozen would never be freed.
            assert gone() is None
            assert gc.get_freeze_count() > 10_000  # the modules, the app, the tokenizer
            r = app.http.post(
                "/v1/chat/completions",
                json={"model": "replay", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            )
            assert r.status_code == 200
    finally:
        gc.enable()
    assert gc.get_freeze_count() == 0  # back in the collector's reach once the server stops


def test_an_engine_host_freezes_its_heap_too() -> None:
    with TestClient(create_host_app(Settings(**CONFIG), "heap-test-token")):
        assert gc.get_freeze_count() > 10_000
    assert gc.get_freeze_count() == 0
