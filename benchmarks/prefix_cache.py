"""Team-chat traffic and the prefix cache: prompt normalization off vs on, side by side.

Run from the repository root (the models must exist: `make models`):

    .venv/bin/python benchmarks/prefix_cache.py [--model tiny-qwen3] [--users 4] [--turns 4]

One gateway (a real vLLM CPU engine) serves two teams with the same traffic,
request for request, interleaved: team "raw" has normalization off, team "norm"
has it on; `cache_isolation: team` gives each team its own prefix cache, so the
two runs cannot help each other. The workload:

- one shared system prompt (a team handbook) whose second line is the current
  time, to the second;
- three tool definitions, their keys and order shuffled on every request (as
  different client libraries serialize them);
- per user, a multi-turn conversation (thinking off, so Qwen3's template emits an
  empty think block in the generation prompt but not in the history), and a
  question about a long shared document followed by a follow-up.

Per request: vLLM's cached tokens (usage.prompt_tokens_details.cached_tokens),
the prompt tokens, time to first token (streamed), and the tokens that *could* be
reused: the longest common token prefix of the normalized prompt with any earlier
normalized prompt of its team, in whole blocks, never the last token. The same
number is the denominator for both teams: the requests mean the same thing.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.__file__))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse
import asyncio
import datetime
import json
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks.gateway_process import free_port, launch
from gateway.settings import hash_key
from gateway.text.templates import history_prefix
from policies import prefix

ROOT = Path(__file__).resolve().parent.parent
KWARGS = {"enable_thinking": False}
_VOCAB = "deploy review budget latency cache engine request team policy model token shard replica quota window"
_VOCAB += " schedule block prefix document summary question answer context memory throughput queue fairness"
WORDS = _VOCAB.split(" ")


def text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


HANDBOOK_RNG = random.Random(1)
HANDBOOK = [f"Rule {i}: {text(HANDBOOK_RNG, 18)}." for i in range(40)]
DOCUMENT = "\n".join(f"Section {i}. {text(HANDBOOK_RNG, 60)}" for i in range(25))
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} for the team",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}, "scope": {"type": "string"}},
                "required": ["query"],
            },
        },
    }
    for name in ("search_wiki", "open_ticket", "run_query")
]


def system_prompt(now: datetime.datetime) -> str:
    return "\n".join(
        [
            "You are the platform team's assistant.",
            f"Current date and time: {now.isoformat(timespec='seconds')}Z",
            *HANDBOOK,
        ]
    )


def shuffled(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: shuffled(v, rng) for k, v in items}
    if isinstance(value, list) and value and isinstance(value[0], dict):
        out = [shuffled(v, rng) for v in value]
        rng.shuffle(out)
        return out
    return value


@dataclass
class Turn:
    user: int
    kind: str  # chat | doc
    content: str


def script(users: int, turns: int, seed: int) -> list[Turn]:
    """The order requests are sent: round-robin over users, each with a conversation and a doc question."""
    rng = random.Random(seed)
    per_user: list[list[Turn]] = []
    for u in range(users):
        convo = [Turn(u, "chat", f"Question {t} from user {u}: {text(rng, 12)}?") for t in range(turns)]
        doc = [
            Turn(u, "doc", f"Here is the design document:\n{DOCUMENT}\n\nQuestion from user {u}: {text(rng, 10)}?"),
            Turn(u, "doc", f"And a follow-up: {text(rng, 8)}?"),
        ]
        per_user.append(convo[:2] + doc[:1] + convo[2:] + doc[1:])
    out = []
    for step in range(max(len(p) for p in per_user)):
        out += [p[step] for p in per_user if step < len(p)]
    return out


@dataclass
class Result:
    team: str
    kind: str
    prompt: int
    cached: int
    reusable: int
    shared: int
    ttft: float


class Team:
    def __init__(self, name: str, key: str, tokenizer: Any, block: int) -> None:
        self.name, self.key, self.tok, self.block = name, key, tokenizer, block
        self.history: dict[tuple[int, str], list[dict[str, Any]]] = {}
        self.seen: list[tuple[int, ...]] = []  # earlier normalized prompts (token ids)

    def reusable(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> tuple[int, int]:
        """The longest prefix this request shares with an earlier normalized one: in whole
        blocks (what a cache can serve), and in tokens (what block alignment leaves out)."""
        norm = prefix.normalize(messages, tools, prefix.PrefixPolicy(), history_prefix=history_prefix(self.tok, KWARGS))
        rendered = self.tok.apply_chat_template(
            norm.messages, tools=norm.tools, add_generation_prompt=True, tokenize=False, **KWARGS
        )
        ids = tuple(self.tok.encode(rendered, add_special_tokens=False))
        best = 0
        for other in self.seen:
            n = 0
            for a, b in zip(ids, other, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        self.seen.append(ids)
        return prefix.cacheable_tokens(min(best + 1, len(ids)), self.block), min(best, len(ids) - 1)


async def send(client: httpx.AsyncClient, base: str, team: Team, turn: Turn, model: str, rng: random.Random) -> Result:
    now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    convo = team.history.setdefault((turn.user, turn.kind), [])
    messages = [{"role": "system", "content": system_prompt(now)}, *convo, {"role": "user", "content": turn.content}]
    tools = shuffled(TOOLS, rng)
    reusable, shared = team.reusable(messages, tools)
    body = {
        "model": model,
        "messages": messages,
        "tools": tools,
        "max_tokens": 16,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "chat_template_kwargs": KWARGS,
    }
    t0 = time.perf_counter()
    ttft = None
    answer = ""
    usage: dict[str, Any] = {}
    async with client.stream(
        "POST", f"{base}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {team.key}"}
    ) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for c in chunk.get("choices", []):
                piece = c.get("delta", {}).get("content")
                if piece:
                    ttft = ttft or time.perf_counter() - t0
                    answer += piece
            usage = chunk.get("usage") or usage
    convo += [{"role": "user", "content": turn.content}, {"role": "assistant", "content": answer}]
    return Result(
        team.name,
        turn.kind,
        usage["prompt_tokens"],
        usage["prompt_tokens_details"]["cached_tokens"],
        reusable,
        shared,
        ttft or time.perf_counter() - t0,
    )


def config(tmp: Path, port: int, model: str, keys: dict[str, str], kv: str, max_len: int) -> Path:
    cfg = {
        "server": {"host": "127.0.0.1", "port": port, "log_level": "warning", "cache_dir": str(ROOT / ".cache")},
        "auth": {
            "required": True,
            "keys": [
                {"name": "raw", "sha256": hash_key(keys["raw"]), "team": "raw", "normalize_prompts": False},
                {"name": "norm", "sha256": hash_key(keys["norm"]), "team": "norm"},
            ],
        },
        "quotas": {"teams": [{"name": "raw"}, {"name": "norm"}]},
        "models": [
            {
                "name": "m",
                "path": str(ROOT / "models" / model),
                "load_format": "auto" if model == "tiny-qwen3" else "dummy",
                "max_model_len": max_len,
                "max_num_seqs": 8,
                "kv_cache_bytes": kv,
                "prefix": {"cache_isolation": "team"},
            }
        ],
    }
    path = tmp / "prefix-bench.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


async def run(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(ROOT / "models" / args.model))
    keys = {"raw": "sk-bench-raw", "norm": "sk-bench-norm"}
    with tempfile.TemporaryDirectory() as d:
        port = free_port()
        cfg = config(Path(d), port, args.model, keys, args.kv, args.max_len)
        with launch(cfg, Path(d) / "gateway.log", port) as proc:
            base = proc.base_url
            stats = httpx.get(f"{base}/sparkgate/stats", headers={"Authorization": f"Bearer {keys['norm']}"}).json()
            block = stats["engines"]["m"]["kv"]["block_size"]
            teams = [Team("raw", keys["raw"], tok, block), Team("norm", keys["norm"], tok, block)]
            results: list[Result] = []
            rng = random.Random(args.seed)
            async with httpx.AsyncClient(timeout=600) as client:
                for turn in script(args.users, args.turns, args.seed):
                    for team in teams:  # the same request, one team after the other
                        results.append(await send(client, base, team, turn, "m", rng))
    print(f"model {args.model}, KV block {block} tokens, {len(results) // 2} requests per team\n")
    print(
        "| team | prompt tokens | cached (vLLM) | hit rate | shared prefix | reusable (whole blocks) "
        "| cached / reusable | TTFT p50 | TTFT p95 |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    rows = {}
    for name in ("raw", "norm"):
        rs = [r for r in results if r.team == name]
        prompt, cached, reusable, shared = (
            sum(getattr(r, f) for r in rs) for f in ("prompt", "cached", "reusable", "shared")
        )
        ttfts = [r.ttft * 1000 for r in rs]
        rows[name] = (cached / prompt, cached / max(1, reusable), statistics.median(ttfts), pct(ttfts, 0.95))
        print(
            f"| {name} | {prompt} | {cached} | {cached / prompt:.1%} | {shared} | {reusable} "
            f"({reusable / max(1, shared):.1%}) | {cached / max(1, reusable):.1%} "
            f"| {statistics.median(ttfts):.0f} ms | {pct(ttfts, 0.95):.0f} ms |"
        )
    raw, norm = rows["raw"], rows["norm"]
    ratio = f"{norm[0] / raw[0]:.1f}x" if raw[0] else "n/a (raw: no hits)"
    print(f"\nnorm vs raw: hit rate {ratio}, TTFT p50 {norm[2] / raw[2]:.2f}x, p95 {norm[3] / raw[3]:.2f}x")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny-qwen3")
    ap.add_argument("--users", type=int, default=4)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--kv", default="256MiB")
    ap.add_argument("--max-len", type=int, default=8192)
    asyncio.run(run(ap.parse_args()))
