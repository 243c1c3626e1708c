"""Flood: a light user's time to first token alone vs. beside a user who floods, with fair
share off and on (issue 19), in one run.

Run from the repository root (the model must exist: `make models`):

    .venv/bin/python benchmarks/flood.py [--quick] [--out results.json]
    # a light user who reads each answer for 3 s, with and without room for a newcomer:
    .venv/bin/python benchmarks/flood.py --quick --think 3 --newcomer-s 0

For each setting of `admission.fair_share.enabled` (off, then on), `sparkgate serve` runs
config/default.yaml as it is (the tiny dense model, max_num_seqs 8, the default quotas: 16
requests in flight per key), with two keys, and:
1. light alone: the light user sends short streaming completions one at a time;
2. beside the flood: right after, the heavy user starts keeping FLOOD long streaming
   completions in flight (a 429 is retried after its Retry-After); once the flood queues,
   the light user's short requests one at a time again; the flood stops, the pool drains;
   1 and 2 alternate a few rounds (the host's noise comes and goes);
3. heavy alone: after the light user's idle grace, the same flood with nobody else; the
   pool's running sequences are sampled: a lone user should get every slot.
TTFT is the client's: from the request to the first streamed token (openai SDK).

Markdown tables go to stdout, progress to stderr; `--out` writes the raw results.
"""

from __future__ import annotations

import os
import sys

# Run as a script, Python puts benchmarks/ first on sys.path (see benchmarks/overload.py).
sys.path.insert(0, os.path.dirname(os.__file__))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse
import asyncio
import contextlib
import json
import math
import random
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks.gateway_process import free_port, launch
from gateway import runtime_env

ROOT = Path(__file__).resolve().parent.parent
KEYS = {"heavy": "sk-flood-heavy", "light": "sk-flood-light"}
FLOOD = 24  # the heavy user's streams in flight
HEAVY_PROMPT, HEAVY_MAX_TOKENS = 256, 512
LIGHT_PROMPT, LIGHT_MAX_TOKENS = 32, 8
SEED = 20261202


