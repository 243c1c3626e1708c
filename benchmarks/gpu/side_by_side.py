"""GPU side by side (issue 19): one engine driven directly, through sparkgate, and through vLLM's
own OpenAI server, on the lent H200 (CUDA vLLM 0.26).

Per shape (`shapes/`, dummy weights, the DGX Spark deployment's settings: FP8 KV, 4,096-token
steps, the long-prefill cap of one block, prefix caching on, 8 slots, CUDA graphs), for 2K and 32K
prompts (random token ids: unique, so the prefix cache never hits) at concurrency 1, 4 and 8, 256
output tokens (`ignore_eos`), greedy:

- direct: `AsyncLLM.generate` on the gateway's own engine, run on the gateway's event loop (a
  benchmark-only route triggers it, so both share one engine and one process);
- adapter: the same through `VllmLocalEngine.generate` (sparkgate's engine adapter, no HTTP);
- sparkgate: `POST /v1/completions` (streaming, a key checked) from a client in another process;
- http_floor: the same body to a bare Starlette app served by uvicorn on the gateway's own event
  loop and engine (another port): `json.loads`, `AsyncLLM.generate`, one SSE event per output,
  no gateway logic. sparkgate's TTFT minus its TTFT is the gateway's own work; its TTFT minus
  direct's is the HTTP transport's and the client's floor;
- vllm_server: `python3 -m vllm.entrypoints.openai.api_server` with the same engine settings,
  started after the gateway has stopped (one engine on the GPU at a time).

    python3 benchmarks/gpu/side_by_side.py OUT --shape 35b-a3b --part gateway    # direct, adapter, sparkgate
    python3 benchmarks/gpu/side_by_side.py OUT --shape 35b-a3b --part vllm       # vLLM's own server
    python3 benchmarks/gpu/side_by_side.py --table benchmarks/gpu/side_by_side_result/*.json

Each part writes OUT/side_by_side_SHAPE_PART.json after every case (a part cut short keeps what
it measured). `--table` merges parts and prints output tok/s and TTFT as ratios to direct.
`--profile` first runs `--profile-case` (sparkgate, default 2K c=8, 3 batches) under py-spy
(`--nonblocking`, every thread), written as collapsed stacks to OUT/pyspy_SHAPE[_TAG].txt. HTTP
requests carry an `x-request-id` naming their case, so the gateway's request log gives its own TTFT
(from its outermost middleware to the engine's first output) per case: the sparkgate rows'
`gateway_ttft_p50_ms`. Every request also carries its hop trace (`each[].hops_ms`, ms from the
client's send: uvicorn handing over headers and body, prepare, admission, vLLM's add_request, the
first output, the first text sent) and the GC pauses in it; `--table` prints the hops and, for
c=1, TTFT split into the time to vLLM, the engine's part and the part after, per path and as
per-repetition differences with bootstrap 95% intervals.

The model dirs hold the Qwen3 tokenizer (the Qwen3.6 one is not here), so `vocab_size` is set to
its 151,936 ids: every sampled id then decodes, on every path alike (the head is 4% of the
weights; the same change on all three paths).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import gc
import json
import lzma
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.ports import free_port  # noqa: E402

SHAPES = Path(__file__).resolve().parent / "shapes"
API_KEY = "sk-side-by-side"
MODEL = "bench"
VOCAB = 151_936  # the Qwen3 tokenizer's (see the module docstring)
MAX_TOKENS = 256  # --max-tokens overrides (TTFT does not depend on it; output tok/s does)
KV_BYTES = 16 * 1024**3
# name -> (config file, long_prefill_token_threshold = one FP8 hybrid block, as config/dgx-spark.yaml)
SHAPE_FILES = {
    "35b-a3b": ("qwen3.6-35b-a3b.config.json", 2096),
    "27b": ("qwen3.6-27b.config.json", 1568),
    "cpu-tiny": ("", 0),  # a dry run of the whole script on the CPU build (models/tiny-qwen3-moe)
}
# Repetitions per prompt length (--reps overrides): 32K cases are long enough to average over their own requests.
REPS = {2048: 3, 32768: 1}


def engine_settings(shape: str) -> dict[str, Any]:
    """The engine arguments every path shares (what config/dgx-spark.yaml sets, 8 slots)."""
    if shape == "cpu-tiny":
        return {
            "max_model_len": 32768,  # the tiny model's positions: a ~32K prompt's gateway hops on CPU
            "max_num_seqs": 8,
            "max_num_batched_tokens": 4096,
            "kv_cache_memory_bytes": 512 * 1024**2,
            "enable_prefix_caching": True,
            "enforce_eager": True,
            "load_format": "dummy",
            "dtype": "bfloat16",
            "seed": 0,
        }
    block = SHAPE_FILES[shape][1]
    return {
        "max_model_len": 40960,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 4096,
        "long_prefill_token_threshold": block,
        "kv_cache_dtype": "fp8",
        "kv_cache_memory_bytes": KV_BYTES,
        "enable_prefix_caching": True,
        "enforce_eager": False,
        "load_format": "dummy",
        "dtype": "bfloat16",
        "seed": 0,
        "language_model_only": True,
        "gdn_prefill_backend": "triton",  # no FlashInfer on the GPU machine
    }


def model_dir(shape: str) -> Path:
    """/tmp/models/sbs-SHAPE: the shape's config (Qwen3 vocabulary) and the Qwen3 tokenizer."""
    out = Path("/tmp/models") / f"sbs-{shape}"
    out.mkdir(parents=True, exist_ok=True)
    if shape == "cpu-tiny":
        cfg = json.loads((ROOT / "models/tiny-qwen3-moe/config.json").read_text())
    else:
        cfg = json.loads((SHAPES / SHAPE_FILES[shape][0]).read_text())
    cfg.get("text_config", cfg)["vocab_size"] = VOCAB
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    for src in (ROOT / ".devwheels/gpu/tokenizer", ROOT / "models/_tokenizer-qwen3"):
        if src.is_dir():
            for f in src.iterdir():
                if f.name.endswith(".xz"):
                    (out / f.name[:-3]).write_bytes(lzma.decompress(f.read_bytes()))
                elif not f.name.startswith("."):
                    shutil.copy2(f, out / f.name)
            return out
    raise FileNotFoundError("no Qwen3 tokenizer: .devwheels/gpu/tokenizer or models/_tokenizer-qwen3")


