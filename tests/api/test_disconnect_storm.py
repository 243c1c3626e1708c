"""A disconnect storm: 200 streaming clients vanish at random points (while queued, while
prefilling, while decoding), and the gateway is left holding nothing.

The gateway runs a simulated engine (the DGX Spark box model, no weights) with quotas in a
real redis-server. The phases are made certain by pacing, not by timing: each round fills
the engine's running slots, then sends more clients, which must queue (the slots are full
and nothing finishes: every request asks for minutes of output); a "prefilling" client has
a prompt that takes the simulated box seconds to prefill and leaves once the gateway has
admitted it (its response headers came) but before the first event; a "decoding" one
leaves after a random number of events. Random points come from a seeded RNG.

After the storm: every engine request aborted (the engine holds no request, the gateway's
disconnect counter and its outcome metrics count each client by phase), every KV
reservation released (the admission ledger at zero), every quota hold released (Redis has
no lease, live set member or reservation left), and a new request is served within 5 s.

A smaller storm (30 clients) on the shared real vLLM server checks the same on a real engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis

from gateway.settings import hash_key
from tests.conftest import API_KEY, DENSE, MODELS, ROOT, Fleet, Launch, RedisServer, Server, config_launch, free_port

MODEL = "storm-sim"
SLOTS = 16  # the simulated engine's running slots (max_num_seqs)
CLIENTS = 200
SEED = 1818
KEYS = [f"sk-storm-{i}" for i in range(4)]
PREFIX = "storm:"  # this module's Redis keys (the Redis server is the session's)
# The box prefills at most CHUNK tokens of each prompt per step (vLLM's long_prefill_token_threshold),
# so a short prompt's first token never waits for a long one's prefill, and a long one takes many
# steps: 16K tokens in 125 steps, each at least the chunk's 42 ms of the box's time plus a decode
# step's 13 ms, about 7 s even alone (many times what a round takes to reach its cue), while a
# decoding client leaves within 5 steps.
SPEEDUP = 1.0
CHUNK = 128
PREFILL_TOKENS = 16_000
PREFILL_PROMPT = "hello " * PREFILL_TOKENS  # a token per word
LONG_OUTPUT = 4000  # nearly a minute of decoding: nothing admitted finishes by itself during a round
NEW_REQUEST_DEADLINE_S = 5.0


@dataclass
class Plan:
    phase: str  # "queued", "prefilling" or "decoding": where the client vanishes
    round: int
    key: str
    delay_s: float  # queued / prefilling: how long after its round's cue it leaves
    events: int  # decoding: after how many stream events it leaves


@dataclass
class Seen:
    """What the client saw when it left: the evidence of its phase."""

    headers: bool = False  # the gateway admitted it (a stream's headers come at admission)
    events: int = 0
    status: int | None = None
    error: str = ""


def plans(seed: int = SEED, total: int = CLIENTS) -> list[Plan]:
    rng = random.Random(seed)
    out: list[Plan] = []
    r = 0
    while len(out) < total:
        for _ in range(SLOTS):
            phase = rng.choice(("prefilling", "decoding"))
            out.append(Plan(phase, r, rng.choice(KEYS), rng.uniform(0, 0.5), rng.randint(1, 5)))
        for _ in range(rng.randint(4, 10)):
            out.append(Plan("queued", r, rng.choice(KEYS), rng.uniform(0, 0.5), 0))
        r += 1
    return out[:total]


# -- a raw HTTP client: it decides exactly when the connection closes -------------------------


async def open_stream(base_url: str, key: str, body: dict[str, Any]) -> tuple[asyncio.StreamReader, Any]:
    host, port = base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    raw = json.dumps(body).encode()
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {key}\r\nContent-Length: {len(raw)}\r\n\r\n".encode()
        + raw
    )
    await writer.drain()
    return reader, writer


async def read_headers(reader: asyncio.StreamReader, seen: Seen) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    seen.status = int(head.split(b" ", 2)[1])
    seen.headers = True
    if seen.status != 200:  # an error's body, for the failure message
        seen.error = (await reader.read(4096)).decode(errors="replace")


async def read_events(reader: asyncio.StreamReader, seen: Seen, until: int) -> None:
    """Read the stream until `until` events have come (chunked framing lines are skipped)."""
    while seen.events < until:
        line = await reader.readline()
        if not line:
            raise AssertionError(f"the stream ended after {seen.events} events")
        if line.startswith(b"data: "):
            seen.events += 1


def body_for(plan: Plan, i: int) -> dict[str, Any]:
    # Distinct from the first token: no prompt is in the prefix cache (and prefills at once).
    prompt = f"client {i}: " + (PREFILL_PROMPT if plan.phase == "prefilling" else f"storm round {plan.round}")
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": LONG_OUTPUT,
        "stream": True,
    }


# -- the gateway's side -------------------------------------------------------------------------


def stats(server: Server, key: str = KEYS[0]) -> dict[str, Any]:
    r = httpx.get(f"{server.base_url}/sparkgate/stats", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    r.raise_for_status()
    return r.json()  # type: ignore[no-any-return]


def outcomes(server: Server, model: str, key: str) -> Counter[str]:
    """sparkgate_requests_total by outcome for `model`, from /metrics."""
    text = httpx.get(f"{server.base_url}/metrics", headers={"Authorization": f"Bearer {key}"}, timeout=30).text
    out: Counter[str] = Counter()
    for m in re.finditer(r"^sparkgate_requests_total\{([^}]*)\} ([0-9.e+]+)$", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if labels.get("model") == model:
            out[labels["outcome"]] += int(float(m.group(2)))
    return out


async def wait_for(what: str, cond: Any, timeout: float = 60.0) -> Any:
    """Poll `cond()` (run in a thread: it may do HTTP) until it returns a truthy value."""
    deadline = time.monotonic() + timeout
    while True:
        got = await asyncio.to_thread(cond)
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not reached in {timeout:.0f} s")
        await asyncio.sleep(0.05)


def held(s: dict[str, Any], model: str) -> dict[str, int]:
    """What the gateway and the engine still hold for `model`'s requests (all 0: nothing)."""
    e = s["engines"][model]
    a = e["admission"]
    return {
        "kv_used_blocks": a["used_blocks"],
        "admitted": a["admitted"],
        "queued": a["queued"],
        "running_sequences": a["running_sequences"],
        "engine_unfinished": e["stats"]["unfinished"],
        "engine_running": e["stats"]["running"],
        "engine_waiting": e["stats"]["waiting"],
        "inflight": e["inflight"],
        "quota_holds": s["quota"]["holds"],
        "quota_outbox": s["quota"]["outbox"],
        "unreleased_admissions": s["admission"]["admitted"] - s["admission"]["released"],
    }


