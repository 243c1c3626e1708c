"""GPU check: the gateway's own engine adapter (`VllmLocalEngine`: AsyncLLM, engine core and
worker in their own processes) reads the KV layout from its worker on CUDA vLLM, for the
Qwen3.6-35B-A3B shape with FP8 KV, and it equals what the engine allocated.

    python3 benchmarks/gpu/kv_adapter_check.py OUT_DIR

Dummy weights, no tokenizer. Writes OUT_DIR/kv_adapter_check.json and prints one line.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHAPES = Path(__file__).resolve().parent / "shapes"


async def main(out: Path) -> int:
    sys.path.insert(0, str(ROOT))
    from engine_adapter.vllm_local import VllmEngineConfig, VllmLocalEngine

    mdir = Path("/tmp/models/kv-adapter-35b")
    mdir.mkdir(parents=True, exist_ok=True)
    (mdir / "config.json").write_text((SHAPES / "qwen3.6-35b-a3b.config.json").read_text())
    kv_bytes = 4 * 1024**3
    engine = VllmLocalEngine(
        VllmEngineConfig(
            name="qwen3.6-35b-a3b-fp8",
            model=str(mdir),
            dtype="bfloat16",
            max_model_len=16384,
            max_num_seqs=8,
            max_num_batched_tokens=4096,
            kv_cache_bytes=kv_bytes,
            kv_cache_dtype="fp8",
            load_format="dummy",
            compact_json=False,
            extra_args={"skip_tokenizer_init": True, "language_model_only": True, "gdn_prefill_backend": "triton"},
        )
    )
    t0 = time.monotonic()
    await engine.start()
    spec = engine.kv_spec
    ok = kv_bytes // spec.bytes_per_block == spec.num_blocks and len(spec.groups) == 4
    res = {"startup_s": round(time.monotonic() - t0, 1), "ok": ok, "spec": dataclasses.asdict(spec)}
    print(
        f"[adapter] {'OK ' if ok else 'BAD'} {spec.num_blocks} blocks x {spec.block_size} tokens, "
        f"{spec.bytes_per_block} B/block, groups {[(g.kind, g.num_layers, g.mamba_mode) for g in spec.groups]}",
        flush=True,
    )
    (out / "kv_adapter_check.json").write_text(json.dumps(res, indent=1))
    await engine.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    sys.exit(asyncio.run(main(out_dir)))
