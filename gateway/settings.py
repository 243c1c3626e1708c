"""Configuration: config/*.yaml validated once into these models, env overrides on top.

Environment variables override YAML: `SPARKGATE_SERVER__PORT=9000`,
`SPARKGATE_AUTH__REQUIRED=false`, ... (nested keys joined by `__`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from gateway.text.formats import ReasoningParser, ToolParser
from gateway.vllm_versions import FeatureName, Version, lacks, parse
from policies.fair import DEFAULT_IDLE_S, DEFAULT_RESERVE_SLOTS, FairShare
from policies.images import ImageLimits
from policies.known_issues import ISSUE_IDS, unknown_issues
from policies.kv import cdiv, request_state_blocks
from policies.memory_plan import KvBlocks, MemoryPlan, ModelMemory, PlanDoesNotFit, PleTable, plan_memory

if TYPE_CHECKING:
    from engine_adapter.spark import BoxSpec, Serving

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)


def parse_bytes(value: int | str) -> int:
    """`64MiB`, `2 GiB`, `500MB`, `1048576` -> bytes."""
    if isinstance(value, int):
        return value
    m = _SIZE.match(value)
    if not m:
        raise ValueError(f"not a size: {value!r} (use e.g. 64MiB, 2GiB, 1048576)")
    number, unit = float(m.group(1)), (m.group(2) or "").lower()
    base = 1024 if "i" in unit else 1000
    power = 0 if unit in ("", "b") else "kmgt".index(unit[0]) + 1
    return int(number * base**power)


def hash_key(key: str) -> str:
    """The form API keys are stored in: sha256 hex of the key."""
    return hashlib.sha256(key.encode()).hexdigest()


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CorsSettings(_Model):
    """Cross-origin requests from browsers: off unless origins are listed."""

    allow_origins: tuple[str, ...] = ()  # e.g. ["https://chat.example.com"]; "*" for any
    allow_headers: tuple[str, ...] = ("Authorization", "Content-Type", "X-Request-Id")  # a page's script may send
    allow_methods: tuple[str, ...] = ("GET", "POST", "DELETE", "OPTIONS")  # a page's script may use
    # Response headers a page's script may read (the SDK's retry logic reads Retry-After).
    expose_headers: tuple[str, ...] = ("X-Request-Id", "Retry-After", "retry-after-ms")
    max_age_s: int = Field(600, ge=0)  # how long a browser may reuse a preflight's answer


EngineStart = Literal["sequential", "parallel"]
# Engines whose memory is another process's or box's: reached over HTTP, only their tokenizer here.
ELSEWHERE = ("remote", "vllm-server")


class ServerSettings(_Model):
    """The HTTP server: where it listens, what it logs, how its engines start and how it stops."""

    host: str = DEFAULT_HOST  # the address to listen on ("0.0.0.0": every interface)
    port: int = Field(DEFAULT_PORT, ge=0, le=65535)  # the TCP port to listen on
    # The least severe log records written (uvicorn's too); above info, the per-request lines are off.
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # text: for a console; json: one JSON object a line, every logger's (docs/guide/dashboard-metrics.md).
    log_format: Literal["text", "json"] = "text"
    # uvicorn's access line as well: `sparkgate.request` already has one line per request with
    # more in it, and a second line costs CPU on every short request.
    access_log: bool = False
    # Idle keep-alive, longer than clients' pool expiry (httpx, so the openai SDK: 5 s):
    # otherwise a client may reuse a connection just as the server closes it.
    keep_alive_s: float = Field(75.0, gt=0)
    # Where vLLM, torch and HF write caches; kept inside the tree by default.
    cache_dir: str = ".cache"
    # SIGTERM: how long requests in flight may take to finish before they are aborted
    # (new requests get 503 meanwhile); a second SIGTERM aborts them at once.
    drain_grace_s: float = Field(30.0, ge=0)
    # How the models' engines start: one after another (the safe choice on a GPU, where an
    # engine sizes itself by the memory free at its start), or side by side (CPU engines on
    # their own cores, or GPU engines whose KV is set in bytes): start-up takes the slowest
    # engine's time instead of the sum.
    engine_start: EngineStart = "sequential"
    cors: CorsSettings = CorsSettings()
    # Proxies (addresses or networks) whose X-Forwarded-For names the client: failed-auth
    # throttling and /metrics' loopback check then see the client, not the proxy. Empty: the
    # socket's peer is the client and X-Forwarded-For is ignored (anyone could forge it).
    trusted_proxies: tuple[str, ...] = ()

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for p in v:
            try:
                ipaddress.ip_network(p, strict=False)
            except ValueError:
                raise ValueError(f"trusted_proxies: {p!r} is not an IP address or network") from None
        return v


PriorityClass = Literal["interactive", "batch"]
# Most urgent first: a class's index is its admission priority.
PRIORITY_CLASSES: tuple[PriorityClass, ...] = ("interactive", "batch")


class KeyLimits(_Model):
    """What a key may do. Unset fields inherit: the key's own, then its team's
    `defaults`, then `quotas.defaults`, then unlimited."""

    rpm: int | None = Field(None, ge=1)  # requests per quota window (60 s)
    tpm: int | None = Field(None, ge=1)  # input + output tokens per quota window
    daily_tokens: int | None = Field(None, ge=1)  # per UTC day
    monthly_tokens: int | None = Field(None, ge=1)  # per UTC calendar month
    max_concurrency: int | None = Field(None, ge=1)  # requests in flight at once, across replicas
    allowed_models: tuple[str, ...] | None = None  # names or aliases; None: every model
    max_context: int | None = Field(None, ge=16)  # prompt + max_tokens (None: the model's)
    # The default admission class, and the most urgent one a request header may ask for.
    priority: PriorityClass | None = None
    slo_class: str | None = None  # default latency class (used by routing)
    # Whether routing may serve an explicitly named model's request with another model when
    # the named one would miss the latency objective (aliases always route).
    allow_substitution: bool | None = None
    normalize_prompts: bool | None = None  # prefix-cache normalization (None: the model's setting)

    def over(self, base: KeyLimits) -> KeyLimits:
        """These limits, with unset fields taken from `base`."""
        mine = self.model_dump(exclude_none=True)
        return base.model_copy(update=mine) if mine else base


class PooledLimits(_Model):
    """Totals a whole team shares (every key of the team counts against them)."""

    rpm: int | None = Field(None, ge=1)  # requests per quota window (60 s), the team's keys together
    tpm: int | None = Field(None, ge=1)  # input + output tokens per quota window
    daily_tokens: int | None = Field(None, ge=1)  # per UTC day
    monthly_tokens: int | None = Field(None, ge=1)  # per UTC calendar month
    max_concurrency: int | None = Field(None, ge=1)  # the team's requests in flight at once, across replicas


class TeamSettings(_Model):
    """A team: limits each of its keys inherits, and totals its keys share."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.@-]{1,64}$")  # what a key names as its `team`
    defaults: KeyLimits = KeyLimits()  # inherited by each key of the team
    pooled: PooledLimits = PooledLimits()  # counted against all of the team's keys together


