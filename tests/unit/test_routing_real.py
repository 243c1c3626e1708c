"""benchmarks/gpu/routing_real.py's `report` on the recorded H200 runs: the box model (virtual
time, no GPU) against what the real engines did on an H200."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

# Minutes of simulated fleet time: the full tier only, and not measured for the coverage gate
# (tests/conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.no_cover]

RESULTS = ROOT / "benchmarks/gpu/routing_real_result"
Rows = dict[str, tuple[int, float, float]]


def report(*names: str) -> tuple[Rows, dict[str, float], str]:
    """`report` on recorded runs of one setting: per strategy (offered, measured %, predicted %),
    the prediction fitted to each run's own probe, and the whole output."""
    cmd = [sys.executable, str(ROOT / "benchmarks/gpu/routing_real.py"), "report", *(str(RESULTS / n) for n in names)]
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
    found = re.findall(r"fitted to the probe: predicted ([\d.]+)%", r.stdout)
    return rows, dict(zip(rows, map(float, found), strict=True)), r.stdout  # (report's order)


def test_on_real_engines_the_router_meets_99_percent_where_the_best_model_alone_is_under_80() -> None:
    """Six seeds at 0.65 req/s on three H200s: the sixth run (seeds 1-3 of the router and the
    35B-A3B alone, 1-2 of the others), the seventh (seed 3 of those two) and the eighth (seeds 4-6
    of every policy, on a third machine). The issue's two goals, as recorded: the router met 99.1%
    of objectives where the best single model met 65.5%, and the box model fitted to each call's
    own probe predicts every policy within 3 points."""
    runs = [f"routing_real_gpu_bf16_0.65_run{n}.json" for n in (6, 7, 8)]
    rows, fitted, out = report(*runs)
    assert {k: v[:2] for k, v in rows.items()} == {
        "router": (232, 99.1),
        "qwen3.6-35b-a3b alone": (232, 65.5),
        "qwen3.8-27b alone": (232, 43.1),
        "round-robin": (232, 77.6),
    }
    seeds = re.findall(r"per seed, measured / predicted: (.*)$", out, re.M)
    assert [re.findall(r"(\d+): ", line) for line in seeds] == [["1", "2", "3", "4", "5", "6"]] * 4
    assert out.count(": probe: this machine's host time") == 3  # each call's host fitted apart
    best_alone = max(rows[s][1] for s in rows if s.endswith(" alone"))
    assert rows["router"][1] >= 99.0 > 80.0 > best_alone
    assert "prompt tokens found cached: measured 0.0%" in out  # no run fed on another's prompts
    for strategy, (_, measured, _) in rows.items():
        assert abs(measured - fitted[strategy]) <= 3.0, (strategy, measured, fitted[strategy])
    # Goodput: objectives met per second of arrivals (six 60 s windows).
    goodput = dict(zip(rows, map(float, re.findall(r"measured   goodput ([\d.]+) req/s", out)), strict=True))
    assert goodput["router"] == pytest.approx(230 / 360, abs=5e-4)
    assert goodput["router"] > 1.4 * max(goodput[s] for s in rows if s.endswith(" alone"))

    # The eighth run alone (one machine, seeds 4-6): the router missed two chats of seed 5, the
    # fitted box model one; the 35B-A3B alone is 15.8 points under the box model from the
    # datasheet, within 3 once fitted (this host: 0.06 + 0.53 ms per step and per sequence).
    rows, fitted, _ = report(runs[-1])
    assert {k: v[1] for k, v in rows.items()} == {
        "router": 98.3,
        "qwen3.6-35b-a3b alone": 58.3,
        "qwen3.8-27b alone": 45.8,
        "round-robin": 75.8,
    }
    assert rows["qwen3.6-35b-a3b alone"][2] - rows["qwen3.6-35b-a3b alone"][1] > 15.0
    for strategy, (_, measured, _) in rows.items():
        assert abs(measured - fitted[strategy]) <= 3.0, (strategy, measured, fitted[strategy])


