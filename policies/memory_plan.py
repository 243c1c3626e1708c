"""Whole-box memory plan: do the co-resident models fit, and how much KV cache does each get?

On a DGX Spark the OS, every model's weights, activations/graphs and every KV
pool draw on one unified memory (MemTotal 121.6 GiB). Over-committing it does not fail
fast: pages migrate and latency swings. So the plan is checked before any
engine starts, and each engine is told its exact KV bytes.

Everything an engine holds is counted: its weights (its shard of them under
tensor parallelism), a per-layer n-gram embedding table (Qwen4Exp's PLE) by dtype and
placement, that table's prefetch buffer, and a KV pool in whole blocks that must hold
every running sequence's state blocks besides one max_model_len sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

GiB = 1024**3
MiB = 1024**2

PleDtype = Literal["bf16", "fp8"]
# host: pinned host memory (vLLM 0.32's `--engram-config '{"cpu_offload": true}'`, the default);
# device: GPU memory (cpu_offload false). On a DGX Spark both are the same LPDDR5X, and pinned
# pages cannot be evicted: both count against the box. disk: file-backed, read through the page
# cache (only a vLLM build with disk-backed PLE has it; stock 0.32 does not).
PlePlacement = Literal["host", "device", "disk"]
_PLE_DTYPE_BYTES = {"bf16": 2, "fp8": 1}
# Rows the PLE lookup gathers per token into its prefetch buffer (docs: flash-next.md section 4:
# max_num_batched_tokens x 16 x 160 B for Qwen3.8-Flash-Next's 160-wide table).
PLE_ROWS_PER_TOKEN = 16


def fmt_bytes(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


@dataclass(frozen=True, slots=True, kw_only=True)
class PleTable:
    """A per-layer n-gram embedding table (Qwen4Exp): rows x dim, loaded as BF16 or FP8."""

    rows: int
    dim: int
    dtype: PleDtype = "fp8"
    placement: PlePlacement = "host"
    requires_build: str | None = None  # the non-stock vLLM build a disk placement needs

    @property
    def bytes(self) -> int:
        return self.rows * self.dim * _PLE_DTYPE_BYTES[self.dtype]

    @property
    def resident(self) -> int:
        """Bytes it pins in the box's memory (0 on disk: page cache, evictable)."""
        return 0 if self.placement == "disk" else self.bytes

    def prefetch_bytes(self, max_num_batched_tokens: int) -> int:
        """The side-stream prefetch buffer: a step's tokens x rows per token x dim bytes."""
        return max_num_batched_tokens * PLE_ROWS_PER_TOKEN * self.dim

    def describe(self) -> str:
        where = {"host": "pinned host memory", "device": "device memory", "disk": "on disk, via the page cache"}
        text = f"{self.rows:,} x {self.dim} {self.dtype} = {fmt_bytes(self.bytes)}, {where[self.placement]}"
        return text + (f" (needs {self.requires_build})" if self.requires_build else "")


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
    max_num_batched_tokens: int = 0  # sizes the PLE prefetch buffer
    kv_blocks: KvBlocks | None = None  # None: the pool is counted in bytes only
    max_num_seqs: int = 1
    max_model_len: int = 0
    shards: int = 1  # tensor parallelism over boxes: this box holds 1/shards of weights, table and KV

    @property
    def ple_bytes(self) -> int:
        return 0 if self.ple is None else self.ple.resident // self.shards

    @property
    def prefetch(self) -> int:
        return 0 if self.ple is None else self.ple.prefetch_bytes(self.max_num_batched_tokens)

    @property
    def fixed(self) -> int:
        """What the model pins on this box before any shared KV."""
        return self.weights // self.shards + self.overhead + self.ple_bytes + self.prefetch + (self.kv_cache or 0)


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    kv_cache: dict[str, int]  # model -> KV bytes its engine gets (whole blocks where known)
    unplanned: int  # bytes left over (0 when some model takes a share, but for block rounding)
    lines: tuple[str, ...]  # the plan as readable lines, for logs and /sparkgate/stats
    used: int = 0  # bytes the plan puts on the box, reserve included


@dataclass(frozen=True, slots=True)
class PlanDoesNotFit:
    message: str
    over: int = 0  # bytes more than the box has (0: it is short of KV blocks instead)


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
        text += f" + its prefetch buffer {m.prefetch / MiB:.0f} MiB"
    return text + f" + KV {pool}"


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
    *, total: int, reserved: int, models: Sequence[ModelMemory], min_kv: int = 1
) -> MemoryPlan | PlanDoesNotFit:
    """Fixed parts first (reserve, weights, tables, buffers, overheads, fixed KV pools); the
    rest is split between the models without a fixed pool, in proportion to `kv_share`, and
    every pool of known geometry is cut to whole blocks and must hold `min_kv_blocks`."""
    fixed = reserved + sum(m.fixed for m in models)
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
    used = total - rest
    lines.append(f"  total: {fmt_bytes(used)} of {fmt_bytes(total)} ({fmt_bytes(total - used)} free)")
    return MemoryPlan(kv_cache=kv, unplanned=rest, lines=tuple(lines), used=used)
