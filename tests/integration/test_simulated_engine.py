"""SimulatedEngine: the Engine protocol over the DGX Spark box model, with a real tokenizer."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from engine_adapter.base import Engine, EngineChunk, EngineRequest, EngineRequestInvalid, SamplingOptions
from engine_adapter.simulated import SimEngineConfig, SimulatedEngine
from policies.kv import footprint

TOKENIZER = Path(__file__).resolve().parents[2] / "models" / "tiny-qwen3"
SPEEDUP = 200.0  # a 35B-A3B decode step (~20 ms) takes ~0.1 ms of wall time


@pytest_asyncio.fixture
async def engine() -> AsyncIterator[SimulatedEngine]:
    if not TOKENIZER.exists():
        pytest.fail(f"{TOKENIZER} is missing: run `sparkgate prepare-models --root models`")
    eng = SimulatedEngine(
        SimEngineConfig(name="sim-35b", model="Qwen3.6-35B-A3B", tokenizer=str(TOKENIZER), speedup=SPEEDUP)
    )
    await eng.start()
    try:
        yield eng
    finally:
        await eng.shutdown()


def request(rid: str, prompt: list[int], max_tokens: int, **kw: object) -> EngineRequest:
    return EngineRequest(
        request_id=rid,
        prompt_token_ids=tuple(prompt),
        sampling=SamplingOptions(max_tokens=max_tokens, **kw),  # type: ignore[arg-type]
    )


def words(n: int, tag: int = 0) -> list[int]:
    return [1000 + tag] + [(tag * 31 + i) % 5000 + 200 for i in range(1, n)]


async def collect(engine: SimulatedEngine, req: EngineRequest) -> list[EngineChunk]:
    return [chunk async for chunk in engine.generate(req)]


async def test_implements_the_engine_protocol(engine: SimulatedEngine) -> None:
    assert isinstance(engine, Engine)
    assert engine.is_healthy
    assert engine.max_model_len == 262144
    assert engine.tokenizer.decode([9707])  # the real tokenizer


async def test_streams_the_requested_tokens_step_by_step(engine: SimulatedEngine) -> None:
    chunks = await collect(engine, request("a", words(300), 40))
    ids = [t for c in chunks for t in c.choices[0].token_ids]
    assert len(ids) == 40
    assert chunks[0].prompt_tokens == 300 and chunks[0].num_cached_tokens == 0
    assert len(chunks[0].choices[0].token_ids) == 1  # the prefill step samples one token
    assert all(1 <= len(c.choices[0].token_ids) <= 4 for c in chunks)  # MTP: up to k+1 per step
    assert len(chunks) < 40  # speculative decoding: several tokens per step
    assert [c.finished for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[-1].choices[0].finish_reason == "length"
    special = set(engine.tokenizer.all_special_ids)
    assert not special & set(ids)
    text = "".join(c.choices[0].text for c in chunks)
    assert text == engine.tokenizer.decode(ids)
    # Deterministic: the same prompt gives the same output.
    again = await collect(engine, request("a2", words(300), 40))
    assert [t for c in again for t in c.choices[0].token_ids] == ids


async def test_tokens_arrive_at_the_boxs_pace() -> None:
    """The engine sleeps step_time / speedup: its clock (wall x speedup) never runs ahead of the box."""
    eng = SimulatedEngine(
        SimEngineConfig(name="paced", model="Qwen3.6-35B-A3B", tokenizer=str(TOKENIZER), speedup=20.0)
    )
    await eng.start()
    try:
        t0, sim0 = eng.clock(), eng.sim.now
        w0 = time.monotonic()
        chunks = await collect(eng, request("paced", words(2048, 3), 200))
        clock_elapsed, wall = eng.clock() - t0, time.monotonic() - w0
        box_elapsed = eng.sim.now - max(sim0, t0)
    finally:
        await eng.shutdown()
    assert sum(len(c.choices[0].token_ids) for c in chunks) == 200
    # ~0.26 s prefill + 199 tokens at ~160 tok/s on the box: ~1.5 simulated seconds.
    assert 1.2 < box_elapsed < 1.9
    assert clock_elapsed >= box_elapsed - 0.01
    assert wall >= box_elapsed / 20 - 0.001
    assert clock_elapsed < box_elapsed + 1.5  # a loaded host may lag, but not by much


async def test_instant_mode_waits_for_nothing_and_keeps_the_outputs(engine: SimulatedEngine) -> None:
    """Instant: the same steps and tokens, on the simulator's own clock (no step is slept)."""
    eng = SimulatedEngine(dataclasses.replace(engine.config, name="instant", instant=True))
    await eng.start()
    try:
        chunks = await collect(eng, request("i", words(2048, 3), 200))
        assert eng.clock() == eng.sim.now > 1.2  # the box's seconds, not the wall's
    finally:
        await eng.shutdown()
    paced = await collect(engine, request("p", words(2048, 3), 200))
    assert [c.choices[0].token_ids for c in chunks] == [c.choices[0].token_ids for c in paced]


