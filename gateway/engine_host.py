"""`sparkgate engine-host`: a box's engines served bare to the gateways on other boxes.

The three models do not fit one DGX Spark, so one of them runs on a second box.
Its gateway is not there: the gateway on the first box reaches this host with
the same values it passes an in-process engine (token ids in, chunks out, the
KV spec, live stats; `engine_adapter/wire.py`), so counting, admission,
routing and quotas stay in one place. Each gateway first claims a share of an
engine (`policies/shares.py`) and admits against that share only: the engine
is never over-committed, however many gateways reach it.

    POST /engine/v1/{model}/claim             Claim -> EngineInfo (409 when it does not fit)
    DELETE /engine/v1/{model}/claim           frees the share at once (else its lease lapses)
    GET  /engine/v1/{model}/stats             renews the claim -> StatsFrame
    POST /engine/v1/{model}/generate          GenerateFrame -> NDJSON StreamFrames
    POST /engine/v1/{model}/abort/{id}        (also done when the stream's connection closes)
    GET  /engine/v1/health                   (no token: for liveness probes)

Every other call needs `Authorization: Bearer <token>`, the token shared with the
gateways (the host is not for clients), and `X-Sparkgate-Gateway: <id>`, the calling
gateway's per-process id. The token is compared in constant time, never shown in a repr or a
log, and wrong tokens count toward the caller's failed-auth block (`auth.failed`), as at the
gateway.

SIGTERM drains the host as the gateway's own (gateway/drain.py): new claims and generate
calls get 503 `server_shutting_down`, stats and claims say the engine is unhealthy (the
gateways stop sending it work), running streams finish within `server.drain_grace_s`, then
the rest are aborted (the engine's "abort" ends each) and the host exits 0. Stats, aborts and
claim releases stay served meanwhile.

With `box.min_free` the host guards its box's memory as the gateway does (gateway/host_memory.py):
below the floor a generate call gets 503 `server_overloaded` with Retry-After, which the
gateway's remote engine answers as overloaded (503, or 529 on the Messages API).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import hmac
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, Header, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.types import Scope

from engine_adapter.base import Engine, EngineError, EngineRequestInvalid
from engine_adapter.hf_tokenizer import fingerprint
from engine_adapter.wire import Claim, EngineInfo, GenerateFrame, StatsFrame, chunk_line, error_line
from gateway import heap
from gateway.app import EngineFactory, build_engine, start_engines
from gateway.auth import bearer
from gateway.drain import Drain
from gateway.errors import (
    AuthenticationFailed,
    EngineUnavailableError,
    GatewayError,
    ModelNotFound,
    ShareUnavailable,
)
from gateway.failed_auth import FailedAuthTable
from gateway.host_memory import HostMemory, MemoryWatch, from_settings
from gateway.http import errors as http_errors
from gateway.http.deps import client_address
from gateway.http.draining import DrainingMiddleware
from gateway.http.json_body import JSONRoute
from gateway.settings import FailedAuthSettings, Settings
from policies import shares

log = logging.getLogger(__name__)

CLAIM_TTL_S = 10.0  # a gateway polls stats every ~0.5 s; a dead one's share frees after this
HEARTBEAT_S = 1.0  # an empty line on a quiet stream: gateways time out a host silent for longer


@dataclasses.dataclass
class HostedEngine:
    engine: Engine
    tokenizer_fingerprint: str
    claims: dict[str, shares.Lease] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class HostState:
    engines: dict[str, HostedEngine]
    token: str = dataclasses.field(repr=False)
    failed_auth: FailedAuthTable = dataclasses.field(default_factory=lambda: FailedAuthTable(FailedAuthSettings()))
    claim_ttl_s: float = CLAIM_TTL_S
    heartbeat_s: float = HEARTBEAT_S
    drain: Drain = dataclasses.field(default_factory=Drain)
    # The box's memory guard (gateway/host_memory.py): None without box.min_free.
    memory: MemoryWatch | None = None

    def healthy(self, hosted: HostedEngine) -> bool:
        """What the gateways are told: a draining host's engines take no new work."""
        return hosted.engine.is_healthy and not self.drain.draining

    def hosted(self, model: str) -> HostedEngine:
        try:
            return self.engines[model]
        except KeyError:
            raise ModelNotFound(f"This host serves no model '{model}' (it has: {', '.join(self.engines)}).") from None