def prompt(path: str, length: int, conc: int, rep: int, i: int) -> list[int]:
    """Random ids, distinct per path and request, clear of the specials at the vocabulary's end."""
    rng = random.Random(f"{path}/{length}/{conc}/{rep}/{i}")
    return [rng.randrange(1000, 150_000) for _ in range(length)]


def summarize(reqs: list[dict[str, Any]], walls: list[float], tokens: list[int]) -> dict[str, Any]:
    ttfts = sorted(r["ttft_s"] for r in reqs)
    decode = [r["decode_tok_s"] for r in reqs if r["decode_tok_s"]]

    def pct(q: float) -> float:
        return ttfts[min(len(ttfts) - 1, round(q * (len(ttfts) - 1)))]

    return {
        "ttft_p50_ms": round(1000 * statistics.median(ttfts), 2),
        "ttft_p99_ms": round(1000 * pct(0.99), 2),
        "ttft_mean_ms": round(1000 * statistics.fmean(ttfts), 2),
        "output_tok_s": round(sum(tokens) / sum(walls), 2),
        "decode_tok_s_per_stream": round(statistics.fmean(decode), 2) if decode else None,
        "requests": len(reqs),
        "output_tokens": sum(tokens),
        "wall_s": [round(w, 3) for w in walls],
        "ttft_ms": [round(1000 * t, 1) for t in ttfts],  # every request's, sorted: p50s of a few are noisy
        # every request in the order sent (rep by rep), with its hops where traced
        "each": [
            {"rid": r.get("rid"), "ttft_ms": round(1000 * r["ttft_s"], 3)}
            | {k: r[k] for k in ("hops_ms", "gc_ms", "gc_gen") if k in r}
            for r in reqs
        ],
    }


# --------------------------------------------------------------------------- in the gateway process

# Hop trace: every request's milestones in the gateway process, as perf_counter times (CLOCK_MONOTONIC,
# one clock for every process of the host, so they compare with the client's send time). Tagged with
# the request's x-request-id (the direct path: its request id) through a context variable that the
# tasks a request starts inherit. A few microseconds a request, on every path alike.
TRACE_TAG: contextvars.ContextVar[str | None] = contextvars.ContextVar("sbs_trace_tag", default=None)
TRACE: dict[str, list[tuple[str, float]]] = {}
GC_PAUSES: list[tuple[float, float, int]] = []  # (start, seconds, generation) of every collection


def mark(event: str) -> None:
    if (tag := TRACE_TAG.get()) is not None:
        TRACE.setdefault(tag, []).append((event, time.perf_counter()))


