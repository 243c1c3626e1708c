"""Failed-authentication throttling: may this client try a key now? Pure: a client's record
and the clock in, `Allow | Block` and the next record out.

A client (an address; an IPv6 /64, which one subscriber usually holds whole) opens a window
at its first failure. `max_failures` failures before the window's `window_s` have passed
block it for `block_s`: every attempt then gets 429 with Retry-After, a correct key included
(the key is not even looked at, so a blocked guesser learns nothing). When the block ends the
client starts afresh. A success changes nothing: not this client's count (else one valid key
would let an attacker reset its count between guesses), and never another client's.
"""

from __future__ import annotations

import functools
import ipaddress
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FailureLimits:
    max_failures: int  # within window_s; reaching it blocks
    window_s: float
    block_s: float


@dataclass(frozen=True, slots=True)
class ClientRecord:
    """One client's failures: its window and count, or the end of its block."""

    window_start: float = 0.0
    failures: int = 0
    blocked_until: float | None = None

    @property
    def blocked(self) -> bool:
        return self.blocked_until is not None


@dataclass(frozen=True, slots=True)
class Allow:
    pass


@dataclass(frozen=True, slots=True)
class Block:
    retry_after_s: float  # until the block ends


ALLOW = Allow()


def check(record: ClientRecord | None, now: float) -> Allow | Block:
    """Before any key is checked: is this client blocked?"""
    if record is None or record.blocked_until is None or now >= record.blocked_until:
        return ALLOW
    return Block(retry_after_s=record.blocked_until - now)


def failed(record: ClientRecord | None, limits: FailureLimits, now: float) -> ClientRecord:
    """The record after one more failure: counted in its window (a new window when the last
    one has passed), blocked once the count reaches `max_failures`."""
    if record is None or forgettable(record, limits, now):
        record = ClientRecord(window_start=now)
    elif record.blocked:
        return record  # failures while blocked do not extend the block
    count = record.failures + 1
    if count >= limits.max_failures:
        return ClientRecord(window_start=record.window_start, failures=count, blocked_until=now + limits.block_s)
    return ClientRecord(window_start=record.window_start, failures=count)


def forgettable(record: ClientRecord, limits: FailureLimits, now: float) -> bool:
    """Nothing left to remember: its block has ended, or its window has passed unblocked."""
    if record.blocked_until is not None:
        return now >= record.blocked_until
    return now - record.window_start >= limits.window_s


# Cached: parsing an address is a few microseconds on every request, and a gateway sees few
# distinct peers (a proxy's, a team's); the cache is bounded for the days it sees many.
@functools.lru_cache(maxsize=4096)
def client_key(address: str | None) -> str:
    """Whose failures these are: an IPv4 address as it is, an IPv6 address's /64 (one
    subscriber can rotate through a whole /64 at will), IPv4-mapped IPv6 as IPv4. What is not
    an IP address (a Unix socket, a test client's name) is its own key."""
    if not address:
        return "unknown"
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])  # drop an IPv6 zone id
    except ValueError:
        return address[:64]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)
