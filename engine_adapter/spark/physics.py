"""Step-time physics: how long one continuous-batching engine step takes on a box.

A decode step is bound by the bytes it must stream from memory (active weights, MoE experts
the batch touches, KV of the full-attention layers, linear-attention state); a prefill chunk
is bound by tensor-core FLOPs (GEMMs linear in tokens at the weight dtype's rate, attention
quadratic over the full-attention layers at the BF16 rate). Speculative decoding verifies k+1 positions per
sequence per step and keeps (1 - a^(k+1)) / (1 - a) of them.

Sparse attention (Qwen4Exp's QSA, Flash-Next) caps the keys a query attends (`attended_keys`) and
adds the lightning indexer that picks them (`indexer_pairs`). Its kernels gather each query's own
selection, so they are bound by bytes, not FLOPs, and they run between the prefill's compute-bound
GEMMs: their time is added to the prefill's compute, not hidden behind it (`step_cost`). An n-gram
table read from the drive costs each step its rows' pages (`ple_read_seconds`), serially.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from engine_adapter.spark.catalogue import ModelSpec
from engine_adapter.spark.hardware import TRAINED_ROUTING_LOCALITY, BoxSpec


def distinct_experts(model: ModelSpec, tokens: int, locality: float = 1.0) -> float:
    """Expected experts per layer that `tokens` routed tokens touch: E * (1 - (1 - k/E)^T) with
    routing uniform and independent over E = locality * num_experts experts (the working set)."""
    if not model.is_moe or tokens <= 0:
        return 0.0
    k = model.experts_per_token
    e = max(float(k), locality * model.num_experts)
    return e * (1 - (1 - k / e) ** tokens)


def weight_bytes_touched(model: ModelSpec, tokens: int, sampled: int, locality: float = 1.0) -> float:
    """Weights one forward over `tokens` positions streams: every non-expert weight, the
    experts the tokens touch, and the lm_head only when some position is sampled."""
    if tokens <= 0:
        return 0.0
    params = model.shared_params - (0.0 if sampled else model.lm_head_params)
    if model.is_moe:
        params += model.expert_params * distinct_experts(model, tokens, locality) / model.num_experts
    return params * model.weight_bytes_per_param


def _mod_sum(m: int, r: int) -> int:
    """The sum of n % r over n in [0, m)."""
    q, s = divmod(m, r)
    return q * r * (r - 1) // 2 + s * (s - 1) // 2


def _sparse_keys_prefix(model: ModelSpec, tokens: int) -> int:
    """Keys the queries at positions 0..tokens-1 attend in one layer under QSA's selection (vLLM
    0.34 models/qwen4_exp/nvidia/ops/qsa_indexer.py, _expand_qsa_indices_kernel): a query that
    sees n tokens takes min(n // r, budget / r) whole compressed blocks of r tokens (the indexer's
    top-k) plus the n % r tokens of the open block, so it attends all n up to budget + r - 1
    tokens (2,051 for Flash-Next) and budget + n % r past that."""
    r = model.indexer_compress_ratio
    budget = model.sparse_attention_budget
    dense = budget + r - 1
    m = min(tokens, dense)
    total = m * (m + 1) // 2
    if tokens > dense:
        total += (tokens - dense) * budget + _mod_sum(tokens + 1, r) - _mod_sum(dense + 1, r)
    return total


def attended_keys(model: ModelSpec, context: int, new: int) -> float:
    """Query-key pairs of one full-attention layer for `new` queries after `context` cached tokens
    (causal inside the chunk): new * (context + new / 2) dense; with sparse attention, each query
    attends at most its selection (`_sparse_keys_prefix`)."""
    if model.sparse_attention_budget <= 0:
        return new * (context + new / 2)
    return float(_sparse_keys_prefix(model, context + new) - _sparse_keys_prefix(model, context))


def indexer_pairs(model: ModelSpec, context: int, new: int) -> float:
    """(query, compressed key) pairs the indexer scores in one layer for `new` queries after
    `context` cached tokens: a query that sees n tokens scores their n // r complete compressed
    blocks (the visible blocks of vLLM 0.34's qsa_select_paged_decode / _prefill). 0 when dense."""
    if model.sparse_attention_budget <= 0 or new <= 0:
        return 0.0
    r = model.indexer_compress_ratio
    lo, hi = context + 1, context + new  # tokens the chunk's first and last query see
    tokens = (lo + hi) * new // 2
    return float(tokens - (_mod_sum(hi + 1, r) - _mod_sum(lo, r))) / r


def attention_flops(model: ModelSpec, context: int, new: int) -> float:
    """QK^T and PV over the full-attention layers for `new` tokens after `context` cached ones:
    4 * heads * head_dim per query-key pair (`attended_keys`) per layer."""
    per_layer = 4.0 * model.q_heads * model.head_dim * attended_keys(model, context, new)
    return model.full_attention_layers * per_layer


def indexer_flops(model: ModelSpec, context: int, new: int) -> float:
    """The indexer's scores over the full-attention layers: 2 * heads * head_dim per pair."""
    per_pair = 2.0 * model.indexer_heads * model.indexer_head_dim
    return model.full_attention_layers * per_pair * indexer_pairs(model, context, new)


# Bytes per (query, compressed key) pair the indexer moves besides reading the keys: its FP32
# logit, written by the scoring kernel and read back by the top-k (vLLM 0.34
# models/qwen4_exp/nvidia/ops/qsa_indexer.py, qsa_select_paged_decode / _prefill, _topk).
INDEXER_LOGIT_BYTES = 4 + 4
# Query rows a prefill scoring tile shares one read of the compressed keys over (_prefill_logits:
# TILE_R 64 for BF16 keys, the default indexer_kv_dtype); a decode step reads them once per
# sequence (_qsa_mqa_paged_uniform_kernel scores all of a request's rows together).
INDEXER_PREFILL_TILE_ROWS = 64


def kv_page_bytes(model: ModelSpec) -> int:
    """K and V of one token in one full-attention layer."""
    return 2 * model.kv_heads * model.head_dim * model.kv_dtype_bytes


def sparse_attention_bytes(model: ModelSpec, context: int, new: int) -> float:
    """K/V bytes QSA's sparse attention gathers for `new` queries after `context` cached tokens:
    the kernel runs one program per query row and KV head over that row's own selection (vLLM 0.34
    models/qwen4_exp/nvidia/ops/qsa.py, qsa_sparse_paged_attention: grid rows x kv heads), so
    each row reads its selected tokens' K/V; no reuse between rows is counted (nearby queries'
    selections overlap, and what of it the GPU's L2 keeps is not known)."""
    return model.full_attention_layers * kv_page_bytes(model) * attended_keys(model, context, new)


def indexer_bytes(model: ModelSpec, context: int, new: int, key_reads: float) -> float:
    """Bytes the indexer moves over the full-attention layers: each pair's logit, and the
    compressed keys read `key_reads` times over (a decode's rows read them once; a prefill's,
    once per scoring tile)."""
    if model.sparse_attention_budget <= 0 or new <= 0:
        return 0.0
    keys = key_reads * (context + new) * model.indexer_bytes_per_token
    return model.full_attention_layers * (INDEXER_LOGIT_BYTES * indexer_pairs(model, context, new) + keys)


# The OS page: the unit a buffered read of the n-gram table's rows fetches from the drive.
PAGE_BYTES = 4096


def ple_read_seconds(box: BoxSpec, model: ModelSpec, tokens: int) -> float:
    """Reading one step's n-gram table rows from the drive, serial with the step (vLLM 0.34's
    disk placement, models/qwen4_exp/nvidia/ngram_embedding.py: stage_checkpoint_rows waits for
    the step's ids behind a stream sync, then Qwen4ExpPLEDiskOffloadEmbedding._read_rows
    posix_fadvise(WILLNEED)s the distinct rows' page runs and preadv()s each row).

    Every token in the step looks up `ple_rows_per_token` rows ((ngram_size - 1) x heads_per_ngram),
    assumed distinct and on cold pages (the worst case: nothing of the table in the page cache).
    A row of b bytes at a multiple of g = gcd(b, page) spans 1 + (b - g) / page pages on average.
    The fadvise queues all of a step's pages at once, so the drive serves them at its random-read
    rate, or its bandwidth in pages, whichever is lower (`BoxSpec.nvme_read_iops`,
    `nvme_read_bandwidth`). Not counted: one read's latency per step, and the host's two system
    calls per row."""
    if tokens <= 0 or model.ple_rows_per_token <= 0:
        return 0.0
    if box.nvme_read_iops <= 0 or box.nvme_read_bandwidth <= 0:
        raise ValueError(f"{box.name} has no drive spec (nvme_read_iops, nvme_read_bandwidth) to read the table from")
    rows = tokens * model.ple_rows_per_token
    g = math.gcd(model.ple_row_bytes, PAGE_BYTES)
    pages = rows * (1 + (model.ple_row_bytes - g) / PAGE_BYTES)
    return pages / min(box.nvme_read_iops, box.nvme_read_bandwidth / PAGE_BYTES)


@dataclass(frozen=True, slots=True)
class StepCost:
    """One engine step's time and why."""

    seconds: float
    memory_s: float  # main forward: bytes / effective bandwidth
    compute_s: float  # main forward: FLOPs / achievable rates
    draft_s: float  # speculative drafting
    overhead_s: float
    bytes: float
    flops: float
    tokens: int  # positions in the main forward
    ple_read_s: float = 0.0  # the n-gram table's rows read from the drive, before the forward


def _draft_cost(box: BoxSpec, model: ModelSpec, decodes: int, prefill_tokens: int) -> tuple[float, float]:
    """(seconds, bytes) of drafting: each pass reads the drafter and the shared lm_head
    (memory-bound); the drafter also runs over every prefilled token (compute)."""
    sd = model.spec
    seconds, total_bytes = 0.0, 0.0
    if decodes:
        positions = decodes if sd.kind == "mtp" else decodes * sd.draft_tokens
        per_pass = (sd.draft_params + model.lm_head_params) * model.weight_bytes_per_param
        flops = 2 * (sd.draft_flops_params + model.lm_head_params) * positions
        dense_flops = box.dense_flops(model.weight_dtype)
        one = max(per_pass / box.effective_bandwidth, flops / dense_flops) + box.forward_overhead_s
        seconds += sd.draft_passes * one
        total_bytes += sd.draft_passes * per_pass
    if prefill_tokens:
        seconds += 2 * sd.draft_flops_params * prefill_tokens / box.dense_flops(model.weight_dtype)
    return seconds, total_bytes


def step_cost(
    box: BoxSpec,
    model: ModelSpec,
    decode_contexts: Sequence[int],
    prefill_chunks: Sequence[tuple[int, int, bool]] = (),
    routing_locality: float = TRAINED_ROUTING_LOCALITY,
    async_scheduling: bool = False,
    ple_table_on_disk: bool = False,
) -> StepCost:
    """Time of one continuous-batching step of `model` as served (`ModelSpec.served`).

    decode_contexts: the KV length of each decoding sequence (each verifies k+1 positions).
    prefill_chunks: (tokens already cached, chunk length, whether the chunk ends the prompt).
    routing_locality: share of a layer's experts decode tokens route over (`Serving`).
    async_scheduling: whether the host's work overlaps the GPU's (`Serving`); if not, the step
    also waits for it (`BoxSpec.sync_step_s`, `sync_token_s`).
    ple_table_on_disk: the model's n-gram table is read from the drive each step
    (`ple_read_seconds`); in memory, its rows cost no step time.
    """
    k1 = model.spec.draft_tokens + 1
    n_dec = len(decode_contexts)
    n_pre = sum(n for _, n, _ in prefill_chunks)
    tokens = n_dec * k1 + n_pre
    if tokens == 0:
        return StepCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0)
    sampled = n_dec * k1 + sum(1 for *_, last in prefill_chunks if last)
    kvt = model.kv_bytes_per_token
    state = model.linear_state_bytes
    sparse = model.sparse_attention_budget > 0
    nbytes = weight_bytes_touched(model, tokens, sampled, 1.0 if n_pre else routing_locality)
    # Decode: read each context's KV; GDN reads its state and writes one per verified position
    # (vLLM keeps a state per speculative position so a rejection can roll back). Sparse
    # attention reads the compressed keys of the whole context once (the indexer) and each
    # verified position's own selection of K/V.
    for c in decode_contexts:
        nbytes += state * (1 + k1)
        if sparse:
            nbytes += indexer_bytes(model, c, k1, key_reads=1) + sparse_attention_bytes(model, c, k1)
        else:
            nbytes += c * kvt
    # Prefill: read the cached prefix's KV, write the chunk's, carry the state through (sparse:
    # the attention and indexer kernels' own reads are counted with them below).
    nbytes += sum((n if sparse else c + n) * kvt + 2 * state for c, n, _ in prefill_chunks)
    dense = 2 * (model.shared_params - model.lm_head_params) * tokens + 2 * model.lm_head_params * sampled
    expert = 2 * model.active_expert_params * tokens
    attn = sum(attention_flops(model, c, k1) + indexer_flops(model, c, k1) for c in decode_contexts)
    dense_flops = box.dense_flops(model.weight_dtype)
    compute_s = dense / dense_flops + attn / box.attention_flops
    # Expert GEMMs are slow only when each expert sees many rows (prefill); decode is memory-bound anyway.
    compute_s += expert / (dense_flops * (box.moe_gemm_efficiency if n_pre else 1.0))
    # Prefill attention: dense, FLOPs at the attention rate (K/V tiles are shared by a tile of
    # queries). Sparse, each kernel is the slower of its FLOPs and its bytes: the selection
    # gather moves 1 KiB of K/V per 24K FLOPs (24 FLOP/B, below the Spark's ~220 FLOP/B balance),
    # so it is bandwidth-bound, and it runs between compute-bound GEMMs, not under them.
    kernel_bytes = 0.0
    for c, n, _ in prefill_chunks:
        flops = attention_flops(model, c, n)
        attn += flops
        if not sparse:
            compute_s += flops / box.attention_flops
            continue
        gather = sparse_attention_bytes(model, c, n)
        index = indexer_bytes(model, c, n, key_reads=math.ceil(n / INDEXER_PREFILL_TILE_ROWS))
        index_flops = indexer_flops(model, c, n)
        attn += index_flops
        compute_s += max(flops / box.attention_flops, gather / box.effective_bandwidth)
        compute_s += max(index_flops / box.attention_flops, index / box.effective_bandwidth)
        kernel_bytes += gather + index
    memory_s = nbytes / box.effective_bandwidth
    draft_s, draft_bytes = _draft_cost(box, model, n_dec, n_pre)
    overhead_s = box.step_overhead_s
    if not async_scheduling:
        overhead_s += box.sync_step_s + box.sync_token_s * tokens
    ple_s = ple_read_seconds(box, model, tokens) if ple_table_on_disk else 0.0
    seconds = ple_s + max(memory_s, compute_s) + draft_s + overhead_s
    return StepCost(
        seconds=seconds,
        memory_s=memory_s,
        compute_s=compute_s,
        draft_s=draft_s,
        overhead_s=overhead_s,
        bytes=nbytes + kernel_bytes + draft_bytes,
        flops=dense + expert + attn,
        tokens=tokens,
        ple_read_s=ple_s,
    )


def decode_step_cost(
    box: BoxSpec,
    model: ModelSpec,
    contexts: Sequence[int],
    routing_locality: float = TRAINED_ROUTING_LOCALITY,
    async_scheduling: bool = False,
    ple_table_on_disk: bool = False,
) -> StepCost:
    """A pure decode step (no prefill in the batch)."""
    return step_cost(box, model, contexts, (), routing_locality, async_scheduling, ple_table_on_disk)
