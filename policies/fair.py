"""Fair share of one pool's running slots and KV among the users active on it.

Round robin (policies/admission.py) orders who goes next, but a flood still holds every
running slot: a light user's request then waits until one of the flood's long requests
ends (a long request holds its slot for its whole decode). Fair share keeps room for
the users who run little, so they start at once:

- every active user is owed `reserve_slots` running sequences, and the KV of that many
  of its recent requests (at most a slot's share of the pool each);
- a user running fewer than it is owed may take any free room (it is taking what it is
  owed); a user running its due or more may take only room nobody else is owed;
- a user is active while it has a job running or waiting, and for `idle_s` after its
  last one ended: a user sending one request after another keeps its room between them;
- while others are active, a user runs at most `max_share` of the slots (never fewer than
  it is owed): where each sequence in the batch makes every step longer (a CPU), the
  flood's batch is what delays a light user's first token. The user asking for the least
  (running and waiting) is not the flood: the cap spares it, else a light user with a few
  requests in flight would wait for its own beside a capped flood.

- a user whose last request ended less than `newcomer_s` ago is likely back soon (a person
  reading an answer before the next question): while one is idle, room for one more
  user's `reserve_slots` is kept free, so its next request starts at once instead of
  waiting for one of a flood's long requests to end.

A lone user is owed nothing by anyone else, so it gets every slot (work-conserving); as
more users become active, what a flood may hold shrinks by what they are owed. Room is
left idle only while an active user is owed it and has not claimed it, at most `idle_s`
after that user's last request, and one newcomer's room for `newcomer_s` after another
user's last request.

Pure: `now` comes in as a value (seconds on the caller's clock); the caller re-runs
admission at `next_expiry()`, when owed room falls free.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_RESERVE_SLOTS = 1
DEFAULT_IDLE_S = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class FairShare:
    """The policy's settings (gateway/settings.py validates them)."""

    enabled: bool = True
    reserve_slots: int = DEFAULT_RESERVE_SLOTS  # sequences owed to each active user
    idle_s: float = DEFAULT_IDLE_S  # a user stays active this long after its last job ended
    # While others are active, a user runs at most this share of the slots (never less than
    # `reserve_slots`): fewer sequences beside a light user's make the engine's steps shorter.
    max_share: float = 1.0
    # After a user's last request, room for one newcomer is kept this long (0: none).
    newcomer_s: float = 0.0


OFF = FairShare(enabled=False)


@dataclass(slots=True)
class _User:
    sequences: int = 0  # running now
    jobs: int = 0  # running now
    waiting: int = 0  # queued entries
    want: int = 0  # KV blocks owed per owed sequence: its last request's, capped
    until: float = -math.inf  # active until then once idle (its last job's end + idle_s)
    owed_slots: int = 0  # what it is counted as owed now (0 while inactive)
    owed_blocks: int = 0


