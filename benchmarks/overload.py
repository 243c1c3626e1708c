"""Overload: goodput of vLLM alone vs. vLLM behind sparkgate, and the cost of one admission decision.

Run from the repository root (the models must exist: `make models`):

    .venv/bin/python benchmarks/overload.py [--quick] [--out results.json]

A. Goodput (DistServe): requests per second that complete and meet BOTH the TTFT
   SLO and the TPOT SLO, at offered loads of 1x, 2x and 4x the engine's capacity,
   open-loop Poisson arrivals (fixed seed) over a fixed window, then drain.
   (1) direct: the engine (`VllmLocalEngine`, AsyncLLM in this process), streamed;
   (2) gateway: the same engine settings behind `sparkgate serve` (a subprocess
       with a generated config), driven by the openai SDK (streaming, usage chunk).
   Both get the same prompts (random token ids, distinct: no prefix sharing) at the
   same arrival times. Capacity and SLOs are calibrated from the direct engine first.
B. The admission decision cost: `policies.admission.Admission` (pure), with a
   queue of 10,000 entries, per offer / release / cancel / timeout.

Markdown tables go to stdout, progress to stderr; `--out` writes the raw results.
"""

from __future__ import annotations

import os
import sys

# Run as a script, Python puts benchmarks/ first on sys.path, where another script may shadow a standard
# module (a benchmarks/tokenize.py would break `inspect`): the standard library first, then the repository root.
sys.path.insert(0, os.path.dirname(os.__file__))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse
import asyncio
import gc
import json
import math
import random
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks.gateway_process import free_port, launch
from gateway import runtime_env

ROOT = Path(__file__).resolve().parent.parent
MODEL = "tiny-moe-small-kv"
API_KEY = "sk-overload-bench"
PROMPT_TOKENS = 1000
MAX_TOKENS = 200
LOADS = (1.0, 2.0, 4.0)
SEED = 20260101
STARTUP_TIMEOUT_S = 420
ENGINE: dict[str, Any] = {
    "name": MODEL,
    "path": str(ROOT / "models" / "tiny-qwen3-moe"),
    "load_format": "dummy",
    "max_model_len": 2048,
    "max_num_seqs": 8,
    "kv_cache_bytes": "2560KiB",  # 40 blocks of 128 tokens
    "enforce_eager": True,
    # The engine worker's threads on core 1; the rest (client, frontends, engine loop) is left to the OS.
    "cpu_cores": "1" if (os.cpu_count() or 1) > 1 else None,
}


