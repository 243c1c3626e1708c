"""The run phase: a prepared job through its holds to its answer, released exactly once.

    priority -> the memory guard (host memory below box.min_free: 503, nothing held)
      -> quota hold (a request over its key's limits never queues)
      -> routing's flight, and its hold (so as not to stall running requests)
      -> admission (a fair queue for KV room and a running slot; the client may leave),
         then the memory guard again (memory may have fallen while it queued)
      -> engine -> the answer, whole (`Running.body`) or streamed (`Running.events`), in
         the encoding of the API surface that asked (it passes its encoders)
      -> release, once on every path: the admission ticket, the flight, and the quota
         settled with what the engine really did (the job's meter)

The quota is held before routing's flight starts: a refused request leaves no trace in
the routing model to undo, and the flight, which other requests' predictions count, starts
only for a request that will run (docs/lifecycle.md). A client that goes away aborts its
engine requests at once. Nothing here knows HTTP: the caller passes `client_gone`, which
returns when the client disconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

from engine_adapter.base import EngineChunk
from gateway import dashboard
from gateway.admission import Ticket
from gateway.drain import shutting_down
from gateway.errors import GatewayError, from_exception, unexpected
from gateway.job import Job
from gateway.lifecycle import generate
from gateway.lifecycle.prepare import demand, priority_of
from gateway.metrics import (
    CANCELLED,
    CLIENT_LEFT,
    COMPLETED,
    FAILED,
    LEFT_QUEUED,
    QUOTA_UNAVAILABLE,
    REJECTED_ADMISSION,
    REJECTED_QUOTA,
)
from gateway.quota import Hold
from gateway.router import Router
from gateway.state import AppState
from policies.demand import Demand
from policies.lanes import Flight

log = logging.getLogger(__name__)

ClientGone = Callable[[], Awaitable[None]]  # returns when the client disconnects
Chunks = AsyncIterator[tuple[int, EngineChunk]]  # a job's engine output: (prompt index, chunk)
# An API surface's encoders of a job's engine output: a whole body, or server-sent events.
BodyEncoder = Callable[[Job, Chunks], Awaitable[dict[str, Any]]]
EventEncoder = Callable[[Job, Chunks], AsyncIterator[str]]
# The surface's end of a stream that an error cut short (the status line is gone): in-band.
StreamError = Callable[[GatewayError], str]


class ClientLeft(Exception):
    """The client went away: nobody is left to answer."""


def _count_left(state: AppState) -> None:
    """The one place a client that left is counted: once per request, queued (`start`) or
    answered in part (`Running.release`); the HTTP layer only answers it (499)."""
    state.counters.client_disconnects += 1


async def start(job: Job, state: AppState, *, priority_header: str | None, client_gone: ClientGone) -> Running:
    """Take the job's holds in order; on any failure give back what was taken and raise."""
    wanted = demand(
        job,
        priority=priority_of(job.principal, priority_header),
        user_max_running=job.principal.max_concurrency or state.settings.admission.per_user_max_concurrency,
    )
    metrics = state.metrics
    job.meter.started = job.served.engine.clock()
    # Host memory below its floor: refused before the quota store is asked (nothing to undo).
    if (low := _memory_low(state)) is not None:
        if metrics is not None:
            metrics.not_started(job, REJECTED_ADMISSION)
        raise low
    try:
        hold = await state.quota.reserve(job.principal, job.id, job.worst_case_tokens)
    except BaseException as e:
        if metrics is not None:
            status = getattr(e, "status", 0)
            metrics.not_started(job, REJECTED_QUOTA if status == 429 else QUOTA_UNAVAILABLE)
        raise
    flight = _start_flight(state.router, job)
    try:
        if flight is not None:
            assert state.router is not None  # a flight is routing's
            # Most requests are not held: the first check runs here, without a watcher's tasks.
            held = flight.not_before > job.served.engine.clock()  # routing held it from the start
            if held or flight.hold_again():
                await _unless_gone(_route_hold(job, flight, state.router, checked=not held), state, client_gone)
        if state.drain.draining:  # it arrived as the drain began: not worth queueing
            raise shutting_down()
        ticket = await _admit(wanted, state, client_gone)
        if (low := _memory_low(state)) is not None:  # memory fell while it queued: it never ran
            ticket.release()
            raise low
    except BaseException as e:
        hold.release()
        if flight is not None:
            flight.finish()  # it never reached its engine
        if isinstance(e, ClientLeft):
            _count_left(state)
            log.info("%s: client left while queued", job.id)
        if metrics is not None:
            outcome = LEFT_QUEUED if isinstance(e, ClientLeft) else CANCELLED
            metrics.not_started(job, REJECTED_ADMISSION if isinstance(e, GatewayError) else outcome)
        raise
    if flight is not None:
        flight.admitted()
    return Running(job, state, ticket, hold, flight, client_gone)