def redis_holds(url: str, prefix: str) -> dict[str, int]:
    r = redis.Redis.from_url(url, decode_responses=True)
    try:
        return {
            "leases": int(r.zcard(f"{prefix}leases")),
            "live": sum(int(r.scard(k)) for k in r.scan_iter(f"{prefix}live:*")),
            "reservations": sum(1 for _ in r.scan_iter(f"{prefix}r:*")),
        }
    finally:
        r.close()


# -- the storm on the simulated engine ------------------------------------------------------------


def side_by_side(request: pytest.FixtureRequest, tmp: Path) -> list[Launch]:
    """The storm's server, started with the session's others (tests/conftest.py: `fleet`)."""
    redis_server: RedisServer = request.getfixturevalue("redis_server")
    port = free_port()
    cfg = {
        "server": {"host": "127.0.0.1", "port": port, "log_level": "info", "cache_dir": str(ROOT / ".cache")},
        "auth": {
            "required": True,
            "keys": [{"name": f"storm{i}", "sha256": hash_key(k), "max_concurrency": 500} for i, k in enumerate(KEYS)],
        },
        "quotas": {"store": "redis", "redis_url": redis_server.url, "key_prefix": PREFIX},
        "models": [
            {
                "name": MODEL,
                "path": str(MODELS / "tiny-qwen3"),  # the tokenizer
                "engine": "simulated",
                "simulated": {"model": "Qwen3.8-27B", "speedup": SPEEDUP},
                "max_model_len": 65536,
                "max_num_seqs": SLOTS,
                "max_num_batched_tokens": 4096,
                "long_prefill_token_threshold": CHUNK,
                "kv_cache_bytes": "30GiB",
            }
        ],
        "admission": {"max_queued": 256, "max_queued_per_user": 256},
    }
    return [config_launch(cfg, tmp)]


