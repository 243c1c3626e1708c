"""Per-key quotas across two gateway replicas sharing one real redis-server.

Replica A fails closed when Redis is away, replica B fails open (per-process
limits). Each runs its own real vLLM CPU engine. The tests run in file order:
the Redis outage and the replica crash come last.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis
import yaml

from gateway.settings import hash_key
from tests.conftest import MODELS, ROOT, Fleet, Launch, RedisServer, Server, free_port, launch

ADMIN_KEY = "sk-quota-admin"
MODEL = "tiny"
WINDOW_S = 3.0
MAX_LEN = 32768
LONG = 30_000  # max_tokens of a request that runs for a minute unless aborted
LEASE_S = 4.0  # renewed every 1.3 s: margin for a loaded 2-core machine
PREFIX = "sg:"
HEADERS_JSON = {"Content-Type": "application/json"}
MESSAGES = [{"role": "user", "content": "Count to ten."}]

pytestmark = pytest.mark.engine


@dataclass
class Pair:
    a: Server  # fails closed
    b: Server  # fails open
    redis: RedisServer

    @property
    def both(self) -> tuple[Server, Server]:
        return self.a, self.b

    def r(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis.url, decode_responses=True, socket_timeout=5)


def _config(tmp: Path, port: int, redis_url: str, on_outage: str, core: str, simulated: bool = False) -> Path:
    cfg = {
        "server": {"host": "127.0.0.1", "port": port, "log_level": "info", "cache_dir": str(ROOT / ".cache")},
        "auth": {"required": True, "admin_keys": [{"name": "admin", "sha256": hash_key(ADMIN_KEY)}]},
        "quotas": {
            "store": "redis",
            "redis_url": redis_url,
            "key_prefix": PREFIX,
            "on_outage": on_outage,
            "window_s": WINDOW_S,
            "lease_s": LEASE_S,
            # Generous: on a loaded 2-core CI box a 0.5 s read timeout tripped replica B into
            # fail-open mid-test. The outage test stops Redis (refused at once), so it needs no short timeout.
            "redis_timeout_s": 2.0,
            "teams": [{"name": "lab", "defaults": {"rpm": 10_000}, "pooled": {"monthly_tokens": 10_000_000}}],
        },
        "models": [
            {
                "name": MODEL,
                "path": str(MODELS / "tiny-qwen3"),
                "max_model_len": MAX_LEN,
                "max_num_seqs": 16,
                "kv_cache_bytes": "64MiB",
                # The DGX Spark box model in real time: starts in a second, streams for minutes.
                **(
                    {
                        "engine": "simulated",
                        "simulated": {"model": "Qwen3.8-27B", "speedup": 1.0},
                        "kv_cache_bytes": "4GiB",
                    }
                    if simulated
                    else {"cpu_cores": core}
                ),
            }
        ],
        "admission": {"max_queued": 2000, "max_queued_per_user": 2000, "max_queued_tokens": 10_000_000},
    }
    path = tmp / f"gateway-{on_outage}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


ENGINES = 2  # vLLM engines its servers start: the fleet starts them in a wave
_REDIS: list[RedisServer] = []  # the one `side_by_side` started, for `pair`


def side_by_side(request: pytest.FixtureRequest, tmp: Path) -> list[Launch]:
    """The two replicas, each on its own core, and the Redis they share (started first: their
    configs name its port)."""
    rs = RedisServer(tmp)
    rs.start()
    request.addfinalizer(rs.stop)  # in case this module never takes its servers
    _REDIS.append(rs)
    replicas = []
    for name, on_outage, core in (("a", "closed", "0"), ("b", "open", "1" if (os.cpu_count() or 1) > 1 else "0")):
        port = free_port()
        replicas.append(Launch(_config(tmp, port, rs.url, on_outage, core), tmp / f"gateway-{name}.log", port))
    return replicas


@pytest.fixture(scope="module")
def pair(fleet: Fleet) -> Iterator[Pair]:
    with fleet.servers(__name__) as (a, b):
        rs = _REDIS.pop()
        try:
            yield Pair(a, b, rs)
        finally:
            rs.stop()


def admin(server: Server, method: str, path: str, **kw: Any) -> httpx.Response:
    return httpx.request(
        method, f"{server.base_url}{path}", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30, **kw
    )


def create_key(server: Server, user: str, **limits: Any) -> tuple[str, str]:
    r = admin(server, "POST", "/sparkgate/admin/keys", json={"user": user, "team": "lab", "limits": limits})
    assert r.status_code == 201, r.text
    return r.json()["id"], r.json()["key"]


def chat(server: Server, key: str, max_tokens: int = 8, **kw: Any) -> httpx.Response:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": max_tokens, "ignore_eos": True, **kw}
    return httpx.post(
        f"{server.api}/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120
    )


def quota_stats_for(server: Server, key: str) -> dict[str, Any]:
    """The replica's quota counters (/sparkgate/stats wants a user's key)."""
    r = httpx.get(f"{server.base_url}/sparkgate/stats", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    r.raise_for_status()
    return r.json()["quota"]  # type: ignore[no-any-return]


def period(p: Pair, scope: str, client: redis.Redis | None = None) -> dict[str, int]:
    """The scope's counters for today, read straight from Redis."""
    r = client or p.r()
    sec, _ = r.time()
    raw = r.hgetall(f"{PREFIX}d:{scope}:{sec // 86400}")
    return {k: int(v) for k, v in raw.items()}


