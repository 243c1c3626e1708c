"""sparkgate vs vLLM's own OpenAI server vs LiteLLM's proxy, on the same CPU engine (issue 19).

Run from the repository root (the models must exist: `make models`; LiteLLM in its own
virtualenv: `python3 -m venv .cache/litellm-venv && .cache/litellm-venv/bin/pip install
'litellm[proxy]==1.108.7'`):

    .venv/bin/python benchmarks/vs_vllm_server.py [--quick] [--rounds 3] [--requests 64] [--out r.json]
    # part 2 for sparkgate alone, on a full run's capacity and SLO, its fair share changed:
    .venv/bin/python benchmarks/vs_vllm_server.py --overload-only 6.0,0.5,0.0458 --fair-share '{"idle_s": 3}'
    # the TTFT the gateway adds over the engine, a git ref's gateway beside the working tree's:
    .venv/bin/python benchmarks/vs_vllm_server.py --systems direct,sparkgate@cf78869,sparkgate \
        --max-tokens 1 --rounds 3 --requests 128 --skip-overload

The same engine settings (config/default.yaml's first model) four ways:
  (a) direct: `VllmLocalEngine` (AsyncLLM) in this process, prompt pre-tokenized: the limit;
  (b) sparkgate: `sparkgate serve` with keys, per-key quotas (rpm/tpm/daily/concurrency),
      admission, routing and prompt normalization on;
  (c) vllm: `python -m vllm.entrypoints.openai.api_server` (the CPU build in .venv), --api-key;
  (d) litellm: LiteLLM's proxy in front of (c), its master key and the deployment's rpm/tpm
      limits (virtual keys need a Postgres database);
  and sparkgate@REF: (b) as of a git ref (exported with `git archive`, as overhead.py and
      traffic_drift.py do: benchmarks/gateway_process.py), for a change's before and after in
      one run; part 1 only (with --skip-overload).

Part 1, closed loop: concurrency 1, 8 and 32, streaming and not, 1-token and 64-token answers
(--max-tokens; ignore_eos, so every answer has exactly that many tokens: a shorter one is an
error). Each round runs every cell for every system (the systems' order rotates per round) so
the machine's drift hits all alike; medians over rounds. TTFT: to the first content chunk (not
streaming: the whole response); with (a) in the run, a last table gives each HTTP system's TTFT
p50 less (a)'s: the TTFT it adds over the engine. Server CPU: the front process's user+system
time per request (the engine core, a child process, is not counted; for (d) LiteLLM's and (c)'s
together).

Part 2, overload (b, c, d): open-loop Poisson arrivals at 4x what (a) sustains (streaming,
64-token answers, concurrency 32), from a heavy user (15/16 of it) and a light user (1/16);
goodput under a TTFT+TPOT SLO, the light user's TTFT (and alone, at its own rate, first),
rejections and vLLM preemptions. sparkgate runs config/default.yaml's admission settings (its
fair share), and a second instance for this part with the queue timeout at the TTFT SLO and
max_queued at 4 x max_num_seqs (an operator's overload settings); vLLM and LiteLLM have no such
knobs.

Markdown tables go to stdout, progress to stderr. Exits non-zero when any request failed
where none should (part 1: any; part 2: one without an HTTP answer: a system's own error
answers under overload are counted in its row).
"""

from __future__ import annotations

import os
import sys

# Run as a script, Python puts benchmarks/ first on sys.path: the standard library first, then the repository root.
sys.path.insert(0, os.path.dirname(os.__file__))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse
import asyncio
import contextlib
import hashlib
import json
import math
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks.gateway_process import child, free_port, launch
from benchmarks.overload import poisson_arrivals
from gateway import runtime_env

ROOT = Path(__file__).resolve().parent.parent
LITELLM_VENV = ROOT / ".cache" / "litellm-venv"
KEY = "sk-bench-vs-vllm"
LIGHT_KEY = "sk-bench-vs-vllm-light"
MESSAGES = [{"role": "user", "content": "Write a short story about a lighthouse keeper and a storm."}]
SYSTEMS = ("direct", "sparkgate", "vllm", "litellm")
CONCURRENCY = (1, 8, 32)
MAX_TOKENS = (1, 64)
OVERLOAD_TOKENS = 64
SEED = 20261202
STARTUP_TIMEOUT_S = 600


