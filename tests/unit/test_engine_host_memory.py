"""The engine host's memory guard (issue 51): below its box's min_free a generate call gets
503 `server_overloaded` with Retry-After, and the gateway's remote engine turns that answer into
its own overloaded error (503; 529 on the Messages API). The host runs in process on a replay
engine, reading a memory source the test holds; the test takes each reading itself."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from fastapi.testclient import TestClient

from engine_adapter.base import (
    EngineOverloaded,
    EngineRequest,
    EngineRequestInvalid,
    EngineUnavailable,
    SamplingOptions,
)
from engine_adapter.remote import _refused
from engine_adapter.wire import GenerateFrame
from gateway.engine_host import create_host_app
from gateway.errors import Overloaded, from_exception
from gateway.host_memory import MemoryWatch
from gateway.http.anthropic import errors as anthropic_errors
from gateway.settings import Settings
from tests.conftest import MODELS

GiB = 1024**3
TOKEN = "engine-host-memory-token"
MODEL = "replay"
HEADERS = {"Authorization": f"Bearer {TOKEN}", "X-Sparkgate-Gateway": "g1", "Content-Type": "application/json"}


class HeldMemory:
    def __init__(self) -> None:
        self.value: int | None = 64 * GiB

    def available(self) -> int | None:
        return self.value


@dataclass
class Host:
    http: TestClient
    memory: HeldMemory
    watch: MemoryWatch

    def set(self, available: int) -> None:
        self.memory.value = available
        self.watch.sample()

    def generate(self, rid: str) -> httpx.Response:
        request = EngineRequest(request_id=rid, prompt_token_ids=(1, 2, 3), sampling=SamplingOptions(max_tokens=5))
        body = GenerateFrame(request=request).model_dump_json()
        return self.http.post(f"/engine/v1/{MODEL}/generate", content=body, headers=HEADERS)


@pytest.fixture
def host() -> Iterator[Host]:
    settings = Settings(
        models=[{"name": MODEL, "engine": "replay", "path": str(MODELS / "tiny-qwen3"), "weights_bytes": "1GiB"}],
        box={"memory": "128GiB", "min_free": "6GiB", "guard": {"poll_s": 60, "retry_after_s": 3}},
    )
    memory = HeldMemory()
    with TestClient(create_host_app(settings, TOKEN, host_memory=memory)) as http:
        claim = http.post(f"/engine/v1/{MODEL}/claim", json={"share": 1.0}, headers=HEADERS)
        assert claim.status_code == 200, claim.text
        yield Host(http, memory, http.app.state.host.memory)  # type: ignore[attr-defined]


def test_below_the_floor_the_host_refuses_new_generate_calls(host: Host) -> None:
    host.set(5 * GiB)
    r = host.generate("a")
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "server_overloaded"
    assert r.headers["Retry-After"] == "3"
    stats = host.http.get(f"/engine/v1/{MODEL}/stats", headers=HEADERS)
    assert stats.status_code == 200 and stats.json()["healthy"] is True  # its engine is not dead
    host.set(8 * GiB)  # min_free + the default 2 GiB margin
    assert host.generate("b").status_code == 200


def test_the_gateway_answers_the_host_s_refusal_as_overloaded(host: Host) -> None:
    host.set(GiB)
    refused = _refused(host.generate("c"), "engine replay on spark-2")
    assert isinstance(refused, EngineOverloaded) and refused.retry_after_s == 3
    err = from_exception(refused)
    assert isinstance(err, Overloaded)
    assert (err.status, anthropic_errors.status(err), err.code) == (503, 529, "server_overloaded")
    assert err.headers["Retry-After"] == "3"


def test_other_refusals_keep_their_meaning() -> None:
    bad = _refused(httpx.Response(400, json={"error": {"message": "bad", "code": "invalid_value"}}), "e")
    assert isinstance(bad, EngineRequestInvalid)
    down = _refused(httpx.Response(503, json={"error": {"message": "down", "code": "engine_unavailable"}}), "e")
    assert type(down) is EngineUnavailable
    odd = _refused(httpx.Response(503, text="not json"), "e")
    assert type(odd) is EngineUnavailable
    no_hint = _refused(httpx.Response(503, json={"error": {"message": "m", "code": "server_overloaded"}}), "e")
    assert isinstance(no_hint, EngineOverloaded) and no_hint.retry_after_s is None
    assert "Retry-After" not in from_exception(no_hint).headers
