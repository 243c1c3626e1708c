"""API keys: Bearer tokens checked against stored sha256 hashes in constant time."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from gateway.errors import AuthenticationFailed
from gateway.settings import AuthSettings, PriorityClass


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling (the key's configured name; anonymous when auth is off) and their limits."""

    name: str
    priority: PriorityClass = "interactive"
    max_concurrency: int | None = None
    max_context: int | None = None


ANONYMOUS = Principal("anonymous")


class KeyRing:
    def __init__(self, settings: AuthSettings) -> None:
        self._required = settings.required
        self._keys = [
            (bytes.fromhex(k.sha256), Principal(k.name, k.priority, k.max_concurrency, k.max_context))
            for k in settings.keys
        ]

    def authenticate(self, authorization: str | None) -> Principal:
        if not self._required:
            return ANONYMOUS
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if not token and scheme.lower() in ("", "bearer"):
            raise AuthenticationFailed(
                "You didn't provide an API key. Pass it as 'Authorization: Bearer YOUR_KEY'.",
                code="missing_api_key",
            )
        if scheme.lower() != "bearer" or not token:
            raise AuthenticationFailed("Malformed Authorization header: expected 'Bearer YOUR_KEY'.")
        digest = hashlib.sha256(token.encode()).digest()
        found: Principal | None = None
        # Compare against every key (no early exit), so timing reveals nothing.
        for stored, principal in self._keys:
            if hmac.compare_digest(digest, stored):
                found = principal
        if found is None:
            raise AuthenticationFailed("Incorrect API key provided.")
        return found