def log(msg: str) -> None:
    print(f"[vs {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse_systems(text: str) -> list[str]:
    """--systems, in a fixed order: direct, each sparkgate@REF as given, then the rest of SYSTEMS."""
    asked = [s for s in text.split(",") if s]
    unknown = [s for s in asked if s not in SYSTEMS and not (s.startswith("sparkgate@") and len(s) > 10)]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown systems {unknown}: expected {', '.join(SYSTEMS)} or sparkgate@REF")
    refs = list(dict.fromkeys(s for s in asked if s.startswith("sparkgate@")))
    return [s for s in SYSTEMS[:1] if s in asked] + refs + [s for s in SYSTEMS[1:] if s in asked]


def int_list(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def default_config() -> dict[str, Any]:
    cfg: dict[str, Any] = yaml.safe_load((ROOT / "config" / "default.yaml").read_text())
    return cfg


def engine_model() -> dict[str, Any]:
    """config/default.yaml's first model, its path made absolute: every system gets these settings."""
    model: dict[str, Any] = dict(default_config()["models"][0])
    model["path"] = str((ROOT / model["path"]).resolve())
    model.pop("aliases", None)
    return model


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def sparkgate_config(
    model: dict[str, Any], port: int, admission: dict[str, Any], slo: Slo | None = None
) -> dict[str, Any]:
    """Keys with quotas, admission, routing and prompt normalization on. Without an SLO (the closed-loop
    sweep, where no request may fail) the keys' latency class is "batch" (a 600 s deadline), else routing
    would turn away what its model predicts misses the interactive class; with one (overload), that
    class is the SLO, so routing turns away what would miss it anyway."""
    limits: dict[str, Any] = {
        "rpm": 1_000_000,
        "tpm": 1_000_000_000,
        "daily_tokens": 100_000_000_000,
        "max_concurrency": 1000,
        "slo_class": "batch" if slo is None else "interactive",
    }
    routing: dict[str, Any] = {"enabled": True}
    if slo is not None:
        routing["classes"] = {
            "interactive": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s},
            "batch": {"deadline_s": 600.0},
        }
    return {
        "server": {"host": "127.0.0.1", "port": port, "log_level": "warning", "cache_dir": str(ROOT / ".cache")},
        "auth": {
            "required": True,
            "keys": [
                {"name": "heavy", "sha256": digest(KEY), **limits},
                {"name": "light", "sha256": digest(LIGHT_KEY), **limits},
            ],
        },
        "quotas": {"store": "memory"},
        # config/default.yaml's admission (its fair share), with this run's settings over it.
        "admission": default_config().get("admission", {}) | admission,
        "routing": routing,
        "models": [{**model, "prefix": {"normalize": True}}],
    }


# -- processes ------------------------------------------------------------------------------


def vllm_server(model: dict[str, Any], port: int, tmp: Path) -> contextlib.AbstractContextManager[tuple[int, int]]:
    from gateway.settings import ModelSettings

    m = ModelSettings(**model)
    args = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        m.path,
        "--served-model-name",
        m.name,
        "--dtype",
        m.dtype,
        "--max-model-len",
        str(m.max_model_len),
        "--max-num-seqs",
        str(m.max_num_seqs),
        "--enforce-eager" if m.enforce_eager else "--no-enforce-eager",
        "--enable-prefix-caching" if m.enable_prefix_caching else "--no-enable-prefix-caching",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--api-key",
        KEY,
        "--uvicorn-log-level",
        "warning",
        "--disable-uvicorn-access-log",
    ]
    if m.kv_cache_bytes is not None:
        args += ["--kv-cache-memory-bytes", str(m.kv_cache_bytes)]
    env = dict(os.environ)
    if m.cpu_cores is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = m.cpu_cores

    @contextlib.contextmanager
    def run() -> Iterator[tuple[int, int]]:
        log(f"vllm: starting its OpenAI server on :{port}")
        with child(
            args, tmp / "vllm.log", f"http://127.0.0.1:{port}/health", env=env, startup_timeout_s=STARTUP_TIMEOUT_S
        ) as pid:
            yield port, pid

    return run()