def _memory_low(state: AppState) -> GatewayError | None:
    """The memory guard's refusal (gateway/host_memory.py), before a job is admitted: every
    API surface's request passes here, and one already running is never cut."""
    return None if state.memory is None else state.memory.refusal()


def _start_flight(router: Router | None, job: Job) -> Flight | None:
    """Start the job's timing record on the model routing chose (None: routing is off)."""
    if router is None or job.route is None:
        return None
    first = job.requests[0]
    # The length routing predicted it at: max_tokens as the client set it, else the default
    # (the sampling's max_tokens is then the context left). Capping a set max_tokens at the
    # default would have the router believe a long summary's slot free halfway through it, and
    # send chats to wait for that slot.
    route = job.route
    return router.start_flight(
        job.served.name, job.prompts[0].cache_keys(), route.output_tokens, first.cache_salt, route, job.principal.name
    )


async def _route_hold(job: Job, flight: Flight, router: Router, *, checked: bool) -> None:
    """Wait until routing lets the job go to its engine (its hold, on the engine's clock).
    `checked`: its first check at its due time said hold (`start` made it).

    Held requests of one class on one engine wait in line: only the first re-checks its
    hold (each check walks every request on the engine), the others wait for it to go,
    woken in turn. Each re-checking on its own would make the checks quadratic in the
    requests held, enough to stall the gateway with a thousand clients."""
    engine = job.served.engine

    async def until_due() -> None:
        while (left := flight.not_before - engine.clock()) > 0:
            # The engine's clock may run faster than the wall clock (a simulated box): poll.
            await asyncio.sleep(min(0.25, left))

    if not checked:
        await until_due()
        if not flight.hold_again():
            return
    line = router.recheck_line(job.served.name, "" if job.route is None else job.route.slo)
    with flight.waiting_for_recheck():  # held until its turn, its hold's end passed or not
        while True:
            try:
                await asyncio.wait_for(line.acquire(), timeout=0.25)
                break
            except TimeoutError:
                # Waiting on for its turn would miss its first token's objective: it goes now
                # (as the check would say; a cheap look at the clock, not the check itself).
                if flight.ttft_due is not None and engine.clock() >= flight.ttft_due:
                    return
    try:
        while True:
            await until_due()
            if not flight.hold_again():
                return
    finally:
        line.release()


