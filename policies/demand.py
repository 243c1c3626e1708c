"""What admission speaks: a job's demand on a pool, the limits of pools and queues, the
decisions (`Admit`, `Queue`, `Reject` and its reasons) and a pool's numbers. Values only;
the state machine that decides is `policies/admission.py`."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from enum import Enum

DEFAULT_MAX_QUEUED = 256
DEFAULT_MAX_QUEUED_TOKENS = 4_000_000
DEFAULT_MAX_QUEUED_PER_USER = 64
DEFAULT_MAX_BYPASS = 4
DEFAULT_MAX_SCAN = 16


class RejectReason(Enum):
    """Why a request is turned away: (metric label, HTTP status, OpenAI error code)."""

    REQUEST_TOO_LARGE = ("request_too_large", 400, "request_too_large")
    QUEUE_FULL = ("queue_full", 503, "server_overloaded")
    QUEUE_TOKENS_FULL = ("queue_tokens_full", 503, "server_overloaded")
    USER_QUEUE_FULL = ("user_queue_full", 429, "rate_limit_exceeded")
    DISPLACED = ("displaced_by_fair_share", 503, "server_overloaded")
    QUEUE_TIMEOUT = ("queue_timeout", 503, "queue_timeout")
    POOL_CLOSED = ("pool_closed", 503, "engine_unavailable")

    @property
    def label(self) -> str:
        return self.value[0]

    @property
    def status(self) -> int:
        return self.value[1]

    @property
    def code(self) -> str:
        return self.value[2]


@dataclass(frozen=True, slots=True, kw_only=True)
class Demand:
    """What one job needs from a pool, worst case (prompt + max output)."""

    id: str
    pool: str
    user: str
    priority: int = 0  # 0 is the most urgent class
    sequences: int = 1  # running slots: prompts x n
    private_blocks: int  # blocks nobody else can supply
    # Chain keys of the prompt's full blocks that a live request may already
    # hold (vLLM reuses whole blocks hashed from the start): each costs a block
    # unless an admitted, prefilled request holds it.
    shared_keys: tuple[Hashable, ...] = ()
    # Hybrid (linear-attention) models: the engine can resume only where a state was
    # cached, i.e. at the end of a live request's shared keys (its replay boundary).
    resume_at_end_only: bool = False
    tokens: int = 0  # what it counts against the queue's token bound
    user_max_running: int | None = None  # the user's concurrency cap (jobs)
    max_output: int = 0  # its longest answer's tokens (max_tokens; 0: not known)

    @property
    def worst_case_blocks(self) -> int:
        return self.private_blocks + len(self.shared_keys)


@dataclass(frozen=True, slots=True)
class Admit:
    id: str
    blocks: int  # blocks charged to the pool for it now
    shared_blocks: int  # prompt blocks it shares with admitted requests


@dataclass(frozen=True, slots=True)
class Queue:
    id: str
    position: int  # entries ahead of it in its pool (all classes), 0-based


@dataclass(frozen=True, slots=True)
class Reject:
    id: str
    reason: RejectReason
    message: str
    retry_after: float | None = None  # seconds; None where waiting cannot help


Decision = Admit | Queue | Reject


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolLimits:
    """One engine's capacity, read from the running engine."""

    name: str
    blocks: int  # usable KV blocks
    max_sequences: int  # running slots (vLLM's max_num_seqs, or lower)


BACKLOG_MAX_OUTPUT = 16  # tokens: a request this short runs a few steps (QueueLimits.lone_backlog)


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueLimits:
    max_queued: int = DEFAULT_MAX_QUEUED
    max_queued_tokens: int = DEFAULT_MAX_QUEUED_TOKENS
    max_queued_per_user: int = DEFAULT_MAX_QUEUED_PER_USER
    max_bypass: int = DEFAULT_MAX_BYPASS
    # Heads that do not fit, looked at per pass before giving up: keeps a decision
    # O(log users) when thousands of users wait on a full pool.
    max_scan: int = DEFAULT_MAX_SCAN
    # While one user alone uses a pool, it may start this share of the pool's slots more
    # short requests (answers of at most BACKLOG_MAX_OUTPUT tokens) than the engine runs: they
    # wait in the engine's own queue, so a sequence that ends is replaced in the same engine
    # step, not a step later after the gateway hears of it (1-token answers: every other step
    # lost). Their KV is reserved like any other's, so the engine still never preempts. Beside
    # other users: none (fair share decides who goes next); a user arriving waits for the
    # backlog's short requests to start and end, a few steps.
    lone_backlog: float = 0.0


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    name: str
    capacity_blocks: int
    used_blocks: int
    shared_blocks: int  # distinct prompt blocks in the prefix table
    running_sequences: int
    max_sequences: int
    admitted: int
    queued: int
    queued_tokens: int
    active_users: int = 0  # users running, waiting or recently served (policies/fair.py)
    owed_slots: int = 0  # running slots kept for active users that run less than they are owed
    owed_blocks: int = 0  # and KV blocks