@contextlib.contextmanager
def litellm_server(name: str, vllm_port: int, tmp: Path) -> Iterator[tuple[int, int]]:
    binary = LITELLM_VENV / "bin" / "litellm"
    if not binary.exists():
        raise SystemExit(f"{binary} is missing; see this script's docstring")
    port = free_port()
    config = {
        "model_list": [
            {
                "model_name": name,
                "litellm_params": {
                    "model": f"openai/{name}",
                    "api_base": f"http://127.0.0.1:{vllm_port}/v1",
                    "api_key": KEY,
                    "rpm": 1_000_000,
                    "tpm": 1_000_000_000,
                },
            }
        ],
        "general_settings": {"master_key": KEY},
        "litellm_settings": {"telemetry": False, "set_verbose": False},
    }
    path = tmp / "litellm.yaml"
    path.write_text(yaml.safe_dump(config))
    # The bundled model-cost map: this machine reaches no GitHub.
    env = os.environ | {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False", "LITELLM_LOG": "ERROR"}
    args = [str(binary), "--config", str(path), "--host", "127.0.0.1", "--port", str(port)]
    log(f"litellm: starting its proxy on :{port} in front of :{vllm_port}")
    url = f"http://127.0.0.1:{port}/health/liveliness"
    with child(args, tmp / "litellm.log", url, env=env, startup_timeout_s=STARTUP_TIMEOUT_S) as pid:
        yield port, pid


def cpu_s(pid: int) -> float:
    """A process's CPU time so far (user + system, all threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- requests -------------------------------------------------------------------------------


@dataclass
class Result:
    """One request as its client saw it."""

    user: str
    arrival_s: float
    status: int  # 200, the HTTP status, or 0 (an exception)
    error: str = ""
    tokens: int = 0
    ttft_s: float | None = None
    tpot_s: float | None = None
    latency_s: float = 0.0

    def ok(self, want: int) -> bool:
        return self.status == 200 and not self.error and self.tokens == want


class Target:
    """One system, as requests and counters."""

    name: str
    pids: tuple[int, ...] = ()

    async def send(self, max_tokens: int, stream: bool, user: str = "heavy") -> Result:
        raise NotImplementedError

    async def preemptions(self) -> int:
        raise NotImplementedError

    def cpu(self) -> float:
        return sum(cpu_s(p) for p in self.pids)


class Direct(Target):
    name = "direct"

    def __init__(self, model: dict[str, Any]) -> None:
        from engine_adapter.vllm_local import VllmLocalEngine
        from gateway.app import build_engine
        from gateway.settings import Settings

        settings = Settings(**sparkgate_config(model, 0, {}), base_dir=str(ROOT))
        engine = build_engine(settings, settings.models[0])  # what `sparkgate serve` builds
        assert isinstance(engine, VllmLocalEngine)
        self.engine = engine
        self.prompt: tuple[int, ...] = ()
        self._ids = 0

    async def start(self) -> None:
        await self.engine.start()
        tok = self.engine.tokenizer
        text = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
        self.prompt = tuple(int(i) for i in tok.encode(text, add_special_tokens=False))

    async def send(self, max_tokens: int, stream: bool, user: str = "heavy") -> Result:
        from engine_adapter.base import EngineRequest, SamplingOptions

        self._ids += 1
        req = EngineRequest(
            request_id=f"direct-{self._ids}",
            prompt_token_ids=self.prompt,
            sampling=SamplingOptions(max_tokens=max_tokens, ignore_eos=True),
        )
        t0 = time.perf_counter()
        r = Result(user, 0.0, 200)
        first = last = None
        try:
            async for chunk in self.engine.generate(req):
                for c in chunk.choices:
                    r.tokens += len(c.token_ids)
                    if c.token_ids:
                        last = time.perf_counter()
                        first = first or last
        except Exception as e:  # counted, not raised: the run reports every failure and exits non-zero
            r.status, r.error = 0, f"{type(e).__name__}: {e}"
        return finish(r, t0, first if stream else None, last, stream)

    async def preemptions(self) -> int:
        return self.engine.stats().preemptions


def finish(r: Result, t0: float, first: float | None, last: float | None, stream: bool) -> Result:
    end = time.perf_counter()
    r.latency_s = end - t0
    r.ttft_s = (first - t0) if stream and first is not None else (r.latency_s if not stream else None)
    if stream and first is not None and last is not None and r.tokens > 1:
        r.tpot_s = (last - first) / (r.tokens - 1)
    return r


class Http(Target):
    """An OpenAI-compatible server, over aiohttp (the same client for b, c and d)."""

    def __init__(self, name: str, port: int, pids: tuple[int, ...], model: str, keys: dict[str, str]) -> None:
        import aiohttp

        self.name = name
        self.base = f"http://127.0.0.1:{port}"
        self.pids = pids
        self.model = model
        self.keys = keys
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=2.0),
            timeout=aiohttp.ClientTimeout(total=600),
        )
        self.preempt_url: str | None = None

    async def send(self, max_tokens: int, stream: bool, user: str = "heavy") -> Result:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": MESSAGES,
            "max_tokens": max_tokens,
            "stream": stream,
            "ignore_eos": True,
            "user": user,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        headers = {"Authorization": f"Bearer {self.keys.get(user, self.keys['heavy'])}"}
        t0 = time.perf_counter()
        r = Result(user, 0.0, 200)
        first = last = None
        try:
            async with self.session.post(f"{self.base}/v1/chat/completions", json=body, headers=headers) as resp:
                r.status = resp.status
                if resp.status != 200:
                    r.error = (await resp.text())[:300]
                elif not stream:
                    data = await resp.json()
                    r.tokens = int(data["usage"]["completion_tokens"])
                else:
                    async for raw in resp.content:
                        line = raw.strip()
                        if not line.startswith(b"data:"):
                            continue
                        payload = line[5:].strip()
                        if payload == b"[DONE]":
                            break
                        event = json.loads(payload)
                        if "error" in event:
                            r.error = str(event["error"])[:300]
                        for c in event.get("choices") or ():
                            if (c.get("delta") or {}).get("content"):
                                last = time.perf_counter()
                                first = first or last
                        if event.get("usage"):
                            r.tokens = int(event["usage"]["completion_tokens"])
        except Exception as e:  # counted, not raised
            r.status, r.error = 0, f"{type(e).__name__}: {e}"
        return finish(r, t0, first, last, stream)

    async def preemptions(self) -> int:
        if self.name.startswith("sparkgate"):
            async with self.session.get(
                f"{self.base}/sparkgate/stats", headers={"Authorization": f"Bearer {KEY}"}
            ) as resp:
                resp.raise_for_status()
                return int((await resp.json())["engines"][self.model]["stats"]["preemptions"])
        assert self.preempt_url is not None  # vLLM's /metrics (LiteLLM's: the vLLM server's behind it)
        async with self.session.get(self.preempt_url) as resp:
            resp.raise_for_status()
            text = await resp.text()
        return int(
            sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith("vllm:num_preemptions_total"))
        )

    async def close(self) -> None:
        await self.session.close()


# -- part 1: closed loop ------------------------------------------------------------------------


def pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))]


@dataclass
class Cell:
    system: str
    concurrency: int
    stream: bool
    max_tokens: int
    round: int
    requests: int
    errors: int
    first_error: str
    wall_s: float
    cpu_s: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    tpot_mean_s: float | None
    out_tokens: int

    @property
    def rps(self) -> float:
        """Successful requests a second (a failed one is no throughput)."""
        return (self.requests - self.errors) / self.wall_s

    @property
    def tok_s(self) -> float:
        return self.out_tokens / self.wall_s

    @property
    def cpu_ms(self) -> float:
        return self.cpu_s / self.requests * 1e3


async def closed_loop(t: Target, concurrency: int, stream: bool, max_tokens: int, n: int, rnd: int) -> Cell:
    left = n
    results: list[Result] = []

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            results.append(await t.send(max_tokens, stream))

    cpu0 = t.cpu()
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    cpu = t.cpu() - cpu0
    bad = [r for r in results if not r.ok(max_tokens)]
    ttfts = [r.ttft_s for r in results if r.ok(max_tokens) and r.ttft_s is not None]
    tpots = [r.tpot_s for r in results if r.ok(max_tokens) and r.tpot_s is not None]
    first_error = ""
    if bad:
        b = bad[0]
        first_error = f"status {b.status}, {b.tokens} tokens, {b.error}"
    return Cell(
        t.name,
        concurrency,
        stream,
        max_tokens,
        rnd,
        len(results),
        len(bad),
        first_error,
        wall,
        cpu,
        pct(ttfts, 50),
        pct(ttfts, 99),
        statistics.fmean(tpots) if tpots else None,
        sum(r.tokens for r in results if r.ok(max_tokens)),
    )


async def sweep(targets: list[Target], rounds: int, requests: int, max_tokens: Sequence[int]) -> list[Cell]:
    cells: list[Cell] = []
    for t in targets:  # warm-up: both kinds of response once each
        for stream in (False, True):
            r = await t.send(max(MAX_TOKENS), stream)
            if not r.ok(max(MAX_TOKENS)):
                raise SystemExit(f"{t.name}: warm-up request failed: {r}")
    for rnd in range(rounds):
        order = targets[rnd % len(targets) :] + targets[: rnd % len(targets)]
        for conc in CONCURRENCY:
            for stream in (False, True):
                for mt in max_tokens:
                    n = max(requests, 2 * conc)
                    for t in order:
                        c = await closed_loop(t, conc, stream, mt, n, rnd)
                        cells.append(c)
                        log(
                            f"round {rnd + 1}: {t.name:9} c={conc:2} stream={stream!s:5} max_tokens={mt:2}: "
                            f"{c.rps:7.1f} req/s, TTFT p50 {fmt_ms(c.ttft_p50_s)} ms, errors {c.errors}"
                        )
    return cells


def fmt_ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def med(xs: list[float | None]) -> float | None:
    ys = [x for x in xs if x is not None]
    return statistics.median(ys) if ys else None


def report_sweep(cells: list[Cell], systems: list[str]) -> str:
    max_tokens = sorted({c.max_tokens for c in cells})
    rows = []
    for conc in CONCURRENCY:
        for stream in (False, True):
            for mt in max_tokens:
                group = [c for c in cells if (c.concurrency, c.stream, c.max_tokens) == (conc, stream, mt)]
                base = med([c.rps for c in group if c.system == "direct"])
                for s in systems:
                    mine = [c for c in group if c.system == s]
                    rps = med([c.rps for c in mine])
                    ratio = f"{rps / base:.2f}" if rps and base else "-"
                    cpu = "-" if s == "direct" else f"{med([c.cpu_ms for c in mine]) or 0:.2f}"
                    rows.append(
                        [
                            str(conc),
                            "yes" if stream else "no",
                            str(mt),
                            s,
                            f"{rps or 0:.1f}",
                            ratio,
                            f"{med([c.tok_s for c in mine]) or 0:.0f}",
                            fmt_ms(med([c.ttft_p50_s for c in mine])),
                            fmt_ms(med([c.ttft_p99_s for c in mine])),
                            cpu,
                            str(sum(c.errors for c in mine)),
                        ]
                    )
    header = [
        "conc",
        "stream",
        "max_tokens",
        "system",
        "req/s",
        "req/s vs direct",
        "output tok/s",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "server CPU ms/req",
        "errors",
    ]
    out = [table(header, rows)]
    if "vllm" in systems:
        out += ["", vllm_ratios(cells, systems, max_tokens)]
    if "direct" in systems and len(systems) > 1:
        out += ["", added_ttft(cells, [s for s in systems if s != "direct"], max_tokens)]
    return "\n".join(out)


def vllm_ratios(cells: list[Cell], systems: list[str], max_tokens: list[int]) -> str:
    """The goal's two ratios: sparkgate / vLLM server at every point, and at max_tokens=1."""
    ratio_rows = []
    for conc in CONCURRENCY:
        for stream in (False, True):
            for mt in max_tokens:
                group = [c for c in cells if (c.concurrency, c.stream, c.max_tokens) == (conc, stream, mt)]
                per = {s: med([c.rps for c in group if c.system == s]) for s in systems}
                sg, vl, ll = per.get("sparkgate"), per.get("vllm"), per.get("litellm")
                ratio_rows.append(
                    [
                        str(conc),
                        "yes" if stream else "no",
                        str(mt),
                        f"{sg / vl:.2f}" if sg and vl else "-",
                        f"{ll / vl:.2f}" if ll and vl else "-",
                    ]
                )
    return table(["conc", "stream", "max_tokens", "sparkgate / vllm req/s", "litellm / vllm req/s"], ratio_rows)


def added_ttft(cells: list[Cell], systems: list[str], max_tokens: list[int]) -> str:
    """Each system's TTFT p50 less direct's (medians over rounds): what it adds over the engine
    (not streaming, the whole answer: for max_tokens 1 that is the first token too)."""
    rows = []
    for stream in (True, False):
        for mt in max_tokens:
            for conc in CONCURRENCY:
                group = [c for c in cells if (c.concurrency, c.stream, c.max_tokens) == (conc, stream, mt)]
                base = med([c.ttft_p50_s for c in group if c.system == "direct"])
                row = [str(conc), "yes" if stream else "no", str(mt), fmt_ms(base)]
                for s in systems:
                    mine = med([c.ttft_p50_s for c in group if c.system == s])
                    row.append("-" if mine is None or base is None else f"{(mine - base) * 1e3:+.1f}")
                rows.append(row)
    header = ["conc", "stream", "max_tokens", "direct TTFT p50 ms"] + [f"{s} added ms" for s in systems]
    return "TTFT p50 added over direct (the engine in-process):\n\n" + table(header, rows)


# -- part 2: overload ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Slo:
    ttft_s: float
    tpot_s: float

    def met(self, r: Result) -> bool:
        return (
            r.ok(OVERLOAD_TOKENS)
            and r.ttft_s is not None
            and r.tpot_s is not None
            and r.ttft_s <= self.ttft_s
            and r.tpot_s <= self.tpot_s
        )


@dataclass
class OverloadRun:
    system: str
    phase: str  # "light alone" or "heavy + light"
    window_s: float
    preemptions: int
    results: list[Result] = field(default_factory=list)


async def open_loop(t: Target, plan: list[tuple[float, str]], window_s: float, phase: str) -> OverloadRun:
    before = await t.preemptions()
    start = time.perf_counter()

    async def one(at: float, user: str) -> Result:
        r = await t.send(OVERLOAD_TOKENS, True, user)
        r.arrival_s = at
        return r

    tasks = []
    for at, user in plan:
        delay = start + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(at, user)))
    results = list(await asyncio.gather(*tasks))
    return OverloadRun(t.name, phase, window_s, await t.preemptions() - before, results)


