"""Anthropic's Messages API: POST /v1/messages and /v1/messages/count_tokens (Claude Code,
the anthropic SDKs), and HEAD / GET / (Claude Code checks that the base URL answers).

A Messages request becomes a chat request (translate.py) and goes through the same
lifecycle as chat completions (`prepare_chat`, then `answer` with this surface's encoders,
output.py). Errors come in Anthropic's shape (anthropic/errors.py, for this surface's paths).
The key may come as `x-api-key` (the SDK's) or `Authorization: Bearer` (Claude Code with
ANTHROPIC_AUTH_TOKEN); `anthropic-version` and `anthropic-beta` headers are accepted as they are.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from gateway import lifecycle
from gateway.http.anthropic import errors
from gateway.http.anthropic import schemas as messages_schemas
from gateway.http.anthropic import translate as messages_input
from gateway.http.anthropic.output import MessageEncoder
from gateway.http.serving import Encoder, answer, prepared, routing_of
from gateway.http.surface import Surface

router = APIRouter()


@router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
async def root() -> dict[str, str]:
    return {"status": "ok", "service": "sparkgate"}


def _model(req: messages_schemas.CountTokensRequest) -> str:
    return req.model


def _message(raw: bytes) -> messages_schemas.MessagesRequest:
    return messages_schemas.parse(raw, messages_schemas.MessagesRequest)


def _count(raw: bytes) -> messages_schemas.CountTokensRequest:
    return messages_schemas.parse(raw, messages_schemas.CountTokensRequest)


@router.post("/v1/messages")
async def create_message(request: Request) -> Response:
    state, caller, req = await SURFACE.read(request, _message, model=_model)
    translated = messages_input.translate(req)
    routing = routing_of(state, request)
    job = await prepared(
        SURFACE, lifecycle.prepare_chat(translated.chat, state.registry, caller, state.settings.limits, routing)
    )
    encoder = MessageEncoder(model=req.model, thinking_shown=translated.thinking_shown)
    return await answer(job, state, request, SURFACE, Encoder(encoder.complete, encoder.stream))


@router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request) -> dict[str, Any]:
    state, caller, req = await SURFACE.read(request, _count, model=_model, count=False)
    chat = messages_input.translate(req).chat
    routing = routing_of(state, request)
    count = await prepared(SURFACE, lifecycle.count_chat(chat, state.registry, caller, state.settings.limits, routing))
    return {"input_tokens": count}


# Anthropic's error shape and stream error event; the key as the anthropic SDKs send it
# (`x-api-key`) or as Claude Code does with ANTHROPIC_AUTH_TOKEN (`Authorization: Bearer`).
SURFACE = Surface(
    "anthropic",
    router,
    paths=("/v1/messages",),
    error_status=errors.status,
    error_body=errors.body,
    stream_error=errors.stream_error,
    key_headers=("x-api-key", "authorization"),
    params={"messages": "messages", "stop": "stop_sequences", "structured_outputs": "output_format"},
)
