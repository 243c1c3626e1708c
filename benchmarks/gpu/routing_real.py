"""Routing on real engines (issue 21): one sparkgate serving the Qwen3.6-35B-A3B shape and the 27B
shape co-resident on one H200 (CUDA vLLM 0.26, dummy weights), the team's mix, the router against
each model alone and round-robin; and the box model's prediction of the same runs.

The engines: bf16 weights (`--weights`; both shapes take ~115 GiB, leaving 6 GiB of KV each,
170K tokens of the 27B's) or FP8 weights by vLLM's online quantization with 16 GiB each (the
first H200 run: 2-4x slower than the box model says for FP8, no tuned fused-MoE kernels for
E=256 there), FP8 KV, the DGX Spark deployment's scheduler (4
slots, 4,096-token steps, the long-prefill cap of one hybrid block, prefix caching, CUDA graphs,
no asynchronous scheduling), no speculative decoding (random weights accept no drafts). The
config's `placement` puts both on one box, so the router counts them as box-mates. Their latency
profiles (what the router starts from) are the box model's for the H200 from its datasheet
(`profile()`), not measured: the router learns the rest online.

The load: `benchmarks/routing.py`'s mix and SLO classes (`gateway/plan/fleet.py`: chat 70%,
long-document questions 10%, summaries 20%), Poisson arrivals at `--rate` for `--window` s,
generated exactly as the box model's (`fleet.arrivals`, same seeds), each prompt written out as
text of that many tokens, sent open-loop with the `openai` SDK (streaming chat completions,
`ignore_eos`, the kind's output length, its SLO class in `X-Sparkgate-SLO`). Strategies, each on
the same arrivals, one after another on the one gateway:

- router: `model: "auto"`, a fresh router (its latency factors back at the profile) per run;
- round-robin: the models in turn, by name, routing off (no SLO check, no hold);
- <model> alone: every request to that model by name, routing off; the other engine idles.

A request meets its objective when its whole answer arrived within `--window` + `--grace` s of
the start and its TTFT and TPOT (or its total, for deadlines) meet its class; the batch class's
deadline is cut to the grace (`routing`), so that the cut-off can judge it. An early 429
(`slo_unattainable`) and a request unfinished at the cut-off count as misses. The prediction
(`--predict`) replays the same arrivals on the box model (`engine_adapter/spark`, the built-in
`h200` box, the same serving and blocks) with the same cut-off, the router there being the
gateway's own code on a virtual clock.

    python3 benchmarks/gpu/routing_real.py run OUT --rate fit --seeds 1 2 3      # on the GPU machine
    python3 benchmarks/gpu/routing_real.py run OUT --shape cpu-tiny --rate 0.5 --window 20   # a dry run here
    .venv/bin/python benchmarks/gpu/routing_real.py plan --rates 0.5 0.6 0.7 0.9   # the box model's sweep
    .venv/bin/python benchmarks/gpu/routing_real.py report benchmarks/gpu/routing_real_result/*.json

Before the runs, `run` probes each model alone (`PROBE`: 2,000-token chats, one and three at
once), after an unrecorded pass that warms the fresh engines: the lent H200s' hosts differ, and
with the synchronous scheduler a step waits for its host.
`report` prints the box model's prediction as it is and fitted to the probe (each model's host
time per step and per sequence beyond the box model's, from the probe's decode, `calibration`). `--rate fit` runs at the
load where every model alone meets under 78% in the fitted box model (`fitted_rate`): the issue's
load, found for the machine at hand. Later calls reusing the kept gateway reuse its probe.

`run` writes OUT/routing_real_SHAPE_WEIGHTS_RATE.json after every strategy (a run cut short keeps
what it measured): every request's kind, times, cached prompt tokens and outcome, and for router
runs the router's learned latency factors polled every 2 s. Each run writes its arrivals' token
ids as its own words (`prompt_shift`): the runs share engines and arrivals, and the box model
replaying one starts with empty prefix caches. `report` prints measured vs predicted attainment per
strategy and class, TTFT/TPOT percentiles, rejections, and what the router learned.

The engines' cold start (435 s one after the other, the first bf16 run; they now start side by
side) is most of one 10-minute device call: `--keep` leaves the gateway running detached for the
next call, which finds it (`/tmp/routing-real/gateway.json`) and goes straight to the runs;
`--budget` starts no run that could outlast the call. The call that starts it carries the Qwen3
tokenizer (`models/_tokenizer-qwen3`, from `make models`) beside the last staged wheels: the
prompts are written as words of its vocabulary.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import dataclasses
import itertools
import json
import os
import random
import secrets
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu.side_by_side import free_port, model_dir, stop, wait_health  # noqa: E402
from gateway.plan.fleet import DEFAULT_WORKLOAD, Arrival, Deployed, Fleet, Placement, RequestKind, arrivals  # noqa: E402
from gateway.router import slo_classes  # noqa: E402
from gateway.settings import LatencyProfile, RoutingSettings  # noqa: E402
from policies.routing import Slo  # noqa: E402

API_KEY = "sk-routing-real"
GiB = 1024**3
WINDOW_S = 60.0
# The batch class's deadline is cut to the grace (`routing`); below ~150 s the router holds
# summaries for less than it would and chats lose slots to them (box model, 0.7 req/s: 91.7% of
# objectives met with 90 s, 96.7% with 150 s or the configured 300 s; runs end by ~100 s either way).
GRACE_S = 150.0
# Each engine's KV pool by weight type: bf16 weights of both shapes (~115 GiB) leave ~20 GiB of
# the H200, FP8 weights (~58 GiB) far more. 6 GiB still hold 170K tokens of the 27B's.
KV_GIB = {"bf16": 6, "fp8": 16}
WEIGHTS = "bf16"
SLOTS = 4  # config/dgx-spark.yaml
STEP_TOKENS = 4096
# The SLO classes of config/sim-dgx-spark.yaml and config/dgx-spark.yaml (see `routing`).
ROUTING: dict[str, Any] = {
    "enabled": True,
    "classes": {
        "interactive": {"ttft_s": 2.0, "tpot_s": 0.06, "reserve_slots": 2, "prefer": "fast"},
        "document": {"ttft_s": 60.0, "tpot_s": 0.06, "prefer": "fast"},
        "batch": {"deadline_s": 300.0, "prefer": "fast"},
    },
    "default_class": "interactive",
}


def routing(grace: float) -> dict[str, Any]:
    """The SLO classes a run uses: the configs', with the batch deadline no later than `grace`,
    so that the cut-off (window + grace) judges every request by its own objective. A 300 s
    deadline past a 150 s cut-off counted summaries held well within it as misses (the first
    bf16 run on the H200: 11 of 15)."""
    out = copy.deepcopy(ROUTING)
    batch = out["classes"]["batch"]
    batch["deadline_s"] = min(batch["deadline_s"], grace)
    return out


@dataclasses.dataclass(frozen=True)
class Served:
    name: str  # the served name (config/dgx-spark.yaml's)
    shape: str  # side_by_side's shape key (its config and tokenizer)
    model: str  # the box model's key
    quality: float
    block: int  # the engine's KV block with FP8 KV: its long-prefill cap and prefix-cache unit


MODELS = (
    Served("qwen3.6-35b-a3b", "35b-a3b", "Qwen3.6-35B-A3B", 25, 2096),
    Served("qwen3.8-27b", "27b", "Qwen3.8-27B", 34, 1568),
)
# A dry run of the whole harness on the CPU build: two tiny engines and a mix a hundredth the size.
CPU_MODELS = (
    Served("qwen3.6-35b-a3b", "tiny-qwen3-moe", "Qwen3.6-35B-A3B", 25, 16),
    Served("qwen3.8-27b", "tiny-qwen3", "Qwen3.8-27B", 34, 16),
)
CPU_WORKLOAD = tuple(
    dataclasses.replace(
        k,
        prompt_tokens=(k.prompt_tokens[0] // 50, k.prompt_tokens[1] // 50),
        output_tokens=k.output_tokens // 20,
        shared_prefix=k.shared_prefix // 50,
    )
    for k in DEFAULT_WORKLOAD
)


WORKLOADS = {"gpu": DEFAULT_WORKLOAD, "cpu-tiny": CPU_WORKLOAD}
# The calibration probe: chats of one size, alone and three at once, to each model in turn before
# the runs. Its decode beyond the box model's is the machine's host time, per step and per
# sequence (`calibration`): the lent H200s' hosts differ (the 35B-A3B decoded 1.07-1.11x the
# model's time alone on two machines, 1.2-1.3x on others), and a synchronous scheduler's step
# waits for its host.
PROBE = {
    "gpu": RequestKind("probe", 1.0, (2_000, 2_000), 300, "interactive"),
    "cpu-tiny": RequestKind("probe", 1.0, (40, 40), 15, "interactive"),
}
PROBE_CONCURRENCY = (1, 3)


def serving(weights: str) -> Any:
    from engine_adapter.spark import Serving

    # dummy weights: random routers spread every token over all the experts; the Spark
    # deployment's synchronous scheduler (gateway_settings), whose host time the box charges
    dtype: Literal["bf16", "fp8"] = "fp8" if weights == "fp8" else "bf16"  # (`--weights`' choices)
    return Serving(weight_dtype=dtype, kv_dtype="fp8", spec_decode=False, routing_locality=1.0, async_scheduling=False)


# --------------------------------------------------------------------------- the box model


def profile(s: Served, weights: str) -> LatencyProfile:
    """The router's starting profile for `s` on the H200, from the box model alone: TTFT of one
    request at 16, 2K and 32K tokens fixes overhead, rate and the quadratic term; decode at 1
    and 4 sequences and at 32K of context fixes the TPOT terms."""
    from benchmarks.sim_vs_measured import round_times
    from engine_adapter.spark import H200, BoxSim, SimConfig
    from engine_adapter.spark import MODELS as SPECS

    def one(concurrency: int, tokens: int) -> tuple[float, float]:
        config = SimConfig(
            max_num_seqs=SLOTS,
            max_num_batched_tokens=STEP_TOKENS,
            long_prefill_token_threshold=s.block,
            kv_cache_bytes=KV_GIB[weights] * GiB,
            serving=dataclasses.replace(serving(weights), block_size=s.block),
        )
        first, last = round_times(BoxSim(SPECS[s.model], H200, config), concurrency, tokens, 64)
        return statistics.fmean(first.values()), statistics.fmean((last[r] - first[r]) / 63 for r in first)

    (t0, tpot1), (t2, _), (t32, tpot32) = one(1, 16), one(1, 2000), one(1, 32000)
    _, tpot4 = one(4, 16)
    # t(n) = t0 + n / rate + q * (n / 1000)^2 through the three points
    a = [[2000.0, 4.0], [32000.0, 1024.0]]
    b = [t2 - t0, t32 - t0]
    det = a[0][0] * a[1][1] - a[0][1] * a[1][0]
    inv_rate = (b[0] * a[1][1] - a[0][1] * b[1]) / det
    q = (a[0][0] * b[1] - b[0] * a[1][0]) / det
    return LatencyProfile(
        prefill_tokens_per_s=round(1 / inv_rate),
        ttft_overhead_s=round(t0, 4),
        prefill_s_per_ktoken2=round(max(0.0, q), 7),
        tpot_s=round(tpot1, 5),
        tpot_per_sequence_s=round(max(0.0, (tpot4 - tpot1) / 3), 6),
        tpot_per_ktoken_s=round(max(0.0, (tpot32 - tpot1) / 32), 7),
    )


# Per model, this machine's host time beyond the box model's: (per step, per sequence) seconds.
Host = dict[str, tuple[float, float]]


def placement(profiles: dict[str, LatencyProfile], weights: str, host: Host | None = None) -> Placement:
    from engine_adapter.spark import H200

    return Placement(
        "one-h200",
        tuple(
            Deployed(
                s.name,
                s.model,
                "h200",
                KV_GIB[weights],
                s.quality,
                profiles[s.name],
                max_num_batched_tokens=STEP_TOKENS,
                long_prefill_token_threshold=s.block,
                block_size=s.block,
                host_step_s=(host or {}).get(s.name, (0.0, 0.0))[0],
                host_seq_s=(host or {}).get(s.name, (0.0, 0.0))[1],
            )
            for s in MODELS
        ),
        box=H200,
        serving=serving(weights),
    )


def strategies() -> list[str]:
    return ["router", *(f"{s.name} alone" for s in MODELS), "round-robin"]


def predict(
    strategy: str,
    rate: float,
    window: float,
    grace: float,
    seed: int,
    profiles: dict[str, LatencyProfile],
    weights: str,
    classes: dict[str, Any],
    workload: Sequence[RequestKind] = DEFAULT_WORKLOAD,
    host: Host | None = None,
) -> list[dict[str, Any]]:
    """The box model's run of `strategy` on the arrivals `run` sends: each request's outcome."""
    load = arrivals(workload, rate, window, seed)
    return box_run(strategy, load, profiles, weights, classes, host)


def box_summary(
    strategy: str,
    rate: float,
    seeds: Sequence[int],
    window: float,
    grace: float,
    profiles: dict[str, LatencyProfile],
    weights: str,
    classes: dict[str, Any],
    host: Host | None = None,
) -> dict[str, Any]:
    """The box model's `summary` of `strategy` at `rate`, its runs on `seeds` pooled."""
    recs = [
        q for seed in seeds for q in predict(strategy, rate, window, grace, seed, profiles, weights, classes, host=host)
    ]
    return summary(recs, window + grace, classes)


