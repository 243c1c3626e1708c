"""Measure vLLM's real KV-cache block allocation on tiny models, in-process.

`KVProbe` starts an in-process vLLM engine (LLMEngine over an InprocClient, so
the scheduler, its KVCacheManager and the BlockPool live in this process) and
hooks a few methods of those objects to record, per request:

* the peak number of (non-null) blocks it held in each KV cache group,
* how many blocks it took off the pool's free queue (new blocks, plus cached
  blocks revived from the free queue on a prefix hit) and how many it gave back
  while still running (sliding-window / Mamba state blocks), hence its peak net
  footprint in the pool,
* its prefix-cache hit at admission, `num_cached_tokens`, and preemptions;

and, per run, the peak number of pool blocks in use. The pool facts (usable
block count, per-group kind / block size / page size / layer count, Mamba cache
mode, scheduler class) come from the engine's own objects.

Usage (anything that starts an engine must run under `if __name__ == "__main__":`
or inside a test)::

    probe = KVProbe.start("models/tiny-qwen3", kv_cache_memory_bytes=64 * 65536)
    recs = probe.run([ProbeRequest(prompt_token_ids=make_prompt(200, seed=1), max_tokens=60)])
    recs[0].peak_blocks_per_group, recs[0].peak_net_pool, probe.last_run.peak_pool_used
    probe.pool_used_blocks(); probe.facts.usable_blocks; probe.shutdown()

`python -m benchmarks.kv_probe` runs the scenarios behind the KV rules
report (.cache/kv-rules.md) and prints each measurement next to its formula.
Each model runs in its own subprocess, one engine at a time.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from policies.kv import state_group_blocks

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "models"
CACHE = ROOT / ".cache"

ENV_DEFAULTS: dict[str, str] = {
    "VLLM_CACHE_ROOT": str(CACHE / "vllm"),
    "VLLM_RPC_BASE_PATH": str(CACHE / "rpc"),
    "TORCHINDUCTOR_CACHE_DIR": str(CACHE / "inductor"),
    "TIKTOKEN_CACHE_DIR": str(CACHE / "tiktoken"),
    "HF_HOME": str(CACHE / "hf"),
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    # The engine core must live in this process for the hooks to see it.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}

# Internal scheduler ids: "<external>-<8 hex>" (randomised) and "<k>_<that>" for n>1 children.
_INTERNAL_ID = re.compile(r"^(?:(?P<child>\d+)_)?(?P<ext>.+?)(?:-[0-9a-f]{8})?$")


def configure_env() -> None:
    """Set the cache/offline environment (without overriding what the caller set)."""
    for key, value in ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"


def cpu_lacks_for(engine_kwargs: dict[str, Any]) -> str | None:
    """Why this CPU cannot run an engine with these kwargs, or None. vLLM's CPU attention
    stores FP8 KV only with AVX-512 or AMX, the same test as here (cpu_attn.py); without
    them (AVX2-only x86, ARM) the engine raises at start-up."""
    if not str(engine_kwargs.get("kv_cache_dtype", "auto")).startswith("fp8"):
        return None
    import torch

    if torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported():
        return None
    return "vLLM's CPU build needs AVX-512 or AMX for an FP8 KV cache; this CPU has neither"


def make_prompt(length: int, seed: int, *, low: int = 1000, high: int = 150000) -> list[int]:
    """Deterministic pseudo-random token ids; different seeds share no prefix."""
    rng = random.Random(seed)
    return [rng.randrange(low, high) for _ in range(length)]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --------------------------------------------------------------------------- facts


@dataclass(frozen=True)
class GroupFacts:
    """One KV cache group, as the engine built it."""

    index: int
    kind: str  # "full_attention" | "sliding_window" | "mamba" | other spec class name
    spec_class: str
    manager_class: str
    block_size: int  # tokens per block of this group (manager block size)
    page_size_bytes: int  # bytes per block per layer (padding included)
    num_layers: int
    layer_names: tuple[str, ...]
    sliding_window: int | None
    mamba_cache_mode: str | None


@dataclass(frozen=True)
class PoolFacts:
    """The shared BlockPool and the settings that decide allocation."""

    num_blocks: int  # BlockPool size, including the null block (id 0)
    usable_blocks: int  # num_blocks - 1: the null block is never handed out
    bytes_per_block: int  # pool bytes one block id costs (all groups alias one buffer)
    kv_cache_memory_bytes: int | None
    scheduler_block_size: int  # cache_config.block_size (stretched for hybrids)
    hash_block_size: int
    cache_hit_alignment_tokens: int | None
    cache_dtype: str
    prefix_caching: bool
    mamba_cache_mode: str
    mamba_block_size: int | None
    async_scheduling: bool
    scheduler_class: str
    coordinator_class: str
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    prefix_cache_retention_interval: int | None
    scheduler_reserve_full_isl: bool
    watermark: float
    groups: tuple[GroupFacts, ...]

    def summary(self) -> str:
        lines = [
            f"pool: {self.num_blocks} blocks ({self.usable_blocks} usable, block 0 = null), "
            f"{self.bytes_per_block} B/block, kv_cache_memory_bytes={self.kv_cache_memory_bytes}",
            f"  scheduler block {self.scheduler_block_size}, hash block {self.hash_block_size}, "
            f"hit alignment {self.cache_hit_alignment_tokens}, dtype {self.cache_dtype}, "
            f"prefix caching {self.prefix_caching}, mamba mode {self.mamba_cache_mode!r} "
            f"(mamba_block_size {self.mamba_block_size})",
            f"  {self.scheduler_class} (async={self.async_scheduling}), {self.coordinator_class}, "
            f"max_model_len {self.max_model_len}, max_num_batched_tokens {self.max_num_batched_tokens}, "
            f"retention interval {self.prefix_cache_retention_interval}, "
            f"reserve_full_isl {self.scheduler_reserve_full_isl}, watermark {self.watermark}",
        ]
        for g in self.groups:
            extra = f" window={g.sliding_window}" if g.sliding_window else ""
            extra += f" mode={g.mamba_cache_mode}" if g.mamba_cache_mode else ""
            lines.append(
                f"  group {g.index}: {g.kind} ({g.spec_class}/{g.manager_class}) block {g.block_size} tok, "
                f"page {g.page_size_bytes} B/layer x {g.num_layers} layers{extra}"
            )
        return "\n".join(lines)


# --------------------------------------------------------------------------- requests / records


@dataclass
class ProbeRequest:
    """A request given as token ids. `add_at_step` = engine steps of this run before it is added."""

    prompt_token_ids: list[int]
    max_tokens: int
    n: int = 1
    ignore_eos: bool = True
    add_at_step: int = 0
    request_id: str | None = None
    sampling_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class RequestRecord:
    """What one (child) request did to the KV cache."""

    request_id: str  # external id; a child of an n>1 request is "<id>#<k>"
    parent_id: str
    child_index: int | None
    prompt_len: int
    max_tokens: int
    num_groups: int
    num_output_tokens: int = 0
    first_scheduled_step: int | None = None
    finished_step: int | None = None
    finish_num_computed_tokens: int | None = None
    finish_num_tokens: int | None = None
    peak_blocks_per_group: list[int] = field(default_factory=list)  # non-null blocks held at once
    peak_blocks_total: int = 0  # max over steps of the sum over groups
    peak_table_len_per_group: list[int] = field(default_factory=list)  # block-table length (nulls included)
    distinct_blocks_per_group: list[set[int]] = field(default_factory=list)
    new_blocks: int = 0  # BlockPool.get_new_blocks inside this request's allocate_slots
    revived_cached_blocks: int = 0  # prefix-hit blocks taken off the free queue (ref_cnt was 0)
    shared_hit_blocks: int = 0  # prefix-hit blocks another live request already held
    pool_taken: int = 0  # sum of free-queue decreases in its allocate_slots calls
    pool_released_early: int = 0  # free-queue increases in its allocate_slots calls (window / state frees)
    net_pool: int = 0  # current net footprint (resets on preemption)
    peak_net_pool: int = 0  # peak of net_pool: its own peak contribution to pool usage
    admission_hits: list[int] = field(default_factory=list)  # num_new_computed_tokens at each admission
    num_preemptions: int = 0  # scheduler-side preemptions seen by the hook
    num_cached_tokens: int | None = None  # RequestOutput.num_cached_tokens
    metrics_num_preemptions: int | None = None  # RequestOutput.metrics.num_preemptions
    trace: list[tuple[int, int, int, tuple[int, ...]]] = field(default_factory=list)
    alloc_trace: list[tuple[int, int, int, bool]] = field(default_factory=list)
    # (scheduler step, num_new_tokens, num_new_computed_tokens, allocated?) for every allocate_slots call
    # (scheduler step, num_computed_tokens after scheduling, num_tokens, non-null blocks per group)

    def __post_init__(self) -> None:
        if not self.peak_blocks_per_group:
            self.peak_blocks_per_group = [0] * self.num_groups
            self.peak_table_len_per_group = [0] * self.num_groups
            self.distinct_blocks_per_group = [set() for _ in range(self.num_groups)]

    @property
    def hit_tokens(self) -> int:
        return self.admission_hits[0] if self.admission_hits else 0

    def brief(self) -> str:
        return (
            f"{self.request_id}: P={self.prompt_len} M={self.max_tokens} out={self.num_output_tokens} "
            f"steps={self.first_scheduled_step}-{self.finished_step} "
            f"peak/group={self.peak_blocks_per_group} peak_total={self.peak_blocks_total} "
            f"table={self.peak_table_len_per_group} new={self.new_blocks} revived={self.revived_cached_blocks} "
            f"shared={self.shared_hit_blocks} peak_net={self.peak_net_pool} released_early={self.pool_released_early} "
            f"hits={self.admission_hits} cached_tokens={self.num_cached_tokens} "
            f"preempt={self.num_preemptions}/{self.metrics_num_preemptions}"
        )


class Gate(Protocol):
    """What stands between a run's requests and the engine (`KVProbe.run`)."""

    def arrive(self, request: ProbeRequest) -> bool:
        """A request arrives: True lets it in now; False keeps it out (queued or refused)."""
        ...

    def finished(self, request_id: str) -> list[ProbeRequest]:
        """A request finished: the queued requests to let in now."""
        ...


