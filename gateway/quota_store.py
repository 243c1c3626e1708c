"""Where quota counters and API keys live: Redis (shared by every replica) or this
process's memory (the embedded default). Both give the same answers; one test
suite (tests/integration/test_quota_store.py) runs against each.

A reservation is taken atomically for all of a request's scopes (its key, its
team, its user): every scope is checked (policies/quotas.py) and only then is
every scope charged, so there is no check-then-count race. It is settled once
with the actual usage (the difference is refunded), or released when the
request never reached an engine. Each reservation has a lease that its replica
renews; a crashed replica's holds are released when their lease runs out.

Redis layout (prefix `sg:`), per scope `s`:
  w:{s}       ZSET  rid -> reserved at (ms)      the rpm/tpm sliding window
  wt:{s}      HASH  rid -> tokens                 (reserved, then actual)
  ws:{s}      STR   the window's token sum        (kept with the entries: O(1) checks)
  live:{s}    SET   rids held now                 max_concurrency
  d:{s}:{day} HASH  prompt, completion, requests, reserved    (UTC day index)
  m:{s}:{mon} HASH  the same per calendar month (year * 12 + month - 1)
and per reservation r:{rid} (its scopes, cost, day, month), leases (ZSET rid ->
expiry), stats (expired, late); keys: key:{sha256} -> JSON, keyids (SET).
Time is Redis's own (`TIME`), so replicas' clocks do not matter. One Redis
(not Cluster): the scripts build key names from their arguments.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, overload

from pydantic import BaseModel, ConfigDict

from gateway.settings import KeyLimits
from policies import quotas
from policies.quotas import Deny, DenyReason, Limits, Period, ScopeState, WindowEntry


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


KEEP_DAY_S = 40 * 86400
KEEP_MONTH_S = 400 * 86400


def epoch_ms() -> int:
    return time.time_ns() // 1_000_000


# --------------------------------------------------------------------------- memory


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


# --------------------------------------------------------------------------- redis

# Shared by the scripts below: the clock, calendar, and finishing a reservation.
_LUA_COMMON = r"""
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function fdiv(a, b) return math.floor(a / b) end
-- policies/quotas.py: civil_from_days / days_from_civil (Howard Hinnant)
local function civil(z)
  z = z + 719468
  local era = fdiv(z >= 0 and z or z - 146096, 146097)
  local doe = z - era * 146097
  local yoe = fdiv(doe - fdiv(doe, 1460) + fdiv(doe, 36524) - fdiv(doe, 146096), 365)
  local y = yoe + era * 400
  local doy = doe - (365 * yoe + fdiv(yoe, 4) - fdiv(yoe, 100))
  local mp = fdiv(5 * doy + 2, 153)
  local m = mp < 10 and mp + 3 or mp - 9
  if m <= 2 then y = y + 1 end
  return y, m
end
local function days_from_civil(y, m)
  if m <= 2 then y = y - 1 end
  local era = fdiv(y >= 0 and y or y - 399, 400)
  local yoe = y - era * 400
  local doy = fdiv(153 * (m > 2 and m - 3 or m + 9) + 2, 5)
  local doe = yoe * 365 + fdiv(yoe, 4) - fdiv(yoe, 100) + doy
  return era * 146097 + doe - 719468
end
local function num(v) return tonumber(v) or 0 end
local function charge(k, prompt, completion, keep)
  redis.call('HINCRBY', k, 'prompt', prompt)
  redis.call('HINCRBY', k, 'completion', completion)
  redis.call('HINCRBY', k, 'requests', 1)
  redis.call('EXPIRE', k, keep)
end
-- Settle (counted) or release (not counted) one reservation; 0 if it is gone. A tombstone
-- (done:{rid} = settled | expired) makes a repeated settle (a retry after a lost reply) a no-op.
local function finish(p, rid, prompt, completion, keep_day, keep_month, how)
  redis.call('ZREM', p .. 'leases', rid)
  local r = p .. 'r:' .. rid
  local rec = redis.call('HMGET', r, 'scopes', 'cost', 'day', 'month')
  if not rec[1] then return 0 end
  local cost = tonumber(rec[2])
  local counted = prompt + completion > 0
  for s in string.gmatch(rec[1], '[^\n]+') do
    local dk, mk = p .. 'd:' .. s .. ':' .. rec[3], p .. 'm:' .. s .. ':' .. rec[4]
    redis.call('HINCRBY', dk, 'reserved', -cost)
    redis.call('HINCRBY', mk, 'reserved', -cost)
    if counted then
      charge(dk, prompt, completion, keep_day)
      charge(mk, prompt, completion, keep_month)
    end
    local w, wt, ws = p .. 'w:' .. s, p .. 'wt:' .. s, p .. 'ws:' .. s
    if redis.call('ZSCORE', w, rid) then
      local was = num(redis.call('HGET', wt, rid))
      if counted then
        redis.call('HSET', wt, rid, prompt + completion)
        redis.call('INCRBY', ws, prompt + completion - was)
      else
        redis.call('ZREM', w, rid)
        redis.call('HDEL', wt, rid)
        redis.call('INCRBY', ws, -was)
      end
    end
    redis.call('SREM', p .. 'live:' .. s, rid)
  end
  redis.call('DEL', r)
  redis.call('SET', p .. 'done:' .. rid, how, 'EX', 86400)
  return 1
