"""Codex CLI itself (npm `@openai/codex`, pinned in tests/agent_clients.py), `codex exec`
against the gateway's Responses API on the replay engine, configured the way the README
tells users to (`sparkgate codex-config`: a model provider and a model catalog). It answers a
prompt; it applies the patch the model writes with its freeform `apply_patch` tool and prints
the model's next answer; it runs a namespaced tool (multi_agent_v1's wait_agent). Codex talks
to a custom provider with plain HTTP POSTs answered with server-sent events, as the gateway's
request log shows. No Node or npm registry fails these tests."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from engine_adapter import recordings
from engine_adapter.recordings import tag
from tests import agent_clients
from tests.conftest import API_KEY, REPLAY_AGENTS, Server

PATCH = json.loads(recordings.CODEX_PATCH[0].split("\n")[1])["arguments"]["input"]


@pytest.fixture(scope="module")
def codex() -> Path:
    return agent_clients.install() / "codex"


@pytest.fixture(scope="module")
def server(replay_server: Server) -> Server:
    return replay_server  # its replay-agents model has an agent's context


@pytest.fixture
def codex_home(server: Server, tmp_path: Path) -> Path:
    """A CODEX_HOME with the config `sparkgate codex-config` prints, and its catalog."""
    home = tmp_path / "codex-home"
    entries = agent_clients.codex_home(home, server.log_path.parent / "sparkgate-replay.yaml", "--model", REPLAY_AGENTS)
    assert f'base_url = "{server.api}"' in (home / "config.toml").read_text()  # server.host:port, from the config
    entry = entries[REPLAY_AGENTS]
    assert entry["apply_patch_tool_type"] == "freeform" and entry["context_window"] == 131072
    return home


def run_codex(codex: Path, home: Path, workspace: Path, prompt: str) -> subprocess.CompletedProcess[str]:
    workspace.mkdir(exist_ok=True)
    env = {
        "PATH": os.environ["PATH"],  # node, for the npm wrapper
        "HOME": str(home),
        "CODEX_HOME": str(home),
        "SPARKGATE_API_KEY": API_KEY,
    }
    return subprocess.run(
        [str(codex), "exec", "--json", "--skip-git-repo-check", "--sandbox", "workspace-write", prompt],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )


def events(done: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def answers(events: list[dict[str, Any]]) -> list[str]:
    return [e["item"]["text"] for e in events if e["type"] == "item.completed" and e["item"]["type"] == "agent_message"]


def session_items(home: Path) -> list[dict[str, Any]]:
    """The items of the session Codex recorded (its rollout): what it made of the responses."""
    (rollout,) = (home / "sessions").rglob("*.jsonl")
    lines = [json.loads(line) for line in rollout.read_text().splitlines()]
    return [x["payload"] for x in lines if x.get("type") == "response_item"]


def test_codex_answers(codex: Path, server: Server, codex_home: Path, tmp_path: Path) -> None:
    before = len(server.requests_logged())
    done = events(run_codex(codex, codex_home, tmp_path / "ws", "hello"))
    assert answers(done) == [recordings.ANSWER]
    assert done[-1]["type"] == "turn.completed" and done[-1]["usage"]["input_tokens"] > 5000
    # One turn, one POST /v1/responses answered with a stream: no WebSocket, no other call.
    (request,) = server.requests_logged()[before:]
    assert (request["method"], request["path"], request["status"], request["stream"]) == (
        "POST",
        "/v1/responses",
        "200",
        "True",
    )


def test_codex_applies_the_patch_and_answers_from_the_result(
    codex: Path, server: Server, codex_home: Path, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    before = len(server.requests_logged())
    done = events(run_codex(codex, codex_home, workspace, f"Create hello.txt. {tag('codex_patch')}"))
    assert (workspace / "hello.txt").read_text() == "hello from sparkgate\n"  # Codex applied the patch
    changes = [e["item"] for e in done if e["type"] == "item.completed" and e["item"]["type"] == "file_change"]
    assert [c["status"] for c in changes] == ["completed"]
    assert answers(done) == [recordings.CODEX_PATCH[1]]  # "I created hello.txt."
    items = session_items(codex_home)
    (call,) = [i for i in items if i["type"] == "custom_tool_call"]
    assert call["name"] == "apply_patch" and call["input"] == PATCH
    (output,) = [i for i in items if i["type"] == "custom_tool_call_output"]
    assert output["call_id"] == call["call_id"]
    # The call, then the answer from its result: two streamed POSTs.
    logged = server.requests_logged()[before:]
    assert [(r["method"], r["path"], r["stream"], r["status"]) for r in logged] == [
        ("POST", "/v1/responses", "True", "200")
    ] * 2


def test_codex_runs_a_namespaced_tool(codex: Path, codex_home: Path, tmp_path: Path) -> None:
    done = events(run_codex(codex, codex_home, tmp_path / "ws", f"Wait for the agent. {tag('codex_wait')}"))
    assert answers(done) == [recordings.CODEX_WAIT[1]]
    items = session_items(codex_home)
    (call,) = [i for i in items if i["type"] == "function_call"]
    assert (call["name"], call["namespace"]) == ("wait_agent", "multi_agent_v1")
    (output,) = [i for i in items if i["type"] == "function_call_output"]
    # Codex ran its wait_agent on the call's arguments: the recorded id is no real agent's.
    assert output["call_id"] == call["call_id"] and output["output"].startswith("invalid agent id agent-1")
