"""POST /v1/chat/completions and /v1/completions, GET /v1/models."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway import pipeline, streaming
from gateway.admission import Ticket
from gateway.deps import AppState, Caller, Counters, State
from gateway.pipeline import Job, abort, prepare_chat, prepare_completion
from gateway.quota import Hold
from gateway.schemas import ChatCompletionRequest, CompletionRequest
from policies import prefix
from policies.admission import Demand

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def _client_left(request: Request) -> None:
    """Return when the client disconnects. The body was read, so the next message can only be that."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


@contextlib.asynccontextmanager
async def _on_disconnect(request: Request, job: Job, counters: Counters) -> AsyncIterator[asyncio.Task[None]]:
    """While the body is being produced, watch for the client leaving and then
    abort the job's engine requests at once. Waiting for the response
    generator to be closed is not enough: on ASGI 2.4 servers Starlette stops
    iterating without closing it, and it is finalized only when collected."""

    async def watch() -> None:
        await _client_left(request)
        counters.client_disconnects += 1
        log.info("client went away: aborting %s", job.id)
        await abort(job)

    watcher = asyncio.ensure_future(watch())
    try:
        yield watcher
    finally:
        if not watcher.done():
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher


class _Holds:
    """A running job's admission ticket and quota hold, given back together, once:
    the quota is settled with what the engine really did (the job's meter)."""

    def __init__(self, job: Job, ticket: Ticket, hold: Hold) -> None:
        self.job = job
        self.ticket = ticket
        self.hold = hold
        self.returned = False  # the client got the whole response (and its usage)

    def release(self) -> None:
        self.ticket.release()
        if self.job.flight is not None:
            self.job.flight.finish()
        m = self.job.meter
        self.hold.settle(m.prompt_tokens, m.completion_tokens, returned=self.returned)


class _TicketedStream(StreamingResponse):
    """A stream that gives back its holds however the response ends, even when the
    body is never iterated (the client left before the first byte)."""

    def __init__(self, content: AsyncIterator[str], holds: _Holds, **kw: Any) -> None:
        super().__init__(content, **kw)
        self.holds = holds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.holds.release()


async def _counted_stream(job: Job, counters: Counters, request: Request, holds: _Holds) -> AsyncIterator[str]:
    name = job.served.name
    counters.by_model_inflight[name] = counters.by_model_inflight.get(name, 0) + 1
    try:
        async with _on_disconnect(request, job, counters) as watcher:
            async for line in streaming.stream(job):
                if watcher.done():
                    return
                yield line
        counters.completed += 1
        holds.returned = True
    finally:
        counters.by_model_inflight[name] -= 1
        holds.release()  # the engine requests are finished or aborted by now


class _ClientLeft(Exception):
    pass


