"""A Messages request as the chat request the lifecycle runs (`prepare_chat`).

system (a string, or text blocks)  -> one leading system message, blocks in order
                                      (joined by blank lines; `cache_control` is
                                      accepted: vLLM caches every prefix anyway)
user text and image blocks         -> a user message (consecutive blocks; images as chat's
                                      image_url parts: a base64 source as a data URL)
user tool_result blocks            -> tool messages, in order ({"role": "tool",
                                      "tool_call_id": tool_use_id}), text and images;
                                      `is_error` results start with "Error: "
assistant text / thinking /        -> one assistant message: content, reasoning_content,
  tool_use blocks                     tool_calls (input as JSON arguments)
system turns inside `messages`     -> system messages where they stand (Claude Code)
document, ... blocks               -> 400 unsupported_content
tools (client tools)               -> chat function tools (input_schema as parameters);
                                      server tools (web_search_..., bash_..., any other
                                      `type`) and `defer_loading` tools are accepted and
                                      not offered to the model; forcing one is a 400
tool_choice auto / any / tool / none -> auto / required / the named function / none;
  disable_parallel_tool_use        -> parallel_tool_calls: false
thinking enabled / adaptive        -> the template's thinking switch on; disabled or
                                      absent -> off (Anthropic's default)
stop_sequences, temperature, top_p, top_k, metadata.user_id (-> user), max_tokens
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from gateway.errors import InvalidRequest
from gateway.http.anthropic.schemas import Block, CountTokensRequest, MessagesRequest, Thinking
from gateway.http.responses.schemas import validation_failed
from gateway.lifecycle.requests import ChatCompletionRequest

ERROR_PREFIX = "Error: "  # a tool_result with is_error, as the model reads it


@dataclass(frozen=True)
class Translated:
    chat: ChatCompletionRequest
    thinking_shown: bool  # thinking blocks carry their text (not `display: omitted`)


def _unsupported(block: Block, param: str) -> InvalidRequest:
    return InvalidRequest(
        f"Content of type '{block.type}' is not supported by this model.",
        param=f"{param}.type",
        code="unsupported_content",
    )


def _needs(value: Any, param: str, what: str) -> Any:
    if value is None:
        raise InvalidRequest(
            f"{what} needs '{param.rsplit('.', 1)[-1]}'.", param=param, code="missing_required_parameter"
        )
    return value


def _text_of(blocks: str | Sequence[Block] | None, param: str) -> str:
    """Text blocks joined; any other kind is refused."""
    if blocks is None:
        return ""
    if isinstance(blocks, str):
        return blocks
    out = []
    for j, b in enumerate(blocks):
        if b.type != "text":
            raise _unsupported(b, f"{param}[{j}]")
        out.append(_needs(b.text, f"{param}[{j}].text", "A text block"))
    return "".join(out)


def _image_part(b: Block, param: str) -> dict[str, Any]:
    """An image block as chat's `image_url` part (the lifecycle reads and checks it)."""
    source = _needs(b.source, f"{param}.source", "An image block")
    if source.type == "base64":
        media = _needs(source.media_type, f"{param}.source.media_type", "A base64 image source")
        data = _needs(source.data, f"{param}.source.data", "A base64 image source")
        url = f"data:{media};base64,{data}"
    elif source.type == "url":
        url = _needs(source.url, f"{param}.source.url", "A url image source")
    else:
        raise InvalidRequest(
            f"An image source of type '{source.type}' is not supported; send 'base64'.",
            param=f"{param}.source.type",
            code="unsupported_content",
        )
    return {"type": "image_url", "image_url": {"url": url}}


def _parts_of(blocks: str | Sequence[Block] | None, param: str, first: int = 0) -> str | list[dict[str, Any]]:
    """Text and image blocks as chat content: the text joined, or with an image the parts.
    `first`: the first block's index in `param`."""
    if blocks is None or isinstance(blocks, str):
        return blocks or ""
    parts: list[dict[str, Any]] = []
    for j, b in enumerate(blocks, start=first):
        if b.type == "text":
            parts.append({"type": "text", "text": _needs(b.text, f"{param}[{j}].text", "A text block")})
        elif b.type == "image":
            parts.append(_image_part(b, f"{param}[{j}]"))
        else:
            raise _unsupported(b, f"{param}[{j}]")
    if any(p["type"] == "image_url" for p in parts):
        return parts
    return "".join(p["text"] for p in parts)


def system_text(system: str | Sequence[Block] | None) -> str:
    if isinstance(system, str) or system is None:
        return system or ""
    return "\n\n".join(_text_of([b], f"system[{j}]") for j, b in enumerate(system))


def _user(blocks: str | list[Block], i: int) -> list[dict[str, Any]]:
    if isinstance(blocks, str):
        return [{"role": "user", "content": blocks}]
    out: list[dict[str, Any]] = []
    run: list[Block] = []  # consecutive text and image blocks: one user message
    start = 0

    def flush() -> None:
        if run:
            out.append({"role": "user", "content": _parts_of(run, f"messages[{i}].content", start)})
            run.clear()

    for j, b in enumerate(blocks):
        param = f"messages[{i}].content[{j}]"
        if b.type in ("text", "image"):
            if not run:
                start = j
            run.append(b)
        elif b.type == "tool_result":
            flush()
            result = _parts_of(b.content, f"{param}.content")
            if b.is_error:
                result = _error_prefixed(result)
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": _needs(b.tool_use_id, f"{param}.tool_use_id", "A tool_result block"),
                    "content": result,
                }
            )
        else:
            raise _unsupported(b, param)
    flush()
    return out


