"""How two processes share one GPU (issue 21): the time slice, measured rather than fitted.

Two vLLM engines in one sparkgate are two processes, two CUDA contexts: the GPU runs one
context's kernels at a time and switches after a time slice, or when the running context has
nothing queued. The box model and the router (`policies.lanes.turn_ratio`) take a 10 ms slice,
fitted to the first H200 routing run. This measures it: a probe process runs "steps" of `work`
ms of GPU time split into `segments` kernels, each followed by a host sync (as an engine's step
syncs to read its sampled tokens, and a prefill step at every host-side shape decision), beside
a hog process that keeps the GPU busy:

- `stream`: back-to-back kernels, never a gap (a long prefill);
- `steps`: 15 ms steps with a host sync and ~1 ms of CPU after each (a busy engine's decode).

Kernels are `torch.cuda._sleep` spins, so work is GPU time independent of memory bandwidth.
A step's latency beside the hog, less its work, divided by its segments, is the wait per
host sync: the slice the probe waits for after each sync while the hog runs its own.

    python3 benchmarks/gpu/timeslice.py OUT     # on the GPU machine, ~30 s
"""

from __future__ import annotations

import json
import multiprocessing as mp
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PROBES = ((1.0, 1), (4.0, 1), (16.0, 1), (64.0, 1), (16.0, 4), (16.0, 16))
HOGS = ("alone", "stream", "steps")
SECONDS_PER_CASE = 0.8


def cycles_per_ms() -> float:
    import torch

    torch.cuda._sleep(1_000_000)  # warm up
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    n = 50_000_000
    a.record()
    torch.cuda._sleep(n)
    b.record()
    b.synchronize()
    return n / a.elapsed_time(b)


def hog(kind: str, per_ms: float, ready: Any, stop: Any) -> None:
    import torch

    torch.cuda.init()
    torch.cuda._sleep(1000)
    torch.cuda.synchronize()
    ready.set()
    if kind == "stream":
        # 2 ms kernels, never fewer than ~8 queued: the GPU always has this context's work.
        events: list[Any] = []
        while not stop.is_set():
            torch.cuda._sleep(int(2 * per_ms))
            e = torch.cuda.Event()
            e.record()
            events.append(e)
            if len(events) > 16:
                events.pop(0).synchronize()
    else:
        while not stop.is_set():
            torch.cuda._sleep(int(15 * per_ms))
            torch.cuda.synchronize()
            t = time.perf_counter() + 0.001
            while time.perf_counter() < t:
                pass
    torch.cuda.synchronize()


def probe(work_ms: float, segments: int, per_ms: float) -> list[float]:
    import torch

    cycles = int(work_ms / segments * per_ms)
    out: list[float] = []
    end = time.perf_counter() + SECONDS_PER_CASE
    while time.perf_counter() < end or len(out) < 5:
        t0 = time.perf_counter()
        for _ in range(segments):
            torch.cuda._sleep(cycles)
            torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1000)
        time.sleep(0.002)  # a little CPU between steps, as an engine's scheduler takes
    return out


def main() -> int:
    import torch

    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".")
    out.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")
    per_ms = cycles_per_ms()
    doc: dict[str, Any] = {"device": torch.cuda.get_device_name(), "cycles_per_ms": per_ms, "cases": []}
    try:
        doc["compute_policy"] = subprocess.run(
            ["nvidia-smi", "compute-policy", "-l"], capture_output=True, text=True, timeout=20
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        doc["compute_policy"] = repr(e)
    print(f"{doc['device']}: {per_ms:.0f} cycles/ms; compute policy: {doc['compute_policy']!r}", flush=True)
    for kind in HOGS:
        proc = None
        stop = ctx.Event()
        if kind != "alone":
            ready = ctx.Event()
            proc = ctx.Process(target=hog, args=(kind, per_ms, ready, stop))
            proc.start()
            ready.wait(120)
            time.sleep(0.5)
        for work, segments in PROBES:
            lat = probe(work, segments, per_ms)
            p50 = statistics.median(lat)
            case = {
                "hog": kind,
                "work_ms": work,
                "segments": segments,
                "n": len(lat),
                "p10_ms": sorted(lat)[len(lat) // 10],
                "p50_ms": p50,
                "p90_ms": sorted(lat)[len(lat) * 9 // 10],
                "wait_per_sync_ms": (p50 - work) / segments,
            }
            doc["cases"].append(case)
            print(
                f"{kind:<7} work {work:5.1f} ms in {segments:>2} segments: p10 {case['p10_ms']:7.2f}"
                f" p50 {p50:7.2f} p90 {case['p90_ms']:7.2f} ms  wait per sync {case['wait_per_sync_ms']:6.2f} ms"
                f"  (n={len(lat)})",
                flush=True,
            )
        if proc is not None:
            stop.set()
            proc.join(30)
            if proc.is_alive():
                proc.kill()
    (out / "timeslice.json").write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
