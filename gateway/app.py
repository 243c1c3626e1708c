"""create_app(settings): the lifespan starts the engines and wires the routes."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from engine_adapter.base import Engine, KVSpec
from engine_adapter.paced import paced
from gateway import canary, heap, request_log, responses_store, vision
from gateway.admission import AdmissionControl
from gateway.auth import KeyRing
from gateway.canary_state import Result as CanaryResult
from gateway.drain import Drain
from gateway.failed_auth import FailedAuthTable
from gateway.host_memory import HostMemory, from_settings
from gateway.http import (
    admin,
    body_limits,
    dashboard,
    draining,
    ops,
    response_docs,
)
from gateway.http import errors as http_errors
from gateway.http import metrics as metrics_http
from gateway.http.anthropic.routes import SURFACE as ANTHROPIC
from gateway.http.openai.routes import SURFACE as OPENAI
from gateway.http.responses.routes import SURFACE as RESPONSES
from gateway.http.surface import Surface
from gateway.metrics import Metrics
from gateway.quota import QuotaGate
from gateway.registry import ModelRegistry, ServedModel, config_vocab_size
from gateway.router import Router
from gateway.settings import PRIORITY_CLASSES, EngineStart, ModelSettings, Settings
from gateway.state import AppState, Counters
from gateway.supervisor import SupervisedEngine, Supervisor
from gateway.text import tokenizer as fast_tokenizer
from gateway.text.templates import output_formats
from policies.demand import PoolLimits, QueueLimits

log = logging.getLogger(__name__)

# The API surfaces (gateway/http/<surface>/, docs/contributing.md): adding one is a folder
# and a line here.
SURFACES: tuple[Surface, ...] = (OPENAI, RESPONSES, ANTHROPIC)

EngineFactory = Callable[[Settings, ModelSettings], Engine]


def build_engine(settings: Settings, model: ModelSettings) -> Engine:
    """The engine a model's settings ask for (`engine:`, looked up in `ENGINES`)."""
    return ENGINES[model.engine](settings, model)


def vllm_engine(settings: Settings, model: ModelSettings) -> Engine:
    """vLLM's engine in this process."""
    from engine_adapter.vllm_local import VllmEngineConfig, VllmLocalEngine

    path = str(settings.model_path(model))
    tokenizer = model.tokenizer
    if tokenizer is not None:
        tokenizer = str(settings.model_path(model.model_copy(update={"path": tokenizer})))
    return VllmLocalEngine(
        VllmEngineConfig(
            name=model.name,
            model=path,
            tokenizer=tokenizer,
            dtype=model.dtype,
            max_model_len=model.max_model_len,
            max_num_seqs=model.max_num_seqs,
            max_num_batched_tokens=model.max_num_batched_tokens,
            long_prefill_token_threshold=model.long_prefill_token_threshold,
            kv_cache_bytes=model.kv_cache_bytes,
            kv_cache_dtype=model.kv_cache_dtype,
            enable_prefix_caching=model.enable_prefix_caching,
            enforce_eager=model.enforce_eager,
            load_format=model.load_format,
            seed=model.seed,
            cpu_cores=model.cpu_cores,
            compact_json=model.json_whitespace == "compact",
            extra_args={**vision.engine_args(model, Path(path)), **model.vllm_engine_args()},
        )
    )


def simulated_engine(settings: Settings, model: ModelSettings) -> Engine:
    from engine_adapter.simulated import SimEngineConfig, SimulatedEngine
    from engine_adapter.spark import STEP_TOKENS

    assert model.simulated is not None  # settings validation guarantees it
    return SimulatedEngine(
        SimEngineConfig(
            name=model.name,
            model=model.simulated.model,
            tokenizer=str(settings.model_path(model)),
            speedup=model.simulated.speedup,
            instant=model.simulated.instant,
            max_model_len=model.max_model_len,
            max_num_seqs=model.max_num_seqs,
            max_num_batched_tokens=model.max_num_batched_tokens or STEP_TOKENS,
            long_prefill_token_threshold=model.long_prefill_token_threshold,
            kv_cache_bytes=model.kv_cache_bytes,
            seed=model.seed,
            ple_table_on_disk=model.ple_on_disk,
        )
    )


