"""Whole-box memory plan: do the co-resident models fit, and how much KV cache does each get?

On a DGX Spark the OS, every model's weights, activations/graphs and every KV
pool draw on one unified memory (MemTotal 121.6 GiB). Over-committing it does not fail
fast: pages migrate and latency swings. So the plan is checked before any
engine starts, and each engine is told its exact KV bytes.

Everything an engine holds is counted: its weights (its shard of them under
tensor parallelism), a per-layer n-gram embedding table (Qwen4Exp's PLE) by dtype and
placement, that table's lookup buffers, and a KV pool in whole blocks that must hold
every running sequence's state blocks besides one max_model_len sequence.

And the box's worst moment: every engine's KV allocated while an engine starting also holds
its start-up transient (CUDA-graph capture, kernel autotuning: vLLM does both after it
allocates the pool), the largest one when engines start one after another, all of them when
they start side by side. The plan keeps a floor of free memory even then, for
the page cache and the host: on a unified-memory box a plan that runs it dry wedges the
whole machine (docs/operator-guide.md, "The box never wedges").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

GiB = 1024**3
MiB = 1024**2

PleDtype = Literal["bf16", "fp8"]
# host: pinned host memory (`--engram-config '{"cpu_offload": true}'`, vLLM's default);
# device: GPU memory (cpu_offload false). On a DGX Spark both are the same LPDDR5X, and pinned
# pages cannot be evicted: both count against the box. disk: the rows stay in the checkpoint
# files and each step's are read on the host through the page cache (`{"disk_offload": true}`,
# vLLM >= 0.34: gateway/vllm_versions.py).
PlePlacement = Literal["host", "device", "disk"]
_PLE_DTYPE_BYTES = {"bf16": 2, "fp8": 1}
# Rows one token looks up: Qwen4Exp's n-gram heads, (ngram_size - 1) x heads_per_ngram = 2 x 8
# for Qwen3.8-Flash-Next (vLLM 0.34 models/qwen4_exp/nvidia/ngram_embedding.py, ngram_heads).
PLE_ROWS_PER_TOKEN = 16
# Disk placement, per step token and row (vLLM 0.34 Qwen4ExpPLEDiskOffloadEmbedding.__init__,
# sized for max_num_batched_tokens): a pinned int64 id, and three copies of the row (device
# staging, pinned host rows, the distinct-row read buffer).
_DISK_ID_BYTES = 8
_DISK_ROW_COPIES = 3
# The page size the rows are read through: a row of b bytes at a multiple of gcd(b, page)
# spans 1 + (b - gcd) / page pages on average (engine_adapter/spark/physics.py, ple_read_seconds).
PAGE_BYTES = 4096


def fmt_bytes(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


@dataclass(frozen=True, slots=True, kw_only=True)
class PleTable:
    """A per-layer n-gram embedding table (Qwen4Exp): rows x dim, loaded as BF16 or FP8."""

    rows: int
    dim: int
    dtype: PleDtype = "fp8"
    placement: PlePlacement = "host"

    @property
    def row_bytes(self) -> int:
        return self.dim * _PLE_DTYPE_BYTES[self.dtype]

    @property
    def bytes(self) -> int:
        return self.rows * self.row_bytes

    @property
    def resident(self) -> int:
        """Bytes it pins in the box's memory (0 on disk: page cache, evictable)."""
        return 0 if self.placement == "disk" else self.bytes

    def buffer_bytes(self, max_num_batched_tokens: int) -> int:
        """What the lookup holds besides the table, for a step of that many tokens. host: the
        side-stream prefetch buffer of rows (common/ngram_embedding.py, _prefetch_buffer);
        device: nothing (no prefetch); disk: the ids and three copies of the rows."""
        rows = max_num_batched_tokens * PLE_ROWS_PER_TOKEN
        if self.placement == "host":
            return rows * self.row_bytes
        if self.placement == "disk":
            return rows * (_DISK_ID_BYTES + _DISK_ROW_COPIES * self.row_bytes)
        return 0

    def step_pages(self, max_num_batched_tokens: int) -> int:
        """On disk: the page cache a step's rows pass through, cold (every row distinct); it
        must find that much room free, or each step evicts what the last one read."""
        if self.placement != "disk":
            return 0
        rows = max_num_batched_tokens * PLE_ROWS_PER_TOKEN
        spill = self.row_bytes - math.gcd(self.row_bytes, PAGE_BYTES)
        return rows * PAGE_BYTES + rows * spill

    def describe(self) -> str:
        where = {
            "host": "pinned host memory",
            "device": "device memory",
            "disk": "on disk, read through the page cache (evictable: not counted)",
        }
        return f"{self.rows:,} x {self.dim} {self.dtype} = {fmt_bytes(self.bytes)}, {where[self.placement]}"


