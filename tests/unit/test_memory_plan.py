"""policies/memory_plan.py and its wiring into settings: the box must hold every co-resident model."""

from __future__ import annotations

import pytest

from gateway.settings import Settings
from policies.memory_plan import GiB, MemoryPlan, ModelMemory, PlanDoesNotFit, plan_memory


def test_the_rest_is_split_by_share() -> None:
    plan = plan_memory(
        total=128 * GiB,
        reserved=26 * GiB,
        models=[
            ModelMemory(name="a3b", weights=20 * GiB, overhead=2 * GiB),
            ModelMemory(name="27b", weights=18 * GiB, overhead=2 * GiB, kv_share=3.0),
        ],
    )
    assert isinstance(plan, MemoryPlan)
    assert plan.kv_cache == {"a3b": 15 * GiB, "27b": 45 * GiB}
    assert plan.unplanned == 0
    assert any("a3b 15.00 GiB" in line for line in plan.lines)


def test_fixed_pools_leave_the_rest_unplanned() -> None:
    plan = plan_memory(total=100 * GiB, reserved=0, models=[ModelMemory(name="m", weights=10 * GiB, kv_cache=50 * GiB)])
    assert isinstance(plan, MemoryPlan) and plan.kv_cache == {"m": 50 * GiB} and plan.unplanned == 40 * GiB


def test_three_models_do_not_fit_one_spark() -> None:
    """The reference: ~22 + ~20 + ~85 GiB of weights and overheads against ~102 GiB at util 0.8."""
    plan = plan_memory(
        total=128 * GiB,
        reserved=26 * GiB,
        models=[
            ModelMemory(name="qwen3.6-35b-a3b", weights=22 * GiB),
            ModelMemory(name="qwen3.8-27b", weights=20 * GiB),
            ModelMemory(name="qwen3.8-flash-next", weights=85 * GiB),
        ],
    )
    assert isinstance(plan, PlanDoesNotFit)
    assert "qwen3.8-flash-next: weights 85.00 GiB" in plan.message and "25.00 GiB more than the box has" in plan.message


def test_a_sharing_model_left_with_nothing_does_not_fit() -> None:
    plan = plan_memory(
        total=10 * GiB,
        reserved=0,
        models=[ModelMemory(name="big", weights=5 * GiB, kv_cache=5 * GiB), ModelMemory(name="small", weights=0)],
    )
    assert isinstance(plan, PlanDoesNotFit) and "no room left for the KV cache of small" in plan.message


def _settings(**box: object) -> Settings:
    return Settings(
        models=[{"name": "m", "path": "x", "weights_bytes": "20GiB", "overhead_bytes": "1GiB"}],  # type: ignore[list-item]
        box=box,  # type: ignore[arg-type]
    )


def test_settings_apply_the_plan() -> None:
    s = _settings(memory="128GiB", reserved="8GiB")
    plan = s.memory_plan()
    assert isinstance(plan, MemoryPlan)
    assert s.with_kv_plan(plan).models[0].kv_cache_bytes == 99 * GiB
    assert Settings(models=[{"name": "m", "path": "x"}]).memory_plan() is None  # type: ignore[list-item]


def test_settings_refuse_a_box_without_weights() -> None:
    with pytest.raises(ValueError, match="weights_bytes for m"):
        Settings(models=[{"name": "m", "path": "x"}], box={"memory": "1GiB"})  # type: ignore[list-item,arg-type]
