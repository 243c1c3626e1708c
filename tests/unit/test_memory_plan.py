"""policies/memory_plan.py and its wiring into settings: the box must hold every co-resident model."""

from __future__ import annotations

import pytest

from gateway.settings import Settings, model_memory
from policies.memory_plan import (
    GiB,
    KvBlocks,
    MemoryPlan,
    ModelMemory,
    PlanDoesNotFit,
    PleTable,
    min_kv_blocks,
    plan_memory,
)


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


# -- Flash-Next on vLLM 0.32 (issue 41; ../shared/reference/flash-next.md sections 2 and 4) ----------

SPARK = int(121.6 * GiB)  # MemTotal of a DGX Spark
FLASH_WEIGHTS = int(75.2 * GiB)  # non-PLE NVFP4 weights (vllm#56757)
BLOCKS = KvBlocks(block_bytes=40_943_616, block_tokens=3136, state_blocks=9)  # CUDA rule, FP8, prefix caching


def _table(dtype: str = "fp8", placement: str = "host") -> PleTable:
    return PleTable(rows=320_001_536, dim=160, dtype=dtype, placement=placement)  # type: ignore[arg-type]


def _flash(**kw: object) -> ModelMemory:
    args: dict[str, object] = {
        "name": "flash",
        "weights": FLASH_WEIGHTS,
        "ple": _table(),
        "max_num_batched_tokens": 4096,
        "kv_blocks": BLOCKS,
        "max_num_seqs": 4,
        "max_model_len": 262_144,
    }
    return ModelMemory(**(args | kw))  # type: ignore[arg-type]


def test_the_ngram_table_by_dtype_and_placement() -> None:
    assert _table("bf16").bytes == 102_400_491_520 and f"{_table('bf16').bytes / GiB:.2f}" == "95.37"
    assert _table("fp8").bytes == 51_200_245_760 and f"{_table('fp8').bytes / GiB:.2f}" == "47.68"
    assert _table(placement="host").resident == _table(placement="device").resident == 51_200_245_760
    assert _table(placement="disk").resident == 0  # the page cache's, evictable
    assert _table().prefetch_bytes(4096) == 4096 * 16 * 160 == 10 * 1024**2


def test_flash_next_on_one_spark_does_not_fit_with_its_table_in_memory() -> None:
    """75.2 GiB of weights + 47.68 GiB of FP8 table = 122.89 GiB > 121.6 GiB, before any KV."""
    plan = plan_memory(total=SPARK, reserved=0, models=[_flash()])
    assert isinstance(plan, PlanDoesNotFit)
    assert plan.over == FLASH_WEIGHTS + 51_200_245_760 + 10 * 1024**2 - SPARK
    assert "1.29 GiB more than the box has" in plan.message and "n-gram table 47.68 GiB" in plan.message


def test_the_pool_is_whole_blocks_with_state_blocks_per_request() -> None:
    """Table on disk (a non-stock build): 18 GiB -> 472 blocks of 3,136 tokens (flash-next.md)."""
    plan = plan_memory(total=SPARK, reserved=0, models=[_flash(ple=_table(placement="disk"), kv_cache=19_327_352_832)])
    assert isinstance(plan, MemoryPlan)
    assert plan.kv_cache == {"flash": 472 * 40_943_616}
    assert "flash KV: 472 blocks of 3136 tokens (39.05 MiB), 36 of them state blocks for 4 sequences" in "\n".join(
        plan.lines
    )
    assert plan.unplanned == SPARK - FLASH_WEIGHTS - 10 * 1024**2 - 472 * 40_943_616
    assert min_kv_blocks(BLOCKS, max_num_seqs=4, max_model_len=262_144) == 84 + 36
    no_prefix = KvBlocks(block_bytes=40_943_616, block_tokens=3136, state_blocks=5)
    assert min_kv_blocks(no_prefix, max_num_seqs=4, max_model_len=262_144) == 84 + 20


def test_a_pool_short_of_its_blocks_does_not_fit() -> None:
    plan = plan_memory(
        total=SPARK, reserved=0, models=[_flash(ple=_table(placement="disk"), kv_cache=119 * 40_943_616)]
    )
    assert isinstance(plan, PlanDoesNotFit) and plan.over == 40_943_616 and "it needs 120" in plan.message


def test_a_tensor_parallel_shard_holds_half_the_weights_and_table() -> None:
    """TP=2 over two Sparks beside the 27B: 20 + 37.6 + 23.84 GiB + the buffer, the rest KV."""
    half = _flash(shards=2, kv_blocks=KvBlocks(block_bytes=40_943_616 // 2, block_tokens=3136, state_blocks=9))
    plan = plan_memory(total=SPARK, reserved=24 * GiB, models=[ModelMemory(name="27b", weights=20 * GiB), half])
    assert isinstance(plan, MemoryPlan)
    assert half.fixed == FLASH_WEIGHTS // 2 + 51_200_245_760 // 2 + 10 * 1024**2
    assert f"{plan.kv_cache['27b'] / GiB:.2f}" == "8.07"


def test_settings_feed_the_table_and_blocks() -> None:
    s = Settings(
        models=[  # type: ignore[list-item]
            {
                "name": "flash",
                "path": "x",
                "weights_bytes": "75.2GiB",
                "max_num_seqs": 4,
                "max_model_len": 262144,
                "max_num_batched_tokens": 4096,
                "enable_prefix_caching": False,
                "ple_table": {"rows": 320001536, "dim": 160, "placement": "disk", "requires_build": "a fork"},
                "kv_blocks": {"block_bytes": 40943616, "block_tokens": 3136, "state_groups": 4, "ring_groups": 1},
            }
        ],
        box={"memory": "121.6GiB", "reserved": "24GiB"},  # type: ignore[arg-type]
    )
    mm = model_memory(s.models[0])
    assert mm.kv_blocks == KvBlocks(block_bytes=40943616, block_tokens=3136, state_blocks=5)  # prefix caching off
    assert mm.ple is not None and mm.ple.requires_build == "a fork" and mm.ple_bytes == 0
    assert isinstance(s.memory_plan(), MemoryPlan)
    with pytest.raises(ValueError, match=r"stock vLLM 0\.32 has no disk-backed n-gram table"):
        Settings(models=[{"name": "m", "path": "x", "ple_table": {"rows": 1, "dim": 1, "placement": "disk"}}])  # type: ignore[list-item]
