"""/v1/responses on what a model writes of its own accord (thinking, tool calls), replayed
from recorded Qwen text (engine_adapter/replay.py) and read by the official OpenAI SDK:
reasoning and function_call items, whole and streamed, and a tool loop continued with
previous_response_id."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from engine_adapter import recordings
from engine_adapter.recordings import tag
from tests.conftest import REPLAY, REPLAY_XML, App

WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
}
REASONING, ANSWER = recordings.THINK.split("</think>")
REASONING = REASONING.removeprefix("<think>").strip("\n")
ANSWER = ANSWER.lstrip("\n")


@pytest.fixture(scope="module")
def client(replay_app: App) -> openai.OpenAI:
    return replay_app.sdk()


def ask(name: str) -> str:
    return f"What is the weather in Paris? {tag(name)}"


def test_reasoning_item_then_message(client: openai.OpenAI) -> None:
    r = client.responses.create(model=REPLAY, input=ask("think"))
    reasoning, message = r.output
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_") and reasoning.summary == []
    assert reasoning.content is not None and [c.text for c in reasoning.content] == [REASONING]
    assert message.type == "message" and r.output_text == ANSWER and r.status == "completed"
    assert r.usage is not None and r.usage.output_tokens_details.reasoning_tokens > 0
    assert r.usage.output_tokens > r.usage.output_tokens_details.reasoning_tokens


def test_reasoning_streamed_and_as_summary(client: openai.OpenAI) -> None:
    with client.responses.stream(model=REPLAY, input=ask("think"), reasoning={"summary": "auto"}) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds.index("response.reasoning_text.delta") < kinds.index("response.output_text.delta")
    streamed = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    summarized = "".join(e.delta for e in events if e.type == "response.reasoning_summary_text.delta")
    assert streamed == summarized == REASONING
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == ANSWER
    reasoning = final.output[0]
    assert reasoning.type == "reasoning" and [s.text for s in reasoning.summary] == [REASONING]
    assert final.output_text == ANSWER and kinds[-1] == "response.completed"


def test_function_call_item(client: openai.OpenAI) -> None:
    r = client.responses.create(model=REPLAY, input=ask("call"), tools=[WEATHER])
    (call,) = r.output
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    assert json.loads(call.arguments) == {"city": "Paris"} and call.call_id.startswith("call_")
    assert r.output_text == ""


def test_function_calls_streamed(client: openai.OpenAI) -> None:
    with client.responses.stream(model=REPLAY, input=ask("think_call"), tools=[WEATHER]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    assert added == ["reasoning", "function_call"]
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and json.loads(done[0].arguments) == {"city": "Paris"}
    reasoning, call = final.output
    assert reasoning.type == "reasoning" and call.type == "function_call" and call.name == "get_weather"
    with client.responses.stream(model=REPLAY, input=ask("parallel"), tools=[WEATHER]) as stream:
        final = stream.get_final_response()
    assert [json.loads(c.arguments)["city"] for c in final.output if c.type == "function_call"] == ["Paris", "Rome"]
    with client.responses.stream(
        model=REPLAY, input=ask("parallel"), tools=[WEATHER], parallel_tool_calls=False
    ) as stream:
        final = stream.get_final_response()
    assert [json.loads(c.arguments)["city"] for c in final.output if c.type == "function_call"] == ["Paris"]


def test_xml_calls_streamed_parameter_by_parameter(client: openai.OpenAI) -> None:
    with client.responses.stream(model=REPLAY_XML, input=ask("xml_call"), tools=[WEATHER]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert len([e for e in events if e.type == "response.function_call_arguments.delta"]) > 1
    (call,) = final.output
    assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Paris", "days": 3}


def test_a_tool_loop_through_previous_response_id(client: openai.OpenAI) -> None:
    first = client.responses.create(model=REPLAY, input=ask("call"), tools=[WEATHER], instructions="Use tools.")
    (call,) = first.output
    assert call.type == "function_call"
    # The tool's result carries the next tag: the last tag in the prompt picks the reply.
    result = json.dumps({"temp_c": 21, "note": tag("answer")})
    second = client.responses.create(
        model=REPLAY,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": result}],
        tools=[WEATHER],
        instructions="Use tools.",
    )
    assert second.output_text == recordings.ANSWER and second.status == "completed"
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens
    # The same loop with the whole conversation sent back (store off), as stateless clients do.
    third = client.responses.create(
        model=REPLAY,
        input=[
            {"role": "user", "content": ask("call")},
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": result},
        ],
        tools=[WEATHER],
        instructions="Use tools.",
        store=False,
    )
    assert third.output_text == recordings.ANSWER
    assert third.usage is not None and third.usage.input_tokens == second.usage.input_tokens


def test_the_lifecycle_s_errors_name_the_fields_responses_has(client: openai.OpenAI) -> None:
    """Its input becomes chat's `messages` and `max_output_tokens` chat's `max_tokens`: a refusal
    names what the client sent."""
    with pytest.raises(openai.BadRequestError) as too_long:
        client.responses.create(model=REPLAY, input="hi", max_output_tokens=10**6)
    assert too_long.value.code == "context_length_exceeded" and too_long.value.param == "input"
    with pytest.raises(openai.BadRequestError) as n_bad:
        client.responses.create(model=REPLAY, input="hi", max_output_tokens=0)
    assert n_bad.value.param == "max_output_tokens"
