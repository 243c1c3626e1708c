"""POST /v1/chat/completions and /v1/completions, GET /v1/models: parse, run the lifecycle, answer."""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import APIRouter, Request, Response

from gateway import lifecycle, request_log
from gateway.auth import Principal
from gateway.errors import InvalidRequest
from gateway.http import json_body, response_docs
from gateway.http.deps import Caller, State, get_principal, get_state
from gateway.http.serving import answer, routing_of
from gateway.lifecycle.requests import ChatCompletionRequest, CompletionRequest, refused_fields
from gateway.state import AppState

router = APIRouter(prefix="/v1")
M = TypeVar("M", ChatCompletionRequest, CompletionRequest)


# The two hot routes take the request alone and parse it themselves (json_body), in the
# order FastAPI would: the JSON, the key, the schema. FastAPI's dependency machinery for a body
# model, a header and two dependencies costs a sizeable share of a short chat's CPU time; the document
# still describes the body (`openapi_extra`).
async def _parsed(request: Request, model: type[M]) -> tuple[AppState, Principal, M]:
    state = get_state(request)
    data = json_body.document(await request.body())
    caller = await get_principal(request, request.headers.get("authorization"))
    _refuse_unsupported(data, "chat" if model is ChatCompletionRequest else "completion")
    body = json_body.validate(model, data)
    state.counters.requests += 1
    request_log.note_model(request, body.model)
    return state, caller, body


def _refuse_unsupported(data: Any, kind: str) -> None:
    """vLLM's fields this gateway does not honour, when set: a 400 naming each, not a silent 200."""
    refused = refused_fields(data, kind)
    if refused:
        names = ", ".join(f"'{name}'" for name in refused)
        raise InvalidRequest(
            f"Unsupported parameter: {names} is not supported by this server (see the API reference, docs/api.md).",
            param=refused[0],
            code="unsupported_parameter",
        )


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
