"""The OpenAI Responses API request (`POST /v1/responses`) as clients send it.

Like schemas.py, unknown fields are accepted and ignored (SDKs send `truncation`,
`safety_identifier`, ...); what the gateway uses is validated strictly, and so are the
hints clients such as Codex CLI send (`include`, `prompt_cache_key`, `client_metadata`,
`service_tier`, `text.verbosity`), though only `include: ["reasoning.encrypted_content"]`
changes the answer. Tools are checked in translation (responses_input.py), not here.
The route validates the body itself (`parse`) rather than through FastAPI, so that a
bad input item is reported at its place (`input.2.call_id`), without the names of the
union members pydantic tried, and still through the one error mapping (gateway/errors.py).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from fastapi.exceptions import RequestValidationError
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from gateway.errors import InvalidRequest
from gateway.http import json_body
from gateway.lifecycle.requests import INT64_MAX, FreeJson, FunctionName
from gateway.settings import LimitSettings


class _Request(BaseModel):
    # As in schemas.py: strict types, finite numbers (OpenAI's rules).
    model_config = ConfigDict(extra="ignore", populate_by_name=True, strict=True, allow_inf_nan=False)


class ContentPart(_Request):
    """A message's content part: `input_text` / `output_text` carry `text`, a `refusal`
    part its `refusal`, an `input_image` its `image_url` (a data URL); files and audio are
    refused when translated."""

    type: str
    text: str | None = None
    refusal: str | None = None
    image_url: str | None = None
    detail: Literal["auto", "low", "high"] | None = None  # accepted; Qwen sizes by pixels alone
    file_id: str | None = None


class MessageItem(_Request):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]


class FunctionCallItem(_Request):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str
    id: str | None = None
    namespace: str | None = None  # the namespace tool the function belongs to


class FunctionCallOutputItem(_Request):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[ContentPart]


class CustomToolCallItem(_Request):
    """A call of a custom (freeform) tool: its input is plain text, not JSON."""

    type: Literal["custom_tool_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: str
    id: str | None = None
    namespace: str | None = None


class CustomToolCallOutputItem(_Request):
    type: Literal["custom_tool_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[ContentPart]


class ReasoningPart(_Request):
    type: str
    text: str = ""


class ReasoningItem(_Request):
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[ReasoningPart] = []
    content: list[ReasoningPart] | None = None
    # What this gateway sends as `encrypted_content` is the reasoning text in base64
    # (nothing here is secret from the client that wrote it); another server's blob reads as none.
    encrypted_content: str | None = None

    @property
    def text(self) -> str:
        """The reasoning text (a summary is not the reasoning: only `reasoning_text` parts;
        without them, the text `encrypted_content` carries)."""
        text = "".join(p.text for p in self.content or () if p.type == "reasoning_text")
        if not text and self.encrypted_content:
            return decode_reasoning(self.encrypted_content)
        return text


def encode_reasoning(text: str) -> str:
    """A reasoning item's `encrypted_content`: the text in base64 (not encrypted: the client
    wrote the prompt, and the reasoning is its own answer's)."""
    return base64.b64encode(text.encode()).decode("ascii")


def decode_reasoning(blob: str) -> str:
    """The text `encode_reasoning` wrote; "" for anything else (an encrypted blob of another server)."""
    try:
        return base64.b64decode(blob, validate=True).decode()
    except (ValueError, UnicodeDecodeError):  # binascii.Error is a ValueError
        return ""


ITEM_TYPES = (
    "message",
    "function_call",
    "function_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
    "reasoning",
)


def _item_type(v: Any) -> str | None:
    if isinstance(v, dict):
        kind = v.get("type", "message")  # a message may leave its type out (EasyInputMessage)
        return kind if isinstance(kind, str) else None
    return getattr(v, "type", None)


