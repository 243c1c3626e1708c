"""Per-key quotas: where the counters and keys live, and the async gate around them.

- store.py: the `QuotaStore` protocol and the values it speaks (`KeyRecord`, `Reserved`, ...)
- memory.py: `MemoryQuotaStore`, this process's counters (the embedded default)
- redis_store.py: `RedisQuotaStore`, shared by every replica (scripts/*.lua, atomic)
- gate.py: `QuotaGate` and its `Hold`s: settled once, leases renewed, Redis outages

The rules themselves are pure, in policies/quotas.py; docs/quotas.md has the whole story.
"""

from gateway.quota.gate import Hold, QuotaGate, QuotaMetrics, StoreDown, scopes_of
from gateway.quota.memory import MemoryQuotaStore
from gateway.quota.redis_store import RedisQuotaStore
from gateway.quota.store import KeyRecord, PeriodUsage, QuotaStore, Refused, Reserved, ScopeUsage, StoreStats

__all__ = [
    "Hold",
    "KeyRecord",
    "MemoryQuotaStore",
    "PeriodUsage",
    "QuotaGate",
    "QuotaMetrics",
    "QuotaStore",
    "RedisQuotaStore",
    "Refused",
    "Reserved",
    "ScopeUsage",
    "StoreDown",
    "StoreStats",
    "scopes_of",
]
