"""policies/memory_guard.py: stop admitting below the floor, resume above floor + margin."""

from __future__ import annotations

import pytest

from policies.memory_guard import GuardLimits, GuardState, observe

GiB = 1024**3
LIMITS = GuardLimits(floor=6 * GiB, resume_margin=2 * GiB)


def run(limits: GuardLimits, readings: list[int | None]) -> list[GuardState]:
    state, out = GuardState(), []
    for r in readings:
        state = observe(limits, state, r)
        out.append(state)
    return out


def test_it_stops_below_the_floor_and_resumes_only_past_the_margin() -> None:
    states = run(LIMITS, [10 * GiB, 6 * GiB, 6 * GiB - 1, 7 * GiB, 8 * GiB - 1, 8 * GiB, 7 * GiB])
    assert [s.admitting for s in states] == [True, True, False, False, False, True, True]
    assert [s.available for s in states][-1] == 7 * GiB
    assert states[-1].stops == 1


def test_a_box_hovering_at_the_floor_stops_once() -> None:
    wobble = [6 * GiB - 1, 6 * GiB + 1] * 5
    states = run(LIMITS, wobble)
    assert not any(s.admitting for s in states)
    assert states[-1].stops == 1


def test_each_fall_below_the_floor_counts_a_stop() -> None:
    states = run(LIMITS, [GiB, 9 * GiB, GiB, GiB])
    assert [s.admitting for s in states] == [False, True, False, False]
    assert states[-1].stops == 2


def test_without_a_margin_it_resumes_at_the_floor() -> None:
    states = run(GuardLimits(floor=6 * GiB), [GiB, 6 * GiB])
    assert [s.admitting for s in states] == [False, True]
    assert GuardLimits(floor=6 * GiB).resume_at == 6 * GiB


def test_no_floor_always_admits() -> None:
    assert all(s.admitting for s in run(GuardLimits(floor=0, resume_margin=GiB), [0, GiB]))


def test_an_unknown_reading_admits_and_is_shown_unknown() -> None:
    states = run(LIMITS, [GiB, None])
    assert [s.admitting for s in states] == [False, True]
    assert states[-1].available is None
    assert states[-1].stops == 1


@pytest.mark.parametrize(("floor", "margin"), [(-1, 0), (0, -1)])
def test_negative_sizes_are_refused(floor: int, margin: int) -> None:
    with pytest.raises(ValueError, match="at least 0"):
        GuardLimits(floor=floor, resume_margin=margin)
