"""/v1/messages on a real vLLM CPU engine (the session's shared server): a forced tool
(`tool_choice` any / tool) is generated under the call's grammar, so even a random-weight
model answers with a tool_use whose input fits the schema; and the prompt's cached tokens
come back as cache_read_input_tokens on the next turn."""

from __future__ import annotations

import uuid
from typing import Any

import anthropic
import pytest

from tests.conftest import API_KEY, DENSE, Server

pytestmark = pytest.mark.engine  # the session's vLLM engines

WEATHER: Any = {
    "name": "get_weather",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key=API_KEY, max_retries=0, timeout=120)


# `any` without parallel calls: the grammar is then one call, not an array the random weights
# may extend call after call.
ONE_OF_ANY = {"type": "any", "disable_parallel_tool_use": True}


@pytest.mark.parametrize("choice", [{"type": "tool", "name": "get_weather"}, ONE_OF_ANY])
def test_a_forced_tool_is_generated_under_its_schema(client: anthropic.Anthropic, choice: Any) -> None:
    # The grammar bounds the call (12 characters of city, each at most a 6-token \uXXXX escape):
    # 256 tokens cannot cut it, whatever the random weights sample.
    m = client.messages.create(model=DENSE, max_tokens=256, messages=ASK, tools=[WEATHER], tool_choice=choice)
    (call,) = m.content
    assert call.type == "tool_use" and call.name == "get_weather" and m.stop_reason == "tool_use"
    assert set(call.input) == {"city"} and isinstance(call.input["city"], str)  # type: ignore[index]


def test_the_prefix_cache_shows_in_the_usage(client: anthropic.Anthropic) -> None:
    # Several whole blocks, then the question; new to the cache whatever ran before.
    system = f"Run {uuid.uuid4().hex}. " + "You are the team's assistant. " * 60
    first = client.messages.create(model=DENSE, max_tokens=4, system=system, messages=ASK)
    again = client.messages.create(model=DENSE, max_tokens=4, system=system, messages=ASK)
    total = first.usage.input_tokens + first.usage.cache_read_input_tokens + first.usage.cache_creation_input_tokens
    assert first.usage.cache_creation_input_tokens > 0
    assert again.usage.cache_read_input_tokens >= first.usage.cache_creation_input_tokens > total // 2
    assert again.usage.cache_creation_input_tokens == 0
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens == total