end
local function sweep(p, now, keep_day, keep_month)
  local expired = redis.call('ZRANGEBYSCORE', p .. 'leases', '-inf', now, 'LIMIT', 0, 100)
  for _, rid in ipairs(expired) do
    finish(p, rid, 0, 0, keep_day, keep_month, 'expired')
  end
  if #expired > 0 then redis.call('HINCRBY', p .. 'stats', 'expired', #expired) end
  return #expired
end
"""

# ARGV: prefix, rid, cost, window_ms, lease_ms, keep_day_s, keep_month_s, n,
#       then n x (scope, rpm, tpm, daily, monthly, concurrency), -1 for unlimited.
# Returns {1, day, month, now} or {0, scope index (1-based), reason, retry ms, limit, current}.
# Mirrors policies/quotas.check: keep the two in step.
_LUA_RESERVE = r"""
local p, rid = ARGV[1], ARGV[2]
local cost, window, lease = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local keep_day, keep_month, n = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local held = redis.call('HMGET', p .. 'r:' .. rid, 'day', 'month', 'at')
if held[1] then return {1, tonumber(held[1]), tonumber(held[2]), tonumber(held[3])} end  -- a retry
local now = now_ms()
sweep(p, now, keep_day, keep_month)
local day = fdiv(now, 86400000)
local y, m = civil(day)
local month = y * 12 + m - 1
local day_end = (day + 1) * 86400000
local ny, nm = y, m + 1
if nm == 13 then ny, nm = y + 1, 1 end
local month_end = days_from_civil(ny, nm) * 86400000
local scopes = {}
for i = 1, n do
  local b = 8 + (i - 1) * 6
  local s = ARGV[b + 1]
  local rpm, tpm = tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  local daily, monthly, conc = tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5]), tonumber(ARGV[b + 6])
  scopes[i] = s
  local w, wt, ws = p .. 'w:' .. s, p .. 'wt:' .. s, p .. 'ws:' .. s
  local old = redis.call('ZRANGEBYSCORE', w, '-inf', now - window)
  for _, o in ipairs(old) do
    redis.call('INCRBY', ws, -num(redis.call('HGET', wt, o)))
    redis.call('HDEL', wt, o)
  end
  if #old > 0 then redis.call('ZREMRANGEBYSCORE', w, '-inf', now - window) end
  if redis.call('EXISTS', w) == 0 then redis.call('DEL', ws) end
  local live = redis.call('SCARD', p .. 'live:' .. s)
  if conc >= 0 and live + 1 > conc then return {0, i, 'concurrency', 1000, conc, live} end
  local count = redis.call('ZCARD', w)
  if rpm >= 0 and count + 1 > rpm then
    local e = redis.call('ZRANGE', w, count - rpm, count - rpm, 'WITHSCORES')
    return {0, i, 'rpm', math.max(1, tonumber(e[2]) + window - now), rpm, count}
  end
  if tpm >= 0 then
    local held = num(redis.call('GET', ws))
    if cost > tpm then return {0, i, 'tpm_too_large', 0, tpm, cost} end
    if held + cost > tpm then
      local excess, freed, retry = held + cost - tpm, 0, window
      local es = redis.call('ZRANGE', w, 0, -1, 'WITHSCORES')
      for j = 1, #es, 2 do
        freed = freed + num(redis.call('HGET', wt, es[j]))
        if freed >= excess then retry = math.max(1, tonumber(es[j + 1]) + window - now); break end
      end
      return {0, i, 'tpm', retry, tpm, held}
    end
  end
  local budgets = {
    {daily, p .. 'd:' .. s .. ':' .. day, 'daily', day_end},
    {monthly, p .. 'm:' .. s .. ':' .. month, 'monthly', month_end},
  }
  for _, bg in ipairs(budgets) do
    if bg[1] >= 0 then
      local c = redis.call('HMGET', bg[2], 'prompt', 'completion', 'reserved')
      local used, reserved = num(c[1]) + num(c[2]), num(c[3])
      if used + cost > bg[1] then return {0, i, bg[3], math.max(1, bg[4] - now), bg[1], used + reserved} end
      if used + reserved + cost > bg[1] then return {0, i, bg[3] .. '_in_flight', 1000, bg[1], used + reserved} end
    end
  end
