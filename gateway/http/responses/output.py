"""A job's engine output as a Responses API answer: one response object, or its
server-sent events (`event: <type>\\ndata: <json>\\n\\n`, each with a `sequence_number`).

The output text is read with the job's `TurnParser` (gateway/text/assistant.py); its
events become output items, one open at a time (the state machine Messages shares,
gateway/http/blocks.py):

    ReasoningDelta   -> a `reasoning` item: its text as `reasoning_text` content, and as
                        its one `summary_text` when the request asks for a summary
                        (`reasoning.summary`): a Qwen model writes no summary of its own,
                        and its reasoning is the closest stand-in (LangChain, for one,
                        shows reasoning only from summaries)
    ContentDelta     -> a `message` item (one `output_text` part)
    ToolCallStart    -> a `function_call` item; ToolCallArgs its arguments; ToolCallEnd closes it.
                        A call of a namespaced tool (offered as `{namespace}__{name}`) is named
                        `name` and carries `namespace`; a call of a custom tool is a
                        `custom_tool_call` item whose `input` is the `input` argument's text.

With `include: ["reasoning.encrypted_content"]` a reasoning item also carries
`encrypted_content`: the reasoning text in base64 (a stateless client such as Codex sends it
back, and responses_input.py reads it as the reasoning). With `parallel_tool_calls: false`
the parser keeps only a turn's first call (`TurnSpec.parallel`), as vLLM's server does it.

Streamed, per item: `response.output_item.added`, then for text items
`response.content_part.added`, the deltas (`response.output_text.delta` /
`response.reasoning_text.delta`), their `.done`, `response.content_part.done` (and with a
summary, `response.reasoning_summary_part.added`, `.reasoning_summary_text.delta` / `.done`,
`.reasoning_summary_part.done`); for calls
`response.function_call_arguments.delta` / `.done` (custom tools:
`response.custom_tool_call_input.delta` / `.done`); then `response.output_item.done`. The
stream opens with `response.created` and `response.in_progress` and ends with
`response.completed`, or `response.incomplete` when the output hit its token limit. An
error after the stream started is an `error` event, then `response.failed`.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from engine_adapter.base import EngineChunk
from gateway.errors import GatewayError
from gateway.http.blocks import Block, OneOpen, TextKind
from gateway.http.responses.schemas import encode_reasoning
from gateway.http.responses.translate import CUSTOM_INPUT, ToolRef, output_messages
from gateway.http.sse import new_id, sse
from gateway.http.tally import Tally
from gateway.job import Job
from gateway.text.assistant import ToolCallStart, TurnParser

Status = Literal["in_progress", "completed", "incomplete", "failed"]
# Stores a finished response object with the conversation that continues it.
Save = Callable[[dict[str, Any], list[dict[str, Any]]], Awaitable[None]]


# --- output items ------------------------------------------------------------------------


def message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": []}]
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def reasoning_item(
    item_id: str, text: str | None, status: str, *, summary: bool = False, encrypted: bool = False
) -> dict[str, Any]:
    content = [] if text is None else [{"type": "reasoning_text", "text": text}]
    summaries = [{"type": "summary_text", "text": text}] if summary and text is not None else []
    item = {"id": item_id, "type": "reasoning", "summary": summaries, "content": content, "status": status}
    if encrypted and text is not None:
        item["encrypted_content"] = encode_reasoning(text)
    return item


def call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str, namespace: str | None = None
) -> dict[str, Any]:
    item = {
        "id": item_id,
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }
    if namespace is not None:
        item["namespace"] = namespace
    return item


def custom_call_item(
    item_id: str, call_id: str, name: str, text: str, status: str, namespace: str | None = None
) -> dict[str, Any]:
    item = {"id": item_id, "type": "custom_tool_call", "call_id": call_id, "name": name, "input": text}
    if namespace is not None:
        item["namespace"] = namespace
    return {**item, "status": status}


# The arguments of a custom tool's call, `{"input": "...`, up to the string's text.
_INPUT_OPEN = re.compile(r'\s*\{\s*"' + CUSTOM_INPUT + r'"\s*:\s*"')
_ESCAPE = re.compile(r"\\(?:u[0-9a-fA-F]{4}|[^u])")


def input_so_far(arguments: str) -> str:
    """The `input` string's text that a custom tool call's arguments hold so far (as they
    stream: the string may be unfinished); "" when they do not start `{"input": "`."""
    m = _INPUT_OPEN.match(arguments)
    if m is None:
        return ""
    body, i, end = arguments, m.end(), m.end()
    while i < len(body) and body[i] != '"':
        if body[i] == "\\":
            esc = _ESCAPE.match(body, i)
            if esc is None:  # cut inside an escape: wait for the rest
                break
            i = esc.end()
        else:
            i += 1
        end = i
    text: str = json.loads('"' + body[m.end() : end] + '"')
    if text and "\ud800" <= text[-1] <= "\udbff":  # half a surrogate pair: its other half is to come
        text = text[:-1]
    return text


def custom_input(arguments: str) -> str:
    """A custom tool call's input, from the whole arguments: the `input` string (or the only
    string there is); arguments of any other shape are the input as they are."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(value, dict):
        if isinstance(value.get(CUSTOM_INPUT), str):
            return str(value[CUSTOM_INPUT])
        strings = [v for v in value.values() if isinstance(v, str)]
        if len(value) == 1 and strings:
            return strings[0]
    return arguments