async def _admit(demand: Demand, state: AppState, request: Request) -> Ticket:
    """Wait for the job's turn (KV room, a slot, fairness), or for the client to leave."""
    acquire = asyncio.ensure_future(state.admission.acquire(demand))
    watcher = asyncio.ensure_future(_client_left(request))
    try:
        await asyncio.wait([acquire, watcher], return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not acquire.done():
            acquire.cancel()  # gives the queue place (or a just-granted admission) back
            with contextlib.suppress(BaseException):
                await acquire
        if not watcher.done():
            watcher.cancel()
            with contextlib.suppress(BaseException):
                await watcher
    if watcher.done() and not watcher.cancelled():
        # The client left. The cancel may have lost a race with the admission: give it back.
        if not acquire.cancelled() and acquire.exception() is None:
            acquire.result().release()
        state.counters.client_disconnects += 1
        raise _ClientLeft
    return acquire.result()


async def _respond(job: Job, state: State, request: Request) -> Response:
    demand = pipeline.demand(
        job,
        priority=pipeline.priority_of(job.principal, request.headers.get(state.settings.admission.priority_header)),
        user_max_running=job.principal.max_concurrency or state.settings.admission.per_user_max_concurrency,
    )
    try:
        # The quota first: a request over its key's limits must not queue for the engine.
        hold = await state.quota.reserve(job.principal, job.id, job.worst_case_tokens)
        try:
            await pipeline.route_hold(job)  # routing may hold it back so as not to stall running requests
            ticket = await _admit(demand, state, request)
        except BaseException:
            hold.release()
            raise
    except BaseException as e:
        if job.flight is not None:
            job.flight.finish()  # it never reached its engine
        if isinstance(e, _ClientLeft):
            log.info("%s: client left while queued", job.id)
            return Response(status_code=499)
        raise
    if job.flight is not None:
        job.flight.admitted()
    holds = _Holds(job, ticket, hold)
    try:
        bs = job.served.engine.kv_spec.block_size
        job = dataclasses.replace(job, on_prefill=lambda cached: ticket.prefilled(cached // bs))
        holds.job = job
        return await _run(job, state, request, holds)
    except BaseException:
        holds.release()
        raise


async def _run(job: Job, state: State, request: Request, holds: _Holds) -> Response:
    ticket = holds.ticket
    counters = state.counters
    log.info(
        "%s: model=%s user=%s prompt_tokens=%s max_tokens=%s n=%d stream=%s waited=%.3fs",
        job.id,
        job.served.name,
        job.principal.name,
        "+".join(str(len(p)) for p in job.prompts),
        job.requests[0].sampling.max_tokens,
        job.n,
        job.stream,
        ticket.waited_s,
    )
    headers = {
        "X-Request-Id": job.id,
        "X-Sparkgate-Model": job.served.name,
        "X-Sparkgate-Queue-Wait-Ms": str(round(ticket.waited_s * 1000)),
        "X-Sparkgate-Admission-Seq": str(ticket.seq),
        # What normalization changed, and how much of the first prompt a later request can
        # reuse from the cache (whole blocks; the cached count itself is in the usage).
        "X-Sparkgate-Prefix": ",".join(job.prefix_changes) or "none",
        "X-Sparkgate-Cacheable-Tokens": str(
            prefix.cacheable_tokens(len(job.prompts[0]), job.served.engine.kv_spec.block_size)
        ),
    }
    if job.route is not None:  # which model routing chose, why, and what it expects
        headers |= {
            "X-Sparkgate-SLO": job.route.slo,
            "X-Sparkgate-Route": job.route.reason,
            "X-Sparkgate-Predicted-TTFT-Ms": str(round(job.route.predicted.ttft_s * 1000)),
            "X-Sparkgate-Predicted-TPOT-Ms": str(round(job.route.predicted.tpot_s * 1000, 1)),
        }
    if job.stream:
        return _TicketedStream(
            _counted_stream(job, counters, request, holds),
            holds,
            media_type="text/event-stream",
            headers=SSE_HEADERS | headers,
        )
    name = job.served.name
    counters.by_model_inflight[name] = counters.by_model_inflight.get(name, 0) + 1
    try:
        async with _on_disconnect(request, job, counters) as watcher:
            work = asyncio.ensure_future(streaming.complete(job))
            try:
                await asyncio.wait([work, watcher], return_when=asyncio.FIRST_COMPLETED)
            finally:
                # The client left (its engine requests are being aborted), or this
                # handler itself was cancelled: either way the work must not outlive it.
                client_left = watcher.done()
                if client_left or not work.done():
                    work.cancel()
                    with contextlib.suppress(BaseException):
                        await work
            if client_left:
                return Response(status_code=499)
            body = work.result()
            holds.returned = True
    except Exception:
        counters.failed += 1
        if not job.served.engine.is_healthy:
            state.admission.close(name)  # nobody waiting for a dead engine should wait on
        raise
    finally:
        counters.by_model_inflight[name] -= 1
        holds.release()
    counters.completed += 1
    cached = (body.get("usage") or {}).get("prompt_tokens_details", {}).get("cached_tokens", 0)
    return JSONResponse(body, headers=headers | {"X-Sparkgate-Cached-Tokens": str(cached)})


def _routing(state: AppState, request: Request) -> pipeline.Routing:
    if state.router is None:
        return pipeline.NO_ROUTING
    return pipeline.Routing(state.router, request.headers.get(state.settings.routing.header))


@router.post("/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request, state: State, caller: Caller) -> Response:
    state.counters.requests += 1
    job = await prepare_chat(body, state.registry, caller, state.settings.limits, _routing(state, request))
    return await _respond(job, state, request)


@router.post("/completions")
async def completions(body: CompletionRequest, request: Request, state: State, caller: Caller) -> Response:
    state.counters.requests += 1
    job = await prepare_completion(body, state.registry, caller, state.settings.limits, _routing(state, request))
    return await _respond(job, state, request)


@router.get("/models")
async def list_models(state: State, caller: Caller) -> dict[str, Any]:
    data = []
    for served in state.registry:
        if not caller.may_use(served.settings.names):
            continue
        for name in served.settings.names:
            data.append(
                {
                    "id": name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "sparkgate",
                    "root": served.name,
                    "max_model_len": served.engine.max_model_len,
                }
            )
    if state.router is not None:  # names that route: a chat frontend can offer them like models
        for alias, strategy in state.settings.routing.aliases.items():
            data.append(
                {"id": alias, "object": "model", "created": 0, "owned_by": "sparkgate", "root": f"route:{strategy}"}
            )
    return {"object": "list", "data": data}
