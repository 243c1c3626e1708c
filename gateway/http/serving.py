"""One serving path for every API surface: run a prepared job and answer it in the
surface's own encoding.

Chat, completions, Responses and Anthropic's Messages each parse their request into a
`lifecycle.Job` (one tokenization, quotas, admission, routing) and hand it here with their
surface (gateway/http/surface.py) and the request's encoders (`Encoder`): a whole body, or
server-sent events. What a surface does not bring is the same for all: the response headers,
the stream that releases its job's holds however it ends, and the answer to a client that
left (499; counted once, by the lifecycle). Errors are answered in the surface's shape by
gateway/http/errors.py before the stream starts, and after it by the lifecycle, which ends
the stream with the surface's in-band error event.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from gateway import lifecycle, request_log
from gateway.admission import Ticket
from gateway.errors import GatewayError
from gateway.http.openai import output
from gateway.http.surface import Surface
from gateway.lifecycle.run import BodyEncoder, EventEncoder, StreamError
from gateway.state import AppState
from policies import prefix

T = TypeVar("T")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass(frozen=True)
class Encoder:
    """A request's encoders of its job's engine output: a whole body, a stream, and (where
    the surface's own event is not enough) the end of a stream an error cut short."""

    complete: BodyEncoder = output.complete
    stream: EventEncoder = output.stream
    stream_error: StreamError | None = None


CHAT = Encoder()


async def _client_left(request: Request) -> None:
    """Return when the client disconnects. The body was read, so the next message can only be that."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class _ReleasingStream(StreamingResponse):
    """A stream that gives back its job's holds however the response ends, even when the
    body is never iterated (the client left before the first byte).

    It streams as Starlette does on an ASGI 2.4 server, whatever the server's version: on 2.3
    (uvicorn) Starlette runs a task group per response with a second listener for the client's
    leaving, and `Running.events` has its own (`Running._watched`), which also aborts the
    engine requests. One listener, and no task group, per stream."""

    def __init__(self, running: lifecycle.Running, encode: EventEncoder, fail: StreamError, **kw: Any) -> None:
        super().__init__(running.events(encode, fail), **kw)
        self.running = running

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.stream_response(send)
        except OSError:  # a send to a closed connection, where a server raises it
            raise ClientDisconnect() from None
        finally:
            self.running.release()


def _headers(job: lifecycle.Job, ticket: Ticket) -> dict[str, str]:
    headers = {
        "X-Request-Id": job.id,  # the client's x-request-id instead, when given (request_log.py)
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
    return headers


async def prepared(surface: Surface, prepare: Awaitable[T]) -> T:
    """The lifecycle's prepare, its errors naming the fields as the surface's client sent them."""
    try:
        return await prepare
    except GatewayError as e:
        raise surface.renamed(e) from None


async def answer(
    job: lifecycle.Job, state: AppState, request: Request, surface: Surface, encoder: Encoder = CHAT
) -> Response:
    """Run the job and answer with the request's encoders: a JSON body, a stream (ended by
    the surface's error event if it fails), or 499 for a client that left."""
    request_log.note_job(request, job)
    try:
        running = await lifecycle.start(
            job,
            state,
            priority_header=request.headers.get(state.settings.admission.priority_header),
            client_gone=lambda: _client_left(request),
        )
    except lifecycle.ClientLeft:
        return Response(status_code=499)
    request_log.note_job(request, job, running)
    try:
        headers = _headers(job, running.ticket)
        if job.stream:
            sse = SSE_HEADERS | headers
            fail = encoder.stream_error or surface.stream_error
            return _ReleasingStream(running, encoder.stream, fail, media_type="text/event-stream", headers=sse)
        body = await running.body(encoder.complete)
    except lifecycle.ClientLeft:
        return Response(status_code=499)
    except BaseException:
        running.release()  # idempotent: body() has released already where it ran
        raise
    return JSONResponse(body, headers=headers | {"X-Sparkgate-Cached-Tokens": str(job.meter.cached_tokens)})


def routing_of(state: AppState, request: Request) -> lifecycle.Routing:
    if state.router is None:
        return lifecycle.NO_ROUTING
    return lifecycle.Routing(state.router, request.headers.get(state.settings.routing.header))
