"""FastAPI dependencies as Annotated aliases: state from the app, auth from headers."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from gateway import request_log
from gateway.auth import Principal
from gateway.state import AppState


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.sparkgate
    return state


async def get_principal(request: Request, authorization: Annotated[str | None, Header()] = None) -> Principal:
    principal = await get_state(request).keys.authenticate(authorization)
    request.state.user = principal.name  # for the dashboard's rejections (gateway/errors.py)
    request_log.note_caller(request, principal)
    return principal


async def get_admin(request: Request, authorization: Annotated[str | None, Header()] = None) -> str:
    return await get_state(request).keys.authenticate_admin(authorization)


State = Annotated[AppState, Depends(get_state)]
Caller = Annotated[Principal, Depends(get_principal)]
Admin = Annotated[str, Depends(get_admin)]