end
for _, s in ipairs(scopes) do
  local w, wt, ws = p .. 'w:' .. s, p .. 'wt:' .. s, p .. 'ws:' .. s
  redis.call('ZADD', w, now, rid)
  redis.call('HSET', wt, rid, cost)
  redis.call('INCRBY', ws, cost)
  -- The three expire together, once every entry is older than the window.
  redis.call('PEXPIRE', w, window)
  redis.call('PEXPIRE', wt, window)
  redis.call('PEXPIRE', ws, window)
  local dk, mk = p .. 'd:' .. s .. ':' .. day, p .. 'm:' .. s .. ':' .. month
  redis.call('HINCRBY', dk, 'reserved', cost)
  redis.call('EXPIRE', dk, keep_day)
  redis.call('HINCRBY', mk, 'reserved', cost)
  redis.call('EXPIRE', mk, keep_month)
  redis.call('SADD', p .. 'live:' .. s, rid)
end
redis.call('HSET', p .. 'r:' .. rid, 'scopes', table.concat(scopes, '\n'), 'cost', cost, 'day', day, 'month', month,
  'at', now)
redis.call('ZADD', p .. 'leases', now + lease, rid)
return {1, day, month, now}
"""

# ARGV: prefix, rid, prompt, completion, keep_day_s, keep_month_s, day, month, scopes...
# Returns 1; 0 when the lease had run out (the usage is charged to the periods anyway);
# 2 when it was already settled (a repeat: nothing changes).
_LUA_SETTLE = r"""
local p, rid = ARGV[1], ARGV[2]
local prompt, completion = tonumber(ARGV[3]), tonumber(ARGV[4])
local keep_day, keep_month = tonumber(ARGV[5]), tonumber(ARGV[6])
if finish(p, rid, prompt, completion, keep_day, keep_month, 'settled') == 1 then return 1 end
local done = p .. 'done:' .. rid
if redis.call('GET', done) == 'settled' then return 2 end
redis.call('SET', done, 'settled', 'EX', 86400)
redis.call('HINCRBY', p .. 'stats', 'late', 1)
if prompt + completion > 0 then
  for i = 9, #ARGV do
    charge(p .. 'd:' .. ARGV[i] .. ':' .. ARGV[7], prompt, completion, keep_day)
    charge(p .. 'm:' .. ARGV[i] .. ':' .. ARGV[8], prompt, completion, keep_month)
  end
end
return 0
"""

# ARGV: prefix, lease_ms, rids... -> the rids whose lease is gone.
_LUA_RENEW = r"""
local p, lease = ARGV[1], tonumber(ARGV[2])
local until_ms = now_ms() + lease
local missing = {}
for i = 3, #ARGV do
  if redis.call('ZSCORE', p .. 'leases', ARGV[i]) then
    redis.call('ZADD', p .. 'leases', until_ms, ARGV[i])
  else
    table.insert(missing, ARGV[i])
  end
