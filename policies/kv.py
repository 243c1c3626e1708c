"""KV-cache footprint of a request, in the running engine's blocks and bytes.

Pure arithmetic over the engine's `KVSpec` (block size, groups, page sizes as
vLLM allocated them), mirroring vLLM v1's KV cache manager (0.32, synchronous
scheduler; docs/kv-footprint.md has the rules and their sources):

- all groups draw block ids from one pool, and a request holds blocks in each;
- full attention holds ceil((P + M - 1) / bs) blocks at its peak (the last
  sampled token is never fed back);
- sliding window frees blocks that fall wholly out of the window as decoding
  moves on; its peak is the prefill chunk or the steady decode window;
- a ring (a per-request buffer, e.g. Qwen4Exp's QSA raw keys) holds one block
  from its first step to its last;
- linear attention (Mamba/GDN/short conv) holds one state block ("none"), or in "align"
  mode two for one step each time it crosses into a new block (more under
  asynchronous scheduling, bounded from measurements on CUDA vLLM);
- prefix caching reuses whole blocks whose token chain from the start is
  identical, at most P - 1 tokens' worth; hit blocks that a live request
  holds cost nothing, others come off the free list and cost one each.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol


class KVGroup(Protocol):
    """What the footprint reads of one KV cache group (layers sharing a block table). The
    engine adapter's `engine_adapter.base.KVGroup` is one: policies take values, they
    import no engine."""

    @property
    def kind(self) -> Literal["full_attention", "sliding_window", "linear_attention", "ring"]: ...
    @property
    def block_size(self) -> int: ...
    @property
    def sliding_window(self) -> int | None: ...
    @property
    def mamba_mode(self) -> Literal["none", "align"] | None: ...


class KVSpec(Protocol):
    """What the footprint reads of a running engine's KV cache (`engine_adapter.base.KVSpec`
    is one)."""

    @property
    def block_size(self) -> int: ...
    @property
    def bytes_per_block(self) -> int: ...
    @property
    def groups(self) -> Sequence[KVGroup]: ...
    @property
    def prefix_caching(self) -> bool: ...
    @property
    def max_num_batched_tokens(self) -> int: ...
    @property
    def async_scheduling(self) -> bool: ...


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True, slots=True)
class Footprint:
    """A request's peak hold on the pool, all its sequences together."""

    blocks: int  # pool blocks at the peak (of the sum over groups), worst case: max_tokens generated
    bytes: int  # what those blocks weigh in the pool
    per_group: tuple[int, ...]  # each group's own peak (same order as spec.groups)
    # Prompt blocks that a live request may already hold, as chain keys; counted
    # once in `blocks` however many of the request's sequences share them.
    shared_keys: tuple[Hashable, ...]

    @property
    def private_blocks(self) -> int:
        return self.blocks - len(self.shared_keys)


def peak_tokens(prompt_tokens: int, max_tokens: int) -> int:
    """Tokens whose KV a sequence holds at its peak: the last sampled token is never fed back."""
    return prompt_tokens + max_tokens - 1


def _sliding_held(group: KVGroup, c: int, k: int) -> int:
    """Blocks a sliding-window group holds in a step that computes tokens [c, c + k): those
    wholly below c - w + 1 have gone back to the pool (vLLM frees them before allocating)."""
    bs, w = group.block_size, group.sliding_window or 0
    return cdiv(c + k, bs) - max(0, c - w + 1) // bs


def _steps(spec: KVSpec, prompt_tokens: int, max_tokens: int) -> list[tuple[int, int]]:
    """The (start, length) steps where a sliding window's hold can peak: prefill chunks of the
    scheduler's budget starting wherever other requests' tokens cut the previous one (so the
    worst start), then one-token decode steps (periodic in the block size past the window)."""
    chunk = spec.max_num_batched_tokens or prompt_tokens
    bs = min(g.block_size for g in spec.groups)
    w = max(g.sliding_window or 0 for g in spec.groups)
    starts = {0, max(0, prompt_tokens - chunk)}
    for b in range(0, prompt_tokens + bs, bs):
        for c in (b + 1 - chunk, b + w - 2, b + w - 1):
            if 0 <= c < prompt_tokens:
                starts.add(c)
    steps = [(c, min(chunk, prompt_tokens - c)) for c in sorted(starts)]
    last = prompt_tokens + max_tokens - 2  # the last position fed back
    head = range(prompt_tokens, min(last, max(prompt_tokens, w) + 2 * bs) + 1)
    tail = range(max(prompt_tokens, last - 2 * bs), last + 1)
    steps += [(c, 1) for c in sorted(set(head) | set(tail))]
    return steps


def state_group_blocks(
    mamba_mode: Literal["none", "align"] | None, full_blocks: int, *, async_scheduling: bool, chunk_blocks: int
) -> int:
    """Blocks one linear-attention (Mamba, GDN, short-conv) state group holds at a request's
    peak, when its attention holds `full_blocks` and a prefill chunk spans `chunk_blocks`: the
    one rule admission and the memory plan both count by (docs/kv-footprint.md)."""
    if mamba_mode != "align" or full_blocks <= 1:
        return 1  # one state block
    if not async_scheduling:
        # "align" keeps the previous state block for the step that crosses into a new block,
        # which is also the step the attention groups reach their peak (vLLM 0.32, 0.34).
        return 2
    # Asynchronous scheduling (CUDA builds) holds more while a chunked prefill crosses several
    # blocks (docs/kv-footprint.md, section 8). Bound: the blocks one chunk spans, plus two.
    return min(full_blocks, 2 + chunk_blocks)