def log(msg: str) -> None:
    print(f"[overload {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- workload -------------------------------------------------------------------


def prompt_ids(load_index: int, i: int) -> list[int]:
    """A distinct prompt of random token ids (no prefix sharing across requests or loads)."""
    rng = random.Random(SEED * 7919 + load_index * 1_000_003 + i)
    return [rng.randrange(1000, 100_000) for _ in range(PROMPT_TOKENS)]


def poisson_arrivals(rate: float, window_s: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    out: list[float] = []
    t = rng.expovariate(rate)
    while t < window_s:
        out.append(t)
        t += rng.expovariate(rate)
    return out


@dataclass
class Record:
    """One request as its client saw it."""

    index: int
    arrival_s: float  # scheduled, from the start of the run
    status: int  # 200, or the HTTP status of the rejection (0: a failure without one)
    code: str | None = None  # the error code of a rejection
    tokens: int = 0
    ttft_s: float | None = None  # to the first chunk with output text
    tpot_s: float | None = None  # (last - first) / (tokens - 1)
    latency_s: float | None = None
    queue_wait_ms: int | None = None  # gateway: X-Sparkgate-Queue-Wait-Ms
    text_chunks: int = 0  # stream chunks that carried text (few: the output arrived in bursts)

    @property
    def completed(self) -> bool:
        return self.status == 200 and self.tokens == MAX_TOKENS


@dataclass(frozen=True)
class Slo:
    ttft_s: float
    tpot_s: float

    def met(self, r: Record) -> bool:
        return (
            r.completed
            and r.ttft_s is not None
            and r.tpot_s is not None
            and r.ttft_s <= self.ttft_s
            and r.tpot_s <= self.tpot_s
        )


class Timing:
    """First/last output text times of one stream."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.first: float | None = None
        self.last: float | None = None
        self.chunks = 0

    def text(self) -> None:
        self.chunks += 1
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        self.last = now

    def fill(self, r: Record) -> Record:
        end = time.perf_counter()
        r.latency_s = end - self.t0
        r.text_chunks = self.chunks
        if self.first is not None and self.last is not None:
            r.ttft_s = self.first - self.t0
            if r.tokens > 1:
                r.tpot_s = (self.last - self.first) / (r.tokens - 1)
        return r


Sender = Callable[[int, float, list[int]], Coroutine[Any, Any, Record]]


async def open_loop(send: Sender, rate: float, window_s: float, load_index: int) -> list[Record]:
    """Poisson arrivals over the window (each request started at its time, whatever is in flight), then drain."""
    arrivals = poisson_arrivals(rate, window_s, SEED + load_index)
    prompts = [prompt_ids(load_index, i) for i in range(len(arrivals))]
    start = time.perf_counter()
    tasks: list[asyncio.Task[Record]] = []
    for i, at in enumerate(arrivals):
        delay = start + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(send(i, at, prompts[i])))
    return list(await asyncio.gather(*tasks))


# -- direct: the engine in this process ----------------------------------------------


def settings_for(model: dict[str, Any], admission: dict[str, Any] | None = None, port: int = 0) -> dict[str, Any]:
    """The gateway config; the direct engine is built from the same model entry."""
    from gateway.settings import hash_key

    cfg: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "port": port, "log_level": "warning", "cache_dir": str(ROOT / ".cache")},
        "auth": {"required": True, "keys": [{"name": "bench", "sha256": hash_key(API_KEY)}]},
        "models": [{k: v for k, v in model.items() if v is not None}],
    }
    if admission is not None:
        cfg["admission"] = admission
    return cfg


class Direct:
    def __init__(self) -> None:
        from engine_adapter.vllm_local import VllmLocalEngine
        from gateway.app import build_engine
        from gateway.settings import Settings

        settings = Settings(**settings_for(ENGINE), base_dir=str(ROOT))
        engine = build_engine(settings, settings.models[0])  # exactly what `sparkgate serve` builds
        assert isinstance(engine, VllmLocalEngine)
        self.engine = engine
        self._ids = 0

    async def send(self, index: int, arrival_s: float, prompt: list[int]) -> Record:
        from engine_adapter.base import EngineRequest, SamplingOptions

        self._ids += 1
        request = EngineRequest(
            request_id=f"direct-{self._ids}",
            prompt_token_ids=tuple(prompt),
            sampling=SamplingOptions(max_tokens=MAX_TOKENS, ignore_eos=True),
        )
        timing = Timing()
        r = Record(index=index, arrival_s=arrival_s, status=200)
        try:
            async for chunk in self.engine.generate(request):
                for c in chunk.choices:
                    r.tokens += len(c.token_ids)
                    if c.text:
                        timing.text()
        except Exception as e:  # reported, not raised: one failure must not stop the run
            r.status, r.code = 0, type(e).__name__
        return timing.fill(r)

    def preemptions(self) -> int:
        return self.engine.stats().preemptions

    async def drained(self) -> None:
        while self.engine.stats().unfinished:
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)  # the last stat updates


# -- gateway: `sparkgate serve` in a subprocess --------------------------------------


class Gateway:
    def __init__(self, base_url: str) -> None:
        import httpx
        import openai

        self.base_url = base_url
        # Idle connections expire on the client before uvicorn closes them (its keep-alive is 5 s, like
        # httpx's default): otherwise a request can race the server's close and fail, and nothing retries.
        try:  # recent openai SDKs ship their own fork of httpx
            import httpx2 as sdk_http
        except ImportError:
            import httpx as sdk_http  # type: ignore[no-redef]

        limits = sdk_http.Limits(max_connections=1000, max_keepalive_connections=100, keepalive_expiry=2.0)
        self.client = openai.AsyncOpenAI(
            base_url=f"{base_url}/v1",
            api_key=API_KEY,
            max_retries=0,
            timeout=900,
            http_client=openai.DefaultAsyncHttpxClient(limits=limits, timeout=900),
        )
        self.http = httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {API_KEY}"})

    async def send(self, index: int, arrival_s: float, prompt: list[int]) -> Record:
        import openai

        timing = Timing()
        r = Record(index=index, arrival_s=arrival_s, status=200)
        try:
            raw = await self.client.completions.with_raw_response.create(
                model=MODEL,
                prompt=prompt,
                max_tokens=MAX_TOKENS,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
            wait = raw.headers.get("x-sparkgate-queue-wait-ms")
            r.queue_wait_ms = int(wait) if wait is not None else None
            stream = raw.parse()  # with_raw_response is the legacy wrapper: parse() is sync
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].text:
                    timing.text()
                if chunk.usage is not None:
                    r.tokens = chunk.usage.completion_tokens
        except openai.APIStatusError as e:
            body = e.body if isinstance(e.body, dict) else {}
            r.status, r.code = e.status_code, str(body.get("code"))
        except openai.APIError as e:  # an in-band stream error or a broken connection
            r.status, r.code = 0, type(e).__name__
        return timing.fill(r)

    async def stats(self) -> dict[str, Any]:
        resp = await self.http.get(f"{self.base_url}/sparkgate/stats")
        resp.raise_for_status()
        data: dict[str, Any] = resp.json()
        return data

    async def preemptions(self) -> int:
        return int((await self.stats())["engines"][MODEL]["stats"]["preemptions"])

    async def drained(self) -> None:
        while True:
            e = (await self.stats())["engines"][MODEL]
            a = e["admission"]
            if a["admitted"] == 0 and a["queued"] == 0 and e["stats"]["unfinished"] == 0:
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.5)

    async def close(self) -> None:
        await self.client.close()
        await self.http.aclose()


# -- calibration and runs ---------------------------------------------------------------


@dataclass
class Calibration:
    block_size: int
    num_gpu_blocks: int
    usable_blocks: int
    blocks_per_request: int
    k: int  # requests the pool fits at once
    max_num_seqs: int
    mean_latency_s: float
    mean_ttft_s: float
    mean_tpot_s: float
    capacity_rps: float
    records: list[Record] = field(default_factory=list)


async def together(send: Sender, n: int, load_index: int) -> list[Record]:
    prompts = [prompt_ids(load_index, i) for i in range(n)]
    return list(await asyncio.gather(*(send(i, 0.0, prompts[i]) for i in range(n))))


async def calibrate(direct: Direct, rounds: int) -> Calibration:
    spec = direct.engine.kv_spec
    bpr = math.ceil((PROMPT_TOKENS + MAX_TOKENS - 1) / spec.block_size)
    k = spec.usable_blocks // bpr
    if k < 1:
        raise SystemExit(f"the pool ({spec.usable_blocks} blocks) does not fit one request ({bpr} blocks)")
    log(f"pool: {spec.num_blocks} blocks x {spec.block_size} tokens; {bpr} blocks/request -> K = {k}")
    await together(direct.send, 1, 90)  # warm-up
    await together(direct.send, k, 91)
    records: list[Record] = []
    for r in range(rounds):
        got = await together(direct.send, k, 92 + r)
        bad = [x for x in got if not x.completed]
        if bad:
            raise SystemExit(f"calibration request failed: {bad[0]}")
        records.extend(got)
    latency = statistics.fmean(x.latency_s or 0.0 for x in records)
    return Calibration(
        block_size=spec.block_size,
        num_gpu_blocks=spec.num_blocks,
        usable_blocks=spec.usable_blocks,
        blocks_per_request=bpr,
        k=k,
        max_num_seqs=spec.max_num_seqs,
        mean_latency_s=latency,
        mean_ttft_s=statistics.fmean(x.ttft_s or 0.0 for x in records),
        mean_tpot_s=statistics.fmean(x.tpot_s or 0.0 for x in records),
        capacity_rps=k / latency,
        records=records,
    )


@dataclass
class Run:
    system: str
    load: float
    rate_rps: float
    window_s: float
    wall_s: float  # first arrival to the last response
    preemptions: int
    records: list[Record]
    client_stall_max_s: float = 0.0  # the measuring process's longest event-loop stall (host noise)
    client_stall_total_s: float = 0.0  # its stalls over 50 ms, summed
    loadavg: tuple[float, float] = (0.0, 0.0)  # the host's 1-minute load average at the start and the end


def pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))]


def summarize(run: Run, slo: Slo) -> dict[str, Any]:
    recs = run.records
    done = [r for r in recs if r.completed]
    good = [r for r in recs if slo.met(r)]
    rejected = Counter(f"{r.status} {r.code}" for r in recs if r.status in (429, 503))
    failed = Counter(f"{r.status} {r.code}" for r in recs if not r.completed and r.status not in (429, 503))
    ttfts = [r.ttft_s for r in done if r.ttft_s is not None]
    tpots = [r.tpot_s for r in done if r.tpot_s is not None]
    return {
        "system": run.system,
        "load": run.load,
        "offered_rps": run.rate_rps,
        "arrivals": len(recs),
        "completed": len(done),
        "rejected": sum(rejected.values()),
        "rejected_by_code": dict(rejected),
        "failed_by_code": dict(failed),
        "met_slo": len(good),
        "missed_ttft": sum(1 for r in done if r.ttft_s is None or r.ttft_s > slo.ttft_s),
        "missed_tpot": sum(1 for r in done if r.tpot_s is None or r.tpot_s > slo.tpot_s),
        "slo_attainment": len(good) / len(recs) if recs else 0.0,
        "goodput_rps": len(good) / run.window_s,
        "ttft_p50_s": pct(ttfts, 50),
        "ttft_p95_s": pct(ttfts, 95),
        "tpot_mean_s": statistics.fmean(tpots) if tpots else None,
        "preemptions": run.preemptions,
        "wall_s": run.wall_s,
        "client_stall_max_s": run.client_stall_max_s,
        "client_stall_total_s": run.client_stall_total_s,
        "loadavg": run.loadavg,
    }


class StallMonitor:
    """How long this process's event loop went without running (it was busy, or the host did not schedule
    it): a stalled loop delays arrivals and stream reads alike, so it bounds the measurement's noise."""

    TICK_S = 0.01

    def __init__(self) -> None:
        self.max_s = 0.0
        self.total_s = 0.0
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(self.TICK_S)
            late = time.perf_counter() - t - self.TICK_S
            self.max_s = max(self.max_s, late)
            if late > 0.05:
                self.total_s += late

    def stop(self) -> None:
        self._task.cancel()


async def measure(
    system: str,
    send: Sender,
    preemptions: Callable[[], Awaitable[int]],
    drained: Callable[[], Awaitable[None]],
    capacity: float,
    window_s: float,
) -> list[Run]:
    runs = []
    for li, load in enumerate(LOADS):
        rate = load * capacity
        log(f"{system}: load {load:g}x = {rate:.3f} req/s for {window_s:g} s of arrivals")
        before = await preemptions()
        load_start = os.getloadavg()[0]
        stalls = StallMonitor()
        t0 = time.perf_counter()
        records = await open_loop(send, rate, window_s, li)
        wall = time.perf_counter() - t0
        stalls.stop()
        await drained()
        run = Run(system, load, rate, window_s, wall, await preemptions() - before, records)
        run.client_stall_max_s, run.client_stall_total_s = stalls.max_s, stalls.total_s
        run.loadavg = (load_start, os.getloadavg()[0])
        runs.append(run)
        done = sum(r.completed for r in records)
        log(f"{system}: load {load:g}x: {len(records)} arrivals, {done} completed, {wall:.1f} s")
    return runs


async def run_direct(rounds: int, window_s: float) -> tuple[Calibration, list[Run]]:
    direct = Direct()
    log("direct: starting the engine")
    await direct.engine.start()
    try:
        cal = await calibrate(direct, rounds)
        log(f"capacity {cal.capacity_rps:.3f} req/s (K={cal.k}, mean latency {cal.mean_latency_s:.2f} s)")

        async def preempts() -> int:
            return direct.preemptions()

        runs = await measure("direct", direct.send, preempts, direct.drained, cal.capacity_rps, window_s)
    finally:
        log("direct: shutting the engine down")
        await direct.engine.shutdown()
    return cal, runs


async def run_gateway(k: int, capacity_rps: float, slo: Slo, window_s: float, tmp: Path) -> dict[str, Any]:
    port = free_port()
    admission = {
        "max_queued": 4 * k,
        # A request that would miss its TTFT SLO anyway is turned away when its time is up.
        "queue_timeout_s": {"interactive": slo.ttft_s, "batch": slo.ttft_s},
    }
    cfg = settings_for(ENGINE, admission, port)
    path = tmp / "overload.yaml"
    path.write_text(yaml.safe_dump(cfg))
    log(f"gateway: starting `sparkgate serve --config {path}` (log: {tmp / 'gateway.log'})")
    with launch(path, tmp / "gateway.log", port, startup_timeout_s=STARTUP_TIMEOUT_S) as proc:
        gw = Gateway(proc.base_url)
        try:
            await together(gw.send, 1, 90)  # the same warm-up as the direct engine's
            await together(gw.send, k, 91)
            await gw.drained()
            runs = await measure("gateway", gw.send, gw.preemptions, gw.drained, capacity_rps, window_s)
            final = await gw.stats()
        finally:
            await gw.close()
    return {"config": cfg, "final_stats": final, "runs": [asdict(r) for r in runs]}


def gateway_phase(state_path: Path) -> None:
    """The gateway's client, in a process of its own (no engine, no torch: a plain client)."""
    state = json.loads(state_path.read_text())
    slo = Slo(**state["slo"])
    tmp = state_path.parent
    out = asyncio.run(run_gateway(state["k"], state["capacity_rps"], slo, state["window_s"], tmp))
    (tmp / "gateway.json").write_text(json.dumps(out))


def run_from_dict(d: dict[str, Any]) -> Run:
    return Run(**{**d, "records": [Record(**r) for r in d["records"]]})


# -- B: admission decision cost ---------------------------------------------------------


@dataclass
class OpCost:
    shape: str
    bound: str
    queued: int
    setup_s: float
    ops: int
    us: dict[str, tuple[float, float]]  # op -> (median, p99) microseconds


def admission_cost(users: int, per_user: int, slots: int, ops: int, cal_k: int, bpr: int, blocks: int) -> OpCost:
    """Time single decisions of `Admission` with users x per_user entries queued behind a full pool.

    Each timed operation is followed by an untimed one that restores the queue to the
    same size and shape, so every measurement sees the same queue.
    """
    from policies.admission import Admission
    from policies.demand import Admit, Demand, PoolLimits, Queue, QueueLimits, Reject

    big = 10**12
    adm = Admission(
        [PoolLimits(name="p", blocks=blocks, max_sequences=slots)],
        QueueLimits(max_queued=big, max_queued_tokens=big, max_queued_per_user=big),
    )
    ids = iter(range(big))
    rng = random.Random(SEED)

    def demand(user: str) -> Demand:
        return Demand(id=f"j{next(ids)}", pool="p", user=user, private_blocks=bpr, tokens=PROMPT_TOKENS + MAX_TOKENS)

    running: list[str] = []
    for i in range(cal_k):  # fill the pool
        d = demand(f"runner{i}")
        decision, _ = adm.offer(d)
        assert isinstance(decision, Admit)
        running.append(d.id)
    queued: list[str] = []  # ids, for random picks
    where: dict[str, tuple[int, str]] = {}  # id -> (index in queued, user)

    def add(d: Demand) -> None:
        decision, others = adm.offer(d)
        assert isinstance(decision, Queue) and not others, decision
        where[d.id] = (len(queued), d.user)
        queued.append(d.id)

    def drop(job: str) -> str:
        i, user = where.pop(job)
        last = queued.pop()
        if last != job:
            queued[i] = last
            where[last] = (i, where[last][1])
        return user

    t0 = time.perf_counter()
    for _ in range(per_user):
        for u in range(users):
            add(demand(f"user{u}"))
    setup = time.perf_counter() - t0
    n_queued = adm.snapshot("p").queued
    ns: dict[str, list[int]] = {"offer": [], "release": [], "cancel": [], "timeout": []}
    clock = time.perf_counter_ns
    gc.collect()
    gc.disable()
    try:
        for j in range(ops):
            # offer (one that queues): a new entry; then cancel it (untimed)
            d = demand(f"user{j % users}" if per_user > 1 else f"newcomer{j}")
            t = clock()
            decision, _ = adm.offer(d)
            ns["offer"].append(clock() - t)
            assert isinstance(decision, Queue)
            adm.cancel(d.id)
        for _ in range(ops):
            # release (that admits the next waiting entry); then queue a new one for the admitted user
            job = running.pop(0)
            t = clock()
            admitted = adm.release(job)
            ns["release"].append(clock() - t)
            assert len(admitted) == 1, admitted
            nxt = admitted[0].id
            running.append(nxt)
            add(demand(drop(nxt)))
        for _ in range(ops):
            # cancel a random waiting entry; then queue a new one for its user
            job = rng.choice(queued)
            t = clock()
            admitted = adm.cancel(job)
            ns["cancel"].append(clock() - t)
            assert not admitted
            add(demand(drop(job)))
        for _ in range(ops):
            # a random waiting entry's queue timeout; then queue a new one for its user
            job = rng.choice(queued)
            t = clock()
            reject = adm.timeout(job)
            ns["timeout"].append(clock() - t)
            assert isinstance(reject, Reject)
            add(demand(drop(job)))
    finally:
        gc.enable()
    assert adm.snapshot("p").queued == n_queued
    us = {op: (statistics.median(v) / 1000, (pct([float(x) for x in v], 99) or 0.0) / 1000) for op, v in ns.items()}
    bound = f"KV blocks ({slots} slots)" if slots > cal_k else f"slots ({slots} slots)"
    return OpCost(f"{users:,} users x {per_user:,}", bound, n_queued, setup, ops, us)


# -- output -----------------------------------------------------------------------------


def fmt(x: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "-" if x is None else f"{x * scale:.{digits}f}"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def report_a(cal: Calibration, slo: Slo, summaries: list[dict[str, Any]], window_s: float, max_queued: int) -> str:
    out = ["## A. Goodput under overload: vLLM direct vs. behind sparkgate", ""]
    pinned = f"pinned to core {ENGINE['cpu_cores']}" if ENGINE["cpu_cores"] else "not pinned"
    out.append(
        f"Workload: {PROMPT_TOKENS} prompt tokens (random ids, distinct), {MAX_TOKENS} output tokens (ignore_eos), "
        f"streaming; open-loop Poisson arrivals for {window_s:g} s (seed {SEED}), then drain. Engine: "
        f"tiny-qwen3-moe, dummy weights, max_model_len 2048, max_num_seqs {cal.max_num_seqs}, kv_cache_bytes 2560KiB, "
        f"enforce_eager, {pinned}."
    )
    out.append("")
    out.append("Calibration (direct engine, K requests started together):")
    out.append("")
    out.append(
        table(
            [
                "num_gpu_blocks",
                "usable blocks",
                "block size",
                "blocks/request",
                "K",
                "mean latency at K",
                "mean TTFT at K",
                "mean TPOT at K",
                "capacity",
            ],
            [
                [
                    str(cal.num_gpu_blocks),
                    str(cal.usable_blocks),
                    str(cal.block_size),
                    str(cal.blocks_per_request),
                    str(cal.k),
                    f"{cal.mean_latency_s:.2f} s",
                    f"{cal.mean_ttft_s * 1000:.0f} ms",
                    f"{cal.mean_tpot_s * 1000:.1f} ms",
                    f"{cal.capacity_rps:.3f} req/s",
                ]
            ],
        )
    )
    out.append("")
    out.append(
        f"SLOs (for both): TTFT <= {slo.ttft_s:.2f} s (= max(1 s, 4 x calibrated TTFT)), "
        f"TPOT <= {slo.tpot_s * 1000:.1f} ms (= 2.5 x calibrated TPOT)."
    )
    out.append(
        f"Gateway admission: max_queued = 4K = {max_queued}; interactive queue timeout = the TTFT SLO "
        f"({slo.ttft_s:.2f} s), so a request that would miss its TTFT anyway is turned away early "
        "(503 queue_timeout) instead of running late."
    )
    out.append(
        "Goodput = requests that completed and met both SLOs / arrival window; SLO attainment = those / arrivals "
        "(rejections count as misses); TTFT and TPOT over completed requests, measured on the client's stream "
        "(gateway: openai SDK; direct: the engine's output stream); preemptions: vLLM's counter over the run; "
        "client stall: the measuring process's longest event-loop stall (it delays arrivals and reads alike: "
        "host noise); host load avg: 1-minute load average at the run's start and end (2 cores)."
    )
    out.append("")
    rows = []
    for s in summaries:
        rej = ", ".join(f"{k}: {v}" for k, v in sorted(s["rejected_by_code"].items()))
        fail = ", ".join(f"{k}: {v}" for k, v in sorted(s["failed_by_code"].items()))
        rows.append(
            [
                f"{s['load']:g}x",
                s["system"],
                f"{s['offered_rps']:.3f}",
                str(s["arrivals"]),
                str(s["completed"]) + (f" (failed {fail})" if fail else ""),
                f"{s['rejected']}" + (f" ({rej})" if rej else ""),
                f"{s['slo_attainment'] * 100:.1f}%",
                f"{s['missed_ttft']} / {s['missed_tpot']}",
                f"{s['goodput_rps']:.3f}",
                fmt(s["ttft_p50_s"]),
                fmt(s["ttft_p95_s"]),
                fmt(s["tpot_mean_s"], 1000, 1),
                str(s["preemptions"]),
                f"{s['wall_s']:.0f}",
                f"{s['client_stall_max_s']:.2f}",
                "{:.1f}-{:.1f}".format(*s["loadavg"]),
            ]
        )
    out.append(
        table(
            [
                "load",
                "system",
                "offered req/s",
                "arrivals",
                "completed",
                "rejected (status code: n)",
                "SLO attainment",
                "completed but missed TTFT / TPOT",
                "goodput req/s",
                "TTFT p50 s",
                "TTFT p95 s",
                "TPOT mean ms",
                "preemptions",
                "wall s",
                "client stall max s",
                "host load avg",
            ],
            rows,
        )
    )
    out.append("")
    ratio_rows = []
    for load in LOADS:
        d = next(s for s in summaries if s["load"] == load and s["system"] == "direct")
        g = next(s for s in summaries if s["load"] == load and s["system"] == "gateway")
        ratio = g["goodput_rps"] / d["goodput_rps"] if d["goodput_rps"] else None
        ratio_rows.append(
            [
                f"{load:g}x",
                f"{d['goodput_rps']:.3f}",
                f"{g['goodput_rps']:.3f}",
                "-" if ratio is None else (f"{ratio:.2f}" if g["goodput_rps"] else "0"),
            ]
        )
    out.append(table(["load", "direct goodput req/s", "gateway goodput req/s", "gateway / direct"], ratio_rows))
    return "\n".join(out)


def report_b(costs: list[OpCost]) -> str:
    out = ["## B. Admission decision cost (policies.admission.Admission, pure)", ""]
    out.append(
        "A pool like A's (KV room for K requests, full), the queue held at a fixed size behind it; every request the "
        "same size. Microseconds per call, median / p99, one timed call at a time (gc off). "
        "offer = one that queues; release = one that admits the next waiting entry; cancel and timeout = of a "
        "random waiting entry."
    )
    out.append("")
    rows = []
    for c in costs:
        cells = [f"{c.us[op][0]:.1f} / {c.us[op][1]:.1f}" for op in ("offer", "release", "cancel", "timeout")]
        rows.append([c.shape, f"{c.queued:,}", c.bound, str(c.ops), *cells, f"{c.setup_s:.1f}"])
    out.append(
        table(
            [
                "queue",
                "queued",
                "pool bound by",
                "ops each",
                "offer µs",
                "release µs",
                "cancel µs",
                "timeout µs",
                "fill queue s",
            ],
            rows,
        )
    )
    return "\n".join(out)


# -- main -------------------------------------------------------------------------------


def part_a(quick: bool, tmp: Path) -> dict[str, Any]:
    window = 6.0 if quick else 30.0
    cal, direct_runs = asyncio.run(run_direct(rounds=1 if quick else 2, window_s=window))
    slo = Slo(ttft_s=max(1.0, 4 * cal.mean_ttft_s), tpot_s=2.5 * cal.mean_tpot_s)
    log(f"SLOs: TTFT <= {slo.ttft_s:.2f} s, TPOT <= {slo.tpot_s * 1000:.1f} ms")
    # The direct engine is shut down (its processes are gone); the gateway's client runs in a
    # fresh process, so it carries neither this process's engine frontend nor its heap.
    state = tmp / "state.json"
    state.write_text(json.dumps({"k": cal.k, "capacity_rps": cal.capacity_rps, "slo": asdict(slo), "window_s": window}))
    subprocess.run([sys.executable, str(Path(__file__).resolve()), "--gateway-phase", str(state)], check=True)
    gateway = json.loads((tmp / "gateway.json").read_text())
    gateway_runs = [run_from_dict(r) for r in gateway["runs"]]
    runs = [r for pair in zip(direct_runs, gateway_runs, strict=True) for r in pair]
    summaries = [summarize(r, slo) for r in runs]
    print(report_a(cal, slo, summaries, window, 4 * cal.k), flush=True)
    print(flush=True)
    return {
        "window_s": window,
        "calibration": asdict(cal),
        "slo": asdict(slo),
        "summaries": summaries,
        "runs": [asdict(r) for r in runs],
        "gateway_config": gateway["config"],
        "gateway_final_stats": gateway["final_stats"],
    }


def part_b(quick: bool, k: int, bpr: int, blocks: int) -> list[OpCost]:
    shapes = [(20, 100), (2_000, 1)] if quick else [(100, 100), (10_000, 1)]
    ops = 200 if quick else 2_000
    costs = []
    for users, per_user in shapes:
        for slots in (ENGINE["max_num_seqs"], k):
            log(f"admission cost: {users} users x {per_user}, {slots} slots, {ops} ops each")
            costs.append(admission_cost(users, per_user, slots, ops, k, bpr, blocks))
    print(report_b(costs), flush=True)
    return costs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a smoke run: short windows, a smaller queue in B")
    ap.add_argument("--out", type=Path, help="write the raw results (JSON) here")
    ap.add_argument("--skip-a", action="store_true", help="only the admission decision cost (B)")
    ap.add_argument("--gateway-phase", type=Path, help=argparse.SUPPRESS)  # internal: A's gateway client
    args = ap.parse_args()
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout is for the tables
    runtime_env.configure(ROOT / ".cache")
    if args.gateway_phase is not None:
        gateway_phase(args.gateway_phase)
        return
    results: dict[str, Any] = {"quick": args.quick, "engine": ENGINE}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sparkgate-overload-") as tmp:
        if not args.skip_a:
            results["a"] = a = part_a(args.quick, Path(tmp))
            cal = a["calibration"]
            k, bpr, blocks = cal["k"], cal["blocks_per_request"], cal["usable_blocks"]
        else:
            k, bpr, blocks = 3, math.ceil((PROMPT_TOKENS + MAX_TOKENS - 1) / 128), 39
        results["b"] = [asdict(c) for c in part_b(args.quick, k, bpr, blocks)]
    log(f"done in {time.perf_counter() - t0:.0f} s")
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=1, default=str))
        log(f"raw results: {args.out}")


if __name__ == "__main__":
    main()
