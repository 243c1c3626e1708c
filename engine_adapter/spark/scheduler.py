"""`BoxSim`: vLLM's scheduler on the box model, in virtual time.

FCFS, chunked prefill with decodes first, max_num_seqs, the block pool (block_pool.py),
no preemption: a request is admitted only when its peak fits; for hybrid models with prefix
caching, vLLM's Mamba "align" mode (prefill chunks end on block boundaries). A model whose
catalogue entry lists its state groups (`ModelSpec.state_groups`, `ring_groups`: Flash-Next)
has its per-request state blocks counted as vLLM 0.32 counts them (`BoxSim.state_blocks`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from engine_adapter.base import KVGroup, KVSpec
from engine_adapter.spark.block_pool import BlockPool, block_hashes, cdiv
from engine_adapter.spark.catalogue import ModelSpec
from engine_adapter.spark.hardware import DGX_SPARK, BoxSpec, GiB, Serving
from engine_adapter.spark.physics import StepCost, step_cost


@dataclass(frozen=True, slots=True)
class RequestEvent:
    """What one request got from one step."""

    request_id: str
    new_tokens: int  # output tokens emitted at the end of this step
    first_token: bool  # this step emitted the request's first token
    finished: bool
    prompt_tokens: int
    num_cached_tokens: int


@dataclass(frozen=True, slots=True)
class StepResult:
    start: float
    end: float
    cost: StepCost
    events: tuple[RequestEvent, ...]
    prefill_tokens: int
    decode_seqs: int
    blocks_in_use: int  # pool blocks held at the step's end, before finished requests let go

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(eq=False)
class _Request:
    request_id: str
    prompt: tuple[int, ...]
    max_tokens: int
    arrival: float
    salt: str | None
    hashes: list[bytes]
    peak_blocks: int  # blocks the sequence holds at its peak: cdiv(P + M - 1, bs), + state blocks
    full_blocks: int  # the attention blocks of that peak: cdiv(P + M - 1, bs)
    blocks: list[int] = field(default_factory=list)  # attention blocks, in prompt order
    state: list[int] = field(default_factory=list)  # state and ring blocks (`BoxSim.state_blocks`)
    computed: int = 0  # prompt tokens whose KV exists (cached or computed)
    cached_tokens: int = 0
    generated: int = 0
    credit: float = 0.0  # fractional accepted tokens carried between steps

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def prefilling(self) -> bool:
        return self.computed < self.prompt_len


# A simulated engine's scheduler budget per step (its prefill chunk) when its config sets none.
STEP_TOKENS = 4096
# The share of a box's memory vLLM takes (--gpu-memory-utilization of the Spark deployment).
GPU_MEMORY_UTILIZATION = 0.8


def kv_budget(model: ModelSpec, box: BoxSpec, serving: Serving) -> int:
    """KV bytes one engine of `model` gets alone on `box`: on the Spark as deployed, the budget
    read off its logs; elsewhere what the utilization leaves after the weights (served dtype)."""
    if box == DGX_SPARK and serving.weight_dtype == "nvfp4":
        return int(model.kv_budget_gib * GiB)
    return int(box.memory_bytes * GPU_MEMORY_UTILIZATION - model.served(serving).weight_bytes)


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    max_num_seqs: int = 4
    max_num_batched_tokens: int = STEP_TOKENS
    max_model_len: int = 262144
    kv_cache_bytes: int | None = None  # default: the model's KV budget (`kv_budget`)
    enable_prefix_caching: bool = True
    # vLLM's --long-prefill-token-threshold: while others run or wait, a prefill takes at
    # most this many tokens a step, so a short prompt need not wait for a long one (0: off).
    long_prefill_token_threshold: int = 0
    # Weight and KV dtypes, speculative decoding, block size (default: the Spark deployment's).
    serving: Serving = field(default_factory=Serving)
    # The model's n-gram table is read from the box's drive each step (vLLM 0.34's
    # --engram-config '{"disk_offload": true}', a fork's VLLM_PLE_TABLE_MEMORY=disk), not kept
    # in memory: each step waits for its rows' pages (`physics.ple_read_seconds`).
    ple_table_on_disk: bool = False


class BoxSim:
    """vLLM's v1 scheduler on the box model, in virtual seconds.

    Each `step()` runs one engine step: running requests first (decodes verify k+1
    positions, unfinished prefills take the next chunk), then waiting requests in FCFS
    order while a sequence slot, token budget and KV blocks remain. Admission reserves a
    request's whole peak, so nothing is ever preempted; a request that does not fit waits.
    The linear-attention state of max_num_seqs sequences is reserved from the KV budget up
    front (as vLLM's Mamba cache is per slot), so the block pool holds attention KV only;
    except for a model whose catalogue entry lists its state groups (Flash-Next): on vLLM's own
    block (`ModelSpec.vllm_block_size` or more) each request holds its state blocks in the pool
    (`state_blocks`), and on a smaller one (the box model's 16 tokens) what those blocks weigh at
    vLLM's block is reserved per slot.

    A model with linear-attention layers and prefix caching on runs as vLLM's mamba_cache_mode
    "align" (`_aligned`): a prefill chunk that does not finish the prompt's full blocks ends on a
    block boundary, so a chunk the step's leftover budget cannot stretch to one waits: a
    running prefill sits the step out, a waiting request stops admission (FCFS).
    """

    def __init__(self, model: ModelSpec, box: BoxSpec = DGX_SPARK, config: SimConfig | None = None) -> None:
        self.config = config or SimConfig()
        self.serving = self.config.serving
        self.model = model.served(self.serving)
        self.box = box
        self.block_size = self.serving.block_size
        self.bytes_per_block = model.kv_bytes_per_token * self.block_size
        budget = self.config.kv_cache_bytes or kv_budget(model, box, self.serving)
        if budget <= 0:
            raise ValueError(f"{model.name}'s weights leave no KV on the {box.name}")
        self.kv_cache_bytes = budget
        if self.config.ple_table_on_disk:
            if model.ple_rows_per_token <= 0:
                raise ValueError(f"{model.name} has no n-gram table to read from disk")
            if box.nvme_read_bandwidth <= 0 or box.nvme_read_iops <= 0:
                raise ValueError(f"{box.name} has no drive spec to read {model.name}'s n-gram table from")
        # vLLM runs hybrid models with prefix caching in mamba_cache_mode "align".
        self.mamba_align = model.linear_state_bytes > 0 and self.config.enable_prefix_caching
        # The state groups draw blocks from the pool, as in vLLM, only where a block page holds a state.
        self.pooled_state = model.state_groups > 0 and self.block_size >= self.model.vllm_block_size
        pool_bytes = budget - self.config.max_num_seqs * self._slot_state_bytes()
        if pool_bytes < 2 * self.bytes_per_block:
            raise ValueError(
                f"KV budget {budget} B cannot hold the linear state of {self.config.max_num_seqs} sequences"
            )
        self.pool = BlockPool(pool_bytes // self.bytes_per_block)
        if self.mamba_align:
            self._check_align()
        self.now = 0.0
        self._future: list[_Request] = []  # arrival > now
        self._waiting: list[_Request] = []
        self._running: list[_Request] = []
        self._ids: set[str] = set()
        self.steps = 0
        self.generation_tokens = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    def _slot_state_bytes(self) -> int:
        """What one sequence slot reserves outside the pool for its state: the catalogue's linear
        state; for a model with listed state groups on a block too small to hold one, its peak
        state blocks at the weight of vLLM's block; nothing when those blocks are in the pool."""
        m = self.model
        if m.state_groups == 0:
            return m.linear_state_bytes
        if self.pooled_state:
            return 0
        return self.state_blocks(2) * m.kv_bytes_per_token * m.vllm_block_size

    def state_blocks(self, full_blocks: int) -> int:
        """Pool blocks a request holds at its peak besides its `full_blocks` attention blocks, in
        vLLM 0.32 and 0.34 (v1/core/single_type_kv_cache_manager.py, measured on their schedulers
        with the Flash-Next shape): each ring group one; each state group one, or in
        mamba_cache_mode "align" two once the request spans more than one block (the previous
        state block stays for the step that crosses into the next), and under asynchronous
        scheduling up to the blocks a prefill chunk spans plus two. Flash-Next: 6 if F = 1, else
        F + 9 (align) or F + 5. policies/kv.py's `request_state_blocks` is the rule; this copy
        (engine_adapter may not import policies) is pinned to it by tests/unit/test_spark.py."""
        m = self.model
        if not self.mamba_align or full_blocks <= 1:
            per_group = 1
        elif not self.serving.async_scheduling:
            per_group = 2
        else:
            per_group = min(full_blocks, 2 + -(-self.config.max_num_batched_tokens // self.block_size))
        return m.state_groups * per_group + m.ring_groups

    def _check_align(self) -> None:
        """Refuse align-mode settings under which a long prompt could never get a chunk."""
        bs, c = self.block_size, self.config
        if bs > c.max_num_batched_tokens:
            # vLLM's own config check: even a lone prompt's chunk would floor to 0 every step.
            raise ValueError(
                f"In Mamba cache align mode, block_size ({bs}) must be <= "
                f"max_num_batched_tokens ({c.max_num_batched_tokens})"
            )
        if 0 < c.long_prefill_token_threshold < bs:
            # vLLM does not check this, and hangs: with two long prompts in, both are capped below
            # a block, floored to 0, and neither ever prefills again.
            raise ValueError(
                f"In Mamba cache align mode, long_prefill_token_threshold ({c.long_prefill_token_threshold}) "
                f"must be 0 or >= block_size ({bs}): two long prompts would never prefill"
            )

    # -- facts ------------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting) + len(self._future)

    @property
    def kv_usage(self) -> float:
        return self.pool.in_use / self.pool.usable

    @property
    def has_work(self) -> bool:
        return bool(self._running or self._waiting or self._future)

    def kv_spec(self) -> KVSpec:
        """The pool as `policies.kv` reads it: one full-attention group over the full-attention
        layers (the linear state is reserved outside the pool, so it costs no blocks); with the
        state in the pool (`pooled_state`), also its state groups and its rings (one block for
        the request's life, as `state_blocks` counts it)."""
        m = self.model
        page = self.block_size * (2 * m.kv_heads * m.head_dim * m.kv_dtype_bytes + m.indexer_bytes_per_token)
        groups = [
            KVGroup(
                kind="full_attention",
                num_layers=m.full_attention_layers,
                block_size=self.block_size,
                page_bytes_per_layer=page,
            )
        ]
        if self.pooled_state:
            linear = m.layers - m.full_attention_layers
            state_page = linear and m.linear_state_bytes // linear
            mode: Literal["none", "align"] = "align" if self.mamba_align else "none"
            groups += [
                KVGroup(
                    kind="linear_attention",
                    num_layers=m.full_attention_layers,
                    block_size=self.block_size,
                    page_bytes_per_layer=state_page,
                    mamba_mode=mode,
                )
                for _ in range(m.state_groups)
            ]
            groups += [
                KVGroup(
                    kind="ring",
                    num_layers=m.full_attention_layers,
                    block_size=self.block_size,
                    page_bytes_per_layer=page,
                )
                for _ in range(m.ring_groups)
            ]
        return KVSpec(
            block_size=self.block_size,
            num_blocks=self.pool.num_blocks,
            bytes_per_block=self.bytes_per_block,
            kv_cache_bytes=self.pool.num_blocks * self.bytes_per_block,
            cache_dtype="fp8" if m.kv_dtype_bytes == 1 else "bfloat16",
            groups=tuple(groups),
            max_model_len=self.config.max_model_len,
            prefix_caching=self.config.enable_prefix_caching,
            max_num_seqs=self.config.max_num_seqs,
            max_num_batched_tokens=self.config.max_num_batched_tokens,
            long_prefill_token_threshold=self.config.long_prefill_token_threshold,
        )

    def blocks_held(self, request_id: str) -> int:
        for r in self._running:
            if r.request_id == request_id:
                return len(r.blocks) + len(r.state)
        return 0

    # -- requests -----------------------------------------------------------------------

    def submit(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        arrival_time: float | None = None,
        cache_salt: str | None = None,
    ) -> None:
        if request_id in self._ids:
            raise ValueError(f"duplicate request id {request_id!r}")
        if not prompt_token_ids or max_tokens < 1:
            raise ValueError("a request needs at least one prompt token and max_tokens >= 1")
        if len(prompt_token_ids) + max_tokens > self.config.max_model_len:
            raise ValueError(f"prompt + max_tokens exceed max_model_len {self.config.max_model_len}")
        full = cdiv(len(prompt_token_ids) + max_tokens - 1, self.block_size)
        peak = full + (self.state_blocks(full) if self.pooled_state else 0)
        if peak > self.pool.usable:
            raise ValueError(f"request needs {peak} KV blocks, the pool has {self.pool.usable}")
        arrival = self.now if arrival_time is None else arrival_time
        caching = self.config.enable_prefix_caching
        req = _Request(
            request_id=request_id,
            prompt=tuple(prompt_token_ids),
            max_tokens=max_tokens,
            arrival=arrival,
            salt=cache_salt,
            hashes=block_hashes(prompt_token_ids, self.block_size, cache_salt) if caching else [],
            peak_blocks=peak,
            full_blocks=full,
        )
        self._ids.add(request_id)
        if arrival > self.now:
            self._future.append(req)
            self._future.sort(key=lambda r: r.arrival)
        else:
            self._waiting.append(req)

    def abort(self, request_id: str) -> bool:
        """Drop a request wherever it is; its blocks go back (cached ones stay cached)."""
        for queue in (self._running, self._waiting, self._future):
            for r in queue:
                if r.request_id == request_id:
                    queue.remove(r)
                    self._finish(r)
                    return True
        return False

    def advance_to(self, t: float) -> None:
        """Let virtual time pass while the engine is idle (or catch up to a clock)."""
        if not self._running and not self._waiting:
            self.now = max(self.now, t)

    # -- the step -------------------------------------------------------------------------

    def _outstanding(self) -> int:
        return sum(r.peak_blocks - len(r.blocks) - len(r.state) for r in self._running)

    def _cache_hits(self, req: _Request) -> list[int]:
        """The cached blocks of the request's prompt prefix that admission would take."""
        if not self.config.enable_prefix_caching:
            return []
        max_hit = (req.prompt_len - 1) // self.block_size  # vLLM computes at least one token
        return self.pool.lookup(req.hashes[:max_hit])

    def _try_admit(self, req: _Request, hits: list[int]) -> bool:
        """Admit with these prefix hits if the request's peak fits beside every running
        request's remaining peak."""
        revived = sum(1 for b in hits if self.pool.is_evictable(b))
        need = req.peak_blocks - len(hits) + revived
        if need > self.pool.available - self._outstanding():
            return False
        for b in hits:
            self.pool.touch(b)
        req.blocks = list(hits)
        req.computed = req.cached_tokens = len(hits) * self.block_size
        if self.config.enable_prefix_caching:
            self.prefix_cache_queries += req.prompt_len
            self.prefix_cache_hits += req.cached_tokens
        return True

    def _grow(self, req: _Request, kv_tokens: int) -> None:
        """Hold blocks for `kv_tokens` tokens of KV (never past the reserved peak), and the state
        blocks for that many attention blocks."""
        want = min(cdiv(kv_tokens, self.block_size), req.full_blocks)
        while len(req.blocks) < want:
            req.blocks.append(self.pool.allocate())
        if self.pooled_state:
            while len(req.state) < self.state_blocks(len(req.blocks)):
                req.state.append(self.pool.allocate())
        full = min(req.computed, req.prompt_len) // self.block_size
        for i in range(min(full, len(req.hashes))):
            self.pool.register(req.blocks[i], req.hashes[i])

    def _finish(self, req: _Request) -> None:
        self.pool.release(req.blocks)
        self.pool.release(req.state)
        req.blocks = []
        req.state = []
        self._ids.discard(req.request_id)

    def _release_arrivals(self) -> None:
        while self._future and self._future[0].arrival <= self.now:
            self._waiting.append(self._future.pop(0))

    def _aligned(self, req: _Request, start: int, n: int) -> int:
        """vLLM's `_mamba_block_aligned_split`: the Mamba state is cached only at chunk ends, so a
        chunk from `start` ends on a block boundary (0 when `n` cannot reach the next one),
        stopping at the prompt's last one if it would cross it; only the chunk after that, the
        prompt's last, ends anywhere."""
        bs = self.block_size
        last_cache_position = req.prompt_len - req.prompt_len % bs
        end = start + n
        if end < last_cache_position:
            end = end // bs * bs
        elif start < last_cache_position < end:
            end = last_cache_position  # vLLM: "force to cache the last chunk"
        return max(0, end - start)

    def _schedule(self) -> tuple[list[_Request], list[tuple[_Request, int]]]:
        """(decoding requests, (prefilling request, chunk)) for this step. In align mode a
        running prefill whose aligned chunk is empty sits this step out; a waiting one stops
        admission for the step (vLLM `break`s: nobody overtakes it)."""
        budget = self.config.max_num_batched_tokens
        k1 = self.model.spec.draft_tokens + 1
        # As vLLM: the cap applies only when another request runs or waits (nobody to starve otherwise).
        cap = self.config.long_prefill_token_threshold if len(self._running) + len(self._waiting) > 1 else 0
        decodes: list[_Request] = []
        chunks: list[tuple[_Request, int]] = []

        def chunk(r: _Request, budget: int, start: int) -> int:
            n = r.prompt_len - start
            n = min(n, cap, budget) if cap else min(n, budget)
            return self._aligned(r, start, n) if self.mamba_align else n

        for r in self._running:
            if budget <= 0:
                break
            if r.prefilling:
                n = chunk(r, budget, r.computed)
                if n == 0:
                    continue  # align mode: no block-aligned chunk fits what is left of the step
                chunks.append((r, n))
                budget -= n
            else:
                decodes.append(r)
                budget -= k1
        while self._waiting and budget > 0 and len(self._running) < self.config.max_num_seqs:
            req = self._waiting[0]
            hits = self._cache_hits(req)
            n = chunk(req, budget, len(hits) * self.block_size)  # its chunk starts past the cached prefix
            if n == 0:
                break  # align mode: no aligned chunk fits; it stays waiting and nobody overtakes it
            if not self._try_admit(req, hits):
                break  # FCFS: nobody overtakes a request that is waiting for blocks
            self._waiting.pop(0)
            self._running.append(req)
            chunks.append((req, n))
            budget -= n
        return decodes, chunks

    def step(self) -> StepResult:
        """Run one engine step (jumping over idle time to the next arrival, if any)."""
        self._release_arrivals()
        if not self._running and not self._waiting and self._future:
            self.now = self._future[0].arrival
            self._release_arrivals()
        decodes, chunks = self._schedule()
        start = self.now
        cost = step_cost(
            self.box,
            self.model,
            [r.prompt_len + r.generated - 1 for r in decodes],
            [(r.computed, n, r.computed + n == r.prompt_len) for r, n in chunks],
            self.serving.routing_locality,
            self.serving.async_scheduling,
            self.config.ple_table_on_disk,
        )
        self.now = start + cost.seconds
        if cost.tokens:
            self.steps += 1
        events = [self._after_prefill(r, n) for r, n in chunks]
        events += [self._after_decode(r) for r in decodes]
        in_use = self.pool.in_use
        done = {e.request_id for e in events if e.finished}
        for r in [r for r in self._running if r.request_id in done]:
            self._running.remove(r)
            self._finish(r)
        return StepResult(
            start=start,
            end=self.now,
            cost=cost,
            events=tuple(e for e in events if e.new_tokens or e.finished),
            prefill_tokens=sum(n for _, n in chunks),
            decode_seqs=len(decodes),
            blocks_in_use=in_use,
        )

    def _event(self, r: _Request, new: int, first: bool) -> RequestEvent:
        self.generation_tokens += new
        return RequestEvent(
            request_id=r.request_id,
            new_tokens=new,
            first_token=first,
            finished=r.generated >= r.max_tokens,
            prompt_tokens=r.prompt_len,
            num_cached_tokens=r.cached_tokens,
        )

    def _after_prefill(self, r: _Request, n: int) -> RequestEvent:
        r.computed += n
        self._grow(r, r.computed)
        if r.prefilling:
            return self._event(r, 0, False)
        r.generated = 1  # the step that completes the prompt samples the first token
        return self._event(r, 1, True)

    def _after_decode(self, r: _Request) -> RequestEvent:
        sd = self.model.spec
        r.credit += sd.expected_tokens
        accepted = max(1, min(sd.draft_tokens + 1, math.floor(r.credit)))
        r.credit -= accepted
        new = min(accepted, r.max_tokens - r.generated)
        r.generated += new
        self._grow(r, r.prompt_len + r.generated - 1)
        return self._event(r, new, False)

    def run_until_idle(self, max_steps: int = 10_000_000) -> list[StepResult]:
        """Step until every submitted request has finished (for benchmarks and tests)."""
        results: list[StepResult] = []
        while self.has_work and len(results) < max_steps:
            results.append(self.step())
        return results
