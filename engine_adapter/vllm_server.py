"""A stock vLLM OpenAI server as an engine, reached over HTTP (`engine: vllm-server`).

For the team that already runs vLLM: NVIDIA's container on another box, or one vLLM spanning
two DGX Sparks with Ray. The gateway still counts tokens once, with the model's tokenizer
loaded here: it sends token ids (`/v1/completions` with an id prompt, `return_token_ids`) and
streams the answer back, token ids and all. Closing the stream aborts the request (vLLM
aborts a request whose client went away).

What admission needs comes from the server itself:
- the KV pool: block size and block count from `/metrics`' `vllm:cache_config_info`; this
  gateway counts against `share` of it;
- running and waiting requests, KV use, preemptions: `/metrics`, polled;
- the context length: `/v1/models`;
- cached tokens per request: the usage's `prompt_tokens_details` (the server needs
  `--enable-prompt-tokens-details`).
Before serving, the server's tokenizer is checked against the local one on a probe text
(`/tokenize`), because token ids cross the wire.

The pool's blocks are counted as one full-attention group: exact for a dense model. The
server does not publish its layer groups, so a hybrid model's footprint (its linear-attention
state blocks) is not seen here. For exact claims between several gateways, or hybrid models,
`sparkgate engine-host` is the engine to use (docs/guide/engines.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from engine_adapter.base import (
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
    greedy,
)
from engine_adapter.hf_tokenizer import load_tokenizer
from engine_adapter.polled import PolledEngine
from engine_adapter.vllm_fields import sampling_fields, structured_fields

log = logging.getLogger(__name__)

# Words, digits, punctuation, accents and CJK: tokenizers that differ usually differ here.
PROBE_TEXT = "Hello, world! Déjà vu: 12345 tokens, 東京 and naïve café-style <tags>."
_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


@dataclass(frozen=True, kw_only=True)
class VllmServerConfig:
    name: str  # the model's name in the gateway
    address: str  # the server's base URL, e.g. http://spark-2:8000
    served_model: str  # the server's --served-model-name
    tokenizer: str  # a local directory with the model's tokenizer
    max_num_seqs: int  # the server's --max-num-seqs (vLLM does not publish it)
    api_key: str | None = field(default=None, repr=False)
    share: float = 1.0  # of the server's KV pool and slots, for this gateway
    poll_interval_s: float = 0.5
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 300.0  # vLLM sends nothing while a long prompt prefills


@dataclass(frozen=True, slots=True)
class ServerPool:
    """What the server's /metrics and /v1/models say of its KV cache and context."""

    block_size: int
    num_blocks: int  # vLLM's num_gpu_blocks: the whole pool, its null block included
    kv_cache_bytes: int
    cache_dtype: str
    prefix_caching: bool
    max_model_len: int


def _families(text: str) -> dict[str, list[Any]]:
    """Prometheus text -> {metric name: samples}, `_total` counters under their full name."""
    out: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def _value(families: dict[str, list[Any]], name: str, model: str) -> float:
    """A gauge or counter of `model` (vLLM labels its metrics `model_name`), summed over engines."""
    return float(sum(s.value for s in families.get(name, ()) if s.labels.get("model_name", model) == model))


def pool_of(metrics_text: str, max_model_len: int) -> ServerPool:
    """The KV pool from `vllm:cache_config_info` (one gauge whose labels are the cache config)."""
    samples = _families(metrics_text).get("vllm:cache_config_info")
    if not samples:
        raise EngineUnavailable("its /metrics has no vllm:cache_config_info (is it a vLLM OpenAI server?)")
    labels = samples[0].labels
    try:
        block_size, num_blocks = int(labels["block_size"]), int(labels["num_gpu_blocks"])
    except (KeyError, ValueError) as e:
        raise EngineUnavailable(f"vllm:cache_config_info lacks block_size/num_gpu_blocks: {e!r}") from e
    kv_bytes = labels.get("kv_cache_memory_bytes", "None")
    return ServerPool(
        block_size=block_size,
        num_blocks=num_blocks,
        kv_cache_bytes=int(kv_bytes) if kv_bytes.isdigit() else 0,
        cache_dtype=labels.get("cache_dtype", "auto"),
        prefix_caching=labels.get("enable_prefix_caching", "False") == "True",
        max_model_len=max_model_len,
    )


