"""`sparkgate plan`: how much of a workload each placement of the models on DGX Spark boxes
sustains within its SLOs, on the box model (gateway/plan/fleet.py), routed as the gateway routes.

A placement puts each model on a box, or leaves it out; a box holds its models' weights
and a share of KV within its usable memory (the three models cannot all share one box).
For each placement the planner raises the offered load until SLO attainment drops below
the target, and reports the highest load that met it, as requests/s and as users.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from engine_adapter.spark import MODELS, GiB
from gateway.plan.fleet import Deployed, Placement, RequestKind, Summary, simulate
from gateway.plan.plot import line_chart
from gateway.settings import ModelSettings, RoutingSettings

# What the planner assumes of a box: 128 GiB, of which vLLM may use this share.
BOX_BYTES = 128 * GiB
UTILIZATION = 0.8
MIN_KV_GIB = 8.0  # less KV than this per model is not worth a placement


@dataclass(frozen=True)
class PlanRow:
    placement: Placement
    sustained_rps: float  # the highest offered load whose attainment met the target (0: none)
    curve: tuple[Summary, ...]

    def users(self, requests_per_user_per_min: float) -> float:
        return self.sustained_rps * 60 / requests_per_user_per_min


def _weights_gib(m: ModelSettings) -> float:
    if m.weights_bytes is not None:
        return m.weights_bytes / GiB
    assert m.simulated is not None
    return MODELS[m.simulated.model].weight_bytes / GiB


def placements(models: Sequence[ModelSettings], boxes: int) -> list[Placement]:
    """Every way to put the models on `boxes` identical boxes (a model may be left out)
    that fits in memory, each box's spare memory split evenly as KV."""
    usable = BOX_BYTES * UTILIZATION / GiB
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
            spare = usable - sum(_weights_gib(m) for m in ms)
            kv = spare / len(ms)
            if kv < MIN_KV_GIB:
                fits = False
                break
            for m in ms:
                whole = Deployed.of(m, f"box-{i + 1}")
                deployed.append(dataclasses.replace(whole, kv_gib=min(kv, whole.kv_gib)))
        if fits:
            name = " | ".join(" + ".join(g) for g in groups)
            out.append(Placement(name, tuple(deployed)))
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


def html(rows: Sequence[PlanRow], kinds: Sequence[RequestKind], target: float, per_user: float) -> str:
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
        f"(routed by the gateway's router, on the DGX Spark box model). Users: at {per_user:g} request(s) per "
        "user per minute.</p>"
        f"<table><tr><th>placement</th><th>req/s</th><th>users</th></tr>{body}</table>{svg}"
    )
