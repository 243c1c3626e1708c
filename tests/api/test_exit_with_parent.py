"""A test run that is killed leaves no server behind: each fleet server runs through
tests/exit_with_parent.py, which ends it, and its process group, when the process that started it
goes. Here a short-lived parent starts one and is killed with SIGKILL (no teardown runs)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.configs import shipped_config, write_config
from tests.conftest import ROOT, STARTUP_TIMEOUT_S

GONE_WITHIN_S = 60  # a bound on the polling below, not a threshold: it takes ~0.2 s when idle

# The parents, given a log path and arguments: each starts a child as the fleet does, says its
# pid, then waits to be killed. `python -m tests.exit_with_parent <its pid> MODULE ARG...`, in its
# own process group, its output in the log:
MODULE = """
import subprocess, sys
from tests import exit_with_parent
with open(sys.argv[1], "wb") as log:
    child = subprocess.Popen(
        exit_with_parent.command(*sys.argv[2:]), stdout=log, stderr=subprocess.STDOUT, process_group=0
    )
print(child.pid, flush=True)
sys.stdin.read()
"""
# tests.conftest's RedisServer, its data beside the log:
REDIS = """
import sys
from pathlib import Path
from tests.conftest import RedisServer
redis = RedisServer(Path(sys.argv[1]).parent)
redis.start()
print(redis.proc.pid, flush=True)
sys.stdin.read()
"""


def start_time(pid: int) -> str | None:
    """`pid`'s start time (to tell it from a later process given the same pid), None once it
    is gone. A zombie counts as gone: in a container, init may never reap an orphan."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def wait_for(condition: Callable[[], object], what: str, timeout_s: float = GONE_WITHIN_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not {what} after {timeout_s} s"
        time.sleep(0.05)  # polled, not waited out


Start = Callable[..., tuple[subprocess.Popen[str], int]]


@pytest.fixture
def parent(tmp_path: Path) -> Iterator[Start]:
    """Starts a parent running a script above with `args`; gives it and the child's pid. Whatever
    a failed test leaves is killed."""
    started: list[tuple[subprocess.Popen[str], int]] = []

    def start(script: str, *args: str) -> tuple[subprocess.Popen[str], int]:
        proc = subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path / "child.log"), *args],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        started.append((proc, child))
        return proc, child

    yield start
    for proc, child in started:
        proc.kill()
        proc.wait()
        with contextlib.suppress(ProcessLookupError):  # its group, should its leader have gone alone
            os.killpg(child, signal.SIGKILL)


def test_a_server_ends_when_the_process_that_started_it_is_killed(parent: Start, tmp_path: Path) -> None:
    cfg = shipped_config("replay")  # the replay engine: ready in seconds, no engine process
    config = write_config(cfg, tmp_path)
    proc, server = parent(MODULE, "gateway.cli", "serve", "--config", str(config))
    ready = f"http://127.0.0.1:{cfg['server']['port']}/ready"

    def is_ready() -> bool:
        assert start_time(server) is not None, (tmp_path / "child.log").read_text()[-3000:]
        try:
            return httpx.get(ready, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(is_ready, "ready", STARTUP_TIMEOUT_S)
    born = start_time(server)
    proc.kill()  # SIGKILL: no teardown, as a killed test run
    proc.wait()
    wait_for(lambda: start_time(server) != born, "gone")


def test_its_process_group_goes_with_it(parent: Start, tmp_path: Path) -> None:
    # A stand-in server (this module's `__main__` below) whose child, like vLLM's engine core,
    # is a spawned multiprocessing process that ignores SIGTERM and does not watch its parent.
    proc, server = parent(MODULE, __name__)
    log = tmp_path / "child.log"
    wait_for(lambda: log.read_text().strip(), "the engine's pid in the log")
    engine = int(log.read_text().split()[0])
    born = {pid: start_time(pid) for pid in (server, engine)}
    assert None not in born.values()
    proc.kill()
    proc.wait()
    wait_for(lambda: all(start_time(pid) != t for pid, t in born.items()), "gone")


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")
def test_redis_ends_when_the_process_that_started_it_is_killed(parent: Start) -> None:
    proc, redis = parent(REDIS)
    born = start_time(redis)
    assert born is not None
    proc.kill()
    proc.wait()
    wait_for(lambda: start_time(redis) != born, "gone")


def _engine() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.pause()


if __name__ == "__main__":  # the stand-in server of test_its_process_group_goes_with_it
    engine = multiprocessing.get_context("spawn").Process(target=_engine)
    engine.start()
    print(engine.pid, flush=True)
    signal.pause()
