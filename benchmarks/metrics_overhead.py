"""What /metrics and the request log cost a request: the same gateway with `metrics.enabled`
on and off, and with its JSON request line (`sparkgate.request`, as `log_format: json`
writes it, to a file) on and off, side by side.

Two apps in one process, each on a replay engine (recorded text, no model, no pacing), driven
in-process through httpx's ASGI transport (no sockets: the gateway's own work is what is
left to measure). Three configs: metrics and log, metrics only, neither. Rounds rotate their
order, so drift in the machine's load hits all alike. Measures the median latency of one
chat request at a time (16 output tokens, non-streaming and streaming), the throughput of
32 at once, and one scrape.

    .venv/bin/python benchmarks/metrics_overhead.py [--rounds 20] [--per-round 25]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from gateway.app import create_app
from gateway.job import Meter
from gateway.logs import JsonFormatter
from gateway.metrics import Metrics
from gateway.settings import MetricsSettings, Settings

ROOT = Path(__file__).resolve().parent.parent
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
BODY = {"model": "replay", "messages": MESSAGES, "max_tokens": 16}


@contextlib.asynccontextmanager
async def gateway(enabled: bool) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(
        auth={"required": False},
        models=[{"name": "replay", "engine": "replay", "path": str(ROOT / "models/tiny-qwen3"), "max_num_seqs": 64}],
        admission={"max_queued": 1024},
        metrics={"enabled": enabled},
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 1234))
        async with httpx.AsyncClient(transport=transport, base_url="http://gw", timeout=60) as client:
            yield client


async def one(client: httpx.AsyncClient, stream: bool) -> float:
    t = time.perf_counter()
    if stream:
        async with client.stream("POST", "/v1/chat/completions", json={**BODY, "stream": True}) as r:
            async for _ in r.aiter_bytes():
                pass
    else:
        r = await client.post("/v1/chat/completions", json=BODY)
    assert r.status_code == 200, r.status_code
    return time.perf_counter() - t


async def burst(client: httpx.AsyncClient, width: int, n: int) -> float:
    """Requests per second, `n` of them with `width` at once."""
    sem = asyncio.Semaphore(width)

    async def limited() -> None:
        async with sem:
            await one(client, False)

    t = time.perf_counter()
    await asyncio.gather(*(limited() for _ in range(n)))
    return n / (time.perf_counter() - t)


def hooks_us(n: int = 20_000) -> float:
    """The metrics hooks alone, per request (admitted + finished, a completed chat's path)."""
    from types import SimpleNamespace

    m = Metrics(MetricsSettings())
    meter = Meter(prompt_tokens=20, completion_tokens=16, started=0.0, first_token=0.001, last_token=0.01)
    job: Any = SimpleNamespace(
        served=SimpleNamespace(name="replay"),
        principal=SimpleNamespace(name="alice", team="t"),
        meter=meter,
        n=1,
        requests=(None,),
        route=None,
    )
    t = time.perf_counter()
    for _ in range(n):
        m.admitted(job, 0.0001)
        m.finished(job, "completed")
    return (time.perf_counter() - t) / n * 1e6


REQUEST_LOG = logging.getLogger("sparkgate.request")


def request_lines(on: bool) -> None:
    """The request log on (info, to its JSON file handler) or off (nothing built or written)."""
    REQUEST_LOG.setLevel(logging.INFO if on else logging.WARNING)


async def main(rounds: int, per_round: int, width: int) -> None:
    log_file = tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False)  # noqa: SIM115
    handler = logging.FileHandler(log_file.name)
    handler.setFormatter(JsonFormatter())
    REQUEST_LOG.addHandler(handler)
    REQUEST_LOG.propagate = False
    async with gateway(True) as on, gateway(False) as off:
        # config name -> (client, request log on)
        configs = {"metrics+log": (on, True), "metrics": (on, False), "neither": (off, False)}
        for c, logged in configs.values():  # warm up: tokenizer caches, first-request paths
            request_lines(logged)
            for _ in range(20):
                await one(c, False)
        lat: dict[tuple[str, bool], list[float]] = {(k, s): [] for k in configs for s in (False, True)}
        tput: dict[str, list[float]] = {k: [] for k in configs}
        names = list(configs)
        for i in range(rounds):
            for name in names[i % 3 :] + names[: i % 3]:
                client, logged = configs[name]
                request_lines(logged)
                for stream in (False, True):
                    lat[name, stream] += [await one(client, stream) for _ in range(per_round)]
                tput[name].append(await burst(client, width, 8 * width))
        scrape = []
        for _ in range(200):
            t = time.perf_counter()
            r = await on.get("/metrics")
            scrape.append(time.perf_counter() - t)
        assert r.status_code == 200
        series = sum(1 for line in r.text.splitlines() if line and not line.startswith("#"))

    def med_us(xs: list[float]) -> float:
        return statistics.median(xs) * 1e6

    handler.close()
    lines = sum(1 for _ in open(log_file.name))  # noqa: SIM115
    n = rounds * per_round
    print(f"{n} requests per config and kind, {rounds} rotated rounds; bursts of {8 * width}, {width} at once")
    print(f"request log: {lines} JSON lines written to {log_file.name}")
    print("| | metrics + request log | metrics only | neither | all / neither | metrics / neither |")
    print("|---|---|---|---|---|---|")
    for stream in (False, True):
        a, b, c = (med_us(lat[k, stream]) for k in names)
        kind = "stream" if stream else "JSON"
        print(f"| one at a time, {kind}, p50 | {a:,.0f} µs | {b:,.0f} µs | {c:,.0f} µs | {a / c:.3f} | {b / c:.3f} |")
    a, b, c = (statistics.median(tput[k]) for k in names)
    print(
        f"| {width} at once, median throughput | {a:,.0f} req/s | {b:,.0f} req/s | {c:,.0f} req/s "
        f"| {a / c:.3f} | {b / c:.3f} |"
    )
    print(f"scrape: p50 {med_us(scrape):,.0f} µs for {series} samples; the hooks alone: {hooks_us():.1f} µs a request")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--per-round", type=int, default=25)
    p.add_argument("--width", type=int, default=32)
    a = p.parse_args()
    asyncio.run(main(a.rounds, a.per_round, a.width))