@dataclass(frozen=True, slots=True, kw_only=True)
class KvBlocks:
    """The engine's KV pool geometry: one block id's bytes across all layers, its tokens, and
    the blocks a request holds besides its attention blocks (linear-attention / Mamba state
    groups and rings: Flash-Next on vLLM 0.32 holds 9 with prefix caching, 5 without)."""

    block_bytes: int
    block_tokens: int
    state_blocks: int = 0  # per running request


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelMemory:
    name: str
    weights: int  # bytes of weights resident in memory (the whole model's; a shard holds 1/shards)
    overhead: int = 0  # activations, CUDA graphs, runtime buffers
    kv_cache: int | None = None  # fixed KV bytes on this box; None = a share of what is left
    kv_share: float = 1.0  # weight of this model in splitting what is left
    ple: PleTable | None = None
    max_num_batched_tokens: int = 0  # sizes the PLE lookup buffers
    kv_blocks: KvBlocks | None = None  # None: the pool is counted in bytes only
    max_num_seqs: int = 1
    max_model_len: int = 0
    shards: int = 1  # tensor parallelism over boxes: this box holds 1/shards of weights, table and KV
    # Held at start-up on top of all of the above, then released: CUDA-graph capture and kernel
    # autotuning, which vLLM runs after it allocates the KV pool.
    startup: int = 0

    @property
    def ple_bytes(self) -> int:
        return 0 if self.ple is None else self.ple.resident // self.shards

    @property
    def ple_buffers(self) -> int:
        return 0 if self.ple is None else self.ple.buffer_bytes(self.max_num_batched_tokens)

    @property
    def ple_pages(self) -> int:
        return 0 if self.ple is None else self.ple.step_pages(self.max_num_batched_tokens)

    @property
    def fixed(self) -> int:
        """What the model pins on this box before any shared KV."""
        return self.weights // self.shards + self.overhead + self.ple_bytes + self.ple_buffers + (self.kv_cache or 0)


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    kv_cache: dict[str, int]  # model -> KV bytes its engine gets (whole blocks where known)
    unplanned: int  # bytes left over (0 when some model takes a share, but for block rounding)
    lines: tuple[str, ...]  # the plan as readable lines, for logs and /sparkgate/stats
    used: int = 0  # bytes the plan puts on the box once started, reserve included
    worst_free: int = 0  # bytes still free at the worst moment (the engines starting together)


@dataclass(frozen=True, slots=True)
class PlanDoesNotFit:
    message: str
    over: int = 0  # bytes more than the box has, or under the floor (0: short of KV blocks)


