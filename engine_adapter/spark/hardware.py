"""The box as data: any box's public specs, the efficiencies its kernel paths reach, and the
serving settings an engine runs with. `DGX_SPARK` (the default) and `H200` are built in; a box
file (YAML, config/boxes/) describes any other one.

Reference: /work/shared/reference/dgx-spark.md, benchmarks/sim_vs_measured.py (the Spark) and
benchmarks/box_vs_h200.py (the H200, predicted from its specs alone).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

GiB = 1 << 30

WeightDtype = Literal["nvfp4", "fp8", "bf16"]
KVDtype = Literal["fp8", "bf16"]

# Bytes a weight takes in memory. NVFP4: 4-bit values plus one FP8 scale per 16 values;
# FP8: one byte (per-channel / per-block scales are noise).
WEIGHT_BYTES: dict[str, float] = {"nvfp4": 0.5 + 1 / 16, "fp8": 1.0, "bf16": 2.0}
KV_BYTES: dict[str, int] = {"fp8": 1, "bf16": 2}

# --- Efficiencies that are properties of the kernels, not of a box (shared by every box) ---
# Share of the peak bandwidth decode kernels stream: DRAM of either kind (LPDDR5x, HBM3e)
# sustains roughly 80-90% in STREAM-like copies; GEMV-style kernels over many small tensors
# land a bit lower.
BANDWIDTH_EFFICIENCY = 0.82
# Attention (FP8 or BF16 KV, BF16 softmax/PV) runs on BF16 tensor cores whatever the weights:
# paged, chunked attention reaches ~40% of the BF16 dense peak.
ATTENTION_EFFICIENCY = 0.4
# Expert GEMMs in prefill, relative to dense ones: a 4096-token chunk gives each expert only
# ~80-130 rows, and the grouped MoE path (route, permute, small per-expert tiles, un-permute)
# is tile- and latency-bound, not tensor-core bound.
MOE_GEMM_EFFICIENCY = 0.12
# Share of a layer's experts one text's decode tokens route over, with trained routers on
# English (temporal locality: consecutive tokens and concurrent requests on the same kind of
# text reuse experts). Uniform routing (1.0) would make 4 sequences x 4 verify positions touch
# 102 of 256 experts against 30 for one sequence, a 2.1x slower step; the Spark measured 1.38x.
TRAINED_ROUTING_LOCALITY = 0.1
# Fixed cost per extra forward pass (each draft pass): graph launch and sync.
FORWARD_OVERHEAD_S = 0.0004
# Engines on one box are processes of their own, and a GPU runs one process's kernels at a time:
# a step waits for a busy box-mate, at most this long. Fitted to two engines sharing one GPU (a
# short decode step beside a busy mate took about its own time plus this); a host-sync probe
# (benchmarks/gpu/timeslice.py) shows one long kernel is not stretched, so this is a step's
# total wait over its host syncs, not the GPU's slice. Figures: BENCHMARKS.md.
GPU_TIMESLICE_S = 0.010

# --- The DGX Spark's kernel path and host (GB10, sm_121, Grace cores) ---
# Dense NVFP4 GEMM rate prefill reaches: the vendor's 1 PFLOP is FP4 *with 2:4 sparsity*,
# so ~500 TFLOP/s dense peak; large-M prefill GEMMs reach about a third (NVFP4 kernels for
# sm_121 are young: tuned for datacenter Blackwell).
SPARK_GEMM_EFFICIENCY = 0.32
# Fixed cost per engine step: the synchronous scheduler (--no-async-scheduling), input
# preparation, sampling / rejection sampling and output processing on the Grace cores.
SPARK_STEP_OVERHEAD_S = 0.0025
# Latency a client sees outside the engine core: vLLM's HTTP frontend (chat template,
# tokenizing the prompt on the Grace cores, the ZMQ hop to the engine core, detokenizing,
# the SSE write). Only a benchmark through that frontend adds it.
SPARK_FRONTEND_LATENCY_S = 0.08


@dataclass(frozen=True, kw_only=True)
class BoxSpec:
    """One box: its public specs, and the share of them its kernel paths reach."""

    name: str
    memory_bytes: int  # GPU-visible memory (unified on a Spark)
    mem_bandwidth: float  # bytes/s, peak
    bf16_flops: float  # dense peak (no sparsity)
    fp8_flops: float  # dense peak
    fp4_flops: float = 0.0  # dense peak; 0: no FP4 tensor cores (FP4 weights run as W4A16 on BF16)
    bandwidth_efficiency: float = BANDWIDTH_EFFICIENCY
    gemm_efficiency: float  # share of the weight dtype's peak that large-M prefill GEMMs reach
    attention_efficiency: float = ATTENTION_EFFICIENCY  # share of the BF16 peak
    moe_gemm_efficiency: float = MOE_GEMM_EFFICIENCY  # expert GEMMs relative to dense ones
    step_overhead_s: float  # per engine step: scheduler, input prep, sampling (host CPU)
    forward_overhead_s: float = FORWARD_OVERHEAD_S  # per extra forward pass (drafts)
    frontend_latency_s: float = 0.0  # client-observed latency of vLLM's HTTP frontend
    # Host work of a step that vLLM's asynchronous scheduler overlaps with the GPU's previous step
    # and the synchronous one (`Serving.async_scheduling` False) waits for: per step, and per
    # token in the step. 0 where `step_overhead_s` was measured synchronous (the Spark).
    sync_step_s: float = 0.0
    sync_token_s: float = 0.0
    gpu_timeslice_s: float = GPU_TIMESLICE_S  # a step's own work between waits for a busy box-mate's
    gpu_mate_wait_s: float | None = None  # the longest of those waits (None: `gpu_timeslice_s`)
    # The local drive a model's table can be read from each step (`physics.ple_read_seconds`):
    # bytes/s and 4 KiB random reads/s it serves at a deep queue. 0: not given (a model whose
    # table is on disk cannot be costed on this box).
    nvme_read_bandwidth: float = 0.0
    nvme_read_iops: float = 0.0

    def __post_init__(self) -> None:
        if self.gpu_timeslice_s <= 0 or (self.gpu_mate_wait_s is not None and self.gpu_mate_wait_s <= 0):
            raise ValueError(f"box {self.name!r}: gpu_timeslice_s and gpu_mate_wait_s must be > 0")
        if min(self.sync_step_s, self.sync_token_s) < 0:
            raise ValueError(f"box {self.name!r}: sync_step_s and sync_token_s must be >= 0")
        if min(self.nvme_read_bandwidth, self.nvme_read_iops) < 0:
            raise ValueError(f"box {self.name!r}: nvme_read_bandwidth and nvme_read_iops must be >= 0")
        if min(self.memory_bytes, self.mem_bandwidth, self.bf16_flops, self.fp8_flops) <= 0:
            raise ValueError(f"box {self.name!r}: memory, bandwidth and BF16/FP8 FLOP/s must be positive")
        for f in ("bandwidth_efficiency", "gemm_efficiency", "attention_efficiency", "moe_gemm_efficiency"):
            if not 0 < getattr(self, f) <= 1:
                raise ValueError(f"box {self.name!r}: {f} must be in (0, 1]")

    @property
    def mate_wait_s(self) -> float:
        """The longest a step waits for a busy box-mate's."""
        return self.gpu_timeslice_s if self.gpu_mate_wait_s is None else self.gpu_mate_wait_s

    @property
    def effective_bandwidth(self) -> float:
        return self.mem_bandwidth * self.bandwidth_efficiency

    def peak_flops(self, weights: WeightDtype) -> float:
        """Dense tensor-core peak a GEMM over weights of this dtype runs at: FP4 weights on a
        box without FP4 units are dequantised to BF16 (Marlin-style W4A16)."""
        if weights == "nvfp4" and self.fp4_flops > 0:
            return self.fp4_flops
        return self.fp8_flops if weights == "fp8" else self.bf16_flops

    def dense_flops(self, weights: WeightDtype) -> float:
        """Achievable dense GEMM FLOP/s in prefill."""
        return self.peak_flops(weights) * self.gemm_efficiency

    @property
    def attention_flops(self) -> float:
        """Achievable attention FLOP/s."""
        return self.bf16_flops * self.attention_efficiency