@pytest.fixture(scope="module")
def storm(fleet: Fleet) -> Iterator[Server]:
    with fleet.servers(__name__) as (srv,):
        yield srv


@pytest.mark.slow
async def test_disconnect_storm_leaves_nothing_held(storm: Server, redis_server: RedisServer) -> None:
    all_plans = plans()
    phases = Counter(p.phase for p in all_plans)
    assert len(all_plans) == CLIENTS and min(phases.values()) >= 50, phases  # each phase well represented
    s0 = await asyncio.to_thread(stats, storm)
    assert not any(held(s0, MODEL).values())
    before = await asyncio.to_thread(outcomes, storm, MODEL, KEYS[0])
    seen: list[tuple[Plan, Seen]] = []

    async def run_round(r: int) -> None:
        mine = [p for p in all_plans if p.round == r]
        running = [p for p in mine if p.phase != "queued"]
        queued = [p for p in mine if p.phase == "queued"]
        cue_queued, cue_running = asyncio.Event(), asyncio.Event()

        async def client(plan: Plan) -> None:
            got = Seen()
            seen.append((plan, got))
            reader, writer = await open_stream(storm.base_url, plan.key, body_for(plan, all_plans.index(plan)))
            try:
                if plan.phase == "queued":
                    head = asyncio.ensure_future(read_headers(reader, got))
                    await cue_queued.wait()
                    await asyncio.sleep(plan.delay_s)
                    head.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await head
                    return
                await read_headers(reader, got)
                assert got.status == 200, got
                await cue_running.wait()
                if plan.phase == "prefilling":
                    await asyncio.sleep(plan.delay_s)
                    # Anything already sent is in the socket's buffer: a first event there
                    # would mean it had finished prefilling.
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(read_events(reader, got, 1), timeout=0.01)
                else:
                    await read_events(reader, got, plan.events)
            finally:
                writer.close()  # the client vanishes
                with contextlib.suppress(OSError):
                    await writer.wait_closed()

        tasks = [asyncio.ensure_future(client(p)) for p in running]
        # Every running-phase client admitted: the slots are full.
        await wait_for(
            f"round {r}: {len(running)} admitted",
            lambda: sum(got.headers for p, got in seen if p in running) == len(running),
        )
        tasks += [asyncio.ensure_future(client(p)) for p in queued]
        await wait_for(
            f"round {r}: {len(queued)} queued",
            lambda: stats(storm)["engines"][MODEL]["admission"]["queued"] == len(queued),
        )
        cue_queued.set()
        # The queued ones leave first: a slot freed meanwhile would let one of them in.
        await wait_for(f"round {r}: queue empty", lambda: stats(storm)["engines"][MODEL]["admission"]["queued"] == 0)
        cue_running.set()
        await asyncio.gather(*tasks)

    rounds = max(p.round for p in all_plans) + 1
    for r in range(rounds - 1):
        t0 = time.monotonic()
        await run_round(r)
        t1 = time.monotonic()
        await wait_for(f"round {r}: released", lambda: not any(held(stats(storm), MODEL).values()))
        print(f"round {r}: {t1 - t0:.1f} s, released in {time.monotonic() - t1:.1f} s")
    await run_round(rounds - 1)

    # Right after the last client left: a new request is served, within the deadline.
    c = openai.AsyncOpenAI(base_url=storm.api, api_key=KEYS[0], max_retries=0, timeout=60)
    t = time.monotonic()
    done = await c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "still there?"}], max_tokens=8
    )
    served_s = time.monotonic() - t
    assert done.usage is not None and done.usage.completion_tokens == 8
    assert served_s < NEW_REQUEST_DEADLINE_S, f"a new request took {served_s:.2f} s after the storm"

    # Each client was where it was meant to be when it left.
    for plan, got in seen:
        if plan.phase == "queued":
            assert not got.headers, (plan, got)  # never admitted
        elif plan.phase == "prefilling":
            assert got.headers and got.events == 0, (plan, got)  # admitted, no first token yet
        else:
            assert got.headers and got.events == plan.events, (plan, got)

    # Nothing held anywhere: engine, KV ledger, quota holds, Redis.
    final = await wait_for(
        "nothing held", lambda: (lambda s: s if not any(held(s, MODEL).values()) else None)(stats(storm))
    )
    assert final["client_disconnects"] - s0["client_disconnects"] == CLIENTS
    # What was charged: nothing for a client that left while queued; the prompt for one that
    # left while it prefilled (the engine had it: hanging up before the first token does not
    # make a prompt free); the prompt and the tokens generated for one that left decoding.
    charged = final["quota"]["prompt_tokens"] - s0["quota"]["prompt_tokens"]
    assert charged >= phases["prefilling"] * PREFILL_TOKENS, charged
    generated = final["quota"]["completion_tokens"] - s0["quota"]["completion_tokens"]
    assert generated >= sum(p.events for p in all_plans if p.phase == "decoding") - phases["decoding"], generated
    assert await asyncio.to_thread(redis_holds, redis_server.url, PREFIX) == {"leases": 0, "live": 0, "reservations": 0}
    after = await asyncio.to_thread(outcomes, storm, MODEL, KEYS[0])
    left = {k: after[k] - before[k] for k in ("client_left_queued", "client_left", "completed")}
    assert left == {"client_left_queued": phases["queued"], "client_left": CLIENTS - phases["queued"], "completed": 1}
    print(f"\nstorm: {dict(phases)}; a new request served in {served_s:.2f} s")