def traced_asgi(app: Any) -> Any:
    """The outermost ASGI layer: tags the request and marks `asgi_in` (uvicorn has the headers),
    `body_in` (the body's last piece handed to the app), `response_start` and `first_send` (the
    first body piece that carries text: what the client times as its first token)."""

    async def wrapper(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        rid = next((v.decode() for k, v in scope["headers"] if k == b"x-request-id"), None)
        token = TRACE_TAG.set(rid)
        mark("asgi_in")
        sent = False

        async def receive_() -> Any:
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                mark("body_in")
            return message

        async def send_(message: Any) -> None:
            nonlocal sent
            if message["type"] == "http.response.start":
                mark("response_start")
            elif message["type"] == "http.response.body" and not sent:
                body = message.get("body", b"")
                if re.search(rb'"text": ?"[^"]', body):
                    sent = True
                    mark("first_send")
            await send(message)

        try:
            await app(scope, receive_, send_)
        finally:
            TRACE_TAG.reset(token)

    return wrapper


def install_trace() -> None:
    """Mark the gateway's hops (prepare, admission) and vLLM's (add_request, first output)."""
    from vllm.v1.engine.async_llm import AsyncLLM

    from gateway import lifecycle

    def around(owner: Any, name: str, before: str, after: str) -> None:
        inner = getattr(owner, name)

        async def wrapped(*args: Any, **kw: Any) -> Any:
            mark(before)
            try:
                return await inner(*args, **kw)
            finally:
                mark(after)

        setattr(owner, name, wrapped)

    around(lifecycle, "prepare_completion", "prepare_in", "prepare_out")  # openai.py calls lifecycle.X
    around(lifecycle, "start", "admit_in", "admit_out")  # quota hold, routing, admission
    around(AsyncLLM, "add_request", "add_in", "add_out")  # vLLM's input processing, the send to its core
    generate = AsyncLLM.generate

    async def generate_marked(self: Any, *args: Any, **kw: Any) -> Any:
        inner = generate(self, *args, **kw)
        first = True
        try:
            async for out in inner:
                if first and any(o.token_ids for o in out.outputs):
                    first = False
                    mark("first_out")
                yield out
        finally:
            await inner.aclose()

    AsyncLLM.generate = generate_marked  # type: ignore[method-assign]
    started: list[float] = [0.0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            GC_PAUSES.append((started[0], time.perf_counter() - started[0], int(info["generation"])))

    gc.callbacks.append(on_gc)


def take_trace() -> dict[str, Any]:
    out = {"events": dict(TRACE), "gc": list(GC_PAUSES)}
    TRACE.clear()
    GC_PAUSES.clear()
    return out


async def direct_request(llm: Any, ids: list[int], rid: str, max_tokens: int) -> dict[str, Any]:
    """One request on AsyncLLM, with the sampling parameters the adapter builds for it."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True, output_kind=RequestOutputKind.DELTA
    )
    TRACE_TAG.set(rid)  # this request's own task (gather): the tag stays in it
    t0 = time.perf_counter()
    first = None
    n = 0
    async for out in llm.generate(TokensPrompt(prompt_token_ids=ids), params, rid):
        k = len(out.outputs[0].token_ids) if out.outputs else 0
        if k and first is None:
            first = time.perf_counter()
        n += k
    return finish(t0, first, time.perf_counter(), n, rid)


async def adapter_request(engine: Any, ids: list[int], rid: str, max_tokens: int) -> dict[str, Any]:
    """One request through sparkgate's engine adapter (VllmLocalEngine.generate)."""
    from engine_adapter.base import EngineRequest, SamplingOptions

    req = EngineRequest(
        request_id=rid,
        prompt_token_ids=tuple(ids),
        sampling=SamplingOptions(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
    )
    TRACE_TAG.set(rid)
    t0 = time.perf_counter()
    first = None
    n = 0
    async for chunk in engine.generate(req):
        k = sum(len(c.token_ids) for c in chunk.choices)
        if k and first is None:
            first = time.perf_counter()
        n += k
    return finish(t0, first, time.perf_counter(), n, rid)


def finish(t0: float, first: float | None, end: float, n: int, rid: str | None = None) -> dict[str, Any]:
    first = end if first is None else first
    return {
        "ttft_s": first - t0,
        "tokens": n,
        "decode_tok_s": (n - 1) / (end - first) if n > 1 and end > first else None,
        "rid": rid,
        "t0": t0,  # perf_counter when the request was sent: the trace's events are timed from it
    }


def floor_app(engines: list[Any]) -> Any:
    """The HTTP floor: the completions body in, `AsyncLLM.generate` on the gateway's engine, one SSE
    event per output (the text vLLM detokenized, as the gateway sends), usage, [DONE]. No auth,
    validation, admission, metrics or request log: what any HTTP server on this stack pays."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import StreamingResponse
    from starlette.routing import Route
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    async def completions(request: Request) -> StreamingResponse:
        body = json.loads(await request.body())
        ids = body["prompt"]
        params = SamplingParams(
            max_tokens=body["max_tokens"], temperature=0.0, ignore_eos=True, output_kind=RequestOutputKind.DELTA
        )
        rid = f"{request.headers.get('x-request-id', 'floor')}-{uuid.uuid4().hex[:8]}"
        head = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": body["model"]}

        async def events() -> Any:
            n = 0
            async for out in engines[-1]._llm.generate(TokensPrompt(prompt_token_ids=ids), params, rid):
                for o in out.outputs:
                    n += len(o.token_ids)
                    choice = {"index": 0, "text": o.text, "logprobs": None, "finish_reason": o.finish_reason}
                    yield f"data: {json.dumps(head | {'choices': [choice]})}\n\n"
            usage = {"prompt_tokens": len(ids), "completion_tokens": n, "total_tokens": len(ids) + n}
            yield f"data: {json.dumps(head | {'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])


def serve_gateway(settings_path: str) -> None:
    """Child: `sparkgate serve` as the CLI runs it, plus POST /bench/run for the in-process paths,
    POST /bench/floor, which starts the HTTP floor on the same loop and engine, and POST
    /bench/trace, which hands over (and clears) the hop trace and the GC pauses."""
    sys.path.insert(0, str(ROOT))
    import uvicorn
    from fastapi import Body

    install_trace()

    from gateway import cli
    from gateway.app import create_app, vllm_engine
    from gateway.settings import Settings

    settings = Settings(**json.loads(Path(settings_path).read_text()))
    engines: list[Any] = []

    def factory(s: Any, m: Any) -> Any:
        e = vllm_engine(s, m)
        engines.append(e)
        return e

    async def bench_run(body: dict[str, Any] = Body(...)) -> dict[str, Any]:  # noqa: B008
        engine = engines[-1]
        path, length, conc, rep = body["path"], body["length"], body["conc"], body["rep"]
        run = direct_request if path == "direct" else adapter_request
        target = engine._llm if path == "direct" else engine
        ids = [prompt(path, length, conc, rep, i) for i in range(conc)]
        n = body["max_tokens"]
        t0 = time.perf_counter()
        reqs = await asyncio.gather(
            *(run(target, p, f"{path}-{length}-{conc}-{rep}-{i}", n) for i, p in enumerate(ids))
        )
        return {"wall_s": time.perf_counter() - t0, "requests": list(reqs)}

    class FloorServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Any:
            yield  # the gateway's server owns SIGTERM; this one ends with its loop

    floors: list[Any] = []

    async def bench_floor(body: dict[str, Any] = Body(...)) -> dict[str, Any]:  # noqa: B008
        if not floors:
            # log_config None: leave the gateway's logging as it configured it
            app = traced_asgi(floor_app(engines))
            config = uvicorn.Config(app, host="127.0.0.1", port=body["port"], log_config=None)
            server = FloorServer(config)
            floors.append(asyncio.get_running_loop().create_task(server.serve()))
            while not server.started:
                await asyncio.sleep(0.05)
        return {"ok": True}

    def app_factory(s: Settings, drain: Any) -> Any:
        app = create_app(s, engine_factory=factory, drain=drain)
        app.add_api_route("/bench/run", bench_run, methods=["POST"])
        app.add_api_route("/bench/floor", bench_floor, methods=["POST"])
        app.add_api_route("/bench/trace", take_trace, methods=["POST"])
        return traced_asgi(app)

    cli._run(settings, app_factory, None, None, False)


# --------------------------------------------------------------------------- HTTP client (driver)


async def http_post(
    port: int, path: str, body: dict[str, Any], key: str | None, stream: bool, rid: str | None = None
) -> Any:
    """A minimal HTTP/1.1 client (the same for both servers, and cheap): returns the JSON body, or,
    for a stream, the request's TTFT (first event with text), tokens and decode rate."""
    payload = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {len(payload)}\r\nConnection: close\r\n"
    if key:
        head += f"Authorization: Bearer {key}\r\n"
    if rid:
        head += f"X-Request-Id: {rid}\r\n"
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head.encode() + b"\r\n" + payload)
    await writer.drain()
    status = (await reader.readline()).decode()
    headers: dict[str, str] = {}
    while (line := (await reader.readline()).decode().strip()) != "":
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    chunked = headers.get("transfer-encoding", "").lower() == "chunked"

    async def pieces() -> Any:
        if not chunked:
            while data := await reader.read(65536):
                yield data
            return
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            if size == 0:
                return
            yield await reader.readexactly(size)
            await reader.readexactly(2)

    try:
        if " 200 " not in status:
            rest = b"".join([p async for p in pieces()])
            raise RuntimeError(f"{path}: {status.strip()} {rest[:500]!r}")
        if not stream:
            return json.loads(b"".join([p async for p in pieces()]))
        buf = b""
        first = None
        events = 0
        usage = None
        async for piece in pieces():
            buf += piece
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                for line in event.split(b"\n"):
                    if not line.startswith(b"data: ") or line == b"data: [DONE]":
                        continue
                    d = json.loads(line[6:])
                    if d.get("usage"):
                        usage = d["usage"]
                    if any(c.get("text") for c in d.get("choices") or []):
                        events += 1
                        if first is None:
                            first = time.perf_counter()
        n = usage["completion_tokens"] if usage else events
        return finish(t0, first, time.perf_counter(), n, rid)
    finally:
        writer.close()


async def http_case(
    port: int, key: str, path: str, length: int, conc: int, rep: int, max_tokens: int
) -> dict[str, Any]:
    def body(i: int) -> dict[str, Any]:
        return {
            "model": MODEL,
            "prompt": prompt(path, length, conc, rep, i),
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }

    bodies = [body(i) for i in range(conc)]  # built before the clock starts
    t0 = time.perf_counter()
    rids = [f"{path}-{length}-{conc}-{rep}-{i}" for i in range(conc)]  # the gateway's log names the case
    reqs = await asyncio.gather(
        *(http_post(port, "/v1/completions", b, key, True, r) for b, r in zip(bodies, rids, strict=True))
    )
    return {"wall_s": time.perf_counter() - t0, "requests": list(reqs)}


def wait_health(port: int, proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode}:\n{log.read_text(errors='replace')[-6000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if b" 200 " in s.recv(100):
                    return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"server not healthy after {timeout_s} s:\n{log.read_text(errors='replace')[-6000:]}")


def stop(proc: subprocess.Popen[bytes], wait_s: float = 60) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_gateway(shape: str, work: Path, logs: Path) -> tuple[subprocess.Popen[bytes], int, Path]:
    from gateway.settings import hash_key

    port = free_port()
    es = engine_settings(shape)
    renamed = {"kv_cache_memory_bytes": "kv_cache_bytes"}
    own = {"max_model_len", "max_num_seqs", "max_num_batched_tokens", "long_prefill_token_threshold"}
    own |= {"kv_cache_memory_bytes", "kv_cache_dtype", "enable_prefix_caching", "enforce_eager", "load_format"}
    own |= {"dtype", "seed"}
    model: dict[str, Any] = {"name": MODEL, "path": str(model_dir(shape))}
    model |= {renamed.get(k, k): v for k, v in es.items() if k in own}
    model["engine_args"] = {k: v for k, v in es.items() if k not in own}  # vLLM's own names, verbatim
    settings = {
        "server": {"host": "127.0.0.1", "port": port, "log_level": "info", "cache_dir": str(work / "cache")},
        "auth": {"required": True, "keys": [{"name": "bench", "sha256": hash_key(API_KEY)}]},
        "models": [model],
    }
    sp = work / f"gateway_{shape}.json"
    sp.write_text(json.dumps(settings))
    log = logs / f"gateway_{shape}.log"
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve-gateway", str(sp)], stdout=log.open("wb"), stderr=subprocess.STDOUT
    )
    return proc, port, log


def start_vllm_server(shape: str, logs: Path) -> tuple[subprocess.Popen[bytes], int, Path]:
    port = free_port()
    es = engine_settings(shape)
    args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir(shape))]
    args += ["--served-model-name", MODEL, "--port", str(port), "--host", "127.0.0.1", "--api-key", API_KEY]
    for k, v in es.items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            args.append(flag)
        elif v is not False:
            args += [flag, str(v)]
    if shape != "cpu-tiny":  # what sparkgate's adapter sets: the same config hash, so the compile cache is reused
        args += ["--structured-outputs-config", json.dumps({"backend": "xgrammar", "disable_any_whitespace": True})]
    log = logs / f"vllm_server_{shape}.log"
    proc = subprocess.Popen(args, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    return proc, port, log


def run_part(a: argparse.Namespace) -> int:
    started = time.monotonic()
    work = Path("/tmp/sbs")
    work.mkdir(parents=True, exist_ok=True)
    a.out.mkdir(parents=True, exist_ok=True)
    shape = a.shape
    if shape == "cpu-tiny":
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "1")  # one core for the engine, one for the rest
    result: dict[str, Any] = {
        "shape": shape,
        "part": a.part,
        "engine": engine_settings(shape) | {"vocab_size": VOCAB},
        "max_tokens": a.max_tokens,
        "runs": [],
    }
    try:
        import torch
        import vllm

        result["vllm"] = vllm.__version__
        result["gpu"] = torch.cuda.get_device_name(0)
    except Exception as e:  # the CPU dry run
        result["versions_error"] = repr(e)
    dest = a.out / f"side_by_side_{shape}_{a.part}{'_' + a.tag if a.tag else ''}.json"

    def save() -> None:
        dest.write_text(json.dumps(result, indent=1))

    lens = [int(x) for x in a.lens.split(",")]
    # "LEN:N" for every concurrency at that length, "LENxCONC:N" for one case
    reps: dict[str, int] = {str(k): v for k, v in REPS.items()}
    reps |= {k: int(v) for k, v in (x.split(":") for x in a.reps.split(",") if x)}
    concs = [int(x) for x in a.conc.split(",")]
    if a.part == "gateway":
        proc, port, log = start_gateway(shape, work, a.out)  # the log straight to OUT: kept if cut short
        paths = ["direct", "sparkgate", "http_floor"] + (["adapter"] if a.adapter else [])
    else:
        proc, port, log = start_vllm_server(shape, a.out)
        paths = ["vllm_server"]
    try:
        result["startup_s"] = round(wait_health(port, proc, log, a.start_timeout), 1)
        print(f"[{shape}/{a.part}] healthy after {result['startup_s']} s", flush=True)
        save()
        floor_port = free_port()

        async def one(path: str, length: int, conc: int, rep: int) -> dict[str, Any]:
            if path in ("direct", "adapter"):
                body = {"path": path, "length": length, "conc": conc, "rep": rep, "max_tokens": a.max_tokens}
                return dict(await http_post(port, "/bench/run", body, API_KEY, False))
            to = floor_port if path == "http_floor" else port
            return await http_case(to, API_KEY, path, length, conc, rep, a.max_tokens)

        async def drive() -> None:
            if "http_floor" in paths:
                await http_post(port, "/bench/floor", {"port": floor_port}, API_KEY, False)
            t = time.monotonic()
            longest = min(8192, result["engine"]["max_model_len"] - a.max_tokens - 8)
            for path in paths:  # warm-up: every path's code and the prefill/decode kernels at c=8
                # every concurrency once: a new batch shape may compile or tune kernels on first use
                # (the 35B-A3B's fused MoE has no tuned table for the H200), which must not land on one path
                # and every measured length once (its first prefill may still JIT a kernel)
                warm = {(longest, 1), *((x, 1) for x in lens), *((min(lens), c) for c in concs)}
                for length, conc in sorted(warm):
                    await one(path if path != "adapter" else "direct", length, conc, -1)
            result["warmup_s"] = round(time.monotonic() - t, 1)
            print(f"[{shape}/{a.part}] warm-up {result['warmup_s']} s", flush=True)
            if a.profile and a.part == "gateway":  # first, so a run cut short by its time limit still has it
                case, times = a.profile_case.split(":")
                plen, pconc = (int(x) for x in case.split("x"))
                dest = a.out / f"pyspy_{shape}{'_' + a.tag if a.tag else ''}.txt"
                await profile(dest, proc.pid, lambda: one("sparkgate", plen, pconc, 99), int(times), a.profile_rate)
            if a.part == "gateway":
                await http_post(port, "/bench/trace", {}, API_KEY, False)  # the warm-up's: dropped
            for length in lens:
                for conc in concs:
                    if a.budget and time.monotonic() - started > a.budget:
                        result.setdefault("skipped", []).append([length, conc])  # out of device time
                        print(f"[{shape}/{a.part}] budget spent: skipping {length}/{conc}", flush=True)
                        continue
                    got: dict[str, tuple[list[dict[str, Any]], list[float], list[int]]] = {
                        p: ([], [], []) for p in paths
                    }
                    for rep in range(reps.get(f"{length}x{conc}", reps.get(str(length), 1))):
                        if rep and a.budget and time.monotonic() - started > a.budget:
                            result.setdefault("cut", []).append([length, conc, rep])  # reps so far are kept
                            print(f"[{shape}/{a.part}] budget spent: {length}/{conc} after {rep} reps", flush=True)
                            break
                        for path in paths:  # interleaved, so drift hits every path alike
                            if path == "adapter" and length not in a.adapter_lens:
                                continue
                            r = await one(path, length, conc, rep)
                            got[path][0].extend(r["requests"])
                            got[path][1].append(r["wall_s"])
                            got[path][2].append(sum(q["tokens"] for q in r["requests"]))
                    if a.part == "gateway":
                        trace = await http_post(port, "/bench/trace", {}, API_KEY, False)
                        join_trace([q for reqs, _, _ in got.values() for q in reqs], trace)
                    for path, (reqs, walls, toks) in got.items():
                        if not reqs:
                            continue
                        row = {"shape": shape, "prompt_len": length, "concurrency": conc, "path": path}
                        row |= summarize(reqs, walls, toks)
                        result["runs"].append(row)
                        print(json.dumps({k: v for k, v in row.items() if k not in ("each", "ttft_ms")}), flush=True)
                    save()

        asyncio.run(drive())
    finally:
        stop(proc)
    if a.part == "gateway":
        gateway_ttfts(result["runs"], log.read_text(errors="replace"))
    save()
    print(table([result]))
    print(hop_report([result]))
    return 0