async def overload(targets: Sequence[Target], capacity: float, window_s: float) -> list[OverloadRun]:
    light_rate, heavy_rate = 4 * capacity / 16, 4 * capacity * 15 / 16
    light = [(a, "light") for a in poisson_arrivals(light_rate, window_s, SEED)]
    heavy = [(a, "heavy") for a in poisson_arrivals(heavy_rate, window_s, SEED + 1)]
    mixed = sorted(light + heavy)
    runs = []
    for t in targets:
        log(f"overload: {t.name}: the light user alone ({len(light)} requests at {light_rate:.2f} req/s)")
        runs.append(await open_loop(t, light, window_s, "light alone"))
        log(f"overload: {t.name}: heavy + light ({len(mixed)} requests at {4 * capacity:.2f} req/s)")
        runs.append(await open_loop(t, mixed, window_s, "heavy + light"))
    return runs


def report_overload(runs: list[OverloadRun], slo: Slo, capacity: float, window_s: float) -> str:
    rows = []
    for run in runs:
        rs = run.results
        done = [r for r in rs if r.ok(OVERLOAD_TOKENS)]
        rejected = Counter(r.status for r in rs if r.status in (429, 503))
        failed = [r for r in rs if not r.ok(OVERLOAD_TOKENS) and r.status not in (429, 503)]
        good = [r for r in rs if slo.met(r)]
        light = [r.ttft_s for r in done if r.user == "light" and r.ttft_s is not None]
        lr = [r for r in rs if r.user == "light"]
        rows.append(
            [
                run.system,
                run.phase,
                str(len(rs)),
                str(len(done)),
                ", ".join(f"{k}: {v}" for k, v in sorted(rejected.items())) or "0",
                str(len(failed)),
                f"{len(good) / window_s:.2f}",
                f"{sum(slo.met(r) for r in lr)}/{len(lr)}",
                fmt_ms(pct(light, 50)),
                fmt_ms(pct(light, 99)),
                str(run.preemptions),
            ]
        )
    header = [
        "system",
        "phase",
        "requests",
        "completed",
        "rejected (status: n)",
        "failed",
        "goodput req/s",
        "light met SLO",
        "light TTFT p50 ms",
        "light TTFT p99 ms",
        "preemptions",
    ]
    head = (
        f"Capacity (direct, c=32, streaming, {OVERLOAD_TOKENS} tokens): {capacity:.2f} req/s; offered 4x = "
        f"{4 * capacity:.2f} req/s for {window_s:g} s (heavy 15/16, light 1/16, Poisson, seed {SEED}). "
        f"SLO: TTFT <= {slo.ttft_s * 1e3:.0f} ms, TPOT <= {slo.tpot_s * 1e3:.1f} ms."
    )
    out = [head, "", table(header, rows), ""]
    ratio_rows = []
    by = {(r.system, r.phase): r for r in runs}
    vl = by.get(("vllm", "heavy + light"))
    vl_good = sum(slo.met(r) for r in vl.results) if vl else 0
    for system in dict.fromkeys(r.system for r in runs):
        mix, alone = by[(system, "heavy + light")], by[(system, "light alone")]
        n_good = sum(slo.met(r) for r in mix.results)
        lm = pct([r.ttft_s for r in mix.results if r.user == "light" and r.ok(OVERLOAD_TOKENS) and r.ttft_s], 50)
        la = pct([r.ttft_s for r in alone.results if r.ok(OVERLOAD_TOKENS) and r.ttft_s], 50)
        ratio_rows.append(
            [
                system,
                f"{n_good / vl_good:.2f}" if vl and vl_good else ("-" if not vl else "inf" if n_good else "0"),
                f"{lm / la:.2f}" if lm and la else "- (light got nothing)" if la else "-",
            ]
        )
    out.append(table(["system", "goodput / vllm's", "light TTFT p50, loaded / alone"], ratio_rows))
    return "\n".join(out)