class ApiKey(KeyLimits):
    """A key written in the config file (keys made with `sparkgate keys create` live in the store)."""

    # The key's id (`cfg-NAME` in the admin API) and, unless `user` is set, its user.
    name: str = Field(pattern=r"^[A-Za-z0-9_.@-]{1,64}$")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")  # hex SHA-256 of the key: the config never holds the key
    user: str | None = None  # the person (default: the key's name)
    team: str | None = None  # a name of quotas.teams: its defaults and pooled limits apply

    def limits(self) -> KeyLimits:
        return KeyLimits(**{k: getattr(self, k) for k in KeyLimits.model_fields})


class AdminKey(_Model):
    """A key of the admin API (/sparkgate/admin, `sparkgate keys`); it opens nothing else."""

    name: str  # who holds it
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")  # hex SHA-256 of the key, as for auth.keys


class FailedAuthSettings(_Model):
    """Throttling of failed authentications, per client address (brute force)."""

    max_failures: int = Field(20, ge=1)  # within window_s; then 429 until block_s has passed
    window_s: float = Field(60.0, gt=0)  # seconds in which failures are counted
    block_s: float = Field(60.0, gt=0)  # seconds a client that reached max_failures is refused
    # Clients remembered at once (memory stays bounded whatever addresses an attacker uses).
    max_clients: int = Field(10_000, ge=1)


class AuthSettings(_Model):
    """API keys: who may call the API, and the admin API."""

    # false: no key is asked for; every request is one user, `anonymous`, under quotas.defaults.
    required: bool = True
    keys: tuple[ApiKey, ...] = ()
    admin_keys: tuple[AdminKey, ...] = ()  # for /sparkgate/admin and `sparkgate keys`
    failed: FailedAuthSettings = FailedAuthSettings()

    @model_validator(mode="after")
    def _keys_when_required(self) -> AuthSettings:
        if self.required and not self.keys and not self.admin_keys:
            raise ValueError("auth.required is true but neither auth.keys nor auth.admin_keys is set")
        return self


class QuotaSettings(_Model):
    """Per-key quotas and where their counters live (see gateway/quota/)."""

    # "memory": this process only (the embedded default); "redis": shared by every replica.
    store: Literal["memory", "redis"] = "memory"
    # The Redis server when store is "redis" (stored responses live there too); its password is never shown.
    redis_url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = "sg:"  # every Redis key sparkgate writes starts with this
    redis_timeout_s: float = Field(0.5, gt=0)  # per command; beyond it Redis counts as down
    # Redis down: "closed" answers 503 + Retry-After; "open" serves on per-process limits.
    on_outage: Literal["closed", "open"] = "closed"
    # A reservation's lease: a replica renews its holds every lease_s / 3; a crashed
    # replica's holds are released lease_s after its last renewal.
    lease_s: float = Field(30.0, ge=0.1)
    window_s: float = Field(60.0, ge=0.1)  # the rpm / tpm window (shorter only in tests)
    defaults: KeyLimits = KeyLimits()
    teams: tuple[TeamSettings, ...] = ()

    @model_validator(mode="after")
    def _unique_teams(self) -> QuotaSettings:
        names = [t.name for t in self.teams]
        if len(names) != len(set(names)):
            raise ValueError("quotas.teams: team names must be unique")
        return self

    def team(self, name: str | None) -> TeamSettings | None:
        return next((t for t in self.teams if t.name == name), None)


