"""GPU check: vLLM's long-prefill cap on a real engine (CUDA vLLM 0.26 on the lent H200), with
the DGX Spark deployment's scheduler settings for the 35B-A3B (config/dgx-spark.yaml: FP8 KV,
steps of 4,096 tokens, `long_prefill_token_threshold` 2,096 = one stretched hybrid block).

What the router and the box model assume (docs/routing.md): with the cap, a chat that arrives
while a long prompt prefills shares the next steps with it instead of waiting for all of it;
without it, the chat waits for the long prompt's whole prefill.

    python3 benchmarks/gpu/chunk_cap.py OUT_DIR                 # both cases, one engine each
    python3 benchmarks/gpu/chunk_cap.py OUT_DIR --case cap

Dummy weights, no tokenizer (prompts are ids), engine core in-process and stepped here, so a
request arrives between two steps, as it would. Writes OUT_DIR/chunk_cap_CASE.json and prints
one line per measurement: wall-clock TTFTs on the H200 (not the Spark's: the ratios matter).
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from dummy_engine import dummy_engine, main, prompt_ids

CASES = {"cap": 2096, "no-cap": 0}
LONG, CHAT = 32_768, 1_500


def run_case(name: str, out: Path) -> bool:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    extra = {"long_prefill_token_threshold": CASES[name]} if CASES[name] else {}
    engine, vocab, startup_s = dummy_engine(
        "chunk-cap",
        "qwen3.6-35b-a3b.config.json",
        kv_cache_dtype="fp8",
        max_num_seqs=4,
        max_num_batched_tokens=4096,
        max_model_len=65536,
        kv_cache_memory_bytes=8 * 1024**3,
        **extra,
    )
    sc = engine.vllm_config.scheduler_config
    res: dict[str, Any] = {
        "case": name,
        "startup_s": startup_s,
        "block_size": engine.vllm_config.cache_config.block_size,
        "max_num_batched_tokens": sc.max_num_batched_tokens,
        "long_prefill_token_threshold": sc.long_prefill_token_threshold,
    }
    rng = random.Random(11)
    params = SamplingParams(max_tokens=8, ignore_eos=True, detokenize=False, temperature=0.0)
    core = engine.engine_core.engine_core

    def prompt(n: int) -> TokensPrompt:
        return TokensPrompt(prompt_token_ids=prompt_ids(rng, n, vocab))

    def run(requests: list[tuple[str, int, int]]) -> dict[str, float]:
        """(id, prompt tokens, step to add it at): each one's TTFT from when it was added."""
        core.scheduler.kv_cache_manager.reset_prefix_cache()
        added: dict[str, float] = {}
        first: dict[str, float] = {}
        step = 0
        pending = sorted(requests, key=lambda r: r[2])
        while pending or engine.has_unfinished_requests():
            while pending and pending[0][2] <= step:
                rid, n, _ = pending.pop(0)
                engine.add_request(rid, prompt(n), params)
                added[rid] = time.monotonic()
            for o in engine.step():
                if o.outputs and o.outputs[0].token_ids and o.request_id not in first:
                    first[o.request_id] = time.monotonic()
            step += 1
        return {rid: round(first[rid] - added[rid], 3) for rid in added}

    run([("warm", 4096, 0), ("warm-chat", CHAT, 0)])  # kernels warmed for both shapes
    res["long_alone_ttft_s"] = run([("long", LONG, 0)])["long"]
    res["chat_alone_ttft_s"] = run([("chat", CHAT, 0)])["chat"]
    both = run([("long", LONG, 0), ("chat", CHAT, 2)])  # the chat arrives two steps into the long prefill
    res["mixed"] = {"long_ttft_s": both["long"], "chat_ttft_s": both["chat"]}
    for k in ("long_alone_ttft_s", "chat_alone_ttft_s"):
        print(f"[{name}] {k}: {res[k]}", flush=True)
    print(f"[{name}] chat beside the long prefill: TTFT {both['chat']} s; the long one's: {both['long']} s", flush=True)
    (out / f"chunk_cap_{name}.json").write_text(json.dumps(res, indent=1))
    return True


if __name__ == "__main__":
    sys.exit(main(CASES, run_case, __file__))
