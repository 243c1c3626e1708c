"""The engine restart decision (policies/restart.py): backoff, give-up, pool checks."""

from __future__ import annotations

from policies.demand import PoolLimits
from policies.restart import GiveUp, PoolShape, Restart, RestartRule, after_death, pool_change

RULE = RestartRule(backoff_s=1.0, max_backoff_s=5.0, max_deaths=5, window_s=100.0)


def test_the_backoff_doubles_with_each_recent_death_up_to_its_cap() -> None:
    deaths: list[float] = []
    waits = []
    for t in (0.0, 1.0, 2.0, 3.0):
        deaths.append(t)
        d = after_death(RULE, deaths, t)
        assert isinstance(d, Restart)
        waits.append(d.after_s)
    assert waits == [1.0, 2.0, 4.0, 5.0]


def test_deaths_outside_the_window_are_forgotten() -> None:
    d = after_death(RULE, [0.0, 1.0, 2.0, 3.0, 500.0], 500.0)
    assert d == Restart(1.0, 1)


def test_max_deaths_within_the_window_leaves_it_down() -> None:
    d = after_death(RULE, [0.0, 1.0, 2.0, 3.0, 4.0], 4.0)
    assert isinstance(d, GiveUp) and "5 times within 100s" in d.reason and "max_deaths 5" in d.reason
    assert isinstance(after_death(RestartRule(max_deaths=1), [0.0], 0.0), GiveUp)


def test_disabled_restarts_give_up_at_once() -> None:
    d = after_death(RestartRule(enabled=False), [0.0], 0.0)
    assert isinstance(d, GiveUp) and "disabled" in d.reason


def shape(blocks: int = 100, seqs: int = 8, block_size: int = 16) -> PoolShape:
    return PoolShape(limits=PoolLimits(name="m", blocks=blocks, max_sequences=seqs), block_size=block_size)


def test_a_restarted_engine_must_offer_the_same_pool() -> None:
    assert pool_change(shape(), shape()) is None
    assert "90 KV blocks, admission was sized for 100" in (pool_change(shape(), shape(blocks=90)) or "")
    assert pool_change(shape(), shape(blocks=120)) is not None  # larger: the settings changed
    assert "4 sequences" in (pool_change(shape(), shape(seqs=4)) or "")
    assert "32-token KV blocks" in (pool_change(shape(), shape(block_size=32)) or "")