def log(msg: str) -> None:
    print(f"[flood {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1000, 100_000) for _ in range(n)]  # distinct: no prefix sharing


def config(tmp: Path, fair: dict[str, Any]) -> tuple[Path, int, str]:
    from gateway.settings import hash_key

    cfg = yaml.safe_load((ROOT / "config" / "default.yaml").read_text())
    port = free_port()
    cfg["server"].update(port=port, log_level="warning", cache_dir=str(ROOT / ".cache"))
    cfg["auth"]["keys"] = [{"name": n, "sha256": hash_key(k)} for n, k in KEYS.items()]
    cfg["admission"]["fair_share"].update(fair)
    cfg["base_dir"] = str(ROOT)
    path = tmp / f"flood-{len(list(tmp.iterdir()))}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, port, cfg["models"][0]["name"]


@dataclass
class Phase:
    light_ttft_s: list[float] = field(default_factory=list)
    heavy_completed: int = 0
    engine_tokens: int = 0  # output tokens the engine generated over the phase
    heavy_429: int = 0
    running: list[int] = field(default_factory=list)  # the pool's running sequences, sampled
    wall_s: float = 0.0


class Client:
    def __init__(self, base_url: str, model: str) -> None:
        import httpx
        import openai

        self.base_url, self.model = base_url, model
        self.sdk = {
            u: openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=k, max_retries=0, timeout=600)
            for u, k in KEYS.items()
        }
        self.http = httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {KEYS['light']}"})

    async def engine(self) -> dict[str, Any]:
        r = await self.http.get(f"{self.base_url}/sparkgate/stats")
        r.raise_for_status()
        return r.json()["engines"][self.model]  # type: ignore[no-any-return]

    async def pool(self) -> dict[str, Any]:
        return (await self.engine())["admission"]  # type: ignore[no-any-return]

    async def generated(self) -> int:
        return int((await self.engine())["stats"]["generation_tokens"])

    async def stream(self, user: str, ids: list[int], max_tokens: int) -> tuple[float | None, int]:
        """(seconds to the first token, completion tokens) of one streamed completion."""
        t0 = time.perf_counter()
        first: float | None = None
        tokens = 0
        stream = await self.sdk[user].completions.create(
            model=self.model,
            prompt=ids,
            max_tokens=max_tokens,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        async for chunk in stream:
            if first is None and chunk.choices:
                first = time.perf_counter() - t0
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        return first, tokens

    async def light(self, phase: Phase, n: int, rng: random.Random, think_s: float = 0.0) -> None:
        for i in range(n):
            if i and think_s:
                await asyncio.sleep(think_s)  # a person reading the answer
            ttft, _ = await self.stream("light", prompt(rng, LIGHT_PROMPT), LIGHT_MAX_TOKENS)
            assert ttft is not None
            phase.light_ttft_s.append(ttft)

    async def heavy_stream(self, phase: Phase, rng: random.Random) -> None:
        import openai

        while True:
            try:
                await self.stream("heavy", prompt(rng, HEAVY_PROMPT), HEAVY_MAX_TOKENS)
            except openai.RateLimitError as e:  # over its key's concurrency: back off as told
                phase.heavy_429 += 1
                await asyncio.sleep(float(e.response.headers.get("retry-after", 1)))
                continue
            phase.heavy_completed += 1

    async def sample(self, phase: Phase) -> None:
        while True:
            phase.running.append((await self.pool())["running_sequences"])
            await asyncio.sleep(0.1)

    async def drained(self) -> None:
        while True:
            a = await self.pool()
            if a["admitted"] == 0 and a["queued"] == 0:
                return
            await asyncio.sleep(0.2)

    async def close(self) -> None:
        for c in self.sdk.values():
            await c.close()
        await self.http.aclose()


async def run_one(
    base_url: str, model: str, name: str, n_light: int, heavy_s: float, rounds: int, think_s: float
) -> dict[str, Phase]:
    c = Client(base_url, model)
    rng = random.Random(SEED)
    out = {"alone": Phase(), "heavy alone": Phase(), "beside": Phase()}
    try:
        await c.light(Phase(), 3, rng)  # warm-up
        await c.stream("heavy", prompt(rng, HEAVY_PROMPT), 16)
        # Alone and beside alternate, `rounds` times: the host's noise comes and goes.
        for _ in range(rounds):
            t0 = time.perf_counter()
            await c.light(out["alone"], n_light // rounds, rng, think_s)
            out["alone"].wall_s += time.perf_counter() - t0
            # Beside the flood right after: the light user is active (its last request just ended).
            await flood_phase(c, out["beside"], rng, lambda p: c.light(p, n_light // rounds, rng, think_s))
        # The heavy user alone, after the light user's idle grace.
        await flood_phase(c, out["heavy alone"], rng, lambda _: asyncio.sleep(heavy_s))
        for step, phase in out.items():
            log(
                f"fair share {name}: {step}: running mean {statistics.fmean(phase.running or [0]):.2f}"
                + (f", light p50 {pct(phase.light_ttft_s, 50) * 1000:.0f} ms" if phase.light_ttft_s else "")
            )
    finally:
        await c.close()
    return out


async def flood_phase(
    c: Client, phase: Phase, rng: random.Random, during: Callable[[Phase], Awaitable[object]]
) -> None:
    """The heavy user's flood while `during` runs; then it stops, the pool drains, and the
    light user's idle grace passes."""
    flood = [asyncio.create_task(c.heavy_stream(phase, rng)) for _ in range(FLOOD)]
    # The flood takes what it may and queues before anything is measured.
    while (await c.pool())["queued"] < 1:
        await asyncio.sleep(0.05)
    sampler = asyncio.create_task(c.sample(phase))
    t0 = time.perf_counter()
    tokens0 = await c.generated()
    await during(phase)
    phase.wall_s += time.perf_counter() - t0
    phase.engine_tokens += await c.generated() - tokens0
    for t in [*flood, sampler]:
        t.cancel()
    for t in [*flood, sampler]:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await t
    await c.drained()
    await asyncio.sleep(1.5)  # past the light user's idle grace (1 s)


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))] if s else math.nan


def report(results: dict[str, dict[str, Phase]], n_light: int, heavy_s: float, rounds: int, think_s: float) -> str:
    out = ["## Flood: a light user's TTFT alone vs. beside a flood, fair share off and on", ""]
    out.append(
        f"config/default.yaml (tiny-qwen3 dense, random weights, max_num_seqs 8, 128 MiB KV, 16 in flight per key). "
        f"Heavy user: {FLOOD} streams in flight, {HEAVY_PROMPT} prompt + {HEAVY_MAX_TOKENS} output tokens "
        f"(ignore_eos), a 429 retried after its Retry-After. Light user: {n_light} streams one at a time "
        f"({rounds} rounds of alone then beside{f', {think_s:g} s apart' if think_s else ''}), "
        f"{LIGHT_PROMPT} prompt + {LIGHT_MAX_TOKENS} output tokens. TTFT on the client (openai SDK). "
        f"Heavy alone: {heavy_s:g} s of the flood with nobody else; running = the pool's running sequences "
        "sampled every 0.1 s."
    )
    out.append("")
    head = [
        "fair share",
        "light TTFT p50 alone ms",
        "p50 beside flood ms",
        "beside / alone p50",
        "p90 alone ms",
        "p90 beside ms",
        "max beside ms",
        "heavy alone: running mean (max)",
        "heavy alone: engine tok/s",
        "beside: running mean",
        "beside: engine tok/s",
        "heavy 429s",
    ]
    rows = []
    for name, r in results.items():
        alone, heavy, beside = r["alone"], r["heavy alone"], r["beside"]
        a50, b50 = pct(alone.light_ttft_s, 50), pct(beside.light_ttft_s, 50)
        rows.append(
            [
                name,
                f"{a50 * 1000:.0f}",
                f"{b50 * 1000:.0f}",
                f"{b50 / a50:.2f}x",
                f"{pct(alone.light_ttft_s, 90) * 1000:.0f}",
                f"{pct(beside.light_ttft_s, 90) * 1000:.0f}",
                f"{max(beside.light_ttft_s) * 1000:.0f}",
                f"{statistics.fmean(heavy.running or [0]):.2f} ({max(heavy.running or [0])})",
                f"{heavy.engine_tokens / heavy.wall_s:.0f}",
                f"{statistics.fmean(beside.running or [0]):.2f}",
                f"{beside.engine_tokens / beside.wall_s:.0f}",
                str(heavy.heavy_429 + beside.heavy_429),
            ]
        )
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "|".join("---" for _ in head) + "|")
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer light requests, a shorter heavy window")
    ap.add_argument("--out", type=Path, help="write the raw results (JSON) here")
    ap.add_argument("--max-share", type=float, nargs="*", default=[], help="also run fair share with these max_share")
    ap.add_argument("--newcomer-s", type=float, nargs="*", default=[], help="also run fair share with these newcomer_s")
    ap.add_argument("--think", type=float, default=0.0, help="seconds the light user waits between its requests")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    runtime_env.configure(ROOT / ".cache")
    n_light, heavy_s, rounds = (10, 5.0, 2) if args.quick else (40, 10.0, 4)
    fair = yaml.safe_load((ROOT / "config" / "default.yaml").read_text())["admission"]["fair_share"]
    default = f"on, max_share {fair['max_share']:g}, newcomer_s {fair.get('newcomer_s', 0):g} (default.yaml)"
    variants: dict[str, dict[str, Any]] = {"off": {"enabled": False}, default: {}}
    for share in args.max_share:
        variants[f"on, max_share {share:g}"] = {"max_share": share}
    for newcomer in args.newcomer_s:
        variants[f"on, newcomer_s {newcomer:g}"] = {"newcomer_s": newcomer}
    results: dict[str, dict[str, Phase]] = {}
    with tempfile.TemporaryDirectory(prefix="sparkgate-flood-") as tmp:
        for i, (name, fair) in enumerate(variants.items()):
            path, port, model = config(Path(tmp), fair)
            with launch(path, Path(tmp) / f"gateway-{i}.log", port) as gw:
                log(f"fair share {name}: gateway up")
                results[name] = asyncio.run(run_one(gw.base_url, model, name, n_light, heavy_s, rounds, args.think))
    print(report(results, n_light, heavy_s, rounds, args.think), flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps({k: {p: asdict(v) for p, v in r.items()} for k, r in results.items()}))


if __name__ == "__main__":
    main()
