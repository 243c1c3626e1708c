"""Soak: many concurrent streaming clients against the gateway on simulated engines for
minutes, then check that nothing leaked.

Run from the repository root (needs redis-server on PATH and models/tiny-qwen3's tokenizer):

    .venv/bin/python benchmarks/soak.py --clients 1000 --seconds 600

The gateway (`sparkgate serve`, a subprocess) serves config/sim-dgx-spark.yaml's three
simulated DGX Spark engines, routing on, quotas in a real redis-server (a subprocess here).
Each client loops: a streamed chat request to a random model (or routing alias) with a
random prompt and max_tokens; a share of them vanish (close the connection) at a random
point (before the first byte, or mid-stream). A rejection (429/503) is honoured: the client
waits its Retry-After (jittered) and goes on. At the end, once idle, the gateway must hold
nothing: every pool's KV ledger empty, no quota hold, no Redis lease, live set or reservation.

Reported: completed, intended rejections (by status and code), abandoned, unintended errors
(must be 0), the gateway's RSS at idle / after the first minute / at the end and its trend
over the last half, the largest admission queue, file descriptors, leaks. A Markdown table
to stdout, progress to stderr; `--out` writes the raw result as JSON. Exit status 1 when an
unintended error or a leak is seen.

tests/api/test_soak.py runs a short version of the same (`drive`, `leaks`).
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
import json
import random
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks.gateway_process import Gateway, free_port, launch

ROOT = Path(__file__).resolve().parent.parent
KEYS = [f"sk-soak-{i:02d}" for i in range(20)]
LIMITED_KEY = KEYS[-1]  # a key with a small rpm: its 429s are intended
LIMITED_RPM = 30
MODELS = ["qwen3.8-27b", "qwen3.8-flash-next", "qwen3.6-35b-a3b"]
ALIASES = ["auto", "fast"]  # routing's (only with routing on)
# What the gateway may answer on purpose under overload or limits: (status, code).
INTENDED = {
    (429, "rate_limit_exceeded"),
    (429, "slo_unattainable"),
    (503, "server_overloaded"),
    (503, "queue_timeout"),
    (429, "server_overloaded"),
    (429, "queue_timeout"),
}
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven", "wizards"]
STARTUP_TIMEOUT_S = 420


def log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- the servers --------------------------------------------------------------------------


@contextlib.contextmanager
def redis_server(data_dir: Path) -> Iterator[str]:
    """A real redis-server on a free port until the block exits; its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
    port = free_port()
    args = ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(data_dir), "--save", "", "--appendonly", "no"]
    out = (data_dir / "redis.log").open("ab")
    proc = subprocess.Popen([binary, *args], stdout=out, stderr=subprocess.STDOUT, process_group=0)
    try:
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(64).startswith(b"+PONG"):
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        out.close()


def soak_config(
    tmp: Path, port: int, redis_url: str, *, speedup: float, routing: bool, redis_prefix: str = "sg:"
) -> Path:
    """config/sim-dgx-spark.yaml with the soak's keys, quotas in Redis, on `port`."""
    from gateway.settings import hash_key

    cfg = yaml.safe_load((ROOT / "config/sim-dgx-spark.yaml").read_text())
    cfg["base_dir"] = str(ROOT)
    # Access logs off: a line per request and per rejection is the bulk of the log otherwise.
    cfg["server"].update(port=port, cache_dir=str(ROOT / ".cache"), log_level="warning")
    keys = [{"name": f"soak{i:02d}", "sha256": hash_key(k), "max_concurrency": 200} for i, k in enumerate(KEYS)]
    keys[-1]["rpm"] = LIMITED_RPM
    cfg["auth"]["keys"] = [{**k, "slo_class": "interactive", "allow_substitution": True} for k in keys]
    cfg["quotas"] = {"store": "redis", "redis_url": redis_url, "key_prefix": redis_prefix, "lease_s": 30}
    cfg["routing"]["enabled"] = routing
    for m in cfg["models"]:
        m["simulated"]["speedup"] = speedup
    # Queue waits bounded: a client queued longer than this gets a clean 503 and retries.
    cfg["admission"] = {"max_queued": 256, "queue_timeout_s": {"interactive": 30, "batch": 60}}
    path = tmp / "soak.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