def overload_admission(model: dict[str, Any], slo: Slo, fair_share: dict[str, Any] | None) -> dict[str, Any]:
    """sparkgate's admission settings for part 2 (over config/default.yaml's): an operator's for
    overload, the queue timeout at the TTFT SLO; `fair_share` (--fair-share) over the default's."""
    ms = model["max_num_seqs"]
    admission: dict[str, Any] = {
        "max_queued": 4 * ms,
        "queue_timeout_s": {"interactive": slo.ttft_s, "batch": slo.ttft_s},
    }
    if fair_share is not None:
        admission["fair_share"] = default_config().get("admission", {}).get("fair_share", {}) | fair_share
    return admission


@contextlib.contextmanager
def sparkgate_overload(model: dict[str, Any], admission: dict[str, Any], slo: Slo, tmp: Path) -> Iterator[Http]:
    """A `sparkgate serve` with part 2's settings, as a target."""
    port = free_port()
    cfg_path = tmp / "sparkgate-overload.yaml"
    cfg_path.write_text(yaml.safe_dump(sparkgate_config(model, port, admission, slo)))
    log(f"sparkgate: starting the overload instance (`--config {cfg_path}`)")
    with launch(cfg_path, tmp / "sparkgate-overload.log", port) as gw:
        yield Http("sparkgate", port, (gw.pid,), model["name"], {"heavy": KEY, "light": LIGHT_KEY})


