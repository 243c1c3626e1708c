"""Prompt tokenization: the HF fast tokenizer vs gateway.text.tokenizer.FastTokenizer, side by side.

    .venv/bin/python benchmarks/token_counting.py [--model models/tiny-qwen3] [--repeats 1.0]

For realistic chats of ~1K, 8K and 64K tokens (system prompt, tools, multi-turn
prose, code, JSON tool results, a little non-ASCII) it times the gateway's own
path (`policies.tokens.render_chat`: chat template + encode) and encoding alone,
median of several interleaved runs, checks that the ids are identical, and prints
a markdown table.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# As a script, this folder leads sys.path: put the repo root there so `gateway` imports.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(ROOT)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search_code",
            "description": "Search the repository for a symbol or a regular expression.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "path": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city, in °C.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
]
PROSE = [
    "The scheduler admits a request only when its KV cache fits, so long prompts wait instead of evicting others.",
    "Could you explain why the p99 latency doubled after Tuesday's deploy? The dashboards show a spike at 14:05.",
    "We measured 1,234 requests per second with 64 concurrent clients; the median time to first token was 87 ms.",
    "Résumé of the meeting: the café team (Zoë, José and François) wants naïve caching removed — it's “too clever”.",
    "東京の天気を教えてください。明日は雨が降りますか？ 🌧️ Merci beaucoup, and sorry for the mixed languages!",
    "Make sure the migration is idempotent: running it twice must not duplicate rows or drop the user's settings.",
    "In short:\n\n1. read the config\n2. validate every field\n3. fail fast with a clear message\n",
]
CODE = '''```python
def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile; values need not be sorted."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered)) - 1))
    return ordered[k]
```
'''


def chat(target: int, count: Callable[[list[dict[str, Any]]], int], seed: int = 0) -> list[dict[str, Any]]:
    """A deterministic conversation of at least `target` prompt tokens."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful senior engineer. Answer concisely; use tools when useful."}
    ]
    turn = 0
    while True:
        user = " ".join(rng.choice(PROSE) for _ in range(rng.randint(1, 4)))
        if rng.random() < 0.3:
            user += "\n\n" + CODE
        messages.append({"role": "user", "content": user})
        if rng.random() < 0.3:
            args = json.dumps({"query": f"def handler_{turn}", "limit": rng.randint(1, 20)})
            call = {"type": "function", "function": {"name": "search_code", "arguments": args}}
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            hits = [{"path": f"src/mod_{i}.py", "line": rng.randint(1, 900), "score": rng.random()} for i in range(5)]
            messages.append({"role": "tool", "content": json.dumps({"hits": hits}, indent=2)})
        messages.append({"role": "assistant", "content": " ".join(rng.choice(PROSE) for _ in range(rng.randint(1, 5)))})
        turn += 1
        if turn % 4 == 0 and count(messages) >= target:
            return messages


def elapsed_ms(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def compare(fn: Callable[[Any], object], hf: Any, fast: Any, runs: int) -> tuple[float, float]:
    """Median ms of `fn(hf)` and `fn(fast)`, interleaved so background load hits both alike."""
    fn(hf)  # warm-up
    fn(fast)
    hf_ms, fast_ms = [], []
    for _ in range(runs):
        hf_ms.append(elapsed_ms(lambda: fn(hf)))
        fast_ms.append(elapsed_ms(lambda: fn(fast)))
    return statistics.median(hf_ms), statistics.median(fast_ms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "tiny-qwen3")
    parser.add_argument("--repeats", type=float, default=1.0, help="scale the number of timed runs")
    args = parser.parse_args()

    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from gateway.text.tokenizer import wrap
    from policies.tokens import render_chat

    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]  # no "longer than max length" noise
    hf: Any = AutoTokenizer.from_pretrained(str(args.model))
    t0 = time.perf_counter()
    fast = wrap(hf)
    build_s = time.perf_counter() - t0
    if fast.backend != "tiktoken":
        sys.exit(f"FastTokenizer fell back to HF: {fast.fallback_reason}")

    def count(messages: list[dict[str, Any]]) -> int:
        return len(render_chat(fast, messages, tools=TOOLS))

    def template_and_encode(messages: list[dict[str, Any]]) -> Callable[[Any], object]:
        return lambda tok: render_chat(tok, messages, tools=TOOLS)

    def encode_only(text: str) -> Callable[[Any], object]:
        return lambda tok: tok.encode(text, add_special_tokens=False)

    rows: list[tuple[str, int, str, float, float, int]] = []
    text = ""
    n = 3
    for label, target, runs in (("~1K", 1024, 60), ("~8K", 8192, 25), ("~64K", 65536, 9)):
        messages = chat(target, count)
        prompt = render_chat(hf, messages, tools=TOOLS)
        if render_chat(fast, messages, tools=TOOLS) != prompt:
            sys.exit(f"{label}: ids differ")
        text = prompt.text
        n = max(3, round(runs * args.repeats))
        for step, fn in (("chat template + encode", template_and_encode(messages)), ("encode only", encode_only(text))):
            rows.append((label, len(prompt), step, *compare(fn, hf, fast, n), n))
    # Worst case: text that the NFC normalizer changes (decomposed accents, as pasted
    # from macOS) is normalized per span by HF's own normalizer before tiktoken.
    nfd = unicodedata.normalize("NFD", text)
    nfd_ids = hf.encode(nfd, add_special_tokens=False)
    if fast.encode(nfd, add_special_tokens=False) != nfd_ids:
        sys.exit("NFD text: ids differ")
    rows.append(("~64K, NFD text", len(nfd_ids), "encode only", *compare(encode_only(nfd), hf, fast, n), n))

    print(f"model: {args.model.name}; FastTokenizer backend: {fast.backend}, built + verified in {build_s:.1f} s\n")
    print("| prompt | tokens | step | HF fast tokenizer (ms) | FastTokenizer (ms) | speed-up | runs |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for label, tokens, step, hf_ms, fast_ms, runs in rows:
        print(f"| {label} | {tokens:,} | {step} | {hf_ms:.2f} | {fast_ms:.2f} | {hf_ms / fast_ms:.1f}x | {runs} |")


if __name__ == "__main__":
    main()
