"""An engine that streams no faster than a set pace: any engine, slowed deterministically.

Tests and demos that need one engine slower than another (a router that must learn it,
requests that must still be running a while later) cannot rely on model size: the same
tiny model decodes at 8 ms per token on one machine and 30 on another. Pacing makes
"slow" a configured fact: each chunk waits `token_s` per output token it carries before
it is delivered, so its consumer sees at least that time per token, on any machine.
The engine itself runs at its own speed; only delivery is held back.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from engine_adapter.base import DelegatingEngine, Engine, EngineChunk, EngineRequest


class PacedEngine(DelegatingEngine):
    """Delegates everything to `inner`, delivering its chunks at most one token per `token_s`."""

    def __init__(self, inner: Engine, token_s: float) -> None:
        super().__init__(inner)
        self.token_s = token_s

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        stream = self.inner.generate(request)
        try:
            async for chunk in stream:
                tokens = max((len(c.token_ids) for c in chunk.choices), default=0)
                if tokens:
                    await asyncio.sleep(self.token_s * tokens)
                yield chunk
        finally:
            await stream.aclose()  # type: ignore[attr-defined]  # aborts the request if unfinished


def paced(engine: Engine, token_s: float) -> Engine:
    """`engine` itself when `token_s` is 0, else paced at `token_s` per output token."""
    return PacedEngine(engine, token_s) if token_s > 0 else engine