def box_run(
    strategy: str,
    load: Sequence[Arrival],
    profiles: dict[str, LatencyProfile],
    weights: str,
    classes: dict[str, Any],
    host: Host | None = None,
) -> list[dict[str, Any]]:
    """The box model's run of `strategy` on `load`: each request's outcome, recorded as `one`
    records a real one."""
    fleet = Fleet(placement(profiles, weights, host), RoutingSettings(**classes), strategy.removesuffix(" alone"))
    fleet.run(load)
    out = []
    for a in load:
        o = fleet.outcomes[a.id]
        rec: dict[str, Any] = {"kind": a.kind.name, "t": a.t, "model": o.model, "output": a.kind.output_tokens}
        if o.model is None:
            rec["error"] = "slo_unattainable"
        elif o.first is not None and o.last is not None:
            rec |= {"ttft_s": o.first - a.t, "end_s": o.last, "tokens": o.tokens}
            rec |= {"tpot_s": (o.last - o.first) / max(1, o.tokens - 1), "prompt_tokens": len(a.prompt)}
            rec["cached_tokens"] = o.cached
        out.append(rec)
    return out


def probe_load(kind: RequestKind, concurrency: int, warm: bool = False) -> list[Arrival]:
    """The probe's requests at one concurrency: all at once, prompts of their own (`warm`: the
    unrecorded first pass's, so that the recorded one finds none of its prompts cached)."""
    rng = random.Random(f"probe/{'warm/' * warm}{concurrency}")
    return [
        Arrival(
            f"probe-{concurrency}-{i}",
            0.0,
            kind,
            tuple(rng.randrange(1000, 150_000) for _ in range(kind.prompt_tokens[0])),
        )
        for i in range(concurrency)
    ]