def _error_prefixed(result: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    if isinstance(result, str):
        return ERROR_PREFIX + result
    return [{"type": "text", "text": ERROR_PREFIX}, *result]


def _assistant(blocks: str | list[Block], i: int) -> dict[str, Any]:
    if isinstance(blocks, str):
        return {"role": "assistant", "content": blocks}
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, b in enumerate(blocks):
        param = f"messages[{i}].content[{j}]"
        if b.type == "text":
            texts.append(_needs(b.text, f"{param}.text", "A text block"))
        elif b.type == "thinking":
            reasoning.append(b.thinking or "")
        elif b.type == "redacted_thinking":
            continue  # nothing a Qwen model can read
        elif b.type == "tool_use":
            call_input = b.input if b.input is not None else {}
            calls.append(
                {
                    "id": _needs(b.id, f"{param}.id", "A tool_use block"),
                    "type": "function",
                    "function": {
                        "name": _needs(b.name, f"{param}.name", "A tool_use block"),
                        "arguments": json.dumps(call_input, ensure_ascii=False),
                    },
                }
            )
        else:
            raise _unsupported(b, param)
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        msg["tool_calls"] = calls
    if any(reasoning):
        msg["reasoning_content"] = "".join(reasoning)
    return msg


def to_messages(req: CountTokensRequest) -> list[dict[str, Any]]:
    """The conversation as chat messages (the table in the module's docstring)."""
    messages: list[dict[str, Any]] = []
    if system := system_text(req.system):
        messages.append({"role": "system", "content": system})
    for i, m in enumerate(req.messages):
        if m.role == "user":
            messages += _user(m.content, i)
        elif m.role == "assistant":
            messages.append(_assistant(m.content, i))
        else:
            messages.append({"role": "system", "content": _text_of(m.content, f"messages[{i}].content")})
    return messages


def _thinking_on(thinking: Thinking | None, max_tokens: int | None) -> bool:
    if thinking is None or thinking.type == "disabled":
        return False
    if thinking.type == "enabled":
        budget = thinking.budget_tokens
        if budget is None:
            raise InvalidRequest(
                "thinking.budget_tokens: Field required when thinking is enabled.",
                param="thinking.budget_tokens",
                code="missing_required_parameter",
            )
        if budget < 1024:
            raise InvalidRequest("thinking.budget_tokens: must be at least 1024.", param="thinking.budget_tokens")
        if max_tokens is not None and budget >= max_tokens:
            raise InvalidRequest(
                "`max_tokens` must be greater than `thinking.budget_tokens`.", param="thinking.budget_tokens"
            )
    return True


def _tools(req: CountTokensRequest) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The chat tools offered, and every tool left out (name -> why)."""
    offered: list[dict[str, Any]] = []
    left_out: dict[str, str] = {}
    for t in req.tools or ():
        if not t.offered:
            left_out[t.name] = "deferred" if t.defer_loading else f"a server tool of type '{t.type}'"
            continue
        fn: dict[str, Any] = {"name": t.name, "parameters": t.input_schema or {"type": "object", "properties": {}}}
        if t.description:
            fn["description"] = t.description
        offered.append({"type": "function", "function": fn})
    return offered, left_out


def _tool_choice(req: CountTokensRequest, left_out: dict[str, str]) -> Any:
    choice = req.tool_choice
    if choice is None or choice.type == "auto":
        return None
    if choice.type == "none":
        return "none"
    if choice.type == "any":
        return "required"
    name = _needs(choice.name, "tool_choice.name", "A tool choice of type 'tool'")
    if name in left_out:
        raise InvalidRequest(
            f"tool_choice names '{name}', {left_out[name]}, which this gateway does not run.",
            param="tool_choice",
            code="unsupported_tool_type",
        )
    return {"type": "function", "function": {"name": name}}


def translate(req: CountTokensRequest) -> Translated:
    """The chat request to run (or, for count_tokens, to count)."""
    max_tokens = req.max_tokens if isinstance(req, MessagesRequest) else None
    tools, left_out = _tools(req)
    chat: dict[str, Any] = {
        "model": req.model,
        "messages": to_messages(req),
        "chat_template_kwargs": {"enable_thinking": _thinking_on(req.thinking, max_tokens)},
    }
    if tools:
        chat["tools"] = tools
    if (choice := _tool_choice(req, left_out)) is not None:
        chat["tool_choice"] = choice
    if req.tool_choice is not None and req.tool_choice.disable_parallel_tool_use:
        chat["parallel_tool_calls"] = False
    if isinstance(req, MessagesRequest):
        chat |= {
            "max_tokens": req.max_tokens,
            "stream": req.stream,
            "stop": req.stop_sequences or None,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "top_k": req.top_k,
            "user": req.metadata.user_id if req.metadata is not None else None,
        }
    try:
        chat_req = ChatCompletionRequest.model_validate({k: v for k, v in chat.items() if v is not None})
    except ValidationError as e:  # what the Messages schema let through but chat refuses
        raise validation_failed(e) from None
    shown = req.thinking is None or req.thinking.display != "omitted"
    return Translated(chat=chat_req, thinking_shown=shown)
