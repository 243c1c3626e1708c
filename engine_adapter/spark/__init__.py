"""A first-principles model of one NVIDIA DGX Spark serving one model with vLLM.

Pure and synchronous: no asyncio, no wall clock. By concern:

- `hardware`: the box's specs and the global efficiency constants (`BoxSpec`, `DGX_SPARK`);
- `catalogue`: the served models' shapes and speculative decoders (`ModelSpec`, `MODELS`);
- `physics`: step-time physics (`step_cost`, `decode_step_cost`): memory-bound decode,
  compute-bound prefill, speculative decoding;
- `block_pool`: the KV block pool with a salt-aware prefix cache and LRU eviction;
- `scheduler`: `BoxSim`, vLLM's scheduler in virtual time.

Reference: /work/shared/reference/dgx-spark.md and benchmarks/sim_vs_measured.py.
"""

from engine_adapter.spark.block_pool import BlockPool, block_hashes, cdiv
from engine_adapter.spark.catalogue import MODELS, NVFP4_BYTES_PER_PARAM, ModelSpec, SpecDecode
from engine_adapter.spark.hardware import (
    ATTENTION_FLOPS,
    BANDWIDTH_EFFICIENCY,
    DENSE_FLOPS,
    DGX_SPARK,
    FORWARD_OVERHEAD_S,
    FRONTEND_LATENCY_S,
    MOE_GEMM_EFFICIENCY,
    ROUTING_LOCALITY,
    STEP_OVERHEAD_S,
    BoxSpec,
    GiB,
)
from engine_adapter.spark.physics import (
    StepCost,
    attention_flops,
    decode_step_cost,
    distinct_experts,
    step_cost,
    weight_bytes_touched,
)
from engine_adapter.spark.scheduler import STEP_TOKENS, BoxSim, RequestEvent, SimConfig, StepResult

__all__ = [
    "ATTENTION_FLOPS",
    "BANDWIDTH_EFFICIENCY",
    "DENSE_FLOPS",
    "DGX_SPARK",
    "FORWARD_OVERHEAD_S",
    "FRONTEND_LATENCY_S",
    "MODELS",
    "MOE_GEMM_EFFICIENCY",
    "NVFP4_BYTES_PER_PARAM",
    "ROUTING_LOCALITY",
    "STEP_OVERHEAD_S",
    "STEP_TOKENS",
    "BlockPool",
    "BoxSim",
    "BoxSpec",
    "GiB",
    "ModelSpec",
    "RequestEvent",
    "SimConfig",
    "SpecDecode",
    "StepCost",
    "StepResult",
    "attention_flops",
    "block_hashes",
    "cdiv",
    "decode_step_cost",
    "distinct_experts",
    "step_cost",
    "weight_bytes_touched",
]
