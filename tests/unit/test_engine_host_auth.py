"""The engine host's token: checked in constant time, throttled like the gateway's keys, never
in a repr; a remote engine's address shown without its credentials. The host app runs in
process (Starlette's TestClient) on a replay engine: no vLLM."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from engine_adapter.remote import RemoteEngineConfig
from gateway.engine_host import HostState, create_host_app, token_matches
from gateway.settings import Settings
from tests.conftest import MODELS

TOKEN = "engine-host-unit-token"
MODEL = "replay"
MAX_FAILURES = 3


@pytest.fixture
def host() -> Iterator[TestClient]:
    settings = Settings(
        models=[{"name": MODEL, "engine": "replay", "path": str(MODELS / "tiny-qwen3")}],
        auth={"required": False, "failed": {"max_failures": MAX_FAILURES, "window_s": 600, "block_s": 600}},
    )
    with TestClient(create_host_app(settings, TOKEN)) as c:
        yield c


def stats(c: TestClient, token: str | None) -> int:
    headers = {"X-Sparkgate-Gateway": "g1"} | ({} if token is None else {"Authorization": f"Bearer {token}"})
    return c.get(f"/engine/v1/{MODEL}/stats", headers=headers).status_code


def test_the_token_opens_the_host_and_nothing_else_does(host: TestClient) -> None:
    claim = host.post(
        f"/engine/v1/{MODEL}/claim",
        json={"share": 0.5},
        headers={"Authorization": f"Bearer {TOKEN}", "X-Sparkgate-Gateway": "g1"},
    )
    assert claim.status_code == 200, claim.text
    assert stats(host, TOKEN) == 200
    assert stats(host, None) == 401
    r = host.get(f"/engine/v1/{MODEL}/stats", headers={"Authorization": f"Bearer {TOKEN}x", "X-Sparkgate-Gateway": "g"})
    assert r.status_code == 401 and TOKEN not in r.text
    assert host.get("/engine/v1/health").status_code == 200  # probes need no token


def test_wrong_tokens_block_the_caller_even_with_the_right_token(host: TestClient) -> None:
    for _ in range(MAX_FAILURES):
        assert stats(host, "guess") == 401
    r = host.get(f"/engine/v1/{MODEL}/stats", headers={"Authorization": f"Bearer {TOKEN}", "X-Sparkgate-Gateway": "g"})
    assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_failed_authentications"
    assert 590 <= int(r.headers["Retry-After"]) <= 600
    assert host.get("/engine/v1/health").status_code == 200


def test_missing_tokens_do_not_block(host: TestClient) -> None:
    for _ in range(MAX_FAILURES * 2):
        assert stats(host, None) == 401
    assert stats(host, TOKEN) in (200, 409)  # 409: no claim yet, but the token was accepted


def test_token_comparison() -> None:
    assert token_matches(TOKEN, TOKEN)
    assert not token_matches(TOKEN[:-1], TOKEN)  # a prefix, a different length
    assert not token_matches(TOKEN + "x", TOKEN)
    assert not token_matches("", TOKEN)


def test_tokens_stay_out_of_reprs_and_addresses_lose_their_credentials() -> None:
    state = HostState(engines={}, token=TOKEN)
    assert TOKEN not in repr(state)
    config = RemoteEngineConfig(name=MODEL, address="http://gw:s3cr3t@spark-2:8001", token=TOKEN, tokenizer="t")
    assert TOKEN not in repr(config)
    assert config.shown_address == "http://***@spark-2:8001" and "s3cr3t" not in config.shown_address
    assert RemoteEngineConfig(name=MODEL, address="http://spark-2:8001", token=TOKEN, tokenizer="t").shown_address == (
        "http://spark-2:8001"
    )
    metrics_settings = Settings(
        models=[{"name": MODEL, "engine": "replay", "path": "x"}], metrics={"token": "metrics-s3cret"}
    )
    assert "metrics-s3cret" not in repr(metrics_settings)
