"""Graceful shutdown: SIGTERM drains the server instead of cutting what runs.

    first SIGTERM (or Ctrl-C)   stop accepting: new requests get 503 `server_shutting_down`
                                (Retry-After, Connection: close), /ready turns 503, requests
                                still queued for admission get the same 503 at once (nothing
                                was generated for them: a retry loses nothing); requests
                                already running on an engine go on
    all of them finished        exit 0
    drain_grace_s over, or      abort what still runs: its engine requests are aborted, a
    a second SIGTERM            stream ends with an in-band `server_shutting_down` error event,
                                a whole-body request gets the 503; then exit 0
    a third signal              exit without waiting for anything (uvicorn's force exit)

Every path releases the requests' holds as usual (`Running.release`): KV and slots back to
admission, quota holds settled with the tokens really produced, then the lifespan shuts the
engines down and flushes the quota settlements before the process exits.

`Drain` is the state (in AppState, and the engine host's state); `DrainingServer` is the
uvicorn server that runs it on signals. Nothing here knows the request lifecycle: running
requests register themselves (`track`) as anything with an `abort(error)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import signal
from collections.abc import Callable
from types import FrameType
from typing import Any, Protocol

import uvicorn

from gateway.errors import GatewayError, ShuttingDown

log = logging.getLogger(__name__)

RETRY_AFTER_S = 5  # what a refused client is told: another replica, or this one restarted
ABORT_WAIT_S = 10.0  # after aborting: how long aborted requests may take to wind down
SHUTDOWN_WAIT_S = 5.0  # then uvicorn's own wait for connections, before it cancels them


class Phase(enum.Enum):
    SERVING = "serving"
    DRAINING = "draining"  # no new work; running requests finish
    ABORTING = "aborting"  # running requests are being aborted


class Abortable(Protocol):
    def abort(self, error: GatewayError) -> None: ...


def shutting_down(aborted: bool = False) -> ShuttingDown:
    """The error a client gets: refused while draining, or cut when the drain aborted."""
    if aborted:
        msg = "The server is shutting down and aborted this request; retry it."
    else:
        msg = "The server is shutting down and takes no new requests; retry shortly."
    return ShuttingDown(msg, headers={"Retry-After": str(RETRY_AFTER_S), "Connection": "close"})


class Drain:
    """The shutdown state and the registry of running requests it may have to abort."""

    def __init__(self, grace_s: float = 30.0) -> None:
        self.grace_s = grace_s
        self.phase = Phase.SERVING
        self._running: set[Abortable] = set()
        self._changed = asyncio.Event()  # a request ended, or the phase moved on
        self._stopping = asyncio.Event()  # set once draining: queued requests stop waiting

    @property
    def draining(self) -> bool:
        return self.phase is not Phase.SERVING

    @property
    def running(self) -> int:
        return len(self._running)

    def track(self, request: Abortable) -> Callable[[], None]:
        """Register a running request; call the result when it has ended (idempotent).
        A request that starts while aborting is aborted at once."""
        self._running.add(request)
        if self.phase is Phase.ABORTING:
            request.abort(shutting_down(aborted=True))

        def done() -> None:
            if request in self._running:
                self._running.discard(request)
                self._changed.set()

        return done

    async def stopped(self) -> None:
        """Return once draining has begun (what a queued request waits on beside its turn)."""
        await self._stopping.wait()

    def begin(self) -> None:
        """Stop accepting new work."""
        if self.phase is Phase.SERVING:
            self.phase = Phase.DRAINING
            self._stopping.set()
            self._changed.set()

    def abort(self) -> None:
        """Abort every running request (their holds are released as they end)."""
        self.begin()
        if self.phase is Phase.ABORTING:
            return
        self.phase = Phase.ABORTING
        if self._running:
            log.warning("drain: aborting %d requests still running", len(self._running))
        for request in list(self._running):
            request.abort(shutting_down(aborted=True))
        self._changed.set()

    async def run(self) -> None:
        """The drain: stop accepting, let running requests finish within the grace (or
        until `abort`), abort the rest, and return once they have ended (bounded)."""
        self.begin()
        loop = asyncio.get_running_loop()
        log.warning("drain: %d requests in flight; waiting up to %gs for them", self.running, self.grace_s)
        started = loop.time()
        await self._until(lambda: not self._running or self.phase is Phase.ABORTING, started + self.grace_s)
        if self._running:
            self.abort()
            if not await self._until(lambda: not self._running, loop.time() + ABORT_WAIT_S):
                log.error("drain: %d aborted requests still winding down; closing anyway", self.running)
        log.warning("drain: done in %.1fs", loop.time() - started)

    async def _until(self, done: Callable[[], bool], deadline: float) -> bool:
        loop = asyncio.get_running_loop()
        while not done():
            left = deadline - loop.time()
            if left <= 0:
                return False
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)
        return True


class DrainingServer(uvicorn.Server):
    """uvicorn's server with SIGTERM/SIGINT draining `drain` first (see the module doc).
    Its exit is a clean return (0): the signal is not raised again after serving."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain
        self._loop: asyncio.AbstractEventLoop | None = None
        self._signals = 0  # received since serving began
        self._task: asyncio.Task[None] | None = None  # the drain, once begun (a reference keeps it alive)

    async def startup(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets=sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        loop = self._loop
        if not self.started or loop is None:
            super().handle_exit(sig, frame)  # still starting: stop once started, as uvicorn does
            self._captured_signals.clear()  # and return, not die of the signal (exit 0)
            return
        self._signals += 1
        name = signal.Signals(sig).name
        if self._signals == 1:
            log.warning("drain: %s received; no new requests", name)
            loop.call_soon_threadsafe(self._start)
        elif self._signals == 2:
            log.warning("drain: second %s: aborting what still runs", name)
            loop.call_soon_threadsafe(self.drain.abort)
        else:
            log.warning("drain: %s again: exiting now", name)
            self.force_exit = self.should_exit = True

    def _start(self) -> None:
        self._task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        try:
            await self.drain.run()
        finally:
            self.should_exit = True  # uvicorn's own shutdown: close the port, then the lifespan
