"""`make check`'s tests as two pytest processes side by side: tests/unit (with the coverage
gate: tests/conftest.py measures only them) and tests/api + tests/integration.

Each is mostly one core's work in one process (the unit tests; the API tests' clients and their
replay or simulated servers), so on 2 cores the two take about half the time of one. `make test`
stays one process: real vLLM engines keep a core each busy while they run, and a second process
beside them slowed both nearly as much as it saved (benchmarks/results/setup-and-tests.md), and
would leave the suite open to flakes made by load.

    python tools/check_tiers.py [pytest arguments for both] -- [arguments for the unit tests]

Each process's output is printed whole when it ends; .cache/check-<tier>.log has it as it runs.
The exit status is the first non-zero one. Each writes its failures in full to its own file
(`SPARKGATE_TEST_FAILURES`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIERS = {"unit": ["tests/unit"], "api": ["tests/api", "tests/integration"]}


def main(argv: list[str]) -> int:
    at = argv.index("--") if "--" in argv else len(argv)
    shared, own = argv[:at], argv[at + 1 :]
    started = time.monotonic()
    (ROOT / ".cache").mkdir(exist_ok=True)
    running: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    try:
        for tier, paths in TIERS.items():
            log = ROOT / ".cache" / f"check-{tier}.log"  # to follow a run: tail -f
            env = {**os.environ, "SPARKGATE_TEST_FAILURES": str(ROOT / ".cache" / f"test-failures-{tier}.txt")}
            args = [sys.executable, "-m", "pytest", *paths, *shared, *(own if tier == "unit" else [])]
            with log.open("wb") as out:
                running[tier] = (subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT), log)
        status = 0
        for tier, (proc, log) in running.items():
            code = proc.wait()
            sys.stdout.write(f"==== {tier}: {' '.join(TIERS[tier])} (exit {code})\n")
            sys.stdout.flush()
            sys.stdout.buffer.write(log.read_bytes())
            status = status or code
        print(f"==== both in {time.monotonic() - started:.0f} s")
        return status
    finally:
        for proc, _ in running.values():
            if proc.poll() is None:  # interrupted: the other one goes too
                proc.terminate()
                proc.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
