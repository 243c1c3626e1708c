"""Anthropic's Messages API request (`POST /v1/messages`, `/v1/messages/count_tokens`) as
clients send it: the `anthropic` SDKs and Claude Code.

Unknown fields are accepted and ignored (Claude Code sends `context_management`,
`output_config`, beta headers); what the gateway uses is validated strictly. Content
blocks are one model with a `type` and the fields of every kind, checked per kind when the
request is translated (gateway/http/anthropic/translate.py), so an error names the block
(`messages[2].content[0].tool_use_id`) without the names of union members pydantic tried.
"""

from __future__ import annotations

from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from gateway.http import json_body
from gateway.lifecycle.requests import INT32_MAX, INT64_MAX, FreeJson


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class ImageSource(_Request):
    """An image block's `source`: base64 `data` with its `media_type`, or a `url`."""

    type: str
    media_type: str | None = None
    data: str | None = None
    url: str | None = None


class Block(_Request):
    """A content block: text, image, document, tool_use, tool_result, thinking,
    redacted_thinking, ... (the fields its kind uses are checked when translated)."""

    type: str
    text: str | None = None
    # tool_use
    id: str | None = None
    name: str | None = None
    input: FreeJson | None = None
    # tool_result
    tool_use_id: str | None = None
    content: str | list[Block] | None = None
    is_error: bool = False
    # image
    source: ImageSource | None = None
    # thinking
    thinking: str | None = None
    signature: str | None = None
    cache_control: FreeJson | None = None


class Message(_Request):
    # Claude Code also sends `system` turns inside the conversation.
    role: Literal["user", "assistant", "system"]
    content: str | list[Block]


class Tool(_Request):
    """A client tool (no type, or "custom") the model may call; other types are Anthropic's
    server tools (web_search_20250305, code_execution_..., bash_20250124, ...), accepted
    and not offered to the model. `defer_loading` tools are not offered either."""

    type: str | None = None
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: FreeJson | None = None
    defer_loading: bool = False
    cache_control: FreeJson | None = None

    @property
    def offered(self) -> bool:
        return self.type in (None, "custom") and not self.defer_loading


class ToolChoice(_Request):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class Thinking(_Request):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(None, ge=0, le=INT32_MAX)
    display: str | None = None  # "omitted": thinking blocks come back without their text


class Metadata(_Request):
    user_id: str | None = None


class CountTokensRequest(_Request):
    model: str
    messages: list[Message] = Field(min_length=1)
    system: str | list[Block] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1, le=INT64_MAX)
    stream: bool = False
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, le=INT32_MAX)
    metadata: Metadata | None = None


M = TypeVar("M", MessagesRequest, CountTokensRequest)


def parse(raw: bytes, model: type[M]) -> M:
    """The body as `model`, or the 400 that names the first bad field."""
    return json_body.validate(model, json_body.document(raw))
