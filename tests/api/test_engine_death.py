"""Kills a real vLLM engine's core process under a streaming request: the stream ends with a
clean OpenAI error, every reservation is released, /ready turns 503 with the reason, new
requests to that model get 503 `engine_unavailable` with Retry-After while a routing alias
moves to the other model, and the engine is restarted and serves again, all without
restarting the gateway. On a server of its own: the session's shared one must outlive it.
(The same on replay engines, plus a model that keeps dying: tests/api/test_engine_restart.py.)
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from tests.conftest import (
    API_KEY,
    DENSE,
    MESSAGES_SHORT,
    MODELS,
    Fleet,
    Launch,
    Server,
    free_port,
    sdk_client,
    server_config,
)

pytestmark = pytest.mark.engine

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
BACKOFF_S = 2.0
OTHER = "sim-moe"  # the model the alias moves to
COMES_BACK_S = 600  # a vLLM engine starts in 20-35 s on 2 idle cores; far slower on a busy box


ENGINES = 1  # vLLM engines its server starts (and a simulated one): the fleet starts it in a wave


def side_by_side(request: pytest.FixtureRequest, tmp: Path) -> list[Launch]:
    """This module's server, started with the session's others (tests/conftest.py: `fleet`)."""
    port = free_port()
    path = server_config(tmp, port)
    cfg = yaml.safe_load(path.read_text())
    cfg["routing"] = {"enabled": True}
    cfg["models"] = [m for m in cfg["models"] if m["name"] == DENSE]
    cfg["models"].append(
        {
            "name": OTHER,
            "engine": "simulated",
            "path": str(MODELS / "tiny-qwen3"),
            "simulated": {"model": "Qwen3.6-35B-A3B", "speedup": 20.0},
            "max_model_len": 4096,
            "kv_cache_bytes": "1GiB",
        }
    )
    for m in cfg["models"]:
        m["quality"] = 2.0 if m["name"] == DENSE else 1.0
        m["restart"] = {"backoff_s": BACKOFF_S, "max_deaths": 3}
    path.write_text(yaml.safe_dump(cfg))
    return [Launch(path, tmp / "server.log", port)]


@pytest.fixture(scope="module")
def server(fleet: Fleet) -> Iterator[Server]:
    """The tiny dense vLLM engine beside a simulated one, routing on (so the `best` alias can
    move), dense preferred. The other model only has to stay up and take the alias: a
    simulated engine does, without a second vLLM start."""
    with fleet.servers(__name__) as (srv,):
        yield srv


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            out.append(child)
            stack.append(child)
    return out


def engine_cores(root: int) -> list[int]:
    """The gateway's EngineCore processes, oldest first (the engines start in config order)."""
    found = []
    for pid in descendants(root):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"EngineCore" not in f.read():
                    continue
            with open(f"/proc/{pid}/stat") as f:
                started = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: start time
        except (OSError, IndexError, ValueError):
            continue
        found.append((started, pid))
    return [pid for _, pid in sorted(found)]


def ready(server: Server) -> httpx.Response:
    return httpx.get(f"{server.base_url}/ready", timeout=30)


def metric(server: Server, name: str, model: str) -> float:
    text = httpx.get(f"{server.base_url}/metrics", headers=HEADERS, timeout=30).text
    want = f'{name}{{model="{model}"}}'
    return next((float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(want)), 0.0)


def requests_total(server: Server, model: str, outcome: str) -> float:
    return metric_line(server, f'sparkgate_requests_total{{model="{model}",outcome="{outcome}"}}')


def metric_line(server: Server, prefix: str) -> float:
    text = httpx.get(f"{server.base_url}/metrics", headers=HEADERS, timeout=30).text
    return next((float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(prefix)), 0.0)