# -- the clients ------------------------------------------------------------------------------


@dataclass
class Tally:
    completed: int = 0
    abandoned: int = 0  # the client vanished on purpose
    rejected: Counter[str] = field(default_factory=Counter)  # "status code" -> count, intended only
    unintended: Counter[str] = field(default_factory=Counter)
    samples: list[str] = field(default_factory=list)  # the first unintended errors, in full
    tokens: int = 0  # content chunks received

    def error(self, kind: str, detail: str) -> None:
        self.unintended[kind] += 1
        if len(self.samples) < 10:
            self.samples.append(f"{kind}: {detail[:500]}")


def _body(rng: random.Random, models: list[str]) -> dict[str, Any]:
    words = rng.choice((8, 40, 200, 1200))
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(words // 2, words)))
    return {
        "model": rng.choice(models),
        "messages": [{"role": "user", "content": text}],
        "max_tokens": rng.choice((4, 16, 64, 200, 600)),
        "stream": True,
    }


async def _one(http: Any, rng: random.Random, tally: Tally, vanish_p: float, models: list[str]) -> float:
    """One request; returns seconds to wait before the next (a rejection's Retry-After)."""
    key = rng.choice(KEYS)
    body = _body(rng, models)
    # Where it vanishes: never; before the answer starts (queued, prefilling); or after k events.
    vanish_after = -1
    if rng.random() < vanish_p:
        vanish_after = rng.choice((0, 0, 1, 2, 5, 20, 60))
    headers = {"Authorization": f"Bearer {key}"}
    if "auto" in models:  # routing on: a mix of latency classes (chats, long-document questions)
        # (not batch: its requests may be held for its 300 s deadline, past the end of a run)
        headers["X-Sparkgate-SLO"] = rng.choice(("interactive", "interactive", "interactive", "document"))
    try:
        if vanish_after == 0:
            # Leave before anything comes back: a random moment after sending (queued or prefilling).
            async def send() -> tuple[int, bytes, str | None]:
                async with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
                    return r.status_code, await r.aread(), r.headers.get("retry-after")

            task = asyncio.ensure_future(send())
            done, _ = await asyncio.wait([task], timeout=rng.uniform(0.05, 3.0))
            if not done:
                task.cancel()  # closes the connection
                with contextlib.suppress(BaseException):
                    await task
                tally.abandoned += 1
                return 0.0
            status, raw, retry_after = task.result()  # it was answered before the client left
            if status != 200:
                return _rejection(tally, status, raw, retry_after, rng)
            if not raw.rstrip().endswith(b"data: [DONE]"):
                tally.error("stream ended without [DONE]", raw[-200:].decode(errors="replace"))
            else:
                tally.completed += 1
            return 0.0
        async with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
            if r.status_code != 200:
                raw = await r.aread()
                return _rejection(tally, r.status_code, raw, r.headers.get("retry-after"), rng)
            events = 0
            done = False
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    break
                event = json.loads(data)
                if "error" in event:
                    tally.error("stream error", data)
                    return 1.0
                events += 1
                if events == vanish_after:
                    tally.abandoned += 1
                    return 0.0  # leaving the block closes the connection mid-stream
            if done:
                tally.completed += 1
                tally.tokens += events
            else:
                tally.error("stream ended without [DONE]", f"{events} events")
    except (asyncio.CancelledError, KeyboardInterrupt):
        raise
    except Exception as e:
        tally.error(type(e).__name__, repr(e))
        return 1.0
    return 0.0


def _rejection(tally: Tally, status: int, raw: bytes, retry_after: str | None, rng: random.Random) -> float:
    try:
        code = json.loads(raw)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = None
    if (status, code) in INTENDED:
        tally.rejected[f"{status} {code}"] += 1
        if retry_after is None:
            tally.error("rejection without Retry-After", f"{status} {code}")
        wait = float(retry_after or 1)
        return min(wait, 10.0) * rng.uniform(0.5, 1.5)
    tally.error(f"HTTP {status}", raw.decode(errors="replace"))
    return 1.0


async def drive(
    base_url: str,
    *,
    clients: int,
    seconds: float,
    seed: int = 18,
    vanish_p: float = 0.15,
    models: list[str] | None = None,
) -> Tally:
    """`clients` looping clients for `seconds`; each finishes its request in flight, then stops."""
    import httpx

    tally = Tally()
    names = models or MODELS
    stop = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=clients + 16, max_keepalive_connections=clients + 16)
    timeout = httpx.Timeout(connect=30, read=300, write=30, pool=60)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout) as http:

        async def client(i: int) -> None:
            rng = random.Random(seed * 100_003 + i)
            await asyncio.sleep(rng.uniform(0, min(5.0, seconds / 4)))  # ramp up
            while time.monotonic() < stop:
                wait = await _one(http, rng, tally, vanish_p, names)
                if wait:
                    await asyncio.sleep(min(wait, max(0.0, stop - time.monotonic())))

        await asyncio.gather(*(client(i) for i in range(clients)))
    return tally