def _state(request: Request) -> HostState:
    state: HostState = request.app.state.host
    return state


async def _authorized(request: Request, authorization: Annotated[str | None, Header()] = None) -> HostState:
    state = _state(request)

    async def check() -> HostState:
        if not token_matches(bearer(authorization), state.token):
            raise AuthenticationFailed("Incorrect engine host token.")
        return state

    return await state.failed_auth.guarded(client_address(request), check)


def token_matches(given: str, token: str) -> bool:
    """Constant time, also in the length: the digests compared are equally long."""
    return hmac.compare_digest(hashlib.sha256(given.encode()).digest(), hashlib.sha256(token.encode()).digest())


Host = Annotated[HostState, Depends(_authorized)]
# The calling gateway, on every call but /health: claims, renewals and request ids are its.
Gateway = Annotated[str, Header(alias="X-Sparkgate-Gateway", min_length=1)]
router = APIRouter(prefix="/engine/v1", route_class=JSONRoute)


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    """No token needed: for liveness probes, like the gateway's /health."""
    hosted = _state(request).engines
    models = {n: ("ok" if h.engine.is_healthy else "unavailable") for n, h in hosted.items()}
    healthy = all(v == "ok" for v in models.values())
    return JSONResponse(
        {"status": "ok" if healthy else "degraded", "models": models}, status_code=200 if healthy else 503
    )


@router.post("/{model}/claim")
async def claim(model: str, body: Claim, state: Host, gateway: Gateway) -> EngineInfo:
    hosted = state.hosted(model)
    engine = hosted.engine
    spec = shares.share_spec(engine.kv_spec, body.share)
    if isinstance(spec, shares.Refused):
        raise ShareUnavailable(f"Engine {model}: {spec.message}.")
    granted = shares.grant(hosted.claims, gateway, body.share, time.monotonic(), state.claim_ttl_s)
    if isinstance(granted, shares.Refused):
        raise ShareUnavailable(f"Engine {model}: {granted.message}.")
    hosted.claims = granted
    log.info("gateway %s claims %.3g of %s: %d blocks, %d slots", gateway, body.share, model,
             spec.usable_blocks, spec.max_num_seqs)  # fmt: skip
    return EngineInfo(
        name=model,
        kv_spec=spec,
        pool_blocks=engine.kv_spec.usable_blocks,
        healthy=state.healthy(hosted),
        tokenizer_fingerprint=hosted.tokenizer_fingerprint,
    )


@router.delete("/{model}/claim")
async def release(model: str, state: Host, gateway: Gateway) -> dict[str, bool]:
    hosted = state.hosted(model)
    hosted.claims = shares.release(hosted.claims, gateway, time.monotonic())
    return {"released": True}


@router.get("/{model}/stats")
async def stats(model: str, state: Host, gateway: Gateway) -> StatsFrame:
    hosted = state.hosted(model)
    renewed = shares.renew(hosted.claims, gateway, time.monotonic(), state.claim_ttl_s)
    if isinstance(renewed, shares.Refused):
        raise ShareUnavailable(f"Engine {model}: {renewed.message}; claim it again.")
    hosted.claims = renewed
    return StatsFrame(stats=hosted.engine.stats(), healthy=state.healthy(hosted))


@dataclasses.dataclass(eq=False)
class _Stream:
    """A generate call, for the drain: aborting it aborts its engine request, whose last
    chunk ("abort") then ends the stream."""

    engine: Engine
    request_id: str
    aborting: asyncio.Future[None] | None = None

    def abort(self, error: GatewayError) -> None:
        if self.aborting is None:
            self.aborting = asyncio.ensure_future(self.engine.abort(self.request_id))


def _engine_request_id(gateway: str, request_id: str) -> str:
    # Gateways pick their own ids; the host keeps them apart.
    return f"{gateway}/{request_id}"


