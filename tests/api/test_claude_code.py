"""Claude Code itself (npm `@anthropic-ai/claude-code`, pinned in tests/agent_clients.py),
headless, against the gateway's Messages API on the replay engine: it answers a prompt, and
in a turn where the model calls its Bash tool, Claude Code runs the command, sends the
tool_result, and prints the model's next answer. No Node or npm registry fails these tests."""

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


@pytest.fixture(scope="module")
def claude() -> Path:
    return agent_clients.install() / "claude"


def run_claude(claude: Path, server: Server, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": server.base_url,
        "ANTHROPIC_AUTH_TOKEN": API_KEY,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    return subprocess.run(
        [str(claude), "-p", *args, "--model", REPLAY_AGENTS],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )


def test_claude_code_answers(claude: Path, replay_server: Server, tmp_path: Path) -> None:
    done = run_claude(claude, replay_server, tmp_path, "hello")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == recordings.ANSWER


def test_claude_code_runs_its_bash_tool_and_answers_from_the_result(
    claude: Path, replay_server: Server, tmp_path: Path
) -> None:
    prompt = f"Print the marker. {tag('claude_bash')}"
    done = run_claude(
        claude, replay_server, tmp_path, prompt, "--allowedTools", "Bash", "--output-format", "stream-json", "--verbose"
    )
    assert done.returncode == 0, done.stderr
    lines: list[dict[str, Any]] = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    blocks = [(m["type"], b) for m in lines if m["type"] in ("assistant", "user") for b in m["message"]["content"]]
    calls = [b for kind, b in blocks if kind == "assistant" and b["type"] == "tool_use"]
    results = [b for kind, b in blocks if kind == "user" and b["type"] == "tool_result"]
    assert [c["name"] for c in calls] == ["Bash"] and calls[0]["input"]["command"] == "echo sparkgate-$((6*7))"
    (result,) = results
    assert result["tool_use_id"] == calls[0]["id"] and not result.get("is_error")
    assert "sparkgate-42" in json.dumps(result["content"])  # Claude Code really ran the command
    final = lines[-1]
    assert final["type"] == "result" and final["result"] == recordings.CLAUDE_BASH[1]
