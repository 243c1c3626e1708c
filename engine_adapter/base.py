"""What every engine speaks: requests in, chunks out, live stats and the KV spec.

Engine-neutral values only: the gateway never sees a vLLM type. Version and
build differences (CPU 0.32, CUDA 0.26) stay inside the module that imports
vLLM.

Errors an engine raises, all subclasses of `EngineError`:

    EngineError
     +-- EngineRequestInvalid   the engine refused this request's parameters
     +-- EngineUnavailable      the engine is dead or not started
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Container
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length", "abort"]


class EngineError(Exception):
    """Base of the errors engines raise."""


class EngineRequestInvalid(EngineError):
    """The engine rejected the request's parameters (a client error)."""


class EngineUnavailable(EngineError):
    """The engine cannot serve: dead, shut down or never started."""


class EngineOverloaded(EngineUnavailable):
    """The engine's box takes no new work for now (an engine host's memory guard): retry in
    `retry_after_s`. Still unavailable to code that knows no better."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, kw_only=True)
class StructuredOutput:
    """A constraint on the output: exactly one of the fields is set."""

    json_object: bool = False
    json_schema: dict[str, Any] | None = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    # A Lark or EBNF grammar (vLLM tells them apart; xgrammar reads both).
    grammar: str | None = None
    structural_tag: str | None = None  # vLLM's structural tag, as JSON text
    # Options of the constraint (vLLM's names).
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None


@dataclass(frozen=True, kw_only=True)
class SamplingOptions:
    """Engine-neutral sampling parameters, already validated by the gateway."""

    max_tokens: int
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None  # top-k per output token; 0 = only the sampled token
    prompt_logprobs: int | None = None
    logit_bias: dict[int, float] | None = None
    structured: StructuredOutput | None = None
    skip_special_tokens: bool = True


def greedy(s: SamplingOptions) -> bool:
    """Whether every choice is the likeliest tokens (vLLM's threshold): n such choices are one,
    copied, as vLLM refuses n > 1 at temperature 0."""
    return s.temperature < 1e-5


@dataclass(frozen=True, slots=True)
class ImageInput:
    """An image of a request: its encoded bytes (PNG, JPEG...) and its pads in the prompt."""

    data: bytes
    sha256: str  # of `data`: the engine's cache key for it
    offset: int  # the first of its pad tokens in `prompt_token_ids`
    tokens: int  # how many pads it becomes (the gateway counted them as the engine will)


@dataclass(frozen=True, kw_only=True)
class EngineRequest:
    """`prompt_token_ids` is the prompt as the engine holds it: an image's pad token repeated
    once per token the image becomes (`images` says where), so every engine counts it alike."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingOptions
    priority: int = 0
    cache_salt: str | None = None
    images: tuple[ImageInput, ...] = ()

    def compact_ids(self) -> list[int]:
        """The ids with each image's pads back to one: what a chat template writes, and what
        vLLM takes with the image (it expands the pad itself; expanded ids it would misread)."""
        ids = self.prompt_token_ids
        out: list[int] = []
        start = 0
        for image in self.images:
            out += ids[start : image.offset + 1]
            start = image.offset + image.tokens
        out += ids[start:]
        return out


def check_request(request: EngineRequest, *, max_model_len: int, active: Container[str]) -> None:
    """What an engine without vLLM's own checks (simulated, replay) refuses in any request."""
    s = request.sampling
    if s.max_tokens < 1:
        raise EngineRequestInvalid("max_tokens must be at least 1")
    if not request.prompt_token_ids:
        raise EngineRequestInvalid("the prompt is empty")
    if len(request.prompt_token_ids) + s.max_tokens > max_model_len:
        raise EngineRequestInvalid(
            f"prompt ({len(request.prompt_token_ids)} tokens) + max_tokens ({s.max_tokens}) "
            f"exceed max_model_len {max_model_len}"
        )
    if request.request_id in active:
        raise EngineRequestInvalid(f"duplicate request id {request.request_id!r}")


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token_id: int
    token: str
    logprob: float
    top: tuple[tuple[int, str, float], ...] = ()  # (token_id, token, logprob), best first
    rank: int | None = None  # the token's rank in the vocabulary (1 = the likeliest)


@dataclass(frozen=True, kw_only=True)
class ChoiceDelta:
    """New output of one choice (`index` < n) since the previous chunk."""

    index: int
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] | None = None
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None


@dataclass(frozen=True, kw_only=True)
class EngineChunk:
    """One step of a request's output; the last one has `finished=True`."""

    choices: tuple[ChoiceDelta, ...]
    finished: bool
    prompt_tokens: int
    num_cached_tokens: int = 0
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None
    num_preemptions: int = 0


