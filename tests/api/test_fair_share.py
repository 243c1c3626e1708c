"""Fair share through a real gateway: a flood cannot hold the slot a light user is owed.

One server for this module: the tiny dense vLLM engine with 4 running slots, its output
delivered at 20 ms per token at least (`token_pace_s`), so a flood's request holds its slot
for 4 s or more on any machine while a light user's short one is done in a few tokens. Idle
grace is long (300 s) so that no step below depends on how fast the machine is; its expiry
is covered by tests/unit/test_fair_share*.py. The story, in admission order and ledger
states, never wall time:
- a lone user flooding gets every slot (work-conserving);
- a light user arriving then waits for the first slot that frees (it was owed nothing yet);
- once it is active, the flood may not take its slot: the light user's next request is
  admitted at once (it never queues) into a free engine slot, so it runs on the next step.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from gateway.settings import hash_key
from tests.conftest import MODELS, ROOT, Fleet, Launch, Server, free_port

pytestmark = pytest.mark.engine  # starts a vLLM engine

MODEL = "tiny-fair"
KEYS = {"heavy": "sk-fair-heavy", "light": "sk-fair-light"}
SLOTS = 4
FLOOD = 3 * SLOTS
HEAVY_TOKENS = 200  # x 20 ms: 4 s or more per request
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
                "path": str(MODELS / "tiny-qwen3"),
                "max_model_len": 1024,
                "max_num_seqs": SLOTS,
                "kv_cache_bytes": "16MiB",
                "enforce_eager": True,
                "token_pace_s": PACE_S,
            }
        ],
        "admission": {"fair_share": {"idle_s": 300}},  # enabled: the default
    }
    path = tmp / "fair.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return [Launch(path, tmp / "server.log", port)]


@pytest.fixture(scope="module")
def fair(fleet: Fleet) -> Iterator[Server]:
    with fleet.servers(__name__) as (srv,):
        yield srv


def stats(server: Server) -> dict[str, Any]:
    return server.stats(KEYS["light"])


def pool(server: Server) -> dict[str, Any]:
    return stats(server)["engines"][MODEL]["admission"]  # type: ignore[no-any-return]


async def wait_for(server: Server, cond: Any, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        p = await asyncio.to_thread(pool, server)
        if cond(p):
            return p
        if time.monotonic() > deadline:
            pytest.fail(f"condition not reached in {timeout}s: {p}")
        await asyncio.sleep(0.05)


async def call(server: Server, user: str, seed: int, max_tokens: int) -> Any:
    c = openai.AsyncOpenAI(base_url=server.api, api_key=KEYS[user], max_retries=0, timeout=300)
    rng = random.Random(seed)
    raw = await c.completions.with_raw_response.create(
        model=MODEL,
        prompt=[rng.randrange(1000, 100_000) for _ in range(32)],  # distinct: no prefix sharing
        max_tokens=max_tokens,
        extra_body={"ignore_eos": True},
    )
    return raw


async def test_a_flood_leaves_the_light_users_slot_and_a_lone_user_gets_every_slot(fair: Server) -> None:
    flood = [asyncio.ensure_future(call(fair, "heavy", i, HEAVY_TOKENS)) for i in range(FLOOD)]
    try:
        # Alone, the heavy user gets every slot.
        p = await wait_for(fair, lambda p: p["running_sequences"] == SLOTS and p["queued"] == FLOOD - SLOTS)
        assert (p["active_users"], p["owed_slots"]) == (1, 0)

        # A light user arriving now is owed a slot but must wait for the first to free up.
        first = asyncio.ensure_future(call(fair, "light", 1000, 4))
        await wait_for(fair, lambda p: p["queued"] == FLOOD - SLOTS + 1 and p["owed_slots"] == 1)
        raw = await first
        first_seq = int(raw.headers["x-sparkgate-admission-seq"])
        assert first_seq == SLOTS + 1  # right after the flood's running requests: round robin

        # Done, but active: the flood may not take its slot, though it has requests waiting.
        p = await wait_for(fair, lambda p: p["owed_slots"] == 1 and p["running_sequences"] == SLOTS - 1)
        assert p["queued"] >= 1 and p["active_users"] == 2
        before = stats(fair)["admission"]["queued"]  # requests that ever had to queue

        raw = await call(fair, "light", 1001, 4)
        assert raw.parse().usage.completion_tokens == 4
        assert stats(fair)["admission"]["queued"] == before  # admitted at once: it never queued
        second_seq = int(raw.headers["x-sparkgate-admission-seq"])
        assert second_seq > first_seq
    finally:
        for f in flood:
            f.cancel()
        await asyncio.gather(*flood, return_exceptions=True)
    p = await wait_for(fair, lambda p: p["admitted"] == 0 and p["queued"] == 0)
    assert (p["used_blocks"], p["running_sequences"]) == (0, 0)
