"""Request bodies decoded by msgspec's JSON parser, with the standard library's verdict.

FastAPI reads a route's JSON body with `json.loads`: for a 32K-token id prompt (233 KiB) that
is 1.8 ms of the event loop, the largest part of what sparkgate adds to a long prompt's TTFT.
msgspec (a dependency of vLLM) decodes it in well under half that. Wherever msgspec accepts
a document it yields the same Python values as `json.loads` (integers of any size included);
what it refuses (NaN and Infinity literals, floats out of range, lone surrogates, anything not
JSON) goes to `json.loads`, whose value or JSONDecodeError stands, except that a string with a
lone surrogate (`"\ud800"`) is refused too: it is no Unicode text, and an answer quoting it
could not be encoded. So the request models see what they saw before, only sooner.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import msgspec
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

_decode = msgspec.json.Decoder().decode
M = TypeVar("M", bound=BaseModel)


def decode(raw: bytes) -> Any:
    """`json.loads(raw)`, faster where it can be."""
    try:
        return _decode(raw)
    except msgspec.MsgspecError:
        value = json.loads(raw)
    try:  # the slow path only: msgspec refused the document
        json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError as e:
        text = raw.decode(errors="replace")
        raise json.JSONDecodeError("a string holds a lone surrogate, which is not Unicode text", text, 0) from e
    return value


def document(raw: bytes) -> Any:
    """The body as JSON (None when empty), or the error FastAPI raises for a body it cannot
    read, before any dependency (the key) is looked at."""
    if not raw:
        return None
    try:
        return decode(raw)
    except json.JSONDecodeError as e:
        error = {"type": "json_invalid", "loc": ("body", e.pos), "msg": "JSON decode error", "input": {}}
        raise RequestValidationError([error | {"ctx": {"error": e.msg}}], body=e.doc) from None


def validate(model: type[M], data: Any) -> M:
    """`data` as `model`, or FastAPI's RequestValidationError for a body parameter (locations
    under `body`; a missing or null body is a missing body), which the app answers with a 400."""
    if data is None:
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise RequestValidationError(
            [{**err, "loc": ("body", *err["loc"])} for err in e.errors(include_url=False)], body=data
        ) from None


class JSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = decode(await self.body())
        return self._json


class JSONRoute(APIRoute):
    """A route whose body FastAPI parses with `decode` (FastAPI calls `request.json()`)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            return await handler(JSONRequest(request.scope, request.receive))

        return route