def wait_settled(p: Pair, scope: str, timeout: float = 15) -> dict[str, int]:
    """Settlements are applied in the background: wait until the scope holds nothing.
    Only this scope's reservations count, so other keys' traffic cannot keep it waiting."""
    deadline = time.monotonic() + timeout
    while True:
        d = period(p, scope)
        live = p.r().scard(f"{PREFIX}live:{scope}")
        if d.get("reserved", 0) == 0 and live == 0:
            return d
        if time.monotonic() > deadline:
            raise AssertionError(f"{scope} still held after {timeout}s: {d}, {live} live")
        time.sleep(0.1)


def sparkgate_cli(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SPARKGATE_URL=server.base_url, SPARKGATE_ADMIN_KEY=ADMIN_KEY)
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "keys", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )


# --------------------------------------------------------------------------- keys


def test_cli_key_lifecycle_across_replicas(pair: Pair) -> None:
    out = sparkgate_cli(pair.a, "create", "--user", "alice", "--team", "lab", "--rpm", "100", "--name", "laptop")
    assert out.returncode == 0, out.stderr
    fields = dict(line.split(":", 1) for line in out.stdout.splitlines() if ":" in line and not line.startswith("("))
    key_id, key = fields["id"].strip(), fields["key"].strip()
    assert key.startswith("sk-sg-")
    assert pair.r().get(f"{PREFIX}key:{hash_key(key)}") is not None  # stored by hash
    assert key not in json.dumps(pair.r().get(f"{PREFIX}key:{hash_key(key)}"))  # never the key itself

    client = openai.OpenAI(base_url=pair.b.api, api_key=key, max_retries=0)  # the other replica
    resp = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)  # type: ignore[arg-type]
    assert resp.usage is not None

    listed = sparkgate_cli(pair.b, "list")
    assert (
        listed.returncode == 0 and key_id in listed.stdout and "alice" in listed.stdout and "rpm=100" in listed.stdout
    )
    usage = sparkgate_cli(pair.b, "usage", "--key-id", key_id)
    assert usage.returncode == 0, usage.stderr
    day = wait_settled(pair, f"key:{key_id}")
    assert (day["prompt"], day["completion"], day["requests"]) == (
        resp.usage.prompt_tokens,
        resp.usage.completion_tokens,
        1,
    )
    assert json.loads(sparkgate_cli(pair.a, "usage", "--key-id", key_id).stdout)["day"]["total_tokens"] == (
        resp.usage.total_tokens
    )

    revoked = sparkgate_cli(pair.a, "revoke", key_id)
    assert revoked.returncode == 0 and "revoked" in revoked.stdout
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)  # type: ignore[arg-type]
    assert "revoked" in sparkgate_cli(pair.b, "list").stdout

    bad = sparkgate_cli(pair.a, "create", "--user", "x", "--team", "nope")
    assert bad.returncode == 1 and "Unknown team" in bad.stderr


