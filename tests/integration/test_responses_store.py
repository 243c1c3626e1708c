"""One suite, two stores of responses: MemoryResponseStore and RedisResponseStore (a real
redis-server) keep, return, expire and delete records alike; Redis is chosen like the
quota store and its keys sit under the quota prefix."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from gateway import responses_store
from gateway.errors import StoreUnavailable
from gateway.responses_store import MemoryResponseStore, RedisResponseStore, ResponseStore, StoredResponse
from gateway.settings import ModelSettings, Settings
from tests.conftest import RedisServer, free_port

RECORD = StoredResponse(
    user="ann",
    response={"id": "resp_1", "object": "response", "output": [{"type": "message", "content": []}]},
    messages=[{"role": "user", "content": "héllo"}, {"role": "assistant", "content": "hi"}],
)


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[ResponseStore]:
    s: ResponseStore
    if request.param == "memory":
        s = MemoryResponseStore(ttl_s=1, max_stored=100)
    else:
        redis_server: RedisServer = request.getfixturevalue("redis_server")
        s = RedisResponseStore(redis_server.url, prefix=f"t{uuid.uuid4().hex[:8]}:resp:", ttl_s=1)
    yield s
    await s.close()


async def test_put_get_delete(store: ResponseStore) -> None:
    assert await store.get("resp_1") is None
    await store.put("resp_1", RECORD)
    assert await store.get("resp_1") == RECORD
    assert await store.delete("resp_1") is True
    assert await store.get("resp_1") is None
    assert await store.delete("resp_1") is False


async def test_records_expire(store: ResponseStore) -> None:
    await store.put("resp_2", RECORD)
    await asyncio.sleep(1.3)
    assert await store.get("resp_2") is None


def test_redis_is_chosen_like_the_quota_store(redis_server: RedisServer) -> None:
    model = ModelSettings(name="m", path="models/tiny-qwen3")
    memory = responses_store.from_settings(Settings(models=(model,), responses={"ttl_s": 60, "max_stored": 5}))  # type: ignore[arg-type]
    assert isinstance(memory, MemoryResponseStore) and memory.max_stored == 5 and memory.ttl_s == 60
    quotas = {"store": "redis", "redis_url": redis_server.url, "key_prefix": "x:"}
    shared = responses_store.from_settings(Settings(models=(model,), quotas=quotas))  # type: ignore[arg-type]
    assert isinstance(shared, RedisResponseStore) and shared.prefix == "x:resp:" and shared.ttl_s == 3600


async def test_redis_away_is_store_unavailable() -> None:
    s = RedisResponseStore(f"redis://127.0.0.1:{free_port()}/0", prefix="p:", ttl_s=10, timeout_s=0.2)
    with pytest.raises(StoreUnavailable):
        await s.get("resp_x")
    with pytest.raises(StoreUnavailable):
        await s.put("resp_x", RECORD)
    await s.close()