# -- a smaller storm on the real vLLM engine -------------------------------------------------------

REAL_CLIENTS = 30


@pytest.mark.engine
async def test_disconnect_storm_on_a_real_engine(server: Server) -> None:
    """30 streaming clients on the tiny vLLM engine, each leaving at a random point: before
    its answer starts (queued or prefilling: more than the engine's slots and KV hold are
    sent at once) or after a few events. The same checks, on vLLM's own counters."""
    rng = random.Random(SEED)
    await wait_for("engine idle", lambda: not any(held(server.stats(), DENSE).values()), timeout=120)
    s0 = await asyncio.to_thread(server.stats)
    seen: list[Seen] = []

    async def client(i: int) -> None:
        got = Seen()
        seen.append(got)
        body = {
            "model": DENSE,
            "messages": [{"role": "user", "content": f"storm {i}: " + "go on " * rng.randint(1, 400)}],
            "max_tokens": 4000,
            "ignore_eos": True,
            "stream": True,
        }
        leave_after = rng.choice((0, rng.randint(1, 40)))  # 0: at a random moment, whatever it has
        delay = rng.uniform(0.1, 3.0)
        reader, writer = await open_stream(server.base_url, API_KEY, body)
        try:
            if leave_after == 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(read_headers(reader, got), timeout=delay)
                return
            await read_headers(reader, got)
            assert got.status == 200, got
            await read_events(reader, got, leave_after)
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    await asyncio.gather(*(client(i) for i in range(REAL_CLIENTS)))
    c = openai.AsyncOpenAI(base_url=server.api, api_key=API_KEY, max_retries=0, timeout=60)
    t = time.monotonic()
    done = await c.chat.completions.create(model=DENSE, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    served_s = time.monotonic() - t
    assert done.usage is not None and done.usage.completion_tokens == 4
    assert served_s < NEW_REQUEST_DEADLINE_S, f"a new request took {served_s:.2f} s after the storm"
    final = await wait_for(
        "nothing held", lambda: (lambda s: s if not any(held(s, DENSE).values()) else None)(server.stats()), 120
    )
    assert final["client_disconnects"] - s0["client_disconnects"] == REAL_CLIENTS
    assert final["engines"][DENSE]["stats"]["preemptions"] == s0["engines"][DENSE]["stats"]["preemptions"]
    phases = Counter("queued" if not g.headers else "admitted, no token" if not g.events else "decoding" for g in seen)
    assert phases["decoding"] > 0 and phases["queued"] + phases["admitted, no token"] > 0, phases
    print(f"\nreal storm: {dict(phases)}; a new request served in {served_s:.2f} s")
