"""Keys and usage: the admin API (admin keys only) and a caller's own usage.

POST   /sparkgate/admin/keys            create a key; the key itself is shown once
GET    /sparkgate/admin/keys            list keys (never their hashes)
DELETE /sparkgate/admin/keys/{id}       revoke (store keys; config keys live in the config)
GET    /sparkgate/admin/usage?key_id=|user=|team=
POST   /sparkgate/admin/canary?model=   run the canary (gateway/canary.py) now: every model, or one
GET    /sparkgate/usage                 the calling key's own usage and limits

Every route under /sparkgate/admin, and any path there that is no route, goes through
`admin_router`, whose dependency checks the admin key before anything else runs: a route
added later cannot forget it. No key or an unknown one: 401; a user's key: 403.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from fastapi import APIRouter, Depends, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from gateway import canary
from gateway.errors import InvalidRequest, RouteNotFound
from gateway.http.deps import Caller, State, get_admin
from gateway.quota import KeyRecord, ScopeUsage
from gateway.router import unknown_slo_class
from gateway.settings import KeyLimits, hash_key
from gateway.state import AppState

router = APIRouter(prefix="/sparkgate")
admin_router = APIRouter(prefix="/sparkgate/admin", dependencies=[Depends(get_admin)])

NAME = r"^[A-Za-z0-9_.@-]{1,64}$"
KEY_PREFIX = "sk-sg-"


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user: str = Field(pattern=NAME)
    team: str | None = Field(None, pattern=NAME)
    name: str | None = Field(None, max_length=64)
    limits: KeyLimits = KeyLimits()


def _public(k: KeyRecord) -> dict[str, Any]:
    return k.model_dump(exclude={"sha256"}, mode="json") | {"limits": k.limits.model_dump(exclude_none=True)}


def _usage(u: ScopeUsage, window_s: float) -> dict[str, Any]:
    def period(p: Any) -> dict[str, Any]:
        return {
            "period": p.label,
            "prompt_tokens": p.prompt_tokens,
            "completion_tokens": p.completion_tokens,
            "total_tokens": p.used,
            "requests": p.requests,
            "reserved_tokens": p.reserved_tokens,
        }

    return {
        "scope": u.scope,
        "day": period(u.day),
        "month": period(u.month),
        "window": {"seconds": window_s, "requests": u.window_requests, "tokens": u.window_tokens},
        "in_flight": u.live,
    }


async def _all_keys(state: AppState) -> list[KeyRecord]:
    return [*state.keys.configured, *await state.quota.list_keys()]


async def _key(state: AppState, key_id: str) -> KeyRecord:
    record = next((k for k in await _all_keys(state) if k.id == key_id), None)
    if record is None:
        raise RouteNotFound(f"No key with id {key_id!r}.", code="key_not_found")
    return record


@admin_router.post("/keys", status_code=201)
async def create_key(body: KeyCreate, state: State) -> JSONResponse:
    if body.team is not None and state.settings.quotas.team(body.team) is None:
        known = ", ".join(t.name for t in state.settings.quotas.teams) or "none configured"
        raise InvalidRequest(f"Unknown team {body.team!r} (teams: {known}).", param="team", code="unknown_team")
    if body.limits.allowed_models is not None:
        names = {n for m in state.registry for n in m.settings.names}
        unknown = [m for m in body.limits.allowed_models if m not in names]
        if unknown:
            raise InvalidRequest(f"Unknown models: {', '.join(unknown)}.", param="limits.allowed_models")
    routing, slo = state.settings.routing, body.limits.slo_class
    if routing.enabled and slo is not None and slo not in routing.classes:
        raise unknown_slo_class(routing, slo, param="limits.slo_class")
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    record = KeyRecord(
        id="key_" + secrets.token_hex(8),
        sha256=hash_key(key),
        user=body.user,
        team=body.team,
        name=body.name,
        prefix=key[: len(KEY_PREFIX) + 4],
        created_at=time.time(),
        limits=body.limits,
    )
    await state.quota.put_key(record)
    return JSONResponse(_public(record) | {"key": key}, status_code=201)


@admin_router.get("/keys")
async def list_keys(state: State) -> dict[str, Any]:
    return {"object": "list", "data": [_public(k) for k in await _all_keys(state)]}


@admin_router.delete("/keys/{key_id}")
async def revoke_key(key_id: str, state: State) -> dict[str, Any]:
    record = await _key(state, key_id)
    if record.source == "config":
        raise InvalidRequest(f"Key {key_id!r} is defined in the config file; remove it there.", code="config_key")
    if record.revoked_at is None:
        record = record.model_copy(update={"revoked_at": time.time()})
        await state.quota.put_key(record)
    return _public(record) | {"revoked": True}


@admin_router.get("/usage")
async def admin_usage(
    state: State,
    key_id: str | None = Query(None),
    user: str | None = Query(None),
    team: str | None = Query(None),
) -> dict[str, Any]:
    given = [(kind, v) for kind, v in (("key", key_id), ("user", user), ("team", team)) if v is not None]
    if len(given) != 1:
        raise InvalidRequest("Give exactly one of key_id, user or team.", code="invalid_value")
    kind, value = given[0]
    body = _usage(await state.quota.usage(f"{kind}:{value}"), state.settings.quotas.window_s)
    if kind == "key":
        body["key"] = _public(await _key(state, value))
    return body


@admin_router.post("/canary")
async def run_canary(state: State, model: str | None = Query(None)) -> dict[str, Any]:
    """Each model's (or `model`'s) answer cold and from its prefix cache, compared; a model
    whose answers differ is marked degraded until a run passes. Runs one at a time."""
    models = None if model is None else [state.registry.resolve(model)]  # 404 for an unknown name
    results = await canary.run(state, models)
    return {
        "results": {r.model: state.canary.view(r.model) or r.view() for r in results},
        "degraded": sorted(state.canary.degraded()),
    }


@admin_router.api_route(
    "/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"], include_in_schema=False
)
async def admin_unknown(path: str) -> None:
    """Last in the admin router: an unknown admin path is 401/403 to non-admins (it reveals
    nothing about which admin routes exist), 404 to an admin."""
    raise RouteNotFound("Unknown request URL. Please check the URL and method.")


@router.get("/usage")
async def own_usage(state: State, caller: Caller) -> dict[str, Any]:
    """The caller's own key and user totals: no one else's."""
    window = state.settings.quotas.window_s
    return {
        "user": caller.name,
        "key_id": caller.key_id,
        "team": caller.team,
        "limits": caller.limits.model_dump(exclude_none=True),
        "team_pooled_limits": caller.pooled.model_dump(exclude_none=True),
        "key": _usage(await state.quota.usage(caller.key_scope), window),
        "user_total": _usage(await state.quota.usage(caller.user_scope), window),
    }