@dataclass
class _Open(Block):
    id: str = ""
    call_id: str = ""
    name: str = ""
    namespace: str | None = None
    custom: bool = False  # a custom tool's call (its input streams as text), not a function's
    sent: str = ""  # a custom tool call's input, as streamed so far


class OutputItems(OneOpen[_Open]):
    """Parser events -> output items (`output`, closed ones) and the stream events that
    build them (returned by `apply` and `close`, without their sequence numbers):
    `reasoning`, `message`, `function_call` and `custom_tool_call` items."""

    def __init__(
        self,
        *,
        summary: bool = False,
        tools: Mapping[str, ToolRef] | None = None,
        encrypted: bool = False,
    ) -> None:
        super().__init__()
        self.summary = summary  # reasoning as its summary too
        self.tools = tools or {}  # the chat tool names that stand for custom or namespaced tools
        self.encrypted = encrypted  # reasoning items carry encrypted_content

    @property
    def output(self) -> list[dict[str, Any]]:
        return self.closed

    def _start_text(self, kind: TextKind, index: int, out: list[dict[str, Any]]) -> _Open:
        item = _Open(kind, index, id=new_id("msg" if kind == "content" else "rs"))
        added = (
            message_item(item.id, None, "in_progress")
            if kind == "content"
            else reasoning_item(item.id, None, "in_progress")
        )
        out.append({"type": "response.output_item.added", "output_index": index, "item": added})
        out.append(
            {
                "type": "response.content_part.added",
                "item_id": item.id,
                "output_index": index,
                "content_index": 0,
                "part": _part(kind, ""),
            }
        )
        if kind == "reasoning" and self.summary:
            part = {"type": "summary_text", "text": ""}
            where = {"item_id": item.id, "output_index": index, "summary_index": 0}
            out.append({"type": "response.reasoning_summary_part.added", **where, "part": part})
        return item

    def _text_delta(self, item: _Open, text: str, out: list[dict[str, Any]]) -> None:
        where = {"item_id": item.id, "output_index": item.index, "content_index": 0}
        if item.kind == "content":
            out.append({"type": "response.output_text.delta", **where, "delta": text, "logprobs": []})
            return
        out.append({"type": "response.reasoning_text.delta", **where, "delta": text})
        if self.summary:
            summary = {"item_id": item.id, "output_index": item.index, "summary_index": 0}
            out.append({"type": "response.reasoning_summary_text.delta", **summary, "delta": text})

    def _start_call(self, e: ToolCallStart, index: int, out: list[dict[str, Any]]) -> _Open:
        """Open the item of a call: a function call, or a custom tool's; named as the client named it."""
        ref = self.tools.get(e.name) or ToolRef("function", e.name)
        custom = ref.kind == "custom"
        item = _Open("call", index, id=new_id("ctc" if custom else "fc"), call_id=e.id, name=ref.name, custom=custom)
        if custom:
            added = custom_call_item(item.id, e.id, ref.name, "", "in_progress", ref.namespace)
        else:
            added = call_item(item.id, e.id, ref.name, "", "in_progress", ref.namespace)
        item.namespace = ref.namespace
        out.append({"type": "response.output_item.added", "output_index": index, "item": added})
        return item

    def _call_delta(self, item: _Open, delta: str, out: list[dict[str, Any]]) -> None:
        where = {"item_id": item.id, "output_index": item.index}
        if not item.custom:
            out.append({"type": "response.function_call_arguments.delta", **where, "delta": delta})
            return
        text = input_so_far(item.text)
        if len(text) > len(item.sent) and text.startswith(item.sent):
            sent, item.sent = text[len(item.sent) :], text
            out.append({"type": "response.custom_tool_call_input.delta", **where, "delta": sent})

    def _stop(self, item: _Open, status: str, out: list[dict[str, Any]]) -> dict[str, Any]:
        where = {"item_id": item.id, "output_index": item.index}
        text = item.text
        if item.kind == "call" and not item.custom:
            out.append({"type": "response.function_call_arguments.done", **where, "arguments": text})
            done = call_item(item.id, item.call_id, item.name, text, status, item.namespace)
        elif item.kind == "call":
            text = custom_input(text)
            out.append({"type": "response.custom_tool_call_input.done", **where, "input": text})
            done = custom_call_item(item.id, item.call_id, item.name, text, status, item.namespace)
        elif item.kind == "content":
            out.append({"type": "response.output_text.done", **where, "content_index": 0, "text": text, "logprobs": []})
            out.append(
                {"type": "response.content_part.done", **where, "content_index": 0, "part": _part("content", text)}
            )
            done = message_item(item.id, text, status)
        else:
            out.append({"type": "response.reasoning_text.done", **where, "content_index": 0, "text": text})
            part = _part("reasoning", text)
            out.append({"type": "response.content_part.done", **where, "content_index": 0, "part": part})
            if self.summary:
                summary = {**where, "summary_index": 0}
                out.append({"type": "response.reasoning_summary_text.done", **summary, "text": text})
                part = {"type": "summary_text", "text": text}
                out.append({"type": "response.reasoning_summary_part.done", **summary, "part": part})
            done = reasoning_item(item.id, text, status, summary=self.summary, encrypted=self.encrypted)
        out.append({"type": "response.output_item.done", "output_index": item.index, "item": done})
        return done