# -- the gateway's side -------------------------------------------------------------------------


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def stats(base_url: str, key: str = KEYS[0]) -> dict[str, Any]:
    import httpx

    r = httpx.get(f"{base_url}/sparkgate/stats", headers={"Authorization": f"Bearer {key}"}, timeout=60)
    r.raise_for_status()
    return r.json()  # type: ignore[no-any-return]


@dataclass
class Sample:
    t: float  # seconds since the load started
    rss_mib: float
    fds: int
    queued: int  # requests in the admission queues, all pools
    stats_s: float  # how long /sparkgate/stats took to answer (the gateway's responsiveness)


async def sample_loop(gw: Gateway, t0: float, every_s: float, out: list[Sample], stop: asyncio.Event) -> None:
    while not stop.is_set():
        start = time.monotonic()
        try:
            s = await asyncio.to_thread(stats, gw.base_url)
            queued = sum(e["admission"]["queued"] for e in s["engines"].values())
        except Exception as e:
            log(f"stats failed: {e!r}")
            queued = -1
        took = time.monotonic() - start
        out.append(Sample(round(start - t0, 1), rss_mib(gw.pid), open_fds(gw.pid), queued, round(took, 3)))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=every_s)


def redis_holds(redis_url: str, prefix: str = "sg:") -> dict[str, int]:
    """What Redis still holds for requests: leases, live-set members, reservation records."""
    import redis

    r = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        live = sum(int(r.scard(k)) for k in r.scan_iter(f"{prefix}live:*"))
        reservations = sum(1 for _ in r.scan_iter(f"{prefix}r:*"))
        return {"leases": int(r.zcard(f"{prefix}leases")), "live": live, "reservations": reservations}
    finally:
        r.close()


def gateway_holds(s: dict[str, Any]) -> dict[str, int]:
    """What the gateway still holds: KV blocks, admitted/queued requests, quota holds, engine requests."""
    pools = [e["admission"] for e in s["engines"].values()]
    return {
        "kv_used_blocks": sum(p["used_blocks"] for p in pools),
        "admitted": sum(p["admitted"] for p in pools),
        "queued": sum(p["queued"] for p in pools),
        "running_sequences": sum(p["running_sequences"] for p in pools),
        "engine_unfinished": sum(e["stats"]["unfinished"] for e in s["engines"].values()),
        "engine_running": sum(e["stats"]["running"] + e["stats"]["waiting"] for e in s["engines"].values()),
        "inflight": sum(e["inflight"] for e in s["engines"].values()),
        "quota_holds": int(s["quota"]["holds"]),
        "quota_outbox": int(s["quota"]["outbox"]),
        "unreleased_admissions": int(s["admission"]["admitted"]) - int(s["admission"]["released"]),
    }


