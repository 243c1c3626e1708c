"""gateway/http/blocks.py: the one-open-block machine both Messages and Responses build on."""

from __future__ import annotations

from typing import Any

from gateway.http.blocks import Block, OneOpen, TextKind
from gateway.text.assistant import ContentDelta, ReasoningDelta, ToolCallArgs, ToolCallEnd, ToolCallStart


class Recorder(OneOpen[Block]):
    """Each step as a tuple: what a surface is asked to send, in order."""

    def _start_text(self, kind: TextKind, index: int, out: list[dict[str, Any]]) -> Block:
        out.append({"start": kind, "index": index})
        return Block(kind, index)

    def _text_delta(self, block: Block, text: str, out: list[dict[str, Any]]) -> None:
        out.append({"delta": text, "index": block.index})

    def _start_call(self, e: ToolCallStart, index: int, out: list[dict[str, Any]]) -> Block:
        out.append({"start": e.name, "index": index})
        return Block("call", index)

    def _call_delta(self, block: Block, delta: str, out: list[dict[str, Any]]) -> None:
        out.append({"args": delta, "index": block.index})

    def _stop(self, block: Block, status: str, out: list[dict[str, Any]]) -> dict[str, Any]:
        out.append({"stop": block.index, "status": status})
        return {"kind": block.kind, "text": block.text}


def test_one_block_open_at_a_time() -> None:
    r = Recorder()
    events = [
        ToolCallArgs(0, "{}"),  # no call open: dropped
        ReasoningDelta("hm"),
        ReasoningDelta(""),  # empty text opens nothing
        ReasoningDelta("m"),
        ContentDelta("Hi"),  # another kind closes the reasoning
        ToolCallStart(0, "call_1", "a"),
        ToolCallArgs(0, '{"x"'),
        ToolCallArgs(0, ""),
        ToolCallEnd(0, '{"x": 1}'),  # the whole arguments replace the pieces
        ToolCallEnd(0, "{}"),  # no call open: dropped
        ContentDelta("ok"),
    ]
    assert r.apply(events) == [
        {"start": "reasoning", "index": 0},
        {"delta": "hm", "index": 0},
        {"delta": "m", "index": 0},
        {"stop": 0, "status": "completed"},
        {"start": "content", "index": 1},
        {"delta": "Hi", "index": 1},
        {"stop": 1, "status": "completed"},
        {"start": "a", "index": 2},
        {"args": '{"x"', "index": 2},
        {"stop": 2, "status": "completed"},
        {"start": "content", "index": 3},
        {"delta": "ok", "index": 3},
    ]
    assert r.close("incomplete") == [{"stop": 3, "status": "incomplete"}]
    assert r.close() == []
    assert r.closed == [
        {"kind": "reasoning", "text": "hmm"},
        {"kind": "content", "text": "Hi"},
        {"kind": "call", "text": '{"x": 1}'},
        {"kind": "content", "text": "ok"},
    ]


def test_a_new_call_closes_the_one_before() -> None:
    r = Recorder()
    out = r.apply([ToolCallStart(0, "call_1", "a"), ToolCallArgs(0, "{"), ToolCallStart(1, "call_2", "b")])
    assert out[-2:] == [{"stop": 0, "status": "completed"}, {"start": "b", "index": 1}]
    assert r.closed == [{"kind": "call", "text": "{"}]
