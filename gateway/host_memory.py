"""The box's available host memory, and the watch that turns it into the memory guard's
state (policies/memory_guard.py): whether new work is admitted (issue 51).

The number is the one vLLM 0.34 takes as an integrated GPU's free memory (a DGX Spark's
CPU and GPU share it): `psutil.virtual_memory().available` (vllm/utils/mem_utils.py,
`device_memory_info`), which psutil on Linux reads from /proc/meminfo's `MemAvailable`
(psutil/_pslinux.py, `virtual_memory`). `MemInfo` reads that line itself: one file, no
dependency. A test passes its own `HostMemory` instead, and calls `MemoryWatch.sample`
rather than waiting for the poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any, Protocol

from gateway.errors import MemoryLow
from gateway.settings import BoxSettings
from policies.memory_guard import GuardLimits, GuardState, observe

log = logging.getLogger(__name__)

GiB = 1024**3


class HostMemory(Protocol):
    def available(self) -> int | None:
        """Bytes of host memory available now; None when it cannot be read."""
        ...


class MemInfo:
    """`MemAvailable` from /proc/meminfo (Linux 3.14 and later)."""

    def __init__(self, path: str | Path = "/proc/meminfo") -> None:
        self.path = Path(path)

    def available(self) -> int | None:
        try:
            with self.path.open("rb") as f:
                for line in f:
                    if line.startswith(b"MemAvailable:"):
                        return int(line.split()[1]) * 1024  # the kernel writes kB (KiB)
        except (OSError, ValueError, IndexError):
            return None
        return None


def gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB"


class MemoryWatch:
    """Reads the host's available memory every `poll_s` and holds the guard's state; the
    lifecycle asks `refusal()` before it admits a request."""

    def __init__(self, source: HostMemory, limits: GuardLimits, *, poll_s: float, retry_after_s: float) -> None:
        self.source = source
        self.limits = limits
        self.poll_s = poll_s
        self.retry_after_s = retry_after_s
        self.state = GuardState()
        self.refused = 0  # requests turned away, since the start
        self._task: asyncio.Task[None] | None = None
        self._unreadable_logged = False

    @property
    def admitting(self) -> bool:
        return self.state.admitting

    def sample(self) -> GuardState:
        """Read the memory once and update the state (the poll's step; tests call it)."""
        before = self.state
        available = self.source.available()
        self.state = observe(self.limits, before, available)
        if available is None and not self._unreadable_logged:
            self._unreadable_logged = True  # once: it will not start working by itself
            log.warning("cannot read the host's available memory: the memory guard admits everything")
        if before.admitting and not self.state.admitting:
            log.error(
                "host memory low: %s available, below box.min_free %s; admitting no new requests until %s",
                gib(available or 0),
                gib(self.limits.floor),
                gib(self.limits.resume_at),
            )
        elif not before.admitting and self.state.admitting:
            log.warning("host memory back: %s available; admitting new requests again", gib(available or 0))
        return self.state

    def refusal(self) -> MemoryLow | None:
        """The error for a request that would be admitted now (None: admit it)."""
        if self.state.admitting:
            return None
        self.refused += 1
        return MemoryLow(available=self.state.available or 0, floor=self.limits.floor, retry_after_s=self.retry_after_s)

    def reason(self) -> str | None:
        """Why /ready says not ready (None: memory is no reason)."""
        if self.state.admitting:
            return None
        return (
            f"host memory low: {gib(self.state.available or 0)} available, below the floor "
            f"{gib(self.limits.floor)} (admitting again at {gib(self.limits.resume_at)})"
        )

    def view(self) -> dict[str, Any]:
        """The guard as /ready and the dashboard show it."""
        s = self.state
        return {
            "admitting": s.admitting,
            "available_bytes": s.available,
            "min_free_bytes": self.limits.floor,
            "resume_at_bytes": self.limits.resume_at,
            "stops": s.stops,
            "refused": self.refused,
        }

    def start(self) -> None:
        self.sample()  # the first request already sees a reading
        self._task = asyncio.create_task(self._poll(), name="memory-watch")

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            self.sample()

    async def stop(self) -> None:
        if self._task is not None:
            task, self._task = self._task, None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def from_settings(box: BoxSettings | None, source: HostMemory | None = None) -> MemoryWatch | None:
    """The watch a box's settings ask for; None without a floor (no `box:`, or min_free 0)."""
    if box is None or box.min_free == 0:
        return None
    g = box.guard
    return MemoryWatch(
        MemInfo() if source is None else source,
        GuardLimits(floor=box.min_free, resume_margin=g.resume_margin),
        poll_s=g.poll_s,
        retry_after_s=g.retry_after_s,
    )
