"""engine_adapter/spark/: the box's step physics and the simulated scheduler, in virtual time."""

from __future__ import annotations

import dataclasses
import math

import pytest

from engine_adapter.spark import (
    DGX_SPARK,
    MODELS,
    BoxSim,
    SimConfig,
    StepResult,
    decode_step_cost,
    distinct_experts,
    step_cost,
    weight_bytes_touched,
)
from policies.kv import footprint

MOE = MODELS["Qwen3.6-35B-A3B"]
DENSE = MODELS["Qwen3.8-27B"]
BS = 16


def prompt(n: int, tag: int = 0) -> list[int]:
    """A prompt distinct from every other tag's from its first token on."""
    return [100_000 + tag] + [(tag * 7919 + i) % 50_000 + 10 for i in range(1, n)]


def run(sim: BoxSim) -> tuple[list[StepResult], dict[str, float], dict[str, float], dict[str, int]]:
    """Run to idle: (steps, first-token time, finish time, cached tokens) per request."""
    steps = sim.run_until_idle()
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    cached: dict[str, int] = {}
    for s in steps:
        for e in s.events:
            cached[e.request_id] = e.num_cached_tokens
            if e.first_token:
                first[e.request_id] = s.end
            if e.finished:
                last[e.request_id] = s.end
    return steps, first, last, cached


# -- step physics ----------------------------------------------------------------------------


def test_kv_bytes_per_token_counts_full_attention_layers_only() -> None:
    # 2 (K, V) x 16 full-attention layers x 4 KV heads x 256 x 1 byte (fp8); all 64 layers would be 4x.
    assert DENSE.kv_bytes_per_token == 32768
    assert MOE.kv_bytes_per_token == 2 * 10 * 2 * 256


def test_dense_decode_step_bytes() -> None:
    ctx = 8192
    cost = decode_step_cost(DGX_SPARK, DENSE, [ctx])
    k1 = DENSE.spec.draft_tokens + 1
    weights = DENSE.active_params * DENSE.weight_bytes_per_param  # every weight, lm_head included
    main = weights + ctx * DENSE.kv_bytes_per_token + DENSE.linear_state_bytes * (1 + k1)
    draft = (DENSE.spec.draft_params + DENSE.lm_head_params) * DENSE.weight_bytes_per_param
    assert cost.bytes == pytest.approx(main + draft)
    assert cost.memory_s == pytest.approx(main / (273e9 * DGX_SPARK.bandwidth_efficiency))
    assert cost.memory_s > cost.compute_s  # decode is memory-bound
    assert cost.seconds == pytest.approx(cost.memory_s + cost.draft_s + DGX_SPARK.step_overhead_s)
    # 14.4 GB of NVFP4 weights dominate: ~80 ms a step on 224 GB/s.
    assert 0.070 < cost.seconds < 0.095


def test_decode_step_grows_with_context_by_kv_bytes() -> None:
    short = decode_step_cost(DGX_SPARK, DENSE, [2048])
    long = decode_step_cost(DGX_SPARK, DENSE, [65536])
    assert long.bytes - short.bytes == pytest.approx((65536 - 2048) * 32768)


def test_moe_distinct_experts_uniform_routing() -> None:
    assert distinct_experts(MOE, 1) == pytest.approx(8)
    assert distinct_experts(MOE, 4) == pytest.approx(256 * (1 - (1 - 8 / 256) ** 4))  # 30.5
    assert distinct_experts(MOE, 16) == pytest.approx(102.0, abs=0.1)
    assert distinct_experts(MOE, 4096) == pytest.approx(256)
    assert distinct_experts(DENSE, 100) == 0.0
    # A working set of 10% of the experts: 16 tokens touch 25.5 of 25.6.
    assert distinct_experts(MOE, 16, locality=0.1) == pytest.approx(25.6 * (1 - (1 - 8 / 25.6) ** 16))


def test_moe_weight_bytes_follow_the_experts_touched() -> None:
    bpp = MOE.weight_bytes_per_param
    one = weight_bytes_touched(MOE, 1, 1)
    assert one == pytest.approx((MOE.shared_params + MOE.expert_params * 8 / 256) * bpp)
    assert one == pytest.approx(MOE.active_params * bpp)  # one token reads exactly its active weights
    all_experts = weight_bytes_touched(MOE, 100_000, 1)
    assert all_experts == pytest.approx((MOE.shared_params + MOE.expert_params) * bpp, rel=1e-6)
    # Decode of 4 sequences costs far less than 4x one sequence on an MoE, a little more on dense.
    one_seq = decode_step_cost(DGX_SPARK, MOE, [2048]).seconds
    four = decode_step_cost(DGX_SPARK, MOE, [2048] * 4).seconds
    assert 1.1 < four / one_seq < 1.6


