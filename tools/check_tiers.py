"""The tests as two pytest processes side by side: `unit` (the KV exactness tests' in-process
engines, then tests/unit, with the coverage gate: tests/conftest.py measures only them) and `api`
(every other test: tests/api and tests/integration, the ones with servers).

Each process is mostly one core's work at a time (a test and the server it talks to, or a unit
test), and one process alone left the 2 cores about a third idle. `make check` runs the two at
the same priority. `make test` runs `unit` niced (`--unit-nice`): beside real vLLM engines, which
keep a core each busy while they decode, the two at one priority slowed the servers' half by 40%
(benchmarks/results/setup-and-tests.md); niced, the unit half takes what the servers leave idle.

    python tools/check_tiers.py [--unit-nice N] [pytest arguments for both] -- [arguments for unit]

Each process's output is printed whole when it ends; .cache/check-<tier>.log has it as it runs.
The exit status is the first non-zero one. Each writes its failures in full to its own file
(`SPARKGATE_TEST_FAILURES`: .cache/test-failures-<tier>.txt).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KV_EXACT = "tests/integration/test_kv_exact.py"
# The KV exactness tests first: their in-process engines are the unit process's one long
# stretch, and niced they ran 3-4x slower once the servers' engine tests were under way.
TIERS = {"unit": [KV_EXACT, "tests/unit"], "api": ["tests/api", "tests/integration", f"--ignore={KV_EXACT}"]}


def main(argv: list[str]) -> int:
    nice = 0
    if argv[:1] == ["--unit-nice"]:
        nice, argv = int(argv[1]), argv[2:]
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
            if tier == "unit" and nice:
                args = ["nice", "-n", str(nice), *args]
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