def join_trace(reqs: list[dict[str, Any]], trace: dict[str, Any]) -> None:
    """Each request gets its hops (ms from its send: `hops_ms`) and the GC pauses that began
    between its send and its first output (`gc_ms`, `gc_gen`: the oldest generation collected)."""
    events = trace["events"]
    for r in reqs:
        t0 = r.pop("t0")
        hops: dict[str, float] = {}
        for name, t in events.get(r["rid"], []):
            hops.setdefault(name, round(1000 * (t - t0), 3))
        r["hops_ms"] = hops
        end = t0 + hops.get("first_out", 1000 * r["ttft_s"]) / 1000
        pauses = [(d, g) for start, d, g in trace["gc"] if t0 <= start < end]
        r["gc_ms"] = round(1000 * sum(d for d, _ in pauses), 3)
        r["gc_gen"] = max((g for _, g in pauses), default=None)


def gateway_ttfts(rows: list[dict[str, Any]], log: str) -> None:
    """Each sparkgate row gets the gateway's own TTFT p50 from its request log (`ttft_ms`: from its
    outermost middleware to the engine's first output), matched by the case's x-request-id."""
    got: dict[tuple[int, int], list[float]] = {}  # (prompt, concurrency) -> ttft_ms
    for m in re.finditer(r"request_id=sparkgate-(\d+)-(\d+)-(\d+)-\d+ .*? ttft_ms=([\d.]+)", log):
        if m[3] != "99":  # the profiled batches
            got.setdefault((int(m[1]), int(m[2])), []).append(float(m[4]))
    for r in rows:
        if r["path"] == "sparkgate" and (xs := got.get((r["prompt_len"], r["concurrency"]))):
            r["gateway_ttft_p50_ms"] = round(statistics.median(xs), 2)
            r["gateway_ttft_mean_ms"] = round(statistics.fmean(xs), 2)


