"""Admission: may a request start now, wait in the queue, or must it be turned away?

A deterministic state machine, in the style of vLLM's scheduler and TGI's
queue: methods take values (a `Demand`, a job id) and return values
(`Admit`, `Queue`, `Reject`); it never sleeps, reads a clock or does I/O. The
async shell in `gateway/admission.py` owns the futures and timers.

What it guarantees, per pool (one pool = one engine's KV cache and slots):
- the blocks of admitted requests never exceed the pool (so vLLM never has to
  preempt one of them), counting prompt blocks that admitted requests share
  through the prefix cache once, like vLLM does;
- admitted sequences never exceed the engine's running slots, and a user never
  runs more than their concurrency cap;
- the queue is bounded by entries, tokens and entries per user; when it is
  full, the user with the most queued entries gives one up (not the newcomer
  with fewer), so a flood cannot lock a light user out;
- waiting requests start in priority-class order, and within a class by
  least-recently-served user (round robin), so a light user waits at most one
  service slot behind a heavy one; with fair share (policies/fair.py) it does not
  wait at all: a user running less than it is owed takes room a flood may not. A
  request that does not fit yet may be bypassed by smaller ones at most `max_bypass` times, then the pool drains
  for it (no starvation of big requests).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

from policies.demand import (
    BACKLOG_MAX_OUTPUT,
    Admit,
    Decision,
    Demand,
    PoolLimits,
    PoolSnapshot,
    Queue,
    QueueLimits,
    Reject,
    RejectReason,
)
from policies.fair import OFF, FairShare, Shares

DEFAULT_LIMITS = QueueLimits()


@dataclass(slots=True)
class _Block:
    refs: int
    ready: bool  # its owner's prefill is done: a new request will hit it
    resumes: int = 0  # holders whose cached state ends here (hybrid models resume only there)


@dataclass(slots=True)
class _Holding:
    demand: Demand
    private: int  # blocks charged privately (including duplicates of unready shared blocks)
    keys: list[Hashable]  # table keys it holds a reference on
    owned: list[Hashable]  # keys it inserted (its prefill makes them ready)
    duplicated: list[Hashable]  # keys it pays for privately although the table has them
    hits: int  # predicted prefix-hit blocks


@dataclass(slots=True)
class _Waiting:
    demand: Demand
    seq: int
    bypassed: int = 0


@dataclass(slots=True)
class _Pool:
    limits: PoolLimits
    private: int = 0
    table: dict[Hashable, _Block] = field(default_factory=dict)
    sequences: int = 0
    holdings: dict[str, _Holding] = field(default_factory=dict)
    # Waiting entries: per class, per user FIFO; a heap orders users by when
    # they were last served (lazy deletion: stale heap items are skipped).
    waiting: dict[int, dict[str, deque[_Waiting]]] = field(default_factory=dict)
    heaps: dict[int, list[tuple[int, int, str]]] = field(default_factory=dict)
    last_served: dict[str, int] = field(default_factory=dict)
    queued: int = 0
    queued_tokens: int = 0
    class_queued: dict[int, int] = field(default_factory=dict)
    user_queued: dict[str, int] = field(default_factory=dict)
    closed: bool = False
    closed_retry_s: float | None = None  # when to try again while closed (None: not soon)
    shares: Shares = field(init=False)

    @property
    def used(self) -> int:
        return self.private + len(self.table)

    def hits(self, d: Demand) -> int:
        """Leading shared keys held by admitted, prefilled requests (a chain: stop at the first miss)."""
        n = 0
        resumable = 0
        for k in d.shared_keys:
            b = self.table.get(k)
            if b is None or not b.ready:
                break
            n += 1
            if b.resumes:
                resumable = n
        return resumable if d.resume_at_end_only else n

    def cost(self, d: Demand) -> tuple[int, int]:
        hits = self.hits(d)
        return d.private_blocks + len(d.shared_keys) - hits, hits


class Admission:
    """The ledger and the fair queue of every pool. Not thread-safe: one event loop drives it."""

    def __init__(
        self, pools: Iterable[PoolLimits], limits: QueueLimits = DEFAULT_LIMITS, fair: FairShare = OFF
    ) -> None:
        self.limits = limits
        self._pools = {p.name: _Pool(p) for p in pools}
        for p in self._pools.values():
            p.shares = Shares(fair, p.limits.max_sequences, p.limits.blocks)
        self._seq = itertools.count()
        self._serve_clock = itertools.count(1)
        self._user_running: dict[str, int] = {}
        self._where: dict[str, _Waiting] = {}  # waiting job id -> its entry

    # -- requests --------------------------------------------------------------
    # `now`: the caller's clock, in seconds; only fair share's idle grace reads it.

    def offer(self, d: Demand, now: float = 0.0) -> tuple[Decision, list[Admit | Reject]]:
        """A new job. Returns its decision and what else changed (entries displaced from the
        queue, entries admitted to room an idle user's grace no longer holds)."""
        others: list[Admit | Reject] = list(self.expire(now))
        pool = self._pools[d.pool]
        if pool.closed:
            return self._closed(d.id, pool), others
        if d.worst_case_blocks > pool.limits.blocks or d.sequences > pool.limits.max_sequences:
            return self._too_large(d, pool), others
        if self._user_queued(pool, d.user) >= self.limits.max_queued_per_user:
            return self._busy(d, pool, RejectReason.USER_QUEUE_FULL), others
        if pool.queued >= self.limits.max_queued or pool.queued_tokens + d.tokens > self.limits.max_queued_tokens:
            victim = self._displaceable(pool, d)
            if victim is None:
                reason = (
                    RejectReason.QUEUE_FULL if pool.queued >= self.limits.max_queued else RejectReason.QUEUE_TOKENS_FULL
                )
                return self._busy(d, pool, reason), others
            self._unqueue(pool, victim, now)
            others.append(
                self._busy(victim.demand, pool, RejectReason.DISPLACED, "Your request was displaced by the fair share.")
            )
        self._enqueue(pool, _Waiting(d, next(self._seq)))
        admitted = self._schedule_all()
        mine = next((a for a in admitted if a.id == d.id), None)
        others.extend(a for a in admitted if a.id != d.id)
        if mine is not None:
            return mine, others
        return Queue(d.id, self._position(pool, d)), others

    def release(self, job_id: str, now: float = 0.0) -> list[Admit]:
        """An admitted job ended (success, error, timeout, disconnect): free it, admit who now fits.

        Releasing twice, or releasing an id that was never admitted, is a no-op (but for what
        time passing frees).
        """
        freed = self.expire(now)
        pool_name = self._holder_pool(job_id)
        if pool_name is None:
            return freed
        pool = self._pools[pool_name]
        h = pool.holdings.pop(job_id)
        pool.private -= h.private
        pool.sequences -= h.demand.sequences
        last = h.demand.shared_keys[-1] if h.demand.shared_keys else None
        if last is not None and last in pool.table:
            pool.table[last].resumes -= 1
        for k in h.keys:
            b = pool.table[k]
            b.refs -= 1
            if b.refs == 0:
                del pool.table[k]
        self._user_running[h.demand.user] -= 1
        if self._user_running[h.demand.user] == 0:
            del self._user_running[h.demand.user]
        pool.shares.ended(h.demand.user, h.demand.sequences, now)
        return freed + self._schedule_all()

    def cancel(self, job_id: str, now: float = 0.0) -> list[Admit]:
        """A job gave up (its client left): unqueue it if waiting, else release it."""
        w = self._where.get(job_id)
        if w is None:
            return self.release(job_id, now)
        freed = self.expire(now)
        if job_id not in self._where:
            return freed  # admitted to the room that fell free
        self._unqueue(self._pools[w.demand.pool], w, now)
        # The bypass budget it held back may let others in now.
        return freed + self._schedule_all()

    def timeout(self, job_id: str, now: float = 0.0) -> Reject | None:
        """A waiting job's time is up: its rejection, or None if it was admitted meanwhile."""
        w = self._where.get(job_id)
        if w is None:
            return None
        pool = self._pools[w.demand.pool]
        self._unqueue(pool, w, now)
        return self._busy(w.demand, pool, RejectReason.QUEUE_TIMEOUT, "Your request waited too long in the queue.")

    def prefilled(self, job_id: str) -> None:
        """The job's prompt is in the engine's cache now: its blocks can be shared."""
        pool_name = self._holder_pool(job_id)
        if pool_name is None:
            return
        pool = self._pools[pool_name]
        for k in pool.holdings[job_id].owned:
            pool.table[k].ready = True

    def reconcile(self, job_id: str, hit_blocks: int) -> tuple[int, list[Admit]]:
        """The engine reports how many prompt blocks it found cached for the job.

        More than predicted: blocks it paid for as duplicates of blocks an
        admitted request holds are refunded. Fewer than predicted (a
        misprediction): it is charged the difference. Returns (the charge
        change, jobs admitted thanks to a refund).
        """
        pool_name = self._holder_pool(job_id)
        if pool_name is None:
            return 0, []
        pool = self._pools[pool_name]
        h = pool.holdings[job_id]
        keys = h.demand.shared_keys
        hit_blocks = min(hit_blocks, len(keys))
        delta = 0
        if hit_blocks > h.hits:
            for k in keys[h.hits : hit_blocks]:
                if k in h.duplicated and k in pool.table:
                    h.duplicated.remove(k)
                    pool.table[k].refs += 1
                    h.keys.append(k)
                    h.private -= 1
                    pool.private -= 1
                    delta -= 1
        elif hit_blocks < h.hits:
            delta = h.hits - hit_blocks
            h.private += delta
            pool.private += delta
        h.hits = hit_blocks
        return delta, (self._schedule_all() if delta < 0 else [])

    # -- capacity --------------------------------------------------------------

    def expire(self, now: float) -> list[Admit]:
        """Time passed: room owed to users idle since `idle_s` before `now` falls free; who now fits."""
        return self._schedule_all() if self._expire(now) else []

    def next_expiry(self) -> float | None:
        """When `expire` should run next (the caller's clock; None: no need)."""
        return min((t for p in self._pools.values() if (t := p.shares.next_expiry()) is not None), default=None)

    def close(self, pool_name: str, retry_after_s: float | None = None, now: float = 0.0) -> list[Reject]:
        """The pool's engine is gone: reject everyone waiting for it, and every newcomer until
        `reopen`, with `retry_after_s` (seconds; None: it is not coming back soon). Holdings stay
        until their jobs release them. Closing a closed pool updates its retry hint."""
        pool = self._pools[pool_name]
        pool.closed = True
        pool.closed_retry_s = retry_after_s
        rejects = []
        for w in [w for w in self._where.values() if w.demand.pool == pool_name]:
            self._unqueue(pool, w, now)
            rejects.append(self._closed(w.demand.id, pool))
        return rejects

    def reopen(self, pool_name: str) -> list[Admit]:
        """The pool's engine serves again (the same pool: see policies/restart.py)."""
        pool = self._pools[pool_name]
        pool.closed = False
        pool.closed_retry_s = None
        return self._schedule_all()

    def is_closed(self, pool_name: str) -> bool:
        return self._pools[pool_name].closed

    def pool_limits(self, pool_name: str) -> PoolLimits:
        return self._pools[pool_name].limits

    def snapshot(self, pool_name: str) -> PoolSnapshot:
        p = self._pools[pool_name]
        return PoolSnapshot(
            name=pool_name,
            capacity_blocks=p.limits.blocks,
            used_blocks=p.used,
            shared_blocks=len(p.table),
            running_sequences=p.sequences,
            max_sequences=p.limits.max_sequences,
            admitted=len(p.holdings),
            queued=p.queued,
            queued_tokens=p.queued_tokens,
            active_users=p.shares.active(),
            owed_slots=p.shares.owed()[0],
            owed_blocks=p.shares.owed()[1],
        )

    def user_running(self, user: str) -> int:
        return self._user_running.get(user, 0)

    # -- internals -------------------------------------------------------------

    def _expire(self, now: float) -> bool:
        changed = False
        for p in self._pools.values():
            changed = p.shares.expire(now) or changed
        return changed

    def _holder_pool(self, job_id: str) -> str | None:
        for name, pool in self._pools.items():
            if job_id in pool.holdings:
                return name
        return None

    def _closed(self, job_id: str, pool: _Pool) -> Reject:
        return Reject(
            job_id,
            RejectReason.POOL_CLOSED,
            f"Model {pool.limits.name} is not accepting requests: its engine is unavailable.",
            retry_after=pool.closed_retry_s,
        )

    def _too_large(self, d: Demand, pool: _Pool) -> Reject:
        lim = pool.limits
        if d.sequences > lim.max_sequences:
            msg = (
                f"This request needs {d.sequences} sequences at once (prompts x n), "
                f"but model {lim.name} runs at most {lim.max_sequences}. Lower n or send fewer prompts."
            )
        else:
            msg = (
                f"This request needs up to {d.worst_case_blocks} KV-cache blocks (prompt + max_tokens, per "
                f"sequence), but model {lim.name} has {lim.blocks} in all. Lower max_tokens, n or the prompt."
            )
        return Reject(d.id, RejectReason.REQUEST_TOO_LARGE, msg)

    def _busy(self, d: Demand, pool: _Pool, reason: RejectReason, message: str | None = None) -> Reject:
        text = message or {
            RejectReason.QUEUE_FULL: f"Model {pool.limits.name} is overloaded: its queue is full.",
            RejectReason.QUEUE_TOKENS_FULL: f"Model {pool.limits.name} is overloaded: too many tokens are queued.",
            RejectReason.USER_QUEUE_FULL: "You have too many requests waiting; wait for some to finish.",
        }.get(reason, reason.label)
        return Reject(d.id, reason, f"{text} Please retry after a short wait.", retry_after=self._wait_hint(pool))

    def _wait_hint(self, pool: _Pool) -> float:
        """Rough seconds until room: the queue drains a slot-load at a time (the shell scales it by service time)."""
        return float(1 + pool.queued // max(pool.limits.max_sequences, 1))

    def _user_queued(self, pool: _Pool, user: str) -> int:
        return pool.user_queued.get(user, 0)

    def _displaceable(self, pool: _Pool, d: Demand) -> _Waiting | None:
        """Under a full queue, the heaviest user's newest, least urgent entry gives way to a
        newcomer with fewer queued entries (or a more urgent class)."""
        mine = self._user_queued(pool, d.user)
        best: tuple[int, int, int] | None = None
        victim: _Waiting | None = None
        for prio, users in pool.waiting.items():
            for user, fifo in users.items():
                if user == d.user:
                    continue
                w = fifo[-1]
                theirs = self._user_queued(pool, user)
                if prio < d.priority or (prio == d.priority and theirs <= mine + 1):
                    continue
                key = (prio, theirs, w.seq)
                if best is None or key > best:
                    best, victim = key, w
        if victim is not None and pool.queued_tokens - victim.demand.tokens + d.tokens > self.limits.max_queued_tokens:
            return None
        return victim

    def _enqueue(self, pool: _Pool, w: _Waiting) -> None:
        d = w.demand
        users = pool.waiting.setdefault(d.priority, {})
        fifo = users.get(d.user)
        if fifo is None:
            fifo = users[d.user] = deque()
        if not fifo:
            heapq.heappush(pool.heaps.setdefault(d.priority, []), (pool.last_served.get(d.user, 0), w.seq, d.user))
        fifo.append(w)
        pool.queued += 1
        pool.queued_tokens += d.tokens
        pool.class_queued[d.priority] = pool.class_queued.get(d.priority, 0) + 1
        pool.user_queued[d.user] = pool.user_queued.get(d.user, 0) + 1
        self._where[d.id] = w
        pool.shares.queued(d.user, d.sequences, d.worst_case_blocks)

    def _unqueue(self, pool: _Pool, w: _Waiting, now: float) -> None:
        d = w.demand
        fifo = pool.waiting[d.priority][d.user]
        was_head = fifo[0] is w
        fifo.remove(w)
        if not fifo:
            del pool.waiting[d.priority][d.user]
            if not pool.waiting[d.priority]:
                del pool.waiting[d.priority]
        elif was_head:
            # The user's new head needs its own heap item (the old one is now stale).
            heapq.heappush(pool.heaps[d.priority], (pool.last_served.get(d.user, 0), fifo[0].seq, d.user))
        pool.queued -= 1
        pool.queued_tokens -= d.tokens
        pool.class_queued[d.priority] -= 1
        pool.user_queued[d.user] -= 1
        if not pool.user_queued[d.user]:
            del pool.user_queued[d.user]
        del self._where[d.id]
        pool.shares.unqueued(d.user, now)

    def _position(self, pool: _Pool, d: Demand) -> int:
        """Entries of its class and more urgent ones that wait beside it (round robin decides the order)."""
        return sum(n for prio, n in pool.class_queued.items() if prio <= d.priority) - 1

    def _slots(self, pool: _Pool, d: Demand) -> int:
        """The sequences `d` may find started in the pool: the engine's slots, and a lone user's
        short requests a backlog in the engine's own queue (QueueLimits.lone_backlog)."""
        slots = pool.limits.max_sequences
        if self.limits.lone_backlog and 0 < d.max_output <= BACKLOG_MAX_OUTPUT and pool.shares.alone(d.user):
            slots += int(self.limits.lone_backlog * slots)
        return slots

    def _fits(self, pool: _Pool, d: Demand, slots: int) -> tuple[bool, int, int]:
        """Whether `d` fits in the pool's free KV and its `slots` (`_slots`); its cost and hits."""
        cost, hits = pool.cost(d)
        ok = pool.used + cost <= pool.limits.blocks and pool.sequences + d.sequences <= slots
        return ok, cost, hits

    def _fair(self, pool: _Pool, d: Demand, cost: int, slots: int) -> bool:
        """Whether it leaves the room others are owed (it fits: `_fits`)."""
        free_slots = slots - pool.sequences
        return pool.shares.allows(d.user, d.sequences, cost, free_slots, pool.limits.blocks - pool.used)

    def _admit(self, pool: _Pool, w: _Waiting, hits: int) -> Admit:
        d = w.demand
        pool.shares.started(d.user, d.sequences)  # first: busy, it never looks idle in between
        self._unqueue(pool, w, 0.0)
        keys: list[Hashable] = []
        owned: list[Hashable] = []
        dup: list[Hashable] = []
        private = d.private_blocks
        for i, k in enumerate(d.shared_keys):
            b = pool.table.get(k)
            if i < hits:
                assert b is not None
                b.refs += 1
                keys.append(k)
            elif b is None:
                pool.table[k] = _Block(refs=1, ready=False)
                keys.append(k)
                owned.append(k)
            else:
                dup.append(k)
                private += 1
        if d.shared_keys and d.shared_keys[-1] in pool.table:
            pool.table[d.shared_keys[-1]].resumes += 1  # its state will be cached at its last key
        pool.private += private
        pool.sequences += d.sequences
        pool.holdings[d.id] = _Holding(d, private, keys, owned, dup, hits)
        self._user_running[d.user] = self._user_running.get(d.user, 0) + 1
        pool.last_served[d.user] = next(self._serve_clock)
        return Admit(d.id, private + len(owned), hits)

    def _schedule_all(self) -> list[Admit]:
        out: list[Admit] = []
        for pool in self._pools.values():
            out.extend(self._schedule(pool))
        return out

    def _schedule(self, pool: _Pool) -> list[Admit]:
        """Admit waiting entries in class order, least-recently-served user first, while they fit."""
        admitted: list[Admit] = []
        for prio in sorted(pool.waiting):
            heap = pool.heaps.get(prio, [])
            skipped: list[tuple[int, int, str]] = []
            failed: list[_Waiting] = []  # heads that did not fit: others that pass them bypass them
            while heap:
                item = heapq.heappop(heap)
                stamp, seq, user = item
                fifo = pool.waiting.get(prio, {}).get(user)
                # Stale: the user's queue emptied, or it was re-pushed with a newer stamp or head.
                if not fifo or stamp != pool.last_served.get(user, 0) or seq != fifo[0].seq:
                    continue
                head = fifo[0]
                cap = head.demand.user_max_running
                if cap is not None and self._user_running.get(user, 0) >= cap:
                    skipped.append(item)  # not eligible now; keeps its place
                    continue
                slots = self._slots(pool, head.demand)
                ok, cost, hits = self._fits(pool, head.demand, slots)
                if ok and not self._fair(pool, head.demand, cost, slots):
                    skipped.append(item)  # it would take room others are owed; keeps its place
                    continue
                if not ok:
                    failed.append(head)
                    skipped.append(item)
                    # Out of slots: nothing fits. Bypassed often enough: drain the pool for it.
                    if (
                        head.bypassed >= self.limits.max_bypass
                        or pool.sequences >= pool.limits.max_sequences
                        or len(failed) >= self.limits.max_scan
                    ):
                        break
                    continue
                for f in failed:
                    f.bypassed += 1
                admitted.append(self._admit(pool, head, hits))
                if fifo:
                    heapq.heappush(heap, (pool.last_served[user], fifo[0].seq, user))
            for item in skipped:
                heapq.heappush(heap, item)
            if failed:
                # A more urgent class is waiting for room: less urgent ones must not take it.
                break
        return admitted
