"""POST/GET/DELETE /v1/responses through the real test server (tiny vLLM engines), driven by
the official OpenAI SDK: its models must parse every response object and stream event.

The model has random weights: its text is noise, and it never decides to stop or to call
a tool by itself. A JSON format or a forced function puts it under a grammar, which
does terminate (bounded strings, see tests/api/test_tools.py)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import API_KEY, DENSE, OTHER_KEY, Server

pytestmark = pytest.mark.engine  # starts a vLLM engine

MODEL = DENSE  # the session server's dense engine
WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
JSON_OBJECT: Any = {"format": {"type": "json_object"}}
LONG = "Tell me about the weather in Paris, Rome, Oslo and Madrid this week, city by city, in detail. " * 16


def sdk(server: Server, key: str = API_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key=key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return sdk(server)


@pytest.fixture(scope="module")
def other(server: Server) -> openai.OpenAI:
    return sdk(server, OTHER_KEY)


def test_text_answer_with_usage(client: openai.OpenAI) -> None:
    r = client.responses.create(model=MODEL, input="hi", max_output_tokens=8, temperature=0)
    assert r.id.startswith("resp_") and r.object == "response" and r.model == MODEL
    assert isinstance(r.output_text, str) and r.output_text
    (message,) = r.output
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert r.usage is not None and r.usage.input_tokens > 0 and r.usage.output_tokens == 8
    assert r.usage.total_tokens == r.usage.input_tokens + 8
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    # Random weights never stop by themselves: the limit ends the answer.
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens" and message.status == "incomplete"
    assert r.max_output_tokens == 8 and r.temperature == 0 and r.store is not False


def test_json_format_completes(client: openai.OpenAI) -> None:
    r = client.responses.create(
        model=MODEL, input="Reply with a JSON object.", text=JSON_OBJECT, max_output_tokens=64, temperature=0
    )
    assert r.status == "completed" and r.incomplete_details is None
    assert isinstance(json.loads(r.output_text), dict)


def test_json_schema_format(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
        "required": ["colour"],
        "additionalProperties": False,
    }
    r = client.responses.create(
        model=MODEL,
        input="Pick a colour.",
        text={"format": {"type": "json_schema", "name": "pick", "schema": schema, "strict": True}},
        max_output_tokens=64,
        temperature=0,
    )
    assert r.status == "completed" and json.loads(r.output_text)["colour"] in ("red", "green", "blue")
    assert r.text is not None and r.text.format is not None and r.text.format.type == "json_schema"


def test_stream_event_sequence(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model=MODEL, input="Reply with a JSON object.", text=JSON_OBJECT, max_output_tokens=64, temperature=0
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert deltas
    shape = [k for i, k in enumerate(kinds) if k != "response.output_text.delta" or kinds[i - 1] != k]
    assert shape == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    seqs = [e.sequence_number for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    text = "".join(d.delta for d in deltas)
    assert isinstance(json.loads(text), dict)
    assert final.status == "completed" and final.output_text == text
    assert final.usage is not None and final.usage.output_tokens > 0


def test_streamed_limit_is_incomplete(client: openai.OpenAI) -> None:
    events = list(client.responses.create(model=MODEL, input="hi", max_output_tokens=4, temperature=0, stream=True))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[0].response.status == "in_progress"
    last = events[-1]
    assert last.type == "response.incomplete"
    assert last.response.status == "incomplete" and last.response.incomplete_details is not None
    assert last.response.incomplete_details.reason == "max_output_tokens"
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_store_get_delete(client: openai.OpenAI, other: openai.OpenAI) -> None:
    r = client.responses.create(model=MODEL, input="hi", max_output_tokens=4, temperature=0, metadata={"k": "v"})
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text and got.metadata == {"k": "v"}
    with pytest.raises(openai.NotFoundError):  # another user's: not found, like an unknown id
        other.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.delete(r.id)
    assert client.responses.retrieve(r.id).id == r.id
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.retrieve(r.id)
    assert e.value.code == "response_not_found"
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(r.id)
    unstored = client.responses.create(model=MODEL, input="hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_previous_response_id_continues(client: openai.OpenAI, other: openai.OpenAI, server: Server) -> None:
    first = client.responses.create(
        model=MODEL, input=LONG, instructions="Be brief.", max_output_tokens=6, temperature=0
    )
    second = client.responses.create(
        model=MODEL,
        input="And tomorrow?",
        instructions="Be brief.",  # not carried over: a client sends them again
        previous_response_id=first.id,
        max_output_tokens=6,
        temperature=0,
    )
    assert first.usage is not None and second.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens + 6
    assert second.previous_response_id == first.id
    # The conversation renders as it was generated: the first prompt's whole blocks are reused.
    block = server.stats()["engines"][MODEL]["kv"]["block_size"]
    assert first.usage.input_tokens >= 2 * block
    assert second.usage.input_tokens_details.cached_tokens >= block
    third = client.responses.create(
        model=MODEL, input="And after?", previous_response_id=second.id, max_output_tokens=2, temperature=0
    )
    assert third.usage is not None and third.usage.input_tokens > second.usage.input_tokens
    with pytest.raises(openai.NotFoundError) as e:
        other.responses.create(model=MODEL, input="x", previous_response_id=first.id, max_output_tokens=2)
    assert e.value.param == "previous_response_id" and first.id in e.value.message
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model=MODEL, input="x", previous_response_id="resp_unknown", max_output_tokens=2)
    assert e.value.param == "previous_response_id"


def test_hosted_tools_are_echoed_and_cannot_be_forced(client: openai.OpenAI) -> None:
    hosted: Any = [{"type": "web_search_preview"}]
    r = client.responses.create(model=MODEL, input="hi", tools=hosted, max_output_tokens=2)
    assert [t.type for t in r.tools] == ["web_search_preview"] and r.status == "incomplete"  # answered, no search
    with pytest.raises(openai.BadRequestError) as e:
        choice: Any = {"type": "web_search_preview"}
        client.responses.create(model=MODEL, input="hi", tools=hosted, tool_choice=choice, max_output_tokens=2)
    assert e.value.param == "tool_choice" and "web_search_preview" in e.value.message


def test_bad_input_names_its_param(server: Server) -> None:
    def post(body: dict[str, Any]) -> httpx.Response:
        headers = {"Authorization": f"Bearer {API_KEY}"}
        return httpx.post(f"{server.api}/responses", json=body, headers=headers, timeout=60)

    r = post({"model": MODEL, "input": [{"role": "user", "content": "x"}, {"type": "bogus_item"}]})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "input[1]" and "bogus_item" in err["message"]
    assert err["type"] == "invalid_request_error"
    r = post({"model": MODEL, "input": [{"type": "function_call_output", "output": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[0].call_id"
    r = post({"model": MODEL, "input": "hi", "tool_choice": {"type": "function", "name": "nope"}, "tools": [WEATHER]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    r = httpx.post(f"{server.api}/responses", json={"model": MODEL, "input": "hi"}, timeout=60)
    assert r.status_code == 401  # the key is checked before anything else


def test_forced_function_call(client: openai.OpenAI) -> None:
    r = client.responses.create(
        model=MODEL,
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=64,
        temperature=0,
    )
    assert r.status == "completed"
    (call,) = r.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.call_id.startswith("call_") and call.id is not None and call.id.startswith("fc_")
    assert set(json.loads(call.arguments)) == {"city"}
    assert r.tool_choice.type == "function" and r.tools[0].type == "function"  # type: ignore[union-attr]
    # The call and its output continue the conversation.
    follow = client.responses.create(
        model=MODEL,
        previous_response_id=r.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}],
        tools=[WEATHER],
        max_output_tokens=4,
        temperature=0,
    )
    assert follow.usage is not None and r.usage is not None and follow.usage.input_tokens > r.usage.input_tokens


def test_forced_function_call_streamed(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model=MODEL,
        input="What is the weather in Paris?",
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        max_output_tokens=96,
        temperature=0,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    assert kinds[-1] == "response.completed"
    calls = [o for o in final.output if o.type == "function_call"]
    assert calls and all(c.name == "get_weather" for c in calls)
    for c in calls:
        assert set(json.loads(c.arguments)) == {"city"}