def replay_engine(settings: Settings, model: ModelSettings) -> Engine:
    from engine_adapter.replay import ReplayEngine, ReplayEngineConfig

    config = ReplayEngineConfig(
        name=model.name,
        tokenizer=str(settings.model_path(model)),
        max_model_len=model.max_model_len,
        max_num_seqs=model.max_num_seqs,
        token_delay_s=model.replay.token_delay_s,
        recording=model.replay.recording,
        prefix_cache=model.replay.prefix_cache,
        corrupt_cached=model.replay.corrupt_cached,
    )
    # It holds no KV: its notional pool fits every slot at the whole context (an agent's request
    # with no max_tokens reserves the context), so admission never refuses what would run.
    whole = -(-model.max_model_len // config.block_size) * model.max_num_seqs + 1
    return ReplayEngine(dataclasses.replace(config, kv_blocks=max(config.kv_blocks, whole)))


def remote_engine(settings: Settings, model: ModelSettings) -> Engine:
    from engine_adapter.remote import RemoteEngine, RemoteEngineConfig

    assert model.remote is not None  # settings validation guarantees it
    r = model.remote
    return RemoteEngine(
        RemoteEngineConfig(
            name=model.name,
            address=r.address,
            token=os.environ.get(r.token_env, ""),  # `serve` refuses to start without it
            tokenizer=str(settings.model_path(model)),
            share=r.share,
            poll_interval_s=r.poll_interval_s,
            connect_timeout_s=r.connect_timeout_s,
            read_timeout_s=r.read_timeout_s,
        )
    )


def vllm_server_engine(settings: Settings, model: ModelSettings) -> Engine:
    from engine_adapter.vllm_server import VllmServerConfig, VllmServerEngine

    assert model.vllm_server is not None  # settings validation guarantees it
    v = model.vllm_server
    return VllmServerEngine(
        VllmServerConfig(
            name=model.name,
            address=v.address,
            served_model=v.served_model or model.name,
            tokenizer=str(settings.model_path(model)),
            max_num_seqs=model.max_num_seqs,
            api_key=os.environ.get(v.api_key_env) if v.api_key_env else None,  # `serve` refuses it unset
            share=v.share,
            poll_interval_s=v.poll_interval_s,
            connect_timeout_s=v.connect_timeout_s,
            read_timeout_s=v.read_timeout_s,
        )
    )


# Each engine kind of `ModelSettings.engine`: vLLM in this process, the simulated box, an
# engine host on another box, a stock vLLM server, or recorded text replayed.
ENGINES: dict[str, EngineFactory] = {
    "vllm": vllm_engine,
    "simulated": simulated_engine,
    "remote": remote_engine,
    "vllm-server": vllm_server_engine,
    "replay": replay_engine,
}


def pool_limits(model: ModelSettings, spec: KVSpec) -> PoolLimits:
    """What admission may hand out: the blocks and slots the running engine really has."""
    slots = spec.max_num_seqs if model.max_concurrency is None else min(model.max_concurrency, spec.max_num_seqs)
    return PoolLimits(name=model.name, blocks=spec.usable_blocks, max_sequences=slots)


def admission_control(settings: Settings, served: list[ServedModel]) -> AdmissionControl:
    a = settings.admission
    pools = [pool_limits(m.settings, m.engine.kv_spec) for m in served]
    for p in pools:
        log.info("admission %s: %d KV blocks, %d running sequences", p.name, p.blocks, p.max_sequences)
    return AdmissionControl(
        pools,
        QueueLimits(
            max_queued=a.max_queued,
            max_queued_tokens=a.max_queued_tokens,
            max_queued_per_user=a.max_queued_per_user,
            max_bypass=a.max_bypass,
            max_scan=a.max_scan,
            lone_backlog=a.lone_backlog,
        ),
        timeouts_s={PRIORITY_CLASSES.index(name): t for name, t in a.queue_timeout_s.items()},
        fair=a.fair_share.policy(),
    )


async def start_engines(
    engines: list[tuple[ModelSettings, Engine]], mode: EngineStart, start_s: dict[str, float]
) -> None:
    """Start the models' engines in config order or side by side (`server.engine_start`),
    each one's start time into `start_s`. If one fails, those started are shut down."""

    done: list[Engine] = []

    async def start(model: ModelSettings, engine: Engine) -> None:
        t0 = time.monotonic()
        await engine.start()
        start_s[model.name] = time.monotonic() - t0
        done.append(engine)

    try:
        if mode == "parallel":
            results = await asyncio.gather(*(start(m, e) for m, e in engines), return_exceptions=True)
            for r in results:
                if isinstance(r, BaseException):
                    raise r
        else:
            for model, engine in engines:
                await start(model, engine)
    except BaseException:
        for e in done:
            await e.shutdown()
        raise


def create_app(
    settings: Settings,
    engine_factory: EngineFactory = build_engine,
    drain: Drain | None = None,
    host_memory: HostMemory | None = None,
    surfaces: tuple[Surface, ...] = SURFACES,
) -> FastAPI:
    """The gateway's app; `drain` is the one its server's signals drive (gateway/drain.py);
    `host_memory` is what the memory guard reads (default: /proc/meminfo; a test passes its own);
    `surfaces`, the APIs it speaks (a test may plug in another)."""
    drain = Drain(settings.server.drain_grace_s) if drain is None else drain

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        served: list[ServedModel] = []
        engines: list[SupervisedEngine] = []  # every one started, served or not yet
        quota = QuotaGate.from_settings(settings.quotas)
        stored = responses_store.from_settings(settings)
        supervisor: Supervisor | None = None
        canary_task: asyncio.Future[list[CanaryResult]] | None = None
        memory = from_settings(settings.box, host_memory)
        start_s: dict[str, float] = {}
        # Verified tokenizer plans: later starts skip the seconds of checks.
        tokenizer_cache = Path(settings.base_dir) / settings.server.cache_dir / "tokenizers"
        try:
            await quota.start()
            started = [(m, paced(engine_factory(settings, m), m.token_pace_s)) for m in settings.models]
            await start_engines(started, settings.server.engine_start, start_s)
            # The supervisor swaps a restarted engine in.
            engines.extend(SupervisedEngine(e) for _, e in started)
            for (model, _), engine in zip(started, engines, strict=True):
                # Count tokens with tiktoken where it provably gives the model tokenizer's ids.
                tokenizer = await asyncio.to_thread(fast_tokenizer.wrap, engine.tokenizer, tokenizer_cache)
                formats = output_formats(tokenizer, model.tool_parser, model.reasoning_parser)
                log.info("%s: tool calls %s, reasoning %s", model.name, formats.tool_format, formats.reasoning)
                vocab = config_vocab_size(settings.model_path(model))
                sight = vision.vision_of(model, settings.model_path(model), settings.image_fetch)
                served.append(
                    ServedModel(
                        settings=model,
                        engine=engine,
                        tokenizer=tokenizer,
                        formats=formats,
                        vocab_size=vocab,
                        vision=sight,
                    )
                )
            app.state.sparkgate = state = AppState(
                settings=settings,
                registry=ModelRegistry(served),
                keys=KeyRing(settings.auth, settings.quotas, quota.lookup_key),
                counters=Counters(),
                admission=admission_control(settings, served),
                quota=quota,
                router=Router(settings.routing, served, settings.boxes()) if settings.routing.enabled else None,
                responses=stored,
                metrics=Metrics(settings.metrics) if settings.metrics.enabled else None,
                failed_auth=FailedAuthTable(settings.auth.failed),
                drain=drain,
                memory=memory,
            )
            if memory is not None:
                memory.start()
            if state.metrics is not None:
                metrics_http.bind(state.metrics, state)
            state.supervisor = supervisor = Supervisor(
                served,
                state.admission,
                lambda model: engine_factory(settings, model),
                pool_limits,
                start_s=start_s,
            )
            if state.router is not None:
                state.router.down_retry_after = supervisor.retry_after
                state.router.degraded = state.canary.degraded
            supervisor.start()
            if settings.canary.on_start:  # in the background: the models serve meanwhile
                canary_task = asyncio.ensure_future(canary.run(state))
            log.info("sparkgate ready: %s", ", ".join(m.name for m in served))
            with heap.frozen():
                yield
        finally:
            if canary_task is not None:
                canary_task.cancel()
                with contextlib.suppress(BaseException):
                    await canary_task
            if supervisor is not None:
                await supervisor.stop()  # no restart may race the shutdown below
            if memory is not None:
                await memory.stop()
            drain.begin()  # /ready: 503 while the engines shut down
            for e in engines:
                await e.shutdown()
            await quota.close()
            await stored.close()

    app = FastAPI(title="sparkgate", version="0.1.0", lifespan=lifespan)
    http_errors.install(app, surfaces)  # each surface's paths answer in its error shape
    response_docs.install(app)  # the document describes real responses (schemathesis checks them)
    limits = settings.limits
    app.add_middleware(
        body_limits.BodyLimitsMiddleware, max_body_bytes=limits.max_body_bytes, max_json_depth=limits.max_json_depth
    )
    app.add_middleware(draining.DrainingMiddleware, drain=drain)  # inside the log: its 503s are logged
    cors = settings.server.cors
    if cors.allow_origins:  # off by default: browsers' same-origin rule then holds
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(cors.allow_origins),
            allow_methods=list(cors.allow_methods),
            allow_headers=list(cors.allow_headers),
            expose_headers=list(cors.expose_headers),
            max_age=cors.max_age_s,
            allow_credentials=False,  # keys travel in Authorization, never in cookies
        )
    app.add_middleware(request_log.RequestLogMiddleware)  # outermost: it times the whole request
    for surface in surfaces:
        assert surface.router is not None
        app.include_router(surface.router)
    app.include_router(ops.router)
    app.include_router(admin.router)
    app.include_router(admin.admin_router)
    app.include_router(dashboard.router)
    if settings.metrics.enabled:
        app.include_router(metrics_http.router)
    return app
