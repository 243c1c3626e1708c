"""The model catalogue: the served Qwen models' shapes, what a token costs them in bytes
and FLOPs, and their speculative decoders."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

from engine_adapter.spark.hardware import KV_BYTES, WEIGHT_BYTES, Serving, WeightDtype

NVFP4_BYTES_PER_PARAM = WEIGHT_BYTES["nvfp4"]


@dataclass(frozen=True, kw_only=True)
class SpecDecode:
    """A speculative decoder: k draft tokens per step, each accepted with probability alpha."""

    kind: Literal["mtp", "dflash", "none"]  # mtp: k sequential draft passes; dflash: one parallel block pass
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
        if self.kind == "none":
            return 0
        return self.draft_tokens if self.kind == "mtp" else 1


# Speculative decoding off: one position per sequence per step, nothing drafted.
NO_SPEC = SpecDecode(
    kind="none", draft_tokens=0, acceptance=0.0, draft_params=0.0, draft_flops_params=0.0, source="off"
)


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """One served model: what a token costs in bytes and FLOPs."""

    name: str
    total_params: float  # resident parameters (Flash-Next's n-gram table excluded: `ple_table_params`)
    active_params: float  # multiplied per token, lm_head included, embeddings excluded
    lm_head_params: float  # part of active_params, only computed for sampled positions
    weight_dtype: WeightDtype = "nvfp4"
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
    # Bytes per token per full-attention layer kept beside K/V whatever the KV dtype (Qwen4Exp's
    # QSA compressed indexer keys: 64); 0 for plain attention.
    indexer_bytes_per_token: int = 0
    # KV cache groups of recurrent state (GDN, short conv) whose blocks the box model draws from
    # the pool as vLLM 0.32 does, and per-request ring groups (one block for a request's life,
    # never prefix-cached). 0: the linear state is reserved per sequence slot outside the pool
    # (the Qwen3.6 figures were fitted and pinned that way; BoxSim).
    state_groups: int = 0
    ring_groups: int = 0
    # Sparse attention (Qwen4Exp's QSA): a lightning indexer of `indexer_heads` x `indexer_head_dim`
    # scores each query against the context's keys compressed `indexer_compress_ratio` to one, and
    # the query attends only the top `sparse_attention_budget` tokens of it (whole compressed blocks)
    # plus the open block's tail (`attended_keys`). 0: dense attention, no indexer.
    sparse_attention_budget: int = 0
    indexer_heads: int = 0
    indexer_head_dim: int = 0
    indexer_compress_ratio: int = 1
    # Parameters of an n-gram embedding table outside `total_params` (the memory plan counts it
    # where it is resident), and what one step reads of it: `ple_rows_per_token` rows of
    # `ple_row_bytes` per token in the step, which cost step time only when the table is read from
    # the drive (`SimConfig.ple_table_on_disk`, `physics.ple_read_seconds`).
    ple_table_params: float = 0.0
    ple_rows_per_token: int = 0
    ple_row_bytes: int = 0
    notes: str = ""

    @property
    def weight_bytes_per_param(self) -> float:
        return WEIGHT_BYTES[self.weight_dtype]

    def served(self, serving: Serving) -> ModelSpec:
        """This model as an engine with these settings serves it: weight and KV dtypes, and its
        speculative decoder or none."""
        return dataclasses.replace(
            self,
            weight_dtype=serving.weight_dtype,
            kv_dtype_bytes=KV_BYTES[serving.kv_dtype],
            spec=self.spec if serving.spec_decode else NO_SPEC,
        )

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
        """K/V of every full-attention layer, plus what those layers keep per token beside it."""
        per_layer = 2 * self.kv_heads * self.head_dim * self.kv_dtype_bytes + self.indexer_bytes_per_token
        return self.full_attention_layers * per_layer

    @property
    def weight_bytes(self) -> float:
        return self.total_params * self.weight_bytes_per_param

    @property
    def vllm_block_size(self) -> int:
        """The KV block vLLM gives this model: 16 tokens, or for a hybrid model the attention
        block stretched (in 16-token steps) until one layer's K/V page holds one linear-attention
        layer's state (vLLM's CUDA rule, vllm/platforms/interface.py; the CPU build starts at
        128): 2,096 / 1,568 / 3,136 tokens for the 35B-A3B, 27B and Flash-Next with FP8 KV."""
        linear = self.layers - self.full_attention_layers
        if not self.linear_state_bytes or linear <= 0:
            return 16
        page_per_token = 2 * self.kv_heads * self.head_dim * self.kv_dtype_bytes
        return 16 * math.ceil(self.linear_state_bytes / linear / (16 * page_per_token))


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
    # Flash-Next is vLLM 0.32's Qwen4Exp architecture (vllm/models/qwen4_exp/; its kernels say
    # "tuned on SM100f for Qwen3.8-Flash-Next"). No official config.json is public; the shape is read
    # from vLLM 0.32's sources and the public GGUF metadata, which agree (reference:
    # docs/kv-footprint.md section 7a):
    # - nvidia/low_latency_gemm.py:27-140 (TP=4 decode GEMM plans, widths x4): GDN QKVZ
    #   16384 = 2*16*128 + 2*48*128 (16 key / 48 value heads of 128), B/A 96 = 2*48; out proj
    #   6144 = 48*128 = 24 q heads * 256; QSA QKV+gate 2*24*256, K/V 2 heads * 256, indexer
    #   (4+1)*128; shared expert 640; lm_head 248320 x 2560 (hidden 2560).
    # - model_executor/layers/fused_moe/oracle/mxfp4.py:585-590: routed experts E=512, H=2560, N=640.
    # - GGUF metadata: block_count 49 (48 + 1 MTP layer), head_count 24, head_count_kv 2,
    #   key_length 256, embedding 2560, experts 512 / 640 used 10 (+ 1 shared), ssm inner 6144,
    #   group 16, indexer 4 heads x 128, compress_ratios 4 on every 4th layer; vocab 248,320.
    #   Public pages (SGLang, NVIDIA Dynamo, Unsloth): 125B + 51B n-gram table (+4B MTP), 6B active.
    # KV (0.32: nvidia/qsa.py:543, common/qsa_cache.py:844,868, nvidia/model.py:797-849; 0.34
    # renamed qsa_cache.py to common/qsa_indexer.py: :848 ring, :872 compressed; nvidia/qsa.py:493):
    # 12 QSA layers keep K/V (2 x 2 x 256 per token) and compressed indexer keys (head 128, bf16, one state per 4
    # tokens: 64 B per token, whatever the KV dtype): 13,056 B per token with FP8 KV. 36 GDN layers
    # hold conv (3, 10240) bf16 + ssm (48, 128, 128) fp32 = 3,207,168 B each, so vLLM's block is
    # 3,136 tokens on CUDA with FP8 KV, and one block id costs 12 x (3136 x 1024 + 3136 x 64) =
    # 40,943,616 B (vLLM 0.32 v1/core/kv_cache_utils.py, _get_packed_kv_cache_groups, packs one
    # layer of each group per block; 0.33 moved it to v1/core/kv_cache_planning.py).
    # Groups (measured with vLLM 0.32's scheduler, model on the meta device): 3 GDN (12 layers
    # each), 1 PLE short-conv state (layer 2, MambaSpec (9, 10240)), 1 QSA raw-key ring
    # (CircularBufferSpec: one block per request, not prefix-cacheable), 1 attention (12 K/V +
    # 12 compressed). A request peaks at 6 blocks if its tokens fit one block, else F + 9 with
    # prefix caching (mamba "align": 4 state groups x 2 + the ring), F + 5 without.
    # Params counted from that shape: experts 48 x 512 x 3 x 2560 x 640 = 120.8B, GDN 2.09B, QSA
    # 0.62B, shared experts 0.24B, routers 0.06B, embedding and lm_head 0.64B each: 125.1B resident
    # (the ~4B MTP module not counted, as before); per token 10 of 512 experts (2.36B) + 3.64B
    # (lm_head included) = 6.0B. The PLE n-gram table (320,001,536 x 160 = 51.2B params,
    # ngram_embedding.py:122-139) is not in total_params: `ple_table_params`. Each token in a step
    # looks up (ngram_size 3 - 1) x heads_per_ngram 8 = 16 of its rows of 2560 / 16 = 160 values.
    # QSA (config indexer_budget 2048, indexer_compress_ratio 4, indexer 4 heads x 128; vLLM 0.34
    # models/qwen4_exp/nvidia/qsa_indexer.py QSAIndexer): each query attends the top 512 compressed
    # blocks of 4 tokens plus the open block's tail: all of its context up to 2,051 tokens.
    "Qwen3.8-Flash-Next": ModelSpec(
        name="Qwen3.8-Flash-Next",
        total_params=125.1e9,
        active_params=6.0e9,
        lm_head_params=248320 * 2560,
        num_experts=512,
        experts_per_token=10,
        expert_params=48 * 512 * 3 * 2560 * 640,
        layers=48,
        full_attention_layers=12,
        q_heads=24,
        kv_heads=2,
        head_dim=256,
        kv_dtype_bytes=1,
        linear_state_bytes=_gdn_state_bytes(36, 48, conv_dim=10240),
        indexer_bytes_per_token=128 * 2 // 4,  # compressed keys: head 128, bf16, 1 per 4 tokens
        sparse_attention_budget=2048,  # indexer_budget: top 512 blocks of 4 (+ the open block's tail)
        indexer_heads=4,
        indexer_head_dim=128,
        indexer_compress_ratio=4,
        state_groups=4,  # 3 GDN groups of 12 layers + the PLE short-conv state
        ring_groups=1,  # the QSA raw-key ring
        ple_table_params=320_001_536 * 160,
        ple_rows_per_token=(3 - 1) * 8,  # (ngram_size - 1) x heads_per_ngram
        ple_row_bytes=160,  # 2560 / 16 values per row, FP8 (the table's dtype in the deployment)
        spec=SpecDecode(
            kind="mtp",
            draft_tokens=4,
            acceptance=0.70,
            # The MTP module is one MoE block: per pass it reads attention + 10 routed experts.
            draft_params=110e6 + 10 * 3 * 2560 * 640,
            draft_flops_params=110e6 + 11 * 3 * 2560 * 640,
            source="assumption: a 4-deep MTP chain accepts less per token than a 3-deep one "
            "(later drafts condition on earlier guesses); alpha=0.70 at k=4 gives 2.8 tokens",
        ),
        kv_budget_gib=17.33,
        notes="shape from vLLM 0.32's Qwen4Exp and public metadata; QSA's sparse attention "
        "(top-2048 budget) and its indexer costed per step (vLLM 0.34's kernels); the n-gram "
        "table costs step time only when read from disk (SimConfig.ple_table_on_disk)",
    ),
}
