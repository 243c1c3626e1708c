"""A short soak (benchmarks/soak.py records the long one in BENCHMARKS.md): many streaming
clients loop against the gateway on the simulated engines, routing on, quotas in a real
redis-server; some vanish mid-stream, some are turned away. Afterwards nothing is held (KV
ledger, quota holds, Redis leases and reservations, engine requests) and no client saw an
error other than an intended rejection (429/503 with its code and Retry-After). No timing
thresholds: the machine's speed changes how many requests run, not what must hold."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from benchmarks import soak
from tests.conftest import Fleet, Launch, RedisServer, Server, free_port

CLIENTS = 100
SECONDS = 15
# The box ten times faster than real: more requests per second, and a request that routing
# holds (at most its class's 60 s TTFT objective, in the box's time) is held 6 s at most.
SPEEDUP = 10.0
PREFIX = "soak:"  # this module's Redis keys (the Redis server is the session's)


def side_by_side(request: pytest.FixtureRequest, tmp: Path) -> list[Launch]:
    """This module's server, started with the session's others (tests/conftest.py: `fleet`)."""
    redis_url = request.getfixturevalue("redis_server").url
    port = free_port()
    cfg = soak.soak_config(tmp, port, redis_url, speedup=SPEEDUP, routing=True, redis_prefix=PREFIX)
    return [Launch(cfg, tmp / "server.log", port)]


@pytest.fixture(scope="module")
def gateway(fleet: Fleet) -> Iterator[Server]:
    with fleet.servers(__name__) as (srv,):
        yield srv


@pytest.mark.slow
async def test_soak_no_unintended_errors_and_nothing_leaked(gateway: Server, redis_server: RedisServer) -> None:
    tally = await soak.drive(
        gateway.base_url, clients=CLIENTS, seconds=SECONDS, vanish_p=0.2, models=soak.MODELS + soak.ALIASES
    )
    assert not tally.unintended, tally.samples
    # The load was real: requests completed, clients vanished mid-way.
    assert tally.completed > 0 and tally.abandoned > 0, tally
    assert soak.leaks(gateway.base_url, redis_server.url, redis_prefix=PREFIX) == dict.fromkeys(
        [*soak.gateway_holds(soak.stats(gateway.base_url)), "leases", "live", "reservations"], 0
    )
    # And it still serves.
    r = httpx.post(
        f"{gateway.api}/chat/completions",
        json={"model": soak.MODELS[0], "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        headers={"Authorization": f"Bearer {soak.KEYS[0]}"},
        timeout=60,
    )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    print(f"\nsoak: {tally.completed} completed, {tally.abandoned} abandoned, rejected {dict(tally.rejected)}")
