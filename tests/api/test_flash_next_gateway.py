"""A gateway serving Qwen3.8-Flash-Next's real shape on vLLM 0.32's own engine core.

The model runs on the meta device behind vLLM's scheduler and KV cache manager
(benchmarks/meta_engine.py: no forward pass runs on the CPU build, every block is
vLLM's). The gateway reads the six KV groups from the engine's worker at start, and
under an overload of long prompts and answers, far beyond a 49-block pool, it
queues what does not fit: vLLM never preempts, and every admitted request finishes
in full.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from gateway.settings import hash_key
from tests.conftest import MODELS, ROOT, Fleet, Launch, Server, free_port

pytestmark = pytest.mark.engine  # starts a vLLM engine

MODEL = "flash-next"
KEY = "sk-flash"
BLOCK = 1664  # Flash-Next's block with BF16 KV on the CPU build


ENGINES = 1  # vLLM engines its server starts: the fleet starts it in a wave


def side_by_side(request: pytest.FixtureRequest, tmp: Path) -> list[Launch]:
    """This module's server, started with the session's others (tests/conftest.py: `fleet`)."""
    port = free_port()
    cfg = {
        "server": {"host": "127.0.0.1", "port": port, "log_level": "info", "cache_dir": str(ROOT / ".cache")},
        "auth": {"required": True, "keys": [{"name": "team", "sha256": hash_key(KEY)}]},
        "models": [
            {
                "name": MODEL,
                "path": str(MODELS / "flash-next-shape"),
                "load_format": "dummy",
                "max_model_len": 32768,
                "max_num_seqs": 16,
                # 2 GiB that nothing allocates: 50 blocks of 42 MB.
                "kv_cache_bytes": "2GiB",
                "engine_args": {
                    "distributed_executor_backend": "benchmarks.meta_engine.MetaExecutor",
                    "engram_config": {"cpu_offload": False},
                    "skip_tokenizer_init": False,
                },
            }
        ],
        "admission": {"max_queued": 64, "queue_timeout_s": {"interactive": 600, "batch": 600}},
    }
    path = tmp / "flash.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return [Launch(path, tmp / "server.log", port)]


@pytest.fixture(scope="module")
def flash(fleet: Fleet) -> Iterator[Server]:
    with fleet.servers(__name__) as (srv,):
        yield srv


def pool(server: Server) -> dict[str, Any]:
    return server.stats(KEY)["engines"][MODEL]  # type: ignore[no-any-return]


def test_the_gateway_reads_six_groups_from_the_engine(flash: Server) -> None:
    kv = pool(flash)["kv"]
    assert kv["block_size"] == BLOCK and kv["bytes_per_block"] == 42_172_416
    assert kv["num_blocks"] == 2 * 1024**3 // 42_172_416
    kinds = sorted(g["kind"] for g in kv["groups"])
    assert kinds == ["full_attention"] + ["linear_attention"] * 4 + ["ring"]


async def test_overload_queues_instead_of_letting_vllm_preempt(flash: Server) -> None:
    capacity = pool(flash)["admission"]["capacity_blocks"]
    c = openai.AsyncOpenAI(base_url=flash.api, api_key=KEY, max_retries=0, timeout=600)
    rng = random.Random(41)
    asks = [(rng.randrange(BLOCK, 6 * BLOCK), rng.randrange(1, 3000)) for _ in range(24)]

    async def call(i: int, p: int, m: int) -> int:
        ids = [random.Random(i).randrange(1000, 100000) for _ in range(p)]
        r = await c.completions.create(model=MODEL, prompt=ids, max_tokens=m, extra_body={"ignore_eos": True})
        assert r.usage is not None
        return r.usage.completion_tokens

    tasks = [asyncio.ensure_future(call(i, p, m)) for i, (p, m) in enumerate(asks)]
    peak_used, peak_queued = 0, 0
    while not all(t.done() for t in tasks):
        a = (await asyncio.to_thread(pool, flash))["admission"]
        peak_used, peak_queued = max(peak_used, a["used_blocks"]), max(peak_queued, a["queued"])
        assert a["used_blocks"] <= capacity
        await asyncio.sleep(0.05)
    assert [t.result() for t in tasks] == [m for _, m in asks]
    # F + 9 blocks each: about 13 for these, 24 of them against a 49-block pool.
    worst = sum(-(-(p + m - 1) // BLOCK) + 9 for p, m in asks)
    assert worst > 3 * capacity and peak_queued >= 1
    p = pool(flash)
    assert p["stats"]["preemptions"] == 0
    assert p["admission"]["used_blocks"] == 0 and p["admission"]["queued"] == 0
