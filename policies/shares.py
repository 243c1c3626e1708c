"""Shares of one engine's KV pool and slots among the gateways that reach it remotely.

Admission never over-commits an engine because it counts against the blocks and
slots the engine really has. A remote engine (one on another box, served by
`sparkgate engine-host`) may be reached by several gateways; each claims a
share, the host grants claims whose sum stays within the whole, and each
gateway admits against its share only. Claims are leases: a gateway renews its
own while it lives, and a dead gateway's share frees when its lease lapses.

Pure: values in, values out; "cannot grant" is a value.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar


class Pool(Protocol):
    """What a share reads of an engine's KV spec (`engine_adapter.base.KVSpec` is one), a
    dataclass it rewrites in a copy."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def usable_blocks(self) -> int: ...
    @property
    def max_num_seqs(self) -> int: ...
    @property
    def bytes_per_block(self) -> int: ...


SpecT = TypeVar("SpecT", bound=Pool)

EPSILON = 1e-9  # shares like 1/3 + 1/3 + 1/3 must add up to the whole


@dataclass(frozen=True, slots=True)
class Lease:
    share: float
    expires: float  # the host's clock, seconds


@dataclass(frozen=True, slots=True)
class Refused:
    message: str


Claims = Mapping[str, Lease]  # gateway id -> its lease


def live(claims: Claims, now: float) -> dict[str, Lease]:
    """The claims whose lease has not lapsed."""
    return {g: lease for g, lease in claims.items() if lease.expires > now}


def grant(claims: Claims, gateway: str, share: float, now: float, ttl_s: float) -> dict[str, Lease] | Refused:
    """Grant (or renew) `gateway`'s claim on `share` of the engine until now + ttl_s."""
    others = {g: lease for g, lease in live(claims, now).items() if g != gateway}
    held = sum(lease.share for lease in others.values())
    if not 0 < share <= 1:
        return Refused(f"a share must be in (0, 1], got {share}")
    if held + share > 1 + EPSILON:
        return Refused(
            f"{len(others)} other gateway(s) hold {held:.3g} of this engine; "
            f"{share:.3g} more would exceed it (free: {max(0.0, 1 - held):.3g})"
        )
    return {**others, gateway: Lease(share, now + ttl_s)}


def renew(claims: Claims, gateway: str, now: float, ttl_s: float) -> dict[str, Lease] | Refused:
    """Extend a live claim; a lapsed one must be claimed again (its share may be gone)."""
    current = live(claims, now)
    if gateway not in current:
        return Refused(f"gateway {gateway} holds no live claim on this engine")
    return {**current, gateway: Lease(current[gateway].share, now + ttl_s)}


def release(claims: Claims, gateway: str, now: float) -> dict[str, Lease]:
    """The live claims without `gateway`'s (a gateway shutting down frees its share at once)."""
    return {g: lease for g, lease in live(claims, now).items() if g != gateway}


def share_spec(spec: SpecT, share: float) -> SpecT | Refused:
    """The engine as one gateway may use it: `share` of the usable blocks and of the
    running slots, rounded down, so that granted shares never add up past the whole."""
    blocks = math.floor(spec.usable_blocks * share + EPSILON)
    seqs = math.floor(spec.max_num_seqs * share + EPSILON)
    if blocks < 1 or seqs < 1:
        return Refused(
            f"a share of {share:.3g} of {spec.usable_blocks} blocks and {spec.max_num_seqs} "
            "running sequences leaves this gateway nothing to admit against"
        )
    return dataclasses.replace(
        spec,
        num_blocks=blocks + 1,  # plus vLLM's null block, as KVSpec counts it
        max_num_seqs=seqs,
        kv_cache_bytes=blocks * spec.bytes_per_block,
    )
