"""Stored responses (/v1/responses): what `GET /v1/responses/{id}` returns and what
`previous_response_id` continues.

A record is the response object as it was returned, the conversation that continues it
(chat-form messages: the input of every response in its chain and their output, without
the instructions, which OpenAI does not carry over), and the user who owns it. Two
backends, chosen like the quota store's (`quotas.store`):

- `MemoryResponseStore`: this process; at most `responses.max_stored` records and
  `responses.max_stored_bytes` of them (images make a conversation megabytes), each for
  `responses.ttl_s` (the oldest go first).
- `RedisResponseStore`: shared by every replica; one key per record,
  `{quotas.key_prefix}resp:{id}`, written with `SET ... EX ttl`, so Redis expires it.

Both keep the record as JSON text: what a reader gets is a copy, never the writer's objects.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.errors import StoreUnavailable
from gateway.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoredResponse:
    user: str  # the owner's name (Principal.name): only they may read, continue or delete it
    response: dict[str, Any]
    messages: list[dict[str, Any]]  # the conversation in chat form, this response's output included

    def to_json(self) -> str:
        return json.dumps(
            {"user": self.user, "response": self.response, "messages": self.messages},
            ensure_ascii=False,
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> StoredResponse:
        data = json.loads(text)
        return cls(user=data["user"], response=data["response"], messages=data["messages"])


class ResponseStore(Protocol):
    async def put(self, response_id: str, record: StoredResponse) -> None: ...

    async def get(self, response_id: str) -> StoredResponse | None:
        """The record, or None when it is unknown or expired."""
        ...

    async def delete(self, response_id: str) -> bool:
        """Whether there was a record to delete."""
        ...

    async def close(self) -> None: ...


class MemoryResponseStore:
    """Records in this process: bounded in count and in bytes (their JSON's characters), each
    kept `ttl_s`. A record larger than the whole byte bound is not kept."""

    def __init__(
        self,
        *,
        ttl_s: float,
        max_stored: int,
        max_bytes: int = 512 * 1024 * 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_stored = max_stored
        self.max_bytes = max_bytes
        self.bytes = 0  # the JSON held, in characters
        self._clock = clock
        self._records: OrderedDict[str, tuple[float, str]] = OrderedDict()  # id -> (expires at, JSON)

    def __len__(self) -> int:
        return len(self._records)

    def _drop(self, response_id: str | None = None) -> bool:
        """Drop a record (None: the oldest); whether there was one."""
        if response_id is None:
            _, (_, text) = self._records.popitem(last=False)
        elif (entry := self._records.pop(response_id, None)) is not None:
            text = entry[1]
        else:
            return False
        self.bytes -= len(text)
        return True

    def _expire(self, now: float) -> None:
        # Every record lives ttl_s from its write, so the oldest write expires first.
        while self._records:
            first = next(iter(self._records.values()))
            if first[0] > now:
                return
            self._drop()

    async def put(self, response_id: str, record: StoredResponse) -> None:
        now = self._clock()
        self._expire(now)
        self._drop(response_id)
        text = record.to_json()
        if len(text) > self.max_bytes:
            log.warning("response %s not stored: %d bytes, over responses.max_stored_bytes", response_id, len(text))
            return
        while self._records and (len(self._records) >= self.max_stored or self.bytes + len(text) > self.max_bytes):
            self._drop()
        self._records[response_id] = (now + self.ttl_s, text)
        self.bytes += len(text)

    async def get(self, response_id: str) -> StoredResponse | None:
        self._expire(self._clock())
        entry = self._records.get(response_id)
        return None if entry is None else StoredResponse.from_json(entry[1])

    async def delete(self, response_id: str) -> bool:
        self._expire(self._clock())
        return self._drop(response_id)

    async def close(self) -> None:
        self._records.clear()
        self.bytes = 0


def _redis_errors() -> tuple[type[BaseException], ...]:
    import redis.exceptions

    return (redis.exceptions.RedisError, OSError, asyncio.TimeoutError)


class RedisResponseStore:
    """Records in Redis, each a JSON string under `{prefix}{id}` that Redis expires."""

    def __init__(self, url: str, *, prefix: str, ttl_s: float, timeout_s: float = 0.5) -> None:
        import redis.asyncio as aioredis

        self._redis = aioredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, decode_responses=True
        )
        self.prefix = prefix
        self.ttl_s = max(1, math.ceil(ttl_s))

    def _key(self, response_id: str) -> str:
        return f"{self.prefix}{response_id}"

    async def put(self, response_id: str, record: StoredResponse) -> None:
        try:
            await self._redis.set(self._key(response_id), record.to_json(), ex=self.ttl_s)
        except _redis_errors() as e:
            raise StoreUnavailable(f"The response store is unavailable: {e}") from e

    async def get(self, response_id: str) -> StoredResponse | None:
        try:
            raw = await self._redis.get(self._key(response_id))
        except _redis_errors() as e:
            raise StoreUnavailable("The response store is unavailable; please try again.") from e
        return None if raw is None else StoredResponse.from_json(raw if isinstance(raw, str) else raw.decode())

    async def delete(self, response_id: str) -> bool:
        try:
            return bool(await self._redis.delete(self._key(response_id)))
        except _redis_errors() as e:
            raise StoreUnavailable("The response store is unavailable; please try again.") from e

    async def close(self) -> None:
        await self._redis.aclose()


def from_settings(settings: Settings) -> ResponseStore:
    """The store beside the quota counters: in this process, or in the same Redis."""
    r = settings.responses
    if settings.quotas.store == "redis":
        return RedisResponseStore(
            settings.quotas.redis_url,
            prefix=settings.quotas.key_prefix + "resp:",
            ttl_s=r.ttl_s,
            timeout_s=settings.quotas.redis_timeout_s,
        )
    return MemoryResponseStore(ttl_s=r.ttl_s, max_stored=r.max_stored, max_bytes=r.max_stored_bytes)