def test_a_user_reads_only_their_own_usage(pair: Pair) -> None:
    _, key = create_key(pair.a, "bob", allowed_models=[MODEL])
    auth = {"Authorization": f"Bearer {key}"}
    assert chat(pair.a, key).status_code == 200
    own = httpx.get(f"{pair.b.base_url}/sparkgate/usage", headers=auth, timeout=30)
    assert own.status_code == 200 and own.json()["user"] == "bob"
    for path in ("/sparkgate/admin/usage?user=alice", "/sparkgate/admin/keys"):
        r = httpx.get(f"{pair.a.base_url}{path}", headers=auth, timeout=30)
        assert r.status_code == 403 and r.json()["error"]["code"] == "permission_denied"
    r = httpx.get(f"{pair.a.base_url}/sparkgate/admin/keys", headers={"Authorization": "Bearer sk-nobody"}, timeout=60)
    assert r.status_code == 401
    r = httpx.post(
        f"{pair.a.api}/chat/completions",
        json={"model": MODEL, "messages": MESSAGES},
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        timeout=60,
    )
    assert r.status_code == 401  # the admin key is not an inference key


def test_allowed_models(pair: Pair) -> None:
    _, key = create_key(pair.a, "carol", allowed_models=[MODEL])
    models = httpx.get(f"{pair.a.api}/models", headers={"Authorization": f"Bearer {key}"}, timeout=60).json()["data"]
    assert [m["id"] for m in models] == [MODEL]
    bad = admin(pair.a, "POST", "/sparkgate/admin/keys", json={"user": "x", "limits": {"allowed_models": ["gpt-9"]}})
    assert bad.status_code == 400


# --------------------------------------------------------------------------- limits


def test_sdk_waits_retry_after_then_succeeds(pair: Pair) -> None:
    _, key = create_key(pair.a, "dora", rpm=1)
    seen: list[tuple[float, int, str | None]] = []

    def record(response: httpx.Response) -> None:
        seen.append((time.monotonic(), response.status_code, response.headers.get("retry-after-ms")))

    http = httpx.Client(event_hooks={"response": [record]}, timeout=60)
    client = openai.OpenAI(base_url=pair.b.api, api_key=key, max_retries=3, http_client=http)
    client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)  # type: ignore[arg-type]
    # The same key on the other replica: its rpm is spent. The SDK gets 429 + Retry-After,
    # sleeps that long, and its retry succeeds.
    client2 = openai.OpenAI(base_url=pair.a.api, api_key=key, max_retries=3, http_client=http)
    resp = client2.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)  # type: ignore[arg-type]
    assert resp.choices[0].finish_reason == "length"
    statuses = [s for _, s, _ in seen]
    assert statuses[0] == 200 and statuses[-1] == 200 and 429 in statuses
    for (t429, status, retry_ms), (t_next, _, _) in itertools.pairwise(seen):
        if status == 429:
            assert retry_ms is not None and 0 < int(retry_ms) <= WINDOW_S * 1000
            assert t_next - t429 >= int(retry_ms) / 1000 - 0.05  # it waited as told
    # The raw answer a client sees.
    r = chat(pair.a, key)
    assert r.status_code == 429
    err = r.json()["error"]
    assert (err["code"], err["type"]) == ("rate_limit_exceeded", "requests")
    assert int(r.headers["retry-after"]) >= 1 and "retry-after-ms" in r.headers


def test_max_concurrency_holds_across_replicas(pair: Pair) -> None:
    key_id, key = create_key(pair.a, "erin", max_concurrency=2)
    auth = {"Authorization": f"Bearer {key}"}
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": LONG, "ignore_eos": True, "stream": True}

    async def run() -> list[int]:
        lines = []
        async with httpx.AsyncClient(timeout=120) as c, contextlib.AsyncExitStack() as streams:
            for server in pair.both:  # one running request per replica: both of the key's slots
                r = await streams.enter_async_context(
                    c.stream("POST", f"{server.api}/chat/completions", json=body, headers=auth)
                )
                assert r.status_code == 200
                # Keep the iterator: a dropped one closes the connection (the client "leaves").
                lines.append(r.aiter_lines())
                await anext(lines[-1])
            assert len(pair.r().smembers(f"{PREFIX}live:key:{key_id}")) == 2
            extra = [await c.post(f"{s.api}/chat/completions", json=body, headers=auth) for s in pair.both]
            for r in extra:
                err = r.json()["error"]
                assert (err["code"], err["type"]) == ("rate_limit_exceeded", "requests")
                assert "concurrent requests" in err["message"]
            return [r.status_code for r in extra]

    assert asyncio.run(run()) == [429, 429]
    # The streams' clients left: their slots come back (settled in the background).
    deadline = time.monotonic() + 10
    while (r := chat(pair.b, key)).status_code == 429:
        assert time.monotonic() < deadline, r.text
        time.sleep(0.1)
    assert r.status_code == 200


