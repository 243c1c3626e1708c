"""A Responses request as the chat request the lifecycle runs (`prepare_chat`), and a
response's output as the chat messages that continue its conversation.

    instructions                    -> a leading system message (not carried to the next response)
    message items                   -> chat messages (text parts joined; input_image parts kept
                                       as image_url parts; files refused)
    function_call items             -> one assistant message's tool_calls (consecutive calls,
                                       and calls right after the assistant's text, merge);
                                       with `namespace`, named `{namespace}__{name}`
    custom_tool_call items          -> tool_calls too, arguments `{"input": <the input text>}`
    function_call_output,
    custom_tool_call_output         -> {"role": "tool", "tool_call_id": ..., "content": ...}
    reasoning items                 -> reasoning_content of the assistant message that follows
                                       (dropped when none follows); the text is the
                                       `reasoning_text` content, else what `encrypted_content` holds
    tools: function                 -> chat tools {"type": "function", "function": {...}}
           custom (freeform)        -> a function of one required string, `input`
           namespace                -> its function and custom tools, each named `{namespace}__{name}`
           any other type (hosted:  -> accepted and echoed, not offered to the model (this server
           web_search, mcp, ...)       runs none of them)
    tool_choice {"type": "function" | "custom", "name"} -> {"type": "function", "function": {"name"}};
                                       a forced custom tool's output is its input text itself, under
                                       its grammar (`force_custom`); forcing a hosted tool is a 400
    text.format                     -> response_format
    max_output_tokens               -> max_completion_tokens
    reasoning.effort                -> reasoning_effort ("none": thinking off)

`Tools.refs` maps each chat tool name back to what the client declared, so the output
(output.py) names calls as the client knows them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from engine_adapter.base import StructuredOutput
from gateway.errors import InvalidRequest
from gateway.http.responses.schemas import (
    ContentPart,
    CustomTool,
    CustomToolCallItem,
    FunctionCallItem,
    FunctionTool,
    InputItem,
    Item,
    MessageItem,
    NamespaceTool,
    ReasoningItem,
    ResponsesRequest,
    ToolChoiceCustom,
    ToolChoiceFunction,
    validation_failed,
)
from gateway.job import Job
from gateway.lifecycle.requests import ChatCompletionRequest

_TEXT_PARTS = ("input_text", "output_text", "text")
_ITEMS: TypeAdapter[list[Item]] = TypeAdapter(list[InputItem])
NAMESPACE_SEP = "__"  # a namespaced tool's chat name: `{namespace}__{name}`
CUSTOM_INPUT = "input"  # the one string parameter a custom tool is offered with
GRAMMAR_SHOWN = 2000  # a custom tool's grammar longer than this is not written into the prompt
M = TypeVar("M", bound=BaseModel)


def chat_name(name: str, namespace: str | None) -> str:
    """The name the model sees (and calls) for a tool, namespaced or not."""
    return name if namespace is None else f"{namespace}{NAMESPACE_SEP}{name}"


def custom_arguments(text: str) -> str:
    """A custom tool call's input as the arguments of the function the model was offered."""
    return json.dumps({CUSTOM_INPUT: text}, ensure_ascii=False)


def _content(content: str | list[ContentPart], param: str) -> str | list[dict[str, Any]]:
    """A message's (or a tool output's) content as chat's: its text, or with images the list of
    text and `image_url` parts."""
    if isinstance(content, str):
        return content
    out: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        if part.type in _TEXT_PARTS and part.text is not None:
            out.append({"type": "text", "text": part.text})
        elif part.type == "refusal":
            out.append({"type": "text", "text": part.refusal or ""})
        elif part.type in _TEXT_PARTS:
            raise InvalidRequest(f"A content part of type '{part.type}' needs its text.", param=f"{param}[{j}].text")
        elif part.type == "input_image" and part.image_url is not None:
            out.append({"type": "image_url", "image_url": {"url": part.image_url}})
        elif part.type == "input_image":
            raise InvalidRequest(
                "An input_image needs its image_url (a data URL): this server has no files to take a file_id from.",
                param=f"{param}[{j}].image_url",
                code="missing_required_parameter",
            )
        else:
            raise InvalidRequest(
                f"Content of type '{part.type}' is not supported by this model.",
                param=f"{param}[{j}].type",
                code="unsupported_content",
            )
    if any(p["type"] == "image_url" for p in out):
        return out
    return "".join(p["text"] for p in out)


