"""Coding agents on the DGX Spark box model: how many of their requests each model admits at
once when admission reserves every request's worst case.

Run from the repository root (no engine, no GPU; the box model only):

    .venv/bin/python benchmarks/agent_admission.py [--config config/sim-dgx-spark.yaml]
        [--prompt 20000 --prompt 25000] [--max-tokens 32000] [--shared 18000]

Claude Code asks `max_tokens: 32000` on every request, over a 20-25K-token prompt (its tools
and instructions, then the conversation). sparkgate reserves a request's peak KV (prompt plus
max_tokens, whole blocks) before it reaches vLLM, so vLLM never preempts it. Per model, with
the pool the box model gives it (`kv_cache_bytes` and `max_num_seqs` from the config):

- blocks: one agent request's worst-case reservation (policies/kv.py `footprint`);
- distinct: agent sessions with nothing in common admitted at once;
- shared: sessions of one agent whose first `--shared` prompt tokens (tools, instructions)
  are the same: those blocks are reserved once (what the ledger predicts for live requests);
- slots: `max_num_seqs`; the worst case binds when the admitted count is below it.

Should it bind (a smaller KV budget, more slots), a policy that still never lets vLLM preempt
is to reserve the output in installments: the engine request's own max_tokens is one
installment, so vLLM never needs more than was reserved, and at its end the gateway continues
the answer as a new engine request over prompt + output so far (all prefix-cache hits: its own
blocks, still held) once the ledger grants the next installment. `--max-tokens 4096` shows
what one installment of 4,096 tokens would admit.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.__file__))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse
from dataclasses import dataclass
from pathlib import Path

from engine_adapter.base import KVSpec
from engine_adapter.spark.catalogue import MODELS
from engine_adapter.spark.hardware import DGX_SPARK
from engine_adapter.spark.scheduler import BoxSim, SimConfig
from gateway.settings import load_settings
from policies import kv


@dataclass(frozen=True)
class Row:
    model: str
    prompt: int
    blocks: int
    distinct: int
    shared: int
    slots: int


def _at_once(spec: KVSpec, prompt: int, max_tokens: int, shared_tokens: int) -> tuple[int, int, int]:
    """(blocks per request, distinct sessions at once, sessions sharing `shared_tokens`)."""
    ids = list(range(1, prompt + 1))
    one = kv.footprint(spec, ids, max_tokens).blocks
    capacity = spec.usable_blocks
    distinct = capacity // one
    common = min(shared_tokens, prompt - 1) // spec.block_size if spec.prefix_caching and kv.sharable(spec) else 0
    extra = one - common
    shared = 0 if one > capacity else 1 + (capacity - one) // extra
    return one, distinct, shared


def rows(config: Path, prompts: list[int], max_tokens: int, shared_tokens: int) -> list[Row]:
    settings = load_settings(config)
    out = []
    for m in settings.models:
        if m.simulated is None:
            continue
        sim = BoxSim(
            MODELS[m.simulated.model],
            DGX_SPARK,
            SimConfig(
                max_num_seqs=m.max_num_seqs,
                max_model_len=m.max_model_len,
                kv_cache_bytes=m.kv_cache_bytes,
                enable_prefix_caching=m.enable_prefix_caching,
            ),
        )
        spec = sim.kv_spec()
        for p in prompts:
            blocks, distinct, shared = _at_once(spec, p, max_tokens, shared_tokens)
            out.append(Row(m.name, p, blocks, distinct, shared, m.max_num_seqs))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, default=Path("config/sim-dgx-spark.yaml"))
    ap.add_argument("--prompt", type=int, action="append", help="prompt tokens (repeatable)")
    ap.add_argument("--max-tokens", type=int, default=32000)
    ap.add_argument("--shared", type=int, default=18000, help="prompt tokens an agent's sessions share")
    args = ap.parse_args()
    prompts = args.prompt or [20000, 25000]
    print(
        f"agent requests: max_tokens {args.max_tokens}, {args.shared} prompt tokens shared "
        f"between one agent's sessions ({args.config}); blocks of {DGX_SPARK.name}'s box model"
    )
    header = ("model", "prompt", "blocks", "distinct", "shared", "slots")
    print(" | ".join(header))
    binding = []
    for r in rows(args.config, prompts, args.max_tokens, args.shared):
        binds = r.distinct < r.slots
        binding += [r.model] if binds else []
        cells = (r.model, r.prompt, r.blocks, r.distinct, r.shared, f"{r.slots}{' (KV binds)' if binds else ''}")
        print(" | ".join(str(c) for c in cells))
    if binding:
        print(f"the worst-case reservation binds before max_num_seqs on: {', '.join(sorted(set(binding)))}")
    else:
        print("max_num_seqs binds first on every model: the worst-case reservation costs no concurrency")


if __name__ == "__main__":
    main()