def calibration(
    probe: dict[str, list[dict[str, Any]]],
    profiles: dict[str, LatencyProfile],
    weights: str,
    classes: dict[str, Any],
    kind: RequestKind,
) -> Host:
    """Per model, the host time per step and per sequence that fits the box model to this
    machine: the line through the probe's median measured - predicted TPOT at each concurrency
    (a step of c sequences takes `step + c * seq` more). A time, not a scale: what a slower host
    adds is its own work, which a long prefill step does not multiply (the fifth run's 35B-A3B
    decoded 0.8 ms over the model alone and 1.7 ms at three at once, while its prefills ran at
    the model's speed)."""
    out: Host = {}
    for name, probes in probe.items():
        points = []
        for p in probes:
            predicted = box_run(name, probe_load(kind, p["concurrency"]), profiles, weights, classes)
            diffs = [
                m["tpot_s"] - b["tpot_s"]
                for m, b in zip(p["requests"], predicted, strict=True)
                if m.get("tpot_s") and b.get("tpot_s")
            ]
            if diffs:
                points.append((p["concurrency"], statistics.median(diffs)))
        if len({c for c, _ in points}) < 2:
            out[name] = (statistics.median(d for _, d in points) if points else 0.0, 0.0)
            continue
        per_seq, per_step = statistics.linear_regression([c for c, _ in points], [d for _, d in points])
        out[name] = (round(per_step, 6), round(per_seq, 6))
    return out


def host_ms(host: Host) -> dict[str, str]:
    """`host` for print: per model, "per step + per sequence" in ms."""
    return {name: f"{step * 1e3:.2f} + {seq * 1e3:.2f} ms" for name, (step, seq) in host.items()}


def beside(
    together: list[dict[str, Any]],
    profiles: dict[str, LatencyProfile],
    weights: str,
    classes: dict[str, Any],
    kind: RequestKind,
    host: Host,
) -> dict[str, float]:
    """Per model, the median measured / predicted TPOT of the probe's requests sent to all
    models at once, the box model fitted to the machine (`host`): how far its box-mate
    wait is off there (1.0: right)."""
    predicted = box_run("round-robin", probe_load(kind, len(together)), profiles, weights, classes, host)
    ratios: dict[str, list[float]] = {}
    for m, b in zip(together, predicted, strict=True):
        if m.get("tpot_s") and b.get("tpot_s") and b["model"] == m["model"]:
            ratios.setdefault(m["model"], []).append(m["tpot_s"] / b["tpot_s"])
    return {k: round(statistics.median(v), 3) for k, v in sorted(ratios.items())}


# --------------------------------------------------------------------------- judging (both sides)


def complete(rec: dict[str, Any], cutoff: float) -> bool:
    """Whether a request's whole answer was in by `cutoff` (s from the start). A stream cut off
    after its first token has a TTFT but neither its tokens nor an end."""
    return bool(rec.get("tokens", 0) >= rec["output"] and rec["end_s"] <= cutoff)


def met(rec: dict[str, Any], cutoff: float, slos: dict[str, Slo]) -> bool:
    """Whether a request met its class's objectives with its whole answer in by `cutoff`: what
    both the measured and the predicted runs are judged by."""
    from policies.latency import Prediction

    if not complete(rec, cutoff):
        return False
    slo = slos[KINDS[rec["kind"]].slo]
    return not slo.misses(Prediction(rec["ttft_s"], rec["tpot_s"]), rec["output"])


KINDS = {k.name: k for k in DEFAULT_WORKLOAD}


def summary(recs: Sequence[dict[str, Any]], cutoff: float, classes: dict[str, Any]) -> dict[str, Any]:
    """Attainment and latencies of `recs`, judged by `classes` (a run's `routing`)."""
    slos = slo_classes(RoutingSettings(**classes))  # the objectives, as the router reads them
    kinds: dict[str, list[int]] = {k: [0, 0] for k in KINDS}
    for r in recs:
        kinds[r["kind"]][1] += 1
        kinds[r["kind"]][0] += met(r, cutoff, slos)
    done = [r for r in recs if complete(r, cutoff)]

    def q(xs: list[float], p: float) -> float | None:
        xs = sorted(xs)
        return round(xs[min(len(xs) - 1, int(p * len(xs)))], 3) if xs else None

    ttft = [r["ttft_s"] for r in done]
    chat_tpot = [r["tpot_s"] for r in done if r["kind"] == "chat"]
    good = sum(m for m, _ in kinds.values())
    return {
        "offered": len(recs),
        "met": good,
        "attainment": good / len(recs) if recs else 1.0,
        "by_kind": {k: tuple(v) for k, v in kinds.items()},
        "rejected": sum(1 for r in recs if r.get("error") == "slo_unattainable"),
        "errors": sum(1 for r in recs if r.get("error") not in (None, "slo_unattainable", "unfinished")),
        "unfinished": sum(1 for r in recs if r.get("error") == "unfinished"),
        "ttft_p50": q(ttft, 0.5),
        "ttft_p95": q(ttft, 0.95),
        "ttft_p99": q(ttft, 0.99),
        "chat_tpot_p50": q(chat_tpot, 0.5),
        "chat_tpot_p95": q(chat_tpot, 0.95),
        "by_model": {
            m: sum(1 for r in recs if r.get("model") == m) for m in sorted({str(r.get("model")) for r in recs})
        },
    }


