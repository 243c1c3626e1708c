"""`sparkgate plan --two-sparks`: where Qwen3.8-Flash-Next can live on two DGX Sparks.

Flash-Next's n-gram (PLE) table is 51.2B parameters (47.68 GiB FP8, 95.37 GiB BF16). Stock
vLLM 0.32 keeps it in pinned host memory or on the device, which on a Spark are the same
LPDDR5X: 75.2 GiB of non-PLE NVFP4 weights (vllm#56757) + 47.68 GiB of table is more than
the 121.6 GiB a Spark shows before any KV. The three honest placements:

(a) Flash-Next alone on spark-2 with the table on NVMe: only a vLLM build with disk-backed
    PLE (not stock 0.32) serves it so; the other two models share spark-1.
(b) Flash-Next with tensor parallelism over both boxes (vLLM's multi-node launch,
    `--nnodes 2 --node-rank N`, `--headless` on the second): each box holds half its weights,
    table and KV, beside one of the other two models; every step all-reduces twice per
    layer over the ConnectX-7 link (~20-25 GB/s).
(c) Two of the three models, one per box, Flash-Next left out.

Each is planned with policies/memory_plan.py (everything an engine holds) and run on the
box model (gateway/plan/fleet.py) with the gateway's router.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from engine_adapter.spark import DGX_SPARK, MODELS, BoxSpec, GiB, Serving
from gateway.plan.fleet import Deployed, Link, Placement, TensorParallel
from gateway.plan.planner import PlanRow
from gateway.settings import ModelSettings, model_memory
from policies.memory_plan import KvBlocks, MemoryPlan, ModelMemory, PlanDoesNotFit, PleTable, fmt_bytes, plan_memory

SPARK_MEMTOTAL = int(121.6 * GiB)  # what `free`/MemTotal shows on a DGX Spark
RESERVED = 24 * GiB  # OS, CUDA contexts, the gateway: a utilization of 0.8 of MemTotal
DISK_BUILD = (
    "a vLLM build with disk-backed PLE (not stock 0.32: the b12x fork's VLLM_PLE_TABLE_MEMORY=disk; "
    "upstream vllm#54070 / #54129 open)"
)
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
    requires: tuple[str, ...] = ()  # builds that are not stock vLLM

    @property
    def fits(self) -> bool:
        return all(isinstance(p, MemoryPlan) for p in self.memory.values())

    @property
    def stock(self) -> bool:
        return not self.requires


def _memory(m: ModelSettings, *, shards: int = 1, placement: str | None = None) -> ModelMemory:
    mm = dataclasses.replace(model_memory(m), kv_cache=None, shards=shards)
    if placement is not None and mm.ple is not None:
        build = DISK_BUILD if placement == "disk" else None
        ple = PleTable(rows=mm.ple.rows, dim=mm.ple.dim, dtype=mm.ple.dtype, placement=placement, requires_build=build)  # type: ignore[arg-type]
        mm = dataclasses.replace(mm, ple=ple)
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
    return plan_memory(total=total, reserved=reserved, models=models, min_kv=1 * GiB)


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
    """The three placements of the module's docstring for the config's models: the one with an
    n-gram table is Flash-Next; the other two keep their configured order (first on spark-1)."""
    serving = serving or Serving()
    flash = next((m for m in models if m.ple_table is not None), None)
    if flash is None or len(models) != 3:
        raise ValueError("--two-sparks needs three models, one of them with a ple_table (Flash-Next)")
    one, two = (m for m in models if m is not flash)
    s1, s2 = BOXES

    def placed(name: str, parts: Sequence[Deployed]) -> Placement:
        return Placement(name, tuple(parts), box, serving)

    # (a) the table on NVMe (page cache), Flash-Next alone on spark-2.
    mem_a = {
        s1: _plan([_memory(one), _memory(two)], total, reserved),
        s2: _plan([_memory(flash, placement="disk")], total, reserved),
    }
    a = Option(
        "a",
        f"{flash.name} alone on {s2}, n-gram table on NVMe; {one.name} + {two.name} on {s1}",
        placed(
            f"{one.name} + {two.name} | {flash.name} (table on disk)",
            [
                Deployed.of(one, s1, _kv_gib(mem_a[s1], one.name)),
                Deployed.of(two, s1, _kv_gib(mem_a[s1], two.name)),
                Deployed.of(flash, s2, _kv_gib(mem_a[s2], flash.name)),
            ],
        ),
        mem_a,
        (DISK_BUILD,),
    )
    # (b) tensor parallelism over both boxes, the table in memory (stock), sharded.
    half = _memory(flash, shards=2, placement=flash.ple_table.placement if flash.ple_table else None)
    mem_b = {
        s1: _plan([_memory(one), half], total, reserved),
        s2: _plan([_memory(two), half], total, reserved),
    }
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
                dataclasses.replace(Deployed.of(flash, f"{s1}+{s2}", flash_kv), tp=tp),
            ],
        ),
        mem_b,
    )
    # (c) two of the three, one per box.
    mem_c = {s1: _plan([_memory(one)], total, reserved), s2: _plan([_memory(two)], total, reserved)}
    c = Option(
        "c",
        f"{one.name} on {s1}, {two.name} on {s2}, {flash.name} not served",
        placed(
            f"{one.name} | {two.name}",
            [Deployed.of(one, s1, _kv_gib(mem_c[s1], one.name)), Deployed.of(two, s2, _kv_gib(mem_c[s2], two.name))],
        ),
        mem_c,
    )
    return [a, b, c]


def _box_line(box: str, plan: MemoryPlan | PlanDoesNotFit, total: int) -> str:
    if isinstance(plan, PlanDoesNotFit):
        over = f"{fmt_bytes(plan.over)} over" if plan.over else "short of KV blocks"
        return f"    {box}: does not fit ({over}): {plan.message}"
    kv = ", ".join(f"{n} {fmt_bytes(b)}" for n, b in plan.kv_cache.items())
    parts = "".join(f"\n      {line.strip()}" for line in plan.lines if not line.strip().startswith("KV cache"))
    return f"    {box}: {fmt_bytes(plan.used)} of {fmt_bytes(total)} (KV: {kv}){parts}"


def recommended(options: Sequence[Option], rows: dict[str, PlanRow]) -> Option | None:
    """The stock-vLLM placement that fits and sustains the most load (ties: the earlier)."""
    ok = [o for o in options if o.fits and o.stock]
    return max(ok, key=lambda o: rows[o.key].sustained_rps, default=None)


def report(
    options: Sequence[Option], rows: dict[str, PlanRow], *, target: float, per_user: float, total: int
) -> list[str]:
    lines = []
    for o in options:
        r = rows.get(o.key)
        lines.append(f"({o.key}) {o.title}")
        if o.requires:
            lines.append(f"    requires: {'; '.join(o.requires)}")
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
        f"recommended (fits, stock vLLM, most load): ({best.key}) {best.title}"
        if best is not None
        else "recommended: none of them fits on stock vLLM"
    )
    return lines
