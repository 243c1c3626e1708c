"""What sparkgate does on its event loop for one token-id completion before the engine sees it
(the TTFT the GPU side by side added, benchmarks/gpu/side_by_side.py), step by step, per prompt
length. CPU only: the steps are pure Python on the gateway's one event loop, so requests that
arrive together wait for each other's; the k-th of c waits about k times the total.

    .venv/bin/python benchmarks/gpu/side_by_side_hops.py [--tokenizer models/_tokenizer-qwen3]

Steps, as the request path runs them: the body checked (gateway.http.body_limits.check_body:
UTF-8 and nesting depth), parsed (gateway.http.json_body.decode: msgspec, as the routes
parse; json.loads, FastAPI's default, beside it and not in the total), validated (pydantic
CompletionRequest), its prompts normalized (`CompletionRequest.prompts`, read once), the ids
checked against the vocabulary (prepare._completion_prompts: the max; the schema bounds ids
below), `policies.tokens.from_ids` (since the id-prompt cut only a tuple; it used to decode
the whole prompt back to text), the prompt's prefix-cache keys for admission
(`policies.kv.prefix_keys`, 1,568-token blocks) and the adapter's `list()` for vLLM's
TokensPrompt. Median of 7 runs each, milliseconds.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def median_ms(f: Callable[[], Any], runs: int = 7) -> float:
    xs = []
    for _ in range(runs):
        t0 = time.perf_counter()
        f()
        xs.append(time.perf_counter() - t0)
    return round(1000 * statistics.median(xs), 2)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", type=Path, default=ROOT / "models/_tokenizer-qwen3")
    ap.add_argument("--lens", default="2048,8192,32768")
    a = ap.parse_args()
    from transformers import AutoTokenizer

    from gateway.http import json_body
    from gateway.http.body_limits import check_body
    from gateway.lifecycle.requests import CompletionRequest
    from gateway.text import tokenizer as fast_tokenizer
    from policies import kv, tokens

    tok = fast_tokenizer.wrap(AutoTokenizer.from_pretrained(str(a.tokenizer)))
    vocab = len(tok)

    def row(n: int) -> str:
        rng = random.Random(n)
        ids = [rng.randrange(1000, 150_000) for _ in range(n)]
        body = json.dumps({"model": "bench", "prompt": ids, "max_tokens": 256, "stream": True}).encode()
        data = json.loads(body)
        req = CompletionRequest.model_validate(data)
        prompt = tokens.from_ids(ids)
        steps = [
            median_ms(lambda: check_body(body, 64)),
            median_ms(lambda: json_body.decode(body)),
            median_ms(lambda: CompletionRequest.model_validate(data)),
            median_ms(lambda: req.prompts),
            median_ms(lambda: max(ids) >= vocab),
            median_ms(lambda: tokens.from_ids(ids)),
            median_ms(lambda: kv.prefix_keys(prompt.token_ids, 1568)),  # the 27B's FP8 block
            median_ms(lambda: list(prompt.token_ids)),
        ]
        cells = " | ".join(f"{s:.2f}" for s in steps)
        stdlib = median_ms(lambda: json.loads(body))
        return f"| {n} | {len(body) // 1024} | {cells} | {sum(steps):.2f} | {8 * sum(steps):.1f} | {stdlib:.2f} |"

    head = "| prompt tokens | body KiB | body check | JSON decode | pydantic | .prompts | vocab check | from_ids "
    print(head + "| prefix keys | list() | total | x8 | (json.loads) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in (int(x) for x in a.lens.split(",")):
        print(row(n))
    return 0


if __name__ == "__main__":
    sys.exit(main())
