"""FastAPI dependencies as Annotated aliases: state from the app, auth from headers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Header, Request

from gateway.admission import AdmissionControl
from gateway.auth import KeyRing, Principal
from gateway.quota import QuotaGate
from gateway.registry import ModelRegistry
from gateway.router import Router
from gateway.settings import Settings


@dataclass
class Counters:
    """Gateway-side request outcomes, exposed at /sparkgate/stats."""

    requests: int = 0
    completed: int = 0
    failed: int = 0
    client_disconnects: int = 0
    by_model_inflight: dict[str, int] = field(default_factory=dict)


@dataclass
class AppState:
    settings: Settings
    registry: ModelRegistry
    keys: KeyRing
    counters: Counters
    admission: AdmissionControl
    quota: QuotaGate
    router: Router | None = None  # latency-SLO routing (settings.routing.enabled)


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.sparkgate
    return state


async def get_principal(request: Request, authorization: Annotated[str | None, Header()] = None) -> Principal:
    return await get_state(request).keys.authenticate(authorization)


async def get_admin(request: Request, authorization: Annotated[str | None, Header()] = None) -> str:
    return await get_state(request).keys.authenticate_admin(authorization)


State = Annotated[AppState, Depends(get_state)]
Caller = Annotated[Principal, Depends(get_principal)]
Admin = Annotated[str, Depends(get_admin)]
