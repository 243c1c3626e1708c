"""Engine supervision: one watch task per model notices its engine's death and brings it back.

On a death (vLLM's engine core gone, a replay engine crashed, a remote host unreachable):

    admission closes the model (queued and new requests: 503 `engine_unavailable` with
    Retry-After) -> the model is marked down (/ready 503, routing aliases skip it) ->
    in-flight requests fail as their engine streams end (the engines raise
    EngineUnavailable: streams get an in-band error event, bodies a 503) and release their
    KV and quota holds on the way out -> the dead engine is shut down -> after the backoff
    (policies/restart.py) a new engine is built and started -> its KV pool must be the one
    admission was sized for -> it is swapped in and admission reopens.

A model that keeps dying, whose restart is disabled, or whose new engine has another pool
stays down with its reason in /ready. A remote engine is not restarted from here (it runs
on its host): the model is down while the host is unreachable and reopens once the engine
has claimed its share again (RemoteEngine refuses a host that came back with another pool).

The engines in the registry are `SupervisedEngine`s: a stable object (the router's lanes,
jobs and metrics hold it) whose inner engine is swapped on restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from engine_adapter.base import DelegatingEngine, Engine, EngineChunk, EngineRequest, EngineUnavailable, KVSpec
from engine_adapter.paced import paced
from gateway.admission import AdmissionControl
from gateway.registry import ServedModel
from gateway.settings import ELSEWHERE, ModelSettings
from policies.demand import PoolLimits
from policies.restart import GiveUp, PoolShape, Restart, RestartRule, after_death, pool_change

log = logging.getLogger(__name__)

EngineState = Literal["up", "restarting", "down", "unreachable"]
BuildEngine = Callable[[ModelSettings], Engine]  # a new, unstarted engine for a model
PoolOf = Callable[[ModelSettings, KVSpec], PoolLimits]  # what admission would size from a spec

POLL_S = 0.25  # how often each watch task looks at its engine (a property read: cheap)
SHUTDOWN_TIMEOUT_S = 60.0  # a dead engine's cleanup must not hold its restart forever
# Retry-After where no schedule tells better: a remote host away, a death not yet handled.
GUESS_RETRY_S = 5.0


async def _unavailable(name: str) -> AsyncIterator[EngineChunk]:
    raise EngineUnavailable(f"engine {name} is down")
    yield  # pragma: no cover  (makes this an async generator)


class SupervisedEngine(DelegatingEngine):
    """The registry's engine for a model: delegates to the running engine, says unhealthy
    while the supervisor has it down, and keeps the KV spec and tokenizer of the first start
    (admission and the gateway's token counting were built on them; a restart must match)."""

    def __init__(self, inner: Engine) -> None:
        super().__init__(inner)
        self.down = False
        self._spec = inner.kv_spec
        self._tokenizer = inner.tokenizer  # a dead vLLM engine no longer hands its own out

    def swap(self, inner: Engine) -> None:
        self.inner = inner
        self.down = False

    def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        if self.down:
            return _unavailable(self.name)
        return self.inner.generate(request)

    def check(self, request: EngineRequest) -> None:
        if not self.down:  # a down engine answers the request itself (503)
            self.inner.check(request)

    @property
    def kv_spec(self) -> KVSpec:
        return self._spec

    @property
    def max_model_len(self) -> int:
        return self._spec.max_model_len

    @property
    def is_healthy(self) -> bool:
        return not self.down and self.inner.is_healthy

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer


@dataclass
class EngineHealth:
    """One model's engine as /ready, /sparkgate/stats and /metrics show it."""

    state: EngineState = "up"
    reason: str | None = None  # why it is not up (kept after a recovery as `last_death`)
    deaths: int = 0
    restarts: int = 0
    last_death: str | None = None
    death_times: list[float] = field(default_factory=list)  # monotonic
    next_restart_at: float | None = None  # monotonic, while waiting out a backoff
    start_s: float | None = None  # how long its engine last took to start

    def view(self, now: float) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state, "deaths": self.deaths, "restarts": self.restarts}
        if self.reason is not None:
            out["reason"] = self.reason
        if self.last_death is not None:
            out["last_death"] = self.last_death
        if self.next_restart_at is not None:
            out["restart_in_s"] = round(max(0.0, self.next_restart_at - now), 3)
        return out