# --------------------------------------------------------------------------- the gateway (child process)


def gateway_settings(
    shape: str, weights: str, port: int, work: Path, profiles: dict[str, LatencyProfile], classes: dict[str, Any]
) -> dict[str, Any]:
    from gateway.settings import hash_key

    models = []
    for s in CPU_MODELS if shape == "cpu-tiny" else MODELS:
        m: dict[str, Any] = {
            "name": s.name,
            "quality": s.quality,
            "max_num_seqs": SLOTS,
            "max_num_batched_tokens": STEP_TOKENS,
            "enable_prefix_caching": True,
            "load_format": "dummy",
            "dtype": "bfloat16",
            "seed": 0,
            "latency": profiles[s.name].model_dump(),
        }
        if shape == "cpu-tiny":
            m |= {"path": str(ROOT / "models" / s.shape), "max_model_len": 4096, "enforce_eager": True}
            m |= {"kv_cache_bytes": 256 * 1024**2}
        else:
            m |= {"path": str(model_dir(s.shape)), "max_model_len": 65536, "enforce_eager": False}
            m |= {
                "kv_cache_bytes": KV_GIB[weights] * GiB,
                "kv_cache_dtype": "fp8",
                "long_prefill_token_threshold": s.block,
            }
            m["engine_args"] = {
                "language_model_only": True,
                "gdn_prefill_backend": "triton",  # no FlashInfer on the GPU machine
                "async_scheduling": False,  # config/dgx-spark.yaml
                # vLLM refuses to start unless this share of the GPU is free: the second engine
                # starts beside the first (the pool's size is kv_cache_bytes)
                "gpu_memory_utilization": 0.3,
            }
            if weights == "fp8":
                m["engine_args"]["quantization"] = "fp8"  # vLLM's online quantization
        models.append(m)
    # info: the gateway's line per request in OUT/gateway_*.log (its admission wait, cached tokens,
    # TTFT; its `x-request-id` is the record's `request_id`): what a miss waited for
    server = {"host": "127.0.0.1", "port": port, "log_level": "info", "cache_dir": str(work / "cache")}
    if shape != "cpu-tiny":
        # Each pool's size is fixed (kv_cache_bytes: vLLM skips its memory profile), so neither
        # engine sizes itself by what the other left free: side by side, the cold start is the
        # slower engine's (~150 s) rather than the sum (~290 s).
        server["engine_start"] = "parallel"
    return {
        "server": server,
        "auth": {
            "required": True,
            "keys": [{"name": "bench", "sha256": hash_key(API_KEY), "allow_substitution": False}],
        },
        "routing": classes,
        "models": models,
        "placement": {"name": "one-h200", "boxes": [{"name": "h200", "models": [s["name"] for s in models]}]},
    }


def serve(settings_path: str) -> None:
    """Child: `sparkgate serve` as the CLI runs it, plus POST /bench/router {"router": "fresh" |
    "off"}: a fresh router (its learned factors back at the profiles) or routing off."""
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    from gateway import cli
    from gateway.app import create_app
    from gateway.router import Router
    from gateway.settings import Settings

    settings = Settings(**json.loads(Path(settings_path).read_text()))

    async def bench_router(request: Request) -> JSONResponse:
        state = request.app.state.sparkgate
        mode = (await request.json())["router"]
        if mode == "off":
            state.router = None
        else:
            state.router = Router(settings.routing, list(state.registry), settings.boxes())
            state.router.down_retry_after = state.supervisor.retry_after
        return JSONResponse({"router": mode})

    def app_factory(s: Settings, drain: Any) -> Any:
        app = create_app(s, drain=drain)
        app.add_route("/bench/router", bench_router, methods=["POST"])
        return app

    cli._run(settings, app_factory, None, None, False)


# --------------------------------------------------------------------------- the client (driver)


class Words:
    """Prompt text of a given token count: each id becomes one of the tokenizer's single-token
    words (a space and 3-8 lowercase letters), which the Qwen tokenizer keeps one token each."""

    def __init__(self, tokenizer_json: Path) -> None:
        vocab = json.loads(tokenizer_json.read_text())["model"]["vocab"]
        self.words = sorted(
            w[1:]
            for w in vocab
            if w.startswith("\u0120")
            and 3 <= len(w) - 1 <= 8
            and w[1:].isascii()
            and w[1:].isalpha()
            and w[1:].islower()
        )

    def text(self, ids: Sequence[int], shift: int = 0) -> str:
        """The words of `ids`, each id's word `shift` places on (a run's own prompts)."""
        return "".join(" " + self.words[(i + shift) % len(self.words)] for i in ids)


def messages(a: Arrival, words: Words, shift: int = 0) -> list[dict[str, str]]:
    shared = a.kind.shared_prefix
    if shared:
        return [
            {"role": "system", "content": words.text(a.prompt[:shared], shift)},
            {"role": "user", "content": words.text(a.prompt[shared:], shift)},
        ]
    return [{"role": "user", "content": words.text(a.prompt, shift)}]


