"""Tool-call and reasoning formats: one module per model family, registered here.

`TOOL_FORMATS` and `REASONING_FORMATS` list the families; a config's `tool_parser` /
`reasoning_parser` names one (or `auto`: the first whose `detect` recognizes the chat
template, in the order listed, or `none`). A new family is a module with a `ToolFormat`
(or `ReasoningFormat`) subclass, and its class added to the list below: docs/tools.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from gateway.text.formats.base import (
    CallParser,
    CallSink,
    ReasoningFormat,
    ReasoningStart,
    ToolFormat,
    Tools,
    WholeCall,
)
from gateway.text.formats.hermes import Hermes
from gateway.text.formats.qwen3_think import Qwen3Think
from gateway.text.formats.qwen3_xml import Qwen3Xml

__all__ = [
    "REASONING_FORMATS",
    "REASONING_PARSERS",
    "TOOL_FORMATS",
    "TOOL_PARSERS",
    "CallParser",
    "CallSink",
    "ReasoningFormat",
    "ReasoningParser",
    "ReasoningStart",
    "ToolFormat",
    "ToolParser",
    "Tools",
    "WholeCall",
    "detect_reasoning_format",
    "detect_tool_format",
    "reasoning_format",
    "tool_format",
]

# The families, in the order `auto` asks them whether a chat template is theirs: a template
# with XML calls mentions `<tool_call>` too, so qwen3_xml comes before hermes.
TOOL_FORMATS: tuple[ToolFormat, ...] = (Qwen3Xml(), Hermes())
REASONING_FORMATS: tuple[ReasoningFormat, ...] = (Qwen3Think(),)


def _by_name(formats: Sequence[ToolFormat | ReasoningFormat]) -> dict[str, int]:
    index: dict[str, int] = {}
    for i, fmt in enumerate(formats):
        for name in (fmt.name, *fmt.aliases):
            if name in index or name in ("auto", "none"):
                raise RuntimeError(f"format name {name!r} is taken ({type(fmt).__name__})")
            index[name] = i
    return index


_TOOL_NAMES = _by_name(TOOL_FORMATS)
_REASONING_NAMES = _by_name(REASONING_FORMATS)

# The config's values (settings validate `tool_parser` / `reasoning_parser` against them).
TOOL_PARSERS: tuple[str, ...] = ("auto", *sorted(_TOOL_NAMES), "none")
REASONING_PARSERS: tuple[str, ...] = ("auto", *sorted(_REASONING_NAMES), "none")
if TYPE_CHECKING:
    ToolParser = str
    ReasoningParser = str
else:  # Literal types built from the registry: pydantic checks them (and words the error) as it did the fixed ones
    ToolParser = Literal[TOOL_PARSERS]
    ReasoningParser = Literal[REASONING_PARSERS]


def tool_format(name: str) -> ToolFormat:
    """The family a `tool_parser` name (or alias) names."""
    try:
        return TOOL_FORMATS[_TOOL_NAMES[name]]
    except KeyError:
        raise ValueError(f"unknown tool-call format {name!r} (known: {', '.join(sorted(_TOOL_NAMES))})") from None


def reasoning_format(name: str) -> ReasoningFormat:
    """The family a `reasoning_parser` name (or alias) names."""
    try:
        return REASONING_FORMATS[_REASONING_NAMES[name]]
    except KeyError:
        known = ", ".join(sorted(_REASONING_NAMES))
        raise ValueError(f"unknown reasoning format {name!r} (known: {known})") from None


def detect_tool_format(template: str) -> ToolFormat | None:
    """The first family, in registry order, whose calls the chat template's text shows."""
    return next((f for f in TOOL_FORMATS if f.detect(template)), None)


def detect_reasoning_format(template: str) -> ReasoningFormat | None:
    return next((f for f in REASONING_FORMATS if f.detect(template)), None)