def restart_rule(model: ModelSettings) -> RestartRule:
    r = model.restart
    return RestartRule(
        enabled=r.enabled,
        backoff_s=r.backoff_s,
        max_backoff_s=r.max_backoff_s,
        max_deaths=r.max_deaths,
        window_s=r.window_s,
    )


class Supervisor:
    """The watch tasks of every served model (started and stopped by the app's lifespan)."""

    def __init__(
        self,
        models: Sequence[ServedModel],
        admission: AdmissionControl,
        build: BuildEngine,
        pool_of: PoolOf,
        *,
        start_s: dict[str, float] | None = None,
        poll_s: float = POLL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.models = list(models)
        self.admission = admission
        self._build = build
        self._pool_of = pool_of
        self._poll_s = poll_s
        self._clock = clock
        self.health = {m.name: EngineHealth(start_s=(start_s or {}).get(m.name)) for m in self.models}
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        for m in self.models:
            self._tasks.append(asyncio.create_task(self._watch(m), name=f"supervise-{m.name}"))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    def retry_after(self, names: Sequence[str]) -> float | None:
        """Seconds until the first of `names` should serve again (None: none will soon)."""
        now = self._clock()
        hints = []
        for name in names:
            h = self.health.get(name)
            if h is None or h.state == "down":
                continue
            if h.state == "restarting" and h.next_restart_at is not None:
                hints.append(max(0.0, h.next_restart_at - now) + (h.start_s or 1.0))
            elif h.state == "restarting":  # starting now
                hints.append(h.start_s or 1.0)
            else:  # unreachable, or dead and not yet noticed by its watch
                hints.append(GUESS_RETRY_S)
        return min(hints, default=None)

    def views(self) -> dict[str, dict[str, Any]]:
        now = self._clock()
        return {name: h.view(now) for name, h in self.health.items()}

    # -- the watch ---------------------------------------------------------------------------

    async def _watch(self, m: ServedModel) -> None:
        engine = m.engine
        assert isinstance(engine, SupervisedEngine)  # the lifespan wraps every engine
        try:
            while True:
                await asyncio.sleep(self._poll_s)
                if engine.inner.is_healthy:
                    continue
                if m.settings.engine in ELSEWHERE:  # its own process restarts it, not this one
                    await self._wait_for_host(m, engine)
                elif not await self._restart(m, engine):
                    return  # left down: nothing more to watch
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug here must not leave the model silently half-down
            log.exception("supervisor of %s failed", m.name)
            h = self.health[m.name]
            h.state, h.reason, h.next_restart_at = "down", "the engine supervisor failed (see the log)", None
            engine.down = True
            self.admission.close(m.name, None)

    def _died(self, m: ServedModel, engine: SupervisedEngine, reason: str) -> EngineHealth:
        """Record a death and mark the model down; the caller closes admission next, before
        anything awaits (so no request slips in between)."""
        h = self.health[m.name]
        h.deaths += 1
        h.death_times.append(self._clock())
        h.reason = h.last_death = reason
        engine.down = True
        return h

    async def _wait_for_host(self, m: ServedModel, engine: SupervisedEngine) -> None:
        h = self._died(
            m, engine, "engine host unreachable" if m.settings.engine == "remote" else "vLLM server unreachable"
        )
        self.admission.close(m.name, GUESS_RETRY_S)
        h.state = "unreachable"
        log.error("engine %s: its host is unreachable; closed until it answers again", m.name)
        while not engine.inner.is_healthy:  # RemoteEngine's own poller claims its share again
            await asyncio.sleep(self._poll_s)
        engine.down = False
        h.state, h.reason = "up", None
        self.admission.reopen(m.name)
        log.warning("engine %s: its host answers again; reopened", m.name)

    async def _restart(self, m: ServedModel, engine: SupervisedEngine) -> bool:
        """Bring a dead engine back; False when the model is left down."""
        name, rule = m.name, restart_rule(m.settings)
        h = self._died(m, engine, "the engine died (its core process exited or stopped responding)")
        log.error("engine %s died (%d deaths so far)", name, h.deaths)
        decision = after_death(rule, h.death_times, self._clock())
        if isinstance(decision, GiveUp):  # say so before anything awaits: /ready may look
            self._leave_down(name, h, decision.reason)
            await self._shutdown(engine.inner, name)
            return False
        self.admission.close(name, self._retry_hint(h, decision))
        h.state, h.next_restart_at = "restarting", self._clock() + decision.after_s  # backoff from the death
        await self._shutdown(engine.inner, name)
        while True:
            log.warning("engine %s: restarting in %.3gs", name, decision.after_s)
            await asyncio.sleep(max(0.0, (h.next_restart_at or 0.0) - self._clock()))
            h.next_restart_at = None
            self.admission.close(name, self._retry_hint(h, Restart(0.0, 0)))
            try:
                new = await self._start(m, h)
            except Exception as e:
                log.exception("engine %s: restart failed", name)
                h.deaths += 1  # a failed start counts: a model that cannot start gives up
                h.death_times.append(self._clock())
                h.reason = h.last_death = f"restart failed: {e}"
                decision = after_death(rule, h.death_times, self._clock())
                if isinstance(decision, GiveUp):
                    return self._leave_down(name, h, decision.reason)
                self.admission.close(name, self._retry_hint(h, decision))
                h.next_restart_at = self._clock() + decision.after_s
                continue
            before = PoolShape(limits=self.admission.pool_limits(name), block_size=engine.kv_spec.block_size)
            after = PoolShape(limits=self._pool_of(m.settings, new.kv_spec), block_size=new.kv_spec.block_size)
            problem = pool_change(before, after)
            if problem is not None:
                await self._shutdown(new, name)
                return self._leave_down(name, h, problem)
            engine.swap(new)
            h.state, h.reason = "up", None
            h.restarts += 1
            self.admission.reopen(name)
            log.warning("engine %s: restarted in %.1fs; serving again", name, h.start_s or 0.0)
            return True

    def _leave_down(self, name: str, h: EngineHealth, why: str) -> bool:
        h.state, h.next_restart_at = "down", None
        h.reason = f"{h.last_death}; {why}" if h.last_death and h.last_death != why else why
        self.admission.close(name, None)
        log.error("engine %s left down: %s", name, h.reason)
        return False

    def _retry_hint(self, h: EngineHealth, decision: Restart) -> float:
        """Seconds until the model should serve again: the backoff and a start."""
        return decision.after_s + (h.start_s or 1.0)

    async def _start(self, m: ServedModel, h: EngineHealth) -> Engine:
        engine = paced(self._build(m.settings), m.settings.token_pace_s)
        t0 = time.monotonic()
        starting = asyncio.ensure_future(engine.start())
        try:
            await asyncio.shield(starting)
        except asyncio.CancelledError:
            # The gateway is stopping mid-start (a thread cannot be cancelled): let the start
            # finish, then shut the engine down, so no engine process outlives the gateway.
            with contextlib.suppress(Exception):
                await starting
            await self._shutdown(engine, m.name)
            raise
        except Exception:
            await self._shutdown(engine, m.name)  # whatever it started before it failed
            raise
        h.start_s = time.monotonic() - t0
        return engine

    async def _shutdown(self, engine: Engine, name: str) -> None:
        try:
            await asyncio.wait_for(engine.shutdown(), SHUTDOWN_TIMEOUT_S)
        except Exception:  # a dead engine may fail its own cleanup; the restart goes on
            log.warning("engine %s: shutting the engine down failed", name, exc_info=True)
