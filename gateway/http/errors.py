"""Every failure answered in the asking API's error shape: the app's exception handlers, and
`answer` for the middleware that refuses before routing.

The error itself is a value of the vocabulary (gateway/errors.py); the surface whose paths
the request is on (gateway/http/surface.py) writes it. FastAPI's own failures (a body that
does not validate, an unknown URL or method) become the vocabulary's errors here, and an
exception nobody expected is logged with its traceback and answered as a plain 500.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine_adapter.base import EngineError
from gateway import request_log
from gateway.errors import GatewayError, InvalidRequest, MethodNotAllowed, RouteNotFound, from_exception, unexpected
from gateway.http.surface import Surface, surface_of

log = logging.getLogger(__name__)


def surface_for(request: Request) -> Surface:
    """The surface whose paths the request is on (the default shape if none claims it)."""
    # A middleware may run without the app (its tests): the default shape then.
    app = request.scope.get("app")
    surfaces: tuple[Surface, ...] = getattr(getattr(app, "state", None), "surfaces", ())
    return surface_of(request.url.path, surfaces)


def as_error(exc: BaseException) -> GatewayError:
    """Any exception as the vocabulary's error; one nobody expected is logged here, once."""
    if unexpected(exc):
        log.error("unhandled error", exc_info=exc)
    return from_exception(exc)


def answer(request: Request, err: GatewayError) -> JSONResponse:
    """The one way a failure is answered: noted in the request's log line and the dashboard,
    then the asking API's error JSON (the handlers below, and middleware that answers before
    routing)."""
    request_log.note_error(request, err)  # the request's log line says why
    # The dashboard's ring of recent rejections (gateway/dashboard.py), once the app runs.
    app = request.scope.get("app")
    recent = getattr(getattr(getattr(app, "state", None), "sparkgate", None), "recent", None)
    if recent is not None:
        recent.add_rejection(err, request.url.path, getattr(request.state, "user", None))
    return surface_for(request).response(err)


# Labels pydantic puts in an error's location for the union member it tried (`str`,
# `list[str]`, `ChatMessage`, `function-after[...]`): not the client's field names.
_UNION_LABEL = re.compile(r"^(?:str|int|float|bool|none|[a-z-]*\[.*\]|[A-Z][A-Za-z0-9]*)$")
_EXPECTED = {
    "string_type": "a string",
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "a boolean",
    "list_type": "an array",
    "tuple_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "none_required": "null",
}


def param_path(loc: Sequence[int | str]) -> str | None:
    """An error location as OpenAI names a parameter: `messages[3].content`, `seed`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "body" and not out:
            continue
        elif not _UNION_LABEL.match(part):
            out += f".{part}" if out else part
    return out or None


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    return "an object"


def validation_message(exc: RequestValidationError) -> tuple[str, str | None, str]:
    """(message, param, code) of a validation failure: the deepest error (where a union was
    tried, the member that got furthest), type errors as `invalid_type` (as OpenAI names them)."""
    errors = [dict(e) for e in exc.errors()]
    if not errors:
        return "Invalid request.", None, "invalid_value"
    # Deepest first; at one depth a wrong value before a wrong type (the union member whose
    # type matched is the one the client meant: `prompt: [1, -2]` is a bad token id).
    errors.sort(key=lambda e: (-len(e.get("loc", ())), e.get("type") in _EXPECTED))
    first = errors[0]
    param = param_path(first.get("loc", ()))
    kind = str(first.get("type", ""))
    if kind == "json_invalid":
        return "We could not parse the JSON body of your request.", None, "invalid_json"
    if kind == "missing":
        return f"Missing required parameter: '{param}'.", param, "missing_required_parameter"
    if kind in _EXPECTED:
        # Every member a union tried at this place: "expected a string or an array".
        same = [e for e in errors if param_path(e.get("loc", ())) == param and e.get("type") in _EXPECTED]
        expected = " or ".join(dict.fromkeys(_EXPECTED[str(e["type"])] for e in same))
        got = _json_kind(first.get("input"))
        where = f"'{param}'" if param else "the request body"
        return f"Invalid type for {where}: expected {expected}, but got {got} instead.", param, "invalid_type"
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if kind == "finite_number":
        msg = "must be a finite number (not NaN or Infinity)"
    if param is None:
        return f"Invalid request body: {msg}.", None, "invalid_value"
    return f"Invalid value for '{param}': {msg}.", param, "invalid_value"


def install(app: FastAPI, surfaces: tuple[Surface, ...] = ()) -> None:
    """Register the handlers that turn every failure into the asking API's error JSON; a
    request on a surface's paths is answered in that surface's shape."""
    app.state.surfaces = surfaces

    async def on_error(request: Request, exc: Exception) -> JSONResponse:
        return answer(request, as_error(exc))

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        message, param, code = validation_message(exc)
        return answer(request, InvalidRequest(message, param=param, code=code))

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 404:
            return answer(request, RouteNotFound("Unknown request URL. Please check the URL and method."))
        if exc.status_code == 405:  # with the route's `Allow` (RFC 9110 requires it)
            return answer(
                request, MethodNotAllowed("Method not allowed for this URL.", headers=dict(exc.headers or {}))
            )
        err = InvalidRequest(str(exc.detail), code=None)
        err.status = exc.status_code  # type: ignore[misc]
        return answer(request, err)

    app.add_exception_handler(GatewayError, on_error)
    app.add_exception_handler(EngineError, on_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_error)
