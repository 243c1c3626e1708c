"""An Engine that streams recorded Qwen3 model text (engine_adapter/recordings.py).

A random-weight tiny model cannot decide to think or to call a tool; this engine replays
real Qwen3 output formats through the same `Engine` protocol, so the gateway's reasoning and
tool-call parsing, streaming and accounting can be tested end to end without a GPU.

Which recording: the prompt's token ids are decoded and the last `[[replay:NAME]]` tag in
the text picks (in a chat, the last user message's tag); no tag: `answer`. An unknown name
is an EngineRequestInvalid. `[[replay:crash]]` kills the engine, as if its process died: that
request and every stream in flight fail with EngineUnavailable and the engine stays
unhealthy (for tests of the gateway's engine supervision; a new engine must be started).

Streaming: the recording's token ids (the model's own tokenizer, no special tokens added)
then EOS (`<|im_end|>`), one token per chunk. Each chunk's text is the increment of the
decoded prefix, holding back a trailing U+FFFD (a multi-byte character split across
tokens), so the joined deltas are exactly the recording. The EOS token is not in the text.
finish_reason "stop" at EOS, "length" when max_tokens comes first (no EOS then), "abort"
after `abort()`. `stop` strings and `stop_token_ids` are honoured as vLLM does (the text
is cut before the stop string unless include_stop_str_in_output; stop_reason says which);
`ignore_eos`, `min_tokens` and the sampling knobs are ignored (a recording is fixed).
n > 1 streams the same recording for every choice, in the same chunks. Structured output
is rejected: the replay engine cannot follow a grammar. Logprobs, when asked for, are 0.0
for the emitted token.

The KV spec is a plausible full-attention pool (the tiny Qwen3's 2 layers of 2 KV heads x
32 dims in bfloat16) so that the gateway's admission works; nothing is cached
(num_cached_tokens 0) unless `prefix_cache` is on: then a prompt's whole blocks are
remembered per cache_salt, and a later prompt sharing them reports them as cached (never its
last token, as vLLM). `corrupt_cached` is fault injection for the canary: an answer whose
prompt was served from that cache comes out changed ("Paris" becomes "Rome"), as a hybrid
model's corrupted cache hit would.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
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
    KVGroup,
    KVSpec,
    TokenLogprob,
    check_request,
)
from engine_adapter.hf_tokenizer import load_tokenizer
from engine_adapter.recordings import DEFAULT_RECORDING, RECORDINGS, TAG, select

log = logging.getLogger(__name__)

EOS_TOKEN = "<|im_end|>"
CRASH = "crash"  # the tag name that kills the engine
# The tiny Qwen3's attention (models/tiny-qwen3): 2 layers, 2 KV heads of 32 dims, bfloat16.
_LAYERS, _KV_HEADS, _HEAD_DIM, _DTYPE_BYTES = 2, 2, 32, 2


@dataclass(frozen=True, kw_only=True)
class ReplayEngineConfig:
    name: str
    tokenizer: str  # a local Hugging Face tokenizer directory (a Qwen3 model's)
    max_model_len: int = 4096
    max_num_seqs: int = 8
    kv_blocks: int = 4097  # the pool, including vLLM's null block
    block_size: int = 16
    # Wall seconds between tokens; 0: only yield control to the event loop between them.
    token_delay_s: float = 0.0
    recording: str = DEFAULT_RECORDING  # for a prompt without a tag
    prefix_cache: bool = False
    corrupt_cached: bool = False


def corrupted(text: str) -> str:
    """What `corrupt_cached` answers instead of a recording: another city, or a changed text."""
    return text.replace("Paris", "Rome") if "Paris" in text else text + " (corrupted)"


@dataclass(eq=False)
class _Stream:
    """One request in flight."""

    request: EngineRequest
    emitted: int = 0  # output tokens so far (per choice)
    aborted: asyncio.Event = field(default_factory=asyncio.Event)


class ReplayEngine:
    """The Engine protocol over fixed recordings, tokenized by the model's own tokenizer."""

    def __init__(self, config: ReplayEngineConfig) -> None:
        if config.token_delay_s < 0:
            raise ValueError("token_delay_s must not be negative")
        if config.kv_blocks < 2:
            raise ValueError("kv_blocks must be at least 2 (one is the null block)")
        self.name = config.name
        self.config = config
        self._tokenizer: Any = None
        self._eos = -1
        self._ids: dict[str, tuple[int, ...]] = {}  # recording -> its token ids (no EOS)
        self._corrupted: dict[str, tuple[int, ...]] = {}  # recording -> its corrupted ids
        # The prefix cache: (salt, a prompt's first k whole blocks) for every k it has seen.
        self._cached: set[tuple[str | None, tuple[int, ...]]] = set()
        self._queried_tokens = 0
        self._hit_tokens = 0
        self._streams: dict[str, _Stream] = {}
        self._running = False
        self._generation_tokens = 0
        self._steps = 0

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        tok = await asyncio.to_thread(load_tokenizer, self.config.tokenizer)
        eos = tok.convert_tokens_to_ids(EOS_TOKEN)
        if not isinstance(eos, int) or eos == tok.unk_token_id:
            raise ValueError(f"{self.config.tokenizer}: the tokenizer has no {EOS_TOKEN} token (not a Qwen tokenizer)")
        ids: dict[str, tuple[int, ...]] = {}
        for name, text in RECORDINGS.items():
            ids[name] = tuple(tok.encode(text, add_special_tokens=False))
            back = tok.decode(list(ids[name]), skip_special_tokens=True)
            if back != text:  # a recording this tokenizer cannot reproduce would fail every test oddly
                raise ValueError(f"recording {name!r} does not survive this tokenizer: {back!r}")
        if self.config.recording not in ids:
            raise ValueError(f"replay.recording {self.config.recording!r} is not a recording ({', '.join(ids)})")
        self._corrupted = {n: tuple(tok.encode(corrupted(t), add_special_tokens=False)) for n, t in RECORDINGS.items()}
        self._tokenizer, self._eos, self._ids = tok, eos, ids
        self._running = True
        log.info("replay engine %s: %d recordings", self.name, len(ids))

    async def shutdown(self) -> None:
        self._running = False
        for stream in self._streams.values():
            stream.aborted.set()  # wake a waiting stream: it then finds the engine down
        self._streams.clear()

    def _crash(self) -> None:
        log.error("replay engine %s: crash requested; every stream in flight fails", self.name)
        self._running = False
        for stream in self._streams.values():
            stream.aborted.set()  # wake it: it finds the engine down and raises

    # -- facts ---------------------------------------------------------------------

    def clock(self) -> float:
        return time.monotonic()

    @property
    def kv_spec(self) -> KVSpec:
        c = self.config
        page = 2 * c.block_size * _KV_HEADS * _HEAD_DIM * _DTYPE_BYTES  # K and V, one layer, one block
        return KVSpec(
            block_size=c.block_size,
            num_blocks=c.kv_blocks,
            bytes_per_block=page * _LAYERS,
            kv_cache_bytes=page * _LAYERS * c.kv_blocks,
            cache_dtype="bfloat16",
            groups=(
                KVGroup(kind="full_attention", num_layers=_LAYERS, block_size=c.block_size, page_bytes_per_layer=page),
            ),
            max_model_len=c.max_model_len,
            prefix_caching=c.prefix_cache,
            max_num_seqs=c.max_num_seqs,
            max_num_batched_tokens=c.max_model_len,  # the whole prompt in one step
        )

    @property
    def max_model_len(self) -> int:
        return self.config.max_model_len

    @property
    def is_healthy(self) -> bool:
        return self._running

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            raise EngineUnavailable(f"engine {self.name} is not started")
        return self._tokenizer

    def check(self, request: EngineRequest) -> None:
        """Recorded answers honour no constraint or sampling: nothing to refuse up front."""

    def stats(self) -> EngineStats:
        if not self._running:
            return IDLE_STATS
        bs = self.config.block_size
        blocks = sum(
            -(-(len(s.request.prompt_token_ids) + s.emitted) // bs) * s.request.sampling.n
            for s in self._streams.values()
        )
        return EngineStats(
            running=len(self._streams),
            waiting=0,
            kv_cache_usage=min(1.0, blocks / (self.config.kv_blocks - 1)),
            unfinished=len(self._streams),
            preemptions=0,
            generation_tokens=self._generation_tokens,
            prefix_cache_queries=self._queried_tokens,
            prefix_cache_hits=self._hit_tokens,
            steps=self._steps,
        )

    # -- requests ----------------------------------------------------------------------

    def _recording(self, request: EngineRequest) -> tuple[int, ...]:
        """Validate the request; the token ids of the recording its prompt asks for."""
        if not self._running:
            raise EngineUnavailable(f"engine {self.name} is not started")
        s = request.sampling
        if s.structured is not None:
            raise EngineRequestInvalid("the replay engine cannot follow a grammar")
        if s.n < 1:
            raise EngineRequestInvalid("n must be at least 1")
        check_request(request, max_model_len=self.max_model_len, active=self._streams)
        text = self._tokenizer.decode(list(request.prompt_token_ids), skip_special_tokens=False)
        name = select(text) if TAG.search(text) else self.config.recording
        if name == CRASH:
            self._crash()
            raise EngineUnavailable(f"engine {self.name} died (crash requested)")
        if name not in self._ids:
            raise EngineRequestInvalid(
                f"the replay engine has no recording {name!r} (tag [[replay:NAME]] with NAME one of "
                f"{', '.join(self._ids)})"
            )
        return self._ids[name]

    def _cache_lookup(self, request: EngineRequest) -> int:
        """Prompt tokens found in the prefix cache (whole blocks, never the last token), and
        the prompt's blocks remembered for the requests after it."""
        if not self.config.prefix_cache:
            return 0
        bs, ids, salt = self.config.block_size, request.prompt_token_ids, request.cache_salt
        blocks = (len(ids) - 1) // bs
        hit = 0
        while hit < blocks and (salt, ids[: (hit + 1) * bs]) in self._cached:
            hit += 1
        self._cached.update((salt, ids[: k * bs]) for k in range(1, blocks + 1))
        self._queried_tokens += len(ids)
        self._hit_tokens += hit * bs
        return hit * bs

    def _logprobs(self, request: EngineRequest, token_id: int) -> tuple[TokenLogprob, ...] | None:
        k = request.sampling.logprobs
        if k is None:
            return None
        token = self._tokenizer.decode([token_id])
        top = ((token_id, token, 0.0),) if k > 0 else ()
        return (TokenLogprob(token_id=token_id, token=token, logprob=0.0, top=top),)

    def _prompt_logprobs(self, request: EngineRequest) -> tuple[TokenLogprob | None, ...] | None:
        if request.sampling.prompt_logprobs is None:
            return None
        rest = tuple(
            TokenLogprob(token_id=t, token=self._tokenizer.decode([t]), logprob=0.0)
            for t in request.prompt_token_ids[1:]
        )
        return (None, *rest)

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        recording = self._recording(request)
        cached = self._cache_lookup(request)
        if cached and self.config.corrupt_cached:
            recording = self._corrupted[next(n for n, ids in self._ids.items() if ids == recording)]
        s = request.sampling
        stream = _Stream(request=request)
        self._streams[request.request_id] = stream
        stops = tuple(x for x in s.stop if x)
        hold = max((len(x) for x in stops), default=1) - 1  # chars that may begin a stop string
        tokens = (*recording, self._eos)
        sent = ""  # text delivered so far (per choice; every choice is the same)
        try:
            for i, token_id in enumerate(tokens):
                if stream.aborted.is_set():
                    break
                reason: FinishReason | None = None
                stop_reason: str | int | None = None
                ends_text = token_id == self._eos or token_id in s.stop_token_ids
                full = self._tokenizer.decode(
                    list(recording[: i if ends_text else i + 1]), skip_special_tokens=s.skip_special_tokens
                )
                if ends_text:
                    reason = "stop"
                    stop_reason = token_id if token_id != self._eos else None
                    text = full
                else:
                    hit = min(((full.find(x), x) for x in stops if x in full), default=None)
                    if hit is not None:
                        at, stop = hit
                        reason, stop_reason = "stop", stop
                        text = full[: at + len(stop)] if s.include_stop_str_in_output else full[:at]
                    elif i + 1 >= s.max_tokens:
                        reason, text = "length", full
                    else:
                        stable = full.rstrip("\ufffd")  # the next token may complete the character
                        text = stable[: max(len(sent), len(stable) - hold)]
                delta, sent = text[len(sent) :], max(text, sent, key=len)
                stream.emitted += 1
                self._generation_tokens += s.n
                self._steps += 1
                logprobs = self._logprobs(request, token_id)
                yield EngineChunk(
                    choices=tuple(
                        ChoiceDelta(
                            index=c,
                            text=delta,
                            token_ids=(token_id,),
                            logprobs=logprobs,
                            finish_reason=reason,
                            stop_reason=stop_reason,
                        )
                        for c in range(s.n)
                    ),
                    finished=reason is not None,
                    prompt_tokens=len(request.prompt_token_ids),
                    num_cached_tokens=cached,
                    prompt_logprobs=self._prompt_logprobs(request) if i == 0 else None,
                )
                if reason is not None:
                    return
                await self._pace(stream)
                if not self._running:
                    raise EngineUnavailable(f"engine {self.name} is down (shut down or died)")
            # Aborted (the loop always finishes at EOS otherwise).
            yield EngineChunk(
                choices=tuple(ChoiceDelta(index=c, text="", token_ids=(), finish_reason="abort") for c in range(s.n)),
                finished=True,
                prompt_tokens=len(request.prompt_token_ids),
            )
        finally:
            if self._streams.get(request.request_id) is stream:
                del self._streams[request.request_id]

    async def _pace(self, stream: _Stream) -> None:
        """Wait for the next token: `token_delay_s`, cut short by an abort."""
        delay = self.config.token_delay_s
        if delay <= 0:
            await asyncio.sleep(0)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stream.aborted.wait(), delay)

    async def abort(self, request_id: str) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            stream.aborted.set()
