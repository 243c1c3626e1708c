"""An Engine that streams from the DGX Spark box model instead of a GPU.

`BoxSim` (engine_adapter/spark/scheduler.py) runs in a background task in virtual time;
the task sleeps step_time / speedup per step, so tokens arrive at the box's pace
scaled by `speedup`. `clock()` is the engine's time in simulated seconds, for
measuring latency in the box's seconds.

Outputs are deterministic pseudo-random ids from the tokenizer's ordinary vocabulary
(never special tokens), a function of the seed, the prompt and the choice, so
identical prompts get identical outputs as at temperature 0. Every request runs to
max_tokens (finish_reason "length"): there is no model to emit EOS or stop strings.
n > 1 is rejected with EngineRequestInvalid (one sequence per request keeps the
pool's accounting identical to `policies.kv.footprint` for n=1). Logprobs, when
asked for, are 0.0 for the emitted token (a deterministic choice).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from engine_adapter.base import (
    IDLE_STATS,
    ChoiceDelta,
    EngineChunk,
    EngineRequest,
    EngineRequestInvalid,
    EngineStats,
    EngineUnavailable,
    FinishReason,
    KVSpec,
    TokenLogprob,
    check_request,
)
from engine_adapter.hf_tokenizer import load_tokenizer
from engine_adapter.spark import DGX_SPARK, MODELS, STEP_TOKENS, BoxSim, BoxSpec, RequestEvent, SimConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class SimEngineConfig:
    name: str
    model: str  # key into engine_adapter.spark.MODELS
    tokenizer: str  # a local Hugging Face tokenizer directory
    speedup: float = 1.0  # simulated seconds per wall second
    # Steps take no wall time: the clock is the simulator's own, and each step's tokens are out
    # as soon as it is computed (the gateway's fixed cost alone, benchmarks/overhead.py).
    instant: bool = False
    max_model_len: int = 262144
    max_num_seqs: int = 4
    max_num_batched_tokens: int = STEP_TOKENS
    long_prefill_token_threshold: int = 0
    kv_cache_bytes: int | None = None  # default: the model's KV budget on the box
    enable_prefix_caching: bool = True
    seed: int = 0
    box: BoxSpec = field(default=DGX_SPARK)
    # The model's n-gram table is read from the box's drive each step (a model's
    # `ple_table.placement` disk): each step waits for its rows' pages (`SimConfig`).
    ple_table_on_disk: bool = False


@dataclass(frozen=True)
class _Aborted:
    """Put on a stream's queue by `abort()`: the stream ends with finish_reason "abort"."""


@dataclass(eq=False)
class _Stream:
    """One request's output as the engine task produces it."""

    request: EngineRequest
    queue: asyncio.Queue[RequestEvent | _Aborted | BaseException] = field(default_factory=asyncio.Queue)
    cached_tokens: int = 0
    rng: random.Random = field(default_factory=random.Random)
    token_ids: list[int] = field(default_factory=list)
    text: str = ""


