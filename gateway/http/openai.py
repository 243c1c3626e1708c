"""POST /v1/chat/completions and /v1/completions, GET /v1/models: parse, run the lifecycle, answer."""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from gateway import lifecycle, request_log
from gateway.admission import Ticket
from gateway.auth import Principal
from gateway.http import json_body, output, response_docs
from gateway.http.deps import Caller, State, get_principal, get_state
from gateway.http.schemas import ChatCompletionRequest, CompletionRequest
from gateway.lifecycle.run import BodyEncoder, EventEncoder
from gateway.state import AppState
from policies import prefix

router = APIRouter(prefix="/v1")
M = TypeVar("M", ChatCompletionRequest, CompletionRequest)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


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

    def __init__(self, running: lifecycle.Running, encode: EventEncoder, **kw: Any) -> None:
        super().__init__(running.events(encode), **kw)
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


async def answer(
    job: lifecycle.Job,
    state: AppState,
    request: Request,
    *,
    complete: BodyEncoder = output.complete,
    stream: EventEncoder = output.stream,
) -> Response:
    """Run the job and answer with the surface's encoders: a JSON body, a stream, or 499
    for a client that left."""
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
            return _ReleasingStream(running, stream, media_type="text/event-stream", headers=SSE_HEADERS | headers)
        body = await running.body(complete)
    except lifecycle.ClientLeft:
        return Response(status_code=499)
    except BaseException:
        running.release()  # idempotent: body() has released already where it ran
        raise
    usage = body.get("usage") or {}
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}  # chat or Responses
    cached = details.get("cached_tokens", 0)
    return JSONResponse(body, headers=headers | {"X-Sparkgate-Cached-Tokens": str(cached)})


def routing_of(state: AppState, request: Request) -> lifecycle.Routing:
    if state.router is None:
        return lifecycle.NO_ROUTING
    return lifecycle.Routing(state.router, request.headers.get(state.settings.routing.header))


# The two hot routes take the request alone and parse it themselves (json_body), in the
# order FastAPI would: the JSON, the key, the schema. FastAPI's dependency machinery for a body
# model, a header and two dependencies cost 3-15% of a 1-token chat's CPU time; the document
# still describes the body (`openapi_extra`).
async def _parsed(request: Request, model: type[M]) -> tuple[AppState, Principal, M]:
    state = get_state(request)
    data = json_body.document(await request.body())
    caller = await get_principal(request, request.headers.get("authorization"))
    body = json_body.validate(model, data)
    state.counters.requests += 1
    request_log.note_model(request, body.model)
    return state, caller, body


@router.post(
    "/chat/completions",
    responses=response_docs.CHAT,
    openapi_extra=response_docs.request_body(ChatCompletionRequest, "Chat"),
)
async def chat_completions(request: Request) -> Response:
    state, caller, body = await _parsed(request, ChatCompletionRequest)
    job = await lifecycle.prepare_chat(body, state.registry, caller, state.settings.limits, routing_of(state, request))
    return await answer(job, state, request)


@router.post(
    "/completions",
    responses=response_docs.COMPLETIONS,
    openapi_extra=response_docs.request_body(CompletionRequest, "Completion"),
)
async def completions(request: Request) -> Response:
    state, caller, body = await _parsed(request, CompletionRequest)
    job = await lifecycle.prepare_completion(
        body, state.registry, caller, state.settings.limits, routing_of(state, request)
    )
    return await answer(job, state, request)


@router.get("/models", responses=response_docs.LIST_MODELS)
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
