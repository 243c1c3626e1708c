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
        "dgx-spark-vllm-server.yaml",
        "replay.yaml",
        "frontend.yaml",
    ],
)
def test_config_loads(name: str) -> None:
    s = load_settings(CONFIG / name)
    plan = s.memory_plan()
    assert plan is None or isinstance(plan, MemoryPlan), plan


def test_real_deployment_two_boxes() -> None:
    one, two = load_settings(CONFIG / "dgx-spark.yaml"), load_settings(CONFIG / "dgx-spark-2.yaml")
    plan1, plan2 = one.memory_plan(), two.memory_plan()
    assert isinstance(plan1, MemoryPlan) and isinstance(plan2, MemoryPlan)
    assert plan1.kv_cache == {"qwen3.8-27b": 30 << 30, "qwen3.6-35b-a3b": 30 << 30}
    assert plan2.kv_cache == {"qwen3.8-flash-next": 18 << 30}
    # The two in-process engines share spark-1: the router treats them as box-mates.
    # Flash-Next is spark-1's gateway's too, reached on spark-2's engine host.
    assert one.boxes() == {"qwen3.6-35b-a3b": "spark-1", "qwen3.8-27b": "spark-1", "qwen3.8-flash-next": "spark-2"}
    remote = {m.name: m.remote for m in one.models if m.engine == "remote"}
    assert list(remote) == ["qwen3.8-flash-next"] and remote["qwen3.8-flash-next"] is not None
    assert remote["qwen3.8-flash-next"].address == f"http://spark-2:{two.server.port}"
    assert [m.name for m in two.models] == ["qwen3.8-flash-next"] and two.models[0].engine == "vllm"


def test_the_three_models_never_share_one_box() -> None:
    s = load_settings(CONFIG / "sim-dgx-spark.yaml")
    one_box = {p.name for p in planner.placements(s.models, 1)}
    assert one_box == {
        "qwen3.6-35b-a3b",
        "qwen3.8-27b",
        "qwen3.8-flash-next",
        "qwen3.8-27b + qwen3.6-35b-a3b",
    }
    two = {p.name for p in planner.placements(s.models, 2)}
    assert "qwen3.8-27b + qwen3.6-35b-a3b | qwen3.8-flash-next" in two
    assert not any("flash-next +" in n or "+ qwen3.8-flash-next" in n for n in two)


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
    assert real == {"qwen3.6-35b-a3b": (4096, 2096), "qwen3.8-27b": (4096, 1568), "qwen3.8-flash-next": (4096, 2048)}
    sim = load_settings(CONFIG / "sim-dgx-spark.yaml")
    assert {m.name: (m.max_num_batched_tokens, m.long_prefill_token_threshold) for m in sim.models} == real


def test_the_vllm_server_placement_differs_only_in_flash_next() -> None:
    """config/dgx-spark-vllm-server.yaml is config/dgx-spark.yaml with Flash-Next on a stock
    vLLM server: the copy must not drift from the original anywhere else."""
    one, other = load_settings(CONFIG / "dgx-spark.yaml"), load_settings(CONFIG / "dgx-spark-vllm-server.yaml")
    flash = "qwen3.8-flash-next"
    assert one.model_dump(exclude={"models"}) == other.model_dump(exclude={"models"})
    rest = [m for m in one.models if m.name != flash], [m for m in other.models if m.name != flash]
    assert rest[0] == rest[1]
    served = next(m for m in other.models if m.name == flash)
    assert served.engine == "vllm-server" and served.vllm_server is not None
    assert served.vllm_server.address == "http://spark-2:8000" and served.vllm_server.api_key_env == "VLLM_API_KEY"
    # The server's --max-num-seqs, which vLLM does not publish: as spark-2's engine config says.
    spark2 = load_settings(CONFIG / "dgx-spark-2.yaml")
    assert served.max_num_seqs == spark2.models[0].max_num_seqs
    assert other.boxes() == one.boxes()
