"""The box model on an NVIDIA H200 from its public specs alone, against what the H200 measured.

Run from the repository root (virtual time, no sleeping, a few seconds):

    .venv/bin/python benchmarks/box_vs_h200.py [--box h200|config/boxes/h200.yaml] [--measured PATH]

The box is the built-in `h200` (engine_adapter/spark/hardware.py: datasheet specs, efficiencies
from public knowledge of Hopper's kernels, nothing fitted to these runs). The serving is each
run's: BF16 dummy weights (random routers: uniform expert routing), its KV dtype, no
speculative decoding. Each run's workload is replayed on `BoxSim`: `concurrency` distinct
prompts of `input_tokens` submitted together, 256 output tokens each, 8 slots, the run's step
size. Per request: time to first token (the median over the round), decode speed after the
first token (mean); per round: all output tokens / wall time.

Measured: the engine-direct rows of the GPU side-by-side runs (issue 19 item 3,
benchmarks/gpu/side_by_side_result/*.json: FP8 KV, 4,096-token steps) when present, else the
H200 baseline in benchmarks/data/h200-baseline.csv (BF16 KV, the default 2,048-token steps).
Prints each value's error and each metric's median absolute error; exit status 1 when a
metric's median is off by more than 15%.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.sim_vs_measured import round_times
from engine_adapter.spark import MODELS, BoxSim, BoxSpec, ModelSpec, Serving, SimConfig
from gateway.settings import load_box

HERE = Path(__file__).resolve().parent
SIDE_BY_SIDE = HERE / "gpu" / "side_by_side_result"
BASELINE = HERE / "data" / "h200-baseline.csv"
OUTPUT_TOKENS = 256
SLOTS = 8
UTILIZATION = 0.85
TOLERANCE = 0.15
METRICS = ("ttft_s", "decode_tok_s", "output_tok_s_total")
QWEN_VOCAB = 248_320  # the catalogue's lm_head (Qwen3.5/3.6 tokenizer)
# The GPU runs' serving: dummy BF16 weights (random routers spread tokens uniformly over the
# experts), no drafts (random weights would accept none), the CUDA build's asynchronous scheduler.
RUN_SERVING = Serving(
    weight_dtype="bf16", kv_dtype="fp8", spec_decode=False, routing_locality=1.0, async_scheduling=True
)


@dataclass(frozen=True)
class Run:
    model: str  # a key of engine_adapter.spark.MODELS
    input_tokens: int
    concurrency: int
    measured: dict[str, float]
    kv_dtype: str
    step_tokens: int
    slots: int = SLOTS
    prefill_cap: int = 0  # long_prefill_token_threshold
    kv_cache_bytes: int | None = None  # default: what the box's memory leaves at util 0.85
    vocab: int | None = None  # the runs' lm_head (a smaller tokenizer's vocabulary), if not the model's


@dataclass(frozen=True)
class Prediction:
    ttft_s: float
    decode_tok_s: float
    output_tok_s_total: float

    def get(self, metric: str) -> float:
        return float(getattr(self, metric))


def _model_key(shape: str) -> str:
    s = shape.lower()
    if "35b" in s:
        return "Qwen3.6-35B-A3B"
    if "27b" in s:
        return "Qwen3.8-27B"
    raise ValueError(f"unknown shape {shape!r}")


def read_side_by_side(folder: Path = SIDE_BY_SIDE) -> list[Run]:
    """The engine-direct rows of benchmarks/gpu/side_by_side.py's JSON, with each file's engine settings."""
    runs = []
    for path in sorted(folder.glob("*.json")):
        doc = json.loads(path.read_text())
        engine = doc.get("engine", {})
        for rec in doc.get("runs", []):
            if rec.get("path") != "direct":
                continue
            measured = {"ttft_s": rec["ttft_p50_ms"] / 1000, "output_tok_s_total": rec["output_tok_s"]}
            if rec.get("decode_tok_s_per_stream"):
                measured["decode_tok_s"] = rec["decode_tok_s_per_stream"]
            runs.append(
                Run(
                    _model_key(rec["shape"]),
                    int(rec["prompt_len"]),
                    int(rec["concurrency"]),
                    measured,
                    kv_dtype=engine.get("kv_cache_dtype", "fp8"),
                    step_tokens=int(engine.get("max_num_batched_tokens", 4096)),
                    slots=int(engine.get("max_num_seqs", SLOTS)),
                    prefill_cap=int(engine.get("long_prefill_token_threshold", 0)),
                    kv_cache_bytes=engine.get("kv_cache_memory_bytes"),
                    vocab=engine.get("vocab_size"),
                )
            )
    return runs


def read_baseline(path: Path = BASELINE) -> list[Run]:
    with path.open() as f:
        lines = [line for line in f if line.strip() and not line.startswith("#")]
    return [
        Run(
            rec["model"],
            int(rec["input_tokens"]),
            int(rec["concurrency"]),
            {m: float(rec[m]) for m in METRICS if rec[m].strip()},
            kv_dtype="bf16",
            step_tokens=2048,
        )
        for rec in csv.DictReader(lines)
    ]


def with_vocab(model: ModelSpec, vocab: int | None) -> ModelSpec:
    """The model with another vocabulary: its lm_head and (untied) embedding resized."""
    if vocab is None:
        return model
    hidden = model.lm_head_params / QWEN_VOCAB
    delta = (vocab - QWEN_VOCAB) * hidden
    return replace(
        model,
        lm_head_params=vocab * hidden,
        active_params=model.active_params + delta,
        total_params=model.total_params + 2 * delta,
    )


def simulate(box: BoxSpec, serving: Serving, run: Run, output_tokens: int = OUTPUT_TOKENS) -> Prediction:
    """One round: `concurrency` distinct prompts submitted at t=0, run to completion."""
    model = with_vocab(MODELS[run.model], run.vocab)
    weights = model.served(serving).weight_bytes
    config = SimConfig(
        max_num_seqs=run.slots,
        max_num_batched_tokens=run.step_tokens,
        long_prefill_token_threshold=run.prefill_cap,
        max_model_len=65536,
        kv_cache_bytes=run.kv_cache_bytes or int(box.memory_bytes * UTILIZATION - weights),
        serving=serving,
    )
    first, last = round_times(BoxSim(model, box, config), run.concurrency, run.input_tokens, output_tokens)
    ttft = statistics.median(first.values())
    decode = statistics.fmean((output_tokens - 1) / (last[r] - first[r]) for r in first)
    total = run.concurrency * output_tokens / max(last.values())
    return Prediction(ttft, decode, total)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--box", default="h200", help="a built-in box or a box file (its serving is ignored)")
    ap.add_argument("--measured", type=Path, help="a side-by-side result folder or a baseline CSV")
    ap.add_argument("--model", choices=sorted(MODELS), help="only this model's runs")
    a = ap.parse_args()
    box, _ = load_box(a.box)
    if a.measured is not None:
        runs = read_baseline(a.measured) if a.measured.suffix == ".csv" else read_side_by_side(a.measured)
        source = str(a.measured)
    else:
        runs = read_side_by_side()
        source = str(SIDE_BY_SIDE.relative_to(HERE.parent))
        if not runs:
            runs, source = read_baseline(), str(BASELINE.relative_to(HERE.parent))
    runs = [r for r in runs if a.model is None or r.model == a.model]
    print(f"box: {box.name} (specs: {box.mem_bandwidth / 1e12:g} TB/s, {box.bf16_flops / 1e12:g} TFLOP/s BF16)")
    print(f"measured: {source}, {len(runs)} runs")
    header = f"{'model':<17}{'kv':>5}{'input':>7}{'c':>3}  {'metric':<19}{'measured':>10}{'predicted':>11}{'error':>9}"
    print(header)
    print("-" * len(header))
    errors: dict[str, list[float]] = {m: [] for m in METRICS}
    prefill: list[str] = []
    for run in sorted(runs, key=lambda r: (r.model, r.input_tokens, r.concurrency)):
        pred = simulate(box, replace(RUN_SERVING, kv_dtype=run.kv_dtype), run)  # type: ignore[arg-type]
        if run.concurrency == 1 and "ttft_s" in run.measured:
            prefill.append(
                f"  {run.model:<17}{run.input_tokens:>7}  {run.input_tokens / run.measured['ttft_s']:>9.0f}"
                f"{run.input_tokens / pred.ttft_s:>11.0f}"
            )
        for metric in METRICS:
            if metric not in run.measured:
                continue
            measured, predicted = run.measured[metric], pred.get(metric)
            err = (predicted - measured) / measured
            errors[metric].append(err)
            print(
                f"{run.model:<17}{run.kv_dtype:>5}{run.input_tokens:>7}{run.concurrency:>3}  {metric:<19}"
                f"{measured:>10.3f}{predicted:>11.3f}{err:>+8.1%}"
            )
    print()
    print("prefill rate of one request, prompt tokens / TTFT (tok/s):")
    print(f"  {'model':<17}{'input':>7}  {'measured':>9}{'predicted':>11}")
    print("\n".join(prefill))
    print()
    failed = False
    for metric, errs in errors.items():
        if not errs:
            continue
        med = statistics.median(abs(e) for e in errs)
        signed = statistics.median(errs)
        failed |= med > TOLERANCE
        print(f"{metric:<19} median |error| {med:6.1%}  (median signed {signed:+.1%}, n={len(errs)})")
    print(f"goal: every metric's median |error| within {TOLERANCE:.0%}: {'missed' if failed else 'met'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