def test_speculative_decoding_yield() -> None:
    sd = MOE.spec
    assert sd.expected_tokens == pytest.approx((1 - 0.87**4) / (1 - 0.87))  # 3.31
    assert dataclasses.replace(sd, acceptance=0.0).expected_tokens == pytest.approx(1.0)
    assert dataclasses.replace(sd, acceptance=1.0).expected_tokens == 4.0
    # The simulator emits that many tokens per verify step on average.
    sim = BoxSim(MOE)
    sim.submit("a", prompt(100), 1001)
    steps, *_ = run(sim)
    decode_steps = sum(1 for s in steps if s.decode_seqs)
    assert decode_steps == pytest.approx(1000 / sd.expected_tokens, abs=2)
    assert all(e.new_tokens <= 4 for s in steps for e in s.events)


def test_prefill_is_compute_bound_and_quadratic_in_context() -> None:
    chunk = step_cost(DGX_SPARK, DENSE, [], [(0, 4096, False)])
    assert chunk.compute_s > chunk.memory_s
    late = step_cost(DGX_SPARK, DENSE, [], [(61440, 4096, True)])
    # The same 4096 tokens attend over 60K more context: attention FLOPs dominate the difference.
    assert late.seconds > 1.5 * chunk.seconds


# -- the scheduler ---------------------------------------------------------------------------


def test_chunked_prefill_splits_64k_into_4096_token_chunks() -> None:
    sim = BoxSim(MOE)
    sim.submit("long", prompt(65536), 4)
    steps, first, _, _ = run(sim)
    prefill = [s.prefill_tokens for s in steps if s.prefill_tokens]
    assert prefill == [4096] * 16
    assert first["long"] == pytest.approx(sum(s.duration for s in steps[:16]))
    # ~14.6 s measured on the box.
    assert 12.5 < first["long"] < 17.0


def test_decode_is_not_starved_by_a_long_prefill() -> None:
    sim = BoxSim(MOE)
    sim.submit("short", prompt(100, 1), 2000)
    sim.step()  # short's prefill
    sim.submit("long", prompt(65536, 2), 10, arrival_time=sim.now)
    while sim.num_running < 2 or sim.blocks_held("long") == 0:
        sim.step()
    mixed = []
    while sim.blocks_held("long") < 65536 // BS:
        res = sim.step()
        mixed.append(res)
    for res in mixed:
        assert res.decode_seqs == 1  # the decode runs every step, first
        assert res.prefill_tokens <= 4096 - (MOE.spec.draft_tokens + 1)
        assert any(e.request_id == "short" and e.new_tokens >= 1 for e in res.events)


def test_long_prefill_threshold_lets_a_short_prompt_in_beside_a_long_one() -> None:
    """vLLM's long_prefill_token_threshold: a lone prompt takes the whole budget; once another
    request waits, each prefill takes at most the cap a step, so the short one is not queued
    behind the long one's whole prompt. Without the cap it is."""

    def chat_ttft(cap: int) -> tuple[float, list[int]]:
        sim = BoxSim(DENSE, config=SimConfig(max_num_batched_tokens=2048, long_prefill_token_threshold=cap))
        sim.submit("doc", prompt(32768, 1), 4)
        sim.step()  # alone: a whole budget
        sim.submit("chat", prompt(1500, 2), 4, arrival_time=sim.now)
        steps, first, _, _ = run(sim)
        return first["chat"] - steps[0].start, [s.prefill_tokens for s in steps[:3]]

    capped, chunks = chat_ttft(1024)
    # The doc and the chat share each step; the 27B is hybrid with prefix caching, so (vLLM's
    # align mode) the chat's chunk stops at its last block boundary (1488) and its last 12 tokens
    # take a third step.
    assert chunks == [1024 + 1024, 1024 + 464, 1024 + 12]
    fcfs, chunks = chat_ttft(0)
    assert chunks == [2048, 2048, 2048]  # the chat waits for the doc's whole prompt
    assert capped < 2 < 10 < fcfs  # three shared steps against the doc's whole prompt


def test_kv_pool_is_never_over_committed_and_nothing_is_preempted() -> None:
    # A pool of ~300 blocks: two 4000-token requests cannot both hold their peak.
    small = SimConfig(kv_cache_bytes=4 * MOE.linear_state_bytes + 301 * MOE.kv_bytes_per_token * BS)
    sim = BoxSim(MOE, config=small)
    usable = sim.pool.usable
    assert usable == 300
    sim.submit("a", prompt(3000, 1), 1000)  # peak cdiv(3999, 16) = 250 blocks
    sim.submit("b", prompt(3000, 2), 1000)
    seen_b_wait = False
    while sim.has_work:
        assert sim.step().blocks_in_use <= usable
        held_a, held_b = sim.blocks_held("a"), sim.blocks_held("b")
        assert held_a <= 250 and held_b <= 250
        assert not (held_a and held_b)  # never both: b waits for a's blocks
        seen_b_wait |= held_a > 0 and sim.num_waiting == 1
    assert seen_b_wait
    with pytest.raises(ValueError, match="KV blocks"):
        sim.submit("huge", prompt(5000), 10)  # more than the whole pool: refused, not queued forever


