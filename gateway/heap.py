"""The start-up heap, kept out of the garbage collector's full passes while serving.

A gateway process holds torch, transformers, vLLM and the tokenizers: millions of objects
that live as long as it does. Each full (oldest-generation) collection walks all of them,
a stall of the event loop of a sizeable fraction of a second on 2 cores, and the passes over
the younger generations grow with the heap too (BENCHMARKS.md). vLLM's own server freezes
its start-up heap for the same reason (`vllm.utils.gc_utils.freeze_gc_heap`).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)


@contextmanager
def frozen() -> Iterator[int]:
    """Freeze every object alive now for the block's length (yields how many); unfreeze after,
    so that what the block's end leaves unreachable (a test's server, in a test process) can
    still be collected."""
    gc.collect()  # only live objects are frozen: garbage now would never be collected
    gc.freeze()
    count = gc.get_freeze_count()
    log.info("start-up heap frozen: %d objects left out of garbage collection", count)
    try:
        yield count
    finally:
        gc.unfreeze()