class PrefixSettings(_Model):
    """Prompt normalization for the prefix cache (policies/prefix.py), per model."""

    normalize: bool = True  # a key may turn it off (`normalize_prompts: false`)
    merge_system: bool = True  # leading system and developer messages become one at the start
    canonical_tools: bool = True  # tool definitions: keys sorted at every depth, tools by name
    # Lines of the leading instructions matching volatile_patterns (dates, times, ids) move to
    # a short system note at the end, so the next turn shares everything before it.
    move_volatile: bool = True
    volatile_patterns: tuple[str, ...] | None = None  # None: policies.prefix.DEFAULT_VOLATILE_PATTERNS
    # Past assistant turns rendered as the model produced them (Qwen3's empty <think> block put
    # back), so each turn's prompt extends the previous one token for token.
    stable_history: bool = True
    # Separate prefix caches per team or per user (vLLM's cache_salt): one tenant cannot
    # learn from timing whether another's prompt is cached.
    cache_isolation: Literal["none", "team", "user"] = "none"

    @field_validator("volatile_patterns")
    @classmethod
    def _regexes(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for p in v or ():
            try:
                re.compile(p)
            except re.error as e:
                raise ValueError(f"volatile_patterns: {p!r} is not a regular expression: {e}") from None
        return v


class LatencyProfile(_Model):
    """A model's latency on its box before any observation (policies.latency.Profile)."""

    prefill_tokens_per_s: float = Field(10_000.0, gt=0)  # prompt tokens prefilled per second
    ttft_overhead_s: float = Field(0.05, ge=0)  # time to first token besides the prefill, seconds
    prefill_s_per_ktoken2: float = Field(0.0, ge=0)  # attention's quadratic share of prefill
    tpot_s: float = Field(0.02, gt=0)  # one decode step, one sequence, short context, seconds
    tpot_per_sequence_s: float = Field(0.0, ge=0)  # added to a step per other running sequence
    tpot_per_ktoken_s: float = Field(0.0, ge=0)  # added to a step per 1,000 tokens of context


class SimulatedSettings(_Model):
    """The DGX Spark box model's parameters for one simulated engine."""

    model: str  # a key of engine_adapter.spark.MODELS
    speedup: float = Field(1.0, gt=0)  # simulated seconds per wall-clock second
    instant: bool = False  # steps take no wall time: an engine that answers at once

    @field_validator("model")
    @classmethod
    def _a_box_model(cls, v: str) -> str:
        from engine_adapter.spark import MODELS

        if v not in MODELS:
            raise ValueError(f"unknown box model {v!r}; known: {', '.join(MODELS)}")
        return v


class ReplaySettings(_Model):
    """A replay engine (engine: replay): recorded Qwen3 text, no model (engine_adapter/replay.py)."""

    token_delay_s: float = Field(0.0, ge=0)  # wall seconds between tokens
    recording: str = "answer"  # the recording a prompt without a [[replay:NAME]] tag gets
    # A simulated prefix cache (per cache_salt, whole blocks), so cached_tokens mean something.
    prefix_cache: bool = False
    # Fault injection for the canary's tests: an answer served from that cache comes out
    # changed (Paris becomes Rome), as a hybrid model's corrupted cache hit would.
    corrupt_cached: bool = False


class RemoteSettings(_Model):
    """An engine on another box, served by `sparkgate engine-host` there (engine: remote)."""

    address: str  # the host's base URL, e.g. http://spark-2:8001
    token_env: str = "SPARKGATE_ENGINE_TOKEN"  # the environment variable holding the host's token
    share: float = Field(1.0, gt=0, le=1)  # of the engine's KV pool and slots (replicas split it)
    poll_interval_s: float = Field(0.5, gt=0)  # how often the host's /stats (load, health) is read
    connect_timeout_s: float = Field(5.0, gt=0)  # to connect to the host (and to send to it)
    # Silence this long on a stream (the host sends a heartbeat every second) cuts it: 503.
    read_timeout_s: float = Field(10.0, gt=1)


class VllmServerSettings(_Model):
    """A stock vLLM OpenAI server as the engine (engine: vllm-server): another box, a
    container, or one vLLM spanning two boxes with Ray. The gateway sends it token ids."""

    address: str  # the server's base URL, e.g. http://spark-2:8000 (without /v1)
    served_model: str | None = None  # its --served-model-name (default: this model's name)
    api_key_env: str | None = None  # the environment variable holding its --api-key, if it has one
    # Of the server's KV pool and of this model's max_num_seqs (vLLM does not publish its
    # --max-num-seqs: set max_num_seqs to it). Replicas split the server with shares that
    # add up to at most 1; nothing enforces that across gateways (engine-host does).
    share: float = Field(1.0, gt=0, le=1)
    poll_interval_s: float = Field(0.5, gt=0)  # /metrics: running, waiting, KV use
    # To connect to the server (and to send to it); also the whole wait for its /metrics.
    connect_timeout_s: float = Field(5.0, gt=0)
    # A stream silent this long is cut (503): vLLM sends nothing during a prompt's prefill,
    # so this must outlast the longest prefill the server runs.
    read_timeout_s: float = Field(300.0, gt=1)


class ImageFetchSettings(_Model):
    """Images given as http(s) URLs (docs/guide/images.md). Off: such an image gets 400
    image_url_not_allowed, and only data URLs and base64 are read."""

    enabled: bool = False  # fetch http(s) image URLs at all
    # Hosts whose images may be fetched, at every redirect: "images.example.com", or
    # "*.example.com" for its subdomains. Empty: none.
    allow_hosts: tuple[str, ...] = ()
    # Of those, hosts that may resolve to a private, loopback or link-local address (an image
    # server inside the network). Any other that does is refused, whichever hop it is.
    private_hosts: tuple[str, ...] = ()
    max_bytes: int = 20 * 1024 * 1024  # one image (also bounded by the model's images.max_bytes)
    timeout_s: float = Field(10.0, gt=0)  # the whole fetch, redirects included
    max_redirects: int = Field(3, ge=0)  # redirects followed, each to an allowed host

    @field_validator("max_bytes", mode="before")
    @classmethod
    def _size(cls, v: int | str) -> int:
        return parse_bytes(v)


class ImageSettings(_Model):
    """The images one request may send a model (docs: the API page's images section)."""

    # Whether the model takes images. None: as its config says (a `vision_config`, and vLLM not
    # started `language_model_only`); false: every image gets 400 naming the model.
    enabled: bool | None = None
    max_images: int = Field(8, ge=0)  # images in one request (more: 400 too_many_images)
    # Pixels of one image as sent, width x height (more: 400 image_too_large, before it is decoded).
    max_pixels: int = Field(16_777_216, ge=1)
    max_bytes: int = 20 * 1024 * 1024  # one image's encoded bytes, or a size ("20MiB"; more: 413)

    @field_validator("max_bytes", mode="before")
    @classmethod
    def _size(cls, v: int | str) -> int:
        return parse_bytes(v)

    @property
    def limits(self) -> ImageLimits:
        return ImageLimits(max_images=self.max_images, max_pixels=self.max_pixels, max_bytes=self.max_bytes)


class PleTableSettings(_Model):
    """A per-layer n-gram embedding table (Qwen4Exp's PLE, Qwen3.8-Flash-Next: 320,001,536 x 160
    = 51.2B parameters, 95.37 GiB BF16, 47.68 GiB FP8). Where vLLM keeps it decides whether it
    counts against the box, and the gateway passes it to vLLM as `--engram-config`: `host`
    (pinned host memory, `{"cpu_offload": true}`, vLLM's default) and `device`
    (`{"cpu_offload": false}`), the same LPDDR5X on a DGX Spark; `disk` (`{"disk_offload": true}`,
    vLLM >= 0.34, CUDA only): the rows stay in the checkpoint files and each step's are read on
    the host through the page cache (docs/operator-guide.md, "Where Flash-Next fits")."""

    rows: int = Field(gt=0)  # the table's rows (Flash-Next: 320,001,536)
    dim: int = Field(gt=0)  # values per row (Flash-Next: 160)
    dtype: Literal["bf16", "fp8"] = "fp8"  # as loaded: 2 or 1 byte per value
    placement: Literal["host", "device", "disk"] = "host"  # where vLLM keeps it (above)

    def table(self) -> PleTable:
        return PleTable(rows=self.rows, dim=self.dim, dtype=self.dtype, placement=self.placement)

    def engram_config(self) -> dict[str, bool]:
        """vLLM's EngramConfig fields that put the table where `placement` says."""
        if self.placement == "disk":
            return {"disk_offload": True}
        return {"cpu_offload": self.placement == "host"}


class KvBlockSettings(_Model):
    """The engine's KV pool geometry, for a pool counted in whole blocks (vLLM's kv_cache_config:
    Flash-Next on vLLM 0.32, CUDA, FP8 KV: 40,943,616 B per block of 3,136 tokens), and its
    per-request state groups (GDN, PLE short conv) and rings, whose blocks policies/kv.py's
    state-block rule counts (Flash-Next: 4 and 1, so 9 a request with prefix caching and
    synchronous scheduling, 5 without prefix caching; docs/kv-footprint.md)."""

    block_bytes: int = Field(gt=0)  # one block's bytes, all layers of the pool
    block_tokens: int = Field(gt=0)  # tokens one block holds
    state_groups: int = Field(0, ge=0)  # KV groups of per-request state (GDN, PLE short conv)
    ring_groups: int = Field(0, ge=0)  # KV groups of a per-request ring buffer (QSA raw keys)

    def blocks(
        self, *, prefix_caching: bool, async_scheduling: bool, max_num_batched_tokens: int, max_model_len: int
    ) -> KvBlocks:
        """The pool with each running request's state blocks at their most (policies/kv.py's rule,
        at a max_model_len request)."""
        state = request_state_blocks(
            self.state_groups,
            self.ring_groups,
            "align" if prefix_caching else "none",
            cdiv(max_model_len, self.block_tokens),
            async_scheduling=async_scheduling,
            chunk_blocks=cdiv(max_num_batched_tokens, self.block_tokens),
        )
        return KvBlocks(block_bytes=self.block_bytes, block_tokens=self.block_tokens, state_blocks=state)


class RestartSettings(_Model):
    """What happens when a model's engine dies: restarts with exponential backoff, until it
    has died `max_deaths` times within `window_s`; then it stays down (see /ready)."""

    enabled: bool = True  # false: a dead engine stays down at once
    backoff_s: float = Field(1.0, gt=0)  # before the first restart; doubles each time
    max_backoff_s: float = Field(60.0, gt=0)  # the doubling stops here
    max_deaths: int = Field(3, ge=1)  # deaths within window_s (a failed restart counts) that keep it down
    window_s: float = Field(600.0, gt=0)  # seconds in which deaths are counted


class ModelSettings(_Model):
    """One served model: where it lives and how its engine runs."""

    name: str  # what requests' `model` names; also in /v1/models, logs and metrics
    # The model's directory (weights, config, tokenizer); relative to the project root (base_dir).
    path: str
    aliases: tuple[str, ...] = ()  # more names requests may use (listed in /v1/models; unique)
    # vllm: in this process; simulated: the DGX Spark box model; remote: on another box
    # (`path` is then a local copy of the model's tokenizer); vllm-server: a stock vLLM
    # OpenAI server (`path` as for remote); replay: recorded Qwen3 turns
    # picked by a `[[replay:NAME]]` tag in the prompt (`path`: a Qwen tokenizer's directory).
    engine: Literal["vllm", "simulated", "remote", "vllm-server", "replay"] = "vllm"
    tokenizer: str | None = None  # engine vllm: a tokenizer directory other than `path`
    dtype: str = "bfloat16"  # engine vllm: the weights' compute dtype (vLLM's --dtype; "auto")
    # The engine's context (vLLM's --max-model-len): prompt + output tokens of one request.
    max_model_len: int = Field(4096, ge=16)
    max_num_seqs: int = Field(8, ge=1)  # sequences the engine runs at once: admission's running slots
    # Tokens one engine step takes at most (vLLM's; None: vLLM's own default, which the memory
    # plan counts as 8192).
    max_num_batched_tokens: int | None = Field(None, ge=16)
    # vLLM's: while others run or wait, a prefill takes at most this many tokens a step, so a
    # chat does not wait behind a long document's whole prompt (0: no cap). docs/routing.md.
    long_prefill_token_threshold: int = Field(0, ge=0)
    # The most output tokens a request may ask for (more: 400); one that sets no max_tokens
    # gets what the context leaves, up to this (None: no cap).
    max_output_tokens: int | None = Field(None, ge=1)
    # Fixed KV bytes. Unset: with a `box` plan, a share of the memory left; without one, vLLM's default.
    kv_cache_bytes: int | None = None
    kv_share: float = Field(1.0, gt=0)  # weight in the box plan's split of memory left (no fixed KV)
    # What the model costs the box besides KV (the memory plan needs these when `box` is set).
    weights_bytes: int | None = None
    overhead_bytes: int = 0  # activations at max_num_batched_tokens, CUDA graphs, drafter buffers
    # Held on top of all that while the engine starts, then released: CUDA-graph capture and
    # kernel autotuning, which vLLM runs after it allocates the KV pool (the plan's worst moment).
    startup_bytes: int = 0
    # A per-layer n-gram embedding table (Flash-Next), counted by dtype and placement.
    ple_table: PleTableSettings | None = None
    images: ImageSettings = Field(default_factory=ImageSettings)  # the images a request may send it
    # The KV pool in whole blocks with per-request state blocks (hybrid models): see KvBlockSettings.
    kv_blocks: KvBlockSettings | None = None
    # Tensor parallelism over this many boxes (vLLM's multi-node launch): this box holds 1/N of
    # the weights, the n-gram table and the KV pool.
    box_shards: int = Field(1, ge=1)
    kv_cache_dtype: str = "auto"  # engine vllm: vLLM's --kv-cache-dtype, e.g. "fp8" ("auto": the model's)
    # vLLM's prefix cache: a prompt starting like an earlier one reuses its KV blocks.
    enable_prefix_caching: bool = True
    # Engine vllm: no CUDA graphs (vLLM's --enforce-eager): a faster start, slower decoding.
    enforce_eager: bool = True
    # Engine vllm: "dummy" starts on random weights of the checkpoint's shapes (tests, demos).
    load_format: Literal["auto", "safetensors", "dummy"] = "auto"
    seed: int = 0  # the engine's random seed (vLLM's --seed; the simulated engine's)
    # Engine vllm, CPU build: the cores its threads are bound to (VLLM_CPU_OMP_THREADS_BIND, e.g.
    # "0-7"), so engines side by side keep off each other's cores. Unset: as this process got it.
    cpu_cores: str | None = None
    # "compact": structured JSON output without free whitespace (see StructuredOutput).
    json_whitespace: Literal["compact", "any"] = "compact"
    # Deliver at most one output token per this many seconds (0: as fast as the engine), so a
    # test or demo can make an engine slower than it is, the same on any machine.
    token_pace_s: float = Field(0.0, ge=0)
    # Passed verbatim to vLLM's AsyncEngineArgs (names differ across versions).
    engine_args: dict[str, Any] = Field(default_factory=dict)
    # How the model writes tool calls and reasoning (docs/tools.md): a family registered in
    # gateway/text/formats, "none", or "auto": read off the chat template (`<function=` ->
    # qwen3_xml, `<tool_call>` -> hermes, `<think>` -> qwen3).
    tool_parser: ToolParser = "auto"
    reasoning_parser: ReasoningParser = "auto"  # the same choice for reasoning text

    # Admission: running jobs' sequences at once (None: the engine's max_num_seqs).
    max_concurrency: int | None = Field(None, ge=1)
    # The longest prompt + max_tokens accepted (None: max_model_len); a key's may be lower.
    max_context: int | None = Field(None, ge=16)
    prefix: PrefixSettings = PrefixSettings()
    # Routing: the latency profile that seeds the model's prediction, and where it ranks.
    latency: LatencyProfile = LatencyProfile()
    quality: float = 0.0  # higher is better: aliases that route prefer it when it meets the SLO
    # A simulated engine (engine: simulated): the DGX Spark box model's model and time scale.
    simulated: SimulatedSettings | None = None
    remote: RemoteSettings | None = None
    vllm_server: VllmServerSettings | None = None
    replay: ReplaySettings = ReplaySettings()
    restart: RestartSettings = RestartSettings()
    # Open engine-flag reports this model runs anyway (policies/known_issues.py ids, e.g.
    # "vllm#53912"): `sparkgate check` then warns instead of refusing; the canary watches it.
    accept_known_issues: tuple[str, ...] = ()
    # Run the canary on this model (None: where it means something: not on simulated engines).
    canary: bool | None = None

    @field_validator("kv_cache_bytes", "weights_bytes", "overhead_bytes", "startup_bytes", mode="before")
    @classmethod
    def _size(cls, v: Any) -> Any:
        return None if v is None else parse_bytes(v)

    @field_validator("accept_known_issues")
    @classmethod
    def _known_issues(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if bad := unknown_issues(v):
            raise ValueError(f"{bad[0]!r} is not a known issue (known: {', '.join(ISSUE_IDS)})")
        return v

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    def vllm_engine_args(self) -> dict[str, Any]:
        """`engine_args` as the engine gets them: the n-gram table's placement as vLLM's
        engram_config (the plan counts that placement, so it decides)."""
        args = dict(self.engine_args)
        if self.ple_table is not None:
            given = args.get("engram_config")
            args["engram_config"] = {**(given if isinstance(given, dict) else {}), **self.ple_table.engram_config()}
        return args

    @property
    def ple_on_disk(self) -> bool:
        """Whether its n-gram table is read from the checkpoint files each step."""
        return self.ple_table is not None and self.ple_table.placement == "disk"

    def with_ple_placement(self, placement: Literal["host", "device", "disk"]) -> ModelSettings:
        """This model with its n-gram table placed elsewhere (`sparkgate plan` compares them)."""
        assert self.ple_table is not None
        return self.model_copy(update={"ple_table": self.ple_table.model_copy(update={"placement": placement})})

    def vllm_features(self) -> list[FeatureName]:
        """What of vLLM this model's in-process engine needs beyond the oldest supported."""
        if self.engine != "vllm" or self.ple_table is None:
            return []
        return ["ple_table", "ple_disk"] if self.ple_on_disk else ["ple_table"]

    def vllm_lacks(self, version: Version) -> list[str]:
        """Why vLLM `version` cannot serve this model in-process, one line a missing feature."""
        return [f"model {self.name!r}: {why}" for f in self.vllm_features() if (why := lacks(version, f)) is not None]


RouteStrategy = Literal["best", "fast"]
AliasStrategy = Literal["best", "fast", "class"]  # "class": the request's SLO class decides


class SloClass(_Model):
    """A latency objective: time to first token and per output token, or a whole-response deadline."""

    ttft_s: float | None = Field(None, gt=0)  # time to first token, seconds
    tpot_s: float | None = Field(None, gt=0)  # time per output token after the first, seconds
    deadline_s: float | None = Field(None, gt=0)  # the whole response, seconds
    # What `auto` means for this class: "best" (the highest quality that meets it) or "fast"
    # (the soonest done). Long lenient work on the slow models holds a box for tens of
    # seconds that interactive requests then miss: see docs/routing.md.
    prefer: RouteStrategy = "best"
    # Capacity kept for this class (tight objectives) from the others (which can wait): a
    # request of another class that would leave fewer than this many slots free on its
    # engine, or take the last engine where one of these would meet its objectives, is held
    # while it can still meet its own. 0: none. See docs/routing.md.
    reserve_slots: int = Field(0, ge=0)


DEFAULT_ALIASES: dict[str, AliasStrategy] = {"auto": "class", "best": "best", "fast": "fast"}


class RoutingSettings(_Model):
    """Latency-SLO routing between the served models (policies/routing.py)."""

    enabled: bool = False  # false: requests name a served model; the aliases do not exist
    classes: dict[str, SloClass] = Field(
        default_factory=lambda: {
            "interactive": SloClass(ttft_s=2.0, tpot_s=0.06),
            "batch": SloClass(deadline_s=600.0),
        }
    )
    default_class: str = "interactive"  # for a request whose header and key name no class
    header: str = "X-Sparkgate-SLO"  # a request picks its class with this header
    # Model names that route, and how: "best" (highest quality meeting the SLO, degrading to
    # faster ones), "fast" (the quickest predicted) or "class" (the SLO class's `prefer`).
    aliases: dict[str, AliasStrategy] = Field(default_factory=lambda: dict(DEFAULT_ALIASES))
    allow_substitution: bool = False  # the default for keys that do not say
    # Prefer models that meet this share of each objective: predictions err, and a request
    # that only just fits its objective on paper misses it half the time. A request is turned
    # away only when none is predicted to meet the objective itself.
    headroom: float = Field(0.9, gt=0, le=1)
    # Output tokens assumed for a request that does not set max_tokens.
    default_output_tokens: int = Field(512, ge=1)
    window: int = Field(32, ge=1)  # observations in each latency correction's median

    @model_validator(mode="after")
    def _default_known(self) -> RoutingSettings:
        if self.default_class not in self.classes:
            raise ValueError(f"routing.default_class {self.default_class!r} is not in routing.classes")
        return self


class ResponsesSettings(_Model):
    """Stored responses (/v1/responses with `store: true`, the default): what GET
    /v1/responses/{id} returns and `previous_response_id` continues. They live where the
    quota counters do (`quotas.store`: this process, or Redis shared by every replica)."""

    # How long a stored response can be read or continued. An agent chains its turns within
    # minutes; an hour bounds what the store holds (OpenAI keeps them 30 days).
    ttl_s: float = Field(3600.0, gt=0)
    # The in-process store keeps at most this many (the oldest go first); Redis is bounded by the TTL.
    max_stored: int = Field(1000, ge=1)
    # And at most this much of them (a conversation with images is megabytes; the oldest go first).
    max_stored_bytes: int = 512 * 1024 * 1024

    @field_validator("max_stored_bytes", mode="before")
    @classmethod
    def _size(cls, v: int | str) -> int:
        return parse_bytes(v)


class CanarySettings(_Model):
    """A fixed tool-call prompt sent to each model twice, cold then from its prefix cache, at
    temperature 0 (gateway/canary.py): different tool calls, or no cached tokens where prefix
    caching is on, mark the model degraded. On demand: POST /sparkgate/admin/canary."""

    # Also once at start-up, in the background. Off by default: every test and dev gateway
    # would pay two requests per model; the DGX Spark configs turn it on.
    on_start: bool = False
    max_tokens: int = Field(256, ge=16)  # room for the call (and any thinking before it)
    timeout_s: float = Field(600.0, gt=0)  # per model, both requests, queueing included


class MetricsSettings(_Model):
    """GET /metrics (Prometheus text format, gateway/metrics.py)."""

    enabled: bool = True  # false: /metrics answers 404 and no request is measured
    # Unset: only loopback clients may scrape, without a key. Set: anyone with
    # `Authorization: Bearer <token>`, and nobody without it.
    token: str | None = Field(None, repr=False)
    # Distinct `user` label values; users beyond these are counted as `other`.
    max_users: int = Field(50, ge=1)


class LimitSettings(_Model):
    """What one API request may ask for; beyond it the client gets a 400 naming the field
    (413 for the body), before anything is tokenized or reaches an engine."""

    # A request body (413 beyond): room for a few images, each up to `images.max_bytes` base64-encoded.
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024)
    max_json_depth: int = Field(64, ge=4, le=1000)  # nesting of the body's arrays and objects
    max_messages: int = Field(2048, ge=1)  # chat messages, Responses input items, completion prompts
    max_stop: int = Field(4, ge=1)  # stop strings (OpenAI's limit)
    max_stop_chars: int = Field(256, ge=1)  # characters in one stop string
    max_stop_token_ids: int = Field(64, ge=0)  # stop_token_ids entries
    max_tools: int = Field(128, ge=0)  # OpenAI's limit
    max_logit_bias: int = Field(300, ge=0)  # logit_bias entries
    max_n: int = Field(8, ge=1)  # choices per request (each one a sequence in the engine)

    @field_validator("max_body_bytes", mode="before")
    @classmethod
    def _size(cls, v: Any) -> Any:
        return parse_bytes(v)


_DEFAULT_QUEUE_TIMEOUT_S: dict[PriorityClass, float] = {"interactive": 60.0, "batch": 600.0}


class FairShareSettings(_Model):
    """Room kept for users who run little beside a flood (policies/fair.py)."""

    enabled: bool = True  # false: users still take turns, but no room is kept
    reserve_slots: int = Field(DEFAULT_RESERVE_SLOTS, ge=1)  # running sequences owed to each active user
    idle_s: float = Field(DEFAULT_IDLE_S, ge=0, le=3600)  # a user stays active this long after its last request
    max_share: float = Field(1.0, gt=0, le=1)  # of the slots, for one user while others are active
    newcomer_s: float = Field(0.0, ge=0, le=86400)  # room for one more user kept this long after a user's last request

    def policy(self) -> FairShare:
        return FairShare(
            enabled=self.enabled,
            reserve_slots=self.reserve_slots,
            idle_s=self.idle_s,
            max_share=self.max_share,
            newcomer_s=self.newcomer_s,
        )


class AdmissionSettings(_Model):
    """The fair queue in front of the engines (see policies/admission.py)."""

    # Requests waiting per engine; when full, the user with the most waiting gives one up for a
    # newcomer who has fewer, else the newcomer gets 503.
    max_queued: int = Field(256, ge=0)
    max_queued_tokens: int = Field(4_000_000, ge=0)  # the same bound on their worst-case tokens
    max_queued_per_user: int = Field(64, ge=0)  # requests one user may have waiting per engine
    # Times a waiting request that does not fit yet may be passed by smaller ones; then the
    # engine drains for it (big requests are not starved).
    max_bypass: int = Field(4, ge=0)
    # Waiting requests that do not fit looked at per scheduling pass: keeps a decision cheap
    # when thousands wait on a full engine.
    max_scan: int = Field(16, ge=1)
    # Short requests (<= 16 output tokens) started beyond an engine's running slots, as a share
    # of them, while one user alone uses it: they wait in vLLM's queue, which refills a slot in
    # the same step instead of a step later (0: none). policies/demand.py QueueLimits.
    lone_backlog: float = Field(0.0, ge=0, le=4)
    # Requests one user may run at once (None: no cap); a key's own max_concurrency wins.
    per_user_max_concurrency: int | None = Field(None, ge=1)
    # The longest wait in the queue per priority class, seconds; then 503 `queue_timeout`.
    queue_timeout_s: dict[PriorityClass, float] = Field(default_factory=lambda: dict(_DEFAULT_QUEUE_TIMEOUT_S))
    priority_header: str = "X-Sparkgate-Priority"  # asks for a less urgent class than the key's
    fair_share: FairShareSettings = FairShareSettings()


class MemoryGuardSettings(_Model):
    """The run-time memory guard (box.min_free is its floor): below it new requests get 503
    `server_overloaded` (Anthropic's API: 529) with Retry-After, and /ready says why, until
    available memory is back above the floor plus `resume_margin`. docs/guide/admission.md."""

    # How often the available memory (/proc/meminfo's MemAvailable) is read: a reading costs
    # tens of microseconds, and a long prefill can take gigabytes within seconds.
    poll_s: float = Field(1.0, gt=0, le=60)
    # Admission resumes at min_free + this: the hysteresis that keeps a box hovering at the
    # floor from flapping between admitting and refusing.
    resume_margin: int = 2 * 1024**3
    # The Retry-After a refused client is told: about the time running requests take to give
    # their memory back.
    retry_after_s: float = Field(5.0, gt=0)

    @field_validator("resume_margin", mode="before")
    @classmethod
    def _size(cls, v: Any) -> Any:
        return parse_bytes(v)

    @field_validator("resume_margin")
    @classmethod
    def _not_negative(cls, v: int) -> int:
        if v < 0:
            raise ValueError("must be at least 0")
        return v


class BoxSettings(_Model):
    """The machine the in-process engines share (a DGX Spark: 128 GiB unified)."""

    memory: int  # the box's memory, bytes or a size ("128GiB"): what the plan divides
    reserved: int = 0  # OS, gateway process, CUDA contexts: never given to a model
    # The floor of available host memory (MemAvailable, what vLLM reads on a unified-memory GPU):
    # the plan keeps it free at the box's worst moment, and below it the gateway admits no new
    # work until memory comes back (0: no floor). docs/operator-guide.md.
    min_free: int = 0
    # How the gateway (and `sparkgate engine-host`) watches that floor at run time.
    guard: MemoryGuardSettings = MemoryGuardSettings()

    @field_validator("memory", "reserved", "min_free", mode="before")
    @classmethod
    def _size(cls, v: Any) -> Any:
        return parse_bytes(v)


class BoxPlacement(_Model):
    """One box of a placement: the models resident on it and the KV each gets there."""

    name: str  # the box's name in the plan
    models: tuple[str, ...]  # names of models[] resident on it
    kv_gib: dict[str, float] = Field(default_factory=dict)  # unset: the model's whole-box budget


class PlacementSettings(_Model):
    """Where the models live (the three cannot share one 128 GiB box): read by `sparkgate plan`."""

    name: str  # how `sparkgate plan` names the placement in its report
    boxes: tuple[BoxPlacement, ...]


class ServingSettings(_Model):
    """How the engines on a box serve their models (the box model's `Serving`)."""

    weight_dtype: Literal["nvfp4", "fp8", "bf16"] = "nvfp4"  # the checkpoints' weight format
    kv_dtype: Literal["fp8", "bf16"] = "fp8"  # the KV cache's dtype
    spec_decode: bool = True  # each model's speculative decoder (drafts) on
    block_size: int = Field(16, ge=1)  # tokens per KV block
    routing_locality: float = Field(0.1, gt=0, le=1)  # 1.0 for dummy (random) weights
    async_scheduling: bool = False  # the Spark deployment's --no-async-scheduling


class BoxEfficiency(_Model):
    """Shares of a box's peaks its kernel paths reach (physical, documented; never fitted to
    one box's runs). Defaults: engine_adapter/spark/hardware.py's shared constants."""

    gemm: float = Field(gt=0, le=1)  # large-M prefill GEMMs, of the weight dtype's peak
    bandwidth: float = Field(0.82, gt=0, le=1)  # of the peak memory bandwidth, which decode streams
    attention: float = Field(0.4, gt=0, le=1)  # of the BF16 peak
    moe_gemm: float = Field(0.12, gt=0, le=1)  # expert GEMMs relative to dense ones


class BoxFileSettings(_Model):
    """A box file (config/boxes/*.yaml): one box's public specs, the efficiencies its kernel
    paths reach, its per-step costs, and how its engines serve (read by `sparkgate plan --box`)."""

    name: str  # the box's name in the plan's reports
    memory: int  # GPU-visible bytes: 141GB, 128GiB
    memory_bandwidth: float = Field(gt=0)  # bytes/s, peak
    bf16_flops: float = Field(gt=0)  # dense peaks (not the sparse figures)
    fp8_flops: float = Field(gt=0)  # FLOP/s, dense
    fp4_flops: float = Field(0.0, ge=0)  # 0: no FP4 tensor cores
    efficiency: BoxEfficiency
    step_overhead_s: float = Field(ge=0)  # host time per engine step: scheduler, input prep, sampling
    forward_overhead_s: float = Field(0.0004, ge=0)  # per extra forward pass (each draft): launch, sync
    frontend_latency_s: float = Field(0.0, ge=0)  # what vLLM's HTTP frontend adds to client latency
    # The drive an n-gram table on disk is read from (0: none; such a table is then refused).
    nvme_read_bandwidth: float = Field(0.0, ge=0)  # bytes/s
    nvme_read_iops: float = Field(0.0, ge=0)  # random 4 KiB reads/s
    sync_step_s: float = Field(0.0, ge=0)  # host work a synchronous scheduler waits for, per step
    sync_token_s: float = Field(0.0, ge=0)  # ... and per token in the step
    # Engines sharing the box: a step's work between waits for a busy box-mate's (None: the
    # built-in boxes' 10 ms slice).
    gpu_timeslice_s: float | None = Field(None, gt=0)
    gpu_mate_wait_s: float | None = Field(None, gt=0)  # the longest of those waits (None: the slice)
    serving: ServingSettings = ServingSettings()

    @field_validator("memory", mode="before")
    @classmethod
    def _size(cls, v: Any) -> Any:
        return parse_bytes(v)


def load_box(ref: str | Path) -> tuple[BoxSpec, Serving]:
    """(BoxSpec, Serving) for a built-in box's name (dgx-spark, h200: the Spark deployment's
    serving) or a box file's path. ValueError/OSError name what is wrong."""
    from engine_adapter.spark import BOXES, BoxSpec, Serving

    if str(ref) in BOXES:
        return BOXES[str(ref)], Serving()
    path = Path(ref)
    if path.suffix not in (".yaml", ".yml"):
        raise ValueError(f"unknown box {str(ref)!r}: a built-in one ({', '.join(BOXES)}) or a box file (.yaml)")
    raw = yaml.safe_load(path.read_text()) or {}
    f = BoxFileSettings.model_validate(raw)
    box = BoxSpec(
        name=f.name,
        memory_bytes=f.memory,
        mem_bandwidth=f.memory_bandwidth,
        bf16_flops=f.bf16_flops,
        fp8_flops=f.fp8_flops,
        fp4_flops=f.fp4_flops,
        bandwidth_efficiency=f.efficiency.bandwidth,
        gemm_efficiency=f.efficiency.gemm,
        attention_efficiency=f.efficiency.attention,
        moe_gemm_efficiency=f.efficiency.moe_gemm,
        step_overhead_s=f.step_overhead_s,
        forward_overhead_s=f.forward_overhead_s,
        frontend_latency_s=f.frontend_latency_s,
        nvme_read_bandwidth=f.nvme_read_bandwidth,
        nvme_read_iops=f.nvme_read_iops,
        sync_step_s=f.sync_step_s,
        sync_token_s=f.sync_token_s,
        gpu_mate_wait_s=f.gpu_mate_wait_s,
    )
    if f.gpu_timeslice_s is not None:
        box = dataclasses.replace(box, gpu_timeslice_s=f.gpu_timeslice_s)
    return box, Serving(**f.serving.model_dump())


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SPARKGATE_", env_nested_delimiter="__", extra="forbid", frozen=True)

    server: ServerSettings = ServerSettings()
    auth: AuthSettings = AuthSettings(required=False)
    models: tuple[ModelSettings, ...]
    limits: LimitSettings = LimitSettings()
    admission: AdmissionSettings = AdmissionSettings()
    quotas: QuotaSettings = QuotaSettings()
    responses: ResponsesSettings = ResponsesSettings()
    box: BoxSettings | None = None
    routing: RoutingSettings = RoutingSettings()
    metrics: MetricsSettings = MetricsSettings()
    canary: CanarySettings = CanarySettings()
    image_fetch: ImageFetchSettings = ImageFetchSettings()  # images by URL (off)
    placement: PlacementSettings | None = None
    # The vLLM this config's engines run (e.g. "0.34.0" on a DGX Spark): `sparkgate check` judges
    # the config against it; unset, against the vLLM installed here (gateway/vllm_versions.py).
    vllm_version: str | None = None
    # Relative model paths resolve against this (the config file's project root).
    base_dir: str = "."

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (env_settings, init_settings)  # env beats YAML

    @field_validator("vllm_version")
    @classmethod
    def _version(cls, v: str | None) -> str | None:
        if v is not None:
            parse(v)  # ValueError names the expected form
        return v

    @model_validator(mode="after")
    def _unique_names(self) -> Settings:
        if not self.models:
            raise ValueError("models: at least one model is required")
        seen: dict[str, str] = {}
        for m in self.models:
            for n in m.names:
                if n in seen:
                    raise ValueError(f"model name {n!r} is used by both {seen[n]!r} and {m.name!r}")
                seen[n] = m.name
        if self.routing.enabled:
            clash = sorted(set(self.routing.aliases) & set(seen))
            if clash:
                raise ValueError(f"routing.aliases {clash} are also model names")
            classes = [k.slo_class for k in self.auth.keys] + [t.defaults.slo_class for t in self.quotas.teams]
            classes.append(self.quotas.defaults.slo_class)
            unknown_classes = sorted({c for c in classes if c is not None and c not in self.routing.classes})
            if unknown_classes:
                raise ValueError(f"slo_class {unknown_classes} not in routing.classes")
        if self.placement is not None:
            placed = [n for b in self.placement.boxes for n in b.models]
            unknown = sorted(set(placed) - set(seen))
            if unknown:
                raise ValueError(f"placement: unknown models {unknown}")
        for m in self.models:
            if m.engine == "simulated" and m.simulated is None:
                raise ValueError(f"model {m.name!r}: engine 'simulated' needs a 'simulated' section")
            if m.engine == "remote" and m.remote is None:
                raise ValueError(f"model {m.name!r}: engine 'remote' needs a 'remote' section (the host's address)")
            if m.engine == "vllm-server" and m.vllm_server is None:
                raise ValueError(f"model {m.name!r}: engine 'vllm-server' needs a 'vllm_server' section (its address)")
        teams = {t.name for t in self.quotas.teams}
        for k in self.auth.keys:
            if k.team is not None and k.team not in teams:
                raise ValueError(f"auth.keys[{k.name}]: team {k.team!r} is not in quotas.teams")
        if self.box is not None:
            unknown = [m.name for m in self.local_models() if m.weights_bytes is None]
            if unknown:
                raise ValueError(f"box: the memory plan needs weights_bytes for {', '.join(unknown)}")
        return self

    def boxes(self) -> dict[str, str]:
        """Each model's box, from the placement (without one, the engines share this machine)."""
        if self.placement is None:
            return {}
        return {name: b.name for b in self.placement.boxes for name in b.models}

    def memory_plan(self) -> MemoryPlan | PlanDoesNotFit | None:
        """The box's memory plan (None without a `box` section)."""
        if self.box is None:
            return None
        return plan_memory(
            total=self.box.memory,
            reserved=self.box.reserved,
            min_free=self.box.min_free,
            side_by_side=self.server.engine_start == "parallel",
            models=[model_memory(m) for m in self.local_models()],
        )

    def local_models(self) -> tuple[ModelSettings, ...]:
        """The models whose engine uses this box's memory (not those on another box)."""
        return tuple(m for m in self.models if m.engine not in ELSEWHERE)

    def with_kv_plan(self, plan: MemoryPlan) -> Settings:
        """These settings with each local model's KV bytes taken from the plan."""
        models = tuple(
            m.model_copy(update={"kv_cache_bytes": plan.kv_cache[m.name]}) if m.name in plan.kv_cache else m
            for m in self.models
        )
        return self.model_copy(update={"models": models})

    def missing_model_dirs(self) -> list[str]:
        """Models whose directory lacks what this process loads, as readable lines: a whole
        model (config.json) here, only the tokenizer for a model on another box or replayed."""
        lines = []
        for m in self.models:
            needed = "tokenizer_config.json" if m.engine in (*ELSEWHERE, "replay") else "config.json"
            if not (self.model_path(m) / needed).is_file():
                lines.append(f"model {m.name!r}: {self.model_path(m)} has no {needed}")
        return lines

    def missing_secrets(self) -> list[str]:
        """Engines elsewhere whose token variable is unset, as readable lines."""
        lines = [
            f"model {m.name!r}: ${m.remote.token_env} (the engine host's token) is not set"
            for m in self.models
            if m.remote is not None and m.engine == "remote" and not os.environ.get(m.remote.token_env)
        ]
        return lines + [
            f"model {m.name!r}: ${m.vllm_server.api_key_env} (the vLLM server's API key) is not set"
            for m in self.models
            if m.vllm_server is not None
            and m.engine == "vllm-server"
            and m.vllm_server.api_key_env is not None
            and not os.environ.get(m.vllm_server.api_key_env)
        ]

    def model_path(self, model: ModelSettings) -> Path:
        p = Path(model.path)
        return p if p.is_absolute() else Path(self.base_dir) / p


# vLLM's larger default step (the OpenAI server's on a GPU), where max_num_batched_tokens is unset.
DEFAULT_STEP_TOKENS = 8192


def model_memory(m: ModelSettings) -> ModelMemory:
    """What the memory plan counts for one model's engine on this box."""
    return ModelMemory(
        name=m.name,
        weights=m.weights_bytes or 0,
        overhead=m.overhead_bytes,
        kv_cache=m.kv_cache_bytes,
        kv_share=m.kv_share,
        ple=None if m.ple_table is None else m.ple_table.table(),
        max_num_batched_tokens=m.max_num_batched_tokens or DEFAULT_STEP_TOKENS,
        kv_blocks=None
        if m.kv_blocks is None
        else m.kv_blocks.blocks(
            prefix_caching=m.enable_prefix_caching,
            # vLLM turns asynchronous scheduling on unless told not to (CUDA builds); the box
            # model's simulated engines schedule synchronously, as the Spark deployment does.
            async_scheduling=bool(m.engine_args.get("async_scheduling", m.engine == "vllm")),
            max_num_batched_tokens=m.max_num_batched_tokens or DEFAULT_STEP_TOKENS,
            max_model_len=m.max_model_len,
        ),
        max_num_seqs=m.max_num_seqs,
        max_model_len=m.max_model_len,
        shards=m.box_shards,
        startup=m.startup_bytes,
    )


def project_root(config: Path) -> Path:
    """What a config's relative paths resolve against: the project root (the config file's
    parent's parent when it sits in `config/`, else its own directory)."""
    p = config.resolve()
    return p.parent.parent if p.parent.name == "config" else p.parent


def load_settings(path: str | Path, **overrides: Any) -> Settings:
    """Read a YAML config; relative paths in it resolve against `project_root`."""
    p = Path(path).resolve()
    data = yaml.safe_load(p.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{p}: expected a mapping at the top level")
    data.setdefault("base_dir", str(project_root(p)))
    data.update(overrides)
    return Settings(**data)