@dataclass(frozen=True, kw_only=True)
class KVGroup:
    """Layers that share one block table (vLLM's KV cache group). Every group draws
    its blocks from the one pool: a request holds blocks in each group.

    Kinds: attention pages that grow with the sequence ("full_attention", also MLA-style
    pages holding one state per few tokens), a window of them ("sliding_window"), a
    recurrent state that does not grow ("linear_attention": Mamba, GDN, short convs), and
    a per-request ring ("ring": one block for the request's life, never prefix-cached,
    e.g. Qwen4Exp's QSA raw-key buffer)."""

    kind: Literal["full_attention", "sliding_window", "linear_attention", "ring"]
    num_layers: int  # layers in this group (padded groups count their slots)
    block_size: int  # tokens per block for this group
    page_bytes_per_layer: int  # bytes one layer of this group holds per block
    sliding_window: int | None = None
    # Linear attention (Mamba/GDN) state under prefix caching: "align" keeps a
    # state block per block boundary while it moves on; "none" keeps one.
    mamba_mode: Literal["none", "align"] | None = None


@dataclass(frozen=True, kw_only=True)
class KVSpec:
    """The running engine's KV cache, as the engine reports it."""

    block_size: int  # tokens per block of the scheduler (what prefix caching reuses)
    num_blocks: int  # the pool, including vLLM's null block
    bytes_per_block: int  # what one block id costs the pool (groups alias one buffer)
    kv_cache_bytes: int
    cache_dtype: str
    groups: tuple[KVGroup, ...]
    max_model_len: int
    prefix_caching: bool
    max_num_seqs: int  # sequences the scheduler runs at once
    max_num_batched_tokens: int = 0  # the scheduler's token budget per step (prefill chunk size)
    long_prefill_token_threshold: int = 0  # a prefill's chunk while others run or wait (0: no cap)
    async_scheduling: bool = False  # the scheduler plans step k+1 while step k runs (CUDA builds)

    @property
    def usable_blocks(self) -> int:
        """Blocks requests can hold: vLLM keeps block 0 as its null block."""
        return self.num_blocks - 1

    @property
    def capacity_tokens(self) -> int:
        return self.block_size * self.usable_blocks

    @property
    def aligned_chunks(self) -> bool:
        """Whether the scheduler ends every prefill chunk but a prompt's last on a block
        boundary: vLLM does for linear-attention state in "align" mode (prefix caching)."""
        return self.prefix_caching and any(g.mamba_mode == "align" for g in self.groups)


@dataclass(frozen=True, kw_only=True)
class EngineStats:
    """Live numbers: the scheduler's view (last step) and the frontend's."""

    running: int  # scheduler: requests in the running batch
    waiting: int  # scheduler: requests queued inside the engine
    kv_cache_usage: float  # scheduler: share of KV blocks in use, 0..1
    unfinished: int  # frontend: requests submitted and not yet finished
    preemptions: int  # total preemptions seen since start
    generation_tokens: int  # output tokens generated since start
    prefix_cache_queries: int  # tokens looked up in the prefix cache
    prefix_cache_hits: int  # tokens found there
    steps: int  # scheduler stat updates received


IDLE_STATS = EngineStats(
    running=0,
    waiting=0,
    kv_cache_usage=0.0,
    unfinished=0,
    preemptions=0,
    generation_tokens=0,
    prefix_cache_queries=0,
    prefix_cache_hits=0,
    steps=0,
)


@runtime_checkable
class Engine(Protocol):
    """A model served in this process (or reached through it)."""

    name: str

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...

    def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        """Stream the request's output; closing the iterator aborts the request."""
        ...

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats: ...

    @property
    def kv_spec(self) -> KVSpec: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def is_healthy(self) -> bool: ...

    def clock(self) -> float:
        """The engine's time in seconds (monotonic): latency is measured with it. A
        simulated engine's clock runs at its speed-up."""
        ...

    @property
    def tokenizer(self) -> Any:
        """The model's own tokenizer (Hugging Face interface), for the gateway."""
        ...

    def check(self, request: EngineRequest) -> None:
        """Raise `EngineRequestInvalid` for parameters the engine would refuse (a grammar
        that does not compile, sampling it cannot do), before the request is admitted and
        its answer starts. Slow for a grammar (milliseconds): call it off the event loop."""
        ...


class DelegatingEngine:
    """An engine that hands every member to `inner`: a wrapper overrides only what it changes
    (engine_adapter/paced.py, gateway/supervisor.py)."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self.name = inner.name

    async def start(self) -> None:
        await self.inner.start()

    async def shutdown(self) -> None:
        await self.inner.shutdown()

    def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        return self.inner.generate(request)

    async def abort(self, request_id: str) -> None:
        await self.inner.abort(request_id)

    def stats(self) -> EngineStats:
        return self.inner.stats()

    @property
    def kv_spec(self) -> KVSpec:
        return self.inner.kv_spec

    @property
    def max_model_len(self) -> int:
        return self.inner.max_model_len

    @property
    def is_healthy(self) -> bool:
        return self.inner.is_healthy

    def clock(self) -> float:
        return self.inner.clock()

    @property
    def tokenizer(self) -> Any:
        return self.inner.tokenizer

    def check(self, request: EngineRequest) -> None:
        self.inner.check(request)


@dataclass
class StatsCounter:
    """Mutable accumulator an engine updates from its scheduler callbacks."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    preemptions: int = 0
    generation_tokens: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    steps: int = 0
