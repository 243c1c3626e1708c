"""`sparkgate serve` refuses a memory plan that does not fit, or a port in use, naming why, before any engine starts."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import ROOT, free_port


def sparkgate(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


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
    r = sparkgate("serve", "--config", str(path))
    assert r.returncode == 2, r.stderr
    assert "do not fit in the box's memory" in r.stderr
    assert "qwen3.8-flash-next: weights 85.00 GiB" in r.stderr and "25.00 GiB more than the box has" in r.stderr
    assert "Traceback" not in r.stderr


def test_serve_refuses_a_port_in_use_before_starting_engines(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = {
            "server": {"host": "127.0.0.1", "port": port},
            "models": [{"name": "tiny", "path": str(ROOT / "models/tiny-qwen3"), "max_model_len": 512}],
        }
        path = tmp_path / "taken.yaml"
        path.write_text(yaml.safe_dump(cfg))
        r = sparkgate("serve", "--config", str(path))
    assert r.returncode == 2, r.stderr
    assert f"cannot serve on 127.0.0.1:{port}: Address already in use" in r.stderr
    assert "Traceback" not in r.stderr and "EngineCore" not in r.stderr and "Waiting for application" not in r.stderr


def test_serve_exits_3_when_startup_fails_and_frees_its_port(tmp_path: Path) -> None:
    (tmp_path / "no-tokenizer").mkdir()
    (tmp_path / "no-tokenizer" / "config.json").write_text("{}")
    port = free_port()
    model = {"name": "m", "path": str(tmp_path / "no-tokenizer"), "engine": "simulated"}
    cfg = {
        "server": {"host": "127.0.0.1", "port": port, "cache_dir": str(tmp_path / "cache")},
        "models": [model | {"simulated": {"model": "Qwen3.6-35B-A3B"}}],
    }
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(cfg))
    r = sparkgate("serve", "--config", str(path))
    assert r.returncode == 3, r.stderr  # the engine could not start: not a clean exit
    assert "Application startup failed" in r.stderr
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))


def test_plan_compares_placements_and_draws_them(tmp_path: Path) -> None:
    out = tmp_path / "plan.html"
    args = ["plan", "--boxes", "1", "--duration", "60", "--max-rate", "0.1", "--step", "0.1", "--out", str(out)]
    r = sparkgate(*args, "--mix", "chat=1", timeout=120)
    assert r.returncode == 0, r.stderr
    table = r.stdout.splitlines()
    assert table[0].startswith("placement") and "req/s at 95%" in table[0]
    # Flash-Next fits a box alone with its n-gram table on disk (vLLM 0.34), beside no other model.
    assert {re.split(r"\s{2,}", line)[0] for line in table[1:-1]} == {
        "qwen3.6-35b-a3b",
        "qwen3.8-27b",
        "qwen3.8-27b + qwen3.6-35b-a3b",
        "qwen3.8-flash-next",
    }
    page = out.read_text()
    assert "<svg" in page and "chat: 100%" in page and "qwen3.8-27b + qwen3.6-35b-a3b" in page


def test_plan_rejects_an_unknown_workload_kind() -> None:
    r = sparkgate("plan", "--mix", "poetry=1")
    assert r.returncode == 2 and "unknown kinds ['poetry']" in r.stderr


def test_plan_two_sparks_compares_flash_next_placements(tmp_path: Path) -> None:
    """(a) table on disk (vLLM 0.34), (b) TP=2 over both boxes, (c) two models, (d)/(e) beside
    another model: each with its memory per box (the worst moment's floor kept) and SLO
    attainment, and the recommendation."""
    out = tmp_path / "plan.html"
    args = ["plan", "--two-sparks", "--duration", "60", "--seeds", "1", "--max-rate", "0.2", "--step", "0.1"]
    r = sparkgate(*args, "--mix", "chat=1", "--out", str(out), timeout=300)
    assert r.returncode == 0, r.stderr
    text = r.stdout
    assert "(a) qwen3.8-flash-next alone on spark-2, n-gram table on disk" in text
    assert "needs: vLLM >= 0.34.0: ple_table.placement disk" in text
    # (a): 121.6 - 24 reserved - 75.2 - 30.5 MiB of buffers - 2 (start-up) - 4 (floor): 429 blocks.
    assert "qwen3.8-flash-next KV: 429 blocks of 3136 tokens (39.05 MiB)" in text
    assert "KV: qwen3.8-27b 24.80 GiB, qwen3.6-35b-a3b 24.80 GiB" in text
    assert "(b) qwen3.8-flash-next TP=2 over spark-1+spark-2" in text
    assert "(c) qwen3.8-27b on spark-1, qwen3.6-35b-a3b on spark-2, qwen3.8-flash-next not served" in text
    # (b): 24 reserved + 20 (27B) + 37.6 + 23.84 (half of Flash-Next's weights and table) on spark-1.
    assert "qwen3.8-flash-next: weights 37.60 GiB (1/2 of 75.20 GiB)" in text
    assert "n-gram table 23.84 GiB (1/2 of 320,001,536 x 160 fp8 = 47.68 GiB, pinned host memory)" in text
    assert "KV: qwen3.8-27b 5.07 GiB, qwen3.8-flash-next 5.07 GiB" in text
    assert "KV: qwen3.8-27b 71.60 GiB" in text
    # Beside another model on one box, Flash-Next's 75.2 GiB leave less than the floor.
    assert "(d) qwen3.8-flash-next beside qwen3.6-35b-a3b on spark-2" in text
    assert "spark-2: does not fit (5.63 GiB over)" in text and "5.63 GiB under the floor" in text
    assert "(e) qwen3.8-flash-next beside qwen3.8-27b on spark-2" in text and "3.63 GiB under the floor" in text
    assert text.count("SLO attainment (") == 3 and text.count("not simulated: it does not fit") == 2
    assert "recommended (fits, most load, then most models): (" in text
    assert "worst moment, the largest engine starting (2.00 GiB of start-up transients)" in text
    assert "<svg" in out.read_text()


def test_the_recommendation_says_why_it_leaves_a_model_out() -> None:
    """The most load wins; on a tie, the placement serving more models; a recommendation that
    leaves one out says what each all-models placement sustains, or by how much it does not fit."""
    from gateway.plan import two_sparks as two
    from gateway.plan.planner import PlanRow
    from gateway.settings import load_settings

    options = two.options(load_settings(ROOT / "config/sim-dgx-spark.yaml").models)
    assert [o.key for o in options] == ["a", "b", "c", "d", "e"]
    assert [o.fits for o in options] == [True, True, True, False, False]
    by_key = {o.key: o for o in options}

    def rows(**rps: float) -> dict[str, PlanRow]:
        return {k: PlanRow(by_key[k].placement, v, ()) for k, v in rps.items()}

    assert two.recommended(options, rows(a=0.35, b=0.2, c=0.4)) is by_key["c"]
    assert two.recommended(options, rows(a=0.4, b=0.2, c=0.4)) is by_key["a"]  # a tie: three models
    lines = two.report(options, rows(a=0.35, b=0.2, c=0.4), target=0.95, per_user=1.0, total=two.SPARK_MEMTOTAL)
    assert lines[-1] == (
        "why not all 3 models: of the placements that serve them, (a) sustains 0.35 req/s, 13% less; "
        "(b) sustains 0.20 req/s, 50% less; (d) does not fit (5.63 GiB over); (e) does not fit (3.63 GiB over); "
        "(c) sustains 0.40 req/s at the same SLO attainment"
    )
    tied = two.report(options, rows(a=0.4, b=0.2, c=0.4), target=0.95, per_user=1.0, total=two.SPARK_MEMTOTAL)
    assert tied[-1].startswith("recommended (fits, most load, then most models): (a)")


def test_tensor_parallel_steps_pay_the_link() -> None:
    from gateway.plan.fleet import Link, TensorParallel

    tp = TensorParallel(ranks=2, allreduces=96, activation_bytes=5120, link=Link(bytes_per_s=22.5e9, latency_s=20e-6))
    # A decode step of 4 sequences: latency-bound, ~1.9 ms; a 4,096-token prefill: ~91 ms.
    assert abs(tp.step_s(4) - 96 * (20e-6 + 4 * 5120 / 22.5e9)) < 1e-12
    assert 0.09 < tp.step_s(4096) < 0.095
