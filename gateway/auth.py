"""API keys: Bearer tokens checked against stored sha256 hashes.

Keys come from the config file (`auth.keys`, compared in constant time) or
from the quota store (made by `sparkgate keys create`, looked up by hash).
A key's limits are its own, then its team's `defaults`, then
`quotas.defaults`; admin keys (`auth.admin_keys`) only open the admin API.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from gateway.errors import AuthenticationFailed, PermissionDenied
from gateway.quota.store import KeyRecord
from gateway.settings import AuthSettings, KeyLimits, PooledLimits, PriorityClass, QuotaSettings

NO_POOL = PooledLimits()
NO_LIMITS = KeyLimits()


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the user (a person; anonymous when auth is off), the key, and its limits."""

    name: str
    key_id: str = "anonymous"
    team: str | None = None
    limits: KeyLimits = NO_LIMITS  # effective (inheritance applied)
    pooled: PooledLimits = NO_POOL  # the team's shared totals

    @property
    def key_scope(self) -> str:
        return f"key:{self.key_id}"

    @property
    def user_scope(self) -> str:
        return f"user:{self.name}"

    @property
    def team_scope(self) -> str | None:
        return None if self.team is None else f"team:{self.team}"

    @property
    def priority(self) -> PriorityClass:
        return self.limits.priority or "interactive"

    @property
    def max_concurrency(self) -> int | None:
        return self.limits.max_concurrency

    @property
    def max_context(self) -> int | None:
        return self.limits.max_context

    def may_use(self, names: tuple[str, ...]) -> bool:
        """May this caller use a model known by these names (its name and aliases)?"""
        allowed = self.limits.allowed_models
        return allowed is None or any(n in allowed for n in names)


ANONYMOUS = Principal("anonymous")

KeyLookup = Callable[[str], Awaitable[KeyRecord | None]]


T = TypeVar("T")


def _match(digest: bytes, entries: Sequence[tuple[bytes, T]]) -> T | None:
    """The entry whose stored hash is `digest`. Every entry is compared (no early exit),
    so timing reveals nothing about which keys exist."""
    found: T | None = None
    for stored, value in entries:
        if hmac.compare_digest(digest, stored):
            found = value
    return found


def bearer(authorization: str | None) -> str:
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    if not token and scheme.lower() in ("", "bearer"):
        raise AuthenticationFailed(
            "You didn't provide an API key. Pass it as 'Authorization: Bearer YOUR_KEY'.",
            code="missing_api_key",
        )
    if scheme.lower() != "bearer" or not token:
        raise AuthenticationFailed("Malformed Authorization header: expected 'Bearer YOUR_KEY'.")
    return token


class KeyRing:
    def __init__(self, settings: AuthSettings, quotas: QuotaSettings, lookup: KeyLookup | None = None) -> None:
        self._required = settings.required
        self._quotas = quotas
        self._lookup = lookup
        # Config keys, listed beside store keys by the admin API.
        self.configured = [
            KeyRecord(
                id=f"cfg-{k.name}",
                sha256=k.sha256,
                user=k.user or k.name,
                team=k.team,
                name=k.name,
                source="config",
                limits=k.limits(),
            )
            for k in settings.keys
        ]
        self._keys = [
            (bytes.fromhex(r.sha256), self.principal(r.id, r.user, r.team, r.limits)) for r in self.configured
        ]
        self._admins = [(bytes.fromhex(k.sha256), k.name) for k in settings.admin_keys]
        self.anonymous = self.principal("anonymous", "anonymous", None, KeyLimits())

    def principal(self, key_id: str, user: str, team: str | None, own: KeyLimits) -> Principal:
        """A key's caller with its effective limits: its own, then its team's, then the defaults."""
        t = self._quotas.team(team)
        base = self._quotas.defaults if t is None else t.defaults.over(self._quotas.defaults)
        return Principal(user, key_id, team, own.over(base), NO_POOL if t is None else t.pooled)

    async def authenticate(self, authorization: str | None) -> Principal:
        if not self._required:
            return self.anonymous
        digest = hashlib.sha256(bearer(authorization).encode()).digest()
        found = _match(digest, self._keys)
        if found is not None:
            return found
        if self._lookup is not None:
            record = await self._lookup(digest.hex())
            if record is not None and record.revoked_at is None:
                return self.principal(record.id, record.user, record.team, record.limits)
        raise AuthenticationFailed("Incorrect API key provided.")

    async def authenticate_admin(self, authorization: str | None) -> str:
        """The admin key's name. A valid user key gets 403, an unknown key 401."""
        digest = hashlib.sha256(bearer(authorization).encode()).digest()
        found = _match(digest, self._admins)
        if found is not None:
            return found
        if self._required:
            await self.authenticate(authorization)  # 401 unless it is a user's key
        raise PermissionDenied("This endpoint needs an admin key.")