def min_kv_blocks(blocks: KvBlocks, *, max_num_seqs: int, max_model_len: int) -> int:
    """The blocks a pool needs: one max_model_len sequence's attention blocks, and the state
    blocks of every sequence that may run."""
    return -(-max_model_len // blocks.block_tokens) + blocks.state_blocks * max_num_seqs


def _model_line(m: ModelMemory) -> str:
    pool = "share of the rest" if m.kv_cache is None else fmt_bytes(m.kv_cache)
    shard = f" (1/{m.shards} of {fmt_bytes(m.weights)})" if m.shards > 1 else ""
    text = f"  {m.name}: weights {fmt_bytes(m.weights // m.shards)}{shard} + overhead {fmt_bytes(m.overhead)}"
    if m.ple is not None:
        part = f"1/{m.shards} of " if m.shards > 1 and m.ple.resident else ""
        text += f" + n-gram table {fmt_bytes(m.ple_bytes)} ({part}{m.ple.describe()})"
        text += f" + its lookup buffers {m.ple_buffers / MiB:.0f} MiB"
        if m.ple_pages:
            text += f" (a step reads {m.ple_pages / MiB:.0f} MiB of its pages through the page cache)"
    text += f" + KV {pool}"
    return text + (f"; at start-up {fmt_bytes(m.startup)} more" if m.startup else "")


def _blocks_line(m: ModelMemory, kv: int) -> str | None:
    if m.kv_blocks is None:
        return None
    b = m.kv_blocks
    n = kv // b.block_bytes
    state = b.state_blocks * m.max_num_seqs
    return (
        f"  {m.name} KV: {n} blocks of {b.block_tokens} tokens ({b.block_bytes / MiB:.2f} MiB), "
        f"{state} of them state blocks for {m.max_num_seqs} sequences ({b.state_blocks} each), "
        f"{max(0, n - state) * b.block_tokens:,} tokens in the rest"
    )


def plan_memory(
    *,
    total: int,
    reserved: int,
    models: Sequence[ModelMemory],
    min_kv: int = 1,
    min_free: int = 0,
    side_by_side: bool = False,
) -> MemoryPlan | PlanDoesNotFit:
    """Fixed parts first (reserve, weights, tables, buffers, overheads, fixed KV pools), then
    the worst moment's start-up transients and the floor of free memory; the rest is split
    between the models without a fixed pool, in proportion to `kv_share`, and every pool of
    known geometry is cut to whole blocks and must hold `min_kv_blocks`."""
    fixed = reserved + sum(m.fixed for m in models)
    # The floor holds at least the page cache the disk tables' rows pass through in a step.
    min_free = max(min_free, sum(m.ple_pages for m in models))
    startups = [m.startup for m in models]
    peak = sum(startups) if side_by_side else max(startups, default=0)
    starting = "every engine starting" if side_by_side else "the largest engine starting"
    lines = [f"box memory {fmt_bytes(total)}, reserved for OS and gateway {fmt_bytes(reserved)}"]
    lines += [_model_line(m) for m in models]
    rest = total - fixed
    if rest < 0:
        return PlanDoesNotFit(
            "the models do not fit in the box's memory: "
            + "; ".join(lines)
            + f"; that is {fmt_bytes(fixed)} before any shared KV, {fmt_bytes(-rest)} more than the box has.",
            over=-rest,
        )
    rest -= peak + min_free
    if rest < 0:
        return PlanDoesNotFit(
            f"the plan leaves less than the floor of free memory ({fmt_bytes(min_free)}: box.min_free, "
            "or the page cache a step of a table on disk reads) at the box's worst moment: "
            + "; ".join(lines)
            + f"; with {starting} ({fmt_bytes(peak)} of start-up transients) "
            f"{fmt_bytes(rest + min_free)} would be free before any shared KV, "
            f"{fmt_bytes(-rest)} under the floor.",
            over=-rest,
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
    for m in models:
        if m.kv_blocks is None:
            continue
        whole = kv[m.name] // m.kv_blocks.block_bytes * m.kv_blocks.block_bytes
        rest += kv[m.name] - whole
        kv[m.name] = whole
        need = min_kv_blocks(m.kv_blocks, max_num_seqs=m.max_num_seqs, max_model_len=m.max_model_len)
        have = whole // m.kv_blocks.block_bytes
        if have < need:
            short = (need - have) * m.kv_blocks.block_bytes
            return PlanDoesNotFit(
                f"the KV pool of {m.name} is too small: {have} blocks of {m.kv_blocks.block_bytes:,} B "
                f"({fmt_bytes(whole)}), and it needs {need} (one {m.max_model_len}-token sequence plus "
                f"{m.kv_blocks.state_blocks} state blocks for each of {m.max_num_seqs} sequences): "
                + "; ".join(lines)
                + f"; {fmt_bytes(short)} more than the box has.",
                over=short,
            )
    lines.append("  KV cache: " + ", ".join(f"{name} {fmt_bytes(b)}" for name, b in kv.items()))
    lines += [line for m in models if (line := _blocks_line(m, kv[m.name])) is not None]
    lines.append(f"  unplanned: {fmt_bytes(rest)}")
    used = total - rest - peak - min_free
    lines.append(f"  total: {fmt_bytes(used)} of {fmt_bytes(total)} ({fmt_bytes(total - used)} free)")
    worst = rest + min_free
    if peak or min_free:
        lines.append(
            f"  worst moment, {starting} ({fmt_bytes(peak)} of start-up transients): "
            f"{fmt_bytes(worst)} free, floor {fmt_bytes(min_free)}"
        )
    return MemoryPlan(kv_cache=kv, unplanned=rest, lines=tuple(lines), used=used, worst_free=worst)
