"""Does a gateway get slower as it serves? 1-token chats at 32 concurrent, before and after
rounds of one-at-a-time traffic, for sparkgate as of git refs and vLLM's own server, side by side.

Run from the repository root (`make models` first):

    .venv/bin/python benchmarks/traffic_drift.py --systems sparkgate@55fd8f2~1,sparkgate@55fd8f2 \
        --between 6000

Each system is started once, on config/default.yaml's first model with the settings of
`benchmarks/vs_vllm_server.py` (keys, quotas, routing, prompt normalization); `sparkgate@REF` is
the gateway as of a git ref (exported with `git archive`), `sparkgate` the working tree, `vllm`
`python -m vllm.entrypoints.openai.api_server`. A round sends `--requests` chats at concurrency
32, non-streaming then streaming, to each system in turn; between rounds each system serves
`--between` chats one at a time (the traffic whose leftovers would slow it). Printed per round:
req/s and the front process's CPU ms per request (the engine core, a child, is not counted).

Found with it: the gateway's unfrozen start-up heap (a full garbage collection walked 656,127
objects, ~0.45 s, and c=32 fell from 486 to 309 req/s after 6,000 requests; gateway/heap.py).
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
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from benchmarks import vs_vllm_server as vs
from benchmarks.gateway_process import free_port, launch


@contextlib.contextmanager
def sparkgate(ref: str, model: dict[str, Any], tmp: Path) -> Iterator[tuple[str, int, int]]:
    """`sparkgate serve` as of `ref` ("": the working tree)."""
    port = free_port()
    config = tmp / f"sparkgate-{ref.replace('/', '_').replace('~', '-') or 'tree'}.yaml"
    config.write_text(yaml.safe_dump(vs.sparkgate_config(model, port, {})))
    with launch(config, tmp / f"{config.stem}.log", port, ref=ref) as gw:
        yield (f"sparkgate@{ref}" if ref else "sparkgate"), port, gw.pid


async def closed_loop(t: vs.Target, stream: bool, n: int, concurrency: int) -> tuple[float, float]:
    """n 1-token chats, `concurrency` at a time: (req/s, CPU ms per request)."""
    left = n

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            r = await t.send(1, stream)
            if r.status != 200 or r.error:
                raise SystemExit(f"{t.name}: {r.status} {r.error}")

    cpu0, t0 = t.cpu(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return n / (time.perf_counter() - t0), (t.cpu() - cpu0) / n * 1e3


async def run(servers: list[tuple[str, int, int]], model: str, args: argparse.Namespace) -> None:
    keys = {"heavy": vs.KEY, "light": vs.LIGHT_KEY}
    targets = [vs.Http(name, port, (pid,), model, keys) for name, port, pid in servers]
    for t in targets:
        await closed_loop(t, False, 64, 32)  # warm
    print("| round | chats served before | stream | " + " | ".join(f"{t.name} req/s, CPU ms" for t in targets) + " |")
    print("|---" * (3 + len(targets)) + "|")
    served = 64
    for rnd in range(args.rounds):
        if rnd:
            for t in targets:
                rps, cpu = await closed_loop(t, False, args.between, 1)
                vs.log(f"{t.name}: {args.between} chats one at a time, {rps:.1f} req/s, {cpu:.2f} CPU ms")
            served += args.between
        for stream in (False, True):
            cells = []
            for t in targets:
                rps, cpu = await closed_loop(t, stream, args.requests, 32)
                cells.append(f"{rps:.1f}, {cpu:.2f}")
            print(f"| {rnd} | {served} | {'yes' if stream else 'no'} | " + " | ".join(cells) + " |", flush=True)
            served += args.requests
    for t in targets:
        await t.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", default="sparkgate,vllm", help="sparkgate, sparkgate@REF, vllm")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=640, help="chats per c=32 cell")
    p.add_argument("--between", type=int, default=3000, help="one-at-a-time chats between rounds")
    args = p.parse_args()
    model = vs.engine_model()
    with tempfile.TemporaryDirectory() as d, contextlib.ExitStack() as stack:
        tmp = Path(d)
        servers: list[tuple[str, int, int]] = []
        for s in args.systems.split(","):
            if s.startswith("sparkgate"):
                servers.append(stack.enter_context(sparkgate(s.partition("@")[2], model, tmp)))
            elif s == "vllm":
                port = free_port()
                _, pid = stack.enter_context(vs.vllm_server(model, port, tmp))
                servers.append(("vllm", port, pid))
            else:
                raise SystemExit(f"unknown system {s!r}")
        asyncio.run(run(servers, str(model["name"]), args))


if __name__ == "__main__":
    main()
