"""What the in-process GPU checks share (kv_check.py, chunk_cap.py): a CUDA vLLM engine of a real
model shape (`shapes/`) with dummy weights and no tokenizer, its core in this process so the
scheduler can be read and stepped; and a driver that runs each case in its own process (a GPU
engine does not free all its memory on shutdown)."""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

SHAPES = Path(__file__).resolve().parent / "shapes"


def dummy_engine(name: str, shape: str, **engine_args: Any) -> tuple[Any, int, float]:
    """(engine, vocab size, startup seconds) for `shapes/<shape>` with these engine args."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    mdir = Path("/tmp/models") / name
    mdir.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((SHAPES / shape).read_text())
    (mdir / "config.json").write_text(json.dumps(cfg))
    t0 = time.monotonic()
    engine = LLMEngine.from_engine_args(
        EngineArgs(
            model=str(mdir),
            load_format="dummy",
            skip_tokenizer_init=True,
            dtype="bfloat16",
            enforce_eager=True,
            enable_prefix_caching=True,
            language_model_only=True,
            gdn_prefill_backend="triton",
            seed=0,
            **engine_args,
        )
    )
    return engine, cfg.get("text_config", cfg)["vocab_size"], round(time.monotonic() - t0, 1)


def prompt_ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    """n random ids clear of the special tokens at either end of the vocabulary."""
    return [rng.randrange(1000, vocab - 1000) for _ in range(n)]


def main(cases: Iterable[str], run_case: Callable[[str, Path], bool], script: str) -> int:
    """`script OUT_DIR [--case NAME]`: one case here, or each in a process of its own."""
    cases = list(cases)
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--case", choices=cases)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if a.case:
        return 0 if run_case(a.case, a.out) else 1
    rc = 0
    for name in cases:
        rc |= subprocess.run([sys.executable, script, str(a.out), "--case", name]).returncode
    return rc
