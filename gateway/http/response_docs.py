"""What the API's responses look like, for the OpenAPI document (`/openapi.json`).

The bodies themselves are built as plain dicts (openai/bodies.py, openai/output.py, responses/output.py);
these JSON Schemas describe them, so that a client generator, or schemathesis
(benchmarks/fuzz.py, tests/api/test_fuzz.py), can check every real response against the
document: the 200 bodies of chat, completions, models and responses, and the one error
object every failure answers with (gateway/errors.py), under each status it can have.
FastAPI's own 422 is dropped from the document: validation failures are 400s here.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

_STR = {"type": "string"}
_INT = {"type": "integer"}
_NUM = {"type": "number"}
_NULLABLE_STR = {"type": ["string", "null"]}


def _obj(required: dict[str, Any], optional: dict[str, Any] | None = None) -> dict[str, Any]:
    """An object with these keys (more may come: OpenAI adds fields, clients ignore them)."""
    return {"type": "object", "required": list(required), "properties": {**required, **(optional or {})}}


ERROR = _obj(
    {
        "error": _obj(
            {"message": _STR, "type": _STR, "param": _NULLABLE_STR, "code": _NULLABLE_STR},
        )
    }
)

_USAGE = _obj(
    {"prompt_tokens": _INT, "completion_tokens": _INT, "total_tokens": _INT},
    {"prompt_tokens_details": {"type": ["object", "null"]}, "completion_tokens_details": {"type": ["object", "null"]}},
)

_TOOL_CALL = _obj({"id": _STR, "type": {"const": "function"}, "function": _obj({"name": _STR, "arguments": _STR})})
_FINISH = {"type": ["string", "null"]}

CHAT_COMPLETION = _obj(
    {
        "id": _STR,
        "object": {"const": "chat.completion"},
        "created": _INT,
        "model": _STR,
        "choices": {
            "type": "array",
            "items": _obj(
                {
                    "index": _INT,
                    "message": _obj(
                        {"role": {"const": "assistant"}, "content": _NULLABLE_STR},
                        {
                            "tool_calls": {"type": ["array", "null"], "items": _TOOL_CALL},
                            "reasoning_content": _NULLABLE_STR,
                            "reasoning": _NULLABLE_STR,
                            "refusal": _NULLABLE_STR,
                        },
                    ),
                    "finish_reason": _FINISH,
                },
                {"logprobs": {"type": ["object", "null"]}},
            ),
        },
        "usage": _USAGE,
    }
)

COMPLETION = _obj(
    {
        "id": _STR,
        "object": {"const": "text_completion"},
        "created": _INT,
        "model": _STR,
        "choices": {
            "type": "array",
            "items": _obj(
                {"index": _INT, "text": _STR, "finish_reason": _FINISH}, {"logprobs": {"type": ["object", "null"]}}
            ),
        },
        "usage": _USAGE,
    }
)

MODELS = _obj(
    {
        "object": {"const": "list"},
        "data": {
            "type": "array",
            "items": _obj({"id": _STR, "object": {"const": "model"}, "created": _INT, "owned_by": _STR}),
        },
    }
)

RESPONSE = _obj(
    {
        "id": _STR,
        "object": {"const": "response"},
        "created_at": _NUM,
        "status": {"enum": ["completed", "incomplete", "failed", "in_progress"]},
        "model": _STR,
        "output": {"type": "array", "items": _obj({"type": _STR})},
    },
    {
        "usage": {
            "type": ["object", "null"],
            "required": ["input_tokens", "output_tokens", "total_tokens"],
            "properties": {"input_tokens": _INT, "output_tokens": _INT, "total_tokens": _INT},
        },
        "error": {"type": ["object", "null"]},
    },
)

# Each server-sent event (OpenAPI 3.1: `schema` describes one event): a JSON chunk in `data`,
# or `[DONE]` at the end of chat and completions; the Responses API names its events.
_STREAM = {
    "text/event-stream": {
        "schema": {"type": "object", "required": ["data"], "properties": {"data": _STR, "event": _STR}}
    }
}
_ERROR_STATUSES = {
    400: "Invalid request: the error names the `param` and a `code` (invalid_value, invalid_type, "
    "missing_required_parameter, invalid_json, json_too_deep, ...).",
    401: "No or an unknown API key.",
    403: "The key may not do this.",
    404: "Unknown model, route or stored response.",
    413: "The request body, or what its Content-Encoding decodes to, is larger than `limits.max_body_bytes` "
    "(code request_too_large).",
    415: "A Content-Encoding other than zstd, gzip and deflate (code unsupported_content_encoding).",
    429: "A quota or rate limit, or no model can meet the latency objective.",
    503: "Overloaded, an engine unavailable, the quota store unreachable, or draining (with Retry-After).",
}


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {
        s: {"description": _ERROR_STATUSES[s], "content": {"application/json": {"schema": ERROR}}} for s in statuses
    }


def _ok(schema: dict[str, Any], description: str, stream: bool) -> dict[int | str, dict[str, Any]]:
    content: dict[str, Any] = {"application/json": {"schema": schema}}
    if stream:
        content |= _STREAM
    return {200: {"description": description, "content": content}}


_GENERATE_ERRORS = (400, 401, 403, 404, 413, 415, 429, 503)
CHAT = _ok(CHAT_COMPLETION, "A chat completion, or with `stream: true` its chunks as server-sent events.", True)
CHAT |= _errors(*_GENERATE_ERRORS)
COMPLETIONS = _ok(COMPLETION, "A completion, or with `stream: true` its chunks as server-sent events.", True)
COMPLETIONS |= _errors(*_GENERATE_ERRORS)
RESPONSES = _ok(RESPONSE, "A response, or with `stream: true` its events as server-sent events.", True)
RESPONSES |= _errors(*_GENERATE_ERRORS)
LIST_MODELS = _ok(MODELS, "The models this key may use (and routing aliases).", False) | _errors(401, 403)


def request_body(model: type[BaseModel], prefix: str) -> dict[str, Any]:
    """`openapi_extra` for a route that parses its body itself: the model as its request body.
    Its definitions get `prefix` (another surface has a `ContentPart` too); `install` adds them."""
    schema = model.model_json_schema(ref_template=f"#/components/schemas/{prefix}{{model}}")
    _EXTRA_SCHEMAS.update({f"{prefix}{name}": d for name, d in schema.pop("$defs", {}).items()})
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


_EXTRA_SCHEMAS: dict[str, Any] = {}


def install(app: FastAPI) -> None:
    """The app's document, amended once: FastAPI's 422 dropped (this gateway answers 400),
    the definitions of bodies routes parse themselves (`request_body`) added."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = build()
            for item in doc.get("paths", {}).values():
                for op in item.values():
                    if isinstance(op, dict):
                        op.get("responses", {}).pop("422", None)
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                schemas.pop(name, None)
            schemas.update(_EXTRA_SCHEMAS)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
