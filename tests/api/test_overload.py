"""Admission through a real gateway on a deliberately small KV pool.

One extra server for this module: a tiny MoE engine whose pool holds about
three of the requests below at once while vLLM would run eight (max_num_seqs),
so without admission vLLM would have to preempt. Evidence:
- overload: every request completes in full or gets a clean 429/503 with
  Retry-After; vLLM reports zero preemptions; the ledger returns to zero;
- fairness: a light user's request is admitted at the first freed slot,
  ahead of a flooding user's queued requests;
- a queued request times out cleanly, and a client that leaves while queued
  gives its place back.
"""

from __future__ import annotations

import asyncio
import random
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from gateway.settings import hash_key
from tests.conftest import MODELS, ROOT, Fleet, Launch, Server, free_port, open_post

pytestmark = pytest.mark.engine  # starts vLLM engines

MODEL = "tiny-small-kv"
KEYS = {"heavy": "sk-heavy", "light": "sk-light", "third": "sk-third"}
PROMPT = 1000
MAX_TOKENS = 300
BLOCKS_PER_REQUEST = -(-(PROMPT + MAX_TOKENS - 1) // 128)  # 11 blocks of 128 tokens
MAX_QUEUED = 6
# Delivery paced to at least 20 ms per token: a request runs for 6 s or more on any machine,
# well past the batch class's 2 s queue timeout that the queue-timeout test waits through.
PACE_S = 0.02


ENGINES = 1  # vLLM engines its server starts: the fleet starts it in a wave


def side_by_side(request: pytest.FixtureRequest, tmp: Path) -> list[Launch]:
    """This module's server, started with the session's others (tests/conftest.py: `fleet`)."""
    port = free_port()
    cfg = {
        "server": {"host": "127.0.0.1", "port": port, "log_level": "info", "cache_dir": str(ROOT / ".cache")},
        "auth": {"required": True, "keys": [{"name": n, "sha256": hash_key(k)} for n, k in KEYS.items()]},
        "models": [
            {
                "name": MODEL,
                "path": str(MODELS / "tiny-qwen3-moe"),
                "load_format": "dummy",
                "max_model_len": 2048,
                "max_num_seqs": 8,
                # 40 blocks of 128 tokens (64 KiB each): room for three requests of 11 blocks.
                "kv_cache_bytes": "2560KiB",
                "token_pace_s": PACE_S,
            }
        ],
        "admission": {"max_queued": MAX_QUEUED, "queue_timeout_s": {"interactive": 300, "batch": 2}},
    }
    path = tmp / "small.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return [Launch(path, tmp / "server.log", port)]


@pytest.fixture(scope="module")
def small(fleet: Fleet) -> Iterator[Server]:
    with fleet.servers(__name__) as (srv,):
        yield srv


def client(server: Server, user: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.api, api_key=KEYS[user], max_retries=0, timeout=300)


def stats(server: Server) -> dict[str, Any]:
    return server.stats(KEYS["heavy"])


def pool(server: Server) -> dict[str, Any]:
    return stats(server)["engines"][MODEL]  # type: ignore[no-any-return]


def prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 100000) for _ in range(PROMPT)]  # distinct prompts: no prefix sharing


async def call(c: openai.AsyncOpenAI, seed: int, **extra: Any) -> tuple[int, Any]:
    """(status, response or error): a completion of exactly MAX_TOKENS tokens if admitted."""
    try:
        raw = await c.completions.with_raw_response.create(
            model=MODEL,
            prompt=prompt(seed),
            max_tokens=MAX_TOKENS,
            extra_body={"ignore_eos": True},
            **extra,
        )
        return raw.status_code, raw
    except openai.APIStatusError as e:
        return e.status_code, e


