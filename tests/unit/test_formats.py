"""gateway/text/formats: the registry of tool-call and reasoning families, and what each provides.

Every test here runs over every registered family, so a new family's module is checked by
adding its class to the registry (the parser's chunk-size tests in test_assistant.py too).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.settings import ModelSettings
from gateway.text.formats import (
    REASONING_FORMATS,
    REASONING_PARSERS,
    TOOL_FORMATS,
    TOOL_PARSERS,
    ReasoningFormat,
    ToolFormat,
    detect_reasoning_format,
    detect_tool_format,
    reasoning_format,
    tool_format,
)
from gateway.text.formats.hermes import Hermes
from gateway.text.formats.qwen3_think import Qwen3Think
from gateway.text.formats.qwen3_xml import Qwen3Xml

EACH_FORMAT = pytest.mark.parametrize("fmt", TOOL_FORMATS, ids=lambda f: f.name)
EACH_THINK = pytest.mark.parametrize("think", REASONING_FORMATS, ids=lambda f: f.name)
# Typed, as families whose values are text (XML) convert them by the schema.
PARAMS = {"s": {"type": "string"}, "n": {"type": "integer"}, "on": {"type": "boolean"}, "o": {"type": "object"}}
TOOLS = {"f": {"type": "object", "properties": PARAMS}}
ARGS: dict[str, Any] = {"s": 'a "quoted" <b>text</b> ✓', "n": 3, "on": False, "o": {"k": [1, None]}}


def test_the_registry_holds_the_qwen_families() -> None:
    kinds = [type(f) for f in TOOL_FORMATS]
    assert kinds.index(Qwen3Xml) < kinds.index(Hermes)  # `auto` asks XML first: its templates mention <tool_call>
    assert Qwen3Think in [type(f) for f in REASONING_FORMATS]
    assert TOOL_PARSERS[0] == REASONING_PARSERS[0] == "auto" and TOOL_PARSERS[-1] == REASONING_PARSERS[-1] == "none"
    assert {"hermes", "qwen3_xml"} <= set(TOOL_PARSERS) and "qwen3" in REASONING_PARSERS


@EACH_FORMAT
def test_a_tool_format_is_found_by_each_of_its_names(fmt: ToolFormat) -> None:
    for name in (fmt.name, *fmt.aliases):
        assert tool_format(name) is fmt and name in TOOL_PARSERS
        assert ModelSettings(name="m", path="p", tool_parser=name).tool_parser == name


@EACH_THINK
def test_a_reasoning_format_is_found_by_each_of_its_names(think: ReasoningFormat) -> None:
    for name in (think.name, *think.aliases):
        assert reasoning_format(name) is think and name in REASONING_PARSERS
        assert ModelSettings(name="m", path="p", reasoning_parser=name).reasoning_parser == name


def test_an_unknown_name_is_refused() -> None:
    known = ", ".join(TOOL_PARSERS[1:-1])
    with pytest.raises(ValueError, match=re.escape(f"unknown tool-call format 'xml' (known: {known})")):
        tool_format("xml")
    known = ", ".join(REASONING_PARSERS[1:-1])
    with pytest.raises(ValueError, match=re.escape(f"unknown reasoning format 'deepseek_r1' (known: {known})")):
        reasoning_format("deepseek_r1")
    # In the config: pydantic's own message, listing what the registry holds.
    for field, values in (("tool_parser", TOOL_PARSERS), ("reasoning_parser", REASONING_PARSERS)):
        listed = ", ".join(repr(v) for v in values[:-1]) + f" or {values[-1]!r}"
        with pytest.raises(ValidationError, match=re.escape(f"Input should be {listed}")):
            ModelSettings(name="m", path="p", **{field: "deepseek_r1"})


@EACH_FORMAT
def test_a_template_that_writes_a_familys_calls_is_recognized_as_its(fmt: ToolFormat) -> None:
    """`auto` asks in registry order: a family listed earlier must not claim a later one's template."""
    assert detect_tool_format("{% for t in tools %}" + fmt.render_call("f", ARGS) + "{% endfor %}") is fmt
    assert detect_tool_format("<|im_start|>{{ content }}<|im_end|>") is None


@EACH_THINK
def test_a_thinking_template_is_recognized(think: ReasoningFormat) -> None:
    assert detect_reasoning_format(f"{{{{ '{think.think_start}' }}}}") is think
    assert detect_reasoning_format("<|im_start|>{{ content }}<|im_end|>") is None


@EACH_FORMAT
def test_a_whole_call_reads_back_as_written(fmt: ToolFormat) -> None:
    block = fmt.render_call("f", ARGS)
    assert block.startswith(fmt.call_start) and block.endswith(fmt.call_end)
    parsed = fmt.parse_call(block.removeprefix(fmt.call_start).removesuffix(fmt.call_end), TOOLS)
    assert parsed is not None and parsed[0] == "f" and json.loads(parsed[1]) == ARGS
    empty = fmt.render_call("f", {}).removeprefix(fmt.call_start).removesuffix(fmt.call_end)
    assert fmt.parse_call(empty) == ("f", "{}")


@EACH_FORMAT
def test_what_is_not_a_call_reads_as_none(fmt: ToolFormat) -> None:
    for body in ("", "\nnot a function\n", "[1, 2]", "<"):
        assert fmt.parse_call(body, TOOLS) is None


@EACH_FORMAT
@pytest.mark.parametrize("step", [1, 4, 1000])
def test_a_call_streams_to_what_its_whole_block_reads(fmt: ToolFormat, step: int) -> None:
    """The family's parser fed in pieces reports one call whose arguments are the whole read's."""
    block = fmt.render_call("f", ARGS)
    body = block.removeprefix(fmt.call_start)
    sink = _Sink()
    parser, rest = fmt.call_parser(), ""
    for i in range(0, len(body), step):
        rest = parser.feed(rest + body[i : i + step], sink)
    assert sink.log[0] == ("start", "f") and sink.log[-1] == ("end", "")
    whole = fmt.parse_call(body.removesuffix(fmt.call_end), TOOLS)
    assert whole is not None and "".join(v for k, v in sink.log if k == "args") == whole[1]
    assert rest == ""


class _Sink:
    """Records what a call parser reports."""

    tools = TOOLS

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []

    def known(self, name: str) -> bool:
        return name in self.tools

    def start(self, name: str) -> None:
        self.log.append(("start", name))

    def args(self, piece: str) -> None:
        self.log.append(("args", piece))

    def end(self) -> None:
        self.log.append(("end", ""))

    def reject(self, text: str, *, final: bool = False) -> None:
        self.log.append(("reject", text))