def test_the_box_model_predicts_the_h200_routing_runs_within_three_points() -> None:
    rows, fitted, stdout = report("routing_real_gpu_bf16_0.6.json")
    # As recorded: three seeds of the router and the 35B-A3B alone, two of round-robin, one of the
    # 27B alone (the fourth run, 0.6 req/s).
    assert {k: v[:2] for k, v in rows.items()} == {
        "router": (103, 99.0),
        "qwen3.6-35b-a3b alone": (103, 81.6),
        "qwen3.8-27b alone": (35, 57.1),
        "round-robin": (65, 89.2),
    }
    for strategy, (_, measured, predicted) in rows.items():
        assert abs(measured - predicted) <= 3.0, (strategy, measured, predicted)
    assert stdout.count("per seed, measured / predicted:") == 3
    # Where each request goes to the same model on both sides: the decode ratios. Beside a busy
    # box-mate as alone: the mate wait (`BoxSpec.gpu_mate_wait_s`) fitted.
    assert stdout.count("decode measured / predicted") == 3
    assert "qwen3.6-35b-a3b: alone x1.12 (n=103)" in stdout
    assert "qwen3.6-35b-a3b: alone x1.13 (n=1), beside a mate x1.00 (n=32)" in stdout
    assert "qwen3.8-27b: alone x1.01 (n=8), beside a mate x1.08 (n=24)" in stdout
    # Fitted to the run's probe too, where a model has a box-mate: its host's time hides in its
    # waits for the mate (round-robin was 83.1%, 6.2 points low, with the two added). The 27B
    # alone stays 5.7 low there (one seed, two chats): the probe's 27B fit overshoots this host.
    for strategy in ("router", "qwen3.6-35b-a3b alone", "round-robin"):
        assert abs(rows[strategy][1] - fitted[strategy]) <= 3.0, (strategy, rows[strategy], fitted[strategy])


def test_the_probe_fits_the_box_model_to_the_machine_it_measured() -> None:
    """`calibration` gives the host time per step and per sequence that makes the box model
    decode as the probe did: a probe of a host 0.4 + 0.5 ms slower reads that, and the fitted box
    model then predicts it."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.gpu.routing_real import (
        MODELS,
        PROBE,
        PROBE_CONCURRENCY,
        WEIGHTS,
        beside,
        box_run,
        calibration,
        probe_load,
        profile,
        routing,
    )

    kind, classes = PROBE["gpu"], routing(150.0)
    profiles = {s.name: profile(s, WEIGHTS) for s in MODELS}
    slower = {MODELS[0].name: (0.0004, 0.0005), MODELS[1].name: (0.0, 0.0)}

    def probe_as(host: dict[str, tuple[float, float]]) -> dict[str, list[dict[str, object]]]:
        out = {
            name: [
                {"concurrency": c, "requests": box_run(name, probe_load(kind, c), profiles, WEIGHTS, classes, host)}
                for c in PROBE_CONCURRENCY
            ]
            for name in slower
        }
        assert all(r["tokens"] == kind.output_tokens for p in out.values() for q in p for r in q["requests"])
        return out

    fitted = calibration(probe_as(slower), profiles, WEIGHTS, classes, kind)
    for name, (step, seq) in slower.items():
        assert fitted[name] == (pytest.approx(step, abs=2e-5), pytest.approx(seq, abs=2e-5))
    for step, seq in calibration(probe_as({}), profiles, WEIGHTS, classes, kind).values():
        assert abs(step) < 2e-5 and abs(seq) < 2e-5

    # All models at once, the models in turn: what the fitted box model predicts reads 1.0.
    load = probe_load(kind, 2 * PROBE_CONCURRENCY[-1])
    together = box_run("round-robin", load, profiles, WEIGHTS, classes, slower)
    assert [r["model"] for r in together] == [MODELS[i % 2].name for i in range(len(load))]
    assert all(r["tokens"] == kind.output_tokens for r in together)
    assert beside(together, profiles, WEIGHTS, classes, kind, slower) == pytest.approx(
        dict.fromkeys(slower, 1.0), abs=0.002
    )


def test_the_fitted_rate_is_where_each_model_alone_falls_under_the_mark() -> None:
    """`run --rate fit`: on the fifth run's host (its probe's fit: 0.36 + 0.45 ms per step and
    sequence on the 35B-A3B, 0 + 0.36 ms on the 27B) every model alone falls under 78% from 0.55
    req/s on (six seeds), not before."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.gpu.routing_real import (
        FIT_BELOW,
        FIT_SEEDS,
        MODELS,
        WEIGHTS,
        box_summary,
        fitted_rate,
        profile,
        routing,
    )

    profiles = {s.name: profile(s, WEIGHTS) for s in MODELS}
    classes, slower = routing(150.0), {MODELS[0].name: (0.00036, 0.00045), MODELS[1].name: (0.0, 0.00036)}
    assert fitted_rate(profiles, WEIGHTS, classes, slower, 60.0, 150.0) == 0.55

    def alone(rate: float) -> float:
        name = f"{MODELS[0].name} alone"
        return float(box_summary(name, rate, FIT_SEEDS, 60.0, 150.0, profiles, WEIGHTS, classes, slower)["attainment"])

    assert alone(0.5) >= FIT_BELOW > alone(0.55)