def test_budget_is_exact_under_load_from_two_replicas(pair: Pair) -> None:
    """Hundreds of concurrent requests from one key with a daily token budget, split over both
    replicas, beside another key whose clients all hang up midway. The admitted cost never
    exceeds the budget and fills it; what Redis recorded equals the usage returned to the
    clients; nothing stays reserved; and Redis holds exactly what the replicas settled."""
    cost = chat(pair.a, create_key(pair.a, "probe")[1]).json()["usage"]["total_tokens"]  # prompt + 8
    fits = 120
    budget = cost * fits + cost // 2
    flood_id, flood = create_key(pair.a, "flood", daily_tokens=budget)
    leave_id, leaver = create_key(pair.a, "leaver")
    before = [quota_stats_for(s, flood) for s in pair.both]
    rdb = pair.r()
    peak = 0
    stop = threading.Event()

    def watch() -> None:  # what Redis holds for the key, sampled while the load runs
        nonlocal peak
        while not stop.is_set():
            d = period(pair, f"key:{flood_id}", rdb)
            peak = max(peak, d.get("prompt", 0) + d.get("completion", 0) + d.get("reserved", 0))
            time.sleep(0.002)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    rng = random.Random(7)
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 8, "ignore_eos": True}

    async def one(i: int, key: str, timeout: float) -> tuple[int, dict[str, Any] | None]:
        server = pair.both[i % 2]
        try:
            async with httpx.AsyncClient(timeout=timeout) as c:
                r = await c.post(
                    f"{server.api}/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
                )
        except httpx.TimeoutException:
            return -1, None  # hung up while queued or running
        return r.status_code, r.json()

    async def run() -> list[tuple[int, dict[str, Any] | None]]:
        flood_reqs = [one(i, flood, 300) for i in range(300)]
        leaver_reqs = [one(i, leaver, rng.uniform(0.2, 3.0)) for i in range(60)]
        return await asyncio.gather(*flood_reqs, *leaver_reqs)

    results = asyncio.run(run())
    stop.set()
    watcher.join()
    flood_day = wait_settled(pair, f"key:{flood_id}")
    leave_day = wait_settled(pair, f"key:{leave_id}")
    flood_results, leaver_results = results[:300], results[300:]

    codes = [c for c, _ in flood_results]
    assert set(codes) <= {200, 429}, codes
    ok = [b for c, b in flood_results if c == 200 and b]
    refusals = [b["error"]["code"] for c, b in flood_results if c == 429 and b]
    # While the admitted ones ran, the rest were told to retry soon (their reservations were held)...
    assert set(refusals) <= {"rate_limit_exceeded", "insufficient_quota"}, refusals
    used = flood_day.get("prompt", 0) + flood_day.get("completion", 0)
    assert peak <= budget and used <= budget, (peak, used, budget)  # ...the budget was never passed...
    assert len(ok) == fits and used == fits * cost  # ...and it filled exactly
    last = chat(pair.b, flood)  # now it is spent: not worth retrying until tomorrow
    assert last.status_code == 429 and last.json()["error"]["code"] == "insufficient_quota"
    assert last.headers["x-should-retry"] == "false"
    assert used == sum(b["usage"]["total_tokens"] for b in ok)  # recorded == returned
    assert flood_day["requests"] == len(ok) and period(pair, "user:flood") == flood_day
    # No leaks: nothing reserved, no live holds, no leases, for either key.
    for scope, day in ((f"key:{flood_id}", flood_day), (f"key:{leave_id}", leave_day)):
        assert day.get("reserved", 0) == 0 and not rdb.exists(f"{PREFIX}live:{scope}")
    assert rdb.zcard(f"{PREFIX}leases") == 0
    # Every token the replicas settled (the leavers' partial work included) is in Redis, once.
    after = [quota_stats_for(s, flood) for s in pair.both]
    settled = sum(
        (x["prompt_tokens"] + x["completion_tokens"]) - (y["prompt_tokens"] + y["completion_tokens"])
        for x, y in zip(after, before, strict=True)
    )
    leaver_used = leave_day.get("prompt", 0) + leave_day.get("completion", 0)
    assert settled == used + leaver_used, (settled, used, leaver_used)
    hung_up = sum(1 for c, _ in leaver_results if c == -1)
    assert hung_up > 0
    print(
        f"\nbudget {budget} ({fits} x {cost}): used {used}, peak held {peak}; {len(ok)} x 200, "
        f"{len(refusals)} x 429; leavers: {hung_up} hung up, {leaver_used} tokens charged"
    )


