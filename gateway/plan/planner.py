"""`sparkgate plan`: how much of a workload each placement of the models on identical boxes
(DGX Sparks by default; `--box h200` or a box file for any other) sustains within its SLOs,
on the box model (gateway/plan/fleet.py), routed as the gateway routes.

A placement puts each model on a box, or leaves it out; a box holds its models' weights
(at the serving's weight dtype) and a share of KV within its usable memory (the three models
cannot all share one DGX Spark).
For each placement the planner raises the offered load until SLO attainment drops below
the target, and reports the highest load that met it, as requests/s and as users.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from engine_adapter.spark import DGX_SPARK, MODELS, WEIGHT_BYTES, BoxSpec, GiB, Serving
from gateway.plan.fleet import Deployed, Placement, RequestKind, Summary, simulate
from gateway.plan.plot import line_chart
from gateway.settings import ModelSettings, RoutingSettings, model_memory

# The share of a box's memory vLLM may use.
UTILIZATION = 0.8
MIN_KV_GIB = 8.0  # less KV than this per model is not worth a placement


@dataclass(frozen=True)
class PlanRow:
    placement: Placement
    sustained_rps: float  # the highest offered load whose attainment met the target (0: none)
    curve: tuple[Summary, ...]

    def users(self, requests_per_user_per_min: float) -> float:
        return self.sustained_rps * 60 / requests_per_user_per_min


def _weights_gib(m: ModelSettings, serving: Serving) -> float:
    """A model's weights and overheads on the box: its configured `weights_bytes` (the NVFP4
    checkpoints') scaled to the serving's weight dtype, else the catalogue's weights; plus an
    n-gram table held in memory (its own dtype, whatever the serving's) and its lookup buffers."""
    assert m.simulated is not None
    scale = WEIGHT_BYTES[serving.weight_dtype] / WEIGHT_BYTES["nvfp4"]
    mem = model_memory(m)
    table = mem.ple_bytes + mem.ple_buffers
    if m.weights_bytes is not None:
        return (m.weights_bytes * scale + table) / GiB
    return (MODELS[m.simulated.model].served(serving).weight_bytes + table) / GiB


def placements(
    models: Sequence[ModelSettings], boxes: int, box: BoxSpec = DGX_SPARK, serving: Serving | None = None
) -> list[Placement]:
    """Every way to put the models on `boxes` identical boxes (a model may be left out)
    that fits in memory, each box's spare memory split evenly as KV (on a DGX Spark, at most
    the KV budget each model got there). A model whose n-gram table is on disk goes only on a
    box whose drive is known."""
    serving = serving or Serving()
    usable = box.memory_bytes * UTILIZATION / GiB
    if box.nvme_read_iops <= 0:  # a box without a drive spec cannot read an n-gram table from disk
        models = [m for m in models if not m.ple_on_disk]
    seen: set[tuple[tuple[str, ...], ...]] = set()
    out: list[Placement] = []
    for assign in itertools.product(range(-1, boxes), repeat=len(models)):
        groups = tuple(
            sorted(tuple(m.name for m, b in zip(models, assign, strict=True) if b == i) for i in range(boxes))
        )
        groups = tuple(g for g in groups if g)
        if not groups or groups in seen:
            continue
        seen.add(groups)
        deployed: list[Deployed] = []
        fits = True
        for i, names in enumerate(groups):
            ms = [m for m in models if m.name in names]
            spare = usable - sum(_weights_gib(m, serving) for m in ms)
            kv = spare / len(ms)
            if kv < MIN_KV_GIB:
                fits = False
                break
            for m in ms:
                whole = Deployed.of(m, f"box-{i + 1}")
                # The catalogue's KV budgets were read off the Spark's logs; another box has what is spare.
                cap = whole.kv_gib if box == DGX_SPARK else kv
                deployed.append(dataclasses.replace(whole, kv_gib=min(kv, cap)))
        if fits:
            name = " | ".join(" + ".join(g) for g in groups)
            out.append(Placement(name, tuple(deployed), box, serving))
    return out


def sustain(
    placement: Placement,
    routing: RoutingSettings,
    kinds: Sequence[RequestKind],
    *,
    target: float,
    rates: Sequence[float],
    duration_s: float,
    seeds: int = 1,
) -> PlanRow:
    """Attainment at rising load (`seeds` runs of each, pooled: one run's bursts decide too
    much) until it falls below `target` twice in a row."""
    curve: list[Summary] = []
    best = 0.0
    below = 0
    for rate in rates:
        s = Summary.pool(
            [simulate(placement, routing, "router", kinds, rate, duration_s, seed=n) for n in range(1, seeds + 1)]
        )
        curve.append(s)
        if s.attainment >= target:
            best, below = rate, 0
        else:
            below += 1
            if below == 2:
                break
    return PlanRow(placement, best, tuple(curve))


def table(rows: Sequence[PlanRow], target: float, per_user: float) -> list[str]:
    lines = [f"{'placement':<60} {'req/s at ' + format(target, '.0%'):>12} {'users':>7}"]
    for r in sorted(rows, key=lambda r: -r.sustained_rps):
        lines.append(f"{r.placement.name:<60} {r.sustained_rps:>12.2f} {r.users(per_user):>7.0f}")
    return lines


def html(
    rows: Sequence[PlanRow], kinds: Sequence[RequestKind], target: float, per_user: float, box: BoxSpec = DGX_SPARK
) -> str:
    """A page: the workload, the table, attainment against load for every placement."""
    svg = line_chart(
        {r.placement.name: [(s.rate, s.attainment * 100) for s in r.curve] for r in rows},
        title="SLO attainment vs offered load, per placement",
        x_label="offered load, requests/s",
        y_label="requests meeting their SLO, %",
        y_range=(0, 100),
        hlines={f"target {target:.0%}": target * 100},
    )
    mix = "".join(
        f"<li>{escape(k.name)}: {k.share:.0%}, {k.prompt_tokens[0]}-{k.prompt_tokens[1]} tokens in, "
        f"{k.output_tokens} out, SLO {escape(k.slo)}</li>"
        for k in kinds
    )
    body = "".join(
        f"<tr><td>{escape(r.placement.name)}</td><td>{r.sustained_rps:.2f}</td><td>{r.users(per_user):.0f}</td></tr>"
        for r in sorted(rows, key=lambda r: -r.sustained_rps)
    )
    return (
        "<!doctype html><meta charset=utf-8><title>sparkgate plan</title>"
        "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}td,th{padding:.2em 1em;text-align:left}"
        "</style><h1>Capacity plan</h1>"
        f"<p>Workload mix:</p><ul>{mix}</ul>"
        f"<p>Sustained: the highest offered load at which at least {target:.0%} of requests met their SLO "
        f"(routed by the gateway's router, on the box model of the {escape(box.name)}). Users: at {per_user:g} "
        "request(s) per user per minute.</p>"
        f"<table><tr><th>placement</th><th>req/s</th><th>users</th></tr>{body}</table>{svg}"
    )