@dataclass(frozen=True, kw_only=True)
class Serving:
    """How an engine serves a model on the box. The default is the DGX Spark deployment:
    NVFP4 checkpoints, FP8 KV, each model's speculative decoder, trained weights."""

    weight_dtype: WeightDtype = "nvfp4"
    kv_dtype: KVDtype = "fp8"
    spec_decode: bool = True
    block_size: int = 16  # tokens per KV block
    # vLLM's --no-async-scheduling, as the DGX Spark deployment runs (config/dgx-spark.yaml): each
    # step waits for the host's work (`BoxSpec.sync_step_s`, `sync_token_s`). The CUDA build's
    # default is asynchronous.
    async_scheduling: bool = False
    # Share of a layer's experts decode tokens route over: trained weights on text reuse
    # experts (TRAINED_ROUTING_LOCALITY); dummy (random) weights route uniformly: 1.0.
    # Prefill chunks (thousands of varied tokens) route over all experts either way.
    routing_locality: float = TRAINED_ROUTING_LOCALITY

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")
        if not 0 < self.routing_locality <= 1:
            raise ValueError("routing_locality must be in (0, 1]")


# The DGX Spark's drive. NVIDIA's spec: 4 TB NVMe M.2 with self-encryption. The drive Samsung
# announced as qualified and in mass production for the DGX Spark (Jan 2026, reported by Guru3D
# and Wccftech): PM9E1, PCIe Gen5 x4, M.2 2242, 4 TB, sequential reads up to 14,500 MB/s, random
# reads up to 2,000K IOPS. The GB10 board's M.2 slot is PCIe Gen4 (Dell Pro Max GB10 owner's
# manual: "PCIe Gen 4 NVMe", M.2 2230/2242), so the link caps reads at 4 lanes x 16 GT/s x
# 128/130 = 7.88 GB/s, i.e. 1.92M 4 KiB pages/s: below the drive's 2.0M IOPS, so the link binds.
SPARK_NVME_READ_BANDWIDTH = 4 * 16e9 * 128 / 130 / 8
SPARK_NVME_READ_IOPS = 2.0e6

