"""What a model writes of its own accord (thinking, tool calls, malformed calls), replayed from
recorded Qwen text through the real gateway, read by the official OpenAI SDK."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from engine_adapter import recordings
from engine_adapter.recordings import tag
from tests.conftest import API_KEY, MODELS, REPLAY, REPLAY_XML, App

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def client(replay_app: App) -> openai.OpenAI:
    return replay_app.sdk()


def ask(name: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"What is the weather in Paris? {tag(name)}"}]


def think_parts(text: str) -> tuple[str, str]:
    reasoning, answer = text.split("</think>")
    return reasoning.removeprefix("<think>").strip("\n"), answer.lstrip("\n")


def reasoning_token_count(text: str) -> int:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(MODELS / "tiny-qwen3"))
    head = text[: text.index("</think>") + len("</think>")]
    return len(tok.encode(head, add_special_tokens=False))


def collect(stream: Any) -> dict[str, Any]:
    """A chat stream folded into what a client shows: reasoning, content, calls, finish, usage."""
    out: dict[str, Any] = {"reasoning": "", "reasoning_content": "", "content": "", "calls": {}, "finish": []}
    for chunk in stream:
        if chunk.usage is not None:
            out["usage"] = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta.model_dump()
            out["reasoning"] += delta.get("reasoning") or ""
            out["reasoning_content"] += delta.get("reasoning_content") or ""
            out["content"] += delta.get("content") or ""
            for d in choice.delta.tool_calls or []:
                call = out["calls"].setdefault(d.index, {"id": None, "name": "", "arguments": "", "pieces": 0})
                if d.id:
                    assert call["id"] is None, "a call's id comes once"
                    call["id"] = d.id
                if d.function and d.function.name:
                    call["name"] += d.function.name
                if d.function and d.function.arguments:
                    call["arguments"] += d.function.arguments
                    call["pieces"] += 1
            if choice.finish_reason:
                out["finish"].append(choice.finish_reason)
    return out


def test_thinking_comes_apart_from_the_answer(client: openai.OpenAI) -> None:
    reasoning, answer = think_parts(recordings.THINK)
    r = client.chat.completions.create(model=REPLAY, messages=ask("think"))
    message = r.choices[0].message.model_dump()
    assert message["content"] == answer
    assert message["reasoning_content"] == message["reasoning"] == reasoning
    assert r.usage is not None and r.usage.completion_tokens_details is not None
    assert r.usage.completion_tokens_details.reasoning_tokens == reasoning_token_count(recordings.THINK)
    stream = client.chat.completions.create(
        model=REPLAY, messages=ask("think"), stream=True, stream_options={"include_usage": True}
    )
    got = collect(stream)
    assert (got["reasoning"], got["reasoning_content"], got["content"]) == (reasoning, reasoning, answer)
    assert got["finish"] == ["stop"] and got["usage"].completion_tokens_details.reasoning_tokens > 0


def test_thinking_off_leaves_no_reasoning_fields(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=REPLAY, messages=ask("answer"), reasoning_effort="none")
    message = r.choices[0].message.model_dump()
    assert message["content"] == recordings.ANSWER and "reasoning" not in message


def test_a_tool_call_the_model_writes(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=REPLAY, messages=ask("call"), tools=[WEATHER])  # type: ignore[list-item]
    choice = r.choices[0]
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    got = collect(
        client.chat.completions.create(model=REPLAY, messages=ask("call"), tools=[WEATHER], stream=True)  # type: ignore[list-item]
    )
    (streamed,) = got["calls"].values()
    assert streamed["id"].startswith("call_") and streamed["name"] == "get_weather"
    assert json.loads(streamed["arguments"]) == {"city": "Paris"} and got["finish"] == ["tool_calls"]
    assert got["content"] == ""


def test_parallel_calls_and_calls_after_thinking(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=REPLAY, messages=ask("parallel"), tools=[WEATHER])  # type: ignore[list-item]
    calls = r.choices[0].message.tool_calls or []
    assert [json.loads(c.function.arguments)["city"] for c in calls] == ["Paris", "Rome"]  # type: ignore[union-attr]
    assert len({c.id for c in calls}) == 2
    got = collect(
        client.chat.completions.create(model=REPLAY, messages=ask("parallel"), tools=[WEATHER], stream=True)  # type: ignore[list-item]
    )
    assert sorted(got["calls"]) == [0, 1]
    got = collect(
        client.chat.completions.create(model=REPLAY, messages=ask("think_call"), tools=[WEATHER], stream=True)  # type: ignore[list-item]
    )
    assert got["reasoning"].startswith("The user wants the weather") and got["content"] == ""
    assert [c["name"] for c in got["calls"].values()] == ["get_weather"] and got["finish"] == ["tool_calls"]


def test_parallel_tool_calls_false_keeps_the_first_call(client: openai.OpenAI) -> None:
    kw: Any = {"model": REPLAY, "messages": ask("parallel"), "tools": [WEATHER], "parallel_tool_calls": False}
    (call,) = client.chat.completions.create(**kw).choices[0].message.tool_calls or []
    assert json.loads(call.function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]
    got = collect(client.chat.completions.create(stream=True, **kw))
    assert sorted(got["calls"]) == [0] and got["finish"] == ["tool_calls"]


def test_a_malformed_call_comes_back_as_content(client: openai.OpenAI) -> None:
    for stream in (False, True):
        r = client.chat.completions.create(
            model=REPLAY,
            messages=ask("malformed"),
            tools=[WEATHER],  # type: ignore[list-item]
            stream=stream,
        )
        if stream:
            got = collect(r)
            content, calls, finish = got["content"], got["calls"], got["finish"][0]
        else:
            content, calls, finish = (
                r.choices[0].message.content,
                r.choices[0].message.tool_calls,
                r.choices[0].finish_reason,
            )  # type: ignore[union-attr]
        assert content == recordings.MALFORMED and not calls and finish == "stop"


def test_xml_calls_are_parsed_for_a_model_that_writes_them(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=REPLAY_XML, messages=ask("xml_call"), tools=[WEATHER])  # type: ignore[list-item]
    (call,) = r.choices[0].message.tool_calls or []
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}  # type: ignore[union-attr]
    got = collect(
        client.chat.completions.create(model=REPLAY_XML, messages=ask("xml_call"), tools=[WEATHER], stream=True)  # type: ignore[list-item]
    )
    (streamed,) = got["calls"].values()
    assert json.loads(streamed["arguments"]) == {"city": "Paris", "days": 3} and streamed["pieces"] > 1


def test_without_tools_call_text_stays_text(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=REPLAY, messages=ask("call"))
    assert r.choices[0].message.content == recordings.CALL and r.choices[0].message.tool_calls == []


def test_a_tool_loop_sends_the_result_back(client: openai.OpenAI) -> None:
    """The SDK loop an agent runs: call, run the tool, send the result, get the answer."""
    messages: list[Any] = ask("call")
    first = client.chat.completions.create(model=REPLAY, messages=messages, tools=[WEATHER])  # type: ignore[list-item]
    (call,) = first.choices[0].message.tool_calls or []
    # The tool's result carries the next tag: the last tag in the prompt picks the reply.
    result = json.dumps({"temp_c": 21, "note": tag("answer")})
    messages += [first.choices[0].message, {"role": "tool", "tool_call_id": call.id, "content": result}]
    second = client.chat.completions.create(model=REPLAY, messages=messages, tools=[WEATHER])  # type: ignore[list-item]
    assert second.choices[0].message.content == recordings.ANSWER
    assert second.choices[0].finish_reason == "stop"
    assert second.usage is not None and first.usage is not None
    assert second.usage.prompt_tokens > first.usage.prompt_tokens


def test_past_reasoning_is_accepted_back(replay_app: App) -> None:
    """Clients send the reasoning they got back with the answer: either name is taken."""
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello", "reasoning_content": "greet back"},
        {"role": "user", "content": "again"},
    ]
    r = replay_app.http.post(
        "/v1/chat/completions",
        json={"model": REPLAY, "messages": messages},
        headers={"Authorization": f"Bearer {API_KEY}"},
    )
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == recordings.ANSWER


def test_n_choices_stream_one_choice_per_chunk(client: openai.OpenAI) -> None:
    """A client that reads `choices[0]` of each chunk (as vLLM's own tests do) sees every
    choice's whole text and its finish reason: OpenAI and vLLM send one choice per chunk."""
    kw: Any = {"model": REPLAY, "n": 3, "stream": True, "stream_options": {"include_usage": True}}
    chat = list(client.chat.completions.create(messages=ask("answer"), **kw))
    texts: dict[int, str] = {}
    finishes: dict[int, str | None] = {}
    for chunk in chat:
        assert len(chunk.choices) <= 1
        if chunk.choices:
            c = chunk.choices[0]
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            finishes[c.index] = c.finish_reason or finishes.get(c.index)
    assert texts == dict.fromkeys(range(3), recordings.ANSWER) and finishes == dict.fromkeys(range(3), "stop")
    assert chat[-1].usage is not None and chat[-1].usage.completion_tokens > 0
    completion = list(client.completions.create(prompt=f"Say it. {tag('answer')}", max_tokens=64, **kw))
    texts, finishes = {}, {}
    for chunk in completion:
        assert len(chunk.choices) <= 1
        if chunk.choices:
            c = chunk.choices[0]
            texts[c.index] = texts.get(c.index, "") + c.text
            finishes[c.index] = c.finish_reason or finishes.get(c.index)
    assert texts == dict.fromkeys(range(3), recordings.ANSWER) and finishes == dict.fromkeys(range(3), "stop")