# --------------------------------------------------------------------------- outage (stops Redis)


class SteadyLoad:
    """Requests to both replicas, one after another, in a thread of their own, for as long
    as it runs: what each replica answered, and the usage the clients were given."""

    def __init__(self, p: Pair, key: str) -> None:
        self.pair, self.key = p, key
        self.codes: dict[str, list[int]] = {"a": [], "b": []}
        self.returned = 0
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4, "ignore_eos": True}
        auth = {"Authorization": f"Bearer {self.key}"}
        async with httpx.AsyncClient(timeout=120) as c:
            i = 0
            while not self._stop.is_set():
                name, server = ("a", self.pair.a) if i % 2 == 0 else ("b", self.pair.b)
                i += 1
                try:
                    r = await c.post(f"{server.api}/chat/completions", json=body, headers=auth)
                except httpx.HTTPError as e:  # a replica that stopped answering: a failure
                    self.errors.append(e)
                    if len(self.errors) > 20:  # it is gone; don't spin on it
                        return
                    await asyncio.sleep(0.5)
                    continue
                self.codes[name].append(r.status_code)
                if r.status_code == 200:
                    self.returned += r.json()["usage"]["total_tokens"]
                await asyncio.sleep(0.05)

    def __enter__(self) -> SteadyLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_redis_outage_closed_and_open_then_recovery(pair: Pair) -> None:
    key_id, key = create_key(pair.a, "frank", rpm=3)
    steady_id, steady_key = create_key(pair.a, "steady")
    scope = f"key:{key_id}"
    returned = 0
    for s in pair.both:  # both replicas know the keys before the outage
        r = chat(s, key, max_tokens=4)
        assert r.status_code == 200
        returned += r.json()["usage"]["total_tokens"]
        assert chat(s, steady_key, max_tokens=1).status_code == 200
    already = wait_settled(pair, f"key:{steady_id}")
    time.sleep(WINDOW_S)  # an empty rpm window
    with SteadyLoad(pair, steady_key) as load:  # runs until after the recovery
        _outage_and_recovery(pair, key, scope, returned)
        time.sleep(1)
    assert not load.errors, load.errors
    assert set(load.codes["a"]) == {200, 503} and set(load.codes["b"]) == {200}, load.codes
    # The steady load through it all: A said 503 while Redis was away, B kept serving, neither
    # failed otherwise; and Redis recorded every token the steady clients were given.
    deadline = time.monotonic() + 15
    while True:
        d = wait_settled(pair, f"key:{steady_id}")
        recorded = d.get("prompt", 0) + d.get("completion", 0) - already.get("prompt", 0) - already.get("completion", 0)
        if recorded == load.returned or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert recorded == load.returned, (recorded, load.returned)
    a, b = load.codes["a"], load.codes["b"]
    print(
        f"\nsteady load through the outage: A {a.count(200)} x 200, {a.count(503)} x 503; B {b.count(200)} x 200; "
        f"recorded {recorded} tokens == returned {load.returned}"
    )


async def _gather(tasks: list[asyncio.Task[int]]) -> list[int]:
    return await asyncio.gather(*tasks)


