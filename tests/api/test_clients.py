"""The clients agents and apps are built with, unchanged, against the gateway: LangChain's
`ChatOpenAI` and the OpenAI Agents SDK, over chat completions and the Responses API. The
replay engine plays the model's part (a thinking answer, a tool call), so what each client
does with the gateway's answers is checked exactly."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from engine_adapter import recordings
from engine_adapter.recordings import tag
from tests.conftest import API_KEY, REPLAY, Server

WEATHER_CALLS: list[str] = []


def get_weather(city: str) -> str:
    """The weather in a city."""
    WEATHER_CALLS.append(city)
    # The tool's answer carries the next tag: the replayed model answers in words next.
    return f"21 C and sunny in {city}. {tag('answer')}"


@pytest.fixture(autouse=True)
def _no_calls_yet() -> Iterator[None]:
    WEATHER_CALLS.clear()
    yield


def chat_model(server: Server, **kw: Any) -> Any:
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(model=REPLAY, base_url=server.api, api_key=API_KEY, max_retries=0, timeout=60, **kw)  # type: ignore[arg-type]


def test_langchain_bind_tools(replay_server: Server) -> None:
    from langchain_core.tools import tool

    llm = chat_model(replay_server).bind_tools([tool(get_weather)])
    message = llm.invoke(f"What is the weather in Paris? {tag('call')}")
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [("get_weather", {"city": "Paris"})]
    chunks = list(llm.stream(f"What is the weather in Paris? {tag('parallel')}"))
    merged = chunks[0]
    for c in chunks[1:]:
        merged += c
    assert [c["args"]["city"] for c in merged.tool_calls] == ["Paris", "Rome"]


def test_langchain_streams_reasoning_through_the_responses_api(replay_server: Server) -> None:
    llm = chat_model(replay_server, use_responses_api=True, reasoning={"effort": "medium", "summary": "auto"})
    chunks = list(llm.stream(f"What is the capital of France? {tag('think')}"))
    merged = chunks[0]
    for c in chunks[1:]:
        merged += c
    reasoning, answer = recordings.THINK.split("</think>")
    blocks = merged.content if isinstance(merged.content, list) else []
    summaries = [s["text"] for b in blocks if b.get("type") == "reasoning" for s in b.get("summary", [])]
    texts = [b["text"] for b in blocks if b.get("type") == "text"]
    assert "".join(summaries) == reasoning.removeprefix("<think>").strip("\n")
    assert "".join(texts) == answer.lstrip("\n")


@pytest.mark.parametrize("api", ["chat_completions", "responses"])
async def test_an_agent_calls_its_tool_and_answers(replay_server: Server, api: str) -> None:
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)  # no trace upload to OpenAI
    client = openai.AsyncOpenAI(base_url=replay_server.api, api_key=API_KEY, max_retries=0, timeout=60)
    model = (
        OpenAIChatCompletionsModel(model=REPLAY, openai_client=client)
        if api == "chat_completions"
        else OpenAIResponsesModel(model=REPLAY, openai_client=client)
    )
    agent = Agent(
        name="weather", instructions="Answer with the weather tool.", tools=[function_tool(get_weather)], model=model
    )
    result = await Runner.run(agent, f"What is the weather in Paris? {tag('call')}")
    assert WEATHER_CALLS == ["Paris"]
    assert result.final_output == recordings.ANSWER
