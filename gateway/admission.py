"""The async shell around `policies.admission`: futures for waiters, queue timeouts,
tickets that release exactly once, the timer that frees room fair share kept for an idle
user (policies/fair.py), and the numbers /sparkgate/stats shows.

One event loop drives it, so the state machine needs no lock: every call into
it runs to completion between awaits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gateway.errors import GatewayError, from_reject
from policies.admission import Admission
from policies.demand import Admit, Demand, PoolLimits, PoolSnapshot, Queue, QueueLimits, Reject, RejectReason
from policies.fair import OFF, FairShare

log = logging.getLogger(__name__)

_EWMA = 0.2  # weight of the newest observation in the service-time average


@dataclass
class AdmissionMetrics:
    admitted: int = 0
    queued: int = 0
    released: int = 0
    rejected: Counter[str] = field(default_factory=Counter)  # by reason label
    queue_wait_s_total: float = 0.0
    queue_wait_s_max: float = 0.0
    kv_mispredicted_blocks: int = 0  # blocks the engine needed beyond the prediction
    kv_refunded_blocks: int = 0  # blocks given back when the engine found more cached
    # The same by pool (model) for /metrics: (pool, "admitted" | "queued" | "mispredicted_blocks"
    # | "refunded_blocks" | "rejected:<reason>") -> count.
    by_pool: Counter[tuple[str, str]] = field(default_factory=Counter)


class Ticket:
    """An admitted job's hold on its pool. `release()` is idempotent; a ticket that is
    garbage-collected unreleased is released then (and logged: that is a bug)."""

    def __init__(self, control: AdmissionControl, demand: Demand, admit: Admit, waited_s: float, seq: int) -> None:
        self._control = control
        self.seq = seq  # admission order across the gateway (1, 2, ...)
        self.demand = demand
        self.admit = admit
        self.waited_s = waited_s
        self.started = time.monotonic()
        self._released = False
        self._prefilled = False

    @property
    def id(self) -> str:
        return self.demand.id

    def prefilled(self, hit_blocks: int) -> None:
        """The engine has the prompt (first output): its blocks are shareable; reconcile hits."""
        if self._released or self._prefilled:
            return
        self._prefilled = True
        self._control._prefilled(self, hit_blocks)

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self._control._release(self)

    def __del__(self) -> None:
        if not self._released:
            log.error("ticket %s was never released; releasing it now", self.id)
            with contextlib.suppress(Exception):
                self.release()


class AdmissionControl:
    def __init__(
        self,
        pools: Iterable[PoolLimits],
        limits: QueueLimits,
        *,
        timeouts_s: dict[int, float],
        fair: FairShare = OFF,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.state = Admission(pools, limits, fair)
        self._timeouts = timeouts_s
        self._clock = clock
        self._expiry: tuple[float, asyncio.TimerHandle] | None = None  # (when, its timer)
        self._waiters: dict[str, tuple[asyncio.Future[Admit], str]] = {}  # job id -> (future, pool)
        self._service_s: dict[str, float] = {}
        self.metrics = AdmissionMetrics()

    async def acquire(self, demand: Demand) -> Ticket:
        """Wait for room; raise the client-facing error when the answer is no."""
        t0 = self._clock()
        decision, others = self.state.offer(demand, self._clock())
        self._dispatch(others)
        if isinstance(decision, Reject):
            raise self._error(decision, demand.pool)
        if isinstance(decision, Admit):
            return self._ticket(demand, decision, t0)
        assert isinstance(decision, Queue)
        self.metrics.queued += 1
        self.metrics.by_pool[demand.pool, "queued"] += 1
        fut: asyncio.Future[Admit] = asyncio.get_running_loop().create_future()
        self._waiters[demand.id] = (fut, demand.pool)
        timeout = self._timeouts.get(demand.priority)
        try:
            admit = await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            reject = self.state.timeout(demand.id, self._clock())
            self._arm()
            if reject is not None:
                self._waiters.pop(demand.id, None)
                raise self._error(reject, demand.pool) from None
            admit = fut.result()  # admitted in the same tick the timer fired
        except asyncio.CancelledError:
            # The client left (or the server is stopping) while it waited.
            self._waiters.pop(demand.id, None)
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self._dispatch(self.state.release(demand.id, self._clock()))
            else:
                self._dispatch(self.state.cancel(demand.id, self._clock()))
            raise
        return self._ticket(demand, admit, t0)

    def _ticket(self, demand: Demand, admit: Admit, t0: float) -> Ticket:
        waited = self._clock() - t0
        m = self.metrics
        m.admitted += 1
        m.by_pool[demand.pool, "admitted"] += 1
        m.queue_wait_s_total += waited
        m.queue_wait_s_max = max(m.queue_wait_s_max, waited)
        return Ticket(self, demand, admit, waited, m.admitted)

    def _dispatch(self, changes: Iterable[Admit | Reject]) -> None:
        for c in changes:
            waiter = self._waiters.pop(c.id, None)
            if waiter is None or waiter[0].done():
                # Its waiter is gone (cancelled between decisions): give the room back.
                if isinstance(c, Admit):
                    self._dispatch(self.state.release(c.id, self._clock()))
                continue
            fut, pool = waiter
            if isinstance(c, Admit):
                fut.set_result(c)
            else:
                fut.set_exception(self._error(c, pool))
        self._arm()

    def _arm(self) -> None:
        """Keep one timer, at the time room kept for an idle user falls free (if any)."""
        when = self.state.next_expiry()
        if self._expiry is not None:
            if self._expiry[0] == when:
                return
            self._expiry[1].cancel()
            self._expiry = None
        if when is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous caller): the next event expires it
            return
        self._expiry = (when, loop.call_later(max(0.0, when - self._clock()), self._expired))

    def _expired(self) -> None:
        self._expiry = None
        self._dispatch(self.state.expire(self._clock()))

    def _error(self, reject: Reject, pool: str) -> GatewayError:
        self.metrics.rejected[reject.reason.label] += 1
        self.metrics.by_pool[pool, "rejected:" + reject.reason.label] += 1
        retry = None
        if reject.reason is RejectReason.POOL_CLOSED:
            retry = reject.retry_after  # seconds already: the engine's restart schedule
        elif reject.retry_after is not None:
            # The policy counts rounds of the pool's slots; a round lasts about one service time.
            retry = reject.retry_after * self._service_s.get(pool, 1.0)
        return from_reject(reject, retry)

    def _prefilled(self, ticket: Ticket, hit_blocks: int) -> None:
        self.state.prefilled(ticket.id)
        delta, admitted = self.state.reconcile(ticket.id, hit_blocks)
        if delta > 0:
            self.metrics.kv_mispredicted_blocks += delta
            self.metrics.by_pool[ticket.demand.pool, "mispredicted_blocks"] += delta
            log.warning("%s: the engine found %d fewer cached blocks than predicted", ticket.id, delta)
        elif delta < 0:
            self.metrics.kv_refunded_blocks -= delta
            self.metrics.by_pool[ticket.demand.pool, "refunded_blocks"] -= delta
        self._dispatch(admitted)

    def _release(self, ticket: Ticket) -> None:
        self.metrics.released += 1
        held = time.monotonic() - ticket.started
        pool = ticket.demand.pool
        prev = self._service_s.get(pool)
        self._service_s[pool] = held if prev is None else (1 - _EWMA) * prev + _EWMA * held
        self._dispatch(self.state.release(ticket.id, self._clock()))

    def close(self, pool: str, retry_after_s: float | None = None) -> None:
        """Turn away the pool's queue and newcomers (503 `engine_unavailable`, Retry-After
        `retry_after_s`; None: no retry hint) until `reopen`."""
        self._dispatch(self.state.close(pool, retry_after_s, self._clock()))

    def reopen(self, pool: str) -> None:
        self._dispatch(self.state.reopen(pool))

    def is_closed(self, pool: str) -> bool:
        return self.state.is_closed(pool)

    def pool_limits(self, pool: str) -> PoolLimits:
        return self.state.pool_limits(pool)

    def snapshot(self, pool: str) -> PoolSnapshot:
        return self.state.snapshot(pool)