async def wait_for(server: Server, cond: Any, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        p = await asyncio.to_thread(pool, server)
        if cond(p):
            return p
        if time.monotonic() > deadline:
            pytest.fail(f"condition not reached in {timeout}s: {p}")
        await asyncio.sleep(0.1)


def assert_clean_rejection(e: openai.APIStatusError) -> None:
    assert e.status_code in (429, 503), e
    assert int(e.response.headers["retry-after"]) >= 1
    body = e.body
    assert isinstance(body, dict) and body["code"] in ("server_overloaded", "queue_timeout", "rate_limit_exceeded")
    assert body["message"]


def assert_drained(server: Server) -> None:
    p = pool(server)
    a = p["admission"]
    assert (a["used_blocks"], a["admitted"], a["queued"], a["running_sequences"]) == (0, 0, 0, 0), a
    s = stats(server)["admission"]
    assert s["admitted"] == s["released"], s
    assert p["stats"]["preemptions"] == 0


async def test_overload_completes_or_rejects_cleanly_without_preemption(small: Server) -> None:
    p = pool(small)
    capacity = p["admission"]["capacity_blocks"]
    assert p["kv"]["max_num_seqs"] == 8 and capacity // BLOCKS_PER_REQUEST == 3  # vLLM alone would run 8
    heavy, light = client(small, "heavy"), client(small, "light")
    tasks = [asyncio.ensure_future(call(heavy if i % 2 else light, i)) for i in range(14)]
    peak_used, peak_queued = 0, 0
    while not all(t.done() for t in tasks):
        a = (await asyncio.to_thread(pool, small))["admission"]
        peak_used, peak_queued = max(peak_used, a["used_blocks"]), max(peak_queued, a["queued"])
        assert a["used_blocks"] <= capacity
        await asyncio.sleep(0.05)
    results = [t.result() for t in tasks]
    ok = [r for s, r in results if s == 200]
    rejected = [r for s, r in results if s != 200]
    for raw in ok:
        assert raw.parse().usage.completion_tokens == MAX_TOKENS
    for e in rejected:
        assert_clean_rejection(e)
    assert len(ok) >= 3 + MAX_QUEUED and rejected, (len(ok), len(rejected))
    assert peak_used == 3 * BLOCKS_PER_REQUEST and peak_queued >= 1
    assert_drained(small)


async def test_light_user_waits_at_most_one_slot(small: Server) -> None:
    heavy, light = client(small, "heavy"), client(small, "light")
    flood = [asyncio.ensure_future(call(heavy, 100 + i)) for i in range(3 + 4)]
    await wait_for(small, lambda p: p["admission"]["admitted"] == 3 and p["admission"]["queued"] == 4)
    status, raw = await call(light, 200)
    assert status == 200
    flood_results = await asyncio.gather(*flood)
    seqs = sorted(int(r.headers["x-sparkgate-admission-seq"]) for s, r in flood_results if s == 200)
    assert len(seqs) == 7
    light_seq = int(raw.headers["x-sparkgate-admission-seq"])
    # Admitted at the first slot that freed: right after the flood's three running requests.
    assert light_seq == seqs[2] + 1, (light_seq, seqs)
    assert_drained(small)


async def test_queue_timeout_and_leaving_while_queued(small: Server) -> None:
    heavy = client(small, "heavy")
    running = [asyncio.ensure_future(call(heavy, 300 + i)) for i in range(3)]
    await wait_for(small, lambda p: p["admission"]["admitted"] == 3)
    # A batch request (2 s queue timeout) cannot get in before the running ones end.
    status, err = await call(client(small, "third"), 400, extra_headers={"X-Sparkgate-Priority": "batch"})
    assert status == 503 and err.body["code"] == "queue_timeout"
    assert_clean_rejection(err)
    # A client that hangs up while queued gives its place back.
    sock = open_completion(small, 500)
    await wait_for(small, lambda p: p["admission"]["queued"] == 1)
    sock.close()
    await wait_for(small, lambda p: p["admission"]["queued"] == 0, timeout=10)
    for s, _ in await asyncio.gather(*running):
        assert s == 200
    assert_drained(small)
    assert stats(small)["admission"]["rejected"]["queue_timeout"] >= 1


def open_completion(server: Server, seed: int) -> socket.socket:
    payload = {"model": MODEL, "prompt": prompt(seed), "max_tokens": MAX_TOKENS}
    return open_post(server, "/v1/completions", payload, KEYS["third"])


async def test_request_larger_than_the_pool_is_refused(small: Server) -> None:
    """n=4 long completions need more blocks than the whole pool: a clear 400, not a wait forever."""
    with pytest.raises(openai.BadRequestError) as e:
        await client(small, "light").completions.create(model=MODEL, prompt=prompt(9), max_tokens=1000, n=4)
    assert e.value.body["code"] == "request_too_large"  # type: ignore[index]
    assert "KV-cache blocks" in e.value.body["message"]  # type: ignore[index]