@dataclass
class RunStats:
    """Pool-level numbers of the last `KVProbe.run`."""

    steps: int = 0
    used_before: int = 0
    peak_pool_used: int = 0  # max over steps of used (non-null) pool blocks, sampled after schedule()
    used_after: int = 0
    num_preemptions: int = 0
    pool_used_trace: list[int] = field(default_factory=list)


# --------------------------------------------------------------------------- probe


def _spec_kind(spec: Any) -> str:
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, SlidingWindowSpec

    first = getattr(spec, "first_spec", None) if hasattr(spec, "kv_cache_specs") else None
    s = first if first is not None else spec
    if isinstance(s, MambaSpec):
        return "mamba"
    if isinstance(s, SlidingWindowSpec):
        return "sliding_window"
    if isinstance(s, FullAttentionSpec):
        return "full_attention"
    return type(s).__name__


class KVProbe:
    """An in-process vLLM engine with hooks on its scheduler, KV cache manager and block pool."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.core = engine.engine_core.engine_core
        self.scheduler = self.core.scheduler
        self.kv_cache_manager = self.scheduler.kv_cache_manager
        self.coordinator = self.kv_cache_manager.coordinator
        self.pool = self.kv_cache_manager.block_pool
        self.facts = self._read_facts()
        self._records: dict[str, RequestRecord] = {}  # internal id -> record
        self._by_external: dict[str, RequestRecord] = {}
        self._children: dict[str, list[RequestRecord]] = {}
        self._pending_meta: dict[str, ProbeRequest] = {}
        self._current: RequestRecord | None = None
        self._sched_step = 0
        self._counter = 0
        self.trace = False
        self.last_run = RunStats()
        self._install_hooks()

    # -- lifecycle ------------------------------------------------------------------

    @classmethod
    def start(cls, model: str | Path, **engine_kwargs: Any) -> KVProbe:
        """Start an engine on `model` (a dir); kwargs go to vllm.EngineArgs.

        Defaults: enforce_eager, max_model_len 4096, max_num_seqs 8, 64 MiB of KV cache,
        log stats on, load_format "dummy" when the dir holds no safetensors, no tokenizer (the
        probe sends token ids and reads blocks, never text: vLLM's tokenizer copies took 2-10 s
        of each start).
        """
        configure_env()
        from vllm import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        model = str(model)
        kwargs: dict[str, Any] = dict(
            model=model,
            enforce_eager=True,
            max_model_len=4096,
            max_num_seqs=8,
            kv_cache_memory_bytes=64 * 1024 * 1024,
            disable_log_stats=False,
            seed=0,
            skip_tokenizer_init=True,
        )
        if not any(Path(model).glob("*.safetensors")):
            kwargs["load_format"] = "dummy"
        kwargs.update(engine_kwargs)
        try:
            engine = LLMEngine.from_engine_args(EngineArgs(**kwargs))
        except BaseException:
            # A half-started engine leaves vLLM's process-wide parallel groups behind, and the
            # next engine in this process then fails to set up its own (EP group missing).
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

            cleanup_dist_env_and_memory()
            raise
        return cls(engine)

    def shutdown(self) -> None:
        with contextlib.suppress(Exception):
            self.engine.engine_core.shutdown()

    # -- facts ------------------------------------------------------------------------

    def _read_facts(self) -> PoolFacts:
        vc = self.engine.vllm_config
        cc, sc, mc = vc.cache_config, vc.scheduler_config, vc.model_config
        kcfg = self.kv_cache_manager.kv_cache_config
        groups = []
        for i, (g, mgr) in enumerate(zip(kcfg.kv_cache_groups, self.coordinator.single_type_managers, strict=True)):
            spec = g.kv_cache_spec
            per_layer = getattr(spec, "kv_cache_specs", None)
            page = max(s.page_size_bytes for s in per_layer.values()) if per_layer else int(spec.page_size_bytes)
            groups.append(
                GroupFacts(
                    index=i,
                    kind=_spec_kind(spec),
                    spec_class=type(spec).__name__,
                    manager_class=type(mgr).__name__,
                    block_size=int(mgr.block_size),
                    page_size_bytes=int(page),
                    num_layers=len(g.layer_names),
                    layer_names=tuple(g.layer_names),
                    sliding_window=getattr(spec, "sliding_window", None),
                    mamba_cache_mode=getattr(spec, "mamba_cache_mode", None),
                )
            )
        # Every tensor is a view of the one allocation (`size` bytes) the pool was cut from.
        tensors = list(kcfg.kv_cache_tensors)
        bytes_per_block = int(tensors[0].size) // int(kcfg.num_blocks) if tensors else 0
        return PoolFacts(
            num_blocks=int(self.pool.num_gpu_blocks),
            usable_blocks=int(self.pool.num_gpu_blocks) - 1,
            bytes_per_block=bytes_per_block,
            kv_cache_memory_bytes=cc.kv_cache_memory_bytes,
            scheduler_block_size=int(cc.block_size),
            hash_block_size=int(self.pool.hash_block_size),
            cache_hit_alignment_tokens=cc.cache_hit_alignment_tokens,
            cache_dtype=str(cc.cache_dtype),
            prefix_caching=bool(cc.enable_prefix_caching),
            mamba_cache_mode=str(cc.mamba_cache_mode),
            mamba_block_size=cc.mamba_block_size,
            async_scheduling=bool(sc.async_scheduling),
            scheduler_class=type(self.scheduler).__name__,
            coordinator_class=type(self.coordinator).__name__,
            max_model_len=int(mc.max_model_len),
            max_num_batched_tokens=int(sc.max_num_batched_tokens),
            max_num_seqs=int(sc.max_num_seqs),
            prefix_cache_retention_interval=cc.prefix_cache_retention_interval,
            scheduler_reserve_full_isl=bool(sc.scheduler_reserve_full_isl),
            watermark=float(sc.watermark),
            groups=tuple(groups),
        )

    # -- pool state -------------------------------------------------------------------

    def free_blocks(self) -> int:
        return int(self.pool.get_num_free_blocks())

    def pool_used_blocks(self) -> int:
        """Blocks held by requests (the null block excluded)."""
        return self.facts.usable_blocks - self.free_blocks()

    def cached_free_blocks(self) -> int:
        """Free blocks that still carry a prefix-cache hash (revivable by a hit)."""
        return sum(1 for b in self.pool.blocks if b.ref_cnt == 0 and not b.is_null and b.block_hash is not None)

    def reset_prefix_cache(self) -> bool:
        return bool(self.kv_cache_manager.reset_prefix_cache())

    def record(self, request_id: str) -> RequestRecord:
        """The record of a request (children of n > 1: "<id>#<k>") from any run so far."""
        return self._by_external[request_id]

    def held_blocks(self, internal_id: str) -> list[list[int]]:
        """Block ids (null included as 0) per group for a live request."""
        return [[b.block_id for b in g] for g in self.coordinator.get_blocks(internal_id)]

    # -- hooks ------------------------------------------------------------------------

    def _record_for(self, request: Any) -> RequestRecord | None:
        rid = request.request_id
        rec = self._records.get(rid)
        if rec is not None:
            return rec
        m = _INTERNAL_ID.match(rid)
        if m is None:
            return None
        ext = m.group("ext")
        meta = self._pending_meta.get(ext)
        child = int(m.group("child")) if m.group("child") is not None and meta is not None and meta.n > 1 else None
        if meta is None:  # an id we did not add; still track it
            meta = ProbeRequest(prompt_token_ids=list(request.prompt_token_ids or []), max_tokens=-1)
        rec = RequestRecord(
            request_id=ext if child is None else f"{ext}#{child}",
            parent_id=ext,
            child_index=child,
            prompt_len=len(meta.prompt_token_ids),
            max_tokens=meta.max_tokens,
            num_groups=len(self.facts.groups),
        )
        self._records[rid] = rec
        self._by_external[rec.request_id] = rec
        if child is not None:
            self._children.setdefault(ext, []).append(rec)
        return rec

    def _snapshot(self, request: Any, rec: RequestRecord) -> None:
        blocks = self.coordinator.get_blocks(request.request_id)
        held = tuple(sum(1 for b in g if not b.is_null) for g in blocks)
        for i, g in enumerate(blocks):
            rec.peak_blocks_per_group[i] = max(rec.peak_blocks_per_group[i], held[i])
            rec.peak_table_len_per_group[i] = max(rec.peak_table_len_per_group[i], len(g))
            rec.distinct_blocks_per_group[i].update(b.block_id for b in g if not b.is_null)
        rec.peak_blocks_total = max(rec.peak_blocks_total, sum(held))
        if self.trace:
            rec.trace.append((self._sched_step, int(request.num_computed_tokens), int(request.num_tokens), held))

    def _install_hooks(self) -> None:
        sched, kvm, pool = self.scheduler, self.kv_cache_manager, self.pool
        orig_schedule = sched.schedule
        orig_allocate = kvm.allocate_slots
        orig_get_new = pool.get_new_blocks
        orig_touch = pool.touch
        orig_preempt = sched._preempt_request
        orig_free_request = sched._free_request

        def schedule(*args: Any, **kwargs: Any) -> Any:
            out = orig_schedule(*args, **kwargs)
            self._sched_step += 1
            for request in list(sched.running):
                rec = self._record_for(request)
                if rec is None:
                    continue
                if rec.first_scheduled_step is None:
                    rec.first_scheduled_step = self._sched_step
                self._snapshot(request, rec)
            used = self.pool_used_blocks()
            self.last_run.pool_used_trace.append(used)
            self.last_run.peak_pool_used = max(self.last_run.peak_pool_used, used)
            return out

        def allocate_slots(request: Any, *args: Any, **kwargs: Any) -> Any:
            rec = self._record_for(request)
            admitting = request.num_computed_tokens == 0 or str(request.status).endswith(("WAITING", "PREEMPTED"))
            free_before = pool.get_num_free_blocks()
            self._current = rec
            try:
                result = orig_allocate(request, *args, **kwargs)
            finally:
                self._current = None
            delta = free_before - pool.get_num_free_blocks()
            if rec is not None:
                if delta > 0:
                    rec.pool_taken += delta
                else:
                    rec.pool_released_early += -delta
                rec.net_pool += delta
                rec.peak_net_pool = max(rec.peak_net_pool, rec.net_pool)
                if self.trace:
                    num_new = int(args[0]) if args else int(kwargs.get("num_new_tokens", 0))
                    hit = int(kwargs.get("num_new_computed_tokens", 0))
                    rec.alloc_trace.append((self._sched_step + 1, num_new, hit, result is not None))
                if result is not None and admitting and "new_computed_blocks" in kwargs:
                    rec.admission_hits.append(int(kwargs.get("num_new_computed_tokens", 0)))
            return result

        def get_new_blocks(num_blocks: int) -> Any:
            if self._current is not None:
                self._current.new_blocks += num_blocks
            return orig_get_new(num_blocks)

        def touch(blocks: Sequence[Any]) -> None:
            rec = self._current
            if rec is not None:
                for b in blocks:
                    if b.is_null:
                        continue
                    if b.ref_cnt == 0:
                        rec.revived_cached_blocks += 1
                    else:
                        rec.shared_hit_blocks += 1
            orig_touch(blocks)

        def preempt(request: Any, *args: Any, **kwargs: Any) -> Any:
            rec = self._record_for(request)
            if rec is not None:
                self._snapshot(request, rec)
                rec.num_preemptions += 1
                rec.net_pool = 0
            self.last_run.num_preemptions += 1
            return orig_preempt(request, *args, **kwargs)

        def free_request(request: Any, *args: Any, **kwargs: Any) -> Any:
            rec = self._record_for(request)
            if rec is not None:
                rec.finished_step = self._sched_step
                rec.finish_num_computed_tokens = int(request.num_computed_tokens)
                rec.finish_num_tokens = int(request.num_tokens)
                rec.net_pool = 0
            return orig_free_request(request, *args, **kwargs)

        sched.schedule = schedule
        kvm.allocate_slots = allocate_slots
        pool.get_new_blocks = get_new_blocks
        pool.touch = touch
        sched._preempt_request = preempt
        sched._free_request = free_request

    # -- running ----------------------------------------------------------------------

    def run(
        self, requests: Iterable[ProbeRequest], *, max_steps: int = 100000, gate: Gate | None = None
    ) -> list[RequestRecord]:
        """Add the requests (each at its `add_at_step`) and step until all finish.

        With a `gate`, a request reaches the engine only when the gate lets it: at its
        arrival, or when the gate admits it as another finishes (an admission controller
        in front of the engine); a request the gate never admits gets no record.
        Returns one record per request, or per child for n > 1 (ids "<id>#<k>").
        """
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        todo = sorted(requests, key=lambda r: r.add_at_step)
        order: list[str] = []
        for r in todo:
            if r.request_id is None:
                self._counter += 1
                r.request_id = f"p{self._counter}"
            if "-" in r.request_id or "_" in r.request_id:
                raise ValueError("request ids must not contain '-' or '_'")
            order.append(r.request_id)
        self.last_run = RunStats(used_before=self.pool_used_blocks())
        parents: dict[str, ProbeRequest] = {}
        step = 0
        ready: list[ProbeRequest] = []
        while todo or ready or self.engine.has_unfinished_requests():
            while todo and todo[0].add_at_step <= step:
                r = todo.pop(0)
                if gate is None or gate.arrive(r):
                    ready.append(r)
            while ready:
                r = ready.pop(0)
                assert r.request_id is not None
                self._pending_meta[r.request_id] = r
                parents[r.request_id] = r
                params = SamplingParams(
                    max_tokens=r.max_tokens,
                    ignore_eos=r.ignore_eos,
                    n=r.n,
                    temperature=0.0 if r.n == 1 else 1.0,
                    output_kind=RequestOutputKind.FINAL_ONLY,
                )
                for key, value in r.sampling_kwargs.items():
                    setattr(params, key, value)
                self.engine.add_request(r.request_id, {"prompt_token_ids": list(r.prompt_token_ids)}, params)
                if r.n == 1:
                    self._ensure_record(r)
            for out in self.engine.step():
                self._absorb_output(out)
                if gate is not None and getattr(out, "finished", False):
                    ready.extend(gate.finished(out.request_id))
            step += 1
            if step > max_steps:
                raise RuntimeError(f"run did not finish in {max_steps} steps")
        self.last_run.steps = step
        self.last_run.used_after = self.pool_used_blocks()
        result: list[RequestRecord] = []
        for rid in order:
            if rid not in parents:
                continue  # the gate never let it in
            if parents[rid].n == 1:
                result.append(self._by_external[rid])
            else:
                result.extend(sorted(self._children.get(rid, []), key=lambda c: c.child_index or 0))
        return result

    def _ensure_record(self, r: ProbeRequest) -> None:
        assert r.request_id is not None
        if r.request_id not in self._by_external:
            rec = RequestRecord(
                request_id=r.request_id,
                parent_id=r.request_id,
                child_index=None,
                prompt_len=len(r.prompt_token_ids),
                max_tokens=r.max_tokens,
                num_groups=len(self.facts.groups),
            )
            self._by_external[r.request_id] = rec

    def _absorb_output(self, out: Any) -> None:
        if not getattr(out, "finished", False):
            return
        rid = out.request_id
        metrics = getattr(out, "metrics", None)
        preempts = getattr(metrics, "num_preemptions", None) if metrics is not None else None
        children = self._children.get(rid)
        if children:
            by_index = {c.index: c for c in out.outputs}
            for child in children:
                comp = by_index.get(child.child_index)
                child.num_output_tokens = len(comp.token_ids) if comp is not None else 0
                # n > 1: the parent's RequestOutput carries the last child's num_cached_tokens.
                child.num_cached_tokens = out.num_cached_tokens
                child.metrics_num_preemptions = preempts
            return
        rec = self._by_external.get(rid)
        if rec is None:
            return
        rec.num_output_tokens = len(out.outputs[0].token_ids) if out.outputs else 0
        rec.num_cached_tokens = out.num_cached_tokens
        rec.metrics_num_preemptions = preempts


# =========================================================================== scenarios (__main__)

Check = tuple[str, int | str, int | str]  # (label, measured, expected)


class Report:
    """Collects measured-vs-formula lines and counts mismatches."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.mismatches = 0

    def say(self, text: str = "") -> None:
        print(text, flush=True)
        self.lines.append(text)

    def check(self, label: str, measured: int | str, expected: int | str) -> None:
        ok = measured == expected
        if not ok:
            self.mismatches += 1
        self.say(f"    {'ok ' if ok else 'XX '} {label}: measured {measured}  formula {expected}")


