"""POST /v1/responses (OpenAI's Responses API), GET and DELETE /v1/responses/{id}.

A Responses request becomes a chat request (translate.py) and goes through the
same lifecycle as chat completions (`prepare_chat`, then `answer` with this surface's
encoders, output.py). With `store: true` (the default) the finished response
is kept, with its conversation, for its owner (gateway/responses_store.py): GET returns
it, `previous_response_id` continues it, DELETE removes it. Another user's id is "not
found", like an unknown or expired one. With `store: false` nothing is kept: the client sends
the whole conversation back each turn (Codex CLI does, reasoning included, through
`include: ["reasoning.encrypted_content"]`).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request, Response

from gateway import lifecycle
from gateway.auth import Principal
from gateway.errors import GatewayError, ResponseNotFound
from gateway.http import response_docs
from gateway.http.deps import Caller, State
from gateway.http.responses import schemas as responses_schemas
from gateway.http.responses import translate as responses_input
from gateway.http.responses.output import ResponseEncoder
from gateway.http.serving import Encoder, answer, prepared, routing_of
from gateway.http.sse import new_id
from gateway.http.surface import Surface
from gateway.responses_store import StoredResponse
from gateway.state import AppState

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1")


async def _owned(state: AppState, caller: Principal, response_id: str, param: str | None) -> StoredResponse:
    record = await state.responses.get(response_id)
    if record is None or record.user != caller.name:
        raise ResponseNotFound(f"Response with id '{response_id}' not found.", param=param)
    return record


@router.post(
    "/responses",
    responses=response_docs.RESPONSES,
    openapi_extra=response_docs.request_body(responses_schemas.ResponsesRequest, "Responses"),
)
async def create_response(request: Request) -> Response:
    state, caller, req = await SURFACE.read(request, responses_schemas.parse, model=_model)
    responses_schemas.check_limits(req, state.settings.limits)
    history: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        history = (await _owned(state, caller, req.previous_response_id, "previous_response_id")).messages
    translated = responses_input.translate(req, history)
    routing = routing_of(state, request)
    job = await prepared(
        SURFACE, lifecycle.prepare_chat(translated.chat, state.registry, caller, state.settings.limits, routing)
    )
    if translated.forced_custom is not None:  # its output is its input text, not JSON arguments
        job = responses_input.force_custom(job, translated.forced_custom)
    response_id = new_id("resp")

    async def save(body: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        try:
            await state.responses.put(response_id, StoredResponse(user=caller.name, response=body, messages=messages))
        except GatewayError as e:  # the answer stands; only a later GET or continuation misses it
            log.warning("%s not stored: %s", response_id, e.message)

    encoder = ResponseEncoder(
        id=response_id,
        echo=translated.echo,
        conversation=translated.conversation,
        save=save if req.store else None,
        summary=req.reasoning is not None and req.reasoning.summary is not None,
        tools=translated.tools,
        encrypted=req.encrypted_reasoning,
    )
    return await answer(job, state, request, SURFACE, Encoder(encoder.complete, encoder.stream, encoder.stream_error))


def _model(req: responses_schemas.ResponsesRequest) -> str:
    return req.model


@router.get("/responses/{response_id}")
async def get_response(response_id: str, state: State, caller: Caller) -> dict[str, Any]:
    return (await _owned(state, caller, response_id, "response_id")).response


@router.delete("/responses/{response_id}")
async def delete_response(response_id: str, state: State, caller: Caller) -> dict[str, Any]:
    await _owned(state, caller, response_id, "response_id")
    await state.responses.delete(response_id)
    return {"id": response_id, "object": "response", "deleted": True}


# OpenAI's error shape; a stream's error ends it with `error` and `response.failed` (the
# encoder's, which holds the output so far). Chat's parameters by the names Responses gives them.
SURFACE = Surface(
    "responses",
    router,
    paths=("/v1/responses",),
    params={
        "messages": "input",
        "max_tokens": "max_output_tokens",
        "max_completion_tokens": "max_output_tokens",
        "response_format": "text.format",
        "structured_outputs": "text.format",
        "tools": "tools",
        "tool_choice": "tool_choice",
    },
)
