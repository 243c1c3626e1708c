"""Qwen3-Coder's XML calls (Qwen3-Coder, Qwen3.5 and later):

    <tool_call>
    <function=f>
    <parameter=x>
    1
    </parameter>
    </function>
    </tool_call>

A call is sent as it arrives: its start once the function is named (and offered), then
parameter by parameter, each value converted to its schema's type (`convert_param`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from gateway.text.formats.base import CallParser, CallSink, ToolFormat, Tools, parse_streamed

_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>")
_PARAM_OPEN = re.compile(r"\s*<parameter=([^>\n]+)>")
_PARAM_CLOSE = "</parameter>"
_FUNCTION_CLOSE = "</function>"


class Qwen3Xml(ToolFormat):
    name = "qwen3_xml"

    def detect(self, template: str) -> bool:
        return "<function=" in template

    def parse_call(self, body: str, tools: Tools | None = None) -> tuple[str, str] | None:
        return parse_streamed(self, body, tools)

    def call_parser(self) -> CallParser:
        return _XmlCall(self)

    def render_call(self, name: str, arguments: Mapping[str, Any]) -> str:
        params = "".join(
            f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}\n{_PARAM_CLOSE}\n"
            for k, v in arguments.items()
        )
        return f"{self.call_start}\n<function={name}>\n{params}{_FUNCTION_CLOSE}\n{self.call_end}"


class _XmlCall:
    """One XML call in progress: its function, then its parameters as each closes."""

    def __init__(self, fmt: Qwen3Xml) -> None:
        self._fmt = fmt
        self._name: str | None = None  # the function, once known
        self._params = 0  # parameters written
        self._over = False

    def feed(self, text: str, sink: CallSink) -> str:
        while not self._over:
            rest = self._step(text, sink)
            if len(rest) == len(text):
                break
            text = rest
        return text

    def _step(self, text: str, sink: CallSink) -> str:
        if self._name is None:
            m = _FUNCTION.match(text)
            if m is None:
                stripped = text.lstrip()
                closed = self._fmt.call_end in text
                if closed or (stripped and not "<function=".startswith(stripped[:10]) and ">" in stripped):
                    return self._malformed(text, sink)
                return text
            name = m.group(1).strip()
            if not sink.known(name):
                return self._malformed(text, sink)
            self._name = name
            text = text[m.end() :]
            sink.start(name)
        while True:
            m = _PARAM_OPEN.match(text)
            if m is None:
                break
            close = text.find(_PARAM_CLOSE, m.end())
            if close == -1:
                return text
            self._add_param(sink, m.group(1).strip(), text[m.end() : close])
            text = text[close + len(_PARAM_CLOSE) :]
        head = text.lstrip()
        for closer in (_FUNCTION_CLOSE, self._fmt.call_end):
            if head.startswith(closer):
                if closer == self._fmt.call_end:
                    self._close(sink)
                return head[len(closer) :]
        return text

    def finish(self, text: str, sink: CallSink) -> None:
        if self._name is None:
            self._malformed(text, sink)
        else:
            self._close(sink)

    def _add_param(self, sink: CallSink, name: str, raw: str) -> None:
        value = raw[1:] if raw.startswith("\n") else raw
        value = value[:-1] if value.endswith("\n") else value
        assert self._name is not None
        props = (sink.tools.get(self._name) or {}).get("properties") or {}
        converted = convert_param(value, props.get(name))
        pair = json.dumps(name) + ": " + json.dumps(converted, ensure_ascii=False)
        sink.args(("{" if self._params == 0 else ", ") + pair)
        self._params += 1

    def _close(self, sink: CallSink) -> None:
        sink.args("{}" if self._params == 0 else "}")
        sink.end()
        self._over = True

    def _malformed(self, text: str, sink: CallSink) -> str:
        """Not a call: the block (to its end marker, or all there is) is answer text."""
        end = text.find(self._fmt.call_end)
        stop = len(text) if end == -1 else end + len(self._fmt.call_end)
        sink.reject(self._fmt.call_start + text[:stop])
        self._over = True
        return text[stop:]


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
            return json.loads(text, strict=False)
        except ValueError:
            return value
    return value
