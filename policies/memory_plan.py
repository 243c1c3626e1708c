"""Whole-box memory plan: do the co-resident models fit, and how much KV cache does each get?

On a DGX Spark the OS, every model's weights, activations/graphs and every KV
pool draw on one 128 GiB of unified memory. Over-committing it does not fail
fast: pages migrate and latency swings. So the plan is checked before any
engine starts, and each engine is told its exact KV bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

GiB = 1024**3


def fmt_bytes(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelMemory:
    name: str
    weights: int  # bytes of weights resident in memory
    overhead: int = 0  # activations, CUDA graphs, runtime buffers
    kv_cache: int | None = None  # fixed KV bytes; None = a share of what is left
    kv_share: float = 1.0  # weight of this model in splitting what is left


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    kv_cache: dict[str, int]  # model -> KV bytes its engine gets
    unplanned: int  # bytes left over (0 when some model takes a share)
    lines: tuple[str, ...]  # the plan as readable lines, for logs and /sparkgate/stats


@dataclass(frozen=True, slots=True)
class PlanDoesNotFit:
    message: str


def plan_memory(
    *, total: int, reserved: int, models: Sequence[ModelMemory], min_kv: int = 1
) -> MemoryPlan | PlanDoesNotFit:
    """Fixed parts first (reserve, weights, overheads, fixed KV pools); the rest is
    split between the models without a fixed pool, in proportion to `kv_share`."""
    fixed = reserved + sum(m.weights + m.overhead + (m.kv_cache or 0) for m in models)
    lines = [f"box memory {fmt_bytes(total)}, reserved for OS and gateway {fmt_bytes(reserved)}"]
    for m in models:
        pool = "share of the rest" if m.kv_cache is None else fmt_bytes(m.kv_cache)
        lines.append(f"  {m.name}: weights {fmt_bytes(m.weights)} + overhead {fmt_bytes(m.overhead)} + KV {pool}")
    rest = total - fixed
    if rest < 0:
        return PlanDoesNotFit(
            "the models do not fit in the box's memory: "
            + "; ".join(lines)
            + f"; that is {fmt_bytes(fixed)} before any shared KV, {fmt_bytes(-rest)} more than the box has."
        )
    sharing = [m for m in models if m.kv_cache is None]
    kv = {m.name: m.kv_cache for m in models if m.kv_cache is not None}
    if sharing:
        weight = sum(m.kv_share for m in sharing)
        for m in sharing:
            kv[m.name] = int(rest * m.kv_share / weight)
        starved = [m.name for m in sharing if kv[m.name] < min_kv]
        if starved:
            return PlanDoesNotFit(
                f"no room left for the KV cache of {', '.join(starved)}: "
                + "; ".join(lines)
                + f"; {fmt_bytes(rest)} remain after the fixed parts, {fmt_bytes(min_kv)} needed per model."
            )
        rest = 0
    lines.append("  KV cache: " + ", ".join(f"{name} {fmt_bytes(b)}" for name, b in kv.items()))
    lines.append(f"  unplanned: {fmt_bytes(rest)}")
    return MemoryPlan(kv_cache=kv, unplanned=rest, lines=tuple(lines))