async def one(client: Any, model: str, a: Arrival, words: Words, t_start: float, shift: int = 0) -> dict[str, Any]:
    import openai

    rec: dict[str, Any] = {"id": a.id, "kind": a.kind.name, "t": a.t, "output": a.kind.output_tokens, "model": model}
    rec["request_id"] = f"run{shift}-{a.id}"  # the gateway's log line for it
    await asyncio.sleep(max(0.0, t_start + a.t - time.perf_counter()))
    sent = time.perf_counter()
    first = last = None
    tokens = 0
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model=model,
            messages=messages(a, words, shift),
            max_tokens=a.kind.output_tokens,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
            extra_headers={"X-Sparkgate-SLO": a.kind.slo, "X-Request-Id": rec["request_id"]},
        )
        rec["model"] = raw.headers.get("x-sparkgate-model", model)
        # Why routing sent it there (and how long it held it), and what it predicted.
        rec["route"] = raw.headers.get("x-sparkgate-route")
        rec["predicted_ttft_ms"] = raw.headers.get("x-sparkgate-predicted-ttft-ms")
        rec["predicted_tpot_ms"] = raw.headers.get("x-sparkgate-predicted-tpot-ms")
        async for chunk in raw.parse():
            now = time.perf_counter()
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or now
                last = now
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
                rec["prompt_tokens"] = chunk.usage.prompt_tokens
                details = chunk.usage.prompt_tokens_details
                rec["cached_tokens"] = details.cached_tokens if details is not None else None
    except asyncio.CancelledError:
        rec["error"] = "unfinished"
        if first is not None:
            rec["ttft_s"] = first - sent
        return rec
    except openai.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        rec["error"] = str(body.get("code") or e.status_code)
        rec["status"] = e.status_code
        rec["message"] = body.get("message")
        return rec
    except openai.APIError as e:
        rec["error"] = type(e).__name__
        return rec
    if first is None or last is None:
        rec["error"] = "no_output"
        return rec
    rec |= {
        "ttft_s": first - sent,
        "tpot_s": (last - first) / max(1, tokens - 1),
        "end_s": last - t_start,
        "tokens": tokens,
        "late_s": sent - (t_start + a.t),  # how late the client sent it (its own lag)
    }
    return rec


def _call(port: int, path: str, body: dict[str, Any] | None) -> Any:
    """The harness's own calls to the gateway (stdlib: the GPU image's HTTP libraries vary)."""
    import urllib.request

    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
        method="GET" if body is None else "POST",
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


async def get(port: int, path: str) -> Any:
    return await asyncio.to_thread(_call, port, path, None)


async def post(port: int, path: str, body: dict[str, Any]) -> Any:
    return await asyncio.to_thread(_call, port, path, body)


async def idle(port: int, timeout_s: float = 120.0) -> None:
    """Until no request is in flight on the gateway (aborted streams drain)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        stats = await get(port, "/sparkgate/stats")
        if all(e["inflight"] == 0 for e in stats["engines"].values()):
            return
        await asyncio.sleep(0.5)


async def probe(
    port: int, names: Sequence[str], kind: RequestKind, words: Words
) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
    """The calibration probe on the real engines, routing off: each model alone in turn, then
    all of them at once (`PROBE_CONCURRENCY[-1]` each, the models in turn as round-robin sends
    them): what a busy box-mate costs on this machine. Twice, the first pass unrecorded: fresh
    engines' first requests are slow (the fourth run's probe: a first token in 0.55 s and 1.55 s
    against 0.12-0.2 s later), and a probe of them read the 35B-A3B's decode at 1.35x the box
    model's where the runs read 1.10x."""
    import openai

    await idle(port)
    await post(port, "/bench/router", {"router": "off"})
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=API_KEY, max_retries=0, timeout=300)
    for warm in (True, False):
        out: dict[str, list[dict[str, Any]]] = {}
        for name in names:
            for concurrency in PROBE_CONCURRENCY:
                t0 = time.perf_counter()
                load = probe_load(kind, concurrency, warm)
                recs = await asyncio.gather(*(one(client, name, a, words, t0) for a in load))
                out.setdefault(name, []).append({"concurrency": concurrency, "requests": list(recs)})
        t0 = time.perf_counter()
        load = probe_load(kind, len(names) * PROBE_CONCURRENCY[-1], warm)
        together = await asyncio.gather(*(one(client, names[i % len(names)], a, words, t0) for i, a in enumerate(load)))
    await client.close()
    return out, list(together)


async def drive(
    port: int, strategy: str, load: list[Arrival], window: float, grace: float, words: Words, shift: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], float]:
    """One strategy on `load`: every request's record, the router's learned factors over time.
    `shift`: the run's own words for the arrivals' tokens (`Words.text`), so that it finds
    nothing of an earlier run's prompts in the engines' prefix caches, as the box model that
    replays it starts empty."""
    import openai

    await idle(port)
    await post(port, "/bench/router", {"router": "fresh" if strategy == "router" else "off"})
    names = [s.name for s in MODELS]
    turn = itertools.cycle(names)

    def model_for(a: Arrival) -> str:
        if strategy == "router":
            return "auto"
        if strategy == "round-robin":
            return next(turn)
        return strategy.removesuffix(" alone")

    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{port}/v1", api_key=API_KEY, max_retries=0, timeout=window + grace + 60
    )
    learned: list[dict[str, Any]] = []
    t_start = time.perf_counter() + 0.5
    tasks = [asyncio.create_task(one(client, model_for(a), a, words, t_start, shift)) for a in load]

    async def snapshot() -> None:
        """The router's learned factors now (absent while routing is off)."""
        stats = await get(port, "/sparkgate/stats")
        if stats["routing"] is not None:
            t = round(time.perf_counter() - t_start, 2)
            learned.append({"t": t, "models": {m: v["learned"] for m, v in stats["routing"]["models"].items()}})

    async def poll() -> None:
        while True:
            await snapshot()
            await asyncio.sleep(2.0)

    poller = asyncio.create_task(poll()) if strategy == "router" else None
    _, pending = await asyncio.wait(tasks, timeout=max(0.0, t_start + window + grace - time.perf_counter()))
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    if poller is not None:
        poller.cancel()
        await asyncio.gather(poller, return_exceptions=True)
        await snapshot()
    wall = time.perf_counter() - t_start
    await client.close()
    return [t.result() for t in tasks], learned, wall


