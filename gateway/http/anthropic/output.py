"""A job's engine output as an Anthropic Messages answer: one message object, or the
server-sent events the official SDKs parse.

The output is read with the job's `TurnParser` (gateway/text/assistant.py); its events
become content blocks, one open at a time:

    ReasoningDelta  -> a `thinking` block (its text left out under `display: omitted`)
    ContentDelta    -> a `text` block
    ToolCallStart   -> a `tool_use` block; ToolCallArgs its input, ToolCallEnd closes it

Streamed: `message_start` (once the engine has the prompt: its usage says what the prefix
cache held), `ping`, then per block `content_block_start`, deltas (`text_delta`,
`thinking_delta` then a `signature_delta`, `input_json_delta`), `content_block_stop`; then
`message_delta` with the stop reason and the usage, and `message_stop`. An error after the
stream started is an `error` event.

stop_reason: `max_tokens` at the token limit (a tool call cut there too), `tool_use` when the
turn called a tool, `stop_sequence` (naming it) at a stop sequence, else `end_turn`. Usage: `input_tokens` are
the prompt tokens neither read from the prefix cache (`cache_read_input_tokens`) nor newly
written to it in whole blocks (`cache_creation_input_tokens`); the three add up to the prompt
the quota is charged for, which `count_tokens` returns.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from engine_adapter.base import EngineChunk
from gateway.http.sse import sse
from gateway.http.tally import Tally
from gateway.job import Job
from gateway.text.assistant import ContentDelta, Event, ReasoningDelta, ToolCallArgs, ToolCallStart, TurnParser

log = logging.getLogger(__name__)

BlockKind = Literal["text", "thinking", "tool_use"]
SIGNATURE = ""  # thinking is not signed here: a client sends it back as it got it


@dataclass
class _Block:
    kind: BlockKind
    index: int
    text: str = ""  # a text's or thinking's text, a tool_use's input JSON
    id: str = ""
    name: str = ""

    def body(self, *, shown: bool = True) -> dict[str, Any]:
        if self.kind == "text":
            return {"type": "text", "text": self.text}
        if self.kind == "thinking":
            return {"type": "thinking", "thinking": self.text if shown else "", "signature": SIGNATURE}
        try:
            call_input = json.loads(self.text) if self.text else {}
        except ValueError:  # a call cut short by the token limit
            call_input = {}
        return {"type": "tool_use", "id": self.id, "name": self.name, "input": call_input}


class Blocks:
    """Parser events -> content blocks (`content`, closed ones) and the stream events that
    build them (returned by `apply` and `close`)."""

    def __init__(self, *, thinking_shown: bool) -> None:
        self.content: list[dict[str, Any]] = []
        self.shown = thinking_shown
        self.tool_calls = 0
        self._open: _Block | None = None

    def apply(self, events: Iterable[Event]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for e in events:
            if isinstance(e, ReasoningDelta | ContentDelta):
                if not e.text:
                    continue
                kind: BlockKind = "thinking" if isinstance(e, ReasoningDelta) else "text"
                block = self._text_block(kind, out)
                block.text += e.text
                if kind == "text":
                    delta = {"type": "text_delta", "text": e.text}
                elif self.shown:
                    delta = {"type": "thinking_delta", "thinking": e.text}
                else:
                    continue
                out.append({"type": "content_block_delta", "index": block.index, "delta": delta})
            elif isinstance(e, ToolCallStart):
                self._close(out)
                self.tool_calls += 1
                block = self._open = _Block("tool_use", len(self.content), id=_tool_use_id(e.id), name=e.name)
                start = {"type": "tool_use", "id": block.id, "name": block.name, "input": {}}
                out.append({"type": "content_block_start", "index": block.index, "content_block": start})
            elif isinstance(e, ToolCallArgs):
                if self._open is None or self._open.kind != "tool_use" or not e.delta:
                    continue
                self._open.text += e.delta
                delta = {"type": "input_json_delta", "partial_json": e.delta}
                out.append({"type": "content_block_delta", "index": self._open.index, "delta": delta})
            elif self._open is not None and self._open.kind == "tool_use":  # ToolCallEnd
                self._open.text = e.arguments
                self._close(out)
        return out

    def close(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        self._close(out)
        return out

    def _text_block(self, kind: BlockKind, out: list[dict[str, Any]]) -> _Block:
        if self._open is not None and self._open.kind == kind:
            return self._open
        self._close(out)
        block = self._open = _Block(kind, len(self.content))
        start = (
            {"type": "text", "text": ""} if kind == "text" else {"type": "thinking", "thinking": "", "signature": ""}
        )
        out.append({"type": "content_block_start", "index": block.index, "content_block": start})
        return block

    def _close(self, out: list[dict[str, Any]]) -> None:
        block, self._open = self._open, None
        if block is None:
            return
        if block.kind == "thinking":
            delta = {"type": "signature_delta", "signature": SIGNATURE}
            out.append({"type": "content_block_delta", "index": block.index, "delta": delta})
        out.append({"type": "content_block_stop", "index": block.index})
        self.content.append(block.body(shown=self.shown))


def _tool_use_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def _usage(tally: Tally) -> dict[str, Any]:
    return {
        "input_tokens": tally.prompt_tokens - tally.cached_tokens - tally.written_tokens,
        "cache_creation_input_tokens": tally.written_tokens,
        "cache_read_input_tokens": tally.cached_tokens,
        "output_tokens": tally.output_tokens,
    }


def _stop(tally: Tally, tool_calls: int) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence). A tool call cut by the token limit is `max_tokens`, as
    Anthropic's API says it: its input is incomplete, and a client retries with more tokens."""
    if tally.finish_reason == "length":
        return "max_tokens", None
    if tool_calls:
        return "tool_use", None
    if isinstance(tally.stop_reason, str):
        return "stop_sequence", tally.stop_reason
    return "end_turn", None