async def test_cached_tokens_on_a_repeat(engine: SimulatedEngine) -> None:
    p = words(1000, 5)
    first = await collect(engine, request("c1", p, 2))
    second = await collect(engine, request("c2", p, 2))
    salted = await collect(engine, dataclasses.replace(request("c3", p, 2), cache_salt="other"))
    assert first[0].num_cached_tokens == 0
    assert second[0].num_cached_tokens == (1000 - 1) // 16 * 16
    assert all(c.num_cached_tokens == 992 for c in second)
    assert salted[0].num_cached_tokens == 0


async def test_closing_the_stream_aborts_and_frees_kv(engine: SimulatedEngine) -> None:
    gen = engine.generate(request("gone", words(3000, 7), 5000))
    first = await gen.__anext__()
    assert first.choices[0].token_ids
    assert engine.sim.blocks_held("gone") > 0 and engine.stats().running == 1
    await gen.aclose()  # type: ignore[attr-defined]
    assert engine.sim.blocks_held("gone") == 0
    assert engine.stats().kv_cache_usage == 0.0 and engine.stats().running == 0
    assert engine.stats().unfinished == 0


async def test_abort_ends_the_stream_with_abort(engine: SimulatedEngine) -> None:
    chunks: list[EngineChunk] = []

    async def consume() -> None:
        async for c in engine.generate(request("ab", words(500, 8), 5000)):
            chunks.append(c)

    task = asyncio.create_task(consume())
    while not chunks:
        await asyncio.sleep(0.001)
    await engine.abort("ab")
    await asyncio.wait_for(task, 5)
    assert chunks[-1].finished and chunks[-1].choices[0].finish_reason == "abort"
    assert sum(len(c.choices[0].token_ids) for c in chunks) < 5000
    assert engine.stats().kv_cache_usage == 0.0


async def test_kv_spec_matches_the_footprint_the_gateway_predicts(engine: SimulatedEngine) -> None:
    spec = engine.kv_spec
    assert spec.block_size == 16 and spec.max_num_seqs == 4 and spec.prefix_caching
    p, m = words(777, 9), 300
    predicted = footprint(spec, p, m).blocks
    peak = 0
    async for _ in engine.generate(request("fp", p, m)):
        peak = max(peak, engine.sim.blocks_held("fp"))
    assert peak == predicted == -(-(777 + 300 - 1) // 16)


async def test_stats_count_generation_and_prefix_cache(engine: SimulatedEngine) -> None:
    p = words(160, 11)
    await asyncio.gather(collect(engine, request("s1", p, 30)), collect(engine, request("s2", words(64, 12), 30)))
    await collect(engine, request("s3", p, 30))
    st = engine.stats()
    assert st.generation_tokens == 90
    assert st.prefix_cache_queries == 160 + 64 + 160
    assert st.prefix_cache_hits == 144
    assert st.preemptions == 0 and st.running == 0 and st.waiting == 0 and st.unfinished == 0
    assert st.steps > 10


async def test_invalid_requests_are_refused(engine: SimulatedEngine) -> None:
    with pytest.raises(EngineRequestInvalid, match="n=1"):
        await collect(engine, request("n2", words(10), 5, n=2))
    with pytest.raises(EngineRequestInvalid, match="max_model_len"):
        await collect(engine, request("long", words(10), 262144))