async def profile(dest: Path, pid: int, case: Any, times: int, rate: int) -> None:
    """py-spy (non-blocking, so the gateway is not paused) on the gateway process during `times`
    batches of one case; every thread, idle samples left out, each stack under its thread."""
    exe = shutil.which("py-spy") or next(iter(Path("/tmp/site").glob("**/bin/py-spy")), None)
    if exe is None:
        print("py-spy not found: no profile", flush=True)
        return
    spy = subprocess.Popen(
        [
            str(exe),
            "record",
            "--nonblocking",
            "--threads",
            "-r",
            str(rate),
            "-f",
            "raw",
            "-o",
            str(dest),
            "-p",
            str(pid),
        ]
    )
    await asyncio.sleep(1.0)  # py-spy attaches
    for _ in range(times):
        await case()
    spy.send_signal(signal.SIGINT)
    spy.wait(60)


# --------------------------------------------------------------------------- table


def table(parts: list[dict[str, Any]], stat: str = "p50") -> str:
    """One row per shape, prompt and concurrency: output tok/s as a ratio to direct, TTFT p50 added
    to direct's (ms), and each path's decode rate per stream; with the HTTP floor, sparkgate's TTFT
    p50 minus the floor's; with the gateway's request log, its own TTFT p50 minus direct's.
    `stat` "mean" compares mean TTFTs instead (the direct TTFT column then holds direct's mean)."""
    ttft, gw = f"ttft_{stat}_ms", f"gateway_ttft_{stat}_ms"
    rows = [r for p in parts for r in p["runs"]]
    cases = sorted({(r["shape"], r["prompt_len"], r["concurrency"]) for r in rows})
    order = ("direct", "adapter", "sparkgate", "http_floor", "vllm_server")
    paths = [p for p in order if any(r["path"] == p for r in rows)]
    by = {(r["shape"], r["prompt_len"], r["concurrency"], r["path"]): r for r in rows}
    others = [p for p in paths if p != "direct"]
    floor = "http_floor" in paths and "sparkgate" in paths
    logged = any(gw in r for r in rows)
    head = ["shape", "prompt", "conc.", "direct tok/s", *[f"{p} x" for p in others], f"direct TTFT {stat} ms"]
    head += [f"{p} +ms" for p in others]
    head += ["sparkgate - floor ms"] * floor + ["gateway log TTFT - direct ms"] * logged
    head += ["decode tok/s/stream " + " / ".join(paths)]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for shape, length, conc in cases:
        d = by.get((shape, length, conc, "direct"))
        cells = [shape, str(length), str(conc), f"{d['output_tok_s']:.1f}" if d else "-"]
        for p in others:
            r = by.get((shape, length, conc, p))
            cells.append(f"{r['output_tok_s'] / d['output_tok_s']:.3f}" if r and d else "-")
        cells.append(f"{d[ttft]:.1f}" if d else "-")
        for p in others:
            r = by.get((shape, length, conc, p))
            cells.append(f"{r[ttft] - d[ttft]:+.1f}" if r and d else "-")
        g, f = by.get((shape, length, conc, "sparkgate")), by.get((shape, length, conc, "http_floor"))
        if floor:
            cells.append(f"{g[ttft] - f[ttft]:+.1f}" if g and f else "-")
        if logged:
            gl = g.get(gw) if g else None
            cells.append(f"{gl - d[ttft]:+.1f}" if gl is not None and d else "-")
        decode = [by.get((shape, length, conc, p), {}).get("decode_tok_s_per_stream") for p in paths]
        cells.append(" / ".join("-" if x is None else f"{x:.1f}" for x in decode))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