def overload_record(capacity: float, slo: Slo, admission: dict[str, Any], runs: list[OverloadRun]) -> dict[str, Any]:
    """Part 2's raw results, for --out."""
    return {
        "capacity_rps": capacity,
        "slo": asdict(slo),
        "sparkgate_admission": admission,
        "runs": [asdict(r) for r in runs],
    }


def print_overload(runs: list[OverloadRun], slo: Slo, capacity: float, window_s: float) -> bool:
    """Part 2's tables; True if a request got no HTTP answer at all (the measurement failing: a
    system's own error answers under overload, a proxy's 500, are its behaviour, in its row)."""
    print("## Part 2: overload (4x capacity, a heavy and a light user)\n", flush=True)
    print(report_overload(runs, slo, capacity, window_s), flush=True)
    bad_runs = [(r.system, x) for r in runs for x in r.results if x.status == 0]
    for system, x in bad_runs[:5]:
        log(f"ERRORS: overload {system}: status {x.status}, {x.tokens} tokens, {x.error}")
    return bool(bad_runs)


async def overload_only(args: argparse.Namespace, tmp: Path) -> tuple[dict[str, Any], bool]:
    """Part 2 for sparkgate alone on a full run's capacity and SLO (`--overload-only`): to
    compare its settings (`--fair-share`) without the sweep."""
    capacity, ttft_s, tpot_s = args.overload_only
    model, slo = engine_model(), Slo(ttft_s=ttft_s, tpot_s=tpot_s)
    admission = overload_admission(model, slo, args.fair_share)
    results: dict[str, Any] = {"model": model, "loadavg_start": os.getloadavg()}
    with sparkgate_overload(model, admission, slo, tmp) as target:
        try:
            runs = await overload([target], capacity, args.window)
        finally:
            await target.close()
    results["overload"] = overload_record(capacity, slo, admission, runs)
    failed = print_overload(runs, slo, capacity, args.window)
    results["loadavg_end"] = os.getloadavg()
    return results, failed


