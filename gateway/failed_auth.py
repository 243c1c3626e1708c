"""The failed-authentication table: each client's record (policies/failed_auth.py), bounded.

At most `auth.failed.max_clients` clients are remembered, so an attacker rotating addresses
cannot grow the gateway's memory. Records that have nothing left to say go first; when the
table is still full, the client whose last failure is oldest is forgotten, a blocked client
only when every remembered client is blocked (so churn through fresh addresses cannot free
the addresses already blocked).

`guarded(client, attempt)` wraps every key check (API keys, admin keys, the metrics token):
a blocked client gets 429 before its key is looked at; a 401 counts against the client.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from typing import TypeVar

from gateway.errors import AuthenticationFailed, AuthThrottled
from gateway.settings import FailedAuthSettings
from policies import failed_auth as policy

T = TypeVar("T")

# `sparkgate_auth_failures_total{reason}`: no key, a wrong one, refused while blocked.
MISSING, INVALID, BLOCKED = "missing", "invalid", "blocked"


class FailedAuthTable:
    def __init__(self, settings: FailedAuthSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = policy.FailureLimits(settings.max_failures, settings.window_s, settings.block_s)
        self.max_clients = settings.max_clients
        self._clock = clock
        # Each ordered by last change: the oldest first. Blocks all last block_s, so the
        # blocked table is also in order of their ends.
        self._counting: OrderedDict[str, policy.ClientRecord] = OrderedDict()
        self._blocked: OrderedDict[str, policy.ClientRecord] = OrderedDict()
        self.failures: Counter[str] = Counter()  # by reason, for /metrics

    def __len__(self) -> int:
        return len(self._counting) + len(self._blocked)

    @property
    def blocked_clients(self) -> int:
        now = self._clock()
        return sum(1 for r in self._blocked.values() if isinstance(policy.check(r, now), policy.Block))

    def _record(self, client: str) -> policy.ClientRecord | None:
        return self._blocked.get(client) or self._counting.get(client)

    def check(self, client: str) -> None:
        """Raise 429 when the client is blocked."""
        decision = policy.check(self._record(client), self._clock())
        if isinstance(decision, policy.Block):
            self.failures[BLOCKED] += 1
            raise AuthThrottled(decision.retry_after_s)

    def failed(self, client: str, reason: str) -> None:
        """Count a failure: `invalid` ones (a guessed key) toward the block; `missing` ones (no
        key at all guesses nothing) only in the metric."""
        self.failures[reason] += 1
        if reason != INVALID:
            return
        now = self._clock()
        record = policy.failed(self._record(client), self.limits, now)
        self._counting.pop(client, None)
        self._blocked.pop(client, None)
        self._make_room(now)
        (self._blocked if record.blocked else self._counting)[client] = record

    def _make_room(self, now: float) -> None:
        for table in (self._blocked, self._counting):
            while table and policy.forgettable(next(iter(table.values())), self.limits, now):
                table.popitem(last=False)
        while len(self) >= self.max_clients:
            (self._counting or self._blocked).popitem(last=False)

    async def guarded(self, client: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """`attempt` (a key check) unless the client is blocked; its 401 counts as a failure."""
        self.check(client)
        try:
            return await attempt()
        except AuthenticationFailed as e:
            self.failed(client, MISSING if e.code == "missing_api_key" else INVALID)
            raise
