"""benchmarks/gpu/routing_real.py's `report` on the recorded H200 runs: the box model (virtual
time, no GPU) against what the real engines did (issue 21)."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import ROOT

RESULT = ROOT / "benchmarks/gpu/routing_real_result/routing_real_gpu_bf16_0.9.json"


def test_the_box_model_predicts_the_h200_routing_runs_within_three_points() -> None:
    cmd = [sys.executable, str(ROOT / "benchmarks/gpu/routing_real.py"), "report", str(RESULT)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {
        m["strategy"].strip(): (int(m["offered"]), float(m["measured"]), float(m["predicted"]))
        for m in re.finditer(
            r"^(?P<strategy>\S.{0,23}?)\s+(?P<offered>\d+)\s+(?P<measured>[\d.]+)%\s+(?P<predicted>[\d.]+)%",
            r.stdout,
            re.M,
        )
    }
    # Three seeds of each; measured as recorded (router 130/155, the 35B-A3B alone 96/155).
    assert rows.keys() == {"router", "qwen3.6-35b-a3b alone"}
    assert rows["router"][:2] == (155, 83.9) and rows["qwen3.6-35b-a3b alone"][:2] == (155, 61.9)
    for strategy, (_, measured, predicted) in rows.items():
        assert abs(measured - predicted) <= 3.0, (strategy, measured, predicted)
    assert r.stdout.count("per seed, measured / predicted:") == 2
    # Only the 35B-A3B alone sends each request to the same model on both sides: its decode ratio.
    assert r.stdout.count("decode measured / predicted") == 1
    assert "qwen3.6-35b-a3b: alone x1.07 (n=155)" in r.stdout
