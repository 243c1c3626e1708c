"""policies/latency.py: predictions from a profile, corrected online, robust to outliers."""

import random

import pytest

from policies import latency
from policies.latency import LatencyModel, Profile, slot_wait

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


def test_slot_wait_is_zero_with_a_free_slot() -> None:
    assert slot_wait([5.0, 3.0], [], slots=4) == 0.0


def test_slot_wait_is_the_first_running_request_to_finish() -> None:
    assert slot_wait([5.0, 3.0, 9.0, 4.0], [], slots=4) == 3.0


def test_slot_wait_counts_the_queue_ahead() -> None:
    # Slots free at 3 and 4: the two queued take them until 3+10 and 4+1; then 5 is next.
    assert slot_wait([5.0, 3.0, 9.0, 4.0], [10.0, 1.0], slots=4) == 5.0
    assert slot_wait([], [2.0, 2.0, 2.0], slots=1) == 6.0


def test_slot_wait_with_more_running_than_slots() -> None:
    assert slot_wait([1.0, 2.0, 3.0], [], slots=2) == 2.0


def test_slot_wait_needs_a_slot() -> None:
    with pytest.raises(ValueError):
        slot_wait([], [], slots=0)


def test_short_prompts_correct_the_overhead_not_the_prefill_rate() -> None:
    m = LatencyModel(Profile(prefill_tokens_per_s=1000, ttft_overhead_s=0.5, prefill_s_per_ktoken2=0.01))
    long_before = m.predict(prompt_tokens=64_000).ttft_s
    assert long_before == pytest.approx(0.5 + 64 + 0.01 * 64**2)
    for _ in range(10):  # chats start in 0.1 s: the overhead is smaller than thought
        m.observe_ttft(0.1 + 0.01, prompt_tokens=10)
    assert m.predict(prompt_tokens=10).ttft_s == pytest.approx(0.11)
    assert m.predict(prompt_tokens=64_000).ttft_s == pytest.approx(long_before - 0.4)  # the rate is untouched
    for _ in range(10):  # a long prompt took twice its work
        m.observe_ttft(0.1 + 2 * (64 + 0.01 * 64**2), prompt_tokens=64_000)
    assert m.predict(prompt_tokens=64_000).ttft_s == pytest.approx(0.1 + 2 * (64 + 0.01 * 64**2))
    # A cached prefix costs neither its tokens nor its attention. Its 1,000 new tokens are in a
    # band with no observation, two bands from the 64K ones: the profile's rate applies.
    hit = m.predict(prompt_tokens=64_000, cached_tokens=63_000).ttft_s
    assert hit == pytest.approx(0.1 + (1 + 0.01 * (64**2 - 63**2)))


def test_a_band_without_observations_borrows_a_neighbour_s() -> None:
    m = LatencyModel(Profile(prefill_tokens_per_s=1000, ttft_overhead_s=0.0))
    for _ in range(3):
        m.observe_ttft(3 * 20.0, prompt_tokens=20_000)  # 16K-64K band: 3x slower
    assert m.predict(prompt_tokens=20_000).ttft_s == pytest.approx(60.0)
    assert m.predict(prompt_tokens=10_000).ttft_s == pytest.approx(30.0)  # 4K-16K: borrows
    assert m.predict(prompt_tokens=100_000).ttft_s == pytest.approx(300.0)  # 64K+: borrows
    assert m.predict(prompt_tokens=2_000).ttft_s == pytest.approx(2.0)  # 1K-4K: too far, the profile


def test_an_observation_below_the_other_term_is_ignored() -> None:
    m = LatencyModel(Profile(prefill_tokens_per_s=1000, ttft_overhead_s=0.5))
    m.observe_ttft(0.2, prompt_tokens=2000)  # less than the overhead alone: no work ratio to learn
    m.observe_ttft(0.001, prompt_tokens=10)  # less than the work alone: no overhead ratio either
    assert m.observations == 0


def test_remembered_predictions_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(latency, "_MEMO_MAX", 4)
    m = LatencyModel(A3B)
    first = m.predict(prompt_tokens=100)
    for n in range(1, 10):
        m.predict(prompt_tokens=100 + n)
        assert len(m._memo) <= 4
    assert m.predict(prompt_tokens=100) == first  # forgotten, then predicted the same again


def test_learned_reports_each_factor_with_the_observations_behind_it() -> None:
    m = LatencyModel(A3B, window=8)
    assert m.learned() == {
        "observations": 0,
        "overhead": {"factor": 1.0, "n": 0},
        "tpot": {"factor": 1.0, "n": 0},
        "prefill": {},
    }
    for _ in range(3):
        m.observe_ttft(0.05 + 2 * 8000 / 4500, prompt_tokens=8000)  # twice the profile's prefill work, 4K-16K band
        m.observe_tpot(1.5 / 171, concurrency=1, context_tokens=100)
    m.observe_ttft(0.1 + 10 / 4500, prompt_tokens=10)  # overhead-dominated: twice the profile's overhead
    got = m.learned()
    assert got["observations"] == 7
    assert got["prefill"] == {4000: {"factor": pytest.approx(2.0), "n": 3}}
    assert got["tpot"] == {"factor": pytest.approx(1.5), "n": 3}
    assert got["overhead"] == {"factor": pytest.approx(2.0), "n": 1}
