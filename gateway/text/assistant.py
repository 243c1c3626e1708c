"""An assistant turn's text, split into what clients show apart: reasoning, answer, tool calls.

Qwen models write one stream of text: an optional `<think>...</think>` block, then the
answer, in which tool calls appear as `<tool_call>...</tool_call>` blocks, in the format of
the model's family (`tool_parser` in the config; one module each in `gateway/text/formats/`):

    hermes     (Qwen3)              <tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>
    qwen3_xml  (Qwen3-Coder, 3.5+)  <tool_call><function=f><parameter=x>1</parameter></function></tool_call>

`TurnParser` turns that stream, fed as it arrives, into events (`ReasoningDelta`,
`ContentDelta`, `ToolCallStart`, `ToolCallArgs`, `ToolCallEnd`) that the chat and
Responses encoders map to their own shapes. It holds back only what could be the start
of a marker (`<tool_call>`, `</think>`), so streamed text is late by a few characters at most.
What is common to every family is here (the think block, the answer around the calls,
forced calls); a call's block, once its start marker is seen, is read by the family's parser.

A forced tool choice (`required`, or a named function) is generated under a JSON grammar:
the answer is then the arguments object itself (named) or an array of
`{"name": ..., "parameters": {...}}` (required), as vLLM's server does it. A named call
whose spec sets `forced_text` (a freeform tool: one string parameter, generated under the
tool's own grammar, if any) is that parameter's text as written: its arguments are
`{"<forced_text>": "<the text>"}`, the text JSON-escaped as it streams.

Malformed tool-call text (not JSON, an unknown function) comes back as plain content.
Streaming: a JSON call is sent when its block closes (it is checked first); an XML call
is sent parameter by parameter; a forced call when its JSON closes (one the token limit cuts
is never sent: its text is the answer, finish "length"); a freeform call token by token.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any, Literal

from gateway.text.formats import (
    CallParser,
    ReasoningFormat,
    ReasoningStart,
    ToolFormat,
    Tools,
    reasoning_format,
    tool_format,
)


def strict_json(text: str) -> str:
    """`text` as JSON every client parses. vLLM's JSON grammar lets a model write a raw control
    character (a tab) inside a string, which strict parsers (Python's json, JavaScript's
    JSON.parse) refuse: such a document is written again with the character escaped. Anything
    else is left as the model wrote it."""
    try:
        json.loads(text)
    except ValueError:
        try:
            return json.dumps(json.loads(text, strict=False), ensure_ascii=False, separators=(",", ":"))
        except ValueError:
            return text
    return text


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ContentDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    index: int  # the call's position in this turn, from 0
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class ToolCallArgs:
    index: int
    delta: str  # appended to the call's arguments (a JSON object's text once complete)


@dataclass(frozen=True, slots=True)
class ToolCallEnd:
    index: int
    arguments: str  # the whole arguments text: the concatenation of the call's deltas


Event = ReasoningDelta | ContentDelta | ToolCallStart | ToolCallArgs | ToolCallEnd


@dataclass(frozen=True, kw_only=True)
class TurnSpec:
    """How to read one request's output; built when the request is prepared."""

    # "open": the prompt opened a think block, the output starts inside it; "maybe": the
    # output is reasoning if it starts with <think>; "none": thinking is off or unknown.
    reasoning: ReasoningStart = "none"
    # The family whose think block it is (a `reasoning_parser` name): None only with reasoning "none".
    reasoning_format: str | None = "qwen3"
    tool_format: str | None = None  # the family whose calls are parsed (a `tool_parser` name); None: none are
    # The request's function tools: name -> JSON schema of the parameters.
    tools: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    forced: Literal["named", "required"] | None = None
    forced_name: str | None = None  # the function a named tool choice forces
    # A named forced call whose output is the raw text of this one string parameter (not JSON).
    forced_text: str | None = None
    parallel: bool = True  # False (parallel_tool_calls: false): a turn's first call only, as vLLM
    think_end_id: int | None = None  # the </think> token, to count reasoning tokens

    def __post_init__(self) -> None:
        if self.reasoning != "none" and self.reasoning_format is None:
            raise ValueError(f"reasoning {self.reasoning!r} needs a reasoning_format")

    @property
    def plain(self) -> bool:
        """Nothing to parse: the text is the answer."""
        return self.reasoning == "none" and self.tool_format is None and self.forced is None


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _held_suffix(text: str, *markers: str) -> int:
    """Length of the longest end of `text` that could begin one of the markers."""
    best = 0
    for marker in markers:
        for k in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:k]):
                best = k
                break
    return best


class _State(Enum):
    MAYBE = auto()  # is the output a think block? not known yet
    REASONING = auto()
    CONTENT = auto()
    CALL = auto()  # inside <tool_call>
    FORCED = auto()  # the answer is a forced call's JSON


class TurnParser:
    """One choice's output text -> events. Feed text as it arrives, then `finish()`."""

    def __init__(self, spec: TurnSpec) -> None:
        self.spec = spec
        self._tool: ToolFormat | None = None if spec.tool_format is None else tool_format(spec.tool_format)
        self._think: ReasoningFormat | None = None
        if spec.reasoning != "none" and spec.reasoning_format is not None:
            self._think = reasoning_format(spec.reasoning_format)
        self._buf = ""
        self._calls = 0
        self._args = ""  # the open call's arguments so far
        self._call: CallParser | None = None  # the family's parser of the open call
        self._ws = ""  # whitespace held back in content: dropped if a tool call follows
        self._content_started = False
        self._strip_newlines = False  # at the start of a think block or of the answer after it
        self._depth = 0  # forced "required": the JSON array's nesting while scanning
        self._in_string = False
        self._escaped = False
        self._element_start = -1
        self.reasoning_tokens = 0
        self._tentative_tokens = 0
        self._counting = spec.reasoning != "none"
        if spec.reasoning == "open":
            self._state = _State.REASONING
            self._strip_newlines = True
        elif spec.reasoning == "maybe":
            self._state = _State.MAYBE
        else:
            self._state = self._answer_state()

    @property
    def calls(self) -> int:
        return self._calls if self.spec.parallel else min(self._calls, 1)

    def _answer_state(self) -> _State:
        return _State.FORCED if self.spec.forced is not None else _State.CONTENT

    # --- feeding ---

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> list[Event]:
        self._count(token_ids)
        if self.spec.plain:
            return [ContentDelta(text)] if text else []
        self._buf += text
        out: list[Event] = []
        self._run(out, final=False)
        return self._first_call_only(out)

    def finish(self) -> list[Event]:
        """Whatever is held back, and the open call closed as well as it can be."""
        out: list[Event] = []
        if self.spec.plain:
            return out
        self._run(out, final=True)
        if self._state == _State.MAYBE:
            self._state = _State.CONTENT
            self._run(out, final=True)
        if self._state == _State.REASONING and self._buf:
            out.append(ReasoningDelta(self._buf.rstrip("\n")))
        elif self._state == _State.CALL:
            self._finish_call(out)
        elif self._state == _State.FORCED:
            self._finish_forced(out)
        elif self._state == _State.CONTENT and self._buf:
            self._content(out, self._buf, final=True)
        self._buf = ""
        return self._first_call_only(out)

    def _first_call_only(self, events: list[Event]) -> list[Event]:
        """Without parallel calls, the events of every call after the turn's first are dropped."""
        if self.spec.parallel:
            return events
        return [e for e in events if not (isinstance(e, ToolCallStart | ToolCallArgs | ToolCallEnd) and e.index > 0)]

    def _count(self, token_ids: Sequence[int]) -> None:
        """Reasoning tokens: those up to and including </think> (the engine's ids, not text)."""
        if not self._counting or not token_ids:
            return
        end = self.spec.think_end_id
        n = len(token_ids)
        if end is not None and end in token_ids:
            n = list(token_ids).index(end) + 1
            self._counting = False
        if self._state == _State.MAYBE:
            self._tentative_tokens += n
        elif self._state == _State.REASONING:
            self.reasoning_tokens += self._tentative_tokens + n
            self._tentative_tokens = 0
        else:
            self._counting = False
        if not self._counting and self._state != _State.MAYBE:
            self._tentative_tokens = 0

    def _run(self, out: list[Event], *, final: bool) -> None:
        while True:
            before = (self._state, len(self._buf))
            if self._state == _State.MAYBE:
                self._maybe(final)
            elif self._state == _State.REASONING:
                self._reasoning(out, final)
            elif self._state == _State.CONTENT:
                self._content_scan(out, final)
            elif self._state == _State.CALL:
                self._in_call(out)
            else:
                self._forced(out)
            if (self._state, len(self._buf)) == before:
                return

    def _maybe(self, final: bool) -> None:
        assert self._think is not None
        start = self._think.think_start
        head = self._buf.lstrip()
        if head.startswith(start):
            self._buf = head[len(start) :]
            self._state = _State.REASONING
            self._strip_newlines = True
            self.reasoning_tokens += self._tentative_tokens
            self._tentative_tokens = 0
        elif final or not start.startswith(head):
            self._state = self._answer_state()
            self._tentative_tokens = 0
            self._counting = False

    def _reasoning(self, out: list[Event], final: bool) -> None:
        assert self._think is not None
        think_end = self._think.think_end
        if self._strip_newlines:
            self._buf = self._buf.lstrip("\n")
            if not self._buf:
                return
            self._strip_newlines = False
        end = self._buf.find(think_end)
        # A tool call inside the think block ends it (the model skipped </think>).
        call = self._buf.find(self._tool.call_start) if self._tool is not None else -1
        if call != -1 and (end == -1 or call < end):
            if text := self._buf[:call].rstrip("\n"):
                out.append(ReasoningDelta(text))
            self._buf = self._buf[call:]
            self._state = self._answer_state()
            self._counting = False
            return
        if end != -1:
            if text := self._buf[:end].rstrip("\n"):
                out.append(ReasoningDelta(text))
            self._buf = self._buf[end + len(think_end) :]
            self._state = self._answer_state()
            self._strip_newlines = True
            return
        if final:
            return
        markers = (think_end, self._tool.call_start) if self._tool is not None else (think_end,)
        keep = _held_suffix(self._buf, *markers)
        body = self._buf[: len(self._buf) - keep]
        trailing = len(body) - len(body.rstrip("\n"))  # newlines before </think> are markup
        emit = body[: len(body) - trailing]
        if emit:
            out.append(ReasoningDelta(emit))
            self._buf = self._buf[len(emit) :]

    def _content(self, out: list[Event], text: str, *, final: bool = False) -> None:
        """Answer text; whitespace that a tool call may follow is held back."""
        if self._strip_newlines:
            text = text.lstrip("\n")
            if text:
                self._strip_newlines = False
        if self._tool is None:
            if text:
                out.append(ContentDelta(text))
            return
        text = self._ws + text
        body = text.rstrip()
        self._ws = text[len(body) :]
        if final and self._calls == 0 and self._content_started:
            body += self._ws
            self._ws = ""
        if body:
            out.append(ContentDelta(body))
            self._content_started = True

    def _content_scan(self, out: list[Event], final: bool) -> None:
        if self._tool is None:
            if self._buf:
                self._content(out, self._buf)
                self._buf = ""
            return
        call_start = self._tool.call_start
        start = self._buf.find(call_start)
        if start != -1:
            self._content(out, self._buf[:start])  # its trailing whitespace waits: the call may be malformed
            self._buf = self._buf[start + len(call_start) :]
            self._state = _State.CALL
            self._args, self._call = "", self._tool.call_parser()
            return
        keep = 0 if final else _held_suffix(self._buf, call_start)
        text = self._buf[: len(self._buf) - keep]
        if text:
            self._content(out, text, final=final)
            self._buf = self._buf[len(text) :]

    # --- tool calls in the answer: read by the family's parser, reported to a _Sink ---

    def _in_call(self, out: list[Event]) -> None:
        assert self._call is not None
        self._buf = self._call.feed(self._buf, _Sink(self, out))

    def _finish_call(self, out: list[Event]) -> None:
        """The output ended inside a call (no end marker): the family keeps it if it can."""
        assert self._call is not None
        text, self._buf = self._buf, ""
        self._call.finish(text, _Sink(self, out))

    # --- forced tool choice: the answer is JSON under a grammar ---

    def _forced(self, out: list[Event]) -> None:
        if self.spec.forced != "named":
            self._scan_required(out)
        elif self.spec.forced_text is None:
            self._scan_named(out)
        else:  # a freeform call: its text streams as the JSON string's body
            if self._calls == 0:
                if self._strip_newlines:  # right after </think>: markup, as before an answer
                    self._buf = self._buf.lstrip("\n")
                if not self._buf:
                    return
                self._start_forced(out)
            if self._buf:
                piece = json.dumps(self._buf, ensure_ascii=False)[1:-1]
                self._args += piece
                out.append(ToolCallArgs(0, piece))
                self._buf = ""

    def _start_forced(self, out: list[Event]) -> None:
        assert self.spec.forced_name is not None
        out.append(ToolCallStart(0, new_call_id(), self.spec.forced_name))
        self._calls = 1
        if self.spec.forced_text is not None:  # the text is a JSON string's body: open it
            self._args = "{" + json.dumps(self.spec.forced_text) + ': "'
            out.append(ToolCallArgs(0, self._args))

    def _brackets(self, start: int) -> Iterator[tuple[int, str]]:
        """The brackets of the JSON in `_args` from `start` on, outside strings, each with
        `_depth` already updated for it."""
        text = self._args
        for i in range(start, len(text)):
            ch = text[i]
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif ch == "\\":
                    self._escaped = True
                elif ch == '"':
                    self._in_string = False
            elif ch == '"':
                self._in_string = True
            elif ch in "[{":
                self._depth += 1
                yield i, ch
            elif ch in "]}":
                self._depth -= 1
                yield i, ch

    def _scan_named(self, out: list[Event]) -> None:
        """A named call's arguments object, held until it closes: a call the token limit cuts
        is never sent with arguments no client can parse (it ends as text, finish "length")."""
        if self._calls:  # the object has closed: the grammar lets nothing follow it
            self._buf = ""
            return
        start = len(self._args)
        self._args += self._buf
        self._buf = ""
        for i, _ in self._brackets(start):
            if self._depth == 0:
                arguments = strict_json(self._args[: i + 1].strip())
                self._start_forced(out)
                self._args = arguments
                out.append(ToolCallArgs(0, arguments))
                return

    def _scan_required(self, out: list[Event]) -> None:
        """Walk the JSON array; each element that closes becomes a call."""
        start = len(self._args)
        self._args += self._buf
        self._buf = ""
        for i, ch in self._brackets(start):
            if ch == "{" and self._depth == 2:
                self._element_start = i
            elif ch == "}" and self._depth == 1 and self._element_start >= 0:
                self._required_element(out, self._args[self._element_start : i + 1])
                self._element_start = -1

    def _required_element(self, out: list[Event], element: str) -> None:
        try:
            value = json.loads(element, strict=False)  # a raw tab in a string: see strict_json
        except ValueError:
            return
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return
        arguments = json.dumps(value.get("parameters", {}), ensure_ascii=False)
        index = self._calls
        self._calls += 1
        out += [ToolCallStart(index, new_call_id(), value["name"]), ToolCallArgs(index, arguments)]
        out.append(ToolCallEnd(index, arguments))

    def _finish_forced(self, out: list[Event]) -> None:
        if self.spec.forced == "named" and self.spec.forced_text is not None:  # a freeform call, even of no text
            if not self._calls:
                self._start_forced(out)
            self._args += '"}'
            out.append(ToolCallArgs(0, '"}'))
        if self.spec.forced == "named" and self._calls:
            out.append(ToolCallEnd(0, self._args))
        elif self._calls == 0 and self._args.strip():  # cut short before one whole call
            self._content(out, self._args, final=True)


class _Sink:
    """What a family's call parser reports, as the turn's events (see formats.CallSink)."""

    __slots__ = ("_out", "_parser")

    def __init__(self, parser: TurnParser, out: list[Event]) -> None:
        self._parser = parser
        self._out = out

    @property
    def tools(self) -> Tools:
        return self._parser.spec.tools

    def known(self, name: str) -> bool:
        tools = self._parser.spec.tools
        return not tools or name in tools

    def start(self, name: str) -> None:
        p = self._parser
        p._ws = ""  # whitespace before a call is not the answer's
        self._out.append(ToolCallStart(p._calls, new_call_id(), name))

    def args(self, piece: str) -> None:
        p = self._parser
        p._args += piece
        self._out.append(ToolCallArgs(p._calls, piece))

    def end(self) -> None:
        p = self._parser
        self._out.append(ToolCallEnd(p._calls, p._args))
        p._calls += 1
        p._state = _State.CONTENT
        p._args, p._call = "", None

    def reject(self, text: str, *, final: bool = False) -> None:
        p = self._parser
        p._state = _State.CONTENT
        p._call = None
        p._content(self._out, text, final=final)


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str


@dataclass
class Turn:
    """A whole turn, from its events (non-streaming answers, stored responses)."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    saw_reasoning: bool = False

    def apply(self, events: Iterable[Event]) -> None:
        for e in events:
            if isinstance(e, ReasoningDelta):
                self.reasoning += e.text
                self.saw_reasoning = True
            elif isinstance(e, ContentDelta):
                self.content += e.text
            elif isinstance(e, ToolCallStart):
                self.tool_calls.append(ToolCall(e.id, e.name, ""))
            elif isinstance(e, ToolCallArgs):
                self.tool_calls[e.index].arguments += e.delta
            else:
                self.tool_calls[e.index].arguments = e.arguments


def finish_reason(engine_reason: str | None, calls: int) -> str | None:
    """OpenAI's: a turn that called tools and stopped says so."""
    if calls and engine_reason == "stop":
        return "tool_calls"
    return engine_reason