end
return missing
"""

_LUA_SWEEP = r"""
return sweep(ARGV[1], now_ms(), tonumber(ARGV[2]), tonumber(ARGV[3]))
"""

# ARGV: prefix, scope, window_ms -> {day, month, live, window requests, window tokens,
#   day prompt, completion, requests, reserved, month prompt, completion, requests, reserved}
_LUA_USAGE = r"""
local p, s, window = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now = now_ms()
local day = fdiv(now, 86400000)
local y, m = civil(day)
local month = y * 12 + m - 1
local w, wt = p .. 'w:' .. s, p .. 'wt:' .. s
local rids = redis.call('ZRANGEBYSCORE', w, '(' .. (now - window), '+inf')
local tokens = 0
for _, rid in ipairs(rids) do tokens = tokens + num(redis.call('HGET', wt, rid)) end
local out = {day, month, redis.call('SCARD', p .. 'live:' .. s), #rids, tokens}
for _, k in ipairs({p .. 'd:' .. s .. ':' .. day, p .. 'm:' .. s .. ':' .. month}) do
  local c = redis.call('HMGET', k, 'prompt', 'completion', 'requests', 'reserved')
  for j = 1, 4 do table.insert(out, num(c[j])) end
end
return out
"""


def _lim(v: int | None) -> int:
    return -1 if v is None else v


class RedisQuotaStore:
    """Quota counters and keys in Redis, every decision one atomic Lua script."""

    def __init__(
        self, url: str, *, prefix: str = "sg:", window_s: float = 60.0, lease_s: float = 30.0, timeout_s: float = 0.5
    ) -> None:
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff
        from redis.exceptions import ConnectionError as RedisConnectionError

        # A blocking pool: under a burst, commands wait for a connection instead of failing.
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=64,
            timeout=max(2.0, 4 * timeout_s),
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            decode_responses=True,
            # A pooled connection to a Redis that has since restarted fails its next command:
            # that command is sent once more, on a new connection (every script here is safe to
            # repeat). A timeout is not retried: it already waited its redis_timeout_s.
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        )
        self._pool = pool
        self._redis = aioredis.Redis(connection_pool=pool)
        self.prefix = prefix
        self.window_ms = int(window_s * 1000)
        self.lease_ms = int(lease_s * 1000)
        # register_script: EVALSHA, reloading the script itself after a Redis restart (NOSCRIPT).
        self._reserve = self._redis.register_script(_LUA_COMMON + _LUA_RESERVE)
        self._settle = self._redis.register_script(_LUA_COMMON + _LUA_SETTLE)
        self._renew = self._redis.register_script(_LUA_COMMON + _LUA_RENEW)
        self._sweep = self._redis.register_script(_LUA_COMMON + _LUA_SWEEP)
        self._usage = self._redis.register_script(_LUA_COMMON + _LUA_USAGE)

    @property
    def client(self) -> Any:
        return self._redis

    async def reserve(self, rid: str, scopes: Sequence[tuple[str, Limits]], cost: int) -> Reserved | Refused:
        args: list[str | int] = [self.prefix, rid, cost, self.window_ms, self.lease_ms, KEEP_DAY_S, KEEP_MONTH_S]
        args.append(len(scopes))
        for s, lim in scopes:
            args += [
                s,
                _lim(lim.rpm),
                _lim(lim.tpm),
                _lim(lim.daily_tokens),
                _lim(lim.monthly_tokens),
                _lim(lim.max_concurrency),
            ]
        out = await self._reserve(args=args)
        if int(out[0]) == 1:
            return Reserved(rid, tuple(s for s, _ in scopes), cost, int(out[1]), int(out[2]), int(out[3]))
        _, index, label, retry, limit, current = out
        deny = Deny(DenyReason.by_label(label), int(retry), int(limit), int(current))
        return Refused(scopes[int(index) - 1][0], deny)

    async def settle(self, r: Reserved, prompt_tokens: int, completion_tokens: int) -> bool:
        args: list[str | int] = [
            self.prefix,
            r.rid,
            prompt_tokens,
            completion_tokens,
            KEEP_DAY_S,
            KEEP_MONTH_S,
            r.day,
            r.month,
            *r.scopes,
        ]
        return int(await self._settle(args=args)) != 0

    async def renew(self, rids: Sequence[str]) -> list[str]:
        if not rids:
            return []
        return list(await self._renew(args=[self.prefix, self.lease_ms, *rids]))

    async def sweep(self) -> int:
        return int(await self._sweep(args=[self.prefix, KEEP_DAY_S, KEEP_MONTH_S]))

    async def usage(self, scope: str) -> ScopeUsage:
        out = [int(x) for x in await self._usage(args=[self.prefix, scope, self.window_ms])]
        day, month, live, wreq, wtok = out[:5]
        return ScopeUsage(
            scope=scope,
            day=PeriodUsage(quotas.day_label(day), *out[5:9]),
            month=PeriodUsage(quotas.month_label(month), *out[9:13]),
            window_requests=wreq,
            window_tokens=wtok,
            live=live,
        )

    async def stats(self) -> StoreStats:
        leases = await self._redis.zcard(self.prefix + "leases")
        s = await self._redis.hgetall(self.prefix + "stats")
        return StoreStats(leases=int(leases), expired=int(s.get("expired", 0)), late=int(s.get("late", 0)))

    async def put_key(self, record: KeyRecord) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(self.prefix + "key:" + record.sha256, record.model_dump_json())
            pipe.sadd(self.prefix + "keyids", record.sha256)
            await pipe.execute()

    async def get_key(self, sha256: str) -> KeyRecord | None:
        raw = await self._redis.get(self.prefix + "key:" + sha256)
        return None if raw is None else KeyRecord.model_validate_json(raw)

    async def list_keys(self) -> list[KeyRecord]:
        shas = sorted(str(s) for s in await self._redis.smembers(self.prefix + "keyids"))
        if not shas:
            return []
        raws = await self._redis.mget([self.prefix + "key:" + s for s in shas])
        return sorted((KeyRecord.model_validate(json.loads(r)) for r in raws if r), key=lambda k: k.created_at)

    async def ping(self) -> None:
        await self._redis.ping()

    async def close(self) -> None:
        await self._redis.aclose()
        await self._pool.disconnect()
