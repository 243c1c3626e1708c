"""The shipped configs load, their memory plans fit, and the placement is the one documented."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gateway.plan import planner
from gateway.settings import load_settings
from policies.memory_plan import MemoryPlan

CONFIG = Path(__file__).resolve().parents[2] / "config"


@pytest.mark.parametrize(
    "name",
    [
        "default.yaml",
        "sim-dgx-spark.yaml",
        "dgx-spark.yaml",
        "dgx-spark-2.yaml",
        "replay.yaml",
        "frontend.yaml",
    ],
)
def test_config_loads(name: str) -> None:
    s = load_settings(CONFIG / name)
    plan = s.memory_plan()
    assert plan is None or isinstance(plan, MemoryPlan), plan


def test_real_deployment_two_boxes() -> None:
    """Placement (c) of `sparkgate plan --two-sparks` (issue 41): the 27B on spark-1, the
    35B-A3B on spark-2's engine host, each box's 121.6 GiB MemTotal planned in full."""
    one, two = load_settings(CONFIG / "dgx-spark.yaml"), load_settings(CONFIG / "dgx-spark-2.yaml")
    plan1, plan2 = one.memory_plan(), two.memory_plan()
    assert isinstance(plan1, MemoryPlan) and isinstance(plan2, MemoryPlan)
    assert one.box is not None and one.box.memory == int(121.6 * (1 << 30))
    # Less the reserve, the weights, one engine's start-up transient and the floor of free memory.
    assert plan1.kv_cache == {"qwen3.8-27b": one.box.memory - (24 + 20 + 2 + 4 << 30)}  # 71.60 GiB
    assert plan2.kv_cache == {"qwen3.6-35b-a3b": one.box.memory - (24 + 22 + 2 + 4 << 30)}  # 69.60 GiB
    assert plan1.worst_free == plan2.worst_free == 4 << 30
    assert one.boxes() == {"qwen3.8-27b": "spark-1", "qwen3.6-35b-a3b": "spark-2"}
    remote = {m.name: m.remote for m in one.models if m.engine == "remote"}
    assert list(remote) == ["qwen3.6-35b-a3b"] and remote["qwen3.6-35b-a3b"] is not None
    assert remote["qwen3.6-35b-a3b"].address == f"http://spark-2:{two.server.port}"
    assert [m.name for m in two.models] == ["qwen3.6-35b-a3b"] and two.models[0].engine == "vllm"


def test_no_shipped_config_needs_what_its_vllm_lacks() -> None:
    """VLLM_PLE_TABLE_MEMORY is a fork's, not vLLM's: no shipped config or compose file sets it.
    Every config that serves vLLM in-process names a supported vLLM or runs the installed one,
    and needs nothing that version lacks (a table on disk: 0.34)."""
    from gateway import vllm_versions

    root = CONFIG.parent
    for f in [*CONFIG.glob("*.yaml"), *(root / "deploy/dgx-spark").glob("*.yml")]:
        assert "VLLM_PLE_TABLE_MEMORY" not in f.read_text(), f
    installed = vllm_versions.installed()
    assert installed is not None
    for f in CONFIG.glob("*.yaml"):
        s = load_settings(f)
        version = vllm_versions.parse(s.vllm_version) if s.vllm_version else installed.version
        assert vllm_versions.supported(version) is not None, f
        for m in s.models:
            assert all(vllm_versions.lacks(version, x) is None for x in m.vllm_features()), (f, m.name)
    spark = [load_settings(CONFIG / n).vllm_version for n in ("dgx-spark.yaml", "dgx-spark-2.yaml")]
    assert spark == ["0.34.0", "0.34.0"]


def test_the_three_models_never_share_one_box() -> None:
    """With its n-gram table on disk (vLLM 0.34) Flash-Next has a box of its own, alone: its
    75.2 GiB of weights leave no room for a second model's. The three never share one box."""
    s = load_settings(CONFIG / "sim-dgx-spark.yaml")
    one_box = {p.name for p in planner.placements(s.models, 1)}
    assert one_box == {"qwen3.6-35b-a3b", "qwen3.8-27b", "qwen3.8-27b + qwen3.6-35b-a3b", "qwen3.8-flash-next"}
    two = {p.name for p in planner.placements(s.models, 2)}
    assert "qwen3.8-27b + qwen3.6-35b-a3b | qwen3.8-flash-next" in two
    assert not any("+ qwen3.8-flash-next" in n or "qwen3.8-flash-next +" in n for n in two)
    in_memory = [m if m.ple_table is None else m.with_ple_placement("host") for m in s.models]
    assert not any("flash-next" in p.name for p in planner.placements(in_memory, 2))


def test_the_real_engines_cap_long_prefills_as_the_router_assumes(tmp_path: Path) -> None:
    """The DGX Spark engines get vLLM's long-prefill cap (a chat starts beside a document), at
    least one of their stretched hybrid blocks (vLLM asserts it in align mode), and the box
    model runs them with the same scheduler settings (docs/routing.md)."""
    from engine_adapter.vllm_local import VllmLocalEngine
    from gateway.app import vllm_engine

    real: dict[str, tuple[int, int]] = {}
    for name in ("dgx-spark.yaml", "dgx-spark-2.yaml"):
        s = load_settings(CONFIG / name)
        for m in s.models:
            if m.engine != "vllm":
                continue
            engine = vllm_engine(s, m)
            assert isinstance(engine, VllmLocalEngine)
            # vLLM's arguments as the engine would start with them (the weights live on the box).
            local = VllmLocalEngine(dataclasses.replace(engine.config, model=str(tmp_path), tokenizer=None))
            args = local._engine_args()
            real[m.name] = (args.max_num_batched_tokens, args.long_prefill_token_threshold)
    # FP8 KV blocks measured on CUDA vLLM (../shared/device/README.md): 2,096 and 1,568 tokens.
    # (Flash-Next is not in the shipped placement any more: issue 41.)
    assert real == {"qwen3.6-35b-a3b": (4096, 2096), "qwen3.8-27b": (4096, 1568)}
    sim = load_settings(CONFIG / "sim-dgx-spark.yaml")
    simulated = {m.name: (m.max_num_batched_tokens, m.long_prefill_token_threshold) for m in sim.models}
    assert {n: simulated[n] for n in real} == real


def test_the_demo_key_takes_a_first_benchmark_burst() -> None:
    """`make serve`'s key lets a benchmark's few hundred requests at once in (queued, not 429 or
    503): vLLM's cancellation test sends 200; docs/quotas.md says how to lower it for a team."""
    settings = load_settings(CONFIG / "default.yaml")
    (dev,) = [k for k in settings.auth.keys if k.name == "dev"]
    assert dev.max_concurrency is None and (settings.quotas.defaults.max_concurrency or 0) >= 200
    assert settings.admission.max_queued_per_user >= 200 and settings.admission.max_queued >= 200
