"""The grammar of tool_choice "required" (gateway/lifecycle/prepare.py): each tool's `$defs`
move to the grammar's root, renamed per tool, so its `$ref`s resolve."""

from __future__ import annotations

from typing import Any

from gateway.lifecycle.prepare import _forced_schema
from gateway.lifecycle.requests import ChatCompletionRequest


def tool(name: str, city: dict[str, Any]) -> dict[str, Any]:
    params = {
        "type": "object",
        "properties": {
            "city": {"$ref": "#/$defs/City"},
            "cities": {"type": "array", "items": {"$ref": "#/$defs/City"}},
        },
        "$defs": {"City": city},
    }
    return {"type": "function", "function": {"name": name, "parameters": params}}


def test_each_tool_s_defs_move_to_the_root_under_its_name() -> None:
    a, b = {"type": "string"}, {"type": "object", "properties": {"zip": {"type": "string"}}}
    req = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "tools": [tool("f", a), tool("g", b)],
            "tool_choice": "required",
        }
    )
    schema = _forced_schema(req)
    assert schema is not None and schema["$defs"] == {"f.City": a, "g.City": b}
    f, g = (c["properties"]["parameters"] for c in schema["items"]["anyOf"])
    assert f["properties"]["city"] == {"$ref": "#/$defs/f.City"} and "$defs" not in f
    assert g["properties"]["cities"]["items"] == {"$ref": "#/$defs/g.City"}
    assert req.function_tools["f"]["$defs"] == {"City": a}  # the request itself is untouched