Item = (
    MessageItem
    | FunctionCallItem
    | FunctionCallOutputItem
    | CustomToolCallItem
    | CustomToolCallOutputItem
    | ReasoningItem
)
InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[CustomToolCallItem, Tag("custom_tool_call")]
    | Annotated[CustomToolCallOutputItem, Tag("custom_tool_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_type),
]


class FunctionTool(_Request):
    """The Responses API's function tool: flat, no nested `function` object."""

    type: Literal["function"]
    name: FunctionName
    description: str | None = None
    parameters: FreeJson | None = None
    strict: bool | None = None


class CustomFormat(_Request):
    """A custom tool's input: free text, or text in a Lark or regex grammar."""

    type: Literal["text", "grammar"]
    syntax: Literal["lark", "regex"] | None = None
    definition: str | None = None

    @model_validator(mode="after")
    def _grammar_present(self) -> CustomFormat:
        if self.type == "grammar" and (self.syntax is None or not self.definition):
            raise ValueError("a format of type grammar needs its syntax (lark or regex) and definition")
        return self


class CustomTool(_Request):
    """A freeform tool: the model writes its input as text (in `format`'s grammar, if any)."""

    type: Literal["custom"]
    name: FunctionName
    description: str | None = None
    format: CustomFormat | None = None

    @property
    def grammar(self) -> CustomFormat | None:
        return self.format if self.format is not None and self.format.type == "grammar" else None


class NamespaceTool(_Request):
    """Function and custom tools grouped under a name; each is offered as `{namespace}__{name}`
    and called back with its own name and `namespace`."""

    type: Literal["namespace"]
    name: FunctionName
    description: str | None = None
    tools: list[FreeJson]  # function or custom tools, checked one by one in translation


class ToolChoiceFunction(_Request):
    type: Literal["function"]
    name: str
    namespace: str | None = None  # a namespace tool's function (else `name` may be `namespace__name`)


class ToolChoiceCustom(_Request):
    type: Literal["custom"]
    name: str
    namespace: str | None = None


def _tool_choice(v: Any) -> Any:
    """One clear message for a bad tool_choice (a union would report each member's error)."""
    if v is None or v in ("none", "auto", "required") or isinstance(v, ToolChoiceFunction | ToolChoiceCustom):
        return v
    if isinstance(v, dict) and v.get("type") in ("function", "custom") and isinstance(v.get("name"), str):
        return (ToolChoiceFunction if v["type"] == "function" else ToolChoiceCustom).model_validate(v)
    kind = v.get("type") if isinstance(v, dict) else None
    if isinstance(kind, str) and kind not in ("function", "custom", "allowed_tools"):
        raise ValueError(
            f"tool_choice forces the hosted tool type '{kind}', which this server does not run:"
            " only function and custom tools can be forced"
        )
    raise ValueError(
        'must be "none", "auto", "required", {"type": "function", "name": ...} or {"type": "custom", "name": ...}'
    )


class TextFormat(_Request):
    type: Literal["text", "json_object", "json_schema"]
    name: str = "response"
    description: str | None = None
    schema_: FreeJson | None = Field(None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_present(self) -> TextFormat:
        if self.type == "json_schema" and self.schema_ is None:
            raise ValueError("a format of type json_schema needs its schema")
        return self

    def echo(self) -> dict[str, Any]:
        if self.type != "json_schema":
            return {"type": self.type}
        out = {"type": "json_schema", "name": self.name, "schema": self.schema_, "strict": self.strict}
        if self.description is not None:
            out["description"] = self.description
        return out


class TextConfig(_Request):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # accepted; a Qwen model has no such knob


class ReasoningConfig(_Request):
    # "none" turns thinking off; the other efforts leave it on (Qwen models have no levels).
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesRequest(_Request):
    model: str
    input: Annotated[
        Annotated[str, Tag("text")] | Annotated[list[InputItem], Tag("items")],
        Discriminator(lambda v: "text" if isinstance(v, str) else "items"),
    ]
    instructions: str | None = None
    tools: list[FreeJson] | None = None  # checked in translation (function, custom, namespace, hosted)
    tool_choice: Annotated[
        Literal["none", "auto", "required"] | ToolChoiceFunction | ToolChoiceCustom | None,
        BeforeValidator(_tool_choice),
    ] = None
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = Field(None, ge=1, le=INT64_MAX)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    # OpenAI's limits: 16 pairs, keys up to 64 characters, values up to 512.
    metadata: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] | None = Field(
        None, max_length=16
    )
    user: str | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    # Hints: `include` is honoured for "reasoning.encrypted_content"; the others are accepted
    # (the prefix cache needs no key, there is one service tier, client_metadata is the client's).
    include: list[str] | None = None
    prompt_cache_key: str | None = None
    client_metadata: FreeJson | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    background: bool = False
    conversation: Any = None

    @field_validator("background")
    @classmethod
    def _foreground(cls, v: bool) -> bool:
        if v:
            raise ValueError("background responses are not supported")
        return v

    @field_validator("conversation")
    @classmethod
    def _no_conversation(cls, v: Any) -> Any:
        if v is not None:
            raise ValueError("conversation objects are not supported: use previous_response_id")
        return v

    @property
    def items(self) -> list[Item]:
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        return list(self.input)

    @property
    def encrypted_reasoning(self) -> bool:
        """Reasoning items carry `encrypted_content` (the client keeps no server state: store off)."""
        return "reasoning.encrypted_content" in (self.include or ())


# --- validation errors, reported at their place -----------------------------------------

_TYPE_LABELS = {"str", "int", "float", "bool", "dict", "list", "none"}


def _clean_loc(loc: Sequence[int | str]) -> tuple[int | str, ...]:
    """A pydantic error location without the union members' labels it passed through
    (`input.items.2.function_call.name` -> `input.2.name`)."""
    out: list[int | str] = []
    for i, part in enumerate(loc):
        if isinstance(part, str):
            prev = loc[i - 1] if i else None
            if "[" in part or part in _TYPE_LABELS:  # a union member: `str`, `list[ContentPart]`
                continue
            if prev == "input" and part in ("text", "items"):
                continue
            if isinstance(prev, int) and i >= 2 and loc[i - 2] == "items" and part in ITEM_TYPES:
                continue
        out.append(part)
    return tuple(out)


def _message(err: dict[str, Any]) -> str:
    if err.get("type") == "union_tag_invalid":
        tag = (err.get("ctx") or {}).get("tag")
        return f"input items of type '{tag}' are not supported (use one of: {', '.join(ITEM_TYPES)})"
    if err.get("type") == "union_tag_not_found":
        return "an input item must be an object with a 'type'"
    return str(err.get("msg", "invalid value"))


def validation_failed(exc: ValidationError, prefix: Sequence[int | str] = ()) -> RequestValidationError:
    """A pydantic error as FastAPI's, which the app maps to OpenAI's 400 with `param`.
    The deepest error comes first: where a union was tried, it is the member that matched
    best (the one that got furthest), not the first one tried."""
    errors: list[tuple[tuple[int | str, ...], dict[str, Any]]] = []
    for err in exc.errors():
        loc = ("body", *prefix, *_clean_loc(err["loc"]))
        errors.append((loc, {**err, "loc": loc, "msg": _message(dict(err))}))
    errors.sort(key=lambda e: -len(e[0]))
    return RequestValidationError([e for _, e in errors])


def parse(raw: bytes) -> ResponsesRequest:
    """The request body, validated; RequestValidationError (-> 400) when it is not valid."""
    try:
        data = json_body.decode(raw)
    except ValueError:
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body",), "msg": "JSON decode error"}]) from None
    try:
        return ResponsesRequest.model_validate(data)
    except ValidationError as e:
        raise validation_failed(e) from None


def check_limits(req: ResponsesRequest, limits: LimitSettings) -> None:
    """The configured sizes (settings `limits:`), checked before the input is translated."""
    items = len(req.items) + (1 if req.instructions else 0)
    if items > limits.max_messages:
        raise InvalidRequest(
            f"Invalid 'input': at most {limits.max_messages} items are allowed, got {items}.", param="input"
        )
    if len(req.tools or ()) > limits.max_tools:
        raise InvalidRequest(
            f"Invalid 'tools': at most {limits.max_tools} tools are allowed, got {len(req.tools or ())}.",
            param="tools",
        )
