"""`sparkgate plan --two-sparks`: where Qwen3.8-Flash-Next can live on two DGX Sparks.

Flash-Next's n-gram (PLE) table is 51.2B parameters (47.68 GiB FP8, 95.37 GiB BF16). Kept in
pinned host memory or on the device, which on a Spark are the same LPDDR5X, 75.2 GiB of non-PLE
NVFP4 weights (vllm#56757) + 47.68 GiB of table is more than the 121.6 GiB a Spark shows. vLLM
0.34 leaves it in the checkpoint files instead (`--engram-config '{"disk_offload": true}'`):
each step's rows are read on the host through the page cache, which costs a few tens of MiB of
buffers and a read per step (the box model's `ple_table_on_disk`). The placements compared:

(a) Flash-Next alone on spark-2, table on disk; the other two models share spark-1.
(b) Flash-Next with tensor parallelism over both boxes (vLLM's multi-node launch,
    `--nnodes 2 --node-rank N`, `--headless` on the second), the table in memory: each box holds
    half its weights, table and KV, beside one of the other two models; every step all-reduces
    twice per layer over the ConnectX-7 link (~20-25 GB/s).
(c) Two of the three models, one per box, Flash-Next left out.
(d), (e) Flash-Next with its table on disk beside one of the other two on spark-2, the third
    alone on spark-1, where the memory plan says it fits.

Each is planned with policies/memory_plan.py (everything an engine holds, the start-up
transients and the floor of free memory at the box's worst moment) and run on the box model
(gateway/plan/fleet.py) with the gateway's router.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from engine_adapter.spark import DGX_SPARK, MODELS, BoxSpec, GiB, Serving
from gateway.plan.fleet import Deployed, Link, Placement, TensorParallel
from gateway.plan.planner import PlanRow
from gateway.settings import ModelSettings, model_memory
from gateway.vllm_versions import FEATURES, show
from policies.memory_plan import KvBlocks, MemoryPlan, ModelMemory, PlanDoesNotFit, fmt_bytes, plan_memory

SPARK_MEMTOTAL = int(121.6 * GiB)  # what `free`/MemTotal shows on a DGX Spark
# OS and driver (CUDA sees at most 101.3-102.2 of 121.69 GiB free on a headless Spark just
# booted: MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks#47), the gateway, CUDA contexts: the
# shipped configs' box.reserved.
RESERVED = 24 * GiB
# Free at the box's worst moment, for the page cache (the table's rows on disk) and the host:
# the shipped configs' box.min_free, which the gateway's run-time guard also holds.
MIN_FREE = 4 * GiB
DISK = FEATURES["ple_disk"]
# Flash-Next's hidden size (vLLM 0.32's qwen4_exp GEMM plans, ../shared/reference/flash-next.md
# section 1): a token's activations are 2560 x 2 B in BF16 at each all-reduce.
FLASH_NEXT_HIDDEN = 2560
BOXES = ("spark-1", "spark-2")


@dataclass(frozen=True)
class Option:
    key: str  # a, b, c
    title: str
    placement: Placement
    memory: dict[str, MemoryPlan | PlanDoesNotFit]  # box -> its plan
    needs: tuple[str, ...] = ()  # what of vLLM it needs beyond the oldest supported

    @property
    def fits(self) -> bool:
        return all(isinstance(p, MemoryPlan) for p in self.memory.values())

    @property
    def served(self) -> int:
        return len(self.placement.models)


def _memory(m: ModelSettings, *, shards: int = 1) -> ModelMemory:
    mm = dataclasses.replace(model_memory(m), kv_cache=None, shards=shards)
    if shards > 1 and mm.kv_blocks is not None:  # each rank holds its heads' half of every block
        b = mm.kv_blocks
        mm = dataclasses.replace(
            mm,
            kv_blocks=KvBlocks(
                block_bytes=b.block_bytes // shards, block_tokens=b.block_tokens, state_blocks=b.state_blocks
            ),
        )
    return mm


def _plan(models: Sequence[ModelMemory], total: int, reserved: int) -> MemoryPlan | PlanDoesNotFit:
    return plan_memory(total=total, reserved=reserved, models=models, min_kv=1 * GiB, min_free=MIN_FREE)


def _kv_gib(plan: MemoryPlan | PlanDoesNotFit, name: str) -> float:
    return plan.kv_cache[name] / GiB if isinstance(plan, MemoryPlan) else 0.0


def options(
    models: Sequence[ModelSettings],
    *,
    box: BoxSpec = DGX_SPARK,
    serving: Serving | None = None,
    total: int = SPARK_MEMTOTAL,
    reserved: int = RESERVED,
    link: Link | None = None,
) -> list[Option]:
    """The placements of the module's docstring for the config's models: the one with an
    n-gram table is Flash-Next; the other two keep their configured order (first on spark-1)."""
    serving = serving or Serving()
    flash = next((m for m in models if m.ple_table is not None), None)
    if flash is None or len(models) != 3:
        raise ValueError("--two-sparks needs three models, one of them with a ple_table (Flash-Next)")
    one, two = (m for m in models if m is not flash)
    s1, s2 = BOXES
    disk = flash.with_ple_placement("disk")
    needs_disk = (f"vLLM >= {show(DISK.since)}: {DISK.what}",)

    def placed(name: str, parts: Sequence[Deployed]) -> Placement:
        return Placement(name, tuple(parts), box, serving)

    def plan(*ms: ModelMemory) -> MemoryPlan | PlanDoesNotFit:
        return _plan(ms, total, reserved)

    def per_box(
        key: str, title: str, name: str, boxes: dict[str, list[ModelSettings]], needs: tuple[str, ...] = ()
    ) -> Option:
        """Each model whole on one box, each box planned on its own."""
        mem = {b: plan(*(_memory(m) for m in ms)) for b, ms in boxes.items()}
        parts = [Deployed.of(m, b, _kv_gib(mem[b], m.name)) for b, ms in boxes.items() for m in ms]
        return Option(key, title, placed(name, parts), mem, needs)

    # (a) the table on disk, Flash-Next alone on spark-2.
    a = per_box(
        "a",
        f"{flash.name} alone on {s2}, n-gram table on disk; {one.name} + {two.name} on {s1}",
        f"{one.name} + {two.name} | {flash.name} (table on disk)",
        {s1: [one, two], s2: [disk]},
        needs_disk,
    )
    # (b) tensor parallelism over both boxes, the table sharded in memory.
    in_memory = flash.with_ple_placement("host") if flash.ple_on_disk else flash
    half = _memory(in_memory, shards=2)
    mem_b = {s1: plan(_memory(one), half), s2: plan(_memory(two), half)}
    layers = MODELS[flash.simulated.model].layers if flash.simulated is not None else 48
    tp = TensorParallel(ranks=2, allreduces=2 * layers, activation_bytes=FLASH_NEXT_HIDDEN * 2, link=link or Link())
    flash_kv = 2 * min(_kv_gib(mem_b[s1], flash.name), _kv_gib(mem_b[s2], flash.name))
    b = Option(
        "b",
        f"{flash.name} TP=2 over {s1}+{s2} (table sharded in memory), {one.name} on {s1}, {two.name} on {s2}",
        placed(
            f"{one.name} | {two.name} | {flash.name} TP=2",
            [
                Deployed.of(one, s1, _kv_gib(mem_b[s1], one.name)),
                Deployed.of(two, s2, _kv_gib(mem_b[s2], two.name)),
                dataclasses.replace(Deployed.of(in_memory, f"{s1}+{s2}", flash_kv), tp=tp),
            ],
        ),
        mem_b,
    )
    # (c) two of the three, one per box.
    c = per_box(
        "c",
        f"{one.name} on {s1}, {two.name} on {s2}, {flash.name} not served",
        f"{one.name} | {two.name}",
        {s1: [one], s2: [two]},
    )
    # (d), (e) Flash-Next (table on disk) beside one of the others on spark-2, the third alone.
    beside = [
        per_box(
            key,
            f"{flash.name} beside {mate.name} on {s2}, n-gram table on disk; {alone.name} alone on {s1}",
            f"{alone.name} | {flash.name} (table on disk) + {mate.name}",
            {s1: [alone], s2: [disk, mate]},
            needs_disk,
        )
        for key, mate, alone in (("d", two, one), ("e", one, two))
    ]
    return [a, b, c, *beside]


def _box_line(box: str, plan: MemoryPlan | PlanDoesNotFit, total: int) -> str:
    if isinstance(plan, PlanDoesNotFit):
        over = f"{fmt_bytes(plan.over)} over" if plan.over else "short of KV blocks"
        return f"    {box}: does not fit ({over}): {plan.message}"
    kv = ", ".join(f"{n} {fmt_bytes(b)}" for n, b in plan.kv_cache.items())
    parts = "".join(f"\n      {line.strip()}" for line in plan.lines if not line.strip().startswith("KV cache"))
    return f"    {box}: {fmt_bytes(plan.used)} of {fmt_bytes(total)} (KV: {kv}){parts}"


def recommended(options: Sequence[Option], rows: dict[str, PlanRow]) -> Option | None:
    """The placement that fits and sustains the most load; on a tie, the one serving more
    models, then the earlier."""
    ok = [o for o in options if o.fits and o.key in rows]
    return max(ok, key=lambda o: (rows[o.key].sustained_rps, o.served), default=None)


def report(
    options: Sequence[Option], rows: dict[str, PlanRow], *, target: float, per_user: float, total: int
) -> list[str]:
    lines = []
    for o in options:
        r = rows.get(o.key)
        lines.append(f"({o.key}) {o.title}")
        if o.needs:
            lines.append(f"    needs: {'; '.join(o.needs)}")
        lines += [_box_line(b, p, total) for b, p in o.memory.items()]
        if r is None:
            lines.append("    not simulated: it does not fit")
            continue
        curve = ", ".join(f"{s.rate:g}: {s.attainment:.0%}" for s in r.curve)
        lines.append(
            f"    sustained {r.sustained_rps:.2f} req/s at {target:.0%} SLO attainment "
            f"({r.users(per_user):.0f} users); "
            f"attainment by load (req/s): {curve}"
        )
    best = recommended(options, rows)
    lines.append(
        f"recommended (fits, most load, then most models): ({best.key}) {best.title}"
        if best is not None
        else "recommended: none of them fits"
    )
    most = max((o.served for o in options), default=0)
    if best is not None and best.served < most:
        lines.append(_why_fewer(best, [o for o in options if o.served == most], rows))
    return lines


def _why_fewer(best: Option, alls: Sequence[Option], rows: dict[str, PlanRow]) -> str:
    """Why the recommendation leaves a model out: each placement that serves them all sustains
    less load, or does not fit (by how much)."""
    base = rows[best.key].sustained_rps
    parts = []
    for o in alls:
        r = rows.get(o.key)
        if r is None:
            over = max((p.over for p in o.memory.values() if isinstance(p, PlanDoesNotFit)), default=0)
            parts.append(f"({o.key}) does not fit ({fmt_bytes(over)} over)")
        else:
            less = f", {1 - r.sustained_rps / base:.0%} less" if base else ""
            parts.append(f"({o.key}) sustains {r.sustained_rps:.2f} req/s{less}")
    return (
        f"why not all {alls[0].served} models: of the placements that serve them, "
        + "; ".join(parts)
        + f"; ({best.key}) sustains {base:.2f} req/s at the same SLO attainment"
    )
