"""A first-principles model of one NVIDIA DGX Spark serving one model with vLLM.

Pure and synchronous: no asyncio, no wall clock. Two parts:

- step-time physics (`decode_step_cost`, `step_cost`): a decode step is bound by
  the bytes it must stream from the 273 GB/s LPDDR5x (active weights, MoE experts
  the batch touches, KV of the full-attention layers, linear-attention state); a
  prefill chunk is bound by tensor-core FLOPs (GEMMs linear in tokens, attention
  quadratic over the full-attention layers). Speculative decoding verifies k+1
  positions per sequence per step and keeps (1 - a^(k+1)) / (1 - a) of them.
- `BoxSim`: vLLM's scheduler in virtual time (FCFS, chunked prefill with decodes
  first, max_num_seqs, a block pool with a salt-aware prefix cache and LRU
  eviction, no preemption: a request is admitted only when its peak fits).

The efficiency constants below are global: the same for all three models.
Reference: /work/shared/reference/dgx-spark.md and benchmarks/sim_vs_measured.py.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from engine_adapter.base import KVGroup, KVSpec

GiB = 1 << 30

# --- Global efficiency constants (one set for every model; never tuned per row) ---
# Share of the 273 GB/s peak that decode kernels stream: LPDDR5x sustains roughly
# 80-85% in STREAM-like copies; GEMV-style kernels over many small tensors land a bit lower.
BANDWIDTH_EFFICIENCY = 0.82
# Dense NVFP4 GEMM rate reached by prefill: the vendor's 1 PFLOP is FP4 *with 2:4
# sparsity*, so ~500 TFLOP/s dense peak; large-M prefill GEMMs reach about a third.
DENSE_FLOPS = 160e12
# Attention (FP8 KV, BF16 softmax/PV) runs on a different, slower path than FP4 GEMMs:
# ~125 TFLOP/s BF16 dense peak on GB10, paged/chunked attention reaching ~40%.
ATTENTION_FLOPS = 50e12
# Expert GEMMs in prefill reach ~1/8 of the dense rate (~19 TFLOP/s): a 4096-token chunk
# gives each expert only ~80-130 rows, and the grouped NVFP4 MoE path on sm_121 (route,
# permute, small per-expert tiles, un-permute; kernels tuned for datacenter Blackwell) is
# tile- and latency-bound, not tensor-core bound. Both MoE models' 64K prefills agree on it.
MOE_GEMM_EFFICIENCY = 0.12
# Share of a layer's experts the tokens of one text route over during decode (temporal
# locality: consecutive tokens and concurrent requests on the same kind of text reuse
# experts). Uniform routing (1.0) would make 4 sequences x 4 verify positions touch 102 of
# 256 experts against 30 for one sequence, a 2.1x slower step; the box measured 1.38x.
# Prefill chunks (thousands of varied tokens) route over all experts.
ROUTING_LOCALITY = 0.1
# Latency a client sees outside the engine core: vLLM's HTTP frontend (chat template,
# tokenizing the prompt on the Grace cores, the ZMQ hop to the engine core, detokenizing,
# the SSE write). Only the benchmark adds it: in sparkgate the gateway is the frontend.
FRONTEND_LATENCY_S = 0.08
# Fixed cost per engine step: the synchronous scheduler (--no-async-scheduling),
# input preparation, sampling / rejection sampling and output processing on the CPU.
STEP_OVERHEAD_S = 0.0025
# Fixed cost per extra forward pass (each draft pass): graph launch and sync.
FORWARD_OVERHEAD_S = 0.0004
# NVFP4: 4-bit values plus one FP8 scale per 16 values.
NVFP4_BYTES_PER_PARAM = 0.5 + 1 / 16


@dataclass(frozen=True, kw_only=True)
class BoxSpec:
    """The box: how fast it streams memory and multiplies, and its fixed costs."""

    name: str
    mem_bandwidth: float  # bytes/s, peak
    bandwidth_efficiency: float  # share of the peak decode kernels reach
    dense_flops: float  # achievable dense GEMM FLOP/s (prefill)
    attention_flops: float  # achievable attention FLOP/s
    moe_gemm_efficiency: float  # expert GEMMs relative to dense ones
    step_overhead_s: float  # per engine step
    forward_overhead_s: float  # per extra forward pass (drafts)
    memory_bytes: int  # unified memory
    routing_locality: float = 1.0  # share of a layer's experts one text's decode tokens route over
    frontend_latency_s: float = 0.0  # client-observed latency outside the engine core
    block_size: int = 16  # tokens per KV block

    @property
    def effective_bandwidth(self) -> float:
        return self.mem_bandwidth * self.bandwidth_efficiency


DGX_SPARK = BoxSpec(
    name="NVIDIA DGX Spark (GB10)",
    mem_bandwidth=273e9,
    bandwidth_efficiency=BANDWIDTH_EFFICIENCY,
    dense_flops=DENSE_FLOPS,
    attention_flops=ATTENTION_FLOPS,
    moe_gemm_efficiency=MOE_GEMM_EFFICIENCY,
    routing_locality=ROUTING_LOCALITY,
    frontend_latency_s=FRONTEND_LATENCY_S,
    step_overhead_s=STEP_OVERHEAD_S,
    forward_overhead_s=FORWARD_OVERHEAD_S,
    memory_bytes=128 * GiB,
)


@dataclass(frozen=True, kw_only=True)
class SpecDecode:
    """A speculative decoder: k draft tokens per step, each accepted with probability alpha."""

    kind: Literal["mtp", "dflash"]  # mtp: k sequential draft passes; dflash: one parallel block pass
    draft_tokens: int  # k
    acceptance: float  # alpha, per-token acceptance (i.i.d. assumption)
    draft_params: float  # weights one draft pass reads besides the (shared) lm_head
    draft_flops_params: float  # parameters one draft position multiplies through (FLOPs = 2x)
    source: str  # where alpha and the drafter's size come from

    @property
    def expected_tokens(self) -> float:
        """Tokens one verify step yields: accepted drafts plus the bonus/corrected token."""
        a, k = self.acceptance, self.draft_tokens
        return float(k + 1) if a >= 1.0 else (1 - a ** (k + 1)) / (1 - a)

    @property
    def draft_passes(self) -> int:
        return self.draft_tokens if self.kind == "mtp" else 1


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """One served model: what a token costs in bytes and FLOPs."""

    name: str
    total_params: float  # resident parameters (Flash-Next's NVMe n-gram table excluded)
    active_params: float  # multiplied per token, lm_head included, embeddings excluded
    lm_head_params: float  # part of active_params, only computed for sampled positions
    weight_bytes_per_param: float
    num_experts: int = 0  # routed experts per MoE layer (0 = dense)
    experts_per_token: int = 0
    expert_params: float = 0.0  # all routed experts' parameters, all layers
    layers: int
    full_attention_layers: int  # layers with a growing KV cache (hybrid: 1 in 4)
    q_heads: int
    kv_heads: int
    head_dim: int
    kv_dtype_bytes: int  # fp8 KV = 1
    linear_state_bytes: int  # GDN recurrent + conv state of one sequence, all linear layers
    spec: SpecDecode
    kv_budget_gib: float  # KV pool at --gpu-memory-utilization 0.8 (from the box's logs)
    notes: str = ""

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def shared_params(self) -> float:
        """Per-token parameters that are not routed experts (attention, GDN, shared expert, lm_head)."""
        return self.active_params - self.active_expert_params

    @property
    def active_expert_params(self) -> float:
        return self.expert_params * self.experts_per_token / self.num_experts if self.is_moe else 0.0

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.full_attention_layers * self.kv_heads * self.head_dim * self.kv_dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.total_params * self.weight_bytes_per_param


def _gdn_state_bytes(layers: int, value_heads: int, k_dim: int = 128, v_dim: int = 128, conv_dim: int = 0) -> int:
    """Gated DeltaNet state of one sequence: an fp32 k x v matrix per value head, plus
    the short-conv window (3 past positions in bf16) over the q/k/v channels."""
    return layers * (value_heads * k_dim * v_dim * 4 + 3 * conv_dim * 2)


MODELS: dict[str, ModelSpec] = {
    # Shape from model-shapes/qwen3.6-35b-a3b.config.json: 40 layers (10 full attention),
    # hidden 2048, 256 experts x (3 x 2048 x 512), 8 routed + 1 shared; counted params:
    # experts 32.2B, attention+GDN 1.28B, shared experts+routers 0.15B, lm_head 0.51B.
    "Qwen3.6-35B-A3B": ModelSpec(
        name="Qwen3.6-35B-A3B",
        total_params=34.7e9,
        active_params=2.95e9,
        lm_head_params=248320 * 2048,
        weight_bytes_per_param=NVFP4_BYTES_PER_PARAM,
        num_experts=256,
        experts_per_token=8,
        expert_params=40 * 256 * 3 * 2048 * 512,
        layers=40,
        full_attention_layers=10,
        q_heads=16,
        kv_heads=2,
        head_dim=256,
        kv_dtype_bytes=1,
        linear_state_bytes=_gdn_state_bytes(30, 32, conv_dim=8192),
        spec=SpecDecode(
            kind="mtp",
            draft_tokens=3,
            acceptance=0.87,
            # The MTP block: one full-attention layer + one MoE layer (8 of 256 experts + shared) + fc.
            draft_params=27e6 + 8 * 3 * 2048 * 512 + 3 * 2048 * 512 + 8.4e6,
            draft_flops_params=27e6 + 9 * 3 * 2048 * 512 + 8.4e6,
            source="assumption: Qwen3-Next MTP acceptance ~0.8-0.9 per token at temperature 0 on "
            "plain English (alpha=0.87: 3.3 tokens per step); one MTP layer "
            "(mtp_num_hidden_layers=1) sharing the lm_head",
        ),
        kv_budget_gib=65.0,
    ),
    # Shape from model-shapes/qwen3.6-27b.config.json: 64 layers (16 full attention), hidden
    # 5120, MLP 17408; counted params: MLP 17.1B, GDN 5.56B, attention 1.68B, lm_head 1.27B.
    "Qwen3.8-27B": ModelSpec(
        name="Qwen3.8-27B",
        total_params=26.9e9,
        active_params=25.6e9,
        lm_head_params=248320 * 5120,
        weight_bytes_per_param=NVFP4_BYTES_PER_PARAM,
        layers=64,
        full_attention_layers=16,
        q_heads=24,
        kv_heads=4,
        head_dim=256,
        kv_dtype_bytes=1,
        linear_state_bytes=_gdn_state_bytes(48, 48, conv_dim=10240),
        spec=SpecDecode(
            kind="dflash",
            draft_tokens=8,
            acceptance=0.88,
            # DFlash: a block-diffusion drafter of ~5 target-width layers drafting the whole block in one pass.
            draft_params=5 * (105e6 + 267e6),
            draft_flops_params=5 * (105e6 + 267e6),
            source="assumption: DFlash reports mean acceptance lengths of ~5-7 tokens at block 8-16 "
            "with temperature 0; alpha=0.88 gives 5.7 tokens per step at k=8",
        ),
        kv_budget_gib=65.0,
    ),
    # Flash-Next's shape is not public. Assumed Qwen3-Next-80B-like attention: 48 layers (12 full
    # attention), 16 query / 2 KV heads of 256, 512 experts with 10 routed; 118B in experts + ~3.7B per-token
    # non-expert weights (lm_head ~1.0B) = ~6B active. The 51B n-gram embedding lives on NVMe
    # (VLLM_PLE_TABLE_MEMORY=disk): a few rows per token, never streamed per step.
    "Qwen3.8-Flash-Next": ModelSpec(
        name="Qwen3.8-Flash-Next",
        total_params=125e9,
        active_params=6.0e9,
        lm_head_params=248320 * 4096,
        weight_bytes_per_param=NVFP4_BYTES_PER_PARAM,
        num_experts=512,
        experts_per_token=10,
        expert_params=118e9,
        layers=48,
        full_attention_layers=12,
        q_heads=16,
        kv_heads=2,
        head_dim=256,
        kv_dtype_bytes=1,
        linear_state_bytes=_gdn_state_bytes(36, 32, conv_dim=8192),
        spec=SpecDecode(
            kind="mtp",
            draft_tokens=4,
            acceptance=0.70,
            # The 4B MTP module is one MoE block: per pass it reads attention + 10 routed experts.
            draft_params=110e6 + 10 * 118e9 / 48 / 512,
            draft_flops_params=110e6 + 11 * 118e9 / 48 / 512,
            source="assumption: a 4-deep MTP chain accepts less per token than a 3-deep one "
            "(later drafts condition on earlier guesses); alpha=0.70 at k=4 gives 2.8 tokens",
        ),
        kv_budget_gib=17.33,
        notes="shape assumed; n-gram embedding on NVMe not modelled per step",
    ),
}


# --- Step physics -----------------------------------------------------------------------


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
        one = max(per_pass / box.effective_bandwidth, flops / box.dense_flops) + box.forward_overhead_s
        seconds += sd.draft_passes * one
        total_bytes += sd.draft_passes * per_pass
    if prefill_tokens:
        seconds += 2 * sd.draft_flops_params * prefill_tokens / box.dense_flops
    return seconds, total_bytes


def step_cost(
    box: BoxSpec,
    model: ModelSpec,
    decode_contexts: Sequence[int],
    prefill_chunks: Sequence[tuple[int, int, bool]] = (),
) -> StepCost:
    """Time of one continuous-batching step.

    decode_contexts: the KV length of each decoding sequence (each verifies k+1 positions).
    prefill_chunks: (tokens already cached, chunk length, whether the chunk ends the prompt).
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
    nbytes = weight_bytes_touched(model, tokens, sampled, 1.0 if n_pre else box.routing_locality)
    # Decode: read each context's KV; GDN reads its state and writes one per verified position
    # (vLLM keeps a state per speculative position so a rejection can roll back).
    nbytes += sum(c * kvt + state * (1 + k1) for c in decode_contexts)
    # Prefill: read the cached prefix's KV, write the chunk's, carry the state through.
    nbytes += sum((c + n) * kvt + 2 * state for c, n, _ in prefill_chunks)
    dense = 2 * (model.shared_params - model.lm_head_params) * tokens + 2 * model.lm_head_params * sampled
    expert = 2 * model.active_expert_params * tokens
    attn = sum(attention_flops(model, c, k1) for c in decode_contexts)
    attn += sum(attention_flops(model, c, n) for c, n, _ in prefill_chunks)
    compute_s = dense / box.dense_flops + attn / box.attention_flops
    # Expert GEMMs are slow only when each expert sees many rows (prefill); decode is memory-bound anyway.
    compute_s += expert / (box.dense_flops * (box.moe_gemm_efficiency if n_pre else 1.0))
    memory_s = nbytes / box.effective_bandwidth
    draft_s, draft_bytes = _draft_cost(box, model, n_dec, n_pre)
    seconds = max(memory_s, compute_s) + draft_s + box.step_overhead_s
    return StepCost(
        seconds=seconds,
        memory_s=memory_s,
        compute_s=compute_s,
        draft_s=draft_s,
        overhead_s=box.step_overhead_s,
        bytes=nbytes + draft_bytes,
        flops=dense + expert + attn,
        tokens=tokens,
    )