def leaks(base_url: str, redis_url: str, timeout: float = 60.0, redis_prefix: str = "sg:") -> dict[str, int]:
    """Once the gateway is idle (or after `timeout`): everything still held, by kind (all 0: no leak).
    Quota settlements run in background tasks, so a moment after the last response they may
    still be on their way: wait for zero rather than read once."""
    deadline = time.monotonic() + timeout
    while True:
        held = {**gateway_holds(stats(base_url)), **redis_holds(redis_url, redis_prefix)}
        if not any(held.values()) or time.monotonic() > deadline:
            return held
        time.sleep(0.25)


def slope_mib_per_min(samples: list[Sample]) -> float:
    """Least-squares slope of RSS over time (MiB per minute)."""
    if len(samples) < 3:
        return 0.0
    ts = [s.t / 60 for s in samples]
    ys = [s.rss_mib for s in samples]
    return float(statistics.linear_regression(ts, ys).slope)


# -- the run ---------------------------------------------------------------------------------------


async def soak(gw: Gateway, redis_url: str, args: argparse.Namespace) -> dict[str, Any]:
    idle_rss, idle_fds = rss_mib(gw.pid), open_fds(gw.pid)
    log(f"gateway idle: RSS {idle_rss:.0f} MiB, {idle_fds} fds; {args.clients} clients for {args.seconds:.0f} s")
    samples: list[Sample] = []
    stop = asyncio.Event()
    t0 = time.monotonic()
    sampler = asyncio.ensure_future(sample_loop(gw, t0, args.sample_s, samples, stop))

    async def progress() -> None:
        while True:
            await asyncio.sleep(60)
            s = samples[-1] if samples else None
            log(f"t={time.monotonic() - t0:.0f}s {s}")

    reporter = asyncio.ensure_future(progress())
    models = MODELS if args.no_routing else MODELS + ALIASES
    tally = await drive(
        gw.base_url, clients=args.clients, seconds=args.seconds, seed=args.seed, vanish_p=args.vanish, models=models
    )
    load_s = time.monotonic() - t0
    reporter.cancel()
    stop.set()
    await sampler
    held = await asyncio.to_thread(leaks, gw.base_url, redis_url)
    # Deadline for a new request once the storm is over (measured).
    import httpx

    t = time.monotonic()
    r = httpx.post(
        f"{gw.base_url}/v1/chat/completions",
        json={"model": MODELS[0], "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
        headers={"Authorization": f"Bearer {KEYS[0]}"},
        timeout=60,
    )
    after_s = time.monotonic() - t
    end_rss, end_fds = rss_mib(gw.pid), open_fds(gw.pid)
    first_min = min(samples, key=lambda s: abs(s.t - 60)) if samples else None
    last_half = [s for s in samples if s.t >= load_s / 2]
    final = stats(gw.base_url)
    return {
        "clients": args.clients,
        "seconds": args.seconds,
        "load_s": round(load_s, 1),
        "routing": not args.no_routing,
        "completed": tally.completed,
        "content_events": tally.tokens,
        "abandoned": tally.abandoned,
        "rejected": dict(tally.rejected),
        "unintended": dict(tally.unintended),
        "unintended_samples": tally.samples,
        "rss_idle_mib": round(idle_rss, 1),
        "rss_1min_mib": None if first_min is None else round(first_min.rss_mib, 1),
        "rss_end_mib": round(end_rss, 1),
        "rss_max_mib": round(max((s.rss_mib for s in samples), default=end_rss), 1),
        "rss_slope_last_half_mib_per_min": round(slope_mib_per_min(last_half), 2),
        "max_queued": max((s.queued for s in samples), default=0),
        "stats_s_max": max((s.stats_s for s in samples), default=0.0),
        "fds_idle": idle_fds,
        "fds_max": max((s.fds for s in samples), default=end_fds),
        "fds_end": end_fds,
        "leaks": held,
        "after_storm_status": r.status_code,
        "after_storm_s": round(after_s, 3),
        "gateway": {
            "requests": final["requests"],
            "completed": final["completed"],
            "failed": final["failed"],
            "client_disconnects": final["client_disconnects"],
            "quota_unreturned_tokens": final["quota"]["unreturned_tokens"],
            "admission_rejected": final["admission"]["rejected"],
        },
        "samples": [asdict(s) for s in samples],
    }


def table(res: dict[str, Any]) -> str:
    rejected = ", ".join(f"{k}: {v}" for k, v in sorted(res["rejected"].items())) or "0"
    unintended = sum(res["unintended"].values())
    leaked = {k: v for k, v in res["leaks"].items() if v}
    rows = [
        ("clients x seconds", f"{res['clients']} x {res['seconds']:.0f} (load ran {res['load_s']} s)"),
        ("routing", "on" if res["routing"] else "off"),
        ("completed streams", res["completed"]),
        ("intended rejections", f"{sum(res['rejected'].values())} ({rejected})"),
        ("abandoned (client vanished)", res["abandoned"]),
        ("unintended errors", f"{unintended} {res['unintended'] or ''}".strip()),
        ("gateway RSS idle / 1 min / end / max", "{} / {} / {} / {} MiB".format(
            res["rss_idle_mib"], res["rss_1min_mib"], res["rss_end_mib"], res["rss_max_mib"])),
        ("RSS trend, last half of the run", f"{res['rss_slope_last_half_mib_per_min']:+.2f} MiB/min"),
        ("max admission queue (all pools)", res["max_queued"]),
        ("slowest /sparkgate/stats under load", f"{res['stats_s_max']:.2f} s"),
        ("file descriptors idle / max / end", f"{res['fds_idle']} / {res['fds_max']} / {res['fds_end']}"),
        ("leaked at the end", leaked or "0"),
        ("a new request after the load", f"{res['after_storm_status']} in {res['after_storm_s']:.2f} s"),
    ]  # fmt: skip
    out = ["| measure | value |", "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=1000)
    p.add_argument("--seconds", type=float, default=600)
    p.add_argument("--speedup", type=float, default=1.0, help="simulated engines' speed-up over the box")
    p.add_argument("--vanish", type=float, default=0.15, help="share of requests whose client vanishes")
    p.add_argument("--seed", type=int, default=18)
    p.add_argument("--sample-s", type=float, default=5.0)
    p.add_argument("--no-routing", action="store_true", help="models by name only (routing off)")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    # A SIGTERM (`timeout`, a stopped job) unwinds like ^C: the gateway and redis-server are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from gateway import runtime_env

    runtime_env.configure(ROOT / ".cache")
    with tempfile.TemporaryDirectory(prefix="soak-") as d:
        tmp = Path(d)
        with redis_server(tmp) as redis_url:
            port = free_port()
            cfg = soak_config(tmp, port, redis_url, speedup=args.speedup, routing=not args.no_routing)
            log_path = ROOT / ".cache" / "soak-gateway.log"
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with launch(cfg, log_path, port, startup_timeout_s=STARTUP_TIMEOUT_S) as gw:
                res = asyncio.run(soak(gw, redis_url, args))
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))
    print(table(res))
    if res["unintended_samples"]:
        print("\nFirst unintended errors:\n" + "\n".join(f"- {s}" for s in res["unintended_samples"]))
    return 1 if sum(res["unintended"].values()) or any(res["leaks"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