def test_a_killed_engine_core_fails_cleanly_and_comes_back(server: Server) -> None:
    client = sdk_client(server)
    cores = engine_cores(server.proc.pid)
    assert len(cores) == 1, cores  # the dense model's; the other one is simulated
    dense_core = cores[0]
    # Control: while both are up, the alias goes to the dense model (it is preferred).
    assert client.chat.completions.create(model="best", messages=MESSAGES_SHORT, max_tokens=2).model == DENSE  # type: ignore[arg-type]
    failed_before = requests_total(server, DENSE, "failed")
    completed_before = requests_total(server, DENSE, "completed")
    stream = client.chat.completions.create(
        model=DENSE,
        messages=MESSAGES_SHORT,  # type: ignore[arg-type]
        max_tokens=20000,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = iter(stream)
    for _ in range(3):  # it is decoding on the engine
        next(chunks)

    os.kill(dense_core, signal.SIGKILL)
    killed = time.monotonic()
    with pytest.raises(openai.APIError) as e:
        for _ in chunks:
            pass
    assert DENSE in e.value.message or "engine" in e.value.message

    # Down: /ready says why; the model's new requests get a 503 with Retry-After.
    deadline = time.monotonic() + 60
    while (r := ready(server)).json()["models"][DENSE]["state"] != "restarting":
        assert time.monotonic() < deadline, r.json()
        time.sleep(0.1)
    body: dict[str, Any] = r.json()
    assert r.status_code == 503 and body["ready"] is False
    dense = body["models"][DENSE]
    assert dense["deaths"] == 1 and "died" in dense["reason"]
    assert body["models"][OTHER]["state"] == "up"
    assert any(DENSE in reason for reason in body["reasons"])
    with pytest.raises(openai.InternalServerError) as refused:
        client.chat.completions.create(model=DENSE, messages=MESSAGES_SHORT, max_tokens=2)  # type: ignore[arg-type]
    err = refused.value.response.json()["error"]
    assert refused.value.status_code == 503 and err["code"] == "engine_unavailable" and err["type"] == "server_error"
    assert int(refused.value.response.headers["retry-after"]) >= 1
    # The alias that prefers the dead model goes to the other one; the other model serves on.
    routed = client.chat.completions.create(model="best", messages=MESSAGES_SHORT, max_tokens=2)  # type: ignore[arg-type]
    assert routed.model == OTHER
    # Every reservation of the cut request is back, and it counts as failed.
    s = server.stats()
    assert s["engines"][DENSE]["admission"]["used_blocks"] == 0 and s["engines"][DENSE]["admission"]["admitted"] == 0
    assert s["engines"][DENSE]["inflight"] == 0 and s["quota"]["holds"] == 0
    assert requests_total(server, DENSE, "failed") == failed_before + 1  # the cut stream
    assert requests_total(server, DENSE, "completed") == completed_before
    assert metric(server, "sparkgate_engine_up", DENSE) == 0.0
    assert metric(server, "sparkgate_engine_deaths_total", DENSE) == 1.0

    # Restarted (its KV spec read again and checked) and serving, the gateway never restarted.
    deadline = time.monotonic() + COMES_BACK_S
    while (r := ready(server)).status_code != 200:
        body = r.json()
        assert body["models"][DENSE]["state"] == "restarting", body  # not left down
        assert time.monotonic() < deadline, f"not back after {COMES_BACK_S}s: {body}"
        time.sleep(0.5)
    assert time.monotonic() - killed >= BACKOFF_S
    back = r.json()["models"][DENSE]
    assert back["state"] == "up" and back["deaths"] == 1 and back["restarts"] == 1
    answer = client.chat.completions.create(model=DENSE, messages=MESSAGES_SHORT, max_tokens=4)  # type: ignore[arg-type]
    assert answer.usage is not None and answer.usage.completion_tokens >= 1
    assert client.chat.completions.create(model="best", messages=MESSAGES_SHORT, max_tokens=2).model == DENSE  # type: ignore[arg-type]
    assert metric(server, "sparkgate_engine_up", DENSE) == 1.0
    assert metric(server, "sparkgate_engine_restarts_total", DENSE) == 1.0
    new_cores = engine_cores(server.proc.pid)
    assert len(new_cores) == 1 and dense_core not in new_cores, new_cores  # no leftover core process
    assert server.proc.poll() is None