def kv_spec_for(pool: ServerPool, share: float, max_num_seqs: int) -> KVSpec:
    """This gateway's share of the server's pool, as one full-attention group."""
    usable = int((pool.num_blocks - 1) * share)  # vLLM keeps block 0 as its null block
    bytes_per_block = pool.kv_cache_bytes // pool.num_blocks if pool.num_blocks else 0
    return KVSpec(
        block_size=pool.block_size,
        num_blocks=usable + 1,
        bytes_per_block=bytes_per_block,
        kv_cache_bytes=bytes_per_block * (usable + 1),
        cache_dtype=pool.cache_dtype,
        groups=(
            KVGroup(
                kind="full_attention",
                num_layers=1,
                block_size=pool.block_size,
                page_bytes_per_layer=bytes_per_block,
            ),
        ),
        max_model_len=pool.max_model_len,
        prefix_caching=pool.prefix_caching,
        max_num_seqs=max(1, int(max_num_seqs * share)),
    )


def stats_of(metrics_text: str, model: str) -> EngineStats:
    f = _families(metrics_text)
    return EngineStats(
        running=int(_value(f, "vllm:num_requests_running", model)),
        waiting=int(_value(f, "vllm:num_requests_waiting", model)),
        kv_cache_usage=_value(f, "vllm:kv_cache_usage_perc", model),
        unfinished=0,
        preemptions=int(_value(f, "vllm:num_preemptions_total", model)),
        generation_tokens=int(_value(f, "vllm:generation_tokens_total", model)),
        prefix_cache_queries=int(_value(f, "vllm:prefix_cache_queries_total", model)),
        prefix_cache_hits=int(_value(f, "vllm:prefix_cache_hits_total", model)),
        steps=0,
    )


def completion_body(request: EngineRequest, model: str) -> dict[str, Any]:
    """The request as vLLM's /v1/completions takes it: an id prompt, the answer's ids back."""
    s = request.sampling
    if s.prompt_logprobs is not None:
        raise EngineRequestInvalid("prompt logprobs are not available from a vllm-server engine")
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(request.prompt_token_ids),
        **sampling_fields(s),
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    if request.priority:  # a server without --scheduling-policy priority refuses any other
        body["priority"] = request.priority
    if s.logit_bias:
        body["logit_bias"] = {str(k): v for k, v in s.logit_bias.items()}
    if request.cache_salt is not None:
        body["cache_salt"] = request.cache_salt
    if s.structured is not None:
        body["structured_outputs"] = structured_fields(s.structured)
    return body


def _logprobs(raw: dict[str, Any] | None, token_ids: list[int], top_k: int | None) -> tuple[TokenLogprob, ...] | None:
    """Completions logprobs (strings only) -> TokenLogprob, the ids from `token_ids`. The top
    alternatives' ids are not sent: -1 (the gateway's bodies show their text and logprob)."""
    if raw is None or top_k is None:
        return None
    out = []
    tops = raw.get("top_logprobs") or [None] * len(token_ids)
    for tid, token, lp, top in zip(
        token_ids, raw.get("tokens") or (), raw.get("token_logprobs") or (), tops, strict=False
    ):
        best = sorted((top or {}).items(), key=lambda kv: -kv[1])[:top_k]
        out.append(TokenLogprob(token_id=tid, token=token, logprob=lp, top=tuple((-1, t, v) for t, v in best)))
    return tuple(out)


