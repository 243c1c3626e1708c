"""What a model family's output format provides: tool-call markers and parsers, think markers.

A `ToolFormat` knows one family's tool-call blocks: the markers around a call, how a whole
block reads (`parse_call`), how a block in progress reads as it arrives (`call_parser`: by
default the whole block once it closes), and whether a chat template is its family's
(`detect`, for `tool_parser: auto`). A `ReasoningFormat` knows a family's think block. The
turn parser (`gateway/text/assistant.py`) does the rest, the same for every family: the
think block, the answer around the calls, forced calls.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, Protocol

ReasoningStart = Literal["none", "open", "maybe"]
Tools = Mapping[str, Mapping[str, Any]]  # a request's function tools: name -> JSON schema of the parameters


class CallSink(Protocol):
    """What a call parser reports to (the turn parser, which turns it into events)."""

    @property
    def tools(self) -> Tools: ...

    def known(self, name: str) -> bool:
        """A function the request offers (any name, when it lists none)."""
        ...

    def start(self, name: str) -> None:
        """The block is a call of this function (`ToolCallStart`)."""
        ...

    def args(self, piece: str) -> None:
        """More of the call's arguments (`ToolCallArgs`): the pieces concatenate to a JSON object."""
        ...

    def end(self) -> None:
        """The call is whole (`ToolCallEnd`); the answer goes on."""
        ...

    def reject(self, text: str, *, final: bool = False) -> None:
        """Not a call after all: `text` (from the start marker on) is answer text (`final`: the output's last)."""
        ...


class CallParser(Protocol):
    """One call in progress, fed the text after its start marker."""

    def feed(self, text: str, sink: CallSink) -> str:
        """Read what can be read of `text` (the call's unread text so far); return the unread
        rest. Ends with `sink.end()` or `sink.reject()` once the block is over."""
        ...

    def finish(self, text: str, sink: CallSink) -> None:
        """The output ended inside the call (no end marker): close it as well as it can be."""
        ...


class ToolFormat(ABC):
    """A model family's tool calls. Stateless: one instance serves every request."""

    name: ClassVar[str]  # the config's `tool_parser` value
    aliases: ClassVar[tuple[str, ...]] = ()  # other `tool_parser` values for it
    call_start: ClassVar[str] = "<tool_call>"
    call_end: ClassVar[str] = "</tool_call>"

    @abstractmethod
    def detect(self, template: str) -> bool:
        """Whether a chat template (its text) writes this family's calls (`tool_parser: auto`)."""

    @abstractmethod
    def parse_call(self, body: str, tools: Tools | None = None) -> tuple[str, str] | None:
        """A whole block's text between the markers -> (function name, arguments as a JSON
        object's text), or None when it is not a call. `tools`: the schemas, where the
        family's values are typed by them."""

    def call_parser(self) -> CallParser:
        """A parser for one call as it arrives. By default the block is read whole once it
        closes (`parse_call`), then sent at once; override to stream it."""
        return WholeCall(self)

    @abstractmethod
    def render_call(self, name: str, arguments: Mapping[str, Any]) -> str:
        """The block, markers included, that the family's model writes for this call (the tests' samples)."""


class WholeCall:
    """A call read when its block closes: checked whole, then sent in one piece."""

    def __init__(self, fmt: ToolFormat) -> None:
        self._fmt = fmt

    def feed(self, text: str, sink: CallSink) -> str:
        end = text.find(self._fmt.call_end)
        if end == -1:
            return text
        self._read(text[:end], sink, closed=True)
        return text[end + len(self._fmt.call_end) :]

    def finish(self, text: str, sink: CallSink) -> None:
        self._read(text, sink, closed=False)

    def _read(self, body: str, sink: CallSink, *, closed: bool) -> None:
        parsed = self._fmt.parse_call(body, sink.tools)
        if parsed is None or not sink.known(parsed[0]):
            sink.reject(self._fmt.call_start + body + (self._fmt.call_end if closed else ""), final=not closed)
            return
        name, arguments = parsed
        sink.start(name)
        sink.args(arguments)
        sink.end()


class _Collected:
    """A sink that keeps one call (parsing a whole block with a streaming parser)."""

    def __init__(self, tools: Tools) -> None:
        self.tools = tools
        self.name: str | None = None
        self.arguments = ""
        self.over = False

    def known(self, name: str) -> bool:
        return not self.tools or name in self.tools

    def start(self, name: str) -> None:
        self.name = name

    def args(self, piece: str) -> None:
        self.arguments += piece

    def end(self) -> None:
        self.over = True

    def reject(self, text: str, *, final: bool = False) -> None:
        self.name, self.over = None, True


def parse_streamed(fmt: ToolFormat, body: str, tools: Tools | None) -> tuple[str, str] | None:
    """A whole block read by the family's streaming parser: what the turn parser would send."""
    sink = _Collected(tools or {})
    parser = fmt.call_parser()
    rest = parser.feed(body + fmt.call_end, sink)
    if not sink.over:
        parser.finish(rest, sink)
    return None if sink.name is None else (sink.name, sink.arguments)


class ReasoningFormat(ABC):
    """A model family's think block."""

    name: ClassVar[str]  # the config's `reasoning_parser` value
    aliases: ClassVar[tuple[str, ...]] = ()
    think_start: ClassVar[str] = "<think>"
    think_end: ClassVar[str] = "</think>"

    @abstractmethod
    def detect(self, template: str) -> bool:
        """Whether a chat template (its text) is a thinking model's of this family (`reasoning_parser: auto`)."""

    @abstractmethod
    def reasoning_start(self, prompt_text: str) -> ReasoningStart:
        """Where the output starts, read off the rendered prompt: inside a think block the
        prompt opened ("open"), after one it closed or with none to come ("none"), or
        undecided, the output a think block if it starts with `think_start` ("maybe")."""

    def think_end_id(self, tokenizer: Any) -> int | None:
        """The end marker's token id (reasoning tokens are counted up to it), None when it is not one token."""
        ids = tokenizer.encode(self.think_end, add_special_tokens=False)
        return ids[0] if len(ids) == 1 else None
