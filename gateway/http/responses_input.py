"""A Responses request as the chat request the lifecycle runs (`prepare_chat`), and a
response's output as the chat messages that continue its conversation.

    instructions                    -> a leading system message (not carried to the next response)
    message items                   -> chat messages (text parts joined; images, files refused)
    function_call items             -> one assistant message's tool_calls (consecutive calls,
                                       and calls right after the assistant's text, merge)
    function_call_output            -> {"role": "tool", "tool_call_id": ..., "content": ...}
    reasoning items                 -> reasoning_content of the assistant message that follows
                                       (dropped when none follows)
    tools (flat function tools)     -> chat tools {"type": "function", "function": {...}}
    tool_choice {"type": "function", "name"} -> {"type": "function", "function": {"name"}}
    text.format                     -> response_format
    max_output_tokens               -> max_completion_tokens
    reasoning.effort                -> reasoning_effort ("none": thinking off)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError

from gateway.errors import InvalidRequest
from gateway.http.responses_schemas import (
    ContentPart,
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    InputItem,
    MessageItem,
    ReasoningItem,
    ResponsesRequest,
    ToolChoiceFunction,
    validation_failed,
)
from gateway.http.schemas import ChatCompletionRequest

Item = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem
_TEXT_PARTS = ("input_text", "output_text", "text")
_ITEMS: TypeAdapter[list[Item]] = TypeAdapter(list[InputItem])


def _text(content: str | list[ContentPart], param: str) -> str:
    if isinstance(content, str):
        return content
    out = []
    for j, part in enumerate(content):
        if part.type in _TEXT_PARTS and part.text is not None:
            out.append(part.text)
        elif part.type == "refusal":
            out.append(part.refusal or "")
        elif part.type in _TEXT_PARTS:
            raise InvalidRequest(f"A content part of type '{part.type}' needs its text.", param=f"{param}[{j}].text")
        else:
            raise InvalidRequest(
                f"Content of type '{part.type}' is not supported by this model.",
                param=f"{param}[{j}].type",
                code="unsupported_content",
            )
    return "".join(out)


def to_messages(items: Sequence[Item], param: str = "input") -> list[dict[str, Any]]:
    """Responses items -> chat messages (the table in the module's docstring)."""
    messages: list[dict[str, Any]] = []
    reasoning: str | None = None  # waits for the assistant message it belongs to
    for i, item in enumerate(items):
        if isinstance(item, ReasoningItem):
            reasoning = (reasoning or "") + item.text
            continue
        if isinstance(item, MessageItem):
            msg: dict[str, Any] = {"role": item.role, "content": _text(item.content, f"{param}[{i}].content")}
            if item.role == "assistant" and reasoning:
                msg["reasoning_content"] = reasoning
            messages.append(msg)
        elif isinstance(item, FunctionCallItem):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = messages[-1] if messages else None
            # The same turn: calls that follow the assistant's text (or its other calls).
            if last is not None and last["role"] == "assistant" and reasoning is None:
                last.setdefault("tool_calls", []).append(call)
            else:
                msg = {"role": "assistant", "content": "", "tool_calls": [call]}
                if reasoning:
                    msg["reasoning_content"] = reasoning
                messages.append(msg)
        else:
            content = _text(item.output, f"{param}[{i}].output")
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": content})
        reasoning = None
    return messages


def output_messages(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output items (which are valid input items) as chat messages."""
    return to_messages(_ITEMS.validate_python(output), param="output")


def function_tools(raw: list[dict[str, Any]] | None) -> list[FunctionTool]:
    """The request's tools: function tools only (another type is named in a 400)."""
    tools = []
    for i, t in enumerate(raw or ()):
        kind = t.get("type")
        if kind != "function":
            raise InvalidRequest(
                f"Tools of type '{kind}' are not supported: only function tools are.",
                param="tools",
                code="unsupported_tool_type",
            )
        try:
            tools.append(FunctionTool.model_validate(t))
        except ValidationError as e:
            raise validation_failed(e, ("tools", i)) from None
    return tools


@dataclass(frozen=True)
class Translated:
    chat: ChatCompletionRequest
    conversation: list[dict[str, Any]]  # the chat messages before the output, without instructions
    echo: dict[str, Any]  # the request's fields that the response object repeats


def translate(req: ResponsesRequest, history: Sequence[dict[str, Any]] = ()) -> Translated:
    """The chat request to run; `history` is the stored conversation of previous_response_id."""
    items = req.items
    if not items:
        raise InvalidRequest("input must not be empty.", param="input")
    tools = function_tools(req.tools)
    conversation = [*history, *to_messages(items)]
    messages = [{"role": "system", "content": req.instructions}] if req.instructions else []
    chat: dict[str, Any] = {
        "model": req.model,
        "messages": messages + conversation,
        "stream": req.stream,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "user": req.user,
        "max_completion_tokens": req.max_output_tokens,
        "parallel_tool_calls": req.parallel_tool_calls,
    }
    if tools:
        chat["tools"] = [
            {"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)} for t in tools
        ]
    choice = req.tool_choice
    if isinstance(choice, ToolChoiceFunction):
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif choice is not None:
        chat["tool_choice"] = choice
    fmt = req.text.format if req.text is not None else None
    if fmt is not None and fmt.type == "json_object":
        chat["response_format"] = {"type": "json_object"}
    elif fmt is not None and fmt.type == "json_schema":
        schema = {"name": fmt.name, "schema": fmt.schema_, "strict": fmt.strict, "description": fmt.description}
        chat["response_format"] = {"type": "json_schema", "json_schema": schema}
    if req.reasoning is not None and req.reasoning.effort is not None:
        chat["reasoning_effort"] = req.reasoning.effort
    try:
        chat_req = ChatCompletionRequest.model_validate({k: v for k, v in chat.items() if v is not None})
    except ValidationError as e:  # what the Responses schema let through but chat refuses
        raise validation_failed(e) from None
    return Translated(chat=chat_req, conversation=conversation, echo=_echo(req, tools))


def _echo(req: ResponsesRequest, tools: list[FunctionTool]) -> dict[str, Any]:
    choice = req.tool_choice
    fmt = req.text.format if req.text is not None else None
    return {
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "metadata": req.metadata or {},
        "parallel_tool_calls": req.parallel_tool_calls,
        "previous_response_id": req.previous_response_id,
        "reasoning": {
            "effort": req.reasoning.effort if req.reasoning else None,
            "summary": req.reasoning.summary if req.reasoning else None,
        },
        "store": req.store,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "text": {"format": fmt.echo() if fmt is not None else {"type": "text"}},
        "tool_choice": choice.model_dump() if isinstance(choice, ToolChoiceFunction) else (choice or "auto"),
        "tools": [t.model_dump() for t in tools],
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "truncation": "disabled",
        "user": req.user,
    }
