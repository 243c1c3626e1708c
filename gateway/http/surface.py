"""An API surface as one object: what the gateway needs to know about an API it speaks.

Each surface is a folder under gateway/http/ (openai/, responses/, anthropic/) holding its
routes, schemas, input translation and output encoders, and one `Surface` value, defined
beside its router. app.py includes each surface's router and hands the same tuple to the
error handlers (gateway/http/errors.py), which answer a failure on the surface's paths in
its shape. What a surface brings:

    name, router, paths   its routes, and the path prefixes whose errors it answers
    error_status/body     its error JSON and status (OpenAI's unless it says otherwise)
    stream_error          the in-band event that ends a stream an error cut short
    key_headers           where a client of this API sends its key, in order
    params                its names for chat's parameters, for errors the lifecycle raises

A route's work is then the same on every surface (`read`: the key, the body, the schema,
the count; then `lifecycle.prepare_*` and `serving.answer`). The lifecycle owns what every
stream needs: the in-band error, whether the job failed, the usage (docs/lifecycle.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gateway import request_log
from gateway.auth import Principal
from gateway.errors import GatewayError
from gateway.http.deps import authenticate, get_state
from gateway.http.sse import sse
from gateway.lifecycle.run import StreamError
from gateway.redaction import redact
from gateway.state import AppState

T = TypeVar("T")


def openai_status(err: GatewayError) -> int:
    return err.status


def openai_body(err: GatewayError) -> dict[str, Any]:
    """OpenAI's error JSON: the gateway's default shape (also for its own endpoints)."""
    # Messages may quote the client's input (a model name, a value): never a key back.
    param = None if err.param is None else redact(err.param)
    return {"error": {"message": redact(err.message), "type": err.error_type, "param": param, "code": err.code}}


def openai_stream_error(err: GatewayError) -> str:
    """A chat or completions stream's end after an error: the error as a data line, then
    `[DONE]` (as vLLM's server ends one)."""
    return sse(openai_body(err)) + sse("[DONE]")


@dataclass(frozen=True)
class Surface:
    name: str
    router: APIRouter | None = None
    paths: tuple[str, ...] = ()
    error_status: Callable[[GatewayError], int] = openai_status
    error_body: Callable[[GatewayError], dict[str, Any]] = openai_body
    stream_error: StreamError = openai_stream_error
    key_headers: tuple[str, ...] = ("authorization", "x-api-key")
    params: Mapping[str, str] = field(default_factory=dict)

    def answers(self, path: str) -> bool:
        return path.startswith(self.paths) if self.paths else False

    def response(self, err: GatewayError) -> JSONResponse:
        return JSONResponse(self.error_body(err), status_code=self.error_status(err), headers=err.headers)

    def renamed(self, err: GatewayError) -> GatewayError:
        """`err` naming the field this surface's client sent (chat's names otherwise)."""
        return err.renamed(self.params) if self.params else err

    def credentials(self, request: Request) -> str | None:
        """The key, as `Authorization: Bearer <key>`, from the first of `key_headers` sent."""
        for name in self.key_headers:
            value = request.headers.get(name)
            if value is not None:
                return value if name == "authorization" else f"Bearer {value}"
        return None

    async def read(
        self, request: Request, parse: Callable[[bytes], T], *, model: Callable[[T], str], count: bool = True
    ) -> tuple[AppState, Principal, T]:
        """The preamble every route of every surface shares: the key (a failed one is 401
        before the body is looked at), the body parsed by the surface's schema, the request
        counted (`count`) and its model noted for the request's log line."""
        state = get_state(request)
        caller = await authenticate(request, self.credentials(request))
        body = parse(await request.body())
        if count:
            state.counters.requests += 1
        request_log.note_model(request, model(body))
        return state, caller, body


# What a path no surface claims answers in (the gateway's own endpoints, unknown URLs).
DEFAULT = Surface("default")


def surface_of(path: str, surfaces: tuple[Surface, ...]) -> Surface:
    for surface in surfaces:
        if surface.answers(path):
            return surface
    return DEFAULT
