"""Shares of a remote engine: claims add up to at most the whole, leases lapse, and a
share's KV spec never hands out more than its part of the pool."""

from __future__ import annotations

import pytest

from engine_adapter.base import KVGroup, KVSpec
from policies.shares import Lease, Refused, grant, live, release, renew, share_spec

SPEC = KVSpec(
    block_size=16,
    num_blocks=1001,  # 1000 usable
    bytes_per_block=4096,
    kv_cache_bytes=1001 * 4096,
    cache_dtype="bfloat16",
    groups=(KVGroup(kind="full_attention", num_layers=2, block_size=16, page_bytes_per_layer=2048),),
    max_model_len=4096,
    prefix_caching=True,
    max_num_seqs=4,
)


def test_claims_add_up_to_the_whole_and_no_more() -> None:
    a = grant({}, "a", 0.5, now=0, ttl_s=10)
    assert a == {"a": Lease(0.5, 10)}
    assert not isinstance(a, Refused)
    thirds = grant(grant(grant({}, "x", 1 / 3, 0, 10), "y", 1 / 3, 0, 10), "z", 1 / 3, 0, 10)  # type: ignore[arg-type]
    assert not isinstance(thirds, Refused) and len(thirds) == 3  # rounding does not refuse a third third
    over = grant(a, "b", 0.6, now=1, ttl_s=10)
    assert isinstance(over, Refused) and "hold 0.5" in over.message and "free: 0.5" in over.message
    # A gateway re-claiming replaces its own share instead of adding to it.
    again = grant(a, "a", 1.0, now=1, ttl_s=10)
    assert again == {"a": Lease(1.0, 11)}


@pytest.mark.parametrize("share", [0.0, -0.1, 1.5])
def test_a_share_outside_0_1_is_refused(share: float) -> None:
    refused = grant({}, "a", share, now=0, ttl_s=10)
    assert isinstance(refused, Refused) and "(0, 1]" in refused.message


def test_a_lapsed_lease_frees_its_share_and_must_be_claimed_again() -> None:
    claims = {"dead": Lease(0.9, 5.0)}
    assert live(claims, 4.9) == claims and live(claims, 5.0) == {}
    after = grant(claims, "new", 0.5, now=6, ttl_s=10)
    assert after == {"new": Lease(0.5, 16)}  # the dead gateway's lease is dropped
    refused = renew(claims, "dead", now=6, ttl_s=10)
    assert isinstance(refused, Refused) and "no live claim" in refused.message
    assert renew(claims, "dead", now=1, ttl_s=10) == {"dead": Lease(0.9, 11)}


def test_release_frees_at_once() -> None:
    claims = {"a": Lease(0.5, 10), "b": Lease(0.5, 10)}
    assert release(claims, "a", now=1) == {"b": Lease(0.5, 10)}
    assert release(claims, "nobody", now=1) == claims


def test_a_share_spec_rounds_down_so_shares_never_overlap() -> None:
    half = share_spec(SPEC, 0.5)
    assert isinstance(half, KVSpec)
    assert half.usable_blocks == 500 and half.max_num_seqs == 2 and half.kv_cache_bytes == 500 * 4096
    third = share_spec(SPEC, 1 / 3)
    assert isinstance(third, KVSpec)
    assert 3 * third.usable_blocks <= SPEC.usable_blocks and third.max_num_seqs == 1
    whole = share_spec(SPEC, 1.0)
    assert isinstance(whole, KVSpec) and whole.usable_blocks == 1000 and whole.max_num_seqs == 4
    assert whole.block_size == SPEC.block_size and whole.groups == SPEC.groups


def test_a_share_too_small_to_run_one_sequence_is_refused() -> None:
    tiny = share_spec(SPEC, 0.2)  # 0.8 of a slot
    assert isinstance(tiny, Refused) and "nothing to admit" in tiny.message