def run(a: argparse.Namespace) -> int:
    started = time.monotonic()
    work = Path("/tmp/routing-real")
    work.mkdir(parents=True, exist_ok=True)
    a.out.mkdir(parents=True, exist_ok=True)
    served = CPU_MODELS if a.shape == "cpu-tiny" else MODELS
    profiles = {s.name: profile(MODELS[i], a.weights) for i, s in enumerate(served)}
    log = work / f"gateway_{a.shape}.log"
    probed = work / "probe.json"  # the probe of the gateway kept on this machine
    proc, port = kept_gateway(work, a)
    if proc is None:
        probed.unlink(missing_ok=True)
        port = a.port or free_port()
        sp = work / "settings.json"
        sp.write_text(json.dumps(gateway_settings(a.shape, a.weights, port, work, profiles, routing(a.grace))))
        proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(sp)],
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=a.keep,  # outlives this call when kept
        )
    try:
        up = wait_health(port, proc, log, a.start_timeout)
        if a.keep:  # now: a call cut off by its time limit leaves it for the next
            (work / "gateway.json").write_text(json.dumps({"pid": proc.pid, "port": port, "setting": setting(a)}))
        print(f"gateway up in {up:.0f} s", flush=True)
        words = Words(
            Path(model_dir(MODELS[0].shape) if a.shape != "cpu-tiny" else ROOT / "models" / served[0].shape)
            / "tokenizer.json"
        )
        classes = routing(a.grace)
        if not probed.exists():
            alone, together = asyncio.run(probe(port, [s.name for s in served], PROBE[a.shape], words))
            probed.write_text(json.dumps({"probe": alone, "probe_together": together}))
        found = json.loads(probed.read_text())
        host = calibration(found["probe"], profiles, a.weights, classes, PROBE[a.shape])
        print(
            f"probe: this machine's host time beyond the box model's, per step + per sequence {host_ms(host)}",
            flush=True,
        )
        mates = beside(found["probe_together"], profiles, a.weights, classes, PROBE[a.shape], host)
        print(f"probe, all models at once: decode against the box model's (fitted) {mates}", flush=True)
        if a.rate is None:
            a.rate = fitted_rate(profiles, a.weights, classes, host, a.window, a.grace)
            print(f"rate: {a.rate:g} req/s, each model alone under {FIT_BELOW:.0%} in the fitted box model", flush=True)
        dest = a.out / f"routing_real_{a.shape}_{a.weights}_{a.rate:g}.json"
        doc = document(a, dest, work, profiles) | found
        doc.setdefault("startup_s", []).append(round(up, 1))
        workload = WORKLOADS[a.shape]
        cutoff = a.window + a.grace
        done = {(r["strategy"], r["seed"]) for r in doc["runs"]}
        order = a.only or strategies()
        for seed in a.seeds:
            for strategy in order:
                if (strategy, seed) in done:
                    continue
                load = arrivals(workload, a.rate, a.window, seed)
                # The box model knows the real shapes only: a dry run's tiny engines wait to the cut-off.
                guess = (
                    None
                    if a.shape == "cpu-tiny"
                    else predicted_wall(box_run(strategy, load, profiles, a.weights, classes, host), cutoff)
                )
                if time.monotonic() - started + expected_s(doc["runs"], strategy, cutoff, guess) > a.budget:
                    print(f"a run would outlast the {a.budget:g} s budget: stopping before {strategy} seed {seed}")
                    return 0
                # Each run its own prompt words: the strategies run one after another on the same
                # engines and arrivals, and until the fifth run each found the documents and
                # summaries the one before had left in the prefix caches (a 50K-token document's
                # first token in 0.27 s against 3.3 s predicted).
                shift = secrets.randbelow(len(words.words) - 1) + 1
                recs, learned, wall = asyncio.run(drive(port, strategy, load, a.window, a.grace, words, shift))
                s = summary(recs, cutoff, doc["routing"])
                doc["runs"].append(
                    {
                        "strategy": strategy,
                        "seed": seed,
                        "wall_s": round(wall, 1),
                        "prompt_shift": shift,
                        "requests": recs,
                        "learned": learned,
                    }
                )
                dest.write_text(json.dumps(doc, indent=1))
                (work / dest.name).write_text(dest.read_text())
                print(
                    f"seed {seed} {strategy:<24} {s['met']:>3}/{s['offered']:<3} {s['attainment']:6.1%} rejected"
                    f" {s['rejected']} unfinished {s['unfinished']} errors {s['errors']} TTFT p50 {s['ttft_p50']}"
                    f" p95 {s['ttft_p95']}  {s['by_kind']}  ({wall:.0f} s)",
                    flush=True,
                )
    finally:
        if not a.keep or proc.poll() is not None:
            (work / "gateway.json").unlink(missing_ok=True)
            stop(proc)
        if log.exists():
            (a.out / log.name).write_bytes(log.read_bytes()[-2_000_000:])
    return 0


def document(a: argparse.Namespace, dest: Path, work: Path, profiles: dict[str, LatencyProfile]) -> dict[str, Any]:
    """The run's JSON: an earlier call's runs of the same setting (`--resume`, or the copy a call
    on this machine left: skipped here, kept in `dest`), and the setting."""
    doc: dict[str, Any] = {"runs": []}
    for earlier in (a.resume, work / dest.name):
        if earlier is not None and earlier.exists():
            found = json.loads(earlier.read_text())
            same = (found["window_s"], found["grace_s"]) == (a.window, a.grace)
            if same and len(found["runs"]) > len(doc["runs"]):
                doc = found
    return doc | {
        "shape": a.shape,
        "rate": a.rate,
        "window_s": a.window,
        "grace_s": a.grace,
        "weights": a.weights,
        "kv_gib": KV_GIB[a.weights],
        "slots": SLOTS,
        "routing": routing(a.grace),
        "profiles": {k: v.model_dump() for k, v in profiles.items()},
    }


# The rates `--rate fit` tries, lowest first; the seeds it judges them on (three seeds are not
# monotonic in the rate: 80.6% at 0.6 req/s, 79.8% at 0.55); the attainment it asks each model
# alone to stay under (the 80%, less a margin for the run's own seeds).
RATE_GRID = tuple(round(0.4 + 0.05 * i, 2) for i in range(13))
FIT_SEEDS = (1, 2, 3, 4, 5, 6)
FIT_BELOW = 0.78


def fitted_rate(
    profiles: dict[str, LatencyProfile],
    weights: str,
    classes: dict[str, Any],
    host: Host,
    window: float,
    grace: float,
) -> float:
    """The lowest rate of `RATE_GRID` at which every model alone meets fewer than `FIT_BELOW` of
    its objectives, in the box model fitted to this machine: the issue's load, found for the
    machine at hand (test_routing_real pins it for the fifth run's host)."""
    for rate in RATE_GRID:
        alone = [
            box_summary(f"{s.name} alone", rate, FIT_SEEDS, window, grace, profiles, weights, classes, host)
            for s in MODELS
        ]
        if max(x["attainment"] for x in alone) < FIT_BELOW:
            return rate
    return RATE_GRID[-1]


def expected_s(runs: Sequence[dict[str, Any]], strategy: str, cutoff: float, predicted_s: float | None = None) -> float:
    """How long a run of `strategy` may take: a quarter over its longest measured run, else over
    the fitted box model's wall for it (`predicted_wall`: the sixth to eighth runs' walls were
    0.88-1.12x it), else to the cut-off; plus the wait for the gateway to go idle. The cut-off
    alone (225 s) left the call that starts the engines no room for a ~70 s run after them."""
    walls = [float(r["wall_s"]) for r in runs if r["strategy"] == strategy]
    if walls:
        return min(cutoff, 1.25 * max(walls)) + 15
    return min(cutoff, 1.25 * predicted_s) + 15 if predicted_s is not None else cutoff + 15


