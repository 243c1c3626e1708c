"""POST /v1/chat/completions and /v1/completions, GET /v1/models."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from gateway import streaming
from gateway.deps import Caller, Counters, State
from gateway.pipeline import Job, abort, prepare_chat, prepare_completion
from gateway.schemas import ChatCompletionRequest, CompletionRequest

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@contextlib.asynccontextmanager
async def _on_disconnect(request: Request, job: Job, counters: Counters) -> AsyncIterator[asyncio.Task[None]]:
    """While the body is being produced, watch for the client leaving and then
    abort the job's engine requests at once. Waiting for the response
    generator to be closed is not enough: on ASGI 2.4 servers Starlette stops
    iterating without closing it, and it is finalized only when collected."""

    async def watch() -> None:
        # The body was read, so the next message can only be the disconnect.
        while (await request.receive())["type"] != "http.disconnect":
            pass
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


async def _counted_stream(job: Job, counters: Counters, request: Request) -> AsyncIterator[str]:
    name = job.served.name
    counters.by_model_inflight[name] = counters.by_model_inflight.get(name, 0) + 1
    try:
        async with _on_disconnect(request, job, counters) as watcher:
            async for line in streaming.stream(job):
                if watcher.done():
                    return
                yield line
        counters.completed += 1
    finally:
        counters.by_model_inflight[name] -= 1


async def _respond(job: Job, state: State, request: Request) -> Response:
    counters = state.counters
    log.info(
        "%s: model=%s user=%s prompt_tokens=%s max_tokens=%s n=%d stream=%s",
        job.id,
        job.served.name,
        job.principal.name,
        "+".join(str(len(p)) for p in job.prompts),
        job.requests[0].sampling.max_tokens,
        job.n,
        job.stream,
    )
    headers = {"X-Request-Id": job.id, "X-Sparkgate-Model": job.served.name}
    if job.stream:
        return StreamingResponse(
            _counted_stream(job, counters, request),
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
    except Exception:
        counters.failed += 1
        raise
    finally:
        counters.by_model_inflight[name] -= 1
    counters.completed += 1
    return JSONResponse(body, headers=headers)


@router.post("/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request, state: State, caller: Caller) -> Response:
    state.counters.requests += 1
    job = await prepare_chat(body, state.registry, caller, state.settings.limits)
    return await _respond(job, state, request)


@router.post("/completions")
async def completions(body: CompletionRequest, request: Request, state: State, caller: Caller) -> Response:
    state.counters.requests += 1
    job = await prepare_completion(body, state.registry, caller, state.settings.limits)
    return await _respond(job, state, request)


@router.get("/models")
async def list_models(state: State, caller: Caller) -> dict[str, Any]:
    data = []
    for served in state.registry:
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
    return {"object": "list", "data": data}
