"""/v1/responses without a server: request validation, translation to chat, the output
items and their stream events (checked against the openai SDK's own models), the store."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.exceptions import RequestValidationError
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from engine_adapter.base import ChoiceDelta, EngineChunk, EngineUnavailable
from gateway.errors import InvalidRequest, from_exception
from gateway.http.errors import validation_message as _validation_message
from gateway.http.responses.output import OutputItems, ResponseEncoder
from gateway.http.responses.schemas import ResponsesRequest, parse
from gateway.http.responses.translate import output_messages, to_messages, translate
from gateway.job import Meter
from gateway.lifecycle.generate import metered
from gateway.responses_store import MemoryResponseStore, StoredResponse
from gateway.text.assistant import (
    ContentDelta,
    ReasoningDelta,
    ToolCallArgs,
    ToolCallEnd,
    ToolCallStart,
    TurnSpec,
)

EVENT = TypeAdapter(ResponseStreamEvent)
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def req(**kw: Any) -> ResponsesRequest:
    return parse(json.dumps({"model": "m", "input": "hi", **kw}).encode())


def bad(**kw: Any) -> tuple[str, str | None, str]:
    """(message, param, code) of the 400 a body gets."""
    with pytest.raises(RequestValidationError) as e:
        req(**kw)
    return _validation_message(e.value)


# --- validation -------------------------------------------------------------------------


def test_unknown_fields_ignored_and_defaults() -> None:
    r = req(include=["reasoning.encrypted_content"], truncation="auto", service_tier="auto")
    assert r.store is True and r.parallel_tool_calls is True and r.tool_choice is None
    assert [i.model_dump() for i in r.items] == [{"type": "message", "role": "user", "content": "hi"}]


def test_unknown_item_type_is_named_at_its_place() -> None:
    message, param, _ = bad(input=[{"role": "user", "content": "x"}, {"type": "web_search_call", "id": "ws_1"}])
    assert param == "input[1]"
    assert "web_search_call" in message


def test_item_errors_name_the_field_not_the_union() -> None:
    _, param, code = bad(input=[{"type": "function_call", "name": "f", "arguments": "{}"}])
    assert (param, code) == ("input[0].call_id", "missing_required_parameter")
    _, param, _ = bad(input=[{"role": "user", "content": [{"type": "input_text", "text": 5}]}])
    assert param == "input[0].content[0].text"
    _, param, _ = bad(input=[{"role": "robot", "content": "x"}])
    assert param == "input[0].role"
    _, param, _ = bad(input=7)
    assert param == "input"


def test_bad_options_name_their_param() -> None:
    assert bad(tool_choice={"type": "web_search_preview"})[1] == "tool_choice"
    assert bad(text={"format": {"type": "json_schema", "name": "x"}})[1] == "text.format"
    assert bad(reasoning={"effort": "extreme"})[1] == "reasoning.effort"
    assert bad(max_output_tokens=0)[1] == "max_output_tokens"
    assert bad(background=True)[1] == "background"
    assert bad(input=None)[1] == "input"
    with pytest.raises(RequestValidationError) as e:
        parse(b"{not json")
    assert _validation_message(e.value)[2] == "invalid_json"


# --- translation ------------------------------------------------------------------------


def test_string_input_and_instructions() -> None:
    t = translate(req(instructions="Be terse.", max_output_tokens=9, temperature=0.5, user="u"))
    assert [m.role for m in t.chat.messages] == ["system", "user"]
    assert t.chat.messages[0].content == "Be terse."
    assert t.chat.requested_max_tokens == 9 and t.chat.temperature == 0.5 and t.chat.user == "u"
    assert t.conversation == [{"role": "user", "content": "hi"}]  # instructions are not carried over


def test_items_to_chat_messages() -> None:
    items = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hmm"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
        {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": '{"city":"Paris"}'},
        {"type": "function_call", "call_id": "call_2", "name": "weather", "arguments": '{"city":"Rome"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "rain"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]},  # no assistant follows: dropped
        {"role": "user", "content": "thanks"},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "call again"}]},
        {"type": "function_call", "call_id": "call_3", "name": "weather", "arguments": "{}"},
    ]
    t = translate(req(input=items))
    assert t.conversation == [
        {"role": "developer", "content": "rules"},
        {"role": "user", "content": "ab"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "reasoning_content": "hmm",
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Paris"}'}},
                {"id": "call_2", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Rome"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "rain"},
        {"role": "user", "content": "thanks"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "call again",
            "tool_calls": [{"id": "call_3", "type": "function", "function": {"name": "weather", "arguments": "{}"}}],
        },
    ]
    assert len(t.chat.messages) == 7  # the chat schema takes them as they are


def test_unsupported_content_is_refused() -> None:
    r = req(input=[{"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}])
    with pytest.raises(InvalidRequest) as e:
        translate(r)
    assert e.value.param == "input[0].content[0].type" and e.value.code == "unsupported_content"
    r = req(input=[{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}])
    with pytest.raises(InvalidRequest) as e:
        translate(r)
    assert e.value.param == "input[0].content[0].image_url" and e.value.code == "missing_required_parameter"


def test_an_input_image_becomes_an_image_url_part_in_its_place() -> None:
    image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"}
    output = [{"type": "input_text", "text": "shot:"}, image]
    r = req(
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "look "}, image]},
            {"type": "function_call", "call_id": "c1", "name": "shot", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": output},
        ]
    )
    messages = [m.model_dump(exclude_none=True) for m in translate(r).chat.messages]
    part = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    assert messages[0]["content"] == [{"type": "text", "text": "look "}, part]
    assert messages[2]["role"] == "tool" and messages[2]["content"] == [{"type": "text", "text": "shot:"}, part]
    with pytest.raises(InvalidRequest) as e:
        translate(req(input=[]))
    assert e.value.param == "input"


def test_tools_and_tool_choice() -> None:
    tool = {"type": "function", "name": "weather", "description": "d", "parameters": WEATHER, "strict": True}
    t = translate(req(tools=[tool], tool_choice={"type": "function", "name": "weather"}, parallel_tool_calls=False))
    assert t.chat.tools is not None
    assert t.chat.tools[0].model_dump(exclude_none=True) == {
        "type": "function",
        "function": {"name": "weather", "description": "d", "parameters": WEATHER, "strict": True},
    }
    assert t.chat.forced_function == "weather" and t.chat.parallel_tool_calls is False
    assert t.echo["tools"] == [tool] and t.echo["tool_choice"] == {"type": "function", "name": "weather"}
    assert translate(req(tools=[tool], tool_choice="required")).chat.tool_choice == "required"
    assert translate(req()).echo["tool_choice"] == "auto"


def test_hosted_tools_are_echoed_not_offered() -> None:
    for kind in ("web_search", "file_search", "computer_use_preview", "code_interpreter"):
        t = translate(req(tools=[{"type": kind}]))
        assert t.chat.tools is None and t.echo["tools"] == [{"type": kind}]
    with pytest.raises(InvalidRequest) as e:
        translate(req(tools=[{"name": "no_type"}]))
    assert e.value.param == "tools[0].type"
    with pytest.raises(RequestValidationError) as v:
        translate(req(tools=[{"type": "function", "name": "no spaces allowed"}]))
    assert _validation_message(v.value)[1] == "tools[0].name"


def test_text_format_and_reasoning() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    t = translate(req(text={"format": {"type": "json_schema", "name": "thing", "schema": schema, "strict": True}}))
    rf = t.chat.response_format
    assert rf is not None and rf.type == "json_schema" and rf.json_schema is not None
    assert rf.json_schema.schema_ == schema and rf.json_schema.name == "thing"
    assert t.echo["text"] == {"format": {"type": "json_schema", "name": "thing", "schema": schema, "strict": True}}
    t = translate(req(text={"format": {"type": "json_object"}}))
    assert t.chat.response_format is not None and t.chat.response_format.type == "json_object"
    assert translate(req(text={"format": {"type": "text"}})).chat.response_format is None
    off = translate(req(reasoning={"effort": "none"}))
    assert off.chat.thinking is False and off.echo["reasoning"] == {"effort": "none", "summary": None}
    assert translate(req(reasoning={"effort": "high", "summary": "auto"})).chat.thinking is True
    assert translate(req()).chat.thinking is None


def test_history_goes_first_after_instructions() -> None:
    history = [{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"}]
    t = translate(req(instructions="sys", input="three", previous_response_id="resp_x"), history)
    assert [(m.role, m.content) for m in t.chat.messages] == [
        ("system", "sys"),
        ("user", "one"),
        ("assistant", "two"),
        ("user", "three"),
    ]
    assert t.conversation == [*history, {"role": "user", "content": "three"}]
    assert t.echo["previous_response_id"] == "resp_x"


# --- output items and events --------------------------------------------------------------


def test_event_sequence_for_each_item_kind() -> None:
    items = OutputItems()
    events = items.apply(
        [
            ReasoningDelta("think"),
            ReasoningDelta("ing"),
            ContentDelta("Hello"),
            ToolCallStart(0, "call_a", "weather"),
            ToolCallArgs(0, '{"city": '),
            ToolCallArgs(0, '"Paris"}'),
            ToolCallEnd(0, '{"city": "Paris"}'),
            ContentDelta("bye"),
        ]
    )
    events += items.close("completed")
    assert [(e["type"], e.get("output_index")) for e in events] == [
        ("response.output_item.added", 0),
        ("response.content_part.added", 0),
        ("response.reasoning_text.delta", 0),
        ("response.reasoning_text.delta", 0),
        ("response.reasoning_text.done", 0),
        ("response.content_part.done", 0),
        ("response.output_item.done", 0),
        ("response.output_item.added", 1),
        ("response.content_part.added", 1),
        ("response.output_text.delta", 1),
        ("response.output_text.done", 1),
        ("response.content_part.done", 1),
        ("response.output_item.done", 1),
        ("response.output_item.added", 2),
        ("response.function_call_arguments.delta", 2),
        ("response.function_call_arguments.delta", 2),
        ("response.function_call_arguments.done", 2),
        ("response.output_item.done", 2),
        ("response.output_item.added", 3),
        ("response.content_part.added", 3),
        ("response.output_text.delta", 3),
        ("response.output_text.done", 3),
        ("response.content_part.done", 3),
        ("response.output_item.done", 3),
    ]
    for i, e in enumerate(events):
        EVENT.validate_python({**e, "sequence_number": i})  # the SDK's models, strictly
    reasoning, message, call, last = items.output
    assert reasoning["id"].startswith("rs_") and reasoning["summary"] == []
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "thinking"}]
    assert message["id"].startswith("msg_") and message["role"] == "assistant" and message["status"] == "completed"
    assert message["content"] == [{"type": "output_text", "text": "Hello", "annotations": []}]
    assert call["id"].startswith("fc_") and call["call_id"] == "call_a" and call["name"] == "weather"
    assert call["arguments"] == '{"city": "Paris"}' and call["status"] == "completed"
    assert last["content"][0]["text"] == "bye"
    # Each item id is the same in its added and done events and in the output.
    assert events[0]["item"]["id"] == events[6]["item"]["id"] == reasoning["id"]


def test_cut_short_item_is_incomplete() -> None:
    items = OutputItems()
    items.apply([ContentDelta("partial")])
    done = items.close("incomplete")
    assert done[-1]["item"]["status"] == "incomplete" and items.output[0]["status"] == "incomplete"
    assert OutputItems().close("completed") == []


def test_output_becomes_the_next_turns_messages() -> None:
    items = OutputItems()
    items.apply([ReasoningDelta("r"), ContentDelta("text"), ToolCallStart(0, "call_z", "f"), ToolCallEnd(0, "{}")])
    items.close("completed")
    assert output_messages(items.output) == [
        {
            "role": "assistant",
            "content": "text",
            "reasoning_content": "r",
            "tool_calls": [{"id": "call_z", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        }
    ]
    assert to_messages([]) == []


# --- the encoders, on a fake job ------------------------------------------------------------


def fake_job(turn: TurnSpec | None = None) -> Any:
    served = SimpleNamespace(
        name="tiny",
        engine=SimpleNamespace(kv_spec=SimpleNamespace(block_size=16)),
        settings=SimpleNamespace(enable_prefix_caching=True),
    )
    return SimpleNamespace(
        prompts=([0] * 40,), turn=turn or TurnSpec(), created=1700000000, served=served, meter=Meter()
    )


async def chunks_of(pieces: list[str], finish: str, fail: bool = False) -> AsyncIterator[tuple[int, EngineChunk]]:
    for k, text in enumerate(pieces):
        last = k == len(pieces) - 1
        delta = ChoiceDelta(index=0, text=text, token_ids=(1,), finish_reason=finish if last else None)
        yield 0, EngineChunk(choices=(delta,), finished=last, prompt_tokens=40, num_cached_tokens=16)
        if fail and k == 0:
            raise EngineUnavailable("engine died")


def encoder(saved: list[Any]) -> ResponseEncoder:
    async def save(body: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        saved.append((body, messages))

    echo = translate(req(max_output_tokens=3)).echo
    return ResponseEncoder(id="resp_1", echo=echo, conversation=[{"role": "user", "content": "hi"}], save=save)


def stream_events(enc: ResponseEncoder, job: Any, chunks: AsyncIterator[tuple[int, EngineChunk]]) -> list[Any]:
    """The stream's events; an error ends it with the encoder's `stream_error`, as the lifecycle
    calls it (gateway/lifecycle/run.py). The chunks are metered on the way, as when serving."""

    async def collect() -> list[str]:
        lines = []
        try:
            async for line in enc.stream(job, metered(job, chunks)):
                lines.append(line)
        except Exception as e:
            lines.append(enc.stream_error(from_exception(e)))
        return lines

    out = []
    for frame in "".join(asyncio.run(collect())).split("\n\n"):
        if not frame:
            continue
        head, data = frame.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert head == f"event: {event['type']}"
        out.append(EVENT.validate_python(event))
    return out


def test_stream_frames_and_sequence_numbers() -> None:
    saved: list[Any] = []
    thinking = TurnSpec(reasoning="maybe")
    pieces = ["<think>\nhm", "m</think>\n\nHel", "lo"]
    events = stream_events(encoder(saved), fake_job(thinking), chunks_of(pieces, "stop"))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "response.reasoning_text.delta" in kinds and "response.output_text.delta" in kinds
    final = events[-1].response
    assert final.status == "completed" and final.id == "resp_1" and final.output_text == "Hello"
    assert final.usage is not None and final.usage.input_tokens == 40 and final.usage.output_tokens == 3
    assert final.usage.input_tokens_details.cached_tokens == 16
    assert final.usage.input_tokens_details.cache_write_tokens == 16  # 39 // 16 blocks, one of them cached
    assert final.usage.total_tokens == 43
    [(body, messages)] = saved
    assert body["id"] == "resp_1" and body["status"] == "completed"
    assert messages == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello", "reasoning_content": "hmm"},
    ]


def test_length_finish_is_incomplete() -> None:
    events = stream_events(encoder([]), fake_job(), chunks_of(["a", "b", "c"], "length"))
    assert events[-1].type == "response.incomplete"
    resp = events[-1].response
    assert resp.status == "incomplete" and resp.incomplete_details is not None
    assert resp.incomplete_details.reason == "max_output_tokens" and resp.output_text == "abc"
    assert resp.max_output_tokens == 3


def test_error_mid_stream_is_reported_in_band() -> None:
    saved: list[Any] = []
    events = stream_events(encoder(saved), fake_job(), chunks_of(["a", "b"], "stop", fail=True))
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2].code == "engine_unavailable" and "engine died" in events[-2].message
    assert events[-1].response.status == "failed" and saved == []


def test_complete_body_parses_with_the_sdk() -> None:
    saved: list[Any] = []
    call = '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    turn = TurnSpec(tool_format="hermes", tools={"weather": WEATHER})
    job = fake_job(turn)
    body = asyncio.run(encoder(saved).complete(job, metered(job, chunks_of(["Sure.\n", call], "stop"))))
    r = Response.model_validate(body)  # strictly: every field the SDK requires is there
    assert r.object == "response" and r.status == "completed" and r.model == "tiny"
    message, fc = r.output
    assert message.type == "message" and r.output_text == "Sure."
    assert fc.type == "function_call" and fc.name == "weather" and json.loads(fc.arguments) == {"city": "Oslo"}
    assert fc.call_id.startswith("call_") and fc.id is not None and fc.id.startswith("fc_")
    assert r.tool_choice == "auto" and r.parallel_tool_calls is True and r.temperature == 1.0
    assert saved[0][1][-1]["tool_calls"][0]["function"]["name"] == "weather"


# --- the store ------------------------------------------------------------------------------


def test_memory_store_is_bounded_in_bytes() -> None:
    store = MemoryResponseStore(ttl_s=10, max_stored=100, max_bytes=1000)

    def record(chars: int) -> StoredResponse:
        return StoredResponse(user="ann", response={}, messages=[{"role": "user", "content": "x" * chars}])

    async def run() -> None:
        for i in range(3):
            await store.put(f"resp_{i}", record(300))  # about 370 characters each
        assert len(store) == 2 and await store.get("resp_0") is None and store.bytes <= 1000
        await store.put("resp_big", record(2000))  # larger than the whole bound: not kept
        assert await store.get("resp_big") is None and len(store) == 2
        assert await store.delete("resp_1") and len(store) == 1
        assert store.bytes == len(record(300).to_json())

    asyncio.run(run())


def test_memory_store_ttl_bound_and_copies() -> None:
    now = [0.0]
    store = MemoryResponseStore(ttl_s=10, max_stored=2, clock=lambda: now[0])

    async def run() -> None:
        record = StoredResponse(user="ann", response={"id": "resp_a"}, messages=[{"role": "user", "content": "x"}])
        await store.put("resp_a", record)
        got = await store.get("resp_a")
        assert got == record
        assert got is not None
        got.messages.append({"role": "user", "content": "changed"})  # a reader's copy
        assert (await store.get("resp_a")) == record
        now[0] = 5
        await store.put("resp_b", record)
        await store.put("resp_c", record)  # over the bound: the oldest goes
        assert await store.get("resp_a") is None and len(store) == 2
        now[0] = 12  # resp_b and resp_c were written at 5: still there
        assert await store.get("resp_b") is not None
        now[0] = 15
        assert await store.get("resp_b") is None and len(store) == 0
        await store.put("resp_d", record)
        assert await store.delete("resp_d") is True
        assert await store.delete("resp_d") is False

    asyncio.run(run())


def test_reasoning_as_summary_when_asked() -> None:
    items = OutputItems(summary=True)
    events = items.apply([ReasoningDelta("a"), ReasoningDelta("b"), ContentDelta("c")]) + items.close("completed")
    kinds = [e["type"] for e in events]
    assert kinds[:9] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
    ]
    assert kinds[9:12] == [
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
    ]
    for i, e in enumerate(events):
        EVENT.validate_python({**e, "sequence_number": i})
    assert items.output[0]["summary"] == [{"type": "summary_text", "text": "ab"}]
    assert items.output[0]["content"] == [{"type": "reasoning_text", "text": "ab"}]
