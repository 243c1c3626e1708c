"""The box model against what one DGX Spark measured: every row of the measurements CSV.

Run from the repository root (virtual time, no sleeping, a few seconds):

    .venv/bin/python benchmarks/sim_vs_measured.py

Each row's workload is replayed on `BoxSim`: `concurrency` requests submitted together,
`input_tokens` of distinct prompt (no prefix-cache hits), 1024 output tokens (ignore_eos),
Flash-Next with its n-gram table read from the drive, as it was measured (`TABLE_ON_DISK`).
Per request: time to first token, decode speed after the first token; per round: all
output tokens / wall time. Exit status 1 when any prediction is off by more than 15%.
"""

from __future__ import annotations

import csv
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine_adapter.spark import DGX_SPARK, MODELS, BoxSim, SimConfig

DATA = Path(__file__).resolve().parent / "data" / "dgx-spark-measurements.csv"
# Models whose measured runs read their n-gram table from the box's NVMe drive each step: the
# Flash-Next runs were taken with VLLM_PLE_TABLE_MEMORY=disk (/work/shared/reference/dgx-spark.md).
TABLE_ON_DISK = frozenset({"Qwen3.8-Flash-Next"})
OUTPUT_TOKENS = 1024
TOLERANCE = 0.15
METRICS = ("ttft_s", "decode_tok_s", "output_tok_s_total")


@dataclass(frozen=True)
class Row:
    model: str
    input_tokens: int
    concurrency: int
    measured: dict[str, float]


@dataclass(frozen=True)
class Prediction:
    ttft_s: float
    decode_tok_s: float
    output_tok_s_total: float

    def get(self, metric: str) -> float:
        return float(getattr(self, metric))


def read_rows(path: Path = DATA) -> list[Row]:
    with path.open() as f:
        lines = [line for line in f if line.strip() and not line.startswith("#")]
    rows = []
    for rec in csv.DictReader(lines):
        measured = {m: float(rec[m]) for m in METRICS if rec[m].strip()}
        rows.append(Row(rec["model"], int(rec["input_tokens"]), int(rec["concurrency"]), measured))
    return rows


def round_times(
    sim: BoxSim, concurrency: int, input_tokens: int, output_tokens: int
) -> tuple[dict[str, float], dict[str, float]]:
    """`concurrency` distinct prompts submitted at t=0 and run to completion: each request's
    first-token and finish times on the box's clock."""
    for i in range(concurrency):
        prompt = [(i * 7_919 + j) % 200_000 + 10 for j in range(input_tokens)]
        prompt[0] = 1_000_000 + i  # distinct from the first block on: no prefix-cache hits
        sim.submit(f"r{i}", prompt, output_tokens, arrival_time=0.0)
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for res in sim.run_until_idle():
        for e in res.events:
            if e.first_token:
                first[e.request_id] = res.end
            if e.finished:
                last[e.request_id] = res.end
    return first, last


def simulate(model: str, input_tokens: int, concurrency: int, output_tokens: int = OUTPUT_TOKENS) -> Prediction:
    """One round: `concurrency` distinct prompts submitted at t=0, run to completion."""
    config = SimConfig(max_model_len=262144, ple_table_on_disk=model in TABLE_ON_DISK)
    sim = BoxSim(MODELS[model], DGX_SPARK, config)
    first, last = round_times(sim, concurrency, input_tokens, output_tokens)
    # The measurements were taken through vLLM's HTTP frontend: its latency delays every
    # request's first token (and so the round) but not the token stream after it.
    lag = DGX_SPARK.frontend_latency_s
    ttft = statistics.fmean(first.values()) + lag
    decode = statistics.fmean((output_tokens - 1) / (last[r] - first[r]) for r in first)
    total = concurrency * output_tokens / (max(last.values()) + lag)
    return Prediction(ttft, decode, total)


def main() -> int:
    rows = read_rows()
    failures = 0
    header = f"{'model':<20}{'input':>7}{'c':>3}  {'metric':<19}{'measured':>10}{'predicted':>11}{'error':>9}"
    print(header)
    print("-" * len(header))
    for row in rows:
        pred = simulate(row.model, row.input_tokens, row.concurrency)
        for metric, measured in row.measured.items():
            predicted = pred.get(metric)
            err = (predicted - measured) / measured
            flag = "" if abs(err) <= TOLERANCE else "  FAIL"
            failures += bool(flag)
            print(
                f"{row.model:<20}{row.input_tokens:>7}{row.concurrency:>3}  {metric:<19}"
                f"{measured:>10.2f}{predicted:>11.2f}{err:>+8.1%}{flag}"
            )
    print()
    print("decode speed per request, 2048-token prompts: alone vs at concurrency 4")
    for name in MODELS:
        alone = simulate(name, 2048, 1).decode_tok_s
        four = simulate(name, 2048, 4).decode_tok_s
        print(f"  {name:<20} {alone:7.1f} -> {four:7.1f} tok/s  (x{four / alone:.2f})")
    print()
    print(f"{failures} value(s) outside +-{TOLERANCE:.0%}" if failures else f"all values within +-{TOLERANCE:.0%}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
