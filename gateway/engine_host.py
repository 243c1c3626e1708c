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

from engine_adapter.base import Engine, EngineError, EngineRequestInvalid
from engine_adapter.hf_tokenizer import fingerprint
from engine_adapter.wire import Claim, EngineInfo, GenerateFrame, StatsFrame, chunk_line, error_line
from gateway import errors
from gateway.app import EngineFactory, vllm_engine
from gateway.auth import bearer
from gateway.errors import AuthenticationFailed, EngineUnavailableError, ModelNotFound, ShareUnavailable
from gateway.failed_auth import FailedAuthTable
from gateway.http.deps import client_address
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
router = APIRouter(prefix="/engine/v1")


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
        healthy=engine.is_healthy,
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
    return StatsFrame(stats=hosted.engine.stats(), healthy=hosted.engine.is_healthy)


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
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    return StreamingResponse(frames(), media_type="application/x-ndjson")


@router.post("/{model}/abort/{request_id}")
async def abort(model: str, request_id: str, state: Host, gateway: Gateway) -> dict[str, bool]:
    await state.hosted(model).engine.abort(_engine_request_id(gateway, request_id))
    return {"aborted": True}


def create_host_app(settings: Settings, token: str, engine_factory: EngineFactory = vllm_engine) -> FastAPI:
    """Start every model of the config as a bare engine; no admission, quotas or routing
    here: those belong to the gateways that claim the engines."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        hosted: dict[str, HostedEngine] = {}
        try:
            for model in settings.models:
                engine = engine_factory(settings, model)
                await engine.start()
                hosted[model.name] = HostedEngine(engine, fingerprint(engine.tokenizer))
                spec = engine.kv_spec
                log.info("hosting %s: %d blocks x %d tokens, %d slots", model.name, spec.usable_blocks,
                         spec.block_size, spec.max_num_seqs)  # fmt: skip
            app.state.host = HostState(engines=hosted, token=token, failed_auth=FailedAuthTable(settings.auth.failed))
            yield
        finally:
            for h in hosted.values():
                await h.engine.shutdown()

    app = FastAPI(title="sparkgate engine host", version="0.1.0", lifespan=lifespan)
    errors.install(app)
    app.include_router(router)
    return app
