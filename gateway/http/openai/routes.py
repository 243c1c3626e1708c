"""POST /v1/chat/completions and /v1/completions, GET /v1/models: parse, run the lifecycle, answer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Request, Response

from gateway import lifecycle
from gateway.errors import InvalidRequest
from gateway.http import json_body, response_docs
from gateway.http.deps import Caller, State
from gateway.http.serving import answer, routing_of
from gateway.http.surface import Surface
from gateway.lifecycle.requests import ChatCompletionRequest, CompletionRequest, refused_fields

router = APIRouter(prefix="/v1")
M = TypeVar("M", ChatCompletionRequest, CompletionRequest)


def _parser(model: type[M]) -> Callable[[bytes], M]:
    """The body as `model`: JSON, then vLLM's fields this gateway refuses, then the schema.
    The two hot routes parse it themselves: FastAPI's dependency machinery for a body model,
    a header and two dependencies costs a sizeable share of a short chat's CPU time (the
    document still describes the body: `openapi_extra`)."""
    kind = "chat" if model is ChatCompletionRequest else "completion"

    def parse(raw: bytes) -> M:
        data = json_body.document(raw)
        _refuse_unsupported(data, kind)
        return json_body.validate(model, data)

    return parse


_CHAT = _parser(ChatCompletionRequest)
_COMPLETION = _parser(CompletionRequest)


def _model(body: ChatCompletionRequest | CompletionRequest) -> str:
    return body.model


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
    state, caller, body = await SURFACE.read(request, _CHAT, model=_model)
    routing = routing_of(state, request)
    job = await lifecycle.prepare_chat(body, state.registry, caller, state.settings.limits, routing)
    return await answer(job, state, request, SURFACE)


@router.post(
    "/completions",
    responses=response_docs.COMPLETIONS,
    openapi_extra=response_docs.request_body(CompletionRequest, "Completion"),
)
async def completions(request: Request) -> Response:
    state, caller, body = await SURFACE.read(request, _COMPLETION, model=_model)
    routing = routing_of(state, request)
    job = await lifecycle.prepare_completion(body, state.registry, caller, state.settings.limits, routing)
    return await answer(job, state, request, SURFACE)


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


# OpenAI's API: its error shape is the gateway's default, and chat's names are its own.
SURFACE = Surface("openai", router, paths=("/v1/chat/completions", "/v1/completions", "/v1/models"))