class SimulatedEngine:
    """The Engine protocol over `BoxSim`, streaming in (scaled) real time."""

    def __init__(self, config: SimEngineConfig) -> None:
        if config.model not in MODELS:
            raise ValueError(f"unknown model {config.model!r}; known: {', '.join(MODELS)}")
        if config.speedup <= 0:
            raise ValueError("speedup must be positive")
        self.name = config.name
        self.config = config
        self._sim: BoxSim | None = None
        self._tokenizer: Any = None
        self._vocab: list[int] = []
        self._streams: dict[str, _Stream] = {}
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._t0 = time.monotonic()
        self._dead: BaseException | None = None

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        c = self.config
        self._tokenizer = await asyncio.to_thread(load_tokenizer, c.tokenizer)
        self._vocab = self._ordinary_ids(self._tokenizer)
        sim_config = SimConfig(
            max_num_seqs=c.max_num_seqs,
            max_num_batched_tokens=c.max_num_batched_tokens,
            long_prefill_token_threshold=c.long_prefill_token_threshold,
            max_model_len=c.max_model_len,
            kv_cache_bytes=c.kv_cache_bytes,
            enable_prefix_caching=c.enable_prefix_caching,
            ple_table_on_disk=c.ple_table_on_disk,
        )
        self._sim = BoxSim(MODELS[c.model], c.box, sim_config)
        self._t0 = time.monotonic()
        self._dead = None
        self._task = asyncio.create_task(self._run(), name=f"sim-engine-{self.name}")
        spec = self._sim.kv_spec()
        log.info(
            "simulated engine %s (%s): %d blocks x %d tokens", self.name, c.model, spec.num_blocks, spec.block_size
        )

    async def shutdown(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for stream in self._streams.values():
            stream.queue.put_nowait(EngineUnavailable(f"engine {self.name} shut down"))
        self._streams.clear()
        self._sim = None

    @staticmethod
    def _ordinary_ids(tokenizer: Any) -> list[int]:
        """Ids of the base vocabulary that are not special and decode to visible text."""
        special = set(tokenizer.all_special_ids)
        ids = [i for i in range(int(tokenizer.vocab_size)) if i not in special]
        rng = random.Random(0)
        sample = rng.sample(ids, min(len(ids), 4096))
        return sorted(i for i in sample if tokenizer.decode([i]).strip())

    # -- facts ---------------------------------------------------------------------

    def clock(self) -> float:
        """Simulated seconds since start: wall time scaled by the speedup (instant: the
        simulator's own time, which waits for nothing)."""
        if self.config.instant:
            return 0.0 if self._sim is None else self._sim.now
        return (time.monotonic() - self._t0) * self.config.speedup

    def _require(self) -> BoxSim:
        if self._sim is None:
            raise EngineUnavailable(f"engine {self.name} is not started")
        if self._dead is not None:
            raise EngineUnavailable(f"engine {self.name} died: {self._dead}")
        return self._sim

    @property
    def sim(self) -> BoxSim:
        return self._require()

    @property
    def kv_spec(self) -> KVSpec:
        return self._require().kv_spec()

    @property
    def max_model_len(self) -> int:
        return self.config.max_model_len

    @property
    def is_healthy(self) -> bool:
        return self._sim is not None and self._dead is None and self._task is not None and not self._task.done()

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            raise EngineUnavailable(f"engine {self.name} is not started")
        return self._tokenizer

    def check(self, request: EngineRequest) -> None:
        """Simulated output honours no constraint or sampling: nothing to refuse up front."""

    def stats(self) -> EngineStats:
        sim = self._sim
        if sim is None:
            return IDLE_STATS
        return EngineStats(
            running=sim.num_running,
            waiting=sim.num_waiting,
            kv_cache_usage=sim.kv_usage,
            unfinished=len(self._streams),
            preemptions=0,  # admission reserves each request's peak: never preempts
            generation_tokens=sim.generation_tokens,
            prefix_cache_queries=sim.prefix_cache_queries,
            prefix_cache_hits=sim.prefix_cache_hits,
            steps=sim.steps,
        )

    # -- the engine task -------------------------------------------------------------

    async def _run(self) -> None:
        try:
            while True:
                sim = self._sim
                assert sim is not None
                if not sim.has_work:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                sim.advance_to(self.clock())
                result = sim.step()
                # Sleep until the engine clock reaches the step's end: tokens stream at the box's pace.
                delay = 0.0 if self.config.instant else (result.end - self.clock()) / self.config.speedup
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    await asyncio.sleep(0)  # behind the clock: catch up, but let consumers run
                for event in result.events:
                    stream = self._streams.get(event.request_id)
                    if stream is not None:
                        stream.queue.put_nowait(event)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug in the simulator: fail every stream, as a dead engine would
            log.exception("simulated engine %s died", self.name)
            self._dead = e
            for stream in self._streams.values():
                stream.queue.put_nowait(EngineUnavailable(f"engine {self.name} died: {e}"))

    # -- requests ----------------------------------------------------------------------

    def _validate(self, request: EngineRequest) -> None:
        s = request.sampling
        if s.n != 1:
            raise EngineRequestInvalid("the simulated engine serves n=1 only")
        check_request(request, max_model_len=self.max_model_len, active=self._streams)

    def _rng_for(self, request: EngineRequest) -> random.Random:
        h = hashlib.sha256(f"{self.config.seed}:{request.sampling.seed}:".encode())
        h.update(",".join(map(str, request.prompt_token_ids)).encode())
        return random.Random(h.digest())

    def _delta(self, stream: _Stream, n: int, finished: bool, reason: FinishReason = "length") -> ChoiceDelta:
        new = [stream.rng.choice(self._vocab) for _ in range(n)]
        stream.token_ids.extend(new)
        text = self._tokenizer.decode(stream.token_ids, skip_special_tokens=True)
        # Hold back a trailing replacement char: the next token may complete a multi-byte character.
        stable = text if finished else text.rstrip("\ufffd")
        delta, stream.text = stable[len(stream.text) :], stable
        lps = None
        if stream.request.sampling.logprobs is not None:
            lps = tuple(TokenLogprob(token_id=t, token=self._tokenizer.decode([t]), logprob=0.0, top=()) for t in new)
        return ChoiceDelta(
            index=0,
            text=delta,
            token_ids=tuple(new),
            logprobs=lps,
            finish_reason=reason if finished else None,
        )

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        sim = self._require()
        self._validate(request)
        stream = _Stream(request=request, rng=self._rng_for(request))
        try:
            sim.advance_to(self.clock())
            sim.submit(
                request.request_id,
                request.prompt_token_ids,
                request.sampling.max_tokens,
                arrival_time=max(sim.now, self.clock()),
                cache_salt=request.cache_salt,
            )
        except ValueError as e:
            raise EngineRequestInvalid(str(e)) from e
        self._streams[request.request_id] = stream
        self._wake.set()
        finished = False
        try:
            while not finished:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = True if isinstance(item, _Aborted) else item.finished
                if isinstance(item, _Aborted):
                    delta = self._delta(stream, 0, True, "abort")
                else:
                    stream.cached_tokens = item.num_cached_tokens
                    delta = self._delta(stream, item.new_tokens, finished)
                yield EngineChunk(
                    choices=(delta,),
                    finished=finished,
                    prompt_tokens=len(request.prompt_token_ids),
                    num_cached_tokens=stream.cached_tokens,
                )
        finally:
            self._streams.pop(request.request_id, None)
            if not finished and self._sim is not None:
                # The consumer went away (disconnect, error, cancel): free the slot now.
                self._sim.abort(request.request_id)

    async def abort(self, request_id: str) -> None:
        if self._sim is not None and self._sim.abort(request_id):
            stream = self._streams.get(request_id)
            if stream is not None:
                stream.queue.put_nowait(_Aborted())
