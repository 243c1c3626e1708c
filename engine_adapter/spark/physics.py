"""Step-time physics: how long one continuous-batching engine step takes on a box.

A decode step is bound by the bytes it must stream from memory (active weights, MoE experts
the batch touches, KV of the full-attention layers, linear-attention state); a prefill chunk
is bound by tensor-core FLOPs (GEMMs linear in tokens at the weight dtype's rate, attention
quadratic over the full-attention layers at the BF16 rate). Speculative decoding verifies k+1 positions per
sequence per step and keeps (1 - a^(k+1)) / (1 - a) of them.
"""

from __future__ import annotations

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


def attention_flops(model: ModelSpec, context: int, new: int) -> float:
    """QK^T and PV over the full-attention layers for `new` tokens after `context` cached ones
    (causal inside the chunk): 4 * heads * head_dim * new * (context + new / 2) per layer."""
    per_layer = 4.0 * model.q_heads * model.head_dim * new * (context + new / 2)
    return model.full_attention_layers * per_layer


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
) -> StepCost:
    """Time of one continuous-batching step of `model` as served (`ModelSpec.served`).

    decode_contexts: the KV length of each decoding sequence (each verifies k+1 positions).
    prefill_chunks: (tokens already cached, chunk length, whether the chunk ends the prompt).
    routing_locality: share of a layer's experts decode tokens route over (`Serving`).
    async_scheduling: whether the host's work overlaps the GPU's (`Serving`); if not, the step
    also waits for it (`BoxSpec.sync_step_s`, `sync_token_s`).
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
    nbytes = weight_bytes_touched(model, tokens, sampled, 1.0 if n_pre else routing_locality)
    # Decode: read each context's KV; GDN reads its state and writes one per verified position
    # (vLLM keeps a state per speculative position so a rejection can roll back).
    nbytes += sum(c * kvt + state * (1 + k1) for c in decode_contexts)
    # Prefill: read the cached prefix's KV, write the chunk's, carry the state through.
    nbytes += sum((c + n) * kvt + 2 * state for c, n, _ in prefill_chunks)
    dense = 2 * (model.shared_params - model.lm_head_params) * tokens + 2 * model.lm_head_params * sampled
    expert = 2 * model.active_expert_params * tokens
    attn = sum(attention_flops(model, c, k1) for c in decode_contexts)
    attn += sum(attention_flops(model, c, n) for c, n, _ in prefill_chunks)
    dense_flops = box.dense_flops(model.weight_dtype)
    compute_s = dense / dense_flops + attn / box.attention_flops
    # Expert GEMMs are slow only when each expert sees many rows (prefill); decode is memory-bound anyway.
    compute_s += expert / (dense_flops * (box.moe_gemm_efficiency if n_pre else 1.0))
    memory_s = nbytes / box.effective_bandwidth
    draft_s, draft_bytes = _draft_cost(box, model, n_dec, n_pre)
    overhead_s = box.step_overhead_s
    if not async_scheduling:
        overhead_s += box.sync_step_s + box.sync_token_s * tokens
    seconds = max(memory_s, compute_s) + draft_s + overhead_s
    return StepCost(
        seconds=seconds,
        memory_s=memory_s,
        compute_s=compute_s,
        draft_s=draft_s,
        overhead_s=overhead_s,
        bytes=nbytes + draft_bytes,
        flops=dense + expert + attn,
        tokens=tokens,
    )


def decode_step_cost(
    box: BoxSpec,
    model: ModelSpec,
    contexts: Sequence[int],
    routing_locality: float = TRAINED_ROUTING_LOCALITY,
    async_scheduling: bool = False,
) -> StepCost:
    """A pure decode step (no prefill in the batch)."""
    return step_cost(box, model, contexts, (), routing_locality, async_scheduling)