HOPS = ("asgi_in", "body_in", "prepare_in", "prepare_out", "admit_out", "response_start", "add_in", "add_out")
HOPS += ("first_out", "first_send")


def bootstrap(xs: list[float], stat: Any, n: int = 2000) -> tuple[float, float]:
    """A 95% percentile interval of `stat` over resamples of `xs` (seeded: the same every run)."""
    rng = random.Random(0)
    got = sorted(stat(rng.choices(xs, k=len(xs))) for _ in range(n))
    return got[int(0.025 * n)], got[int(0.975 * n) - 1]


def hop_report(parts: list[dict[str, Any]]) -> str:
    """Where each path's TTFT goes (medians, ms from the client's send; direct: from its call),
    then, for c=1, each path's TTFT with 95% intervals and the per-repetition differences."""
    rows = [r for p in parts for r in p["runs"] if any("hops_ms" in e for e in r.get("each", []))]
    if not rows:
        return ""
    out = ["| shape | prompt | conc. | path | n | " + " | ".join(HOPS) + " | client TTFT | GC ms mean |"]
    out.append("|" + "---|" * (len(HOPS) + 7))
    for r in rows:
        each = r["each"]

        def med(name: str, each: list[dict[str, Any]] = each) -> str:
            xs = [e["hops_ms"][name] for e in each if name in e.get("hops_ms", {})]
            return f"{statistics.median(xs):.2f}" if xs else "-"

        gcs = [e.get("gc_ms", 0.0) for e in each]
        ttft = statistics.median(e["ttft_ms"] for e in each)
        cells = [r["shape"], str(r["prompt_len"]), str(r["concurrency"]), r["path"], str(len(each))]
        cells += [med(h) for h in HOPS] + [f"{ttft:.2f}", f"{statistics.fmean(gcs):.2f}"]
        out.append("| " + " | ".join(cells) + " |")

    def value(e: dict[str, Any], metric: str) -> float | None:
        """A request's TTFT, the time to one of its hops, or one of TTFT's three parts: the time
        to vLLM's add_request ("to engine"), from there to the first output ("engine": the same
        work on every path), and from the first output to the client's first text ("after")."""
        hops = e.get("hops_ms", {})
        if metric == "client TTFT":
            return float(e["ttft_ms"])
        if metric == "engine":
            return hops["first_out"] - hops["add_in"] if "first_out" in hops and "add_in" in hops else None
        if metric == "after":
            return e["ttft_ms"] - hops["first_out"] if "first_out" in hops else None
        x = hops.get("add_in" if metric == "to engine" else metric)
        return None if x is None else float(x)

    def per_rep(row: dict[str, Any], metric: str) -> dict[str, float]:
        got = {}
        for e in row["each"]:
            x = value(e, metric)
            if x is not None and e["rid"]:
                got[e["rid"].split("-")[3]] = x  # path-len-conc-REP-i
        return got

    by = {(r["shape"], r["prompt_len"], r["path"]): r for r in rows if r["concurrency"] == 1}
    out += [
        "",
        "| shape | prompt | measure | path or difference | n | p50 ms [95%] | mean ms [95%] |",
        "|---|---|---|---|---|---|---|",
    ]
    for shape, length in sorted({(k[0], k[1]) for k in by}):
        for metric in ("client TTFT", "to engine", "engine", "after"):
            series = {
                p: per_rep(by[(shape, length, p)], metric)
                for p in ("direct", "http_floor", "sparkgate")
                if (shape, length, p) in by
            }
            lines = [(p, list(v.values())) for p, v in series.items()]
            for a_, b_ in (("sparkgate", "direct"), ("sparkgate", "http_floor"), ("http_floor", "direct")):
                if a_ in series and b_ in series:
                    common = sorted(set(series[a_]) & set(series[b_]))
                    lines.append((f"{a_} - {b_}", [series[a_][k] - series[b_][k] for k in common]))
            for name, xs in lines:
                if not xs:
                    continue
                lo, hi = bootstrap(xs, statistics.median)
                mlo, mhi = bootstrap(xs, statistics.fmean)
                p50 = f"{statistics.median(xs):.2f} [{lo:.2f}, {hi:.2f}]"
                mean = f"{statistics.fmean(xs):.2f} [{mlo:.2f}, {mhi:.2f}]"
                out.append(f"| {shape} | {length} | {metric} | {name} | {len(xs)} | {p50} | {mean} |")
    return "\n".join(out)


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--serve-gateway":
        serve_gateway(sys.argv[2])
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path, nargs="?")
    ap.add_argument("--shape", choices=sorted(SHAPE_FILES), default="35b-a3b")
    ap.add_argument("--part", choices=["gateway", "vllm"], default="gateway")
    ap.add_argument("--lens", default="2048,32768")
    ap.add_argument("--conc", default="1,4,8")
    ap.add_argument("--reps", default="", help="repetitions: LEN:N or LENxCONC:N, e.g. 2048:10,32768:1,32768x1:3")
    ap.add_argument("--adapter", action="store_true", help="also time sparkgate's engine adapter alone")
    ap.add_argument("--adapter-lens", type=lambda s: [int(x) for x in s.split(",")], default=[2048])
    ap.add_argument("--profile", action="store_true", help="py-spy on the gateway during --profile-case first")
    ap.add_argument("--profile-case", default="2048x8:3", help="LENxCONC:BATCHES of sparkgate requests profiled")
    ap.add_argument("--profile-rate", type=int, default=250, help="py-spy samples per second")
    ap.add_argument("--max-tokens", type=int, default=MAX_TOKENS, help="output tokens per request")
    ap.add_argument("--tag", default="", help="appended to the result file's name")
    ap.add_argument("--start-timeout", type=float, default=420)
    ap.add_argument("--budget", type=float, default=0, help="seconds from start after which cases are skipped")
    ap.add_argument("--table", nargs="+", type=Path, help="merge these result files and print the table")
    ap.add_argument("--stat", choices=["p50", "mean"], default="p50", help="the table's TTFT statistic")
    a = ap.parse_args()
    if a.table:
        parts = [json.loads(p.read_text()) for p in a.table]
        print(table(parts, a.stat))
        print(hop_report(parts))
        return 0
    if a.out is None:
        ap.error("OUT is required")
    return run_part(a)


if __name__ == "__main__":
    sys.exit(main())
