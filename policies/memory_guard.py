"""The run-time memory guard's decision (issue 51): does the box admit new work, given the
host memory available now?

A DGX Spark's CPU and GPU share one memory; when the host runs out, the box wedges (the
whole team's outage) rather than failing one request. So below a floor the gateway admits
nothing new, and it resumes only once memory is back above the floor plus a margin, so that
a box hovering at the floor does not flap between the two:

    admitting, available < floor                   -> stopped
    stopped,   available >= floor + resume_margin  -> admitting
    otherwise                                      -> as it was
    floor 0 (no floor)                             -> admitting
    available unknown (the reading failed)         -> admitting: a guard that cannot read
                                                      memory must not be the outage itself

Values in, a value out: the gateway's shell (gateway/host_memory.py) reads the memory,
holds the state and refuses the requests.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GuardLimits:
    floor: int  # bytes of available memory below which nothing new is admitted; 0: no floor
    resume_margin: int = 0  # bytes above the floor memory must reach before admitting again

    def __post_init__(self) -> None:
        if self.floor < 0 or self.resume_margin < 0:
            raise ValueError("a memory floor and its resume margin are sizes: at least 0")

    @property
    def resume_at(self) -> int:
        return self.floor + self.resume_margin


@dataclass(frozen=True, slots=True)
class GuardState:
    admitting: bool = True
    available: int | None = None  # the last reading, bytes (None: none yet, or it failed)
    stops: int = 0  # times it stopped admitting, since the start


def observe(limits: GuardLimits, state: GuardState, available: int | None) -> GuardState:
    """The guard's state after a reading of the available memory (bytes)."""
    if limits.floor == 0 or available is None:
        admitting = True
    elif state.admitting:
        admitting = available >= limits.floor
    else:
        admitting = available >= limits.resume_at
    stops = state.stops + (state.admitting and not admitting)
    return GuardState(admitting=admitting, available=available, stops=stops)
