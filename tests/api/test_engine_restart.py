"""An engine that dies is noticed, failed over, restarted with backoff and served again,
without restarting the gateway; one that keeps dying stays down with its reason in /ready.

Fast: replay engines (engine_adapter/replay.py), whose `[[replay:crash]]` tag kills the engine
the way a dead vLLM core does (every stream in flight fails, the engine stays unhealthy).
tests/api/test_engine_death.py does the same to a real vLLM engine's core process.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from engine_adapter import recordings
from tests.conftest import API_KEY, MODELS, ROOT, Fleet, Launch, Server, free_port, sdk_client

STEADY, SPARE, FRAGILE = "steady", "spare", "fragile"
BACKOFF_S = 4.0  # the steady model's first restart waits this long: the test looks at the gap
HEADERS = {"Authorization": f"Bearer {API_KEY}"}
CRASH = [{"role": "user", "content": recordings.tag("crash")}]
LONG = [{"role": "user", "content": recordings.tag("long")}]
HI = [{"role": "user", "content": "hi"}]


def config(tmp: Path, port: int) -> Path:
    from gateway.settings import hash_key

    path = str(MODELS / "tiny-qwen3")
    replay = {"engine": "replay", "path": path, "max_model_len": 4096, "replay": {"token_delay_s": 0.05}}
    cfg = {
        "server": {"host": "127.0.0.1", "port": port, "log_level": "info", "cache_dir": str(ROOT / ".cache")},
        "auth": {"required": True, "keys": [{"name": "tester", "sha256": hash_key(API_KEY)}]},
        "routing": {"enabled": True},
        "models": [
            {"name": STEADY, **replay, "quality": 2.0, "restart": {"backoff_s": BACKOFF_S, "max_deaths": 3}},
            {"name": SPARE, **replay, "quality": 1.0},
            {"name": FRAGILE, **replay, "quality": 0.5, "restart": {"backoff_s": 0.5, "max_deaths": 2}},
        ],
    }
    out = tmp / "sparkgate-restart.yaml"
    out.write_text(yaml.safe_dump(cfg))
    return out


def side_by_side(request: pytest.FixtureRequest, tmp: Path) -> list[Launch]:
    """This module's server, started with the session's others (tests/conftest.py: `fleet`)."""
    port = free_port()
    return [Launch(config(tmp, port), tmp / "server.log", port)]


@pytest.fixture(scope="module")
def server(fleet: Fleet) -> Iterator[Server]:
    """One gateway for the module: each test kills only its own model and asserts on that
    model's state (the fragile one stays down, so /ready stays 503 after its test)."""
    with fleet.servers(__name__) as (srv,):
        yield srv


def ready(server: Server) -> httpx.Response:
    return httpx.get(f"{server.base_url}/ready", timeout=30)


def wait_state(server: Server, model: str, state: str, timeout: float = 30.0) -> httpx.Response:
    """/ready once `model`'s engine is in `state` (its supervisor looks a few times a second)."""
    deadline = time.monotonic() + timeout
    while (r := ready(server)).json()["models"][model]["state"] != state:
        if time.monotonic() > deadline:
            pytest.fail(f"{model} not {state} after {timeout}s: {r.json()}")
        time.sleep(0.05)
    return r


