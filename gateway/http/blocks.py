"""A turn's parsed output as blocks, one open at a time: what Messages' content blocks and
Responses' output items share (gateway/http/anthropic/output.py, gateway/http/responses/output.py).

The `TurnParser`'s events (gateway/text/assistant.py) become blocks of three kinds:

    ReasoningDelta  -> a `reasoning` block (text of one kind runs on in the open block)
    ContentDelta    -> a `content` block
    ToolCallStart   -> a `call` block; ToolCallArgs its arguments; ToolCallEnd closes it

A block of another kind, or a new call, closes the open one; `close` closes the last. Both
surfaces stream a block as it grows (start, deltas, stop) and keep the closed ones for the
whole answer: the order of the block's events is the same, only their shapes differ. So the
state machine is here, once, and a surface says what each step sends (`_start_text`,
`_text_delta`, `_start_call`, `_call_delta`, `_stop`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from gateway.text.assistant import ContentDelta, Event, ReasoningDelta, ToolCallArgs, ToolCallStart

Kind = Literal["reasoning", "content", "call"]
TextKind = Literal["reasoning", "content"]


@dataclass
class Block:
    kind: Kind
    index: int  # its place among the blocks: the number closed before it opened
    text: str = ""  # a reasoning's or content's text, a call's arguments


B = TypeVar("B", bound=Block)


class OneOpen(ABC, Generic[B]):
    """Parser events -> blocks (`closed`, each as the surface's body of it) and the stream
    events that build them (returned by `apply` and `close`)."""

    def __init__(self) -> None:
        self.closed: list[dict[str, Any]] = []
        self._open: B | None = None

    def apply(self, events: Iterable[Event]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for e in events:
            if isinstance(e, ReasoningDelta | ContentDelta):
                if not e.text:
                    continue
                kind: TextKind = "reasoning" if isinstance(e, ReasoningDelta) else "content"
                block = self._open
                if block is None or block.kind != kind:
                    self._close(out)
                    block = self._open = self._start_text(kind, len(self.closed), out)
                block.text += e.text
                self._text_delta(block, e.text, out)
            elif isinstance(e, ToolCallStart):
                self._close(out)
                self._open = self._start_call(e, len(self.closed), out)
            elif isinstance(e, ToolCallArgs):
                block = self._open
                if block is None or block.kind != "call" or not e.delta:
                    continue
                block.text += e.delta
                self._call_delta(block, e.delta, out)
            elif self._open is not None and self._open.kind == "call":  # ToolCallEnd
                self._open.text = e.arguments
                self._close(out)
        return out

    def close(self, status: str = "completed") -> list[dict[str, Any]]:
        """Close the open block, if any. `status` is how it ended, for a surface that says so
        (Responses: `incomplete` when the output was cut short); one closed by the next block
        or its call's end is `completed`."""
        out: list[dict[str, Any]] = []
        self._close(out, status)
        return out

    def _close(self, out: list[dict[str, Any]], status: str = "completed") -> None:
        block, self._open = self._open, None
        if block is not None:
            self.closed.append(self._stop(block, status, out))

    @abstractmethod
    def _start_text(self, kind: TextKind, index: int, out: list[dict[str, Any]]) -> B:
        """Open a reasoning or content block at `index`; add its start events to `out`."""

    @abstractmethod
    def _text_delta(self, block: B, text: str, out: list[dict[str, Any]]) -> None:
        """`text` was added to the open text block (`block.text` has it already)."""

    @abstractmethod
    def _start_call(self, e: ToolCallStart, index: int, out: list[dict[str, Any]]) -> B:
        """Open a call's block at `index`; add its start events to `out`."""

    @abstractmethod
    def _call_delta(self, block: B, delta: str, out: list[dict[str, Any]]) -> None:
        """`delta` was added to the open call's arguments (`block.text` has it already)."""

    @abstractmethod
    def _stop(self, block: B, status: str, out: list[dict[str, Any]]) -> dict[str, Any]:
        """Add a closing block's stop events to `out`; return its body, kept in `closed`."""