@dataclass
class MessageEncoder:
    """One request's encoders (`complete`, `stream`: the `Surface` gateway.http.serving takes)."""

    model: str  # the model name the client asked for (Anthropic echoes it)
    thinking_shown: bool = True

    def _message(self, job: Job, content: list[dict[str, Any]], usage: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": "msg_" + job.id.removeprefix("chatcmpl-")[:24],
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage,
        }

    async def complete(self, job: Job, chunks: AsyncIterator[tuple[int, EngineChunk]]) -> dict[str, Any]:
        tally, blocks, parser = Tally.of(job), Blocks(thinking_shown=self.thinking_shown), TurnParser(job.turn)
        async for _, chunk in chunks:
            tally.observe(chunk)
            for c in chunk.choices:
                blocks.apply(parser.feed(c.text, c.token_ids))
        blocks.apply(parser.finish())
        blocks.close()
        job.meter.reasoning_tokens = parser.reasoning_tokens
        body = self._message(job, blocks.content, _usage(tally))
        body["stop_reason"], body["stop_sequence"] = _stop(tally, blocks.tool_calls)
        return body

    async def stream(self, job: Job, chunks: AsyncIterator[tuple[int, EngineChunk]]) -> AsyncIterator[str]:
        tally, blocks, parser = Tally.of(job), Blocks(thinking_shown=self.thinking_shown), TurnParser(job.turn)
        started = False
        async for _, chunk in chunks:
            tally.observe(chunk)
            lines = []
            if not started:
                started = True
                opening = self._message(job, [], _usage(tally) | {"output_tokens": 0})
                lines += [
                    sse({"type": "message_start", "message": opening}, named=True),
                    sse({"type": "ping"}, named=True),
                ]
            for c in chunk.choices:
                lines += [sse(e, named=True) for e in blocks.apply(parser.feed(c.text, c.token_ids))]
            if lines:
                yield "".join(lines)
        job.meter.reasoning_tokens = parser.reasoning_tokens
        tail = [sse(e, named=True) for e in [*blocks.apply(parser.finish()), *blocks.close()]]
        stop_reason, stop_sequence = _stop(tally, blocks.tool_calls)
        delta = {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
        tail.append(sse({"type": "message_delta", "delta": delta, "usage": _usage(tally)}, named=True))
        tail.append(sse({"type": "message_stop"}, named=True))
        yield "".join(tail)