class _Stream:
    """Turns vLLM's completion chunks into EngineChunks (all choices' deltas of one SSE event)."""

    def __init__(self, request: EngineRequest) -> None:
        self.request = request
        self.prompt_tokens = len(request.prompt_token_ids)
        self.open = set(range(request.sampling.n))
        self.copies = request.sampling.n if greedy(request.sampling) else 1

    def chunk(self, event: dict[str, Any]) -> EngineChunk | None:
        if "error" in event and "choices" not in event:
            err = event["error"] if isinstance(event["error"], dict) else {"message": str(event["error"])}
            raise EngineUnavailable(f"the vLLM server failed the request: {err.get('message')}")
        usage = event.get("usage")
        deltas = []
        for c in event.get("choices") or ():
            ids = list(c.get("token_ids") or ())
            finish = c.get("finish_reason")
            lps = _logprobs(c.get("logprobs"), ids, self.request.sampling.logprobs)
            for copy in range(self.copies):
                index = int(c["index"]) + copy
                if finish is not None:
                    self.open.discard(index)
                deltas.append(
                    ChoiceDelta(
                        index=index,
                        text=c.get("text") or "",
                        token_ids=tuple(ids),
                        logprobs=lps,
                        finish_reason=_FINISH.get(finish, "stop") if finish is not None else None,
                        stop_reason=c.get("stop_reason"),
                    )
                )
        if usage is not None:  # the last event: the usage, once every choice has finished
            details = usage.get("prompt_tokens_details") or {}
            return EngineChunk(
                choices=tuple(deltas),
                finished=True,
                prompt_tokens=int(usage.get("prompt_tokens", self.prompt_tokens)),
                num_cached_tokens=int(details.get("cached_tokens") or 0),
            )
        if not deltas:
            return None
        return EngineChunk(choices=tuple(deltas), finished=False, prompt_tokens=self.prompt_tokens)


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
        err = body.get("error", body)
        return str(err.get("message") or err)
    except (ValueError, AttributeError):
        return response.text[:300] or response.reason_phrase


