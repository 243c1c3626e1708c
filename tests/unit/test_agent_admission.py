"""benchmarks/agent_admission.py: coding agents' worst-case reservations on the DGX Spark box
model leave every model's running slots, not its KV, as the bound."""

from __future__ import annotations

from pathlib import Path

from benchmarks.agent_admission import rows

ROOT = Path(__file__).resolve().parents[2]


def test_worst_case_agent_requests_fit_more_than_the_slots() -> None:
    got = rows(ROOT / "config/sim-dgx-spark.yaml", [20000, 25000], 32000, 18000)
    assert {r.model for r in got} == {"qwen3.8-27b", "qwen3.8-flash-next", "qwen3.6-35b-a3b"}
    for r in got:
        # 25K prompt + 32K output = 57K tokens, 3,563 blocks of 16 tokens.
        assert r.blocks == -(-(r.prompt + 32000) // 16)
        assert r.slots <= r.distinct < r.shared  # a shared prefix is reserved once
    assert min(r.distinct for r in got) == 13  # the 27B beside the 35B-A3B on one box: 24.8 GiB of KV


def test_the_kv_binds_when_the_pool_is_small() -> None:
    got = rows(ROOT / "config/sim-dgx-spark.yaml", [25000], 262144 - 25000, 0)
    assert any(r.distinct < r.slots for r in got)
