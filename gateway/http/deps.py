"""FastAPI dependencies as Annotated aliases: state from the app, auth from headers.

Every key check goes through the failed-authentication table (gateway/failed_auth.py): a
client blocked for too many failures gets 429 before its key is looked at."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from gateway import request_log
from gateway.auth import Principal
from gateway.state import AppState
from policies.failed_auth import client_key


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.sparkgate
    return state


def client_address(request: Request) -> str:
    """Whose failures count: the socket's peer, or the client a trusted proxy names (uvicorn
    rewrites the peer from X-Forwarded-For for `server.trusted_proxies` only)."""
    return client_key(request.client.host if request.client is not None else None)


def credentials(request: Request, authorization: str | None) -> str | None:
    """The key as `Authorization: Bearer` (OpenAI's SDKs) or `x-api-key` (Anthropic's)."""
    if authorization is None and (key := request.headers.get("x-api-key")) is not None:
        return f"Bearer {key}"
    return authorization


async def authenticate(request: Request, authorization: str | None) -> Principal:
    """The caller whose key this is (`Authorization: Bearer <key>`), through the failed-auth
    table; noted for the dashboard's rejections and the request's log line."""
    state = get_state(request)
    principal = await state.failed_auth.guarded(client_address(request), lambda: state.keys.authenticate(authorization))
    request.state.user = principal.name  # for the dashboard's rejections (gateway/http/errors.py)
    request_log.note_caller(request, principal)
    return principal


async def get_principal(request: Request, authorization: Annotated[str | None, Header()] = None) -> Principal:
    return await authenticate(request, credentials(request, authorization))


async def get_admin(request: Request, authorization: Annotated[str | None, Header()] = None) -> str:
    state = get_state(request)
    return await state.failed_auth.guarded(
        client_address(request), lambda: state.keys.authenticate_admin(authorization)
    )


async def _state(request: Request) -> AppState:
    # async: FastAPI runs a plain `def` dependency in its thread pool, a thread hop (and a
    # wait for the GIL) on every request for an attribute lookup.
    return get_state(request)


State = Annotated[AppState, Depends(_state)]
Caller = Annotated[Principal, Depends(get_principal)]
Admin = Annotated[str, Depends(get_admin)]