class VllmServerEngine(PolledEngine):
    """One model of a vLLM OpenAI server, reached over HTTP."""

    def __init__(self, config: VllmServerConfig) -> None:
        self._streams: dict[str, httpx.Response] = {}  # request id -> its open stream
        super().__init__(config.name)
        self.config = config
        self._pool: ServerPool | None = None

    # -- lifecycle ---------------------------------------------------------

    async def start(self) -> None:
        c = self.config
        logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger("httpx").level))
        headers = {"Content-Type": "application/json"}
        if c.api_key:
            headers["Authorization"] = f"Bearer {c.api_key}"
        self._client = httpx.AsyncClient(
            base_url=c.address.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(c.connect_timeout_s, read=c.read_timeout_s),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        )
        self._tokenizer = await asyncio.to_thread(load_tokenizer, c.tokenizer)
        self._pool = await self._read_pool()
        await self._check_tokenizer()
        self._spec = kv_spec_for(self._pool, c.share, c.max_num_seqs)
        self._healthy = True
        self._poller = asyncio.create_task(self._poll(), name=f"poll-{c.name}")
        log.info(
            "engine %s: vLLM server %s (%s): %d of %d blocks x %d tokens, %d slots, max_model_len %d",
            c.name,
            c.address,
            c.served_model,
            self._spec.usable_blocks,
            self._pool.num_blocks - 1,
            self._spec.block_size,
            self._spec.max_num_seqs,
            self._spec.max_model_len,
        )

    async def _get(self, path: str) -> httpx.Response:
        try:
            r = await self._http.get(path, timeout=self.config.connect_timeout_s)
        except httpx.HTTPError as e:
            raise EngineUnavailable(f"vLLM server {self.config.address} unreachable: {e!r}") from e
        if r.status_code != 200:
            raise EngineUnavailable(f"vLLM server {self.config.address}{path}: HTTP {r.status_code}: {_message(r)}")
        return r

    async def _read_pool(self) -> ServerPool:
        c = self.config
        models = (await self._get("/v1/models")).json().get("data") or []
        card = next((m for m in models if m.get("id") == c.served_model), None)
        if card is None:
            served = ", ".join(str(m.get("id")) for m in models) or "none"
            raise EngineUnavailable(f"vLLM server {c.address} does not serve {c.served_model!r} (it serves {served})")
        pool = pool_of((await self._get("/metrics")).text, int(card.get("max_model_len") or 0))
        if pool.max_model_len <= 0:
            raise EngineUnavailable(f"vLLM server {c.address}: /v1/models gives no max_model_len")
        return pool

    async def _check_tokenizer(self) -> None:
        """The server's ids for a probe text must be ours: the gateway counts and sends ids."""
        c = self.config
        ours = list(self._tokenizer.encode(PROBE_TEXT, add_special_tokens=False))
        try:
            r = await self._http.post(
                "/tokenize", json={"model": c.served_model, "prompt": PROBE_TEXT, "add_special_tokens": False}
            )
        except httpx.HTTPError as e:
            raise EngineUnavailable(f"vLLM server {c.address} unreachable: {e!r}") from e
        if r.status_code != 200:
            raise EngineUnavailable(f"vLLM server {c.address}/tokenize: HTTP {r.status_code}: {_message(r)}")
        theirs = r.json().get("tokens")
        if theirs != ours:
            raise EngineUnavailable(
                f"engine {c.name}: the vLLM server's tokenizer differs from {c.tokenizer} here "
                f"(probe text: {len(theirs or ())} ids there, {len(ours)} here); token counts and ids would be wrong"
            )

    async def _poll(self) -> None:
        """Stats from /metrics; a server that went away is unavailable until it answers again
        with the same pool (a restart with another pool would void admission's counts)."""
        c = self.config
        while True:
            await asyncio.sleep(c.poll_interval_s)
            try:
                r = await self._get("/metrics")
                if not self._healthy:
                    pool = await self._read_pool()
                    if pool != self._pool:
                        raise EngineUnavailable(f"came back with another KV pool ({pool} != {self._pool})")
                    await self._check_tokenizer()
                    log.warning("engine %s: vLLM server %s answers again", c.name, c.address)
                self._stats = stats_of(r.text, c.served_model)
                self._healthy = True
            except (EngineUnavailable, ValueError) as e:
                if self._healthy:
                    log.warning("engine %s: vLLM server %s unavailable: %s", c.name, c.address, e)
                self._healthy = False

    async def shutdown(self) -> None:
        await self._stop_polling()
        for response in list(self._streams.values()):
            with contextlib.suppress(Exception):
                await response.aclose()
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    # -- requests -----------------------------------------------------------

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        c = self.config
        if not self.is_healthy:
            raise EngineUnavailable(f"engine {c.name} (vLLM server {c.address}) is not available")
        body = json.dumps(completion_body(request, c.served_model))
        stream = _Stream(request)
        headers = {"X-Request-Id": request.request_id}
        try:
            async with self._http.stream("POST", "/v1/completions", content=body, headers=headers) as r:
                if r.status_code != 200:
                    await r.aread()
                    if r.status_code == 400:
                        raise EngineRequestInvalid(_message(r))
                    raise EngineUnavailable(f"engine {c.name}: vLLM server HTTP {r.status_code}: {_message(r)}")
                self._streams[request.request_id] = r
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if data == "[DONE]":
                        break
                    chunk = stream.chunk(json.loads(data))
                    if chunk is not None:
                        yield chunk
                        if chunk.finished:
                            return
            raise EngineUnavailable(f"engine {c.name}: the vLLM server ended the stream before the request finished")
        except (httpx.HTTPError, httpx.StreamError) as e:  # StreamError: abort() closed it
            raise EngineUnavailable(f"engine {c.name}: the vLLM server failed mid-request: {e!r}") from e
        except ValueError as e:  # not JSON
            raise EngineUnavailable(f"engine {c.name}: the vLLM server sent a malformed event: {e}") from e
        finally:
            # Leaving the `async with` closed the connection: vLLM aborts a request whose
            # client went away, so its blocks free.
            self._streams.pop(request.request_id, None)

    async def abort(self, request_id: str) -> None:
        response = self._streams.pop(request_id, None)
        if response is not None:
            with contextlib.suppress(Exception):
                await response.aclose()