class Shares:
    """One pool's active users and what they are owed, kept incrementally: a decision costs
    O(1) (O(active users) where the share cap binds), an expiry O(log users)."""

    def __init__(self, policy: FairShare, slots: int, blocks: int) -> None:
        self.policy = policy
        # A short request's KV: a slot's even share of the pool.
        self._block_cap = max(1, blocks // max(1, slots))
        self._share_cap = max(policy.reserve_slots, math.floor(policy.max_share * slots + 1e-9))
        self._users: dict[str, _User] = {}
        self._owed_slots = 0
        self._owed_blocks = 0
        self._expiries: list[tuple[float, str]] = []  # (until, user); stale items are skipped
        # Users expected back (their last job's end + newcomer_s), and how many of them are
        # not active now: while any is, room for one newcomer is kept.
        self._known: dict[str, float] = {}
        self._known_expiries: list[tuple[float, str]] = []  # (until, user); stale items are skipped
        self._known_idle = 0

    # -- events ----------------------------------------------------------------

    def queued(self, user: str, sequences: int, blocks: int) -> None:
        u = self._user(user)
        u.waiting += 1
        u.want = min(self._block_cap, math.ceil(blocks / max(1, sequences)))
        self._update(u)

    def unqueued(self, user: str, now: float) -> None:
        u = self._users[user]
        u.waiting -= 1
        self._idle_if_done(user, u, now)

    def started(self, user: str, sequences: int) -> None:
        u = self._user(user)
        u.sequences += sequences
        u.jobs += 1
        self._update(u)

    def ended(self, user: str, sequences: int, now: float) -> None:
        u = self._users[user]
        u.sequences -= sequences
        u.jobs -= 1
        self._idle_if_done(user, u, now)

    def expire(self, now: float) -> bool:
        """Drop the users idle for `idle_s` by `now`, and the newcomers' room of those gone
        `newcomer_s`; True if what is owed shrank."""
        changed = False
        while self._expiries and self._expiries[0][0] <= now:
            until, user = heapq.heappop(self._expiries)
            if not self._idle_until(until, user):
                continue  # stale: it became busy again, or went idle again later
            u = self._users[user]
            self._set_owed(u, 0, 0)
            del self._users[user]
            self._known_idle += user in self._known
            changed = True
        while self._known_expiries and self._known_expiries[0][0] <= now:
            until, user = heapq.heappop(self._known_expiries)
            if not self._known_until(until, user):
                continue  # stale: it went idle again later
            del self._known[user]
            if user not in self._users:
                self._known_idle -= 1
                changed = True
        return changed

    # -- questions -------------------------------------------------------------

    def allows(self, user: str, sequences: int, blocks: int, free_slots: int, free_blocks: int) -> bool:
        """Whether `user` may take `sequences` slots and `blocks` KV blocks of the free room
        (the caller has checked that they are free) without taking what others are owed."""
        if not self.policy.enabled:
            return True
        u = self._users.get(user)
        running = 0 if u is None else u.sequences
        if running < self.policy.reserve_slots:
            return True  # it takes what it is owed itself
        assert u is not None  # (it runs something)
        if len(self._users) > 1 and running + sequences > self._share_cap and not self._lightest(u):
            return False
        newcomer_slots, newcomer_blocks = self._newcomer()
        others_slots = self._owed_slots - u.owed_slots + newcomer_slots
        others_blocks = self._owed_blocks - u.owed_blocks + newcomer_blocks
        return free_slots - sequences >= others_slots and free_blocks - blocks >= others_blocks

    def next_expiry(self) -> float | None:
        """When an idle user's room falls free next (None: no idle user is owed any)."""
        if not self.policy.enabled:
            return None  # nothing is owed: `expire` on the next event is soon enough
        times = (_first_live(self._expiries, self._idle_until), _first_live(self._known_expiries, self._known_until))
        return min((t for t in times if t is not None), default=None)

    def active(self) -> int:
        """Users active now (idle ones count until `expire` drops them)."""
        return len(self._users)

    def alone(self, user: str) -> bool:
        """Whether `user` is the only user active or expected back (`newcomer_s`)."""
        return not self._known_idle and len(self._users) <= 1 and (not self._users or user in self._users)

    def owed(self) -> tuple[int, int]:
        """(slots, blocks) owed to active users and not yet claimed, and kept for a newcomer."""
        slots, blocks = self._newcomer()
        return self._owed_slots + slots, self._owed_blocks + blocks

    # -- internals -------------------------------------------------------------

    def _idle_until(self, until: float, user: str) -> bool:
        """Whether `user` is still idle until `until` (else the heap item is stale)."""
        u = self._users.get(user)
        return u is not None and u.until == until

    def _known_until(self, until: float, user: str) -> bool:
        """Whether `user` is still expected back until `until` (else the heap item is stale)."""
        return self._known.get(user) == until

    def _lightest(self, u: _User) -> bool:
        """Whether `u` asks for less (sequences running, requests waiting) than every other
        active user. O(active users), only where the share cap would bind."""
        mine = u.sequences + u.waiting
        return all(o is u or mine < o.sequences + o.waiting for o in self._users.values())

    def _newcomer(self) -> tuple[int, int]:
        """(slots, blocks) kept for a newcomer: while a user expected back is idle."""
        if not self._known_idle:
            return 0, 0
        return self.policy.reserve_slots, self.policy.reserve_slots * self._block_cap

    def _user(self, user: str) -> _User:
        u = self._users.get(user)
        if u is None:
            u = self._users[user] = _User()
            self._known_idle -= user in self._known  # back: owed its own room now
        return u

    def _idle_if_done(self, user: str, u: _User, now: float) -> None:
        if not (u.jobs or u.waiting):
            u.until = now + self.policy.idle_s
            heapq.heappush(self._expiries, (u.until, user))
            if self.policy.newcomer_s > 0:
                until = now + max(self.policy.newcomer_s, self.policy.idle_s)
                self._known[user] = until
                heapq.heappush(self._known_expiries, (until, user))
        self._update(u)

    def _update(self, u: _User) -> None:
        if u.jobs or u.waiting:
            u.until = -math.inf  # busy: active until it is idle again
        slots = max(0, self.policy.reserve_slots - u.sequences)
        self._set_owed(u, slots, slots * u.want)

    def _set_owed(self, u: _User, slots: int, blocks: int) -> None:
        self._owed_slots += slots - u.owed_slots
        self._owed_blocks += blocks - u.owed_blocks
        u.owed_slots, u.owed_blocks = slots, blocks


def _first_live(heap: list[tuple[float, str]], live: Callable[[float, str], bool]) -> float | None:
    """The earliest live item's time in `heap`, popping the stale ones before it (None: none)."""
    while heap:
        until, user = heap[0]
        if live(until, user):
            return until
        heapq.heappop(heap)
    return None
