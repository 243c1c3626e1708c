"""The in-memory quota store: this process's counters and keys (the embedded
default, and the per-process fallback while Redis is away when `on_outage: open`).
It applies the same rules (policies/quotas.py) and keeps the same books as the
Redis scripts (redis_store.py, scripts/*.lua), in one process.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import overload

from gateway.quota.store import KeyRecord, PeriodUsage, Refused, Reserved, ScopeUsage, StoreStats
from policies import quotas
from policies.quotas import Deny, Limits, Period, ScopeState, WindowEntry


def epoch_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class _Counts:
    prompt: int = 0
    completion: int = 0
    requests: int = 0
    reserved: int = 0

    def charge(self, prompt: int, completion: int) -> None:
        self.prompt += prompt
        self.completion += completion
        self.requests += 1


@dataclass
class _Scope:
    window: OrderedDict[str, WindowEntry] = field(default_factory=OrderedDict)  # oldest first
    tokens: int = 0  # the window's token sum, kept as entries come, change and go
    live: set[str] = field(default_factory=set)

    def put(self, rid: str, entry: WindowEntry) -> None:
        old = self.window.get(rid)
        self.tokens += entry.tokens - (old.tokens if old else 0)
        self.window[rid] = entry

    def drop(self, rid: str) -> None:
        self.tokens -= self.window.pop(rid).tokens


class _WindowView(Sequence[WindowEntry]):
    """The window's entries, oldest first, without copying them (read only on a refusal)."""

    def __init__(self, window: OrderedDict[str, WindowEntry]) -> None:
        self._w = window

    def __len__(self) -> int:
        return len(self._w)

    def __iter__(self) -> Iterator[WindowEntry]:
        return iter(self._w.values())

    @overload
    def __getitem__(self, i: int) -> WindowEntry: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[WindowEntry]: ...
    def __getitem__(self, i: int | slice) -> WindowEntry | Sequence[WindowEntry]:
        return list(self._w.values())[i]


class MemoryQuotaStore:
    """The same rules and bookkeeping as the Redis scripts, in one process.

    Calls run to completion between awaits, which is what makes them atomic here.
    """

    def __init__(self, *, window_s: float = 60.0, lease_s: float = 30.0, clock: Callable[[], int] = epoch_ms) -> None:
        self.window_ms = int(window_s * 1000)
        self.lease_ms = int(lease_s * 1000)
        self._clock = clock
        self._scopes: dict[str, _Scope] = {}
        self._periods: dict[tuple[str, str, int], _Counts] = {}
        self._records: dict[str, Reserved] = {}
        self._leases: dict[str, int] = {}
        self._done: OrderedDict[str, tuple[str, int]] = OrderedDict()  # rid -> (settled | expired, when)
        self._keys: dict[str, KeyRecord] = {}
        self._expired = 0
        self._late = 0

    def _scope(self, s: str, now: int) -> _Scope:
        sc = self._scopes.setdefault(s, _Scope())
        edge = now - self.window_ms
        while sc.window:
            rid, e = next(iter(sc.window.items()))
            if e.at_ms > edge:
                break
            sc.drop(rid)
        return sc

    def _period(self, s: str, kind: str, index: int) -> _Counts:
        return self._periods.setdefault((s, kind, index), _Counts())

    async def reserve(self, rid: str, scopes: Sequence[tuple[str, Limits]], cost: int) -> Reserved | Refused:
        if rid in self._records:
            return self._records[rid]  # a retry
        now = self._clock()
        self._sweep(now)
        day, month = quotas.day_index(now), quotas.month_index(now)
        for s, limits in scopes:
            sc = self._scope(s, now)
            d, m = self._period(s, "d", day), self._period(s, "m", month)
            state = ScopeState(
                live=len(sc.live),
                window_requests=len(sc.window),
                window_tokens=sc.tokens,
                window=_WindowView(sc.window),
                day=Period(d.prompt + d.completion, d.reserved),
                month=Period(m.prompt + m.completion, m.reserved),
            )
            verdict = quotas.check(limits, state, cost, now, self.window_ms)
            if isinstance(verdict, Deny):
                return Refused(s, verdict)
        for s, _ in scopes:
            sc = self._scopes[s]
            sc.put(rid, WindowEntry(now, cost))
            sc.live.add(rid)
            self._period(s, "d", day).reserved += cost
            self._period(s, "m", month).reserved += cost
        r = Reserved(rid, tuple(s for s, _ in scopes), cost, day, month, now)
        self._records[rid] = r
        self._leases[rid] = now + self.lease_ms
        return r

    def _finish(self, rid: str, prompt: int, completion: int, how: str) -> bool:
        self._leases.pop(rid, None)
        r = self._records.pop(rid, None)
        if r is None:
            return False
        self._done[rid] = (how, self._clock())
        counted = prompt + completion > 0
        for s in r.scopes:
            sc = self._scopes[s]
            for c in (self._period(s, "d", r.day), self._period(s, "m", r.month)):
                c.reserved -= r.cost
                if counted:
                    c.charge(prompt, completion)
            if rid in sc.window:
                if counted:
                    sc.put(rid, WindowEntry(sc.window[rid].at_ms, prompt + completion))
                else:
                    sc.drop(rid)
            sc.live.discard(rid)
        return True

    async def settle(self, r: Reserved, prompt_tokens: int, completion_tokens: int) -> bool:
        if self._finish(r.rid, prompt_tokens, completion_tokens, "settled"):
            return True
        if self._done.get(r.rid, ("", 0))[0] == "settled":
            return True  # a repeat
        self._done[r.rid] = ("settled", self._clock())
        self._late += 1
        if prompt_tokens + completion_tokens > 0:  # the hold is gone; the usage still counts
            for s in r.scopes:
                for c in (self._period(s, "d", r.day), self._period(s, "m", r.month)):
                    c.charge(prompt_tokens, completion_tokens)
        return False

    async def renew(self, rids: Sequence[str]) -> list[str]:
        now = self._clock()
        missing = []
        for rid in rids:
            if rid in self._leases:
                self._leases[rid] = now + self.lease_ms
            else:
                missing.append(rid)
        return missing

    def _sweep(self, now: int) -> int:
        while self._done and next(iter(self._done.values()))[1] < now - quotas.DAY_MS:
            self._done.popitem(last=False)
        expired = [rid for rid, until in self._leases.items() if until <= now]
        for rid in expired:
            self._finish(rid, 0, 0, "expired")
        self._expired += len(expired)
        return len(expired)

    async def sweep(self) -> int:
        return self._sweep(self._clock())

    async def usage(self, scope: str) -> ScopeUsage:
        now = self._clock()
        sc = self._scope(scope, now)
        day, month = quotas.day_index(now), quotas.month_index(now)
        d, m = self._period(scope, "d", day), self._period(scope, "m", month)
        return ScopeUsage(
            scope=scope,
            day=PeriodUsage(quotas.day_label(day), d.prompt, d.completion, d.requests, d.reserved),
            month=PeriodUsage(quotas.month_label(month), m.prompt, m.completion, m.requests, m.reserved),
            window_requests=len(sc.window),
            window_tokens=sc.tokens,
            live=len(sc.live),
        )

    async def stats(self) -> StoreStats:
        return StoreStats(leases=len(self._leases), expired=self._expired, late=self._late)

    async def put_key(self, record: KeyRecord) -> None:
        self._keys[record.sha256] = record

    async def get_key(self, sha256: str) -> KeyRecord | None:
        return self._keys.get(sha256)

    async def list_keys(self) -> list[KeyRecord]:
        return sorted(self._keys.values(), key=lambda k: k.created_at)

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        return None