# Public: 128 GB LPDDR5x at 273 GB/s; 1 PFLOP FP4 with 2:4 sparsity (500 TFLOP/s dense);
# FP8 and BF16 at half and a quarter of that.
DGX_SPARK = BoxSpec(
    name="NVIDIA DGX Spark (GB10)",
    memory_bytes=128 * GiB,
    mem_bandwidth=273e9,
    bf16_flops=125e12,
    fp8_flops=250e12,
    fp4_flops=500e12,
    gemm_efficiency=SPARK_GEMM_EFFICIENCY,
    step_overhead_s=SPARK_STEP_OVERHEAD_S,
    frontend_latency_s=SPARK_FRONTEND_LATENCY_S,
    nvme_read_bandwidth=SPARK_NVME_READ_BANDWIDTH,
    nvme_read_iops=SPARK_NVME_READ_IOPS,
)

# Public (NVIDIA H200 SXM datasheet): 141 GB HBM3e at 4.8 TB/s; 989 TFLOP/s BF16 and
# 1,979 TFLOP/s FP8 dense (the datasheet's 1,979 / 3,958 are with sparsity); no FP4 units.
H200 = BoxSpec(
    name="NVIDIA H200 SXM",
    memory_bytes=141_000_000_000,
    mem_bandwidth=4.8e12,
    bf16_flops=989e12,
    fp8_flops=1979e12,
    # Hopper's BF16 GEMMs are mature (cuBLAS/CUTLASS reach ~70% of peak at large shapes on
    # H100/H200 in public GEMM benchmarks); a prefill step also runs norms, activations, the
    # GDN scan and the GEMMs' tails between them: ~0.55 of peak over the GEMM FLOPs.
    gemm_efficiency=0.55,
    # vLLM's asynchronous scheduler (the CUDA build's default) hides the host's work behind the
    # GPU's; what stays is the GPU's own floor per step: a hybrid or MoE layer is ~20-30 small
    # kernels (norms, gates, routing, permutes, the GDN scan) at a few microseconds each even
    # inside a CUDA graph, plus sampling. Public single-stream vLLM figures for ~3B-active MoE
    # models on H100-class GPUs (~4-5 ms per token for ~2 ms of weight streaming) put it at ~2.5 ms.
    step_overhead_s=0.0025,
    # The synchronous scheduler's cost (the Spark deployment's, which the routing runs on real
    # engines keep): fitted on the 35B-A3B's requests that ran alone there against engine-direct
    # runs with async scheduling: one stream's time per token gives the per-step cost, a long
    # prompt's first token the per-token one (BENCHMARKS.md). Which host work a prefill step
    # exposes is not measured; the 27B is assumed to pay the same.
    sync_step_s=0.0018,
    sync_token_s=17e-6,
    # A step waits for a busy box-mate's at most ~6 ms, about three host syncs
    # (benchmarks/gpu/timeslice.py), not the 10 ms slice a long step's work comes in: fitted to
    # the round-robin runs on real engines, where a whole slice overstated a decode's time beside
    # a busy mate and understated round-robin's attainment (BENCHMARKS.md).
    gpu_mate_wait_s=0.006,
)

BOXES: dict[str, BoxSpec] = {"dgx-spark": DGX_SPARK, "h200": H200}
