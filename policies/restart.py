"""What to do when a model's engine dies: restart it after a backoff, or give up.

Pure: the death times and the rule in, a decision out. The async shell that watches the
engines and acts on the decision is `gateway/supervisor.py`.

- The backoff doubles with each death inside the window (`backoff_s`, 2x, 4x ...), capped
  at `max_backoff_s`: a crash loop does not spin, a one-off death comes back quickly.
- `max_deaths` deaths within `window_s` (a failed restart counts as one): the model stays
  down, its reason shown in /ready, until an operator restarts the gateway.
- A restarted engine must offer the pool admission was sized for: a smaller or different
  pool (other settings, less memory free) would let admission hand out blocks that are not
  there, so it stays down instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.demand import PoolLimits


@dataclass(frozen=True, slots=True, kw_only=True)
class RestartRule:
    enabled: bool = True
    backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    max_deaths: int = 3
    window_s: float = 600.0


@dataclass(frozen=True, slots=True)
class Restart:
    """Start a new engine `after_s` seconds from now."""

    after_s: float
    deaths_in_window: int


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Stay down: `reason` says why (for /ready)."""

    reason: str


def after_death(rule: RestartRule, deaths: Sequence[float], now: float) -> Restart | GiveUp:
    """The decision after the latest death; `deaths`: every death's time (the latest included)."""
    recent = sum(1 for t in deaths if now - t <= rule.window_s)
    if not rule.enabled:
        return GiveUp("the engine died and restarts are disabled (models[].restart.enabled)")
    if recent >= rule.max_deaths:
        return GiveUp(
            f"the engine died {recent} times within {rule.window_s:g}s "
            f"(models[].restart.max_deaths {rule.max_deaths}): left down; restart the gateway"
        )
    return Restart(min(rule.max_backoff_s, rule.backoff_s * 2.0 ** max(0, recent - 1)), recent)


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolShape:
    """What admission's pool was sized from: its limits and the engine's block size."""

    limits: PoolLimits
    block_size: int


def pool_change(before: PoolShape, after: PoolShape) -> str | None:
    """Why a restarted engine cannot take over the pool admission holds (None: it can).

    Equal is required, not merely "at least as large": in-flight bookkeeping (prefix keys,
    block counts) was made in the old block size, and a larger pool than configured means the
    settings or the machine changed under a running gateway."""
    b, a = before, after
    if a.block_size != b.block_size:
        return f"the restarted engine has {a.block_size}-token KV blocks, admission was sized for {b.block_size}"
    if a.limits.blocks != b.limits.blocks:
        return f"the restarted engine has {a.limits.blocks} KV blocks, admission was sized for {b.limits.blocks}"
    if a.limits.max_sequences != b.limits.max_sequences:
        return (
            f"the restarted engine runs {a.limits.max_sequences} sequences at once, "
            f"admission was sized for {b.limits.max_sequences}"
        )
    return None