def test_each_run_writes_its_prompts_in_its_own_words(tmp_path: Path) -> None:
    """The strategies run one after another on the same engines and arrivals: each run shifts the
    words its token ids become (`Words.text`), so none finds an earlier run's prompts cached, as
    the box model replaying it does not. Within a run, chats still share their system prompt."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.gpu.routing_real import Words, cached_share, messages
    from gateway.plan.fleet import DEFAULT_WORKLOAD, arrivals

    vocab = {
        "\u0120alpha": 0,
        "\u0120bravo": 1,
        "\u0120charlie": 2,
        "\u0120delta": 3,
        "\u0120ab": 4,
        "\u0120Echo": 5,
        "x": 6,
    }
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps({"model": {"vocab": vocab}}))
    words = Words(path)
    assert words.words == ["alpha", "bravo", "charlie", "delta"]  # single-token lowercase words of 3-8 letters
    assert words.text([0, 1, 2]) == " alpha bravo charlie"
    assert words.text([0, 1, 2], 1) == " bravo charlie delta" and words.text([0, 1, 2], 4) == words.text([0, 1, 2])

    chats = [a for a in arrivals(DEFAULT_WORKLOAD, 0.5, 60.0, 1) if a.kind.name == "chat"][:2]
    (s0, u0), (s1, u1) = (messages(a, words, 3) for a in chats)
    assert s0 == s1 and u0 != u1  # one system prompt within a run
    assert messages(chats[0], words, 2)[0] != s0  # not across runs

    assert cached_share([{"prompt_tokens": 1_000, "cached_tokens": 100}, {"prompt_tokens": 500}]) == 0.1
    assert cached_share([{"prompt_tokens": 1_000}]) is None  # not recorded


def test_the_budget_check_expects_a_first_run_to_take_the_box_model_s_wall() -> None:
    """`run --budget` on a fresh machine, before any run is measured: a run is expected to take a
    quarter over the fitted box model's wall for it, not the whole cut-off (which left the call
    that starts the engines no run after them). On every recorded run of the sixth to the eighth,
    that wall was within 0.85-1.15x the measured one (0.88-1.12x)."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.gpu.routing_real import PROBE, calibration, expected_s, predicted_wall, replay
    from gateway.settings import LatencyProfile

    ratios = []
    for name in (f"routing_real_gpu_bf16_0.65_run{n}.json" for n in (6, 7, 8)):
        doc = json.loads((RESULTS / name).read_text())
        profiles = {k: LatencyProfile(**v) for k, v in doc["profiles"].items()}
        cutoff = doc["window_s"] + doc["grace_s"]
        host = calibration(doc["probe"], profiles, doc["weights"], doc["routing"], PROBE["gpu"])
        for r in doc["runs"]:
            (recs,) = replay(doc, r["strategy"], [r], host)
            wall = predicted_wall(recs, cutoff)
            ratios.append(r["wall_s"] / wall)
            assert expected_s([], r["strategy"], cutoff, wall) >= r["wall_s"] + 15
    assert len(ratios) == 24 and min(ratios) >= 0.85 and max(ratios) <= 1.15, ratios

    assert expected_s([], "router", 210.0) == 225.0  # nothing to go by: the cut-off
    assert expected_s([], "router", 210.0, 80.0) == 115.0
    assert expected_s([], "router", 210.0, 200.0) == 225.0  # never past the cut-off
    assert expected_s([{"strategy": "router", "wall_s": 40.0}], "router", 210.0, 80.0) == 65.0  # measured first
    assert predicted_wall([{"end_s": 50.0}, {"end_s": 70.0}, {"error": "slo_unattainable"}], 210.0) == 70.0
    assert predicted_wall([{"end_s": 50.0}, {"model": "m"}], 210.0) == 210.0  # one never finished