def decode_step_cost(box: BoxSpec, model: ModelSpec, contexts: Sequence[int]) -> StepCost:
    """A pure decode step (no prefill in the batch)."""
    return step_cost(box, model, contexts)


# --- KV pool ------------------------------------------------------------------------------


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def block_hashes(token_ids: Sequence[int], block_size: int, salt: str | None) -> list[bytes]:
    """Chain hashes of the prompt's full blocks: each covers its tokens and its parent's hash,
    seeded with the salt, so a hit means the whole prefix (and the salt) is identical."""
    parent = hashlib.sha256(b"sparkgate-sim:" + (salt or "").encode() + (b"\x01" if salt else b"\x00")).digest()
    out: list[bytes] = []
    for i in range(len(token_ids) // block_size):
        chunk = token_ids[i * block_size : (i + 1) * block_size]
        parent = hashlib.sha256(parent + b",".join(str(t).encode() for t in chunk)).digest()
        out.append(parent)
    return out


class BlockPool:
    """vLLM-style block pool: block 0 is the null block; freed blocks that carry a prefix
    hash stay cached (evictable, least recently freed first) until their id is reused."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free: list[int] = list(range(num_blocks - 1, 0, -1))  # pop() hands out 1, 2, ...
        self._ref: dict[int, int] = {}
        self._hash_of: dict[int, bytes] = {}
        self._by_hash: dict[bytes, int] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced, oldest first
        self.evictions = 0

    @property
    def usable(self) -> int:
        return self.num_blocks - 1

    @property
    def available(self) -> int:
        """Blocks a new allocation can get: free ones plus evictable cached ones."""
        return len(self._free) + len(self._lru)

    @property
    def in_use(self) -> int:
        return self.usable - self.available

    @property
    def cached(self) -> int:
        return len(self._by_hash)

    def lookup(self, hashes: Sequence[bytes]) -> list[int]:
        """The cached blocks of the longest prefix of `hashes`."""
        hits: list[int] = []
        for h in hashes:
            block = self._by_hash.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def is_evictable(self, block: int) -> bool:
        return block in self._lru

    def touch(self, block: int) -> None:
        """A request takes a reference on a cached block (a prefix hit)."""
        self._lru.pop(block, None)
        self._ref[block] = self._ref.get(block, 0) + 1

    def allocate(self) -> int:
        if self._free:
            block = self._free.pop()
        elif self._lru:
            block, _ = self._lru.popitem(last=False)
            del self._by_hash[self._hash_of.pop(block)]
            self.evictions += 1
        else:
            raise RuntimeError("KV pool exhausted: admission let a request over-commit")
        self._ref[block] = 1
        return block

    def register(self, block: int, block_hash: bytes) -> None:
        """Make a full prompt block findable by later requests (first writer wins)."""
        if block_hash not in self._by_hash and block not in self._hash_of:
            self._by_hash[block_hash] = block
            self._hash_of[block] = block_hash

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference on each block; tail blocks first, so a chain's end is evicted first."""
        for block in reversed(blocks):
            self._ref[block] -= 1
            if self._ref[block] == 0:
                del self._ref[block]
                if block in self._hash_of:
                    self._lru[block] = None
                else:
                    self._free.append(block)


# --- Scheduler ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestEvent:
    """What one request got from one step."""

    request_id: str
    new_tokens: int  # output tokens emitted at the end of this step
    first_token: bool  # this step emitted the request's first token
    finished: bool
    prompt_tokens: int
    num_cached_tokens: int


@dataclass(frozen=True, slots=True)
class StepResult:
    start: float
    end: float
    cost: StepCost
    events: tuple[RequestEvent, ...]
    prefill_tokens: int
    decode_seqs: int
    blocks_in_use: int  # pool blocks held at the step's end, before finished requests let go

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(eq=False)
class _Request:
    request_id: str
    prompt: tuple[int, ...]
    max_tokens: int
    arrival: float
    salt: str | None
    hashes: list[bytes]
    peak_blocks: int  # blocks the sequence holds at its peak: cdiv(P + M - 1, bs)
    blocks: list[int] = field(default_factory=list)
    computed: int = 0  # prompt tokens whose KV exists (cached or computed)
    cached_tokens: int = 0
    generated: int = 0
    credit: float = 0.0  # fractional accepted tokens carried between steps

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def prefilling(self) -> bool:
        return self.computed < self.prompt_len


# A simulated engine's scheduler budget per step (its prefill chunk) when its config sets none.
STEP_TOKENS = 4096


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    max_num_seqs: int = 4
    max_num_batched_tokens: int = STEP_TOKENS
    max_model_len: int = 262144
    kv_cache_bytes: int | None = None  # default: the model's KV budget
    enable_prefix_caching: bool = True
    # vLLM's --long-prefill-token-threshold: while others run or wait, a prefill takes at
    # most this many tokens a step, so a short prompt need not wait for a long one (0: off).
    long_prefill_token_threshold: int = 0


class BoxSim:
    """vLLM's v1 scheduler on the box model, in virtual seconds.

    Each `step()` runs one engine step: running requests first (decodes verify k+1
    positions, unfinished prefills take the next chunk), then waiting requests in FCFS
    order while a sequence slot, token budget and KV blocks remain. Admission reserves a
    request's whole peak, so nothing is ever preempted; a request that does not fit waits.
    The linear-attention state of max_num_seqs sequences is reserved from the KV budget up
    front (as vLLM's Mamba cache is per slot), so the block pool holds attention KV only.
    """

    def __init__(self, model: ModelSpec, box: BoxSpec = DGX_SPARK, config: SimConfig | None = None) -> None:
        self.model = model
        self.box = box
        self.config = config or SimConfig()
        self.block_size = box.block_size
        self.bytes_per_block = model.kv_bytes_per_token * self.block_size
        budget = self.config.kv_cache_bytes or int(model.kv_budget_gib * GiB)
        self.kv_cache_bytes = budget
        pool_bytes = budget - self.config.max_num_seqs * model.linear_state_bytes
        if pool_bytes < 2 * self.bytes_per_block:
            raise ValueError(
                f"KV budget {budget} B cannot hold the linear state of {self.config.max_num_seqs} sequences"
            )
        self.pool = BlockPool(pool_bytes // self.bytes_per_block)
        self.now = 0.0
        self._future: list[_Request] = []  # arrival > now
        self._waiting: list[_Request] = []
        self._running: list[_Request] = []
        self._ids: set[str] = set()
        self.steps = 0
        self.generation_tokens = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    # -- facts ------------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting) + len(self._future)

    @property
    def kv_usage(self) -> float:
        return self.pool.in_use / self.pool.usable

    @property
    def has_work(self) -> bool:
        return bool(self._running or self._waiting or self._future)

    def kv_spec(self) -> KVSpec:
        """The pool as `policies.kv` reads it: one full-attention group over the full-attention
        layers (the linear state is reserved outside the pool, so it costs no blocks)."""
        m = self.model
        page = 2 * self.block_size * m.kv_heads * m.head_dim * m.kv_dtype_bytes
        return KVSpec(
            block_size=self.block_size,
            num_blocks=self.pool.num_blocks,
            bytes_per_block=self.bytes_per_block,
            kv_cache_bytes=self.pool.num_blocks * self.bytes_per_block,
            cache_dtype="fp8" if m.kv_dtype_bytes == 1 else "bfloat16",
            groups=(
                KVGroup(
                    kind="full_attention",
                    num_layers=m.full_attention_layers,
                    block_size=self.block_size,
                    page_bytes_per_layer=page,
                ),
            ),
            max_model_len=self.config.max_model_len,
            prefix_caching=self.config.enable_prefix_caching,
            max_num_seqs=self.config.max_num_seqs,
            max_num_batched_tokens=self.config.max_num_batched_tokens,
            long_prefill_token_threshold=self.config.long_prefill_token_threshold,
        )

    def blocks_held(self, request_id: str) -> int:
        for r in self._running:
            if r.request_id == request_id:
                return len(r.blocks)
        return 0

    # -- requests -----------------------------------------------------------------------

    def submit(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        arrival_time: float | None = None,
        cache_salt: str | None = None,
    ) -> None:
        if request_id in self._ids:
            raise ValueError(f"duplicate request id {request_id!r}")
        if not prompt_token_ids or max_tokens < 1:
            raise ValueError("a request needs at least one prompt token and max_tokens >= 1")
        if len(prompt_token_ids) + max_tokens > self.config.max_model_len:
            raise ValueError(f"prompt + max_tokens exceed max_model_len {self.config.max_model_len}")
        peak = cdiv(len(prompt_token_ids) + max_tokens - 1, self.block_size)
        if peak > self.pool.usable:
            raise ValueError(f"request needs {peak} KV blocks, the pool has {self.pool.usable}")
        arrival = self.now if arrival_time is None else arrival_time
        caching = self.config.enable_prefix_caching
        req = _Request(
            request_id=request_id,
            prompt=tuple(prompt_token_ids),
            max_tokens=max_tokens,
            arrival=arrival,
            salt=cache_salt,
            hashes=block_hashes(prompt_token_ids, self.block_size, cache_salt) if caching else [],
            peak_blocks=peak,
        )
        self._ids.add(request_id)
        if arrival > self.now:
            self._future.append(req)
            self._future.sort(key=lambda r: r.arrival)
        else:
            self._waiting.append(req)

    def abort(self, request_id: str) -> bool:
        """Drop a request wherever it is; its blocks go back (cached ones stay cached)."""
        for queue in (self._running, self._waiting, self._future):
            for r in queue:
                if r.request_id == request_id:
                    queue.remove(r)
                    self._finish(r)
                    return True
        return False

    def advance_to(self, t: float) -> None:
        """Let virtual time pass while the engine is idle (or catch up to a clock)."""
        if not self._running and not self._waiting:
            self.now = max(self.now, t)

    # -- the step -------------------------------------------------------------------------

    def _outstanding(self) -> int:
        return sum(r.peak_blocks - len(r.blocks) for r in self._running)

    def _try_admit(self, req: _Request) -> bool:
        """Admit if the request's peak fits beside every running request's remaining peak."""
        max_hit = (req.prompt_len - 1) // self.block_size  # vLLM computes at least one token
        hits = self.pool.lookup(req.hashes[:max_hit]) if self.config.enable_prefix_caching else []
        revived = sum(1 for b in hits if self.pool.is_evictable(b))
        need = req.peak_blocks - len(hits) + revived
        if need > self.pool.available - self._outstanding():
            return False
        for b in hits:
            self.pool.touch(b)
        req.blocks = list(hits)
        req.computed = req.cached_tokens = len(hits) * self.block_size
        if self.config.enable_prefix_caching:
            self.prefix_cache_queries += req.prompt_len
            self.prefix_cache_hits += req.cached_tokens
        return True

    def _grow(self, req: _Request, kv_tokens: int) -> None:
        """Hold blocks for `kv_tokens` tokens of KV (never past the reserved peak)."""
        want = min(cdiv(kv_tokens, self.block_size), req.peak_blocks)
        while len(req.blocks) < want:
            req.blocks.append(self.pool.allocate())
        full = min(req.computed, req.prompt_len) // self.block_size
        for i in range(min(full, len(req.hashes))):
            self.pool.register(req.blocks[i], req.hashes[i])

    def _finish(self, req: _Request) -> None:
        self.pool.release(req.blocks)
        req.blocks = []
        self._ids.discard(req.request_id)

    def _release_arrivals(self) -> None:
        while self._future and self._future[0].arrival <= self.now:
            self._waiting.append(self._future.pop(0))

    def _schedule(self) -> tuple[list[_Request], list[tuple[_Request, int]]]:
        """(decoding requests, (prefilling request, chunk)) for this step."""
        budget = self.config.max_num_batched_tokens
        k1 = self.model.spec.draft_tokens + 1
        # As vLLM: the cap applies only when another request runs or waits (nobody to starve otherwise).
        cap = self.config.long_prefill_token_threshold if len(self._running) + len(self._waiting) > 1 else 0
        decodes: list[_Request] = []
        chunks: list[tuple[_Request, int]] = []

        def chunk(r: _Request, budget: int) -> int:
            n = r.prompt_len - r.computed
            return min(n, cap, budget) if cap else min(n, budget)

        for r in self._running:
            if budget <= 0:
                break
            if r.prefilling:
                n = chunk(r, budget)
                chunks.append((r, n))
                budget -= n
            else:
                decodes.append(r)
                budget -= k1
        while self._waiting and budget > 0 and len(self._running) < self.config.max_num_seqs:
            req = self._waiting[0]
            if not self._try_admit(req):
                break  # FCFS: nobody overtakes a request that is waiting for blocks
            self._waiting.pop(0)
            self._running.append(req)
            n = chunk(req, budget)
            chunks.append((req, n))
            budget -= n
        return decodes, chunks

    def step(self) -> StepResult:
        """Run one engine step (jumping over idle time to the next arrival, if any)."""
        self._release_arrivals()
        if not self._running and not self._waiting and self._future:
            self.now = self._future[0].arrival
            self._release_arrivals()
        decodes, chunks = self._schedule()
        start = self.now
        cost = step_cost(
            self.box,
            self.model,
            [r.prompt_len + r.generated - 1 for r in decodes],
            [(r.computed, n, r.computed + n == r.prompt_len) for r, n in chunks],
        )
        self.now = start + cost.seconds
        if cost.tokens:
            self.steps += 1
        events = [self._after_prefill(r, n) for r, n in chunks]
        events += [self._after_decode(r) for r in decodes]
        in_use = self.pool.in_use
        done = {e.request_id for e in events if e.finished}
        for r in [r for r in self._running if r.request_id in done]:
            self._running.remove(r)
            self._finish(r)
        return StepResult(
            start=start,
            end=self.now,
            cost=cost,
            events=tuple(e for e in events if e.new_tokens or e.finished),
            prefill_tokens=sum(n for _, n in chunks),
            decode_seqs=len(decodes),
            blocks_in_use=in_use,
        )

    def _event(self, r: _Request, new: int, first: bool) -> RequestEvent:
        self.generation_tokens += new
        return RequestEvent(
            request_id=r.request_id,
            new_tokens=new,
            first_token=first,
            finished=r.generated >= r.max_tokens,
            prompt_tokens=r.prompt_len,
            num_cached_tokens=r.cached_tokens,
        )

    def _after_prefill(self, r: _Request, n: int) -> RequestEvent:
        r.computed += n
        self._grow(r, r.computed)
        if r.prefilling:
            return self._event(r, 0, False)
        r.generated = 1  # the step that completes the prompt samples the first token
        return self._event(r, 1, True)

    def _after_decode(self, r: _Request) -> RequestEvent:
        sd = self.model.spec
        r.credit += sd.expected_tokens
        accepted = max(1, min(sd.draft_tokens + 1, math.floor(r.credit)))
        r.credit -= accepted
        new = min(accepted, r.max_tokens - r.generated)
        r.generated += new
        self._grow(r, r.prompt_len + r.generated - 1)
        return self._event(r, new, False)

    def run_until_idle(self, max_steps: int = 10_000_000) -> list[StepResult]:
        """Step until every submitted request has finished (for benchmarks and tests)."""
        results: list[StepResult] = []
        while self.has_work and len(results) < max_steps:
            results.append(self.step())
        return results
