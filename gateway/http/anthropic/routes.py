"""Anthropic's Messages API: POST /v1/messages and /v1/messages/count_tokens (Claude Code,
the anthropic SDKs), and HEAD / GET / (Claude Code checks that the base URL answers).

A Messages request becomes a chat request (messages_input.py) and goes through the same
lifecycle as chat completions (`prepare_chat`, then `answer` with this surface's encoders,
messages_output.py). Errors come in Anthropic's shape (gateway/errors.py, by the path).
The key may come as `x-api-key` (the SDK's) or `Authorization: Bearer` (Claude Code with
ANTHROPIC_AUTH_TOKEN); `anthropic-version` and `anthropic-beta` headers are accepted as they are.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from gateway import lifecycle, request_log
from gateway.http.anthropic import schemas as messages_schemas
from gateway.http.anthropic import translate as messages_input
from gateway.http.anthropic.output import MessageEncoder
from gateway.http.deps import get_principal, get_state
from gateway.http.serving import Surface, answer, routing_of

router = APIRouter()


@router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
async def root() -> dict[str, str]:
    return {"status": "ok", "service": "sparkgate"}


@router.post("/v1/messages")
async def create_message(request: Request) -> Response:
    state = get_state(request)
    raw = await request.body()
    caller = await get_principal(request, request.headers.get("authorization"))
    req = messages_schemas.parse(raw, messages_schemas.MessagesRequest)
    state.counters.requests += 1
    request_log.note_model(request, req.model)
    translated = messages_input.translate(req)
    job = await lifecycle.prepare_chat(
        translated.chat, state.registry, caller, state.settings.limits, routing_of(state, request)
    )
    encoder = MessageEncoder(model=req.model, thinking_shown=translated.thinking_shown)
    return await answer(job, state, request, Surface(encoder.complete, encoder.stream))


@router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request) -> dict[str, Any]:
    state = get_state(request)
    raw = await request.body()
    caller = await get_principal(request, request.headers.get("authorization"))
    req = messages_schemas.parse(raw, messages_schemas.CountTokensRequest)
    request_log.note_model(request, req.model)
    chat = messages_input.translate(req).chat
    count = await lifecycle.count_chat(chat, state.registry, caller, state.settings.limits, routing_of(state, request))
    return {"input_tokens": count}
