"""GPU check: on CUDA vLLM (0.26 on the lent H200), for the real Qwen3.6 shapes (hybrid:
linear attention + full attention, stretched blocks), the KV spec sparkgate reads from the
running engine (`kv_layout_of` its KV cache config) matches the engine's scheduler, and the
peak pool blocks of a single request never exceed `policies.kv.footprint` (equal where the rule is exact; the
asynchronous scheduler's hybrid bound may be over by a block per state group).

    python3 benchmarks/gpu/kv_check.py OUT_DIR            # all cases, one engine each (subprocesses)
    python3 benchmarks/gpu/kv_check.py OUT_DIR --case NAME

Dummy weights, no tokenizer (prompts are ids), engine core in-process so the scheduler's block
pool can be read. Writes OUT_DIR/kv_check_NAME.json per case and prints one line per check.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

from dummy_engine import dummy_engine, main, prompt_ids

ROOT = Path(__file__).resolve().parents[2]
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3.6-35b-a3b": ("qwen3.6-35b-a3b.config.json", {}),
    # FP8 KV doubles the stretched block (2096 tokens); align mode needs chunks at least that long.
    "qwen3.6-35b-a3b-fp8": ("qwen3.6-35b-a3b.config.json", {"kv_cache_dtype": "fp8", "max_num_batched_tokens": 4096}),
    "qwen3.6-27b": ("qwen3.6-27b.config.json", {}),
}
# (prompt, max_tokens): around the stretched block sizes (1056 / 784 / 2096 / 1568 tokens)
REQUESTS = [(100, 30), (1056, 1), (1057, 1), (2113, 64), (4300, 64)]


def _brief(spec: Any) -> list[Any]:
    return [spec.num_blocks, spec.block_size, spec.bytes_per_block, sorted((g.kind, g.num_layers) for g in spec.groups)]


def run_case(name: str, out: Path) -> bool:
    sys.path.insert(0, str(ROOT))
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from engine_adapter.vllm_local import kv_layout_of, kv_spec_from_layout
    from policies.kv import footprint

    shape, extra = CASES[name]
    engine, vocab, startup_s = dummy_engine(
        name,
        shape,
        max_num_seqs=8,
        max_model_len=16384,
        kv_cache_memory_bytes=4 * 1024**3,
        worker_extension_cls="engine_adapter.vllm_local.KVLayoutReporter",
        **extra,
    )
    res: dict[str, Any] = {"case": name, "startup_s": startup_s, "checks": []}
    core = engine.engine_core.engine_core
    sched = core.scheduler
    mgr = sched.kv_cache_manager
    pool = mgr.block_pool
    kcfg = mgr.kv_cache_config
    spec = kv_spec_from_layout(kv_layout_of(kcfg), engine.vllm_config)
    usable = pool.num_gpu_blocks - 1
    real_groups = sorted(
        (type(g.kv_cache_spec).__name__, len(g.layer_names), int(g.kv_cache_spec.block_size))
        for g in kcfg.kv_cache_groups
    )
    kind = {"full_attention": "FullAttentionSpec", "linear_attention": "MambaSpec"}
    ours = sorted((kind.get(g.kind, g.kind), g.num_layers, g.block_size) for g in spec.groups)
    res["engine"] = {
        "num_gpu_blocks": pool.num_gpu_blocks,
        "block_size": engine.vllm_config.cache_config.block_size,
        "groups": real_groups,
        "async_scheduling": bool(getattr(engine.vllm_config.scheduler_config, "async_scheduling", False)),
        "scheduler": type(sched).__name__,
        "mamba_cache_mode": str(getattr(engine.vllm_config.cache_config, "mamba_cache_mode", None)),
    }
    res["derived"] = {
        "num_blocks": spec.num_blocks,
        "block_size": spec.block_size,
        "groups": ours,
        "bytes_per_block": spec.bytes_per_block,
    }

    def check(label: str, measured: Any, predicted: Any, bound: bool = False) -> None:
        ok = measured <= predicted if bound else measured == predicted
        res["checks"].append({"check": label, "measured": measured, "predicted": predicted, "ok": ok})
        print(f"[{name}] {'OK ' if ok else 'BAD'} {label}: measured {measured}, predicted {predicted}", flush=True)

    check("num_blocks", pool.num_gpu_blocks, spec.num_blocks)
    check("block size", engine.vllm_config.cache_config.block_size, spec.block_size)
    check("groups (spec class, layers, block size)", [list(g) for g in real_groups], [list(g) for g in ours])
    check("kv bytes // bytes_per_block == num_blocks", spec.kv_cache_bytes // spec.bytes_per_block, spec.num_blocks)
    # What the gateway reads at start: the worker's own KV cache config, over collective_rpc.
    (worker_layout,) = engine.collective_rpc("sparkgate_kv_layout")
    worker = kv_spec_from_layout(worker_layout, engine.vllm_config)
    check("worker's layout == scheduler's (groups, block, bytes)", _brief(worker), _brief(spec))

    peak = [0]
    original = sched.schedule

    def schedule(*a: Any, **k: Any) -> Any:
        out_ = original(*a, **k)
        peak[0] = max(peak[0], usable - pool.get_num_free_blocks())
        return out_

    sched.schedule = schedule
    rng = random.Random(7)
    for i, (p, m) in enumerate(REQUESTS):
        mgr.reset_prefix_cache()
        ids = prompt_ids(rng, p, vocab)
        peak[0] = 0
        params = SamplingParams(max_tokens=m, ignore_eos=True, detokenize=False, temperature=0.0)
        engine.add_request(f"r{i}", TokensPrompt(prompt_token_ids=ids), params)
        n = 0
        while engine.has_unfinished_requests():
            for o in engine.step():
                n += len(o.outputs[0].token_ids) if o.outputs else 0
        check(f"P={p} M={m} peak pool blocks <= footprint", peak[0], footprint(spec, ids, m).blocks, bound=True)
    res["ok"] = all(c["ok"] for c in res["checks"])
    (out / f"kv_check_{name}.json").write_text(json.dumps(res, indent=1, default=str))
    return bool(res["ok"])


if __name__ == "__main__":
    sys.exit(main(CASES, run_case, __file__))