def to_messages(items: Sequence[Item], param: str = "input") -> list[dict[str, Any]]:
    """Responses items -> chat messages (the table in the module's docstring)."""
    messages: list[dict[str, Any]] = []
    reasoning: str | None = None  # waits for the assistant message it belongs to
    for i, item in enumerate(items):
        if isinstance(item, ReasoningItem):
            reasoning = (reasoning or "") + item.text
            continue
        if isinstance(item, MessageItem):
            msg: dict[str, Any] = {"role": item.role, "content": _content(item.content, f"{param}[{i}].content")}
            if item.role == "assistant" and reasoning:
                msg["reasoning_content"] = reasoning
            messages.append(msg)
        elif isinstance(item, FunctionCallItem | CustomToolCallItem):
            arguments = item.arguments if isinstance(item, FunctionCallItem) else custom_arguments(item.input)
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": chat_name(item.name, item.namespace), "arguments": arguments},
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
        else:  # function_call_output, custom_tool_call_output
            content = _content(item.output, f"{param}[{i}].output")
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": content})
        reasoning = None
    return messages


def output_messages(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output items (which are valid input items) as chat messages."""
    return to_messages(_ITEMS.validate_python(output), param="output")


# --- tools ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolRef:
    """What a chat tool name stands for in the request: a function or custom tool, maybe namespaced."""

    kind: Literal["function", "custom"]
    name: str
    namespace: str | None = None


@dataclass
class Tools:
    """The request's tools: those offered to the model (as chat tools), and the rest."""

    chat: list[dict[str, Any]] = field(default_factory=list)  # chat tools, in the request's order
    refs: dict[str, ToolRef] = field(default_factory=dict)  # chat name -> the tool it stands for
    custom: dict[str, CustomTool] = field(default_factory=dict)  # chat name -> custom tool
    hosted: dict[str, str] = field(default_factory=dict)  # a hosted tool's type, name or label -> type
    echo: list[dict[str, Any]] = field(default_factory=list)  # as the response repeats them

    def add(self, ref: ToolRef, function: dict[str, Any]) -> str:
        name = chat_name(ref.name, ref.namespace)
        if name in self.refs:
            how = (
                " (a namespace's tool is offered as `namespace__name`)"
                if ref.namespace or self.refs[name].namespace
                else ""
            )
            raise InvalidRequest(f"Tool names in 'tools' must be unique: '{name}' is there twice{how}.", param="tools")
        self.refs[name] = ref
        self.chat.append({"type": "function", "function": {**function, "name": name}})
        return name

    def resolve(self, name: str) -> str | None:
        """The chat name a tool_choice's `name` means: a chat name, or the name of exactly one
        namespaced tool."""
        if name in self.refs:
            return name
        inner = [k for k, ref in self.refs.items() if ref.namespace is not None and ref.name == name]
        return inner[0] if len(inner) == 1 else None


def _validated(model: type[M], raw: dict[str, Any], where: tuple[int | str, ...]) -> M:
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise validation_failed(e, where) from None


def _custom_function(tool: CustomTool) -> dict[str, Any]:
    """A custom tool as the function the model is offered: one required string, `input`."""
    description = tool.description or ""
    grammar = tool.grammar
    if grammar is not None and grammar.definition is not None and len(grammar.definition) <= GRAMMAR_SHOWN:
        description += (
            f"\n\nThe `{CUSTOM_INPUT}` is plain text (not JSON) in this {grammar.syntax} grammar:\n"
            f"{grammar.definition.strip()}"
        )
    param = {"type": "string", "description": "The tool's input, as plain text."}
    return {
        "description": description.strip() or None,
        "parameters": {
            "type": "object",
            "properties": {CUSTOM_INPUT: param},
            "required": [CUSTOM_INPUT],
            "additionalProperties": False,
        },
    }


def _add_tool(tools: Tools, raw: dict[str, Any], where: tuple[int | str, ...], namespace: str | None) -> None:
    if raw.get("type") == "function":
        fn = _validated(FunctionTool, raw, where)
        tools.add(ToolRef("function", fn.name, namespace), fn.model_dump(exclude={"type", "name"}, exclude_none=True))
    else:
        custom = _validated(CustomTool, raw, where)
        name = tools.add(ToolRef("custom", custom.name, namespace), _custom_function(custom))
        tools.custom[name] = custom


def _param(where: tuple[int | str, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(where))


def tools_of(raw: list[dict[str, Any]] | None) -> Tools:
    """The request's tools (the module's table), checked; a bad one is a 400 at its place."""
    tools = Tools()
    for i, t in enumerate(raw or ()):
        kind = t.get("type")
        if kind in ("function", "custom"):
            _add_tool(tools, t, ("tools", i), None)
            tools.echo.append(_validated(FunctionTool, t, ("tools", i)).model_dump() if kind == "function" else t)
        elif kind == "namespace":
            ns = _validated(NamespaceTool, t, ("tools", i))
            for j, inner in enumerate(ns.tools):
                if inner.get("type") not in ("function", "custom"):
                    raise InvalidRequest(
                        f"A namespace holds function and custom tools, not '{inner.get('type')}'.",
                        param=_param(("tools", i, "tools", j, "type")),
                        code="unsupported_tool_type",
                    )
                _add_tool(tools, inner, ("tools", i, "tools", j), ns.name)
            tools.echo.append(t)
        elif isinstance(kind, str) and kind:  # hosted (web_search, mcp, ...): known, not offered
            tools.hosted.setdefault(kind, kind)
            for key in ("name", "server_label"):
                if isinstance(t.get(key), str):
                    tools.hosted.setdefault(t[key], kind)
            tools.echo.append(t)
        else:
            raise InvalidRequest("Each tool needs its 'type'.", param=_param(("tools", i, "type")))
    return tools


def _tool_choice(
    choice: ToolChoiceFunction | ToolChoiceCustom | str | None, tools: Tools
) -> tuple[Any, CustomTool | None]:
    """The chat tool_choice, and the custom tool it forces (if it forces one)."""
    if not isinstance(choice, ToolChoiceFunction | ToolChoiceCustom):
        return choice, None
    name = tools.resolve(chat_name(choice.name, choice.namespace))
    if name is None:
        hosted = tools.hosted.get(choice.name)
        if hosted is not None:
            raise InvalidRequest(
                f"tool_choice forces the hosted tool type '{hosted}', which this server does not run:"
                " only function and custom tools can be forced.",
                param="tool_choice",
            )
        raise InvalidRequest(
            f"Invalid value for 'tool_choice': no {choice.type} tool named '{choice.name}' in 'tools'.",
            param="tool_choice",
        )
    if tools.refs[name].kind != choice.type:
        raise InvalidRequest(
            f"Invalid value for 'tool_choice': '{choice.name}' is a {tools.refs[name].kind} tool,"
            f" not a {choice.type} tool.",
            param="tool_choice",
        )
    return {"type": "function", "function": {"name": name}}, tools.custom.get(name)


def force_custom(job: Job, tool: CustomTool) -> Job:
    """The job of a request that forces a custom tool: its output is the tool's input text,
    under the tool's grammar (Lark or regex; free text without one), not the JSON arguments
    object `prepare_chat` constrained it to."""
    grammar = tool.grammar
    structured = None
    if grammar is not None and grammar.syntax == "lark":
        structured = StructuredOutput(grammar=grammar.definition)
    elif grammar is not None:
        structured = StructuredOutput(regex=grammar.definition)
    requests = tuple(replace(r, sampling=replace(r.sampling, structured=structured)) for r in job.requests)
    return replace(job, requests=requests, turn=replace(job.turn, forced_text=CUSTOM_INPUT))


@dataclass(frozen=True)
class Translated:
    chat: ChatCompletionRequest
    conversation: list[dict[str, Any]]  # the chat messages before the output, without instructions
    echo: dict[str, Any]  # the request's fields that the response object repeats
    tools: dict[str, ToolRef] = field(default_factory=dict)  # chat tool name -> the client's tool
    forced_custom: CustomTool | None = None  # tool_choice forces this custom tool (see force_custom)


def translate(req: ResponsesRequest, history: Sequence[dict[str, Any]] = ()) -> Translated:
    """The chat request to run; `history` is the stored conversation of previous_response_id."""
    items = req.items
    if not items:
        raise InvalidRequest("input must not be empty.", param="input")
    tools = tools_of(req.tools)
    choice, forced_custom = _tool_choice(req.tool_choice, tools)
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
    if tools.chat:
        chat["tools"] = tools.chat
    if choice is not None:
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
    return Translated(
        chat=chat_req, conversation=conversation, echo=_echo(req, tools), tools=tools.refs, forced_custom=forced_custom
    )


def _echo(req: ResponsesRequest, tools: Tools) -> dict[str, Any]:
    choice = req.tool_choice
    fmt = req.text.format if req.text is not None else None
    text: dict[str, Any] = {"format": fmt.echo() if fmt is not None else {"type": "text"}}
    if req.text is not None and req.text.verbosity is not None:
        text["verbosity"] = req.text.verbosity
    hints: dict[str, Any] = {}
    if req.prompt_cache_key is not None:
        hints["prompt_cache_key"] = req.prompt_cache_key
    if req.service_tier is not None:
        hints["service_tier"] = "default"  # the one tier there is
    return {
        **hints,
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
        "text": text,
        "tool_choice": choice.model_dump(exclude_none=True) if isinstance(choice, BaseModel) else (choice or "auto"),
        "tools": tools.echo,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "truncation": "disabled",
        "user": req.user,
    }
