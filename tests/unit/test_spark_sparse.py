"""engine_adapter/spark/: Flash-Next's sparse attention (QSA) and its n-gram table read from disk."""

from __future__ import annotations

import dataclasses

import pytest

from engine_adapter.spark import DGX_SPARK, H200, MODELS, BoxSim, Serving, SimConfig, step_cost
from engine_adapter.spark.physics import (
    PAGE_BYTES,
    attended_keys,
    indexer_pairs,
    kv_page_bytes,
    ple_read_seconds,
    sparse_attention_bytes,
)
from gateway.plan.fleet import Deployed, Fleet, Placement
from gateway.settings import ModelSettings, RoutingSettings

FLASH = MODELS["Qwen3.8-Flash-Next"].served(Serving())
MOE = MODELS["Qwen3.6-35B-A3B"]


def selected(n: int) -> int:
    """QSA's rule, written out: a query that sees n tokens takes the top min(n // 4, 512)
    compressed blocks of 4 and the n % 4 tokens of the open block."""
    return min(n // 4, 512) * 4 + n % 4


@pytest.mark.parametrize(("context", "new"), [(0, 1), (0, 2051), (0, 2052), (2049, 9), (100, 5000), (65531, 4096)])
def test_each_query_attends_its_selection_and_the_indexer_scores_every_visible_block(context: int, new: int) -> None:
    queries = range(context + 1, context + new + 1)  # tokens each query sees, itself included
    assert attended_keys(FLASH, context, new) == sum(selected(n) for n in queries)
    assert indexer_pairs(FLASH, context, new) == sum(n // 4 for n in queries)


def test_a_query_attends_all_of_up_to_2051_tokens_and_at_most_2051_past_them() -> None:
    assert attended_keys(FLASH, 2050, 1) == 2051
    assert attended_keys(FLASH, 2051, 1) == 2048
    assert attended_keys(FLASH, 200_000, 1) == 2048 + 200_001 % 4
    assert max(attended_keys(FLASH, c, 1) for c in range(100_000, 100_008)) == 2051


def test_dense_attention_is_unchanged() -> None:
    assert attended_keys(MOE, 1000, 4096) == 4096 * (1000 + 4096 / 2)
    assert indexer_pairs(MOE, 1000, 4096) == 0.0


def test_a_long_prefill_s_attention_is_the_gather_of_each_query_s_selection() -> None:
    """Past 2K tokens a chunk's attention no longer grows with its context (only the indexer
    does), and its sparse kernel is bound by the K/V it gathers, not by its FLOPs."""
    early = step_cost(DGX_SPARK, FLASH, [], [(8192, 4096, False)])
    late = step_cost(DGX_SPARK, FLASH, [], [(61440, 4096, True)])
    gather = sparse_attention_bytes(FLASH, 61440, 4096)
    assert gather == FLASH.full_attention_layers * kv_page_bytes(FLASH) * 4096 * (2048 + 1.5)
    dense = dataclasses.replace(FLASH, sparse_attention_budget=0)
    dense_late = step_cost(DGX_SPARK, dense, [], [(61440, 4096, True)])
    assert late.compute_s < dense_late.compute_s
    # Gather at the bandwidth: 4096 rows x 2049.5 keys x 1 KiB x 12 layers; the indexer grows with the context.
    gather_s = gather / DGX_SPARK.effective_bandwidth
    assert late.compute_s - early.compute_s < 0.1 * gather_s
    assert late.compute_s > gather_s


def test_a_long_context_decode_reads_its_selection_not_the_whole_kv() -> None:
    k1 = FLASH.spec.draft_tokens + 1
    step = step_cost(DGX_SPARK, FLASH, [65536])
    dense = step_cost(DGX_SPARK, dataclasses.replace(FLASH, sparse_attention_budget=0), [65536])
    # Saved: the K/V of all 64K tokens; spent: each verified position's own 2K selection and its
    # FP32 logits over the 16K compressed blocks (the compressed keys are read either way, the
    # indexer's up to the verified positions' own).
    saved = 65536 * 12 * kv_page_bytes(FLASH)
    spent = 12 * kv_page_bytes(FLASH) * attended_keys(FLASH, 65536, k1) + 12 * 8 * indexer_pairs(FLASH, 65536, k1)
    spent += 12 * FLASH.indexer_bytes_per_token * k1
    assert dense.bytes - step.bytes == pytest.approx(saved - spent)
    assert step.seconds < dense.seconds


def test_the_table_on_disk_costs_each_step_its_rows_pages_at_the_drive_s_rate() -> None:
    tokens = 5  # one decode: k + 1 verified positions
    rows = tokens * 16
    pages = rows * (1 + (160 - 32) / PAGE_BYTES)  # 160-B rows at multiples of 32 B straddle 128 of 4096 offsets
    rate = min(DGX_SPARK.nvme_read_iops, DGX_SPARK.nvme_read_bandwidth / PAGE_BYTES)
    assert rate == pytest.approx(4 * 16e9 * 128 / 130 / 8 / 4096)  # the Gen4 x4 link binds, not the drive's IOPS
    assert ple_read_seconds(DGX_SPARK, FLASH, tokens) == pytest.approx(pages / rate)
    in_memory = step_cost(DGX_SPARK, FLASH, [2048])
    on_disk = step_cost(DGX_SPARK, FLASH, [2048], ple_table_on_disk=True)
    assert on_disk.seconds - in_memory.seconds == pytest.approx(pages / rate)
    assert on_disk.ple_read_s == pytest.approx(pages / rate)
    assert in_memory.ple_read_s == 0.0


def test_an_engine_with_its_table_on_disk_waits_for_it_in_ttft_and_tpot() -> None:
    def first_and_last(on_disk: bool) -> tuple[float, float]:
        sim = BoxSim(MODELS["Qwen3.8-Flash-Next"], DGX_SPARK, SimConfig(ple_table_on_disk=on_disk))
        sim.submit("r", [1_000_000, *range(10, 8201)], 64, arrival_time=0.0)
        first = last = 0.0
        for res in sim.run_until_idle():
            for e in res.events:
                first = res.end if e.first_token else first
                last = res.end if e.finished else last
        return first, last

    (f0, l0), (f1, l1) = first_and_last(False), first_and_last(True)
    assert f1 - f0 == pytest.approx(ple_read_seconds(DGX_SPARK, FLASH, 8192))  # two 4096-token chunks
    assert (l1 - f1) > (l0 - f0)


def test_a_table_on_disk_needs_a_table_and_a_drive() -> None:
    with pytest.raises(ValueError, match="no n-gram table"):
        BoxSim(MOE, DGX_SPARK, SimConfig(ple_table_on_disk=True))
    with pytest.raises(ValueError, match="no drive spec"):
        BoxSim(MODELS["Qwen3.8-Flash-Next"], H200, SimConfig(ple_table_on_disk=True))


def _flash_settings(placement: str) -> ModelSettings:
    table = {"rows": 320001536, "dim": 160, "placement": placement}
    return ModelSettings.model_validate(
        {
            "name": "flash",
            "path": "p",
            "engine": "simulated",
            "simulated": {"model": "Qwen3.8-Flash-Next"},
            "ple_table": table,
        }
    )


@pytest.mark.parametrize(("placement", "on_disk"), [("disk", True), ("host", False), ("device", False)])
def test_a_placement_reads_the_table_from_disk_where_the_settings_put_it_there(placement: str, on_disk: bool) -> None:
    deployed = Deployed.of(_flash_settings(placement), "box-1")
    assert deployed.ple_table_on_disk is on_disk
    fleet = Fleet(Placement("p", (deployed,)), RoutingSettings(), "round_robin")
    assert fleet.lanes["flash"].sim.config.ple_table_on_disk is on_disk
