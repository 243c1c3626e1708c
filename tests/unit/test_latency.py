"""policies/latency.py: predictions from a profile, corrected online, robust to outliers."""

import random

import pytest

from policies.latency import LatencyModel, Profile

A3B = Profile(prefill_tokens_per_s=4500, ttft_overhead_s=0.05, tpot_s=1 / 171, tpot_per_sequence_s=0.0007)


def test_profile_predictions() -> None:
    m = LatencyModel(A3B)
    p = m.predict(prompt_tokens=2048)
    assert p.ttft_s == pytest.approx(0.05 + 2048 / 4500)
    assert p.tpot_s == pytest.approx(1 / 171)
    assert m.predict(prompt_tokens=2048, cached_tokens=2000).ttft_s < p.ttft_s
    assert m.predict(prompt_tokens=2048, queued_ahead_tokens=9000).ttft_s == pytest.approx(p.ttft_s + 2.0)
    assert m.predict(prompt_tokens=10, concurrency=4).tpot_s == pytest.approx(1 / 171 + 3 * 0.0007)
    assert p.total_s(101) == pytest.approx(p.ttft_s + 100 * p.tpot_s)


def test_learns_a_slower_box_and_ignores_outliers() -> None:
    m = LatencyModel(A3B, window=16)
    rng = random.Random(3)
    for _ in range(40):
        truth = m.profile.ttft_overhead_s + 2048 / 4500
        m.observe_ttft(truth * 2 * rng.uniform(0.95, 1.05), prompt_tokens=2048)
        m.observe_tpot(2 / 171, concurrency=1, context_tokens=2048)
    assert m.predict(prompt_tokens=2048).ttft_s == pytest.approx(2 * (0.05 + 2048 / 4500), rel=0.05)
    before = m.predict(prompt_tokens=2048)
    for _ in range(3):  # a few wild ones: a stall, a clock glitch
        m.observe_ttft(60.0, prompt_tokens=2048)
    assert m.predict(prompt_tokens=2048).ttft_s == pytest.approx(before.ttft_s, rel=0.1)
    m.observe_ttft(0.0, prompt_tokens=2048)
    m.observe_ttft(10_000.0, prompt_tokens=2048)  # beyond max_ratio: dropped
    assert m.predict(prompt_tokens=2048).tpot_s == pytest.approx(2 / 171, rel=0.01)


def test_a_real_shift_wins_within_half_a_window() -> None:
    m = LatencyModel(A3B, window=10)
    for _ in range(10):
        m.observe_tpot(1 / 171, concurrency=1, context_tokens=100)
    for _ in range(6):
        m.observe_tpot(3 / 171, concurrency=1, context_tokens=100)
    assert m.predict(prompt_tokens=100).tpot_s == pytest.approx(3 / 171, rel=0.01)
