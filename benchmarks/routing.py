"""SLO routing on the simulated DGX Spark boxes: the router vs each model alone vs round-robin.

A mixed workload (short chat, long-document questions, batch summaries; Poisson
arrivals) at rising load, in virtual time on the box model (engine_adapter/spark/,
checked against the measurements by benchmarks/sim_vs_measured.py). Strategies, side by side
on the same arrivals:

- router:       the gateway's routing (policies/load.py) over the placement of
                config/sim-dgx-spark.yaml (two boxes: 35B-A3B + 27B | Flash-Next), learning
                latency online from what it observes;
- round-robin:  the same placement, models in turn;
- <model> alone: every request to that model, alone on a whole box (all its KV budget).

SLO attainment counts every offered request: one turned away early counts as a miss.
Goodput: requests per second that met their objective.

    python benchmarks/routing.py                      # prints the table, writes the plot
    python benchmarks/routing.py --rates 0.1 0.3 --duration 300
    python benchmarks/routing.py --rates 0.26 --seeds 30 --only router "qwen3.6-35b-a3b alone"
    python benchmarks/routing.py --rates 0.26 --seeds 10 --vllm-blocks \
        --only router "qwen3.6-35b-a3b alone" --plot /tmp/r.svg

`--vllm-blocks`: each engine with the KV block vLLM gives it (a hybrid model's attention block
stretched to its linear-attention state: 2,096 / 1,568 tokens), rather than the box model's 16.
vLLM then splits prefills on those blocks and the prefix cache reuses only whole ones.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine_adapter.spark import MODELS  # noqa: E402
from gateway.plan.fleet import DEFAULT_WORKLOAD, Deployed, Placement, Summary, placement_from_settings, simulate  # noqa: E402
from gateway.plan.plot import line_chart  # noqa: E402
from gateway.settings import load_settings  # noqa: E402

WORKLOAD = DEFAULT_WORKLOAD  # chat 70%, long documents 10%, batch summaries 20% (gateway/plan/fleet.py)
TARGET_ATTAINMENT = 0.99
SINGLE_BELOW = 0.80


def solo(d: Deployed) -> Placement:
    """The model alone on a whole box: all of its KV budget."""
    whole = dataclasses.replace(d, box="solo", kv_gib=MODELS[d.model].kv_budget_gib)
    return Placement(f"{d.name} alone", (whole,))


def vllm_blocks(placement: Placement) -> Placement:
    """`placement` with each engine's block as vLLM sizes it (`ModelSpec.vllm_block_size`), its
    long-prefill cap raised to a block where it is below one (vLLM never prefills again
    otherwise: engine_adapter/spark/scheduler.py)."""
    out = []
    for d in placement.models:
        block = MODELS[d.model].served(placement.serving).vllm_block_size
        cap = max(d.long_prefill_token_threshold, block) if d.long_prefill_token_threshold else 0
        out.append(dataclasses.replace(d, block_size=block, long_prefill_token_threshold=cap))
    return dataclasses.replace(placement, models=tuple(out))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(ROOT / "config/sim-dgx-spark.yaml"))
    ap.add_argument("--rates", type=float, nargs="+", default=[0.05, 0.1, 0.2, 0.3, 0.35, 0.4, 0.5])
    ap.add_argument("--duration", type=float, default=600.0, help="simulated seconds of arrivals per load")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seeds", type=int, default=3, help="runs per load (seeds seed, seed+1, ...), pooled")
    ap.add_argument("--only", nargs="+", metavar="STRATEGY", help='run only these ("router", "<model> alone", ...)')
    ap.add_argument("--plot", default=str(ROOT / "docs/routing-benchmark.svg"))
    ap.add_argument("--vllm-blocks", action="store_true", help="the KV blocks vLLM gives hybrid models (see above)")
    args = ap.parse_args()

    settings = load_settings(args.config)
    assert settings.placement is not None, "the config needs a placement"
    placement = placement_from_settings(settings.placement, settings.models)
    if args.vllm_blocks:
        placement = vllm_blocks(placement)
    routing = settings.routing
    # The same router with `auto` taking the best model for every class (no class prefers fast).
    all_best = routing.model_copy(
        update={"classes": {n: c.model_copy(update={"prefer": "best"}) for n, c in routing.classes.items()}}
    )
    setups = [("router", placement, "router", routing)]
    if all_best != routing:
        setups.append(("router, best for every class", placement, "router", all_best))
    setups.append(("round-robin", placement, "round-robin", routing))
    setups += [(f"{d.name} alone", solo(d), d.name, routing) for d in placement.models]
    if args.only:
        unknown = set(args.only) - {label for label, *_ in setups}
        if unknown or "router" not in args.only or not any(o.endswith(" alone") for o in args.only):
            ap.error(f"--only needs the router and a model alone, from {[s[0] for s in setups]}")
        setups = [s for s in setups if s[0] in args.only]
    print(
        f"placement {placement.name}: "
        + "; ".join(
            f"{d.name} on {d.box} ({d.kv_gib:g} GiB KV, {d.block_size or placement.serving.block_size}-token blocks)"
            for d in placement.models
        )
    )
    print(
        "workload: "
        + "; ".join(
            f"{k.name} {k.share:.0%}: {k.prompt_tokens[0]}-{k.prompt_tokens[1]} in, {k.output_tokens} out, SLO {k.slo}"
            for k in WORKLOAD
        )
    )
    for name, cls in settings.routing.classes.items():
        fields = ", ".join(f"{f} {v:g}" for f, v in cls.model_dump(exclude={"prefer"}).items() if v is not None)
        print(f"  SLO {name}: {fields}, auto prefers {cls.prefer}")
    seeds = list(range(args.seed, args.seed + args.seeds))
    print(f"{args.duration:g} simulated s of arrivals per load and seed, seeds {seeds} pooled\n")

    header = f"{'req/s':>6} {'strategy':<28} {'offered':>7} {'rejected':>8} {'attained':>9} {'goodput':>8}"
    header += f" {'TTFT p50':>9} {'p95':>7}  per kind (met/offered)"
    print(header)
    results: dict[str, list[Summary]] = {label: [] for label, *_ in setups}
    t0 = time.monotonic()
    for rate in args.rates:
        for label, pl, strategy, rs in setups:
            r = Summary.pool([simulate(pl, rs, strategy, WORKLOAD, rate, args.duration, seed=s) for s in seeds])
            results[label].append(r)
            kinds = " ".join(f"{k} {m}/{o}" for k, (m, o) in r.by_kind.items())
            print(
                f"{rate:>6.2f} {label:<28} {r.offered:>7} {r.rejected:>8} {r.attainment:>8.1%} {r.goodput:>8.3f}"
                f" {r.ttft_p50:>8.2f}s {r.ttft_p95:>6.1f}s  {kinds}"
            )
        print()
    print(f"({time.monotonic() - t0:.0f} s of wall time)\n")

    singles = [label for label in results if label.endswith(" alone")]
    verdict = 0
    for i, rate in enumerate(args.rates):
        best_label = max(singles, key=lambda s: results[s][i].attainment)
        best = results[best_label][i].attainment
        router = results["router"][i].attainment
        line = f"at {rate:g} req/s: router {router:.1%} | best single ({best_label}) {best:.1%}"
        if "round-robin" in results:
            rr = results["round-robin"][i].attainment
            line += f" | round-robin {rr:.1%} | router/best {router / best:.2f}x, router/round-robin {router / rr:.2f}x"
        print(line)
    loads = [i for i, _ in enumerate(args.rates) if max(results[s][i].attainment for s in singles) < SINGLE_BELOW]
    if loads:
        i = loads[0]
        router = results["router"][i].attainment
        ok = router >= TARGET_ATTAINMENT
        verdict = 0 if ok else 1
        print(
            f"\ntarget: at {args.rates[i]:g} req/s, the first load where every model run alone attains < "
            f"{SINGLE_BELOW:.0%}, the router attains {router:.1%} "
            f"({'meets' if ok else 'MISSES'} the {TARGET_ATTAINMENT:.0%} target)"
        )
    else:
        print(f"\nno load here takes every single model below {SINGLE_BELOW:.0%}: raise --rates")

    svg = line_chart(
        {
            label: [(rate, r.attainment * 100) for rate, r in zip(args.rates, rs, strict=True)]
            for label, rs in results.items()
        },
        title="SLO attainment vs offered load (simulated DGX Spark)",
        x_label="offered load, requests/s",
        y_label="requests meeting their SLO, %",
        y_range=(0, 100),
        hlines={"99%": 99, "80%": 80},
    )
    Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
    Path(args.plot).write_text(svg)
    print(f"plot: {args.plot}")
    return verdict


if __name__ == "__main__":
    sys.exit(main())
