"""The quota store's contract: the `QuotaStore` protocol and the values it speaks
(reservations, refusals, usage, stats, API-key records). Two stores implement it,
`MemoryQuotaStore` (memory.py) and `RedisQuotaStore` (redis_store.py); they give
the same answers, and one test suite (tests/integration/test_quota_store.py)
runs against each.

A reservation is taken atomically for all of a request's scopes (its key, its
team, its user): every scope is checked (policies/quotas.py) and only then is
every scope charged, so there is no check-then-count race. It is settled once
with the actual usage (the difference is refunded), or released when the
request never reached an engine. Each reservation has a lease that its replica
renews; a crashed replica's holds are released when their lease runs out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from gateway.settings import KeyLimits
from policies.quotas import Deny, Limits


class KeyRecord(BaseModel):
    """An API key as stored: only its hash, never the key."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    sha256: str
    user: str
    team: str | None = None
    name: str | None = None  # a label ("laptop", "ci")
    prefix: str = ""  # the key's first characters, to recognise it in lists
    created_at: float = 0.0
    revoked_at: float | None = None
    source: str = "store"  # "config" for keys written in the config file
    limits: KeyLimits = KeyLimits()


@dataclass(frozen=True, slots=True)
class Reserved:
    """A held reservation: what was charged where, to be settled exactly once."""

    rid: str
    scopes: tuple[str, ...]
    cost: int
    day: int
    month: int
    at_ms: int


@dataclass(frozen=True, slots=True)
class Refused:
    scope: str
    deny: Deny


@dataclass(frozen=True, slots=True)
class PeriodUsage:
    label: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    requests: int = 0
    reserved_tokens: int = 0  # held by requests in flight

    @property
    def used(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class ScopeUsage:
    scope: str
    day: PeriodUsage
    month: PeriodUsage
    window_requests: int
    window_tokens: int
    live: int


@dataclass(frozen=True, slots=True)
class StoreStats:
    leases: int  # reservations held now
    expired: int  # released because their lease ran out (a replica died or stalled)
    late: int  # settled after their lease had run out


class QuotaStore(Protocol):
    async def reserve(self, rid: str, scopes: Sequence[tuple[str, Limits]], cost: int) -> Reserved | Refused: ...

    async def settle(self, r: Reserved, prompt_tokens: int, completion_tokens: int) -> bool:
        """Charge the actual usage and refund the rest; (0, 0) releases (the request is not
        counted). False when the lease had already run out (the usage is charged anyway).
        Idempotent: settling the same reservation again changes nothing."""
        ...

    async def renew(self, rids: Sequence[str]) -> list[str]:
        """Extend these leases; returns the ones that no longer exist."""
        ...

    async def sweep(self) -> int: ...
    async def usage(self, scope: str) -> ScopeUsage: ...
    async def stats(self) -> StoreStats: ...
    async def put_key(self, record: KeyRecord) -> None: ...
    async def get_key(self, sha256: str) -> KeyRecord | None: ...
    async def list_keys(self) -> list[KeyRecord]: ...
    async def ping(self) -> None: ...
    async def close(self) -> None: ...
