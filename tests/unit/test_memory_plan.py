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
    assert _table().buffer_bytes(4096) == 4096 * 16 * 160 == 10 * 1024**2  # host: the prefetch rows
    assert _table("bf16").buffer_bytes(4096) == 20 * 1024**2
    assert _table(placement="device").buffer_bytes(4096) == 0  # no prefetch
    # disk (vLLM 0.34): an int64 id and three copies of each row a step looks up
    assert _table(placement="disk").buffer_bytes(4096) == 4096 * 16 * (8 + 3 * 160) == 30.5 * 1024**2


def test_flash_next_on_one_spark_does_not_fit_with_its_table_in_memory() -> None:
    """75.2 GiB of weights + 47.68 GiB of FP8 table = 122.89 GiB > 121.6 GiB, before any KV."""
    plan = plan_memory(total=SPARK, reserved=0, models=[_flash()])
    assert isinstance(plan, PlanDoesNotFit)
    assert plan.over == FLASH_WEIGHTS + 51_200_245_760 + 10 * 1024**2 - SPARK
    assert "1.29 GiB more than the box has" in plan.message and "n-gram table 47.68 GiB" in plan.message


def test_the_pool_is_whole_blocks_with_state_blocks_per_request() -> None:
    """Table on disk: 18 GiB -> 472 blocks of 3,136 tokens (flash-next.md)."""
    plan = plan_memory(total=SPARK, reserved=0, models=[_flash(ple=_table(placement="disk"), kv_cache=19_327_352_832)])
    assert isinstance(plan, MemoryPlan)
    assert plan.kv_cache == {"flash": 472 * 40_943_616}
    assert "flash KV: 472 blocks of 3136 tokens (39.05 MiB), 36 of them state blocks for 4 sequences" in "\n".join(
        plan.lines
    )
    # Left free: at least the page cache a 4,096-token step's rows pass through (65,536 rows of
    # 160 B, a 4 KiB page each and 1 in 32 a second one: 264 MiB).
    assert plan.unplanned == SPARK - FLASH_WEIGHTS - 30.5 * 1024**2 - 472 * 40_943_616 - 264 * 1024**2
    assert plan.worst_free == plan.unplanned + 264 * 1024**2
    text = "\n".join(plan.lines)
    assert "+ its lookup buffers 30 MiB (a step reads 264 MiB of its pages through the page cache)" in text
    assert text.endswith("floor 0.26 GiB")
    assert _table(placement="disk").step_pages(4096) == 264 * 1024**2 and _table().step_pages(4096) == 0
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
                "ple_table": {"rows": 320001536, "dim": 160, "placement": "disk"},
                "kv_blocks": {"block_bytes": 40943616, "block_tokens": 3136, "state_groups": 4, "ring_groups": 1},
            }
        ],
        box={"memory": "121.6GiB", "reserved": "24GiB"},  # type: ignore[arg-type]
    )
    mm = model_memory(s.models[0])
    assert mm.kv_blocks == KvBlocks(block_bytes=40943616, block_tokens=3136, state_blocks=5)  # prefix caching off
    assert mm.ple is not None and mm.ple.placement == "disk" and mm.ple_bytes == 0
    assert isinstance(s.memory_plan(), MemoryPlan)
    # The placement is what vLLM gets, as its engram_config, over what engine_args say.
    assert s.models[0].vllm_engine_args()["engram_config"] == {"disk_offload": True}
    assert s.models[0].vllm_features() == ["ple_table", "ple_disk"]
    host = s.models[0].model_copy(
        update={
            "ple_table": s.models[0].ple_table.model_copy(update={"placement": "host"}),  # type: ignore[union-attr]
            "engine_args": {"engram_config": {"use_thp": True, "cpu_offload": False}},
        }
    )
    assert host.vllm_engine_args()["engram_config"] == {"use_thp": True, "cpu_offload": True}
    assert host.vllm_features() == ["ple_table"]


def test_the_floor_holds_at_the_worst_moment() -> None:
    """Every engine's KV allocated and engines starting (their transients held): the floor of
    free memory still holds, and the KV pools take only what is left after both. One after
    another, the largest transient counts; side by side, all of them."""
    a = ModelMemory(name="a", weights=20 * GiB, startup=2 * GiB)
    b = ModelMemory(name="b", weights=22 * GiB, startup=3 * GiB)
    plan = plan_memory(total=SPARK, reserved=24 * GiB, models=[a, b], min_free=4 * GiB, side_by_side=True)
    assert isinstance(plan, MemoryPlan)
    # 121.6 - 24 - 42 - 5 (both transients) - 4 (the floor) = 46.6 GiB of KV, 23.3 each.
    assert f"{plan.kv_cache['a'] / GiB:.2f}" == f"{plan.kv_cache['b'] / GiB:.2f}" == "23.30"
    assert plan.worst_free == 4 * GiB + plan.unplanned
    assert plan.used == SPARK - plan.unplanned - 9 * GiB  # once started, the transients are free again
    text = "\n".join(plan.lines)
    assert (
        "worst moment, every engine starting (5.00 GiB of start-up transients): 4.00 GiB free, floor 4.00 GiB" in text
    )
    assert "a: weights 20.00 GiB + overhead 0.00 GiB + KV share of the rest; at start-up 2.00 GiB more" in text
    one_by_one = plan_memory(total=SPARK, reserved=24 * GiB, models=[a, b], min_free=4 * GiB)
    assert isinstance(one_by_one, MemoryPlan)
    assert f"{one_by_one.kv_cache['a'] / GiB:.2f}" == "24.30"  # 121.6 - 24 - 42 - 3 - 4 = 48.6
    assert "worst moment, the largest engine starting (3.00 GiB" in "\n".join(one_by_one.lines)


def test_a_plan_under_the_floor_says_by_how_much() -> None:
    """Fixed pools that leave less than the floor at the worst moment do not fit, by that much."""
    a = ModelMemory(name="a", weights=20 * GiB, kv_cache=70 * GiB, startup=3 * GiB)
    plan = plan_memory(total=SPARK, reserved=24 * GiB, models=[a], min_free=6 * GiB)
    assert isinstance(plan, PlanDoesNotFit)
    # 121.6 - 24 - 20 - 70 = 7.6 GiB free once started; starting, 3 GiB less: 4.6 < 6.
    assert f"{plan.over / GiB:.2f}" == "1.40"
    assert "floor of free memory (6.00 GiB: box.min_free" in plan.message and "4.60 GiB would be free" in plan.message
    assert "1.40 GiB under the floor" in plan.message
    no_floor = plan_memory(total=SPARK, reserved=24 * GiB, models=[a])
    assert isinstance(no_floor, MemoryPlan) and "worst moment" in "\n".join(no_floor.lines)
    assert no_floor.worst_free == no_floor.unplanned
