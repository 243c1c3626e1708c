"""policies/kv.py: footprints in the engine's own blocks, against numbers measured on vLLM 0.32 (CPU)."""

from __future__ import annotations

import dataclasses

import pytest

from engine_adapter.base import KVGroup, KVSpec
from policies.kv import footprint, prefix_keys, resumes_at_end, sequence_blocks


def spec(*groups: KVGroup, block: int = 128, prefix: bool = True, chunk: int = 2048) -> KVSpec:
    return KVSpec(
        block_size=block,
        num_blocks=1024,
        bytes_per_block=65536,
        kv_cache_bytes=64 * 2**20,
        cache_dtype="bfloat16",
        groups=groups,
        max_model_len=8192,
        prefix_caching=prefix,
        max_num_seqs=8,
        max_num_batched_tokens=chunk,
    )


FULL = KVGroup(kind="full_attention", num_layers=2, block_size=128, page_bytes_per_layer=32768)
SWA = KVGroup(kind="sliding_window", num_layers=1, block_size=128, page_bytes_per_layer=32768, sliding_window=256)
ATTN_640 = KVGroup(kind="full_attention", num_layers=1, block_size=640, page_bytes_per_layer=163840)
MAMBA_ALIGN = KVGroup(
    kind="linear_attention", num_layers=1, block_size=640, page_bytes_per_layer=163840, mamba_mode="align"
)
MAMBA_NONE = KVGroup(
    kind="linear_attention", num_layers=1, block_size=640, page_bytes_per_layer=163840, mamba_mode="none"
)


def ids(n: int, start: int = 1000) -> list[int]:
    return list(range(start, start + n))


@pytest.mark.parametrize(
    ("p", "m", "blocks"),
    # (prompt, max_tokens) -> peak blocks measured by benchmarks/kv_probe.py: cdiv(P+M-1, 128)
    [(128, 1, 1), (129, 1, 2), (128, 128, 2), (129, 128, 2), (255, 2, 2), (256, 1, 2), (200, 57, 2), (256, 2, 3),
     (300, 213, 4), (2100, 3, 17)],
)  # fmt: skip
def test_full_attention_peak(p: int, m: int, blocks: int) -> None:
    fp = footprint(spec(FULL), ids(p), m)
    assert fp.blocks == blocks and fp.per_group == (blocks,)
    assert fp.bytes == blocks * 65536


@pytest.mark.parametrize(
    ("p", "m", "chunk", "blocks"), [(100, 400, 2048, 3), (600, 400, 2048, 5), (1500, 20, 2048, 12), (1500, 20, 256, 5)]
)
def test_sliding_window_peak(p: int, m: int, chunk: int, blocks: int) -> None:
    """Measured 3, 5, 12; with 256-token chunks vLLM held 4 where the budget let chunks start
    at multiples of 256, and the estimate allows for any start (5)."""
    assert sequence_blocks(spec(SWA, chunk=chunk), p, m) == (blocks,)


@pytest.mark.parametrize(("p", "m", "blocks"), [(641, 1, 4), (700, 600, 5), (1300, 30, 5), (2000, 5, 6), (100, 10, 2)])
def test_hybrid_align_peak_is_attention_plus_two(p: int, m: int, blocks: int) -> None:
    fp = footprint(spec(ATTN_640, MAMBA_ALIGN, block=640), ids(p), m)
    assert fp.blocks == blocks and len(fp.shared_keys) == (p - 1) // 640  # attention blocks up to the replay boundary


def test_hybrid_none_holds_one_state_block() -> None:
    assert footprint(spec(ATTN_640, MAMBA_NONE, block=640, prefix=False), ids(2000), 5).per_group == (4, 1)


def test_gemma_sliding_plus_full_counts_both_groups() -> None:
    assert footprint(spec(FULL, SWA), ids(1500), 20).per_group == (12, 12)
    assert footprint(spec(FULL, SWA), ids(100), 400).per_group == (4, 3)


def test_prefix_keys_whole_blocks_before_the_last_token() -> None:
    assert len(prefix_keys(ids(256), 128)) == 1  # a 256-token repeat hits 128 tokens
    assert len(prefix_keys(ids(300), 128)) == 2
    assert len(prefix_keys(ids(128), 128)) == 0
    a, b = prefix_keys(ids(300), 128), prefix_keys(ids(300), 128)
    assert a == b
    changed = ids(300)
    changed[5] = 7
    c = prefix_keys(changed, 128)
    assert c[0] != a[0] and c[1] != a[1]  # a chain: a change early changes every later key
    late = ids(300)
    late[200] = 7
    assert prefix_keys(late, 128)[0] == a[0] and prefix_keys(late, 128)[1] != a[1]
    assert prefix_keys(ids(300), 128, "team-a") != a  # cache_salt isolates


def test_n_sequences_share_prompt_blocks() -> None:
    """Measured: P=300, M=30, n=2 peaked at 4 pool blocks (2 x 3 - 2 shared)."""
    fp = footprint(spec(FULL), ids(300), 30, n=2)
    assert (fp.blocks, len(fp.shared_keys), fp.private_blocks) == (4, 2, 2)


