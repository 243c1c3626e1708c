"""The gateway's fixed cost per request alone, as TensorZero and LiteLLM measure it: sparkgate
on an engine that answers at once vs LiteLLM's proxy on a mock response, side by side.

Three servers, each its own process on 127.0.0.1, each with one event loop:

- floor: a bare asyncio HTTP server that answers every request with a canned body (the
  client's and the loopback's own cost; what is above it is what a gateway adds);
- sparkgate: `sparkgate serve` on a simulated engine in instant mode (`simulated.instant`: the
  box model's steps take no wall time), auth on (a hashed key), per-key quotas on (rpm, tpm,
  daily tokens and concurrency; the in-memory store), metrics and the request log on;
- litellm: LiteLLM's proxy (its own virtualenv, .cache/litellm-venv) on `mock_response`, its
  master key (virtual keys need a Postgres database) and the deployment's rpm/tpm limits.

`sparkgate@REF` in --servers adds the gateway as of a git ref (exported with `git archive`):
a change's before and after in one run.

An open-loop client (raw HTTP/1.1 over keep-alive sockets, uvloop) sends chat completions
(max_tokens 1; with --prompt-tokens, completions of an id prompt that long) at fixed rates,
streaming and not; each request's latency counts from when it was due, not when it was sent
(no coordinated omission). Each rate runs --repeat times for every server in turn, the order
rotated, so drift in the machine's load hits all alike; the runs are pooled. Each server's
CPU time per request comes from /proc. A server sustains a rate when every request succeeds
and p99 stays under --max-p99-ms; once it is saturated (errors, or even p50 over that), it
runs no higher rate.

    python3 -m venv .cache/litellm-venv
    .cache/litellm-venv/bin/pip install 'litellm[proxy]==1.108.7' py-spy
    .venv/bin/python benchmarks/overhead.py [--servers floor,sparkgate,litellm] [--rates 10,25,...]

`--profile N` instead runs sparkgate alone under py-spy (from the same virtualenv; only the
thread holding the GIL is sampled) at --profile-rate for N requests, and prints where its
time goes per request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_process import ROOT, child, free_port, launch

KEY = "sk-bench-overhead"
LITELLM_VENV = ROOT / ".cache" / "litellm-venv"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]

FLOOR_SERVER = r"""
import asyncio, sys
import uvloop
JSON = (
    b'{"id":"x","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,"message":'
    b'{"role":"assistant","content":"Hi"},"finish_reason":"length"}],'
    b'"usage":{"prompt_tokens":15,"completion_tokens":1,"total_tokens":16}}'
)
EVENTS = [
    b'data: {"id":"x","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index":0,'
    b'"delta":{"role":"assistant","content":"Hi"},"finish_reason":"length"}]}\n\n',
    b"data: [DONE]\n\n",
]
async def serve(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            n = int(next(l.split(b":")[1] for l in head.lower().split(b"\r\n") if l.startswith(b"content-length")))
            body = await reader.readexactly(n)
            if b'"stream": true' in body or b'"stream":true' in body:
                out = [b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"]
                out += [b"%x\r\n%s\r\n" % (len(e), e) for e in EVENTS] + [b"0\r\n\r\n"]
            else:
                out = [b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"]
                out += [b"content-length: %d\r\n\r\n%s" % (len(JSON), JSON)]
            writer.write(b"".join(out))
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()
async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", int(sys.argv[1]), backlog=4096)
    print("ready", flush=True)
    await server.serve_forever()
uvloop.run(main())
"""


def sparkgate_config(port: int) -> str:
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    return f"""
server: {{host: 127.0.0.1, port: {port}, log_level: info, cache_dir: {ROOT / ".cache"}}}
auth:
  required: true
  keys:
    - {{name: bench, sha256: {digest}, rpm: 10000000, tpm: 1000000000, daily_tokens: 100000000000,
        max_concurrency: 100000}}
quotas: {{store: memory}}
admission: {{max_queued: 100000, max_queued_per_user: 100000}}
models:
  - name: sim
    path: {ROOT / "models" / "tiny-qwen3"}
    engine: simulated
    simulated: {{model: Qwen3.6-35B-A3B, instant: true}}
    max_num_seqs: 1024
    max_model_len: 32768
"""


LITELLM_CONFIG = f"""
model_list:
  - model_name: sim
    litellm_params:
      model: openai/sim
      api_key: unused
      mock_response: "Hi"
      rpm: 10000000
      tpm: 1000000000
general_settings:
  master_key: {KEY}
litellm_settings:
  telemetry: false
"""


# -- servers -------------------------------------------------------------------------------


def cpu_s(pid: int) -> float:
    """The process's CPU time so far (user + system, every thread)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child_pid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])


@contextlib.contextmanager
def floor_server(tmp: Path) -> Iterator[tuple[int, int]]:
    port = free_port()
    with child(
        [sys.executable, "-c", FLOOR_SERVER, str(port)], tmp / "floor.log", b"ready"
    ) as pid:  # it prints "ready"
        yield port, pid


@contextlib.contextmanager
def sparkgate_server(tmp: Path) -> Iterator[tuple[int, int]]:
    port = free_port()
    config = tmp / "sparkgate.yaml"
    config.write_text(sparkgate_config(port))
    with launch(config, tmp / "sparkgate.log", port) as gw:
        yield port, gw.pid


@contextlib.contextmanager
def sparkgate_at(tmp: Path, ref: str) -> Iterator[tuple[int, int]]:
    """sparkgate as of git `ref` (exported next to the logs), for before/after in one run."""
    port = free_port()
    config = tmp / f"sparkgate-{ref.replace('/', '_')}.yaml"
    config.write_text(sparkgate_config(port))
    with launch(config, tmp / f"{config.stem}.log", port, ref=ref, startup_timeout_s=300) as gw:
        yield port, gw.pid


@contextlib.contextmanager
def litellm_server(tmp: Path) -> Iterator[tuple[int, int]]:
    binary = LITELLM_VENV / "bin" / "litellm"
    if not binary.exists():
        raise SystemExit(f"{binary} is missing; see this script's docstring")
    port = free_port()
    config = tmp / "litellm.yaml"
    config.write_text(LITELLM_CONFIG)
    # The bundled model-cost map: this machine reaches no GitHub.
    env = os.environ | {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False"}
    args = [str(binary), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    url = f"http://127.0.0.1:{port}/health/liveliness"
    with child(args, tmp / "litellm.log", url, env=env, startup_timeout_s=300) as pid:
        yield port, pid


# -- the open-loop client ----------------------------------------------------------------------


class HttpError(Exception):
    pass


@dataclass
class Client:
    """Keep-alive HTTP/1.1 connections to one server, opened as needed, reused when idle."""

    port: int
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = field(default_factory=list)
    opened: int = 0

    async def post(self, path: str, body: bytes) -> None:
        conn = self.idle.pop() if self.idle else None
        if conn is None:
            conn = await asyncio.open_connection("127.0.0.1", self.port)
            self.opened += 1
        reader, writer = conn
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        try:
            writer.write(head + body)
            status_and_headers = await reader.readuntil(b"\r\n\r\n")
            lines = status_and_headers.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ", 2)[1])
            headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)}
            if "content-length" in headers:
                payload = await reader.readexactly(int(headers["content-length"]))
            elif headers.get("transfer-encoding") == "chunked":
                parts = []
                while True:
                    size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                    if size == 0:
                        await reader.readuntil(b"\r\n")
                        break
                    parts.append((await reader.readexactly(size + 2))[:-2])
                payload = b"".join(parts)
            else:
                raise HttpError(f"no length in {headers}")
        except BaseException:
            writer.close()
            raise
        if headers.get("connection") == "close":
            writer.close()
        else:
            self.idle.append(conn)
        if status != 200:
            raise HttpError(f"{status}: {payload[:200]!r}")

    def close(self) -> None:
        for _, w in self.idle:
            w.close()
        self.idle.clear()


@dataclass(frozen=True)
class Level:
    server: str
    stream: bool
    rate: float
    sent: int
    errors: int
    latencies: list[float]  # seconds, of the successful requests
    connections: int
    first_error: str
    cpu_s: float  # the server's CPU time over the level

    @property
    def cpu_ms(self) -> float:
        """The server's CPU time per request."""
        return self.cpu_s / self.sent * 1e3

    def pct(self, q: float) -> float:
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3 if xs else float("nan")


def body_for(stream: bool, prompt_tokens: int) -> tuple[str, bytes]:
    """A chat, or with `prompt_tokens` a completion whose prompt is that many token ids."""
    if not prompt_tokens:
        return "/v1/chat/completions", json.dumps(
            {"model": "sim", "messages": MESSAGES, "max_tokens": 1, "stream": stream}
        ).encode()
    ids = [(i * 7919) % 20000 + 100 for i in range(prompt_tokens)]  # ordinary words of Qwen's vocabulary
    return "/v1/completions", json.dumps({"model": "sim", "prompt": ids, "max_tokens": 1, "stream": stream}).encode()


async def open_loop(
    port: int, pid: int, server: str, stream: bool, rate: float, seconds: float, prompt_tokens: int = 0
) -> Level:
    """`rate` requests a second for `seconds` (100 requests at least), each sent when due
    whatever the others do."""
    client = Client(port)
    path, body = body_for(stream, prompt_tokens)
    n = max(100, int(rate * seconds))
    lat: list[float] = []
    errors: list[str] = []

    async def one(due: float) -> None:
        try:
            async with asyncio.timeout(15):
                await client.post(path, body)
            lat.append(time.perf_counter() - due)
        except Exception as e:
            errors.append(f"{type(e).__name__}: {e}")

    # perf_counter, not the loop's clock: uvloop's ticks in whole milliseconds.
    tasks = []
    cpu0 = cpu_s(pid)
    t0 = time.perf_counter() + 0.02
    i = 0
    while i < n:
        now = time.perf_counter()
        while i < n and t0 + i / rate <= now:
            tasks.append(asyncio.ensure_future(one(t0 + i / rate)))
            i += 1
        if i < n:
            await asyncio.sleep(max(0.0, t0 + i / rate - time.perf_counter()))
    await asyncio.gather(*tasks)
    cpu = cpu_s(pid) - cpu0
    client.close()
    return Level(server, stream, rate, n, len(errors), lat, client.opened, errors[0] if errors else "", cpu)


async def run_levels(
    ports: dict[str, tuple[int, int]],
    rates: list[float],
    seconds: float,
    max_p99_ms: float,
    prompt_tokens: int,
    repeat: int,
) -> list[Level]:
    """Each rate, streaming and not, `repeat` times for every server in turn (the order rotated
    each time, so drift in the machine's load hits all alike); a level's repeats pooled."""
    out: list[Level] = []
    failed: set[tuple[str, bool]] = set()
    for name, (port, pid) in ports.items():  # warm up: first-request paths, caches, connections
        for stream in (False, True):
            await open_loop(port, pid, name, stream, 100, 1.0, prompt_tokens)
    names = list(ports)
    for rate in rates:
        for stream in (False, True):
            runs: dict[str, list[Level]] = {n: [] for n in names if (n, stream) not in failed}
            for r in range(repeat):
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    if name in runs:
                        port, pid = ports[name]
                        runs[name].append(await open_loop(port, pid, name, stream, rate, seconds, prompt_tokens))
                        await asyncio.sleep(0.5)  # let the server settle (and collect) before the next
            for name, levels in runs.items():
                level = Level(
                    name,
                    stream,
                    rate,
                    sum(lv.sent for lv in levels),
                    sum(lv.errors for lv in levels),
                    [x for lv in levels for x in lv.latencies],
                    max(lv.connections for lv in levels),
                    next((lv.first_error for lv in levels if lv.errors), ""),
                    sum(lv.cpu_s for lv in levels),
                )
                out.append(level)
                ok = level.errors == 0 and level.pct(0.99) <= max_p99_ms
                print(
                    f"  {name:<9} {'stream' if stream else 'json':<6} {rate:>6.0f}/s  p50 {level.pct(0.5):7.2f} ms"
                    f"  p99 {level.pct(0.99):8.2f} ms  cpu {level.cpu_ms:.2f} ms/req  errors {level.errors}"
                    f"  conns {level.connections}"
                    + ("" if ok else "  <- not sustained")
                    + (f"  ({level.first_error[:120]})" if level.errors else ""),
                    flush=True,
                )
                if level.errors or level.pct(0.5) > max_p99_ms:  # saturated, not a noisy tail: stop
                    failed.add((name, stream))
    return out


def report(levels: list[Level], servers: list[str], max_p99_ms: float, args: argparse.Namespace) -> None:
    print()
    print(
        f"{args.prompt_tokens or 'chat'} {'id prompt' if args.prompt_tokens else 'completions'}, max_tokens 1, open"
        f" loop, {args.repeat} x {args.seconds:g} s a level (100 requests at least each); latency from when each"
        f" request was due;"
        f" sustained = no errors and p99 <= {max_p99_ms:g} ms; added = server - floor at the same rate"
    )
    by = {(lv.server, lv.stream, lv.rate): lv for lv in levels}
    others = [s for s in servers if s not in ("floor", "sparkgate")]
    for stream in (False, True):
        print(f"\n{'streaming' if stream else 'non-streaming'}:")
        print(
            "| req/s | "
            + " | ".join(f"{s} p50 / p99 ms" for s in servers)
            + "".join(f" | added p99: {o} / sparkgate" for o in others)
            + " | CPU ms / request: "
            + " / ".join(servers)
            + " |"
        )
        print("|---|" + "---|" * (len(servers) + len(others) + 1))
        for rate in sorted({lv.rate for lv in levels}):
            cells: list[str] = []
            cpu_cells: list[str] = []
            for s in servers:
                lv = by.get((s, stream, rate))
                if lv is None:
                    cells.append("-")
                    cpu_cells.append("-")
                    continue
                mark = "" if lv.errors == 0 and lv.pct(0.99) <= max_p99_ms else " ✗"
                err = f" ({lv.errors} errors)" if lv.errors else ""
                cells.append(f"{lv.pct(0.5):.2f} / {lv.pct(0.99):.2f}{err}{mark}")
                cpu_cells.append(f"{lv.cpu_ms:.2f}")
            floor, sg = by.get(("floor", stream, rate)), by.get(("sparkgate", stream, rate))
            for o in others:
                other = by.get((o, stream, rate))
                if floor and sg and other and sg.pct(0.99) > floor.pct(0.99):
                    added_sg, added_o = sg.pct(0.99) - floor.pct(0.99), other.pct(0.99) - floor.pct(0.99)
                    cells.append(f"{added_o / added_sg:.1f}x ({added_o:.2f} vs {added_sg:.2f} ms)")
                else:
                    cells.append("-")
            print(f"| {rate:,.0f} | " + " | ".join(cells) + f" | {' / '.join(cpu_cells)} |")
        sustained = []
        for s in servers:
            ok = [
                lv.rate
                for lv in levels
                if lv.server == s and lv.stream == stream and lv.errors == 0 and lv.pct(0.99) <= max_p99_ms
            ]
            sustained.append(f"{s} {max(ok):,.0f}" if ok else f"{s} none")
        print(f"highest rate sustained (req/s): {', '.join(sustained)}")


# -- the profile ---------------------------------------------------------------------------------

# Where a sampled stack's time goes: the first rule matched from the leaf up names it. Rules
# are (category, a path fragment, a function name or None for any).
RULES: list[tuple[str, str, str | None]] = [
    ("tokenize (prompt -> ids)", "policies/tokens.py", "encode_text"),
    ("decode id prompts (from_ids)", "policies/tokens.py", "from_ids"),
    ("chat template", "", "apply_chat_template"),
    ("tokenize (prompt -> ids)", "policies/tokens.py", "render_chat"),
    ("normalize (prefix)", "policies/prefix.py", None),
    ("normalize (prefix)", "gateway/text/templates.py", "history_prefix"),
    ("logging", "logging/__init__.py", None),
    ("logging", "gateway/request_log.py", None),
    ("logging", "gateway/logs.py", None),
    ("metrics", "gateway/metrics.py", None),
    ("metrics", "prometheus_client", None),
    ("auth", "gateway/auth.py", None),
    ("auth", "gateway/failed_auth.py", None),
    ("quota", "gateway/quota/", None),
    ("quota", "policies/quotas.py", None),
    ("admission", "gateway/admission.py", None),
    ("admission", "policies/admission", None),
    ("admission (KV footprint)", "policies/kv.py", None),
    ("routing", "gateway/router.py", None),
    ("engine (simulated)", "engine_adapter/", None),
    ("JSON / SSE encoding", "gateway/http/openai/output.py", None),
    ("JSON / SSE encoding", "json/", None),
    ("JSON / SSE encoding", "fastapi/encoders.py", None),
    ("prepare (other)", "gateway/lifecycle/prepare.py", None),
    ("run (other)", "gateway/lifecycle/", None),
    ("http handler (other)", "gateway/http/", None),
    ("gateway (other)", "gateway/", None),
    ("request validation (pydantic)", "pydantic", None),
    ("FastAPI / Starlette", "fastapi/", None),
    ("FastAPI / Starlette", "starlette/", None),
    ("HTTP server (uvicorn, httptools)", "uvicorn/", None),
    ("event loop", "asyncio/", None),
    ("event loop", "uvloop", None),
]
# Stacks of the start (loading, verifying the tokenizer) and of idle threads: not a request's.
STARTUP = (
    "_find_and_load",
    "factory (gateway/cli.py",
    "load_tokenizer",
    "_ordinary_ids",
    "wrap (gateway/text/tokenizer.py",
    "lifespan",
)
IDLE_LEAVES = ("Condition.wait", "Queue.get", "_worker (concurrent/futures/thread.py:81)", "Event.wait")


def categorize(stack: str) -> str | None:
    frames = stack.split(";")
    if any(s in f for f in frames for s in STARTUP) or frames[-1].startswith(IDLE_LEAVES):
        return None
    if frames[-1].startswith("Runner.run (asyncio/runners.py"):
        return "event loop (uvloop's C code: I/O, callbacks)"
    for f in reversed(frames):
        name, _, where = f.partition(" (")
        for category, path, func in RULES:
            if path in where and (func is None or name == func):
                return category
    return "other"


def profile(tmp: Path, requests: int, rate: float, stream: bool, prompt_tokens: int) -> None:
    spy = LITELLM_VENV / "bin" / "py-spy"
    if not spy.exists():
        raise SystemExit(f"{spy} is missing: {LITELLM_VENV}/bin/pip install py-spy")
    port = free_port()
    config = tmp / "sparkgate.yaml"
    config.write_text(sparkgate_config(port))
    raw = tmp / "profile.txt"
    sample_hz = 500
    # --gil: samples of the thread holding the GIL only (py-spy cannot tell idle threads here:
    # without it a thread blocked in epoll or on a lock counts as busy).
    args = [str(spy), "record", "--gil", "-r", str(sample_hz), "-f", "raw", "-o", str(raw), "--"]
    args += [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config)]
    with child(args, tmp / "profile.log", f"http://127.0.0.1:{port}/ready", startup_timeout_s=300) as spy_pid:
        import uvloop

        level = uvloop.run(
            open_loop(port, child_pid(spy_pid), "sparkgate", stream, rate, requests / rate, prompt_tokens)
        )
    print(
        f"profile load: p50 {level.pct(0.5):.2f} ms, p99 {level.pct(0.99):.2f} ms, errors {level.errors}, "
        f"gateway CPU {level.cpu_ms:.2f} ms a request (under py-spy)"
    )
    counts: Counter[str] = Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        category = categorize(stack)
        if category is not None:
            counts[category] += int(n)
    total = sum(counts.values())
    us = 1e6 / sample_hz / requests
    kind = ("streaming " if stream else "non-streaming ") + (
        f"completions of {prompt_tokens} prompt ids" if prompt_tokens else "chats"
    )
    print(f"sparkgate GIL time per request: {requests} {kind} at {rate:g}/s, py-spy at {sample_hz} Hz")
    print("| where | µs / request | share |")
    print("|---|---|---|")
    for category, samples in counts.most_common():
        print(f"| {category} | {samples * us:,.0f} | {samples / total:.1%} |")
    print(f"| total | {total * us:,.0f} | |")


# -- main ------------------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default="10,25,50,100,250,500,1000,2000")
    p.add_argument("--prompt-tokens", type=int, default=0, help="completions of an id prompt this long, not chats")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--repeat", type=int, default=3, help="runs of each level per server, interleaved, pooled")
    p.add_argument("--max-p99-ms", type=float, default=50.0)
    # "sparkgate@REF": the gateway as of a git ref too (a cut's before and after in one run).
    p.add_argument("--servers", default="floor,sparkgate,litellm")
    p.add_argument("--logs", help="keep the servers' configs and logs in this directory")
    p.add_argument("--profile", type=int, default=0, help="profile sparkgate alone for this many requests")
    p.add_argument("--profile-rate", type=float, default=300)
    p.add_argument("--profile-stream", action="store_true")
    a = p.parse_args()
    import uvloop

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(a.logs or d)
        tmp.mkdir(parents=True, exist_ok=True)
        if a.profile:
            profile(tmp, a.profile, a.profile_rate, a.profile_stream, a.prompt_tokens)
            return
        servers = a.servers.split(",")
        starters = {"floor": floor_server, "sparkgate": sparkgate_server, "litellm": litellm_server}
        with contextlib.ExitStack() as stack:
            ports = {}
            for s in servers:
                ref = s.partition("@")[2]
                ports[s] = stack.enter_context(sparkgate_at(tmp, ref) if ref else starters[s](tmp))
            rates = [float(r) for r in a.rates.split(",")]
            levels = uvloop.run(run_levels(ports, rates, a.seconds, a.max_p99_ms, a.prompt_tokens, a.repeat))
        report(levels, servers, a.max_p99_ms, a)


if __name__ == "__main__":
    main()
