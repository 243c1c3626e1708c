"""Exactness: what sparkgate predicts a request holds equals what vLLM allocates.

Each model runs in a real in-process vLLM CPU engine whose scheduler, KV cache
manager and block pool are instrumented (`kv_probe.py`). The prediction side is
the gateway's own code: the KV spec it derives from the engine's config
(`engine_adapter.vllm_local.kv_spec_from_config`), `policies.kv.footprint` and
the `policies.admission` ledger. Error allowed: zero blocks.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.kv_probe import KVProbe, ProbeRequest, cpu_lacks_for, make_prompt
from engine_adapter.base import KVSpec
from engine_adapter.vllm_local import kv_spec_from_config
from policies.admission import Admission
from policies.demand import Admit, Demand, PoolLimits
from policies.kv import footprint, resumes_at_end, sequence_blocks

pytestmark = pytest.mark.engine  # starts vLLM engines

MODELS = Path(__file__).resolve().parents[2] / "models"

ENGINES = {
    "dense": ("tiny-qwen3", {}),
    "moe": ("tiny-qwen3-moe", {}),
    "fp8": ("tiny-qwen3", {"kv_cache_dtype": "fp8_e4m3"}),
    "hybrid": ("tiny-qwen3-next", {}),  # Qwen3-Next: linear attention (GDN) + full attention, "align" mode
    "sliding": ("tiny-qwen3-swa", {}),  # every layer sliding window 256
    "sliding+full": ("tiny-gemma3-swa", {}),  # two groups in one pool
}
FULL_ATTENTION_ONLY = {"dense", "moe", "fp8"}
SHARING = FULL_ATTENTION_ONLY | {"hybrid"}  # where hits on a running request are predicted
KIND = {"full_attention": "full_attention", "sliding_window": "sliding_window", "mamba": "linear_attention"}

# (prompt, max_tokens): block edges at 128 and at the hybrid's 384 or 640 (it varies with the CPU),
# prefill chunks past the window.
SINGLE = [(1, 1), (127, 1), (128, 1), (129, 1), (128, 128), (255, 2), (256, 1), (200, 57), (300, 213),
          (383, 2), (384, 1), (385, 1), (639, 2), (640, 1), (641, 1), (700, 600), (1300, 30), (2100, 3)]  # fmt: skip


@pytest.fixture(scope="module", params=list(ENGINES))
def engine(request: pytest.FixtureRequest) -> Iterator[tuple[str, KVProbe, KVSpec]]:
    model, kwargs = ENGINES[request.param]
    if reason := cpu_lacks_for(kwargs):
        pytest.skip(reason)
    probe = KVProbe.start(MODELS / model, **kwargs)
    try:
        yield request.param, probe, kv_spec_from_config(probe.engine.vllm_config)
    finally:
        probe.shutdown()


def test_derived_spec_matches_the_engine(engine: tuple[str, KVProbe, KVSpec]) -> None:
    _, probe, spec = engine
    f = probe.facts
    assert spec.num_blocks == f.num_blocks and spec.usable_blocks == f.usable_blocks
    assert spec.bytes_per_block == f.bytes_per_block
    assert spec.kv_cache_bytes // spec.bytes_per_block == spec.num_blocks
    ours = sorted((g.kind, g.block_size, g.num_layers, g.sliding_window) for g in spec.groups)
    theirs = sorted((KIND[g.kind], g.block_size, g.num_layers, g.sliding_window) for g in f.groups)
    assert ours == theirs


def test_single_request_peak_is_predicted_exactly(engine: tuple[str, KVProbe, KVSpec]) -> None:
    _, probe, spec = engine
    order = {g.index: i for i, g in enumerate(sorted(probe.facts.groups, key=lambda g: (KIND[g.kind], g.index)))}
    mine = sorted(range(len(spec.groups)), key=lambda i: spec.groups[i].kind)
    for seed, (p, m) in enumerate(SINGLE):
        probe.reset_prefix_cache()
        prompt = make_prompt(p, 1000 + seed)
        (rec,) = probe.run([ProbeRequest(prompt_token_ids=prompt, max_tokens=m)])
        assert rec.num_output_tokens == m
        predicted = footprint(spec, prompt, m)
        per_group = sequence_blocks(spec, p, m)
        measured = [0] * len(spec.groups)
        for g in probe.facts.groups:
            measured[mine[order[g.index]]] = rec.peak_blocks_per_group[g.index]
        if p > spec.max_num_batched_tokens and any(g.kind == "sliding_window" for g in spec.groups):
            # A chunked prefill's peak in a window depends on where other requests' tokens cut
            # the chunks; the estimate takes the worst cut, so it is an upper bound here.
            assert probe.last_run.peak_pool_used <= predicted.blocks, (p, m, rec.brief())
            continue
        assert probe.last_run.peak_pool_used == predicted.blocks, (p, m, rec.brief())
        assert tuple(measured) == per_group, (p, m, rec.brief())


def test_repeat_after_finish_costs_the_full_footprint(engine: tuple[str, KVProbe, KVSpec]) -> None:
    """Hit blocks nobody holds come off the free list: the pool pays for them like new ones."""
    _, probe, spec = engine
    for p in (300, 1300):
        if p <= spec.block_size:
            continue  # no whole block to hit
        probe.reset_prefix_cache()
        prompt = make_prompt(p, 7 + p)
        probe.run([ProbeRequest(prompt_token_ids=prompt, max_tokens=10)])
        (again,) = probe.run([ProbeRequest(prompt_token_ids=prompt, max_tokens=10)])
        assert again.hit_tokens > 0  # it did hit the cache...
        if any(g.kind == "sliding_window" for g in spec.groups):
            # A window revives only the blocks still inside it: the hit makes the prefill cheaper.
            assert probe.last_run.peak_pool_used <= footprint(spec, prompt, 10).blocks
        else:
            assert probe.last_run.peak_pool_used == footprint(spec, prompt, 10).blocks  # ...and still cost this much


def _ledger(spec: KVSpec) -> Admission:
    return Admission([PoolLimits(name="m", blocks=spec.usable_blocks, max_sequences=64)])


def _demand(spec: KVSpec, prompt: list[int], max_tokens: int, n: int = 1) -> Demand:
    fp = footprint(spec, prompt, max_tokens, n=n)
    return Demand(
        id=f"r{len(prompt)}-{prompt[-1]}-{n}",
        pool="m",
        user="u",
        sequences=n,
        private_blocks=fp.private_blocks,
        shared_keys=fp.shared_keys,
        resume_at_end_only=resumes_at_end(spec),
    )


def _sharing_layouts(name: str, bs: int) -> list[tuple[int, int, int]]:
    """(A's prompt, tokens B shares with it, B's prompt). A hybrid caches A's state only at
    its replay boundary, 2 blocks in: B hits those 2 blocks and revives that state block.
    Then B either stays in the block its prefill ends in, or crosses into the next one while
    decoding, after it has let the revived block go (so the pool never holds all it took)."""
    if name != "hybrid":
        return [(300, 260, 330)]
    return [(2 * bs + bs // 2, 2 * bs + 20, 2 * bs + bs // 2), (2 * bs + bs // 2, 2 * bs + 20, 3 * bs - 10)]


def test_prefix_hit_on_a_running_request_is_predicted(engine: tuple[str, KVProbe, KVSpec]) -> None:
    name, probe, spec = engine
    if name not in SHARING:
        pytest.skip("sliding windows predict no sharing (an upper bound)")
    for seed, (pa, common, pb) in enumerate(_sharing_layouts(name, spec.block_size)):
        probe.reset_prefix_cache()
        shared = make_prompt(pa, 11 + 2 * seed)
        a_prompt, b_prompt = shared, shared[:common] + make_prompt(pb - common, 12 + 2 * seed)
        ra, rb = probe.run(
            [
                ProbeRequest(prompt_token_ids=a_prompt, max_tokens=40),
                ProbeRequest(prompt_token_ids=b_prompt, max_tokens=40, add_at_step=5),  # A is prefilled by then
            ]
        )
        ledger = _ledger(spec)
        a, b = _demand(spec, a_prompt, 40), _demand(spec, b_prompt, 40)
        admit_a, _ = ledger.offer(a)
        ledger.prefilled(a.id)
        admit_b, _ = ledger.offer(b)
        assert isinstance(admit_a, Admit) and isinstance(admit_b, Admit)
        layout = (pa, common, pb, rb.brief())
        assert admit_b.shared_blocks == rb.shared_hit_blocks == rb.hit_tokens // spec.block_size > 0, layout
        # What B adds to the pool at its peak, measured in vLLM's block pool.
        assert admit_b.blocks == rb.peak_net_pool, layout
        if name == "hybrid":
            # B revived A's cached state block, a block nobody held: it is paid from B's own.
            assert rb.revived_cached_blocks == 1, layout
            # A's and B's two-state-block steps need not coincide: the pool may peak lower.
            assert ledger.snapshot("m").used_blocks >= probe.last_run.peak_pool_used, layout
        else:
            assert rb.revived_cached_blocks == 0 and rb.new_blocks == admit_b.blocks, layout
            assert ledger.snapshot("m").used_blocks == probe.last_run.peak_pool_used, layout
        assert ra.num_preemptions == rb.num_preemptions == 0, layout


def test_same_step_twins_are_reconciled_to_the_engine(engine: tuple[str, KVProbe, KVSpec]) -> None:
    """Two identical prompts admitted together: the ledger cannot count on sharing before
    the first is prefilled, and gives the duplicates back once vLLM reports the hit."""
    name, probe, spec = engine
    if name not in FULL_ATTENTION_ONLY:
        pytest.skip("sharing is predicted only for full-attention models")
    probe.reset_prefix_cache()
    prompt = make_prompt(300, 21)
    _, rb = probe.run([ProbeRequest(prompt_token_ids=prompt, max_tokens=40)] * 2)
    ledger = _ledger(spec)
    a = _demand(spec, prompt, 40)
    b = Demand(id="twin", pool="m", user="v", private_blocks=a.private_blocks, shared_keys=a.shared_keys)
    ledger.offer(a)
    ledger.offer(b)
    assert ledger.snapshot("m").used_blocks == 2 * footprint(spec, prompt, 40).blocks  # worst case first
    ledger.prefilled(a.id)
    ledger.prefilled(b.id)
    ledger.reconcile(b.id, (rb.num_cached_tokens or 0) // spec.block_size)
    assert ledger.snapshot("m").used_blocks == probe.last_run.peak_pool_used


def test_n_siblings_share_their_prompt(engine: tuple[str, KVProbe, KVSpec]) -> None:
    name, probe, spec = engine
    probe.reset_prefix_cache()
    prompt = make_prompt(300, 31)
    probe.run([ProbeRequest(prompt_token_ids=prompt, max_tokens=30, n=2)])
    predicted = footprint(spec, prompt, 30, n=2).blocks
    if name in FULL_ATTENTION_ONLY:
        assert probe.last_run.peak_pool_used == predicted
    else:
        assert probe.last_run.peak_pool_used <= predicted  # hybrid/sliding siblings: charged per sequence