def predicted_wall(recs: Sequence[dict[str, Any]], cutoff: float) -> float:
    """The box model's wall for a run (`box_run`'s records): its last answer's end, or the
    cut-off if a request never finished."""
    done = [r for r in recs if r.get("error") is None]
    if not done or any("end_s" not in r for r in done):
        return cutoff
    return max(float(r["end_s"]) for r in done)


def setting(a: argparse.Namespace) -> list[str]:
    return [a.shape, a.weights]


class _Kept:
    """A gateway a previous call left running (`--keep`): alive while its pid is."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        try:
            os.kill(self.pid, 0)
        except OSError:
            self.returncode = -1
        return self.returncode

    def send_signal(self, sig: int) -> None:
        with contextlib.suppress(OSError):
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        end = time.monotonic() + (timeout or 1e9)
        while self.poll() is None:
            if time.monotonic() > end:
                raise subprocess.TimeoutExpired("gateway", timeout or 0)
            time.sleep(0.2)
        return -1


def kept_gateway(work: Path, a: argparse.Namespace) -> tuple[Any, int]:
    """The gateway an earlier call kept for this setting, if it is still up (else None)."""
    state = work / "gateway.json"
    if not state.exists():
        return None, 0
    kept = json.loads(state.read_text())
    proc = _Kept(kept["pid"])
    if kept["setting"] != setting(a) or proc.poll() is not None:
        return None, 0
    print(f"reusing the gateway kept on port {kept['port']} (pid {proc.pid})", flush=True)
    return proc, int(kept["port"])


# --------------------------------------------------------------------------- box-model sweep and report


def plan(a: argparse.Namespace) -> int:
    profiles = {s.name: profile(s, a.weights) for s in MODELS}
    for name, p in profiles.items():
        print(f"profile {name}: {p.model_dump()}")
    host = None
    if a.host_ms:
        ms = [x / 1e3 for x in a.host_ms]
        host = {MODELS[0].name: (ms[0], ms[1]), MODELS[1].name: (ms[2], ms[3])}
        print(f"host time beyond the box model's (fitted to a machine): {host_ms(host)}")
    for rate in a.rates:
        for strategy in a.only or strategies():
            s = box_summary(strategy, rate, a.seeds, a.window, a.grace, profiles, a.weights, routing(a.grace), host)
            print(
                f"{rate:>5g} {strategy:<24} {s['met']:>4}/{s['offered']:<4} {s['attainment']:6.1%}"
                f" rejected {s['rejected']:>3}"
                f" TTFT p50 {s['ttft_p50']} p95 {s['ttft_p95']}  {s['by_kind']}",
                flush=True,
            )
        print()
    return 0


def report(a: argparse.Namespace) -> int:
    groups: dict[tuple[str, str, float, float, float], dict[str, Any]] = {}
    hosts: dict[int, Host] = {}  # id(run) -> the host fitted to the probe of the call that ran it
    for path in a.results:  # the runs of one setting, from however many calls (machines), as one
        doc = json.loads(Path(path).read_text())
        doc.setdefault("weights", "fp8")  # the first H200 run's, before bf16 was the default
        key = (doc["shape"], doc["weights"], doc["rate"], doc["window_s"], doc["grace_s"])
        if "probe" in doc:
            profiles = {k: LatencyProfile(**v) for k, v in doc["profiles"].items()}
            host = calibration(doc["probe"], profiles, doc["weights"], doc["routing"], PROBE[doc["shape"]])
            print(
                f"{path}: probe: this machine's host time beyond the box model's, per step + per sequence"
                f" {host_ms(host)}"
            )
            if "probe_together" in doc:
                mates = beside(
                    doc["probe_together"], profiles, doc["weights"], doc["routing"], PROBE[doc["shape"]], host
                )
                print(f"{path}: probe, all models at once: decode against the box model's (fitted) {mates}")
            hosts |= {id(r): host for r in doc["runs"]}
        if key in groups:
            groups[key]["runs"] += doc["runs"]
            groups[key]["path"] += f", {path}"
        else:
            groups[key] = doc | {"path": str(path)}
    for doc in groups.values():
        path, rate, window, grace = doc["path"], doc["rate"], doc["window_s"], doc["grace_s"]
        seeds = sorted({r["seed"] for r in doc["runs"]})
        print(
            f"{path}: {doc['weights']} weights, {rate} req/s, {window:g} s of arrivals + {grace:g} s grace,"
            f" seeds {seeds}"
        )
        header = (
            f"{'strategy':<24}{'offered':>8}{'measured':>10}{'predicted':>10}{'diff':>7}  per kind measured | predicted"
        )
        print(header)
        for strategy in strategies():
            runs = [r for r in doc["runs"] if r["strategy"] == strategy]
            if not runs:
                continue
            predicted = replay(doc, strategy, runs)
            measured = summary([q for r in runs for q in r["requests"]], window + grace, doc["routing"])
            pred = summary([q for p in predicted for q in p], window + grace, doc["routing"])
            diff = 100 * (measured["attainment"] - pred["attainment"])
            print(
                f"{strategy:<24}{measured['offered']:>8}{measured['attainment']:>10.1%}{pred['attainment']:>10.1%}"
                f"{diff:>+6.1f}p  {measured['by_kind']} | {pred['by_kind']}"
            )
            if len(runs) > 1:
                per_seed = [
                    (
                        r["seed"],
                        summary(r["requests"], window + grace, doc["routing"]),
                        summary(p, window + grace, doc["routing"]),
                    )
                    for r, p in zip(runs, predicted, strict=True)
                ]
                print(
                    "    per seed, measured / predicted: "
                    + ", ".join(f"{seed}: {m['attainment']:.1%} / {p['attainment']:.1%}" for seed, m, p in per_seed)
                )
            hits = cached_share([q for r in runs for q in r["requests"]])
            if hits is not None:
                print(
                    f"    prompt tokens found cached: measured {hits:.1%},"
                    f" predicted {cached_share([q for p in predicted for q in p]):.1%}"
                )
            if all(id(r) in hosts for r in runs):
                fitted = [p for r in runs for p in replay(doc, strategy, [r], hosts[id(r)])]
                cal = summary([q for p in fitted for q in p], window + grace, doc["routing"])
                print(
                    f"    fitted to the probe: predicted {cal['attainment']:.1%}"
                    f" ({100 * (measured['attainment'] - cal['attainment']):+.1f}p) {cal['by_kind']}"
                )
            if strategy != "router":  # the same model serves each request on both sides
                line = decode_ratios(
                    [list(zip(r["requests"], p, strict=True)) for r, p in zip(runs, predicted, strict=True)]
                )
                print(f"    decode measured / predicted (median TPOT ratio): {line}")
            for side, s in (("measured", measured), ("predicted", pred)):
                # Goodput as benchmarks/routing.py counts it: objectives met per second of arrivals.
                print(
                    f"    {side:<10} goodput {s['met'] / (window * len(runs)):.3f} req/s"
                    f" rejected {s['rejected']} unfinished {s['unfinished']} errors {s['errors']}"
                    f" TTFT p50/p95/p99 {s['ttft_p50']}/{s['ttft_p95']}/{s['ttft_p99']} s"
                    f" chat TPOT p50/p95 {s['chat_tpot_p50']}/{s['chat_tpot_p95']} s by model {s['by_model']}"
                )
        for r in doc["runs"]:
            if r["strategy"] == "router" and r["learned"]:
                print(f"router seed {r['seed']}: learned factors over the run")
                for line in learned_report(r["learned"]):
                    print("    " + line)
        print()
    return 0


def replay(
    doc: dict[str, Any], strategy: str, runs: Sequence[dict[str, Any]], host: Host | None = None
) -> list[list[dict[str, Any]]]:
    """The box model's prediction of each of `runs` (of `strategy`, in the run document `doc`)."""
    profiles = {k: LatencyProfile(**v) for k, v in doc["profiles"].items()}
    return [
        predict(
            strategy,
            doc["rate"],
            doc["window_s"],
            doc["grace_s"],
            r["seed"],
            profiles,
            doc["weights"],
            doc["routing"],
            WORKLOADS[doc["shape"]],
            host,
        )
        for r in runs
    ]


