"""The async shell around the quota store: holds that settle exactly once, lease
renewal, and what happens when Redis is away.

- `reserve` charges a request's worst case to its key, team and user before it
  queues; a refusal becomes a 429 (`rate_limit_exceeded` or `insufficient_quota`)
  with Retry-After.
- `Hold.settle(prompt, completion)` charges what the engine really did (0, 0:
  never reached it) from a background task, so every exit path can call it
  synchronously; a hold dropped unsettled is released by the GC safety net.
- Redis down: `on_outage: closed` answers 503 + Retry-After; `open` serves on a
  per-process MemoryQuotaStore with the same limits. Settlements that cannot
  reach Redis wait in an outbox and are applied when it is back; a probe
  reconnects without a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from gateway.errors import QuotaUnavailable, from_quota_refusal
from gateway.quota.memory import MemoryQuotaStore
from gateway.quota.redis_store import RedisQuotaStore
from gateway.quota.store import KeyRecord, QuotaStore, Refused, Reserved, ScopeUsage
from gateway.redaction import redacted_url
from gateway.settings import KeyLimits, PooledLimits, QuotaSettings
from policies.quotas import Limits

if TYPE_CHECKING:
    # Annotations only: importing gateway.auth runs this package's __init__ (for
    # gateway.quota.store), which imports this module.
    from gateway.auth import Principal

# The package's logger: quota log lines read "gateway.quota", whichever module wrote them.
log = logging.getLogger("gateway.quota")
T = TypeVar("T")

PROBE_INTERVAL_S = 0.5
OUTAGE_RETRY_AFTER_S = 2


class StoreDown(Exception):
    """The shared store cannot be reached right now."""


def _store_errors() -> tuple[type[BaseException], ...]:
    import redis.exceptions

    return (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError, asyncio.TimeoutError)


def _counted(lim: KeyLimits | PooledLimits) -> Limits:
    """The limits the store counts, from a key's or a team's settings."""
    return Limits(lim.rpm, lim.tpm, lim.daily_tokens, lim.monthly_tokens, lim.max_concurrency)


def scopes_of(principal: Principal) -> list[tuple[str, Limits]]:
    """The counters a request of this caller charges: its key (the key's limits), its
    team (the team's pooled limits) and its user (counted, for usage reports)."""
    scopes = [(principal.key_scope, _counted(principal.limits))]
    if principal.team_scope is not None:
        scopes.append((principal.team_scope, _counted(principal.pooled)))
    scopes.append((principal.user_scope, Limits()))
    return scopes


@dataclass
class QuotaMetrics:
    reserved: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # by reason label
    settled: int = 0
    released: int = 0
    prompt_tokens: int = 0  # charged (settled) by this replica
    completion_tokens: int = 0
    unreturned_tokens: int = 0  # charged for work whose response the client never got (it left, or an error)
    late_settles: int = 0  # settled after the lease had run out
    outbox_applied: int = 0  # settlements applied to Redis after it came back
    replayed: int = 0  # of those, usage served on local limits during an outage
    outages: int = 0
    outage_s: float = 0.0  # seconds the shared store was away, over ended outages
    local_reserves: int = 0  # reservations served by the per-process fallback (fail-open)


class Hold:
    """One request's reservation. `settle` is idempotent and never blocks."""

    def __init__(self, gate: QuotaGate, reserved: Reserved, store: QuotaStore) -> None:
        self._gate = gate
        self.reserved = reserved
        self.store = store
        self._done = False

    @property
    def rid(self) -> str:
        return self.reserved.rid

    @property
    def settling(self) -> bool:
        return self._done

    def settle(self, prompt_tokens: int, completion_tokens: int, *, returned: bool = True) -> None:
        if self._done:
            return
        self._done = True
        self._gate._settle(self, prompt_tokens, completion_tokens, returned)

    def release(self) -> None:
        self.settle(0, 0)

    def __del__(self) -> None:
        if not self._done:
            log.error("quota hold %s was never settled; releasing it now", self.rid)
            with contextlib.suppress(Exception):
                self.release()


class QuotaGate:
    def __init__(self, settings: QuotaSettings, store: QuotaStore, *, shared: bool) -> None:
        self.settings = settings
        self.store = store
        self.shared = shared  # a store other processes share (Redis): it can be away
        self.local = (
            MemoryQuotaStore(window_s=settings.window_s, lease_s=settings.lease_s)
            if shared and settings.on_outage == "open"
            else None
        )
        self.metrics = QuotaMetrics()
        self._down_since: float | None = None
        # Unsettled holds, their leases renewed here. Weak: a hold its request dropped
        # unsettled is collected (and released by its safety net), not renewed forever.
        self._live: weakref.WeakValueDictionary[str, Hold] = weakref.WeakValueDictionary()
        self._outbox: deque[tuple[Hold, int, int]] = deque()
        self._tasks: set[asyncio.Task[None]] = set()
        self._background: asyncio.Task[None] | None = None
        self._key_cache: dict[str, KeyRecord] = {}  # last seen, for fail-open lookups

    @classmethod
    def from_settings(cls, settings: QuotaSettings) -> QuotaGate:
        if settings.store == "redis":
            store: QuotaStore = RedisQuotaStore(
                settings.redis_url,
                prefix=settings.key_prefix,
                window_s=settings.window_s,
                lease_s=settings.lease_s,
                timeout_s=settings.redis_timeout_s,
            )
            return cls(settings, store, shared=True)
        return cls(settings, MemoryQuotaStore(window_s=settings.window_s, lease_s=settings.lease_s), shared=False)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self.shared:
            try:
                await self.store.ping()
                log.info("quota store: redis at %s", redacted_url(self.settings.redis_url))
            except _store_errors() as e:
                self._mark_down(e)
        self._background = asyncio.create_task(self._maintain())

    async def close(self) -> None:
        if self._background is not None:
            self._background.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._background
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._outbox and not self.is_down:
            with contextlib.suppress(StoreDown):
                await self._flush()
        if self._outbox:
            log.error("quota: %d settlements could not reach the store before shutdown", len(self._outbox))
        await self.store.close()

    @property
    def is_down(self) -> bool:
        return self._down_since is not None

    def outage_seconds(self) -> float:
        """Seconds the shared store has been away in all, the outage going on now included."""
        now = 0.0 if self._down_since is None else time.monotonic() - self._down_since
        return self.metrics.outage_s + now

    def _mark_down(self, exc: BaseException) -> None:
        if self._down_since is None:
            self._down_since = time.monotonic()
            self.metrics.outages += 1
            log.error("quota store unreachable (%s): %s", type(exc).__name__, exc)

    async def _shared(self, call: Callable[[], Awaitable[T]]) -> T:
        """A call to the shared store; StoreDown while it is away (fail fast, no timeout each)."""
        if self._down_since is not None:
            raise StoreDown
        try:
            return await call()
        except _store_errors() as e:
            self._mark_down(e)
            raise StoreDown from e

    # ------------------------------------------------------------------ keys

    async def lookup_key(self, sha256: str) -> KeyRecord | None:
        """A stored key by hash; during an outage, fail-open uses the last copy seen."""
        try:
            record = await self._shared(lambda: self.store.get_key(sha256))
        except StoreDown:
            if self.local is not None and sha256 in self._key_cache:
                return self._key_cache[sha256]
            raise self._unavailable() from None
        if record is not None:
            self._key_cache[sha256] = record
        else:
            self._key_cache.pop(sha256, None)
        return record

    async def put_key(self, record: KeyRecord) -> None:
        await self._required(lambda: self.store.put_key(record))

    async def list_keys(self) -> list[KeyRecord]:
        return await self._required(self.store.list_keys)

    async def usage(self, scope: str) -> ScopeUsage:
        return await self._required(lambda: self.store.usage(scope))

    async def _required(self, call: Callable[[], Awaitable[T]]) -> T:
        """A call that has no local fallback: 503 while the shared store is away."""
        try:
            return await self._shared(call)
        except StoreDown:
            raise self._unavailable() from None

    def _unavailable(self) -> QuotaUnavailable:
        return QuotaUnavailable(
            "The quota store is unavailable; please retry shortly.",
            headers={"Retry-After": str(OUTAGE_RETRY_AFTER_S)},
        )

    # ------------------------------------------------------------------ reservations

    async def reserve(self, principal: Principal, rid: str, cost: int) -> Hold:
        scopes = scopes_of(principal)
        store = self.store
        try:
            out = await self._shared(lambda: self.store.reserve(rid, scopes, cost))
        except StoreDown:
            if self.local is None:
                raise self._unavailable() from None
            store = self.local
            self.metrics.local_reserves += 1
            out = await store.reserve(rid, scopes, cost)
        if isinstance(out, Refused):
            label = out.deny.reason.label
            self.metrics.refused[label] = self.metrics.refused.get(label, 0) + 1
            raise from_quota_refusal(out.scope, out.deny, cost)
        self.metrics.reserved += 1
        hold = Hold(self, out, store)
        self._live[rid] = hold  # renewed until settled
        return hold

    def _settle(self, hold: Hold, prompt: int, completion: int, returned: bool) -> None:
        m = self.metrics
        if prompt + completion > 0:
            m.settled += 1
            m.prompt_tokens += prompt
            m.completion_tokens += completion
            if not returned:
                m.unreturned_tokens += prompt + completion
        else:
            m.released += 1
        # Renewed until the settlement is applied: a settle that waits on a busy loop must not
        # find its lease gone (the reservation swept, its room taken, then charged anyway).
        task = asyncio.get_running_loop().create_task(self._apply(hold, prompt, completion))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _apply(self, hold: Hold, prompt: int, completion: int) -> None:
        try:
            await self._apply_settlement(hold, prompt, completion)
        finally:
            self._live.pop(hold.rid, None)

    async def _apply_settlement(self, hold: Hold, prompt: int, completion: int) -> None:
        if hold.store is not self.store:
            # Served on local limits while Redis was away: settle here, and replay the
            # usage into Redis when it is back so the shared totals miss nothing.
            await hold.store.settle(hold.reserved, prompt, completion)
            if prompt + completion > 0:
                self._outbox.append((hold, prompt, completion))
            return
        try:
            live = await self._shared(lambda: hold.store.settle(hold.reserved, prompt, completion))
        except StoreDown:
            self._outbox.append((hold, prompt, completion))  # its lease may run out meanwhile: then a late settle
            return
        if not live:
            self.metrics.late_settles += 1
            log.warning("quota hold %s was settled after its lease ran out", hold.rid)

    async def _flush(self) -> None:
        while self._outbox:
            hold, prompt, completion = self._outbox[0]
            live = await self._shared(functools.partial(self.store.settle, hold.reserved, prompt, completion))
            self._outbox.popleft()
            self.metrics.outbox_applied += 1
            if hold.store is not self.store:
                self.metrics.replayed += 1
            elif not live:
                self.metrics.late_settles += 1

    async def _maintain(self) -> None:
        """Renew this replica's leases, sweep expired ones, probe Redis while it is away."""
        renew_every = max(self.settings.lease_s / 3, 0.05)
        last_renew = 0.0
        while True:
            await asyncio.sleep(min(PROBE_INTERVAL_S, renew_every))
            try:
                if self._down_since is not None:
                    await self.store.ping()
                    down_s = time.monotonic() - self._down_since
                    self.metrics.outage_s += down_s
                    log.warning("quota store reachable again after %.1fs", down_s)
                    self._down_since = None
                    last_renew = 0.0
                if self._outbox:
                    await self._flush()
                now = time.monotonic()
                if now - last_renew >= renew_every:
                    last_renew = now
                    await self._renew_and_sweep()
            except StoreDown:
                pass
            except _store_errors() as e:
                self._mark_down(e)
            except Exception:  # the loop must survive anything; the next round retries
                log.exception("quota maintenance failed")

    async def _renew_and_sweep(self) -> None:
        live = dict(self._live)  # a snapshot: holds may settle while Redis answers
        for store in (s for s in (self.store, self.local) if s is not None):
            rids = [rid for rid, h in live.items() if h.store is store]
            if store is self.store and self.shared:
                missing = await self._shared(functools.partial(store.renew, rids)) if rids else []
                await self._shared(self.store.sweep)
            else:
                missing = await store.renew(rids)
                await store.sweep()
            for rid in missing:
                if not live[rid].settling:  # else its settlement was applied meanwhile
                    log.warning("quota hold %s lost its lease before it was settled", rid)

    def snapshot(self) -> dict[str, Any]:
        return {
            "store": self.settings.store,
            "on_outage": self.settings.on_outage,
            "down": self.is_down,
            "holds": len(self._live),
            "outbox": len(self._outbox),
            **dataclasses.asdict(self.metrics),
        }