def peak_full(p: int, m: int, bs: int) -> int:
    """Peak full-attention blocks of a request: slots for P + M - 1 tokens (last sampled token never stored)."""
    return cdiv(p + m - 1, bs)


def hit_tokens(common: int, prompt_len: int, bs: int) -> int:
    """Full-attention prefix hit: whole blocks of the common prefix, capped at P - 1 tokens."""
    return min(common, prompt_len - 1) // bs * bs


def _seed() -> Callable[[], int]:
    counter = [1000]

    def nxt() -> int:
        counter[0] += 1
        return counter[0]

    return nxt


def scenarios_full_attention(probe: KVProbe, rep: Report) -> None:
    """Dense / MoE: one full-attention group."""
    f = probe.facts
    bs = f.groups[0].block_size
    seed = _seed()
    rep.say("  single requests: peak blocks = ceil((P+M-1)/bs), pool peak = same")
    combos = [(100, 20), (1, 1), (127, 1), (128, 1), (129, 1), (128, 128), (129, 128), (255, 2), (256, 1), (200, 57)]
    combos += [(256, 2), (300, 213), (2100, 3)]
    for p, m in combos:
        if p + m > f.max_model_len:
            continue
        probe.reset_prefix_cache()
        (rec,) = probe.run([ProbeRequest(prompt_token_ids=make_prompt(p, seed()), max_tokens=m)])
        rep.check(
            f"P={p} M={m} (P+M={p + m}) peak blocks [ceil((P+M)/bs)={cdiv(p + m, bs)}]",
            rec.peak_blocks_total,
            peak_full(p, m, bs),
        )
        rep.check(f"P={p} M={m} pool peak used", probe.last_run.peak_pool_used, peak_full(p, m, bs))
        rep.check(f"P={p} M={m} outputs", rec.num_output_tokens, m)

    rep.say("  prefix caching (hits are whole blocks, capped at P-1; hashed at allocation time)")
    probe.reset_prefix_cache()
    shared = make_prompt(300, seed())
    a = ProbeRequest(prompt_token_ids=shared, max_tokens=40)
    b = ProbeRequest(prompt_token_ids=shared[:260] + make_prompt(70, seed()), max_tokens=40, add_at_step=5)
    ra, rb = probe.run([a, b])
    rep.say(f"    {ra.brief()}\n    {rb.brief()}")
    h = hit_tokens(260, 330, bs)
    rep.check("B added while A runs: B hit tokens", rb.hit_tokens, h)
    rep.check("B num_cached_tokens", rb.num_cached_tokens or 0, h)
    rep.check("B shared hit blocks (held by A, cost 0)", rb.shared_hit_blocks, h // bs)
    rep.check("B new pool blocks", rb.new_blocks, peak_full(330, 40, bs) - h // bs)
    rep.check("pool peak A+B", probe.last_run.peak_pool_used, peak_full(300, 40, bs) + peak_full(330, 40, bs) - h // bs)

    probe.reset_prefix_cache()
    shared = make_prompt(300, seed())
    ra, rb = probe.run(
        [ProbeRequest(prompt_token_ids=shared, max_tokens=40), ProbeRequest(prompt_token_ids=shared, max_tokens=40)]
    )
    rep.say(f"    {ra.brief()}\n    {rb.brief()}")
    h = hit_tokens(300, 300, bs)
    rep.check(
        "identical prompts added together: both scheduled in step",
        rb.first_scheduled_step or 0,
        ra.first_scheduled_step or 0,
    )
    rep.check("identical prompts added together: 2nd hit tokens (same step)", rb.hit_tokens, h)
    rep.check("  2nd shared hit blocks", rb.shared_hit_blocks, h // bs)
    rep.check("  pool peak", probe.last_run.peak_pool_used, 2 * peak_full(300, 40, bs) - h // bs)

    for p in (300, 256):
        probe.reset_prefix_cache()
        prompt = make_prompt(p, seed())
        probe.run([ProbeRequest(prompt_token_ids=prompt, max_tokens=10)])
        cached_free = probe.cached_free_blocks()
        (r2,) = probe.run([ProbeRequest(prompt_token_ids=prompt, max_tokens=10)])
        h = hit_tokens(p, p, bs)
        rep.check(f"repeat after finish P={p}: cached-free blocks after 1st = (P+M-1)//bs", cached_free, (p + 9) // bs)
        rep.check(f"  2nd hit tokens (cap P-1={p - 1})", r2.hit_tokens, h)
        rep.check("  2nd num_cached_tokens", r2.num_cached_tokens or 0, h)
        rep.check("  2nd revived cached-free blocks (taken off free list)", r2.revived_cached_blocks, h // bs)
        rep.check("  2nd new blocks", r2.new_blocks, peak_full(p, 10, bs) - h // bs)
        rep.check("  2nd pool taken (new + revived)", r2.pool_taken, peak_full(p, 10, bs))

    probe.reset_prefix_cache()
    (rec,) = probe.run([ProbeRequest(prompt_token_ids=make_prompt(f.max_model_len - 50, seed()), max_tokens=200)])
    rep.say(f"  P + max_tokens > max_model_len: {rec.brief()}")
    rep.check("  output stops at max_model_len - P", rec.num_output_tokens, 50)
    rep.check("  peak blocks = ceil((max_model_len-1)/bs)", rec.peak_blocks_total, cdiv(f.max_model_len - 1, bs))

    probe.reset_prefix_cache()
    prompt = make_prompt(300, seed())
    c0, c1 = probe.run([ProbeRequest(prompt_token_ids=prompt, max_tokens=30, n=2)])
    rep.say(f"    {c0.brief()}\n    {c1.brief()}")
    h = hit_tokens(300, 300, bs)
    rep.check("n=2: child 0 hit", c0.hit_tokens, 0)
    rep.check("n=2: child 1 hit (shares child 0's prompt blocks)", c1.hit_tokens, h)
    rep.check("n=2: pool peak", probe.last_run.peak_pool_used, 2 * peak_full(300, 30, bs) - h // bs)
    rep.check("n=2: parent RequestOutput.num_cached_tokens (= last child's)", c0.num_cached_tokens or 0, h)


def scenarios_preemption(model: str, rep: Report, **engine_kwargs: Any) -> None:
    """A tiny pool: running requests get preempted when decode blocks run out."""
    # 8 blocks of 2 x 32 KiB (7 usable): startup demands (usable blocks) * 128 >= max_model_len.
    kv = engine_kwargs.pop("pool_bytes", 8 * 65536)
    probe = KVProbe.start(model, max_model_len=896, kv_cache_memory_bytes=kv, **engine_kwargs)
    try:
        f = probe.facts
        bs = f.groups[0].block_size
        rep.say(f"  preemption pool: {f.usable_blocks} usable blocks of {bs}")
        reqs = [ProbeRequest(prompt_token_ids=make_prompt(200, 77 + i), max_tokens=300) for i in range(2)]
        recs = probe.run(reqs)
        need = sum(peak_full(200, 300, bs) for _ in recs)
        rep.say(
            f"    two requests needing {need} blocks at peak in {f.usable_blocks}: "
            + "; ".join(r.brief() for r in recs)
        )
        rep.check("  preemptions happened (hook)", int(probe.last_run.num_preemptions > 0), 1)
        rep.check(
            "  RequestOutput.metrics.num_preemptions == hook",
            sum(r.metrics_num_preemptions or 0 for r in recs),
            sum(r.num_preemptions for r in recs),
        )
        rep.check("  pool peak <= usable", int(probe.last_run.peak_pool_used <= f.usable_blocks), 1)
        # A prompt that does not fit waits (never preempts a running request).
        big = ProbeRequest(prompt_token_ids=make_prompt(600, 99), max_tokens=200)
        small = ProbeRequest(prompt_token_ids=make_prompt(300, 98), max_tokens=5, add_at_step=3)
        rb, rs = probe.run([big, small])
        rep.say(f"    {rb.brief()}\n    {rs.brief()}")
        rep.check(
            "  admitting a new prompt never preempts (small waits for big)", rs.num_preemptions + rb.num_preemptions, 0
        )
    finally:
        probe.shutdown()


def scenarios_sliding(probe: KVProbe, rep: Report) -> None:
    f = probe.facts
    probe.trace = True
    seed = _seed()
    swa = next(g for g in f.groups if g.kind == "sliding_window")
    w, bs = swa.sliding_window or 0, swa.block_size
    rep.say(f"  sliding window {w}, block {bs}: a block is freed (nulled) once all its tokens are < n - w + 1")
    for p, m, chunk in [(100, 400, None), (600, 400, None), (1500, 20, None), (1500, 20, 256)]:
        probe.reset_prefix_cache()
        if chunk is not None:
            probe.scheduler.max_num_scheduled_tokens = chunk
        try:
            (rec,) = probe.run([ProbeRequest(prompt_token_ids=make_prompt(p, seed()), max_tokens=m)])
        finally:
            probe.scheduler.max_num_scheduled_tokens = f.max_num_batched_tokens
        # Prefill: slots for the whole chunk are allocated before anything is freed.
        first = chunk or min(p, f.max_num_batched_tokens)
        decode_peak = cdiv(w - 1, bs) + 1  # blocks spanning [n-w+1, n] when n is the new token position
        pre = max(cdiv(first, bs), 0)
        if chunk:
            pre = max(cdiv(c + chunk, bs) - max(0, c - w + 1) // bs for c in range(0, p, chunk))
        g = swa.index
        rep.say(f"    P={p} M={m} chunk={chunk}: {rec.brief()}")
        rep.check(
            f"    P={p} M={m} swa group peak (max(prefill chunk, window))",
            rec.peak_blocks_per_group[g],
            max(pre, decode_peak) if p + m - 1 > w else cdiv(p + m - 1, bs),
        )
        rep.check(
            f"    P={p} M={m} swa table length (nulls kept) = ceil((P+M-1)/bs)",
            rec.peak_table_len_per_group[g],
            peak_full(p, m, bs),
        )
        for other in f.groups:
            if other.kind == "full_attention":
                rep.check(
                    f"    P={p} M={m} full group peak",
                    rec.peak_blocks_per_group[other.index],
                    peak_full(p, m, other.block_size),
                )
    if f.prefix_caching:
        for p in (1000, 1024):
            probe.reset_prefix_cache()
            prompt = make_prompt(p, seed())
            probe.run([ProbeRequest(prompt_token_ids=prompt, max_tokens=10)])
            cf = probe.cached_free_blocks()
            (r2,) = probe.run([ProbeRequest(prompt_token_ids=prompt, max_tokens=10)])
            rep.say(f"    repeat P={p}: cached-free after 1st={cf}; 2nd: {r2.brief()}")
            rep.check(f"    repeat P={p}: hit = floor((P-1)/bs)*bs", r2.hit_tokens, (p - 1) // bs * bs)
            full_hit_blocks = sum((p - 1) // bs for g in f.groups if g.kind == "full_attention")
            rep.check(
                f"    repeat P={p}: swa blocks revived = ceil((w-1)/bs) (the rest of the hit is null)",
                r2.revived_cached_blocks - full_hit_blocks,
                cdiv(w - 1, bs),
            )
    probe.trace = False


def scenarios_mamba(probe: KVProbe, rep: Report) -> None:
    f = probe.facts
    probe.trace = True
    seed = _seed()
    fa = next(g for g in f.groups if g.kind == "full_attention")
    mb = next(g for g in f.groups if g.kind == "mamba")
    bs = fa.block_size
    rep.say(f"  hybrid: full block {bs}, mamba block {mb.block_size}, mode {mb.mamba_cache_mode}")
    for p, m in [(100, 20), (639, 2), (640, 1), (641, 1), (700, 600), (1300, 30), (2000, 5)]:
        if p + m > f.max_model_len:
            continue
        probe.reset_prefix_cache()
        (rec,) = probe.run([ProbeRequest(prompt_token_ids=make_prompt(p, seed()), max_tokens=m)])
        rep.say(f"    {rec.brief()}")
        rep.say(f"      trace(first/last): {rec.trace[:3]} ... {rec.trace[-2:]}")
        rep.check(f"    P={p} M={m} full group peak", rec.peak_blocks_per_group[fa.index], peak_full(p, m, bs))
        full_peak = peak_full(p, m, bs)
        # The CPU build schedules synchronously (platforms/cpu.py): the rule's sync case.
        mamba_peak = state_group_blocks(mb.mamba_cache_mode, full_peak, async_scheduling=False, chunk_blocks=0)
        rep.check(
            f"    P={p} M={m} mamba group peak (align: 2 once P+M-1 > block, else 1)",
            rec.peak_blocks_per_group[mb.index],
            mamba_peak,
        )
        rep.check(f"    P={p} M={m} pool peak = full + mamba", probe.last_run.peak_pool_used, full_peak + mamba_peak)
    if f.prefix_caching:
        for p in (1300, 1280, 700):
            probe.reset_prefix_cache()
            prompt = make_prompt(p, seed())
            probe.run([ProbeRequest(prompt_token_ids=prompt, max_tokens=10)])
            cf = probe.cached_free_blocks()
            (r2,) = probe.run([ProbeRequest(prompt_token_ids=prompt, max_tokens=10)])
            rep.say(f"    repeat P={p}: cached-free after 1st={cf}; 2nd: {r2.brief()}")
            rep.check(f"    repeat P={p}: hit tokens", r2.hit_tokens, (p - 1) // mb.block_size * mb.block_size)
            rep.check(f"    repeat P={p}: num_cached_tokens", r2.num_cached_tokens or 0, r2.hit_tokens)
            longer = prompt + make_prompt(200, seed())
            (r3,) = probe.run([ProbeRequest(prompt_token_ids=longer, max_tokens=10)])
            rep.say(f"    extension of P={p} by 200: {r3.brief()}")
            rep.check(
                f"    1st extension of P={p}: hit = floor((P-1)/bs)*bs (only the replay state is kept)",
                r3.hit_tokens,
                (p - 1) // bs * bs,
            )
            other = prompt + make_prompt(300, seed())
            (r4,) = probe.run([ProbeRequest(prompt_token_ids=other, max_tokens=10)])
            rep.say(f"    another extension of P={p} by 300: {r4.brief()}")
            rep.check(
                f"    2nd extension of P={p}: hit = floor(P/bs)*bs (junction pinned by the 1st)",
                r4.hit_tokens,
                p // bs * bs,
            )
        probe.reset_prefix_cache()
        prompt = make_prompt(1400, seed())
        ra, rb = probe.run(
            [ProbeRequest(prompt_token_ids=prompt, max_tokens=20), ProbeRequest(prompt_token_ids=prompt, max_tokens=20)]
        )
        rep.say(f"    same prompt added together: {ra.brief()}\n      {rb.brief()}")
        rep.check(
            "    same prompt together: 2nd is admitted steps later (waits for the 1st's state)",
            int((rb.first_scheduled_step or 0) > (ra.first_scheduled_step or 0)),
            1,
        )
        rep.check("    same prompt together: 2nd hit", rb.hit_tokens, (1400 - 1) // bs * bs)
        probe.reset_prefix_cache()
        ra, rb = probe.run(
            [
                ProbeRequest(prompt_token_ids=prompt, max_tokens=60),
                ProbeRequest(prompt_token_ids=prompt, max_tokens=20, add_at_step=8),
            ]
        )
        rep.say(f"    same prompt, 2nd added at step 8: {rb.brief()}")
        probe.reset_prefix_cache()
        c0, c1 = probe.run([ProbeRequest(prompt_token_ids=prompt, max_tokens=20, n=2)])
        rep.say(f"    n=2: {c0.brief()}\n      {c1.brief()}")
        rep.say(f"      pool peak {probe.last_run.peak_pool_used}")
    probe.trace = False


MODEL_SETS: dict[str, list[tuple[str, str, dict[str, Any]]]] = {
    # name -> [(label, model dir, engine kwargs)]
    "dense": [("tiny-qwen3 (dense)", "tiny-qwen3", {})],
    "moe": [("tiny-qwen3-moe (MoE)", "tiny-qwen3-moe", {})],
    "hybrid": [
        ("tiny-qwen3-next, prefix caching (mamba align)", "tiny-qwen3-next", {}),
        ("tiny-qwen3-next, no prefix caching (mamba none)", "tiny-qwen3-next", {"enable_prefix_caching": False}),
    ],
    "swa": [
        ("tiny-qwen3-swa (all layers sliding 256)", "tiny-qwen3-swa", {}),
        ("tiny-gemma3-swa (sliding 256 + full)", "tiny-gemma3-swa", {}),
    ],
    "fp8": [
        ("tiny-qwen3 fp8_e4m3", "tiny-qwen3", {"kv_cache_dtype": "fp8_e4m3"}),
        ("tiny-qwen3 fp8_e5m2", "tiny-qwen3", {"kv_cache_dtype": "fp8_e5m2"}),
    ],
    "preempt": [("tiny-qwen3 tiny pool", "tiny-qwen3", {})],
}


def run_model_set(name: str) -> int:
    rep = Report()
    for label, model_dir, kwargs in MODEL_SETS[name]:
        model = MODELS / model_dir
        rep.say(f"== {label}")
        if name == "preempt":
            scenarios_preemption(str(model), rep, **kwargs)
            continue
        if reason := cpu_lacks_for(kwargs):
            rep.say(f"  skipped: {reason}")
            continue
        t0 = time.monotonic()
        try:
            probe = KVProbe.start(model, **kwargs)
        except Exception as exc:
            rep.say(f"  engine start FAILED: {type(exc).__name__}: {exc}")
            continue
        try:
            rep.say(f"  started in {time.monotonic() - t0:.1f}s")
            rep.say("  " + probe.facts.summary().replace("\n", "\n  "))
            kv = probe.facts.kv_cache_memory_bytes or 0
            rep.check(
                "num_blocks = kv_cache_memory_bytes // bytes_per_block",
                probe.facts.num_blocks,
                kv // probe.facts.bytes_per_block,
            )
            rep.check(
                "free blocks at start = num_blocks - 1 (null block)", probe.free_blocks(), probe.facts.num_blocks - 1
            )
            kinds = {g.kind for g in probe.facts.groups}
            if name == "fp8":
                (rec,) = probe.run([ProbeRequest(prompt_token_ids=make_prompt(200, 5), max_tokens=57)])
                rep.check(
                    "fp8 P=200 M=57 peak blocks",
                    rec.peak_blocks_total,
                    peak_full(200, 57, probe.facts.groups[0].block_size),
                )
            elif "mamba" in kinds:
                scenarios_mamba(probe, rep)
            elif "sliding_window" in kinds:
                scenarios_sliding(probe, rep)
            else:
                scenarios_full_attention(probe, rep)
        except Exception as exc:
            rep.say(f"  scenario FAILED: {type(exc).__name__}: {exc}")
            rep.mismatches += 1
        finally:
            probe.shutdown()
    rep.say(f"== {name}: {rep.mismatches} mismatches")
    return 1 if rep.mismatches else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", choices=[*MODEL_SETS, "all"], default="all")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.child or ns.set != "all":
        configure_env()
        return run_model_set(ns.set)
    # One engine per process, one process at a time.
    rc = 0
    for name in MODEL_SETS:
        proc = subprocess.run([sys.executable, "-m", "benchmarks.kv_probe", "--set", name, "--child"], cwd=ROOT)
        rc |= proc.returncode
    return rc


if __name__ == "__main__":
    sys.exit(main())