def metric(server: Server, name: str, model: str) -> float:
    text = httpx.get(f"{server.base_url}/metrics", headers=HEADERS, timeout=30).text
    for line in text.splitlines():
        if line.startswith(f'{name}{{model="{model}"') or line.startswith(f'{name}{{model="{model}",'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def requests_total(server: Server, model: str, outcome: str) -> float:
    text = httpx.get(f"{server.base_url}/metrics", headers=HEADERS, timeout=30).text
    want = f'sparkgate_requests_total{{model="{model}",outcome="{outcome}"}}'
    return next((float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(want)), 0.0)


def crash(client: openai.OpenAI, model: str) -> None:
    with pytest.raises(openai.InternalServerError) as e:
        client.chat.completions.create(model=model, messages=CRASH, max_tokens=8)
    assert e.value.status_code == 503
    assert e.value.response.json()["error"]["code"] == "engine_unavailable"


def assert_unavailable(client: openai.OpenAI, model: str) -> httpx.Response:
    with pytest.raises(openai.InternalServerError) as e:
        client.chat.completions.create(model=model, messages=HI, max_tokens=4)
    err = e.value.response.json()["error"]
    assert e.value.status_code == 503 and err["code"] == "engine_unavailable" and err["type"] == "server_error"
    return e.value.response


def assert_nothing_held(server: Server, model: str) -> None:
    """Every KV and quota reservation of the dead engine's requests is back."""
    deadline = time.monotonic() + 30
    while True:
        s = server.stats()
        a = s["engines"][model]["admission"]
        if a["used_blocks"] == 0 and a["admitted"] == 0 and s["quota"]["holds"] == 0:
            break
        if time.monotonic() > deadline:
            pytest.fail(f"reservations still held after the engine died: {a}, quota {s['quota']}")
        time.sleep(0.1)
    assert s["engines"][model]["inflight"] == 0


def test_a_dead_engine_fails_cleanly_and_is_restarted(server: Server) -> None:
    client = sdk_client(server)
    stream = client.chat.completions.create(model=STEADY, messages=LONG, max_tokens=1000, stream=True)
    chunks = iter(stream)
    first = ""
    while not first:
        first = next(chunks).choices[0].delta.content or ""
    died = time.monotonic()
    crash(client, STEADY)
    # The stream in flight ends with an OpenAI error event, not a hang or a cut connection.
    with pytest.raises(openai.APIError) as e:
        for _ in chunks:
            pass
    assert "down" in e.value.message or "died" in e.value.message
    # Down: /ready says why, new requests get a 503 with a Retry-After, aliases go elsewhere.
    r = wait_state(server, STEADY, "restarting")
    assert r.status_code == 503, r.json()
    body = r.json()
    assert body["ready"] is False
    steady = body["models"][STEADY]
    assert steady["state"] == "restarting" and steady["deaths"] == 1 and "died" in steady["reason"]
    assert 0 < steady["restart_in_s"] <= BACKOFF_S
    assert body["models"][SPARE]["state"] == "up"
    refused = assert_unavailable(client, STEADY)
    assert int(refused.headers["retry-after"]) >= 1
    routed = client.chat.completions.create(model="best", messages=HI, max_tokens=4)
    assert routed.model != STEADY and routed.choices[0].message.content
    assert_nothing_held(server, STEADY)
    assert metric(server, "sparkgate_engine_up", STEADY) == 0.0
    assert metric(server, "sparkgate_engine_deaths_total", STEADY) == 1.0
    # A stream cut by the death is a failure, not a completion.
    assert requests_total(server, STEADY, "failed") == 2.0  # the stream and the crash request
    assert requests_total(server, STEADY, "completed") == 0.0
    # Restarted after its backoff, without restarting the gateway.
    body = wait_state(server, STEADY, "up", timeout=120).json()
    assert time.monotonic() - died >= BACKOFF_S * 0.9
    assert not any(STEADY in reason for reason in body.get("reasons", []))
    assert body["models"][STEADY] == {
        "state": "up",
        "deaths": 1,
        "restarts": 1,
        "last_death": body["models"][STEADY]["last_death"],
    }
    answer = client.chat.completions.create(model=STEADY, messages=HI, max_tokens=64)
    assert answer.choices[0].message.content == recordings.ANSWER
    assert metric(server, "sparkgate_engine_up", STEADY) == 1.0
    assert metric(server, "sparkgate_engine_restarts_total", STEADY) == 1.0
    assert server.stats()["engines"][STEADY]["health"]["restarts"] == 1
    assert server.proc.poll() is None


def test_a_model_that_keeps_dying_stays_down(server: Server) -> None:
    client = sdk_client(server)
    crash(client, FRAGILE)
    wait_state(server, FRAGILE, "up", timeout=120)  # the first death is restarted (after 0.5 s)
    crash(client, FRAGILE)  # the second within the window is max_deaths: it stays down
    r = wait_state(server, FRAGILE, "down")
    assert r.status_code == 503
    body = r.json()
    fragile = body["models"][FRAGILE]
    assert fragile["deaths"] == 2 and fragile["restarts"] == 1 and "restart_in_s" not in fragile
    assert "max_deaths" in fragile["reason"] and "died" in fragile["reason"]
    assert any(FRAGILE in reason and "max_deaths" in reason for reason in body["reasons"])
    refused = assert_unavailable(client, FRAGILE)
    assert "retry-after" not in refused.headers and refused.headers["x-should-retry"] == "false"
    # The other models serve on.
    assert client.chat.completions.create(model=SPARE, messages=HI, max_tokens=4).choices[0].message.content
    assert_nothing_held(server, FRAGILE)
    time.sleep(1.0)  # longer than its backoff: it must still be down, not restarted
    assert ready(server).json()["models"][FRAGILE]["state"] == "down"
