"""Hermes-style JSON calls (Qwen3): `<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>`.

A call is read when its block closes (checked first: one that does not parse comes back as
answer text), then sent in one piece.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gateway.text.formats.base import ToolFormat, Tools


class Hermes(ToolFormat):
    name = "hermes"

    def detect(self, template: str) -> bool:
        return self.call_start in template

    def parse_call(self, body: str, tools: Tools | None = None) -> tuple[str, str] | None:
        try:
            value = json.loads(body.strip(), strict=False)
        except ValueError:
            return None
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return None
        args = value.get("arguments", value.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args, strict=False)
            except ValueError:
                return None
        if not isinstance(args, dict):
            return None
        return value["name"], json.dumps(args, ensure_ascii=False)

    def render_call(self, name: str, arguments: Mapping[str, Any]) -> str:
        call = json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False)
        return f"{self.call_start}\n{call}\n{self.call_end}"
