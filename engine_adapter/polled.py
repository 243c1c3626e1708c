"""What the engines in another process share (`remote.py`, `vllm_server.py`): reached over
HTTP, their stats and health polled in the background, the model's tokenizer loaded here."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Sized
from typing import Any

import httpx

from engine_adapter.base import IDLE_STATS, EngineRequest, EngineStats, EngineUnavailable, KVSpec


class PolledEngine:
    """The facts side of an engine elsewhere. A subclass sets `_spec` when it has the KV
    spec, keeps `_stats` and `_healthy` current from its poll, and `_streams` its open
    streams (set before this `__init__` runs)."""

    name: str
    _streams: Sized

    def __init__(self, name: str) -> None:
        self.name = name
        self._client: httpx.AsyncClient | None = None
        self._tokenizer: Any = None
        self._spec: KVSpec | None = None
        self._stats = IDLE_STATS
        self._healthy = False
        self._poller: asyncio.Task[None] | None = None

    async def _stop_polling(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None

    @property
    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            raise EngineUnavailable(f"engine {self.name} is not started")
        return self._client

    @property
    def kv_spec(self) -> KVSpec:
        if self._spec is None:
            raise EngineUnavailable(f"engine {self.name} is not started")
        return self._spec

    @property
    def max_model_len(self) -> int:
        return self.kv_spec.max_model_len

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            raise EngineUnavailable(f"engine {self.name} is not started")
        return self._tokenizer

    def check(self, request: EngineRequest) -> None:
        """The engine in the other process checks the request as it starts it; its refusal
        comes back as that request's error."""

    def clock(self) -> float:
        # The gateway's clock: latency as clients see it includes the hop to the other process.
        return time.monotonic()

    @property
    def is_healthy(self) -> bool:
        return self._client is not None and self._healthy

    def stats(self) -> EngineStats:
        """The engine's numbers as of the last poll (every client's requests), with this
        gateway's own open streams as `unfinished`."""
        return dataclasses.replace(self._stats, unfinished=len(self._streams))