def cached_share(recs: Sequence[dict[str, Any]]) -> float | None:
    """The share of the prompt tokens their engines found cached (None: not recorded, as in the
    runs before the fifth)."""
    both = [r for r in recs if r.get("cached_tokens") is not None and r.get("prompt_tokens")]
    return sum(r["cached_tokens"] for r in both) / sum(r["prompt_tokens"] for r in both) if both else None


def decode_ratios(runs: Sequence[Sequence[tuple[dict[str, Any], dict[str, Any]]]]) -> str:
    """Per model, the median of measured / predicted TPOT over requests that both sides served
    on it (each run's (measured, predicted) pairs), apart by whether the measured decode
    overlapped a request on another model (a busy box-mate): what tells a slower host (both
    ratios up) from a mis-modelled box-mate wait (one of them)."""
    groups: dict[str, dict[str, list[float]]] = {}
    for pairs in runs:
        done = [(m, p) for m, p in pairs if m.get("tpot_s") and p.get("tpot_s") and m["model"] == p["model"]]
        for m, p in done:
            start, end = m["t"] + m["ttft_s"], m["end_s"]
            beside = any(o["model"] != m["model"] and o["t"] < end and o["end_s"] > start for o, _ in done)
            by = groups.setdefault(m["model"], {"alone": [], "beside a mate": []})
            by["beside a mate" if beside else "alone"].append(m["tpot_s"] / p["tpot_s"])
    return "; ".join(
        f"{model}: " + ", ".join(f"{k} x{statistics.median(v):.2f} (n={len(v)})" for k, v in by.items() if v)
        for model, by in sorted(groups.items())
    )


def learned_report(series: list[dict[str, Any]], tolerance: float = 0.1) -> list[str]:
    """Per model and factor: its value at the end, the observations behind it, and the model's
    observation count from which on the factor stayed within `tolerance` of that end value."""
    out = []
    for model, final in series[-1]["models"].items():

        def factor(point: dict[str, Any], key: tuple[str, ...], model: str = model) -> float | None:
            f = point["models"][model]
            for k in key:
                f = f.get(k) if isinstance(f, dict) else None
            return None if f is None else float(f["factor"])

        keys = [("overhead",), ("tpot",)] + [("prefill", b) for b in final["prefill"]]
        parts = [f"{model}: {final['observations']} observations"]
        for key in keys:
            end = factor(series[-1], key)
            assert end is not None
            settled = final["observations"]
            for point in reversed(series):
                f = factor(point, key)
                if f is None or abs(f - end) > tolerance * end:
                    break
                settled = point["models"][model]["observations"]
            n = final[key[0]]["n"] if len(key) == 1 else final["prefill"][key[1]]["n"]
            name = key[0] if len(key) == 1 else f"prefill >={int(key[1]) / 1000:g}K"
            parts.append(f"{name} x{end:.2f} (n={n}, within {tolerance:.0%} from observation {settled})")
        out.append("; ".join(parts))
    return out


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        serve(sys.argv[2])
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="the gateway and the strategies on real engines")
    r.add_argument("out", type=Path)
    r.add_argument("--shape", choices=["gpu", "cpu-tiny"], default="gpu")
    r.add_argument(
        "--rate",
        type=lambda v: None if v == "fit" else float(v),
        required=True,
        help='req/s, or "fit": where each model alone meets < FIT_BELOW in the box model fitted to the probe',
    )
    r.add_argument("--weights", choices=list(KV_GIB), default=WEIGHTS)
    r.add_argument("--port", type=int, help="serve on this port, and use a gateway already healthy there")
    r.add_argument("--keep", action="store_true", help="leave the gateway running (for the next call)")
    r.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    r.add_argument("--only", nargs="+", metavar="STRATEGY", choices=strategies())
    r.add_argument("--window", type=float, default=WINDOW_S)
    r.add_argument("--grace", type=float, default=GRACE_S)
    r.add_argument("--budget", type=float, default=1e9, help="start no run that could end after this many seconds")
    r.add_argument("--start-timeout", type=float, default=900.0)
    r.add_argument("--resume", type=Path, help="an earlier run's JSON: its runs are kept, not repeated")
    p = sub.add_parser("plan", help="the box model's attainment per strategy at these loads")
    p.add_argument("--rates", type=float, nargs="+", required=True)
    p.add_argument(
        "--host-ms",
        type=float,
        nargs=4,
        metavar=("A3B_STEP", "A3B_SEQ", "DENSE_STEP", "DENSE_SEQ"),
        help="each model's host time per step and per sequence beyond the box model's, in ms (a probe's `calibration`)",
    )
    p.add_argument("--weights", choices=list(KV_GIB), default=WEIGHTS)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--only", nargs="+", metavar="STRATEGY", choices=strategies())
    p.add_argument("--window", type=float, default=WINDOW_S)
    p.add_argument("--grace", type=float, default=GRACE_S)
    q = sub.add_parser("report", help="measured vs predicted, and what the router learned")
    q.add_argument("results", nargs="+")
    a = ap.parse_args()
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    return {"run": run, "plan": plan, "report": report}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
