"""`sparkgate serve` refuses a memory plan that does not fit, naming the numbers, before any engine starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_serve_refuses_a_box_that_cannot_hold_the_models(tmp_path: Path) -> None:
    cfg = {
        "box": {"memory": "128GiB", "reserved": "26GiB"},
        "models": [
            {"name": "qwen3.6-35b-a3b", "path": str(ROOT / "models/tiny-qwen3"), "weights_bytes": "22GiB"},
            {"name": "qwen3.8-27b", "path": str(ROOT / "models/tiny-qwen3"), "weights_bytes": "20GiB"},
            {"name": "qwen3.8-flash-next", "path": str(ROOT / "models/tiny-qwen3"), "weights_bytes": "85GiB"},
        ],
    }
    path = tmp_path / "box.yaml"
    path.write_text(yaml.safe_dump(cfg))
    r = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
    assert "do not fit in the box's memory" in r.stderr
    assert "qwen3.8-flash-next: weights 85.00 GiB" in r.stderr and "25.00 GiB more than the box has" in r.stderr
    assert "Traceback" not in r.stderr
