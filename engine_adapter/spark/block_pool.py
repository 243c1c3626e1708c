"""The KV block pool: vLLM-style blocks with a salt-aware prefix cache and LRU eviction."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def block_hashes(token_ids: Sequence[int], block_size: int, salt: str | None) -> list[bytes]:
    """Chain hashes of the prompt's full blocks: each covers its tokens and its parent's hash,
    seeded with the salt, so a hit means the whole prefix (and the salt) is identical."""
    parent = hashlib.sha256(b"sparkgate-sim:" + (salt or "").encode() + (b"\x01" if salt else b"\x00")).digest()
    out: list[bytes] = []
    for i in range(len(token_ids) // block_size):
        chunk = token_ids[i * block_size : (i + 1) * block_size]
        parent = hashlib.sha256(parent + b",".join(str(t).encode() for t in chunk)).digest()
        out.append(parent)
    return out


class BlockPool:
    """vLLM-style block pool: block 0 is the null block; freed blocks that carry a prefix
    hash stay cached (evictable, least recently freed first) until their id is reused."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free: list[int] = list(range(num_blocks - 1, 0, -1))  # pop() hands out 1, 2, ...
        self._ref: dict[int, int] = {}
        self._hash_of: dict[int, bytes] = {}
        self._by_hash: dict[bytes, int] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced, oldest first
        self.evictions = 0

    @property
    def usable(self) -> int:
        return self.num_blocks - 1

    @property
    def available(self) -> int:
        """Blocks a new allocation can get: free ones plus evictable cached ones."""
        return len(self._free) + len(self._lru)

    @property
    def in_use(self) -> int:
        return self.usable - self.available

    @property
    def cached(self) -> int:
        return len(self._by_hash)

    def lookup(self, hashes: Sequence[bytes]) -> list[int]:
        """The cached blocks of the longest prefix of `hashes`."""
        hits: list[int] = []
        for h in hashes:
            block = self._by_hash.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def is_evictable(self, block: int) -> bool:
        return block in self._lru

    def touch(self, block: int) -> None:
        """A request takes a reference on a cached block (a prefix hit)."""
        self._lru.pop(block, None)
        self._ref[block] = self._ref.get(block, 0) + 1

    def allocate(self) -> int:
        if self._free:
            block = self._free.pop()
        elif self._lru:
            block, _ = self._lru.popitem(last=False)
            del self._by_hash[self._hash_of.pop(block)]
            self.evictions += 1
        else:
            raise RuntimeError("KV pool exhausted: admission let a request over-commit")
        self._ref[block] = 1
        return block

    def register(self, block: int, block_hash: bytes) -> None:
        """Make a full prompt block findable by later requests (first writer wins)."""
        if block_hash not in self._by_hash and block not in self._hash_of:
            self._by_hash[block_hash] = block
            self._hash_of[block] = block_hash

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference on each block; tail blocks first, so a chain's end is evicted first."""
        for block in reversed(blocks):
            self._ref[block] -= 1
            if self._ref[block] == 0:
                del self._ref[block]
                if block in self._hash_of:
                    self._lru[block] = None
                else:
                    self._free.append(block)
