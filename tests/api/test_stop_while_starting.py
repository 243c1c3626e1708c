"""SIGTERM to a `sparkgate serve` whose vLLM engine is still starting: it exits at once, 0, and
its engine's processes (the engine core and its worker) go with it. uvicorn alone would stop
only once the start is over: 20-35 s for the tiny engine on 2 idle cores, minutes for a real
one on a GPU, while a container's stop or a test's teardown waits.

No timing threshold decides it: the server must exit before it ever became ready (a server
that finished its start first logs `sparkgate ready`, however fast the machine), and within a
bound far above the milliseconds the exit takes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import exit_with_parent
from tests.configs import shipped_config, write_config
from tests.conftest import ROOT, STARTUP_TIMEOUT_S

pytestmark = pytest.mark.engine  # starts a vLLM engine

EXITS_WITHIN_S = 15  # a bound, not a threshold: the exit takes milliseconds


def stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command's name (state, ppid, pgrp, ...); None once
    the process is gone. A zombie counts as gone: in a container, init may never reap it."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else fields


def processes() -> dict[int, list[str]]:
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := stat(int(entry))) is not None:
            found[int(entry)] = fields
    return found


def group(pgid: int) -> list[int]:
    """The live processes of process group `pgid`."""
    return [pid for pid, fields in processes().items() if int(fields[2]) == pgid]


def grandchildren(pid: int) -> list[int]:
    """The processes two generations below `pid`: an engine core's worker, below the server."""
    procs = processes()
    children = {p for p, fields in procs.items() if int(fields[1]) == pid}
    return [p for p, fields in procs.items() if int(fields[1]) in children]


def wait_for(condition: Callable[[], object], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not {what} after {timeout_s} s"
        time.sleep(0.05)  # polled, not waited out


def test_sigterm_while_the_engine_starts_ends_the_server_and_its_engine(tmp_path: Path) -> None:
    # The shipped default's tiny vLLM model alone, with a small pool.
    cfg = shipped_config("default", models={"sparkgate-tiny": {"max_model_len": 4096, "kv_cache_bytes": "32MiB"}})
    cfg["models"] = [m for m in cfg["models"] if m["name"] == "sparkgate-tiny"]
    config = write_config(cfg, tmp_path)
    log_path = tmp_path / "server.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            exit_with_parent.command("gateway.cli", "serve", "--config", str(config)),
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            process_group=0,  # its engine's processes join its group: the check below finds them
        )
    try:

        def starting() -> bool:
            assert proc.poll() is None, log_path.read_text(errors="replace")[-3000:]
            return bool(grandchildren(proc.pid))

        # The engine is starting: its core process is up and has started its worker.
        wait_for(starting, "an engine worker", STARTUP_TIMEOUT_S)
        engine = group(proc.pid)
        assert len(engine) >= 3, engine  # the server, the engine core, its worker
        os.kill(proc.pid, signal.SIGTERM)  # the server alone, as Docker or systemd sends it
        sent = time.monotonic()
        try:
            returncode = proc.wait(timeout=EXITS_WITHIN_S)
        except subprocess.TimeoutExpired:
            tail = log_path.read_text(errors="replace")[-3000:]
            pytest.fail(f"still running {EXITS_WITHIN_S} s after SIGTERM:\n{tail}")
        took = time.monotonic() - sent
        text = log_path.read_text(errors="replace")
        assert returncode == 0, text[-3000:]
        assert "SIGTERM while the engines start" in text, text[-3000:]
        assert "sparkgate ready" not in text, f"it finished its start first ({took:.1f} s):\n{text[-3000:]}"
        # Its engine's processes were killed, not left running on their own.
        wait_for(lambda: not group(proc.pid), f"gone: {group(proc.pid)}", EXITS_WITHIN_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
