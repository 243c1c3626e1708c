"""`make check`'s tests: the unit tests and the rest, as two pytest processes side by side.

Most of the fast tier's time is one core's work in one process (the unit tests, the API tests'
clients), so on 2 cores two processes take a little over half the time of one. The coverage
gate belongs to the unit tests (tests/conftest.py measures only them), so it runs there.

    python tools/check_tiers.py [pytest arguments for both] -- [arguments for the unit tests only]

Each process's output is printed whole when it ends, unit tests first; the exit status is the
first non-zero one. Each writes its failures in full to its own file (`SPARKGATE_TEST_FAILURES`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIERS = {"unit": ["tests/unit"], "api": ["tests/api", "tests/integration"]}


def main(argv: list[str]) -> int:
    at = argv.index("--") if "--" in argv else len(argv)
    shared, unit_only = argv[:at], argv[at + 1 :]
    started = time.monotonic()
    running: dict[str, tuple[subprocess.Popen[bytes], tempfile._TemporaryFileWrapper[bytes]]] = {}
    for tier, paths in TIERS.items():
        out = tempfile.NamedTemporaryFile(prefix=f"check-{tier}-", suffix=".log")  # noqa: SIM115
        env = {**os.environ, "SPARKGATE_TEST_FAILURES": str(ROOT / ".cache" / f"test-failures-{tier}.txt")}
        args = [sys.executable, "-m", "pytest", *paths, *shared, *(unit_only if tier == "unit" else [])]
        running[tier] = (subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT), out)
    status = 0
    for tier, (proc, out) in running.items():
        code = proc.wait()
        out.seek(0)
        sys.stdout.write(f"==== {tier}: {' '.join(TIERS[tier])} (exit {code})\n")
        sys.stdout.flush()
        sys.stdout.buffer.write(out.read())
        out.close()
        status = status or code
    print(f"==== both tiers in {time.monotonic() - started:.0f} s")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
