"""The box: one NVIDIA DGX Spark's specs and the box model's global efficiency constants.

The efficiency constants below are global: the same for all three models.
Reference: /work/shared/reference/dgx-spark.md and benchmarks/sim_vs_measured.py.
"""

from __future__ import annotations

from dataclasses import dataclass

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
