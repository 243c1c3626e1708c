"""Tool calls on chat completions through the real server and a real (random-weight) vLLM
engine, driven by the official OpenAI SDK. A random model never decides to call a tool, so
these are the paths vLLM's grammar enforces (a named function, `required`) and the request
checks; what a model writes of its own accord is tested with the replay engine.

The schemas bound their strings (`maxLength`): a random model never picks the closing quote
itself (its logit sits hundreds of ranks down), so an unbounded string runs to max_tokens."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pydantic
import pytest

from tests.conftest import API_KEY, DENSE, RAW_KEY, Server

pytestmark = pytest.mark.engine  # starts vLLM engines

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 12}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def post(server: Server, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{server.api}/chat/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120
    )


def test_a_named_tool_choice_returns_a_call_that_parses(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=DENSE,
        messages=ASK,
        tools=[WEATHER, TIME],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=64,
        seed=7,  # sampled: greedy decoding of a random model repeats one token inside a string
    )
    choice = r.choices[0]
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    args = json.loads(call.function.arguments)  # type: ignore[union-attr]
    assert set(args) == {"city"} and isinstance(args["city"], str)
    assert choice.finish_reason == "tool_calls" and choice.message.content is None


def test_required_streamed_yields_call_deltas(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=DENSE,
        messages=ASK,
        tools=[WEATHER, TIME],  # type: ignore[list-item]
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=96,
        seed=7,
        stream=True,
    )
    calls: dict[int, dict[str, str]] = {}
    finishes = []
    for chunk in stream:
        for choice in chunk.choices:
            for d in choice.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
                if d.id:
                    assert not call["id"], "the id comes once"
                    call["id"] = d.id
                if d.function and d.function.name:
                    call["name"] += d.function.name
                if d.function and d.function.arguments:
                    call["arguments"] += d.function.arguments
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
    assert len(calls) == 1  # parallel_tool_calls=False
    (call,) = calls.values()
    assert call["id"].startswith("call_") and call["name"] in ("get_weather", "get_time")
    args = json.loads(call["arguments"])
    assert set(args) == ({"city"} if call["name"] == "get_weather" else {"zone"})
    assert finishes == ["tool_calls"]


def test_empty_tools_and_tool_choice_none_are_plain_chat(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=DENSE, messages=ASK, tools=[], max_tokens=4)
    assert r.choices[0].message.tool_calls == [] and r.choices[0].finish_reason == "length"
    r = client.chat.completions.create(
        model=DENSE,
        messages=ASK,
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="none",
        max_tokens=4,
    )
    assert r.choices[0].message.tool_calls == []


def test_a_tool_round_trip_renders_the_call_and_its_result(server: Server, hf_tokenizer: Any) -> None:
    # The key without prompt normalization: the prompt is then exactly the template's rendering.
    client = openai.OpenAI(base_url=server.api, api_key=RAW_KEY, max_retries=0, timeout=120)
    first = client.chat.completions.create(
        model=DENSE,
        messages=ASK,
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=64,
        seed=7,
    )
    (call,) = first.choices[0].message.tool_calls or []
    messages: list[Any] = [
        *ASK,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 21}'},
    ]
    second = client.chat.completions.create(
        model=DENSE,
        messages=messages,
        tools=[WEATHER],  # type: ignore[list-item]
        max_tokens=4,
        temperature=0,
    )
    # The template saw the call and the tool's answer: count them the way it renders them.
    template_messages = [
        ASK[0],
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": json.loads(call.function.arguments)},  # type: ignore[union-attr]
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 21}'},
    ]
    text = hf_tokenizer.apply_chat_template(
        template_messages, tools=[WEATHER], tokenize=False, add_generation_prompt=True
    )
    assert "<tool_call>" in text and "<tool_response>" in text and '"temp_c": 21' in text
    assert second.usage is not None
    assert second.usage.prompt_tokens == len(hf_tokenizer.encode(text, add_special_tokens=False))


def test_bad_tools_and_tool_choices_get_400_naming_the_parameter(server: Server) -> None:
    nameless = {"type": "function", "function": {"description": "no name"}}
    cases = [
        ({"tools": [nameless]}, "tools[0].function.name"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
    ]
    for extra, param in cases:
        r = post(server, {"model": DENSE, "messages": ASK, "max_tokens": 2, **extra})
        assert r.status_code == 400, (extra, r.text)
        error = r.json()["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error", (extra, error)


class Weather(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=12)


def test_parse_with_a_pydantic_model(client: openai.OpenAI) -> None:
    r = client.chat.completions.parse(model=DENSE, messages=ASK, response_format=Weather, max_tokens=64, seed=7)
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Weather) and isinstance(parsed.city, str)


def test_thinking_off_has_no_reasoning_fields(server: Server) -> None:
    for extra in ({"reasoning_effort": "none"}, {"chat_template_kwargs": {"enable_thinking": False}}):
        r = post(server, {"model": DENSE, "messages": ASK, "max_tokens": 4, **extra})
        message = r.json()["choices"][0]["message"]
        assert r.status_code == 200 and "reasoning_content" not in message and "reasoning" not in message
        assert r.json()["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}


def test_langchain_structured_output_and_tools(server: Server) -> None:
    """LangChain's ChatOpenAI, unchanged: `with_structured_output` (a JSON schema) and a
    forced tool through `bind_tools`, on the real engine's grammar."""
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=DENSE, base_url=server.api, api_key=API_KEY, max_retries=0, max_tokens=64, seed=7)  # type: ignore[arg-type]
    out = llm.with_structured_output(Weather).invoke("What is the weather in Paris?")
    assert isinstance(out, Weather)
    forced = llm.bind_tools([WEATHER], tool_choice="get_weather").invoke("What is the weather in Paris?")
    (call,) = forced.tool_calls
    assert call["name"] == "get_weather" and set(call["args"]) == {"city"}


# What pydantic generates for nested models: `$ref`s into the parameters' own `$defs`.
PYDANTIC_WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "$defs": {
                "City": {
                    "type": "object",
                    "properties": {"name": {"type": "string", "maxLength": 12}},
                    "required": ["name"],
                    "additionalProperties": False,
                },
            },
            "type": "object",
            "properties": {"city": {"$ref": "#/$defs/City"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


@pytest.mark.parametrize("stream", [False, True])
def test_required_with_refs_into_the_tool_s_own_defs(client: openai.OpenAI, stream: bool) -> None:
    kw: Any = {
        "model": DENSE,
        "messages": ASK,
        "tools": [PYDANTIC_WEATHER],
        "tool_choice": "required",
        "max_tokens": 96,
        "seed": 5,
    }
    if stream:
        arguments, names = "", ""
        for chunk in client.chat.completions.create(stream=True, **kw):
            for choice in chunk.choices:
                for d in choice.delta.tool_calls or []:
                    names += (d.function and d.function.name) or ""
                    arguments += (d.function and d.function.arguments) or ""
    else:
        (call,) = client.chat.completions.create(**kw).choices[0].message.tool_calls or []
        names, arguments = call.function.name, call.function.arguments  # type: ignore[union-attr]
    args = json.loads(arguments)
    assert names == "get_weather" and set(args) == {"city"} and set(args["city"]) == {"name"}
    assert isinstance(args["city"]["name"], str)
