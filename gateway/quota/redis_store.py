"""The Redis quota store: counters and keys shared by every replica, each decision
one atomic Lua script. The scripts are package data (scripts/*.lua), each sent
with the helpers of scripts/common.lua in front of it.

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

import functools
import json
from collections.abc import Callable, Sequence
from importlib.resources import files
from typing import Any

from gateway.quota.store import KeyRecord, PeriodUsage, Refused, Reserved, ScopeUsage, StoreStats
from policies import quotas
from policies.quotas import Deny, DenyReason, Limits

KEEP_DAY_S = 40 * 86400
KEEP_MONTH_S = 400 * 86400


@functools.cache
def _read(name: str) -> str:
    return (files(__package__) / "scripts" / f"{name}.lua").read_text(encoding="utf-8")


def _script(name: str) -> str:
    """The Lua script `scripts/{name}.lua` as sent to Redis: the shared helpers, then the script."""
    return _read("common") + _read(name)


def _lim(v: int | None) -> int:
    return -1 if v is None else v


class RedisQuotaStore:
    """Quota counters and keys in Redis, every decision one atomic Lua script."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "sg:",
        window_s: float = 60.0,
        lease_s: float = 30.0,
        timeout_s: float = 0.5,
        clock: Callable[[], int] | None = None,
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
        # Epoch ms for every script instead of Redis's TIME: lets tests step time instead of
        # sleeping through windows and leases (MemoryQuotaStore takes the same clock).
        self._clock = clock
        # register_script: EVALSHA, reloading the script itself after a Redis restart (NOSCRIPT).
        self._reserve = self._redis.register_script(_script("reserve"))
        self._settle = self._redis.register_script(_script("settle"))
        self._renew = self._redis.register_script(_script("renew"))
        self._sweep = self._redis.register_script(_script("sweep"))
        self._usage = self._redis.register_script(_script("usage"))

    def _now(self) -> list[str]:
        return [] if self._clock is None else [str(self._clock())]

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
        out = await self._reserve(keys=self._now(), args=args)
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
        return int(await self._settle(keys=self._now(), args=args)) != 0

    async def renew(self, rids: Sequence[str]) -> list[str]:
        if not rids:
            return []
        return list(await self._renew(keys=self._now(), args=[self.prefix, self.lease_ms, *rids]))

    async def sweep(self) -> int:
        return int(await self._sweep(keys=self._now(), args=[self.prefix, KEEP_DAY_S, KEEP_MONTH_S]))

    async def usage(self, scope: str) -> ScopeUsage:
        out = [int(x) for x in await self._usage(keys=self._now(), args=[self.prefix, scope, self.window_ms])]
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