async def _unless_gone(work: Awaitable[None], state: AppState, client_gone: ClientGone) -> None:
    """Wait for `work` (routing's hold), or for the client to leave: ClientLeft, and the work
    is given up (a client gone while held no longer holds its quota until the hold ends)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(client_gone())
    try:
        await asyncio.wait([task, watcher], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, watcher):
            if not t.done():
                t.cancel()
                with contextlib.suppress(BaseException):
                    await t
    if task.done() and not task.cancelled():
        task.result()  # done (or failed): admission sees a client that left as well
        return
    raise ClientLeft


async def _admit(wanted: Demand, state: AppState, client_gone: ClientGone) -> Ticket:
    """Wait for the job's turn (KV room, a slot, fairness), for the client to leave, or for
    the server to begin draining (a queued request then gets 503 at once: nothing was
    generated for it, so its retry loses nothing, and the drain waits only for work begun)."""
    acquire = asyncio.ensure_future(state.admission.acquire(wanted))
    watcher = asyncio.ensure_future(client_gone())
    stopped = asyncio.ensure_future(state.drain.stopped())
    try:
        await asyncio.wait([acquire, watcher, stopped], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in (acquire, watcher, stopped):
            if not waiting.done():
                waiting.cancel()  # acquire's gives the queue place (or a just-granted admission) back
                with contextlib.suppress(BaseException):
                    await waiting
    if stopped.done() and not stopped.cancelled() and not (acquire.done() and not acquire.cancelled()):
        raise shutting_down()
    if watcher.done() and not watcher.cancelled():
        # The client left. The cancel may have lost a race with the admission: give it back.
        if not acquire.cancelled() and acquire.exception() is None:
            acquire.result().release()
        raise ClientLeft
    return acquire.result()


class Running:
    """An admitted job: its holds, given back together, once (`release`), however its
    answer ends: done, failed, cancelled, or never asked for."""

    def __init__(
        self, job: Job, state: AppState, ticket: Ticket, hold: Hold, flight: Flight | None, client_gone: ClientGone
    ) -> None:
        self.job = job
        self.state = state
        self.ticket = ticket
        self.hold = hold
        self.flight = flight
        self.client_gone = client_gone
        self.returned = False  # the client got the whole answer (and its usage)
        self.failed = False  # an error ended the answer (else, unreturned: the client left)
        self._released = False
        # Set by `abort` (the drain's end): the error the answer ends with instead.
        self.stopped: GatewayError | None = None
        self._aborting: asyncio.Task[None] | None = None
        self._untrack = state.drain.track(self)  # last: the drain may abort it at once
        self._client_left = False  # seen by `_watched`, which aborted the engine requests
        if state.metrics is not None:
            state.metrics.admitted(job, ticket.waited_s)
        # Debug, not info: the request log's line (`sparkgate.request`) says the same when the
        # request ends, and a line at info costs the event loop a share of every short request's
        # time (BENCHMARKS.md).
        log.debug(
            "%s: model=%s user=%s prompt_tokens=%s max_tokens=%s n=%d stream=%s waited=%.3fs",
            job.id,
            job.served.name,
            job.principal.name,
            "+".join(str(len(p)) for p in job.prompts),
            job.requests[0].sampling.max_tokens,
            job.n,
            job.stream,
            ticket.waited_s,
        )

    def abort(self, error: GatewayError) -> None:
        """End the answer with `error` (a stream in-band, a body as the response): its
        engine requests are aborted, and the engine's "abort" ends their output."""
        if self._released or self.stopped is not None:
            return
        self.stopped = error
        log.info("%s: aborted: %s", self.job.id, error.message)

        async def abort_engine() -> None:
            try:
                await generate.abort(self.job)
            except Exception as e:  # closing its stream aborts it too
                log.warning("%s: engine abort failed: %s", self.job.id, e)

        self._aborting = asyncio.ensure_future(abort_engine())

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self._untrack()
        if not (self.returned or self.failed):
            # The client left: seen on its disconnect message (`_watched`), or first on a
            # failed send (the stream was closed).
            _count_left(self.state)
        self.ticket.release()
        if self.flight is not None:
            self.flight.finish()
        m = self.job.meter
        prompt = m.prompt_tokens
        if not self.returned and not self.failed:
            # The client left. One that leaves mid-prefill is charged its prompt too: the engine
            # had it and spent its prefill on it (else hanging up just before the first token
            # would make any prompt free, and uncounted).
            prompt = max(prompt, m.sent_prompt_tokens)
        self.hold.settle(prompt, m.completion_tokens, returned=self.returned)
        job = self.job
        end = job.served.engine.clock()
        self.state.recent.add_finished(
            dashboard.finished(
                model=job.served.name,
                user=job.principal.name,
                slo=None if job.route is None else job.route.slo,
                arrived=end if m.started is None else m.started,  # set by start(), on the engine's clock
                first=m.first_token,
                end=end,
                completion_tokens=m.completion_tokens,
                choices=job.n * len(job.requests),
                returned=self.returned,
            )
        )
        metrics = self.state.metrics
        if metrics is not None:
            outcome = COMPLETED if self.returned else FAILED if self.failed else CLIENT_LEFT
            route = self.job.route
            slo = None if route is None or self.state.router is None else self.state.router.settings.classes[route.slo]
            metrics.finished(self.job, outcome, slo)

    def _chunks(self) -> AsyncGenerator[tuple[int, EngineChunk], None]:
        bs = self.job.served.engine.kv_spec.block_size
        ticket = self.ticket
        chunks = generate.run(self.job, on_prefill=lambda cached: ticket.prefilled(cached // bs), flight=self.flight)
        return self._stoppable(chunks)

    async def _stoppable(
        self, chunks: AsyncGenerator[tuple[int, EngineChunk], None]
    ) -> AsyncGenerator[tuple[int, EngineChunk], None]:
        """The engine's output until `abort`: then `stopped` is raised, not the engine's
        own "aborted" error (the encoders report it, in-band for a stream)."""
        try:
            if self.stopped is not None:
                raise self.stopped  # aborted before its engine requests started
            async for item in chunks:
                if self.stopped is not None:
                    raise self.stopped
                yield item
        except Exception as e:
            if self._client_left:
                return  # the abort that followed is not the engine failing: nobody reads on
            if self.stopped is not None and e is not self.stopped:
                raise self.stopped from None
            raise
        finally:
            await chunks.aclose()  # aborts engine requests still running

    @contextlib.asynccontextmanager
    async def _watched(self) -> AsyncIterator[asyncio.Future[None]]:
        """While the answer is being produced, watch for the client leaving and then abort
        the job's engine requests at once. Waiting for the answer's generator to be closed
        is not enough: on ASGI 2.4 servers Starlette stops iterating without closing it,
        and it is finalized only when collected."""
        counters = self.state.counters
        name = self.job.served.name

        async def watch() -> None:
            await self.client_gone()
            self._client_left = True
            log.info("client went away: aborting %s", self.job.id)
            await generate.abort(self.job)

        counters.by_model_inflight[name] = counters.by_model_inflight.get(name, 0) + 1
        watcher = asyncio.ensure_future(watch())
        try:
            yield watcher
        finally:
            if not watcher.done():
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            counters.by_model_inflight[name] -= 1

    async def events(self, encode: EventEncoder, fail: StreamError) -> AsyncIterator[str]:
        """The answer as server-sent events; released when it ends, however it ends. An error
        after the first event (the engine died, the drain cut it) ends the stream with the
        surface's error event (`fail`), and the job counts as failed: no encoder decides it."""
        chunks = self._chunks()
        try:
            async with self._watched() as watcher:
                try:
                    async for line in encode(self.job, chunks):
                        if watcher.done() or self._client_left:  # (its abort may be under way)
                            return
                        yield line
                except Exception as exc:
                    if watcher.done() or self._client_left:
                        return
                    err = from_exception(exc)
                    if unexpected(exc):
                        log.error("%s: stream failed", self.job.id, exc_info=exc)
                    else:
                        log.warning("%s: stream failed: %s", self.job.id, err.message)
                    self.job.meter.error_code = err.code
                    self.failed = True
                    self.state.counters.failed += 1
                    yield fail(err)
                    return
            self.state.counters.completed += 1
            self.returned = True
        except Exception:
            if not self.failed:
                self.failed = True
                self.state.counters.failed += 1
            raise
        finally:
            await chunks.aclose()  # aborts engine requests still running
            self.release()

    async def body(self, encode: BodyEncoder) -> dict[str, Any]:
        """The whole answer; released before it returns. ClientLeft if the client went away."""
        job, state = self.job, self.state
        chunks = self._chunks()
        try:
            async with self._watched() as watcher:
                work = asyncio.ensure_future(encode(job, chunks))
                either: list[asyncio.Future[Any]] = [work, watcher]
                try:
                    await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    # The client left (its engine requests are being aborted), or this
                    # task itself was cancelled: either way the work must not outlive it.
                    client_left = watcher.done() or self._client_left  # (its abort may be under way)
                    if client_left or not work.done():
                        work.cancel()
                        with contextlib.suppress(BaseException):
                            await work
                if client_left:
                    raise ClientLeft
                body = work.result()
                self.returned = True
        except ClientLeft:
            raise
        except Exception:
            self.failed = True
            state.counters.failed += 1  # an engine death closes admission in gateway/supervisor.py
            raise
        finally:
            await chunks.aclose()
            self.release()
        state.counters.completed += 1
        return body
