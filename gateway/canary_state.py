"""What the canary found (gateway/canary.py runs it): each model's latest result and its
verdict, read by /ready, /metrics, the dashboard and routing."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["ok", "degraded", "skipped", "error"]


@dataclass(frozen=True, slots=True)
class Answer:
    """What one canary request got: its parsed tool calls (or text) and cached tokens."""

    calls: tuple[tuple[str, Any], ...]  # (name, arguments parsed as JSON where they parse)
    content: str
    cached_tokens: int
    prompt_tokens: int

    def view(self) -> dict[str, Any]:
        calls = [{"name": n, "arguments": a} for n, a in self.calls]
        return {"tool_calls": calls, "content": self.content, "cached_tokens": self.cached_tokens}


@dataclass(frozen=True, slots=True)
class Result:
    model: str
    status: Status
    reason: str
    at: float  # time.time() when it ended
    cold: Answer | None = None
    cached: Answer | None = None

    def view(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status, "reason": self.reason, "at": round(self.at, 3)}
        if self.cold is not None:
            out["cold"] = self.cold.view()
        if self.cached is not None:
            out["cached"] = self.cached.view()
        return out


@dataclass
class Book:
    """The latest result per model, and how many runs ended how (for /metrics)."""

    results: dict[str, Result] = field(default_factory=dict)
    runs: Counter[tuple[str, str]] = field(default_factory=Counter)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one canary run at a time

    # The last verdict (ok or degraded) per model: a run that could not finish (an error)
    # leaves a degraded model degraded.
    verdicts: dict[str, Result] = field(default_factory=dict)

    def record(self, result: Result) -> None:
        self.results[result.model] = result
        self.runs[result.model, result.status] += 1
        if result.status in ("ok", "degraded"):
            self.verdicts[result.model] = result

    def degraded(self) -> frozenset[str]:
        return frozenset(n for n, v in self.verdicts.items() if v.status == "degraded")

    def view(self, model: str) -> dict[str, Any] | None:
        r = self.results.get(model)
        if r is None:
            return None
        return r.view() | {"degraded": model in self.degraded()}