def request_state_blocks(
    state_groups: int,
    ring_groups: int,
    mamba_mode: Literal["none", "align"] | None,
    full_blocks: int,
    *,
    async_scheduling: bool,
    chunk_blocks: int,
) -> int:
    """A request's blocks besides its attention blocks: each state group's, and one per ring."""
    per_group = state_group_blocks(
        mamba_mode, full_blocks, async_scheduling=async_scheduling, chunk_blocks=chunk_blocks
    )
    return state_groups * per_group + ring_groups


def _held(group: KVGroup, c: int, k: int, full_blocks: int, spec: KVSpec) -> int:
    if group.kind == "ring":
        return 1
    if group.kind == "linear_attention":
        chunk = spec.max_num_batched_tokens or full_blocks * group.block_size
        return state_group_blocks(
            group.mamba_mode,
            full_blocks,
            async_scheduling=spec.async_scheduling,
            chunk_blocks=cdiv(chunk, group.block_size),
        )
    if group.kind == "sliding_window" and group.sliding_window:
        return _sliding_held(group, c, k)
    return cdiv(c + k, group.block_size)


def sequence_peaks(spec: KVSpec, prompt_tokens: int, max_tokens: int) -> tuple[int, tuple[int, ...]]:
    """(pool blocks one sequence holds at its peak, each group's own peak).

    Groups may peak at different steps (a window peaks at prefill, full attention
    at the last token), so the pool peak is the peak of their sum, not the sum of peaks.
    """
    tokens = peak_tokens(prompt_tokens, max_tokens)
    fulls = [cdiv(tokens, g.block_size) for g in spec.groups]
    if not any(g.kind == "sliding_window" and g.sliding_window for g in spec.groups):
        peaks = tuple(_held(g, 0, tokens, f, spec) for g, f in zip(spec.groups, fulls, strict=True))
        return sum(peaks), peaks
    per_group = [0] * len(spec.groups)
    pool = 0
    for c, k in _steps(spec, prompt_tokens, max_tokens):
        held = [_held(g, c, k, f, spec) for g, f in zip(spec.groups, fulls, strict=True)]
        per_group = [max(a, b) for a, b in zip(per_group, held, strict=True)]
        pool = max(pool, sum(held))
    return pool, tuple(per_group)


def sequence_blocks(spec: KVSpec, prompt_tokens: int, max_tokens: int) -> tuple[int, ...]:
    """Each group's own peak for one sequence."""
    return sequence_peaks(spec, prompt_tokens, max_tokens)[1]


def prefix_keys(token_ids: Sequence[Hashable], block_size: int, cache_salt: str | None = None) -> tuple[Hashable, ...]:
    """Chain keys of the prompt's blocks an engine could reuse: whole blocks from the
    start, never the block holding the last prompt token (vLLM computes at least one)."""
    n = (len(token_ids) - 1) // block_size
    keys: list[Hashable] = []
    parent: Hashable = ("sparkgate-prefix", cache_salt)
    for i in range(n):
        parent = hash((parent, tuple(token_ids[i * block_size : (i + 1) * block_size])))
        keys.append((i, parent))
    return tuple(keys)


def sharable(spec: KVSpec) -> bool:
    """Whether hits on a live request's prompt blocks are predictable: full attention alone,
    or with linear attention (hits then land only where a state was cached: `resumes_at_end`)."""
    kinds = {g.kind for g in spec.groups}
    return "full_attention" in kinds and "sliding_window" not in kinds


def resumes_at_end(spec: KVSpec) -> bool:
    """Hybrid models cache a request's state only at its replay boundary (the end of its keys)."""
    return any(g.kind == "linear_attention" for g in spec.groups)


def footprint(
    spec: KVSpec,
    prompt_ids: Sequence[Hashable],
    max_tokens: int,
    *,
    n: int = 1,
    cache_salt: str | None = None,
    reads_cache: bool = True,
) -> Footprint:
    """Worst-case blocks for a request of `n` sequences over one prompt.

    Sharing is predicted where vLLM's hits are certain: the n sequences share the
    prompt's whole blocks, and so may another live request. On hybrid models a
    hit shares the attention blocks up to a live request's replay boundary (the
    admission ledger checks for one); its state block is revived, and paid for,
    as part of the request's own blocks. Sliding-window models predict no
    sharing: an upper bound. A request that does not read the cache (`reads_cache` False:
    vLLM skips it for one that asks its prompt's logprobs) shares nothing, not even among its
    own n sequences.
    """
    pool, per_seq = sequence_peaks(spec, len(prompt_ids), max_tokens)
    shared: tuple[Hashable, ...] = ()
    if spec.prefix_caching and sharable(spec) and reads_cache:
        shared = prefix_keys(prompt_ids, spec.block_size, cache_salt)
    h = len(shared)
    blocks = n * pool - (n - 1) * h
    per_group = tuple(n * b - (n - 1) * h for b in per_seq)
    return Footprint(blocks=blocks, bytes=blocks * spec.bytes_per_block, per_group=per_group, shared_keys=shared)
