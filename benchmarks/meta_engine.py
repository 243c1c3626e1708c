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
"""

from __future__ import annotations

from typing import Any

from vllm.v1.executor.uniproc_executor import UniProcExecutor
from vllm.v1.outputs import ModelRunnerOutput

# The token every step samples: a plain word piece, so detokenized output stays printable.
SAMPLED_TOKEN = 1000


def patch_qwen4_exp_for_cpu() -> None:
    """The three things between the CPU build and a Qwen4Exp model on the meta device:

    1. vllm/model_executor/models/qwen3_vl.py imports transformers' torchvision image
       processor (torchvision is not installed here): `cpu_shims/sitecustomize.py` serves
       its PIL twin (put that folder on PYTHONPATH for processes this call cannot reach);
    2. common/ngram_embedding.py allocates the PLE table in pinned memory by default
       (`engram_config.cpu_offload`), which needs an accelerator: the caller passes
       `engram_config={"cpu_offload": False}` (`QWEN4_EXP_CPU_ARGS`);
    3. nvidia/qsa.py refuses to build without FlashAttention, which no forward here needs;

    and vLLM's registry inspects a model class in a fresh interpreter (to keep CUDA out of
    the caller), which would miss patch 1: on the CPU build it inspects in this process.
    Call it in the process that creates the engine's config; `MetaExecutor` calls it in
    the engine core's.
    """
    import importlib

    from vllm.model_executor.models import registry

    registry._run_in_subprocess = lambda fn: fn()  # type: ignore[attr-defined]

    importlib.import_module("benchmarks.cpu_shims.sitecustomize")  # patch 1, for this process
    from vllm.models.qwen4_exp.nvidia import model as _model  # noqa: F401  (qsa imports it first)
    from vllm.models.qwen4_exp.nvidia import qsa

    qsa.is_flash_attn_varlen_func_available = lambda: True  # type: ignore[attr-defined]


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

    def compile_or_warm_up_model(self) -> None:
        return None

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
        return ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled,
        )

    def check_health(self) -> None:
        return None