def overload_figures(text: str) -> tuple[float, float, float]:
    try:
        capacity, ttft_s, tpot_s = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError("expected CAPACITY_RPS,TTFT_S,TPOT_S, e.g. 6.0,0.5,0.0458") from None
    return capacity, ttft_s, tpot_s


# -- main ---------------------------------------------------------------------------------------


async def amain(args: argparse.Namespace, tmp: Path) -> tuple[dict[str, Any], bool]:
    model = engine_model()
    name = model["name"]
    systems: list[str] = args.systems
    refs = [s for s in systems if s.startswith("sparkgate@")]
    results: dict[str, Any] = {"model": model, "systems": systems, "loadavg_start": os.getloadavg()}
    failed = False
    with contextlib.ExitStack() as stack:
        targets: list[Target] = []
        direct = Direct(model)
        vllm_port, sg_port = free_port(), free_port()
        cfg_path = tmp / "sparkgate.yaml"
        cfg_path.write_text(yaml.safe_dump(sparkgate_config(model, sg_port, {})))
        entered: dict[str, Any] = {}

        def enter(key: str, cm: contextlib.AbstractContextManager[Any]) -> None:
            entered[key] = stack.enter_context(cm)

        # Everything starts side by side (engine start-up is minutes on this machine).
        starts: list[Awaitable[None]] = [direct.start()]
        if "vllm" in systems or "litellm" in systems:
            starts.append(asyncio.to_thread(enter, "vllm", vllm_server(model, vllm_port, tmp)))
        if "sparkgate" in systems:
            log(f"sparkgate: starting `sparkgate serve --config {cfg_path}`")
            starts.append(asyncio.to_thread(enter, "sparkgate", launch(cfg_path, tmp / "sparkgate.log", sg_port)))
        if "litellm" in systems:
            starts.append(asyncio.to_thread(enter, "litellm", litellm_server(name, vllm_port, tmp)))
        ref_ports = {s: free_port() for s in refs}
        for s, port in ref_ports.items():
            ref = s.partition("@")[2]
            ref_cfg = tmp / f"sparkgate-{ref.replace('/', '_').replace('~', '-')}.yaml"
            ref_cfg.write_text(yaml.safe_dump(sparkgate_config(model, port, {})))
            log(f"{s}: exporting {ref} and starting its `sparkgate serve --config {ref_cfg}`")
            cm = launch(ref_cfg, tmp / f"{ref_cfg.stem}.log", port, ref=ref, startup_timeout_s=STARTUP_TIMEOUT_S)
            starts.append(asyncio.to_thread(enter, s, cm))
        try:
            log("direct: starting the engine in this process")
            outcomes = await asyncio.gather(*starts, return_exceptions=True)
            errors = [o for o in outcomes if isinstance(o, BaseException)]
            if errors:
                raise errors[0]
            if "direct" in systems:
                targets.append(direct)
            http: list[Http] = []
            vllm_pid = entered["vllm"][1] if "vllm" in entered else 0
            for s, port in ref_ports.items():
                http.append(Http(s, port, (entered[s].pid,), name, {"heavy": KEY, "light": LIGHT_KEY}))
            if "sparkgate" in systems:
                gw = entered["sparkgate"]
                http.append(Http("sparkgate", sg_port, (gw.pid,), name, {"heavy": KEY, "light": LIGHT_KEY}))
            if "vllm" in systems:
                http.append(Http("vllm", vllm_port, (vllm_pid,), name, {"heavy": KEY}))
            if "litellm" in systems:
                lport, lpid = entered["litellm"]
                http.append(Http("litellm", lport, (lpid, vllm_pid), name, {"heavy": KEY}))
            for h in http:
                h.preempt_url = f"http://127.0.0.1:{vllm_port}/metrics"
            targets += http
            try:
                cells = await sweep(targets, args.rounds, args.requests, args.max_tokens)
                results["sweep"] = [asdict(c) for c in cells]
                print("## Part 1: closed loop, medians over rounds\n", flush=True)
                print(report_sweep(cells, [t.name for t in targets]), flush=True)
                print(flush=True)
                bad = [c for c in cells if c.errors]
                for c in bad:
                    log(f"ERRORS: {c.system} c={c.concurrency} stream={c.stream} mt={c.max_tokens}: {c.first_error}")
                failed |= bool(bad)
            finally:
                for h in http:
                    await h.close()
            if args.skip_overload:
                results["loadavg_end"] = os.getloadavg()
                return results, failed
            cap_cells = [
                c
                for c in cells
                if c.system == "direct" and c.concurrency == 32 and c.stream and c.max_tokens == OVERLOAD_TOKENS
            ]
            one = [
                c
                for c in cells
                if c.system == "direct" and c.concurrency == 1 and c.stream and c.max_tokens == OVERLOAD_TOKENS
            ]
            eight = [
                c
                for c in cells
                if c.system == "direct" and c.concurrency == 8 and c.stream and c.max_tokens == OVERLOAD_TOKENS
            ]
            if not cap_cells:
                raise SystemExit("the overload part needs the direct system's sweep (its capacity)")
            capacity = statistics.median(c.rps for c in cap_cells)
            # TTFT: 4x the direct engine's alone (at least 0.5 s); TPOT: 2.5x its at concurrency 8.
            slo = Slo(
                ttft_s=max(0.5, 4 * (med([c.ttft_p50_s for c in one]) or 0.0)),
                tpot_s=2.5 * (med([c.tpot_mean_s for c in eight]) or 0.0),
            )
        finally:
            log("direct: shutting the engine down")
            await direct.engine.shutdown()
        over: list[Http] = []
        admission = overload_admission(model, slo, args.fair_share)
        if "sparkgate" in systems:
            # The sweep's gateway makes way for one with overload settings (its engine too: the same settings).
            for old in [t for t in targets if t.name == "sparkgate"]:
                targets.remove(old)
            over.append(stack.enter_context(sparkgate_overload(model, admission, slo, tmp)))
        if "vllm" in systems:
            over.append(Http("vllm", vllm_port, (vllm_pid,), name, {"heavy": KEY}))
        if "litellm" in systems:
            lt = next(t for t in targets if t.name == "litellm")
            assert isinstance(lt, Http)
            over.append(Http("litellm", int(lt.base.rsplit(":", 1)[1]), lt.pids, name, {"heavy": KEY}))
        for h in over:
            h.preempt_url = f"http://127.0.0.1:{vllm_port}/metrics"
        try:
            runs = await overload(over, capacity, args.window)
        finally:
            for h in over:
                await h.close()
        results["overload"] = overload_record(capacity, slo, admission, runs)
        failed |= print_overload(runs, slo, capacity, args.window)
    results["loadavg_end"] = os.getloadavg()
    return results, failed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a smoke run: 1 round, few requests, a short overload")
    ap.add_argument("--rounds", type=int, help="rounds of the closed-loop sweep (default 3; --quick 1)")
    ap.add_argument("--requests", type=int, help="requests per cell, at least 2x the concurrency (default 64)")
    ap.add_argument("--window", type=float, help="overload arrival window, seconds (default 30; --quick 8)")
    ap.add_argument(
        "--systems",
        type=parse_systems,
        default=",".join(SYSTEMS),
        help="a subset of " + ",".join(SYSTEMS) + ", and sparkgate@REF: the gateway as of a git ref",
    )
    ap.add_argument(
        "--max-tokens",
        type=int_list,
        default=MAX_TOKENS,
        help="the sweep's answer lengths (default 1,64; part 2 needs 64)",
    )
    ap.add_argument("--skip-overload", action="store_true")
    ap.add_argument(
        "--overload-only",
        type=overload_figures,
        metavar="CAPACITY_RPS,TTFT_S,TPOT_S",
        help="part 2 for sparkgate alone, on the capacity and SLO a full run printed",
    )
    ap.add_argument(
        "--fair-share",
        type=json.loads,
        metavar="JSON",
        help="part 2's admission.fair_share over config/default.yaml's, e.g. '{\"idle_s\": 3}'",
    )
    ap.add_argument("--out", type=Path, help="write the raw results (JSON) here")
    args = ap.parse_args()
    if not (args.skip_overload or args.overload_only):
        if any(s.startswith("sparkgate@") for s in args.systems):
            ap.error("sparkgate@REF runs in part 1 only: add --skip-overload")
        if OVERLOAD_TOKENS not in args.max_tokens:
            ap.error(f"part 2 takes its capacity from the {OVERLOAD_TOKENS}-token cells: add them or --skip-overload")
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.requests = args.requests or (8 if args.quick else 64)
    args.window = args.window or (8.0 if args.quick else 30.0)
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout is for the tables
    runtime_env.configure(ROOT / ".cache")
    t0 = time.perf_counter()
    log(f"load average at start: {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="sparkgate-vs-vllm-") as tmp:
        run = overload_only if args.overload_only else amain
        results, failed = asyncio.run(run(args, Path(tmp)))
    log(
        f"done in {time.perf_counter() - t0:.0f} s; load average {results['loadavg_start']} -> {results['loadavg_end']}"
    )
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=1, default=str))
    if failed:
        log("FAILED: some requests failed (see ERRORS above)")
        sys.exit(1)


if __name__ == "__main__":
    main()
