"""Kills the engines' EngineCore processes and checks that clients get a clean 503, not a
500 or a hang. On a server of its own: the session's shared one must outlive it."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.conftest import DENSE, MESSAGES_SHORT, MOE, Server, sdk_client, two_engine_server

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with two_engine_server(tmp_path_factory, "doomed") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return sdk_client(server)


def engine_core_pids(root_pid: int) -> list[int]:
    pids = []
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
    stack = [root_pid]
    while stack:
        pid = stack.pop()
        for child in children.get(pid, []):
            stack.append(child)
            try:
                with open(f"/proc/{child}/cmdline", "rb") as f:
                    if b"EngineCore" in f.read():
                        pids.append(child)
            except OSError:
                pass
    return pids


def test_dead_engine_gives_503(server: Server, client: openai.OpenAI) -> None:
    pids = engine_core_pids(server.proc.pid)
    assert len(pids) == 2, pids
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while httpx.get(f"{server.base_url}/ready").status_code != 503:
        if time.monotonic() > deadline:
            pytest.fail("/ready never reported the dead engines")
        time.sleep(0.5)
    for model in (DENSE, MOE):
        with pytest.raises(openai.InternalServerError) as e:
            client.chat.completions.create(model=model, messages=MESSAGES_SHORT, max_tokens=2)
        assert e.value.status_code == 503
        err = e.value.response.json()["error"]
        assert err["code"] == "engine_unavailable" and err["type"] == "server_error"
        assert e.value.response.headers.get("retry-after")
    # The gateway process itself is still up and answering.
    assert server.proc.poll() is None
