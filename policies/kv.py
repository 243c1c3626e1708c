"""KV-cache footprint of a request, in the running engine's blocks and bytes.

Pure arithmetic over the engine's `KVSpec` (block size, groups, page sizes
as vLLM allocated them), mirroring vLLM v1's KV cache manager: all groups draw
blocks from one pool; a full-attention group holds ceil(tokens / block_size)
blocks per sequence; prefix caching reuses whole blocks whose token chain from
the start is identical. See the rules and their sources in docs/kv-footprint.md.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from engine_adapter.base import KVGroup, KVSpec


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True, slots=True)
class Footprint:
    """A request's peak hold on the pool, all its sequences together."""

    blocks: int  # pool blocks at the peak, worst case (max_tokens generated)
    bytes: int  # what those blocks weigh
    per_group: tuple[int, ...]  # blocks per KV cache group (same order as spec.groups)
    shared_keys: tuple[Hashable, ...]  # prompt blocks another live request may supply

    @property
    def private_blocks(self) -> int:
        return self.blocks - len(self.shared_keys)


def peak_tokens(prompt_tokens: int, max_tokens: int) -> int:
    """Tokens whose KV a sequence holds at its peak: the last sampled token is never fed back."""
    return prompt_tokens + max_tokens - 1


def group_blocks(group: KVGroup, tokens: int) -> int:
    """Blocks one sequence of `tokens` holds in one group at its peak."""
    if group.kind == "linear_attention":
        return 1  # a fixed-size recurrent state, one page per sequence
    if group.kind == "sliding_window" and group.sliding_window is not None:
        # Blocks wholly out of the window are returned to the pool as decoding moves on.
        return min(cdiv(tokens, group.block_size), cdiv(group.sliding_window - 1, group.block_size) + 1)
    return cdiv(tokens, group.block_size)


def prefix_keys(token_ids: Sequence[int], block_size: int, cache_salt: str | None = None) -> tuple[Hashable, ...]:
    """Chain keys of the prompt's blocks an engine could reuse: whole blocks from the
    start, never the block holding the last prompt token (vLLM computes at least one)."""
    n = (len(token_ids) - 1) // block_size
    keys: list[Hashable] = []
    parent: Hashable = ("sparkgate-prefix", cache_salt)
    for i in range(n):
        parent = hash((parent, tuple(token_ids[i * block_size : (i + 1) * block_size])))
        keys.append((i, parent))
    return tuple(keys)


def footprint(
    spec: KVSpec,
    prompt_ids: Sequence[int],
    max_tokens: int,
    *,
    n: int = 1,
    cache_salt: str | None = None,
) -> Footprint:
    tokens = peak_tokens(len(prompt_ids), max_tokens)
    per_group = tuple(group_blocks(g, tokens) * n for g in spec.groups)
    blocks = sum(per_group)
    shared: tuple[Hashable, ...] = ()
    full = [i for i, g in enumerate(spec.groups) if g.kind == "full_attention"]
    if spec.prefix_caching and len(spec.groups) == 1 and full:
        # Plain attention models: the first sequence's full prompt blocks can come from
        # another request. (n > 1 siblings and hybrid models are charged in full.)
        shared = prefix_keys(prompt_ids, spec.groups[0].block_size, cache_salt)
    nbytes = sum(b * g.page_bytes_per_layer * g.num_layers for b, g in zip(per_group, spec.groups, strict=True))
    return Footprint(blocks=blocks, bytes=nbytes, per_group=per_group, shared_keys=shared)
