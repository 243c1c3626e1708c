"""`sparkgate serve` as a child process, for the benchmark scripts (the tests have their own
in tests/conftest.py): started on a free port, waited for until /ready, stopped with SIGINT
(a drain: requests still running may finish) and, after 30 s, SIGKILL."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Gateway:
    base_url: str
    pid: int


@contextlib.contextmanager
def launch(config: Path, log_path: Path, port: int, *, startup_timeout_s: float = 420) -> Iterator[Gateway]:
    """`sparkgate serve --config` until the block exits."""
    import httpx

    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config)],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            # Its own process group (to stop it and its engine processes together) but not its own
            # session: a new session is a new scheduler autogroup, and on this kernel (EEVDF,
            # autogroup on) an engine spinning in another autogroup stalls this process's timers
            # and reads for seconds.
            process_group=0,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + startup_timeout_s
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"gateway exited with {proc.returncode}:\n{log_path.read_text()[-5000:]}")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{base}/ready", timeout=2).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"gateway did not start in {startup_timeout_s}s:\n{log_path.read_text()[-5000:]}"
                    )
                time.sleep(0.5)
            yield Gateway(base, proc.pid)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
