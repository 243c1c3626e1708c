"""What a request's quota costs: reserve + settle, in-memory store vs Redis (Lua), side by side.

Starts its own redis-server on a free port (Debian's package) and measures, for each
store, the latency of reserve+settle one request at a time, and the throughput with many
requests at once from two clients (as two gateway replicas would), on a key with every
limit set and a team pool (three scopes per request, like the gateway).

    .venv/bin/python benchmarks/quota_overhead.py [--requests 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.ports, run as a script

from gateway.quota import MemoryQuotaStore, QuotaStore, RedisQuotaStore, Reserved
from policies.quotas import Limits
from tests.ports import free_port

SCOPES = [
    ("key:bench", Limits(rpm=10**9, tpm=10**12, daily_tokens=10**12, monthly_tokens=10**12, max_concurrency=10**6)),
    ("team:bench", Limits(monthly_tokens=10**12)),
    ("user:bench", Limits()),
]


async def serial(store: QuotaStore, n: int, tag: str) -> list[float]:
    lat = []
    for i in range(n):
        t = time.perf_counter()
        r = await store.reserve(f"{tag}-{i}", SCOPES, 1000)
        assert isinstance(r, Reserved)
        await store.settle(r, 300, 200)
        lat.append(time.perf_counter() - t)
    return lat


async def concurrent(stores: Sequence[QuotaStore], n: int, width: int, tag: str) -> float:
    sem = asyncio.Semaphore(width)

    async def one(i: int) -> None:
        async with sem:
            store = stores[i % len(stores)]
            r = await store.reserve(f"{tag}-{i}", SCOPES, 1000)
            assert isinstance(r, Reserved)
            await store.settle(r, 300, 200)

    t = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return n / (time.perf_counter() - t)


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] * 1e6


async def main(n: int) -> None:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (apt-get install redis-server)")
    port = free_port()
    with tempfile.TemporaryDirectory() as d:
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--dir", d, "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
        )
        try:
            await asyncio.sleep(0.5)
            url = f"redis://127.0.0.1:{port}/0"
            memory = MemoryQuotaStore(lease_s=600)
            r1 = RedisQuotaStore(url, lease_s=600, timeout_s=5)
            r2 = RedisQuotaStore(url, lease_s=600, timeout_s=5)
            rows = []
            for name, stores in (("memory", [memory]), ("redis", [r1, r2])):
                await serial(stores[0], 200, f"warm-{name}")
                lat = await serial(stores[0], n, f"s-{name}")
                tput = await concurrent(stores, n, 64, f"c-{name}")
                rows.append((name, statistics.median(lat) * 1e6, pct(lat, 0.99), tput))
            await r1.close()
            await r2.close()
        finally:
            proc.terminate()
            proc.wait()
    print(f"reserve + settle, 3 scopes per request, {n} requests each")
    print(f"{'store':<8} {'p50 us':>9} {'p99 us':>9} {'req/s (64 at once, 2 clients)':>32}")
    for name, p50, p99, tput in rows:
        print(f"{name:<8} {p50:>9.0f} {p99:>9.0f} {tput:>32.0f}")
    mem, red = rows
    print(f"redis / memory: p50 {red[1] / mem[1]:.1f}x, throughput {red[3] / mem[3]:.2f}x")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=5000)
    asyncio.run(main(ap.parse_args().requests))