def test_prefix_cache_hit_cuts_ttft_and_counts_cached_tokens() -> None:
    sim = BoxSim(MOE)
    p = prompt(20000)
    sim.submit("cold", p, 2)
    _, first, _, cached = run(sim)
    t0 = sim.now
    sim.submit("warm", p, 2, arrival_time=t0)
    _, first2, _, cached2 = run(sim)
    assert cached["cold"] == 0
    assert cached2["warm"] == (20000 - 1) // BS * BS  # whole blocks, never the last prompt token
    assert first2["warm"] - t0 < 0.2 * first["cold"]
    assert sim.prefix_cache_hits == cached2["warm"]
    assert sim.prefix_cache_queries == 40000


def test_cache_salt_isolates_prefix_caches() -> None:
    sim = BoxSim(MOE)
    p = prompt(1000)
    sim.submit("a", p, 1, cache_salt="team-a")
    run(sim)
    sim.submit("b", p, 1, cache_salt="team-b")
    sim.submit("c", p, 1)
    _, _, _, cached = run(sim)
    assert cached == {"b": 0, "c": 0}
    sim.submit("a2", p, 1, cache_salt="team-a")
    _, _, _, cached = run(sim)
    assert cached == {"a2": 992}


def test_lru_eviction_of_unreferenced_cached_blocks() -> None:
    small = SimConfig(kv_cache_bytes=4 * MOE.linear_state_bytes + 201 * MOE.kv_bytes_per_token * BS)
    sim = BoxSim(MOE, config=small)
    sim.submit("a", prompt(1600, 1), 1)  # 100 cached blocks once done
    run(sim)
    assert sim.pool.cached == 100 and sim.pool.in_use == 0
    sim.submit("b", prompt(2400, 2), 1)  # 150 blocks: 50 must come from a's cached ones
    run(sim)
    assert sim.pool.evictions == 50
    # a's chain lost blocks: the least recently freed go first, and a's tail was freed first.
    sim.submit("a-again", prompt(1600, 1), 1)
    _, _, _, cached = run(sim)
    assert cached["a-again"] == 50 * BS


def test_kv_spec_agrees_with_the_gateways_footprint() -> None:
    sim = BoxSim(DENSE)
    spec = sim.kv_spec()
    assert spec.bytes_per_block == DENSE.kv_bytes_per_token * BS
    assert spec.usable_blocks == sim.pool.usable
    assert spec.block_size == BS and spec.max_num_batched_tokens == 4096
    # The pool is the budget less 4 sequences' linear state, in whole blocks.
    state = 4 * DENSE.linear_state_bytes
    assert spec.num_blocks == (65 * 2**30 - state) // spec.bytes_per_block
    for p, m in [(1, 1), (16, 1), (17, 16), (1000, 77), (5000, 3)]:
        ids = prompt(p, p)
        sim.submit(f"r{p}", ids, m)
        peak = 0
        while sim.has_work:
            peak = max(peak, sim.step().blocks_in_use)
        assert peak == footprint(spec, ids, m).blocks == math.ceil((p + m - 1) / BS)


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("prefix_caching", [False, True])
def test_the_box_models_state_blocks_are_the_policys(async_scheduling: bool, prefix_caching: bool) -> None:
    """BoxSim keeps its own copy of the state-block rule (engine_adapter may not import policies):
    it is policies/kv.py's `request_state_blocks`, in both scheduling modes, with and without
    prefix caching (mamba align), for every attention hold."""
    from engine_adapter.spark import Serving
    from policies.kv import cdiv, request_state_blocks

    flash = MODELS["Qwen3.8-Flash-Next"]
    serving = Serving(async_scheduling=async_scheduling, block_size=flash.vllm_block_size)
    config = SimConfig(serving=serving, enable_prefix_caching=prefix_caching, max_num_batched_tokens=8192)
    sim = BoxSim(flash, DGX_SPARK, config)
    for full in (1, 2, 3, 4, 5, 84):
        want = request_state_blocks(
            flash.state_groups,
            flash.ring_groups,
            "align" if prefix_caching else "none",
            full,
            async_scheduling=async_scheduling,
            chunk_blocks=cdiv(8192, flash.vllm_block_size),
        )
        assert sim.state_blocks(full) == want, full
    # Flash-Next's measured rule (vLLM 0.32 and 0.34): F + 9 in align, F + 5 without; under async
    # scheduling the bound of an 8,192-token chunk (3 blocks of 3,136) + 2 per state group.
    if not prefix_caching:
        assert sim.state_blocks(84) == 5
    else:
        assert sim.state_blocks(84) == (4 * (2 + 3) + 1 if async_scheduling else 9)