@router.post("/{model}/generate")
async def generate(model: str, body: GenerateFrame, state: Host, gateway: Gateway) -> StreamingResponse:
    hosted = state.hosted(model)
    if gateway not in shares.live(hosted.claims, time.monotonic()):
        raise ShareUnavailable(f"Engine {model}: gateway {gateway} holds no live claim; claim it first.")
    request = dataclasses.replace(body.request, request_id=_engine_request_id(gateway, body.request.request_id))
    if not hosted.engine.is_healthy:
        raise EngineUnavailableError(f"Engine {model} is not available on this host.")
    # This box's memory below its floor: 503 server_overloaded, which the gateway's remote
    # engine turns into its own overloaded answer (engine_adapter/remote.py). Streams running go on.
    if state.memory is not None and (low := state.memory.refusal()) is not None:
        raise low

    async def frames() -> AsyncIterator[bytes]:
        # The engine's output is pumped through a queue so that an empty line can go out
        # whenever it is quiet (a long prefill): the gateway then tells a slow prompt from a
        # host that stalled. When the gateway's connection closes, Starlette closes this
        # generator; cancelling the pump closes the engine's iterator, which aborts the
        # request, so its KV frees at once.
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()

        async def pump() -> None:
            try:
                async for chunk in hosted.engine.generate(request):
                    await queue.put(chunk_line(chunk))
            except EngineRequestInvalid as e:
                await queue.put(error_line("invalid", str(e)))
            except EngineError as e:
                await queue.put(error_line("unavailable", str(e)))
            await queue.put(None)

        task = asyncio.create_task(pump())
        untrack = state.drain.track(_Stream(hosted.engine, request.request_id))
        try:
            while True:
                try:
                    line = await asyncio.wait_for(queue.get(), state.heartbeat_s)
                except TimeoutError:
                    yield b"\n"
                    continue
                if line is None:
                    return
                yield line
        finally:
            untrack()
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    return StreamingResponse(frames(), media_type="application/x-ndjson")


@router.post("/{model}/abort/{request_id}")
async def abort(model: str, request_id: str, state: Host, gateway: Gateway) -> dict[str, bool]:
    await state.hosted(model).engine.abort(_engine_request_id(gateway, request_id))
    return {"aborted": True}


def host_refuses(scope: Scope) -> bool:
    """New work while draining: claims and generate calls (stats, aborts, releases go on)."""
    return scope["method"] == "POST" and str(scope["path"]).endswith(("/claim", "/generate"))


def create_host_app(
    settings: Settings,
    token: str,
    engine_factory: EngineFactory = build_engine,
    drain: Drain | None = None,
    host_memory: HostMemory | None = None,
) -> FastAPI:
    """Start every model of the config as a bare engine; no admission, quotas or routing
    here: those belong to the gateways that claim the engines. With box.min_free, the box's
    memory guard refuses new generate calls below it (`host_memory`: what it reads)."""
    drain = Drain(settings.server.drain_grace_s) if drain is None else drain

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        hosted: dict[str, HostedEngine] = {}
        memory = from_settings(settings.box, host_memory)
        try:
            engines = [(model, engine_factory(settings, model)) for model in settings.models]
            await start_engines(engines, settings.server.engine_start, {})
            for model, engine in engines:
                hosted[model.name] = HostedEngine(engine, fingerprint(engine.tokenizer))
                spec = engine.kv_spec
                log.info("hosting %s: %d blocks x %d tokens, %d slots", model.name, spec.usable_blocks,
                         spec.block_size, spec.max_num_seqs)  # fmt: skip
            app.state.host = HostState(
                engines=hosted,
                token=token,
                failed_auth=FailedAuthTable(settings.auth.failed),
                drain=drain,
                memory=memory,
            )
            if memory is not None:
                memory.start()
            with heap.frozen():  # it holds vLLM as a gateway does (gateway/heap.py)
                yield
        finally:
            if memory is not None:
                await memory.stop()
            for h in hosted.values():
                await h.engine.shutdown()

    app = FastAPI(title="sparkgate engine host", version="0.1.0", lifespan=lifespan)
    http_errors.install(app)
    app.add_middleware(DrainingMiddleware, drain=drain, refuses=host_refuses)
    app.include_router(router)
    return app