def test_a_request_that_skips_the_cache_shares_nothing() -> None:
    """vLLM reads no cache for a request that asks its prompt's logprobs: each of its n
    sequences holds the whole prompt."""
    fp = footprint(spec(FULL), ids(300), 30, n=2, reads_cache=False)
    assert (fp.blocks, fp.shared_keys) == (6, ())


def test_no_sharing_without_prefix_caching() -> None:
    fp = footprint(spec(FULL, prefix=False), ids(300), 30, n=2)
    assert (fp.blocks, fp.shared_keys) == (6, ())


def test_hybrid_siblings_share_attention_blocks_up_to_the_replay_boundary() -> None:
    assert footprint(spec(ATTN_640, MAMBA_ALIGN, block=640), ids(700), 600, n=2).blocks == 2 * 5 - 1


def test_sliding_window_predicts_no_sharing() -> None:
    assert footprint(spec(FULL, SWA), ids(1500), 20).shared_keys == ()


def test_groups_peaking_at_different_steps_are_not_summed_at_their_peaks() -> None:
    """Gemma3 window + full, P=700 M=600: the window peaks at prefill (6), full attention at
    the end (11); vLLM's pool peaked at 14 (11 + the window's 3 then)."""
    fp = footprint(spec(FULL, SWA), ids(700), 600)
    assert fp.per_group == (11, 6) and fp.blocks == 14


def _qwen36(block: int, layers: int) -> KVSpec:
    attn = KVGroup(kind="full_attention", num_layers=layers, block_size=block, page_bytes_per_layer=1)
    state = KVGroup(
        kind="linear_attention", num_layers=layers, block_size=block, page_bytes_per_layer=1, mamba_mode="align"
    )
    return dataclasses.replace(spec(attn, state, state, state, block=block), async_scheduling=True)


@pytest.mark.parametrize(
    ("block", "layers", "p", "m", "measured"),
    # Peak pool blocks measured on an H200 (vLLM 0.26, AsyncScheduler, 2048-token chunks) by
    # benchmarks/gpu/kv_check.py for the Qwen3.6-35B-A3B (1056) and 27B (784) shapes.
    [(1056, 10, 100, 30, 4), (1056, 10, 1056, 1, 4), (1056, 10, 1057, 1, 8), (1056, 10, 2113, 64, 12),
     (1056, 10, 4300, 64, 14), (784, 16, 100, 30, 4), (784, 16, 1056, 1, 8), (784, 16, 1057, 1, 8),
     (784, 16, 2113, 64, 9), (784, 16, 4300, 64, 18)],
)  # fmt: skip
def test_async_hybrid_bound_covers_what_the_gpu_held(block: int, layers: int, p: int, m: int, measured: int) -> None:
    predicted = footprint(_qwen36(block, layers), ids(p), m).blocks
    assert measured <= predicted <= measured + 3  # never under; at most one block per state group over


def test_only_hybrids_resume_at_the_end_of_their_keys() -> None:
    assert resumes_at_end(spec(ATTN_640, MAMBA_ALIGN, block=640)) and not resumes_at_end(spec(FULL))


def _flash_next(mode: str) -> KVSpec:
    """Qwen3.8-Flash-Next's six groups as vLLM 0.32 builds them (CPU build, BF16 KV: the
    layout tests/integration/test_kv_exact.py reads off the engine): 3 GDN + 1 PLE state,
    the QSA key ring, attention K/V + compressed keys."""
    bs = 1664
    gdn = KVGroup(kind="linear_attention", num_layers=12, block_size=bs, page_bytes_per_layer=3407872, mamba_mode=mode)  # type: ignore[arg-type]
    ple = dataclasses.replace(gdn, num_layers=1)
    ring = KVGroup(kind="ring", num_layers=12, block_size=4, page_bytes_per_layer=1024)
    attention = KVGroup(kind="full_attention", num_layers=24, block_size=bs, page_bytes_per_layer=3407872)
    return dataclasses.replace(
        spec(gdn, gdn, gdn, ple, ring, attention, block=bs, prefix=mode == "align"), bytes_per_block=42172416
    )


@pytest.mark.parametrize(
    ("mode", "p", "m", "blocks", "per_group"),
    # Measured on the meta-device engine: 6 in one block, else F + 9 ("align") or F + 5 ("none").
    [("align", 100, 1, 6, (1, 1, 1, 1, 1, 1)), ("align", 1664, 1, 6, (1, 1, 1, 1, 1, 1)),
     ("align", 1665, 1, 11, (2, 2, 2, 2, 1, 2)), ("align", 10000, 100, 16, (2, 2, 2, 2, 1, 7)),
     ("align", 30000, 500, 28, (2, 2, 2, 2, 1, 19)), ("none", 1665, 1, 7, (1, 1, 1, 1, 1, 2)),
     ("none", 30000, 500, 24, (1, 1, 1, 1, 1, 19))],
)  # fmt: skip
def test_flash_next_holds_its_states_and_ring(
    mode: str, p: int, m: int, blocks: int, per_group: tuple[int, ...]
) -> None:
    fp = footprint(_flash_next(mode), ids(p), m)
    assert (fp.blocks, fp.per_group) == (blocks, per_group)
    assert fp.bytes == blocks * 42172416
