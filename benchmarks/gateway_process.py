"""Servers as child processes for the benchmark scripts (the tests have their own launcher in
tests/conftest.py): `child` for any server, `launch` for `sparkgate serve` on a config."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # for tests.ports: overhead.py imports this with only benchmarks/ on the path
# Re-exported: the benchmark scripts import it from here.
from tests.ports import free_port as free_port  # noqa: E402


@dataclass(frozen=True)
class Gateway:
    base_url: str
    pid: int


@contextlib.contextmanager
def child(
    args: list[str],
    log_path: Path,
    ready: str | bytes,
    *,
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
    startup_timeout_s: float = 420,
) -> Iterator[int]:
    """A server process until the block exits; its pid once `ready` holds: a URL that answers
    200, or bytes that appear in its log. Stopped with SIGINT (a drain: requests still running
    may finish) and, after 30 s, SIGKILL, with its whole process group."""
    import httpx

    with log_path.open("wb") as out:
        # Its own process group (to stop it and its engine processes together) but not its own
        # session: a new session is a new scheduler autogroup, and on this kernel (EEVDF,
        # autogroup on) an engine spinning in another autogroup stalls this process's timers
        # and reads for seconds.
        proc = subprocess.Popen(args, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env, process_group=0)
        try:
            deadline = time.monotonic() + startup_timeout_s
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"{args[:4]} exited with {proc.returncode}:\n{log_path.read_text()[-5000:]}")
                if isinstance(ready, bytes):
                    if ready in log_path.read_bytes():
                        break
                else:
                    with contextlib.suppress(httpx.HTTPError):
                        if httpx.get(ready, timeout=2).status_code == 200:
                            break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{args[:4]} not ready in {startup_timeout_s}s:\n{log_path.read_text()[-5000:]}")
                time.sleep(0.05 if isinstance(ready, bytes) else 0.5)
            yield proc.pid
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@contextlib.contextmanager
def launch(
    config: Path, log_path: Path, port: int, *, ref: str = "", startup_timeout_s: float = 420
) -> Iterator[Gateway]:
    """`sparkgate serve --config` until the block exits; `ref`: the gateway as of that git ref
    (exported next to the config), for a before and after in one run."""
    base = f"http://127.0.0.1:{port}"
    args = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config)]
    cwd = ROOT if not ref else source_tree(ref, config.parent)
    with child(args, log_path, f"{base}/ready", cwd=cwd, startup_timeout_s=startup_timeout_s) as pid:
        yield Gateway(base, pid)


def source_tree(ref: str, into: Path) -> Path:
    """The repository as of git `ref`, exported (`git archive`) to a directory under `into`."""
    tree = into / f"tree-{ref.replace('/', '_').replace('~', '-')}"
    tree.mkdir(exist_ok=True)
    archive = subprocess.run(["git", "archive", ref], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree
