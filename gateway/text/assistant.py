"""An assistant turn's text, split into what clients show apart: reasoning, answer, tool calls.

Qwen models write one stream of text: an optional `<think>...</think>` block, then the
answer, in which tool calls appear as `<tool_call>...</tool_call>` blocks, in one of two
formats chosen per model (`tool_parser` in the config):

    hermes     (Qwen3)              <tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>
    qwen3_xml  (Qwen3-Coder, 3.5+)  <tool_call><function=f><parameter=x>1</parameter></function></tool_call>

`TurnParser` turns that stream, fed as it arrives, into events (`ReasoningDelta`,
`ContentDelta`, `ToolCallStart`, `ToolCallArgs`, `ToolCallEnd`) that the chat and
Responses encoders map to their own shapes. It holds back only what could be the start
of a marker (`<tool_call>`, `</think>`), so streamed text is late by a few characters at most.

A forced tool choice (`required`, or a named function) is generated under a JSON grammar:
the answer is then the arguments object itself (named) or an array of
`{"name": ..., "parameters": {...}}` (required), as vLLM's server does it. A named call
whose spec sets `forced_text` (a freeform tool: one string parameter, generated under the
tool's own grammar, if any) is that parameter's text as written: its arguments are
`{"<forced_text>": "<the text>"}`, the text JSON-escaped as it streams.

Malformed tool-call text (not JSON, an unknown function) comes back as plain content.
Streaming: a JSON call is sent when its block closes (it is checked first); an XML call
is sent parameter by parameter; a named forced call token by token.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any, Literal

ReasoningStart = Literal["none", "open", "maybe"]
ToolFormat = Literal["hermes", "qwen3_xml"]

THINK_START = "<think>"
THINK_END = "</think>"
CALL_START = "<tool_call>"
CALL_END = "</tool_call>"
_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>")
_PARAM_OPEN = re.compile(r"\s*<parameter=([^>\n]+)>")
_PARAM_CLOSE = "</parameter>"
_FUNCTION_CLOSE = "</function>"


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
    tool_format: ToolFormat | None = None  # None: tool calls are not parsed
    # The request's function tools: name -> JSON schema of the parameters.
    tools: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    forced: Literal["named", "required"] | None = None
    forced_name: str | None = None  # the function a named tool choice forces
    # A named forced call whose output is the raw text of this one string parameter (not JSON).
    forced_text: str | None = None
    think_end_id: int | None = None  # the </think> token, to count reasoning tokens

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


def convert_param(value: str, schema: Mapping[str, Any] | None) -> Any:
    """An XML parameter's text as the JSON value its schema's type asks for (text when unsure)."""
    types = (schema or {}).get("type")
    kinds = set(types) if isinstance(types, list) else {types}
    text = value.strip()
    if kinds & {"integer", "number"}:
        try:
            number = float(text)
        except ValueError:
            return value
        if "integer" in kinds and number.is_integer() and "." not in text and "e" not in text.lower():
            return int(text)
        return number
    if "boolean" in kinds and text.lower() in ("true", "false"):
        return text.lower() == "true"
    if "null" in kinds and text.lower() in ("null", "none"):
        return None
    if kinds & {"object", "array"}:
        try:
            return json.loads(text)
        except ValueError:
            return value
    return value


class TurnParser:
    """One choice's output text -> events. Feed text as it arrives, then `finish()`."""

    def __init__(self, spec: TurnSpec) -> None:
        self.spec = spec
        self._buf = ""
        self._calls = 0
        self._args = ""  # the open call's arguments so far
        self._call_name: str | None = None  # the open XML call's function, once known
        self._params = 0  # parameters written for the open XML call
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
        return self._calls

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
        return out

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
        return out

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
                self._call(out)
            else:
                self._forced(out)
            if (self._state, len(self._buf)) == before:
                return

    def _maybe(self, final: bool) -> None:
        head = self._buf.lstrip()
        if head.startswith(THINK_START):
            self._buf = head[len(THINK_START) :]
            self._state = _State.REASONING
            self._strip_newlines = True
            self.reasoning_tokens += self._tentative_tokens
            self._tentative_tokens = 0
        elif final or not THINK_START.startswith(head):
            self._state = self._answer_state()
            self._tentative_tokens = 0
            self._counting = False

    def _reasoning(self, out: list[Event], final: bool) -> None:
        if self._strip_newlines:
            self._buf = self._buf.lstrip("\n")
            if not self._buf:
                return
            self._strip_newlines = False
        end = self._buf.find(THINK_END)
        # A tool call inside the think block ends it (the model skipped </think>).
        call = self._buf.find(CALL_START) if self.spec.tool_format is not None else -1
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
            self._buf = self._buf[end + len(THINK_END) :]
            self._state = self._answer_state()
            self._strip_newlines = True
            return
        if final:
            return
        markers = (THINK_END, CALL_START) if self.spec.tool_format is not None else (THINK_END,)
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
        if self.spec.tool_format is None:
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
        if self.spec.tool_format is None:
            if self._buf:
                self._content(out, self._buf)
                self._buf = ""
            return
        start = self._buf.find(CALL_START)
        if start != -1:
            self._content(out, self._buf[:start])  # its trailing whitespace waits: the call may be malformed
            self._buf = self._buf[start + len(CALL_START) :]
            self._state = _State.CALL
            self._args, self._call_name, self._params = "", None, 0
            return
        keep = 0 if final else _held_suffix(self._buf, CALL_START)
        text = self._buf[: len(self._buf) - keep]
        if text:
            self._content(out, text, final=final)
            self._buf = self._buf[len(text) :]

    # --- tool calls in the answer ---

    def _known(self, name: str) -> bool:
        return not self.spec.tools or name in self.spec.tools

    def _call(self, out: list[Event]) -> None:
        if self.spec.tool_format == "qwen3_xml":
            self._xml_call(out)
            return
        end = self._buf.find(CALL_END)
        if end == -1:
            return
        body = self._buf[:end]
        self._buf = self._buf[end + len(CALL_END) :]
        self._state = _State.CONTENT
        self._json_call(out, body)

    def _json_call(self, out: list[Event], body: str) -> None:
        parsed = _parse_json_call(body)
        if parsed is None or not self._known(parsed[0]):
            self._content(out, CALL_START + body + CALL_END)
            return
        name, arguments = parsed
        self._ws = ""
        index = self._calls
        self._calls += 1
        out += [ToolCallStart(index, new_call_id(), name), ToolCallArgs(index, arguments)]
        out.append(ToolCallEnd(index, arguments))

    def _xml_call(self, out: list[Event]) -> None:
        if self._call_name is None:
            m = _FUNCTION.match(self._buf)
            if m is None:
                stripped = self._buf.lstrip()
                closed = CALL_END in self._buf
                if closed or (stripped and not "<function=".startswith(stripped[:10]) and ">" in stripped):
                    self._malformed_xml(out)
                return
            name = m.group(1).strip()
            if not self._known(name):
                self._malformed_xml(out)
                return
            self._call_name = name
            self._ws = ""
            self._buf = self._buf[m.end() :]
            out.append(ToolCallStart(self._calls, new_call_id(), name))
        while True:
            m = _PARAM_OPEN.match(self._buf)
            if m is None:
                break
            close = self._buf.find(_PARAM_CLOSE, m.end())
            if close == -1:
                return
            self._add_param(out, m.group(1).strip(), self._buf[m.end() : close])
            self._buf = self._buf[close + len(_PARAM_CLOSE) :]
        head = self._buf.lstrip()
        for closer in (_FUNCTION_CLOSE, CALL_END):
            if head.startswith(closer):
                self._buf = head[len(closer) :]
                if closer == CALL_END:
                    self._close_xml_call(out)
                return

    def _add_param(self, out: list[Event], name: str, raw: str) -> None:
        value = raw[1:] if raw.startswith("\n") else raw
        value = value[:-1] if value.endswith("\n") else value
        assert self._call_name is not None
        props = (self.spec.tools.get(self._call_name) or {}).get("properties") or {}
        converted = convert_param(value, props.get(name))
        pair = json.dumps(name) + ": " + json.dumps(converted, ensure_ascii=False)
        piece = ("{" if self._params == 0 else ", ") + pair
        self._params += 1
        self._args += piece
        out.append(ToolCallArgs(self._calls, piece))

    def _close_xml_call(self, out: list[Event]) -> None:
        piece = "{}" if self._params == 0 else "}"
        self._args += piece
        out += [ToolCallArgs(self._calls, piece), ToolCallEnd(self._calls, self._args)]
        self._calls += 1
        self._state = _State.CONTENT
        self._args, self._call_name, self._params = "", None, 0

    def _malformed_xml(self, out: list[Event]) -> None:
        end = self._buf.find(CALL_END)
        body = self._buf if end == -1 else self._buf[: end + len(CALL_END)]
        self._buf = "" if end == -1 else self._buf[end + len(CALL_END) :]
        self._state = _State.CONTENT
        self._content(out, CALL_START + body)

    def _finish_call(self, out: list[Event]) -> None:
        """The output ended inside a call (no </tool_call>): keep it if it is whole."""
        if self.spec.tool_format == "qwen3_xml":
            if self._call_name is None:
                self._malformed_xml(out)
                return
            self._close_xml_call(out)
            return
        body, self._buf = self._buf, ""
        self._state = _State.CONTENT
        parsed = _parse_json_call(body)
        if parsed is None or not self._known(parsed[0]):
            self._content(out, CALL_START + body, final=True)
            return
        self._json_call(out, body)

    # --- forced tool choice: the answer is JSON under a grammar ---

    def _forced(self, out: list[Event]) -> None:
        if self.spec.forced == "named":
            text = self.spec.forced_text
            if self._calls == 0:
                if text is None:
                    self._buf = self._buf.lstrip()
                elif self._strip_newlines:  # right after </think>: markup, as before an answer
                    self._buf = self._buf.lstrip("\n")
                if not self._buf:
                    return
                self._start_forced(out)
            if self._buf:
                piece = self._buf if text is None else json.dumps(self._buf, ensure_ascii=False)[1:-1]
                self._args += piece
                out.append(ToolCallArgs(0, piece))
                self._buf = ""
            return
        self._scan_required(out)

    def _start_forced(self, out: list[Event]) -> None:
        assert self.spec.forced_name is not None
        out.append(ToolCallStart(0, new_call_id(), self.spec.forced_name))
        self._calls = 1
        if self.spec.forced_text is not None:  # the text is a JSON string's body: open it
            self._args = "{" + json.dumps(self.spec.forced_text) + ': "'
            out.append(ToolCallArgs(0, self._args))

    def _scan_required(self, out: list[Event]) -> None:
        """Walk the JSON array; each element that closes becomes a call."""
        i = len(self._args)
        self._args += self._buf
        self._buf = ""
        text = self._args
        while i < len(text):
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
                if self._depth == 1 and ch == "{":
                    self._element_start = i
                self._depth += 1
            elif ch in "]}":
                self._depth -= 1
                if self._depth == 1 and ch == "}" and self._element_start >= 0:
                    self._required_element(out, text[self._element_start : i + 1])
                    self._element_start = -1
            i += 1

    def _required_element(self, out: list[Event], element: str) -> None:
        try:
            value = json.loads(element)
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
        if self.spec.forced == "named":
            if self.spec.forced_text is not None:  # a freeform call, even of no text
                if not self._calls:
                    self._start_forced(out)
                self._args += '"}'
                out.append(ToolCallArgs(0, '"}'))
            if self._calls:
                out.append(ToolCallEnd(0, self._args))
            return
        if self._calls == 0 and self._args.strip():  # cut short before one whole call
            self._content(out, self._args, final=True)


def _parse_json_call(body: str) -> tuple[str, str] | None:
    """(name, arguments JSON) of a Qwen3 JSON call, or None when it is not one."""
    try:
        value = json.loads(body.strip())
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    args = value.get("arguments", value.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return value["name"], json.dumps(args, ensure_ascii=False)


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
