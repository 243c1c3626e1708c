"""A job's engine output as an Anthropic Messages answer: one message object, or the
server-sent events the official SDKs parse.

The output is read with the job's `TurnParser` (gateway/text/assistant.py); its events
become content blocks, one open at a time (the state machine Responses shares,
gateway/http/blocks.py):

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
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from engine_adapter.base import EngineChunk
from gateway.http.blocks import Block, OneOpen, TextKind
from gateway.http.sse import sse
from gateway.http.tally import Tally
from gateway.job import Job
from gateway.text.assistant import ToolCallStart, TurnParser

SIGNATURE = ""  # thinking is not signed here: a client sends it back as it got it


@dataclass
class _Block(Block):
    id: str = ""
    name: str = ""

    def body(self, *, shown: bool = True) -> dict[str, Any]:
        if self.kind == "content":
            return {"type": "text", "text": self.text}
        if self.kind == "reasoning":
            return {"type": "thinking", "thinking": self.text if shown else "", "signature": SIGNATURE}
        try:
            call_input = json.loads(self.text) if self.text else {}
        except ValueError:  # a call cut short by the token limit
            call_input = {}
        return {"type": "tool_use", "id": self.id, "name": self.name, "input": call_input}


class Blocks(OneOpen[_Block]):
    """Parser events -> content blocks (`content`, closed ones) and the stream events that
    build them (returned by `apply` and `close`): `thinking`, `text` and `tool_use` blocks."""

    def __init__(self, *, thinking_shown: bool) -> None:
        super().__init__()
        self.shown = thinking_shown
        self.tool_calls = 0

    @property
    def content(self) -> list[dict[str, Any]]:
        return self.closed

    def _start_text(self, kind: TextKind, index: int, out: list[dict[str, Any]]) -> _Block:
        start = (
            {"type": "text", "text": ""} if kind == "content" else {"type": "thinking", "thinking": "", "signature": ""}
        )
        out.append({"type": "content_block_start", "index": index, "content_block": start})
        return _Block(kind, index)

    def _text_delta(self, block: _Block, text: str, out: list[dict[str, Any]]) -> None:
        if block.kind == "content":
            delta = {"type": "text_delta", "text": text}
        elif self.shown:
            delta = {"type": "thinking_delta", "thinking": text}
        else:
            return
        out.append({"type": "content_block_delta", "index": block.index, "delta": delta})

    def _start_call(self, e: ToolCallStart, index: int, out: list[dict[str, Any]]) -> _Block:
        self.tool_calls += 1
        block = _Block("call", index, id=_tool_use_id(e.id), name=e.name)
        start = {"type": "tool_use", "id": block.id, "name": block.name, "input": {}}
        out.append({"type": "content_block_start", "index": index, "content_block": start})
        return block

    def _call_delta(self, block: _Block, delta: str, out: list[dict[str, Any]]) -> None:
        json_delta = {"type": "input_json_delta", "partial_json": delta}
        out.append({"type": "content_block_delta", "index": block.index, "delta": json_delta})

    def _stop(self, block: _Block, status: str, out: list[dict[str, Any]]) -> dict[str, Any]:
        if block.kind == "reasoning":
            delta = {"type": "signature_delta", "signature": SIGNATURE}
            out.append({"type": "content_block_delta", "index": block.index, "delta": delta})
        out.append({"type": "content_block_stop", "index": block.index})
        return block.body(shown=self.shown)


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
    """One request's encoders (`complete`, `stream`: the `Encoder` gateway.http.serving takes)."""

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