def _outage_and_recovery(pair: Pair, key: str, scope: str, returned: int) -> None:
    """Stops Redis with two of `key`'s requests in flight, checks both replicas' outage behaviour,
    starts it again and checks that Redis recorded every token the key was given (`returned`
    before the outage, plus what was served during and after it)."""

    # Requests in flight when Redis goes: they were reserved in Redis and settle during the outage
    # (Redis stops as soon as both hold their reservation; 800 tokens take seconds to decode).
    async def long(server: Server) -> int:
        async with httpx.AsyncClient(timeout=120) as c:
            body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 800, "ignore_eos": True}
            r = await c.post(f"{server.api}/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200, r.text
            return int(r.json()["usage"]["total_tokens"])

    async def reserved(n: int) -> None:  # until both hold their reservation in Redis
        rdb = pair.r()
        deadline = time.monotonic() + 60
        while rdb.scard(f"{PREFIX}live:{scope}") < n:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)

    # B serves on local limits: the same rpm (3 per window), counted in this process.
    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=120) as c:
            body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4, "ignore_eos": True}
            auth = {"Authorization": f"Bearer {key}"}
            return await asyncio.gather(
                *(c.post(f"{pair.b.api}/chat/completions", json=body, headers=auth) for _ in range(4))
            )

    with asyncio.Runner() as runner:
        in_flight = [runner.get_loop().create_task(long(s)) for s in pair.both]
        runner.run(reserved(2))
        pair.redis.stop()
        try:
            closed = chat(pair.a, key)
            assert closed.status_code == 503 and closed.json()["error"]["code"] == "quota_unavailable"
            assert int(closed.headers["retry-after"]) >= 1

            local = runner.run(burst())
            assert sorted(r.status_code for r in local) == [200, 200, 200, 429]
            returned += sum(r.json()["usage"]["total_tokens"] for r in local if r.status_code == 200)
            returned += sum(runner.run(_gather(in_flight)))
            for s in pair.both:
                assert httpx.get(f"{s.base_url}/health", timeout=60).status_code == 200 and s.proc.poll() is None
            assert quota_stats_for(pair.b, key)["down"] and quota_stats_for(pair.b, key)["local_reserves"] >= 4
        finally:
            pair.redis.start()  # same port, same data directory

    deadline = time.monotonic() + 15
    while (r := chat(pair.a, key, max_tokens=4)).status_code != 200:  # no restart needed
        assert r.status_code in (503, 429) and time.monotonic() < deadline, r.text
        time.sleep(0.3)
    returned += r.json()["usage"]["total_tokens"]
    # What settled during the outage (and what B served locally) reached Redis afterwards.
    deadline = time.monotonic() + 15
    while True:
        day = wait_settled(pair, scope)
        if day.get("prompt", 0) + day.get("completion", 0) == returned or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert day.get("prompt", 0) + day.get("completion", 0) == returned, (day, returned)
    assert quota_stats_for(pair.b, key)["replayed"] >= 3 and not quota_stats_for(pair.a, key)["down"]
    # A's long request was still running when Redis went: it settled into A's outbox.
    assert quota_stats_for(pair.a, key)["outbox_applied"] >= 1


def test_a_crashed_replica_s_holds_expire(pair: Pair, tmp_path: Path) -> None:
    """A third replica on the same Redis dies holding a key's only concurrency slot; B serves
    the key again once the lease runs out (LEASE_S), without anyone cleaning up. (A replica
    of its own: the pair must outlive this test, whatever order the tests run in. Its engine is
    simulated: the quota store, not the engine, is what this is about.)"""
    _, key = create_key(pair.b, "gina", max_concurrency=1)
    port = free_port()
    config = _config(tmp_path, port, pair.redis.url, "closed", "0", simulated=True)
    with launch(config, tmp_path / "gateway-c.log", port) as doomed:
        _crash_holding_a_slot(pair, doomed, key)


def _crash_holding_a_slot(pair: Pair, doomed: Server, key: str) -> None:
    """`doomed` is killed while it streams for `key`; B refuses the key until the lease lapses."""

    async def hold_and_crash() -> None:
        async with httpx.AsyncClient(timeout=60) as c:
            body = {"model": MODEL, "messages": MESSAGES, "max_tokens": LONG, "ignore_eos": True, "stream": True}
            headers = {"Authorization": f"Bearer {key}"}
            async with c.stream("POST", f"{doomed.api}/chat/completions", json=body, headers=headers) as r:
                assert r.status_code == 200
                lines = r.aiter_lines()
                await anext(lines)  # running: it holds the key's only slot
                os.killpg(doomed.proc.pid, signal.SIGKILL)  # it dies with the stream open: nothing settles
                doomed.proc.wait()

    expired_before = int(pair.r().hget(f"{PREFIX}stats", "expired") or 0)
    asyncio.run(hold_and_crash())
    t_dead = time.monotonic()
    first = chat(pair.b, key)
    assert first.status_code == 429 and "concurrent requests" in first.json()["error"]["message"]
    while (r := chat(pair.b, key)).status_code == 429:
        assert time.monotonic() - t_dead < LEASE_S + 10, r.text
        time.sleep(0.2)
    assert r.status_code == 200
    assert time.monotonic() - t_dead <= LEASE_S + 10
    assert int(pair.r().hget(f"{PREFIX}stats", "expired") or 0) > expired_before
