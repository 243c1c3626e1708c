"""A first-principles model of one box (an NVIDIA DGX Spark by default) serving one model with vLLM.

Pure and synchronous: no asyncio, no wall clock. By concern:

- `hardware`: a box's public specs and kernel-path efficiencies (`BoxSpec`; built in:
  `DGX_SPARK`, the default, and `H200`) and the serving settings (`Serving`);
- `catalogue`: the served models' shapes and speculative decoders (`ModelSpec`, `MODELS`);
- `physics`: step-time physics (`step_cost`, `decode_step_cost`): memory-bound decode,
  compute-bound prefill, speculative decoding;
- `block_pool`: the KV block pool with a salt-aware prefix cache and LRU eviction;
- `scheduler`: `BoxSim`, vLLM's scheduler in virtual time.

Reference: /work/shared/reference/dgx-spark.md and benchmarks/sim_vs_measured.py.
"""

from engine_adapter.spark.block_pool import BlockPool, block_hashes, cdiv
from engine_adapter.spark.catalogue import MODELS, NO_SPEC, NVFP4_BYTES_PER_PARAM, ModelSpec, SpecDecode
from engine_adapter.spark.hardware import (
    BOXES,
    DGX_SPARK,
    H200,
    KV_BYTES,
    TRAINED_ROUTING_LOCALITY,
    WEIGHT_BYTES,
    BoxSpec,
    GiB,
    KVDtype,
    Serving,
    WeightDtype,
)
from engine_adapter.spark.physics import (
    StepCost,
    attention_flops,
    decode_step_cost,
    distinct_experts,
    step_cost,
    weight_bytes_touched,
)
from engine_adapter.spark.scheduler import STEP_TOKENS, BoxSim, RequestEvent, SimConfig, StepResult, kv_budget

__all__ = [
    "BOXES",
    "DGX_SPARK",
    "H200",
    "KV_BYTES",
    "MODELS",
    "NO_SPEC",
    "NVFP4_BYTES_PER_PARAM",
    "STEP_TOKENS",
    "TRAINED_ROUTING_LOCALITY",
    "WEIGHT_BYTES",
    "BlockPool",
    "BoxSim",
    "BoxSpec",
    "GiB",
    "KVDtype",
    "ModelSpec",
    "RequestEvent",
    "Serving",
    "SimConfig",
    "SpecDecode",
    "StepCost",
    "StepResult",
    "WeightDtype",
    "attention_flops",
    "block_hashes",
    "cdiv",
    "decode_step_cost",
    "distinct_experts",
    "kv_budget",
    "step_cost",
    "weight_bytes_touched",
]