def _part(kind: TextKind, text: str) -> dict[str, Any]:
    if kind == "content":
        return {"type": "output_text", "text": text, "annotations": []}
    return {"type": "reasoning_text", "text": text}


# --- the response object -------------------------------------------------------------------


def _usage(tally: Tally, reasoning_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": tally.prompt_tokens,
        "input_tokens_details": {"cached_tokens": tally.cached_tokens, "cache_write_tokens": tally.written_tokens},
        "output_tokens": tally.output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": tally.prompt_tokens + tally.output_tokens,
    }


def _status(tally: Tally) -> Status:
    return "incomplete" if tally.finish_reason == "length" else "completed"


@dataclass
class ResponseEncoder:
    """One request's encoders (`complete`, `stream`, the shapes `gateway.http.serving.answer`
    takes), with what the response object needs beyond the job."""

    id: str
    echo: dict[str, Any]  # the request's fields the response repeats
    conversation: list[dict[str, Any]]  # chat messages before this output (stored with it)
    save: Save | None = None  # store:true -- called with the finished response before it is sent
    summary: bool = False  # reasoning.summary was asked for: the reasoning is its summary too
    tools: Mapping[str, ToolRef] = field(default_factory=dict)  # chat tool name -> the client's tool
    encrypted: bool = False  # include: reasoning.encrypted_content
    _run: _Streamed | None = field(default=None, init=False, repr=False)

    def _items(self) -> OutputItems:
        return OutputItems(summary=self.summary, tools=self.tools, encrypted=self.encrypted)

    def body(
        self,
        job: Job,
        *,
        status: Status,
        output: list[dict[str, Any]],
        usage: dict[str, Any] | None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "response",
            "created_at": job.created,
            "status": status,
            "background": False,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "model": job.served.name,
            "output": output,
            "usage": usage,
            **({"completed_at": int(time.time())} if status == "completed" else {}),
            **self.echo,
        }

    async def _finish(self, job: Job, items: OutputItems, tally: Tally, parser: TurnParser) -> dict[str, Any]:
        job.meter.reasoning_tokens = parser.reasoning_tokens
        body = self.body(job, status=_status(tally), output=items.output, usage=_usage(tally, parser.reasoning_tokens))
        if self.save is not None:
            await self.save(body, [*self.conversation, *output_messages(items.output)])
        return body

    async def complete(self, job: Job, chunks: AsyncIterator[tuple[int, EngineChunk]]) -> dict[str, Any]:
        tally, items, parser = Tally.of(job), self._items(), TurnParser(job.turn)
        async for _, chunk in chunks:
            tally.observe(chunk)
            for c in chunk.choices:
                items.apply(parser.feed(c.text, c.token_ids))
        items.apply(parser.finish())
        items.close(_status(tally))
        return await self._finish(job, items, tally, parser)

    async def stream(self, job: Job, chunks: AsyncIterator[tuple[int, EngineChunk]]) -> AsyncIterator[str]:
        run = self._run = _Streamed(job, Tally.of(job), self._items(), TurnParser(job.turn))
        opening = self.body(job, status="in_progress", output=[], usage=None)
        yield run.event({"type": "response.created", "response": opening})
        yield run.event({"type": "response.in_progress", "response": opening})
        async for _, chunk in chunks:
            run.tally.observe(chunk)
            for c in chunk.choices:
                for e in run.items.apply(run.parser.feed(c.text, c.token_ids)):
                    yield run.event(e)
        for e in [*run.items.apply(run.parser.finish()), *run.items.close(_status(run.tally))]:
            yield run.event(e)
        body = await self._finish(job, run.items, run.tally, run.parser)
        yield run.event({"type": f"response.{body['status']}", "response": body})

    def stream_error(self, err: GatewayError) -> str:
        """A stream's end after an error: an `error` event, then `response.failed` with the
        output so far (the lifecycle calls it; the status line is gone)."""
        run = self._run
        assert run is not None, "stream_error follows stream"
        failed = self.body(
            run.job,
            status="failed",
            output=run.items.output,
            usage=_usage(run.tally, run.parser.reasoning_tokens),
            error={"code": "server_error", "message": err.message},
        )
        return run.event({"type": "error", "code": err.code, "message": err.message, "param": err.param}) + run.event(
            {"type": "response.failed", "response": failed}
        )


@dataclass
class _Streamed:
    """A stream's state, kept for the error that may end it."""

    job: Job
    tally: Tally
    items: OutputItems
    parser: TurnParser
    seq: int = 0

    def event(self, e: dict[str, Any]) -> str:
        line = sse({"type": e["type"], "sequence_number": self.seq, **e}, named=True)
        self.seq += 1
        return line
