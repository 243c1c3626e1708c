"""/v1/messages and /v1/messages/count_tokens (Anthropic's Messages API) read by the official
`anthropic` SDK: text, thinking and tool_use blocks, whole and streamed, a tool_result round
trip, count_tokens equal to the billed input, and errors in Anthropic's shape. The model's
text is replayed from recorded Qwen turns (engine_adapter/replay.py)."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest

from engine_adapter import recordings
from engine_adapter.recordings import tag
from tests.conftest import API_KEY, REPLAY, REPLAY_AGENTS, App

WEATHER: Any = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
REASONING, ANSWER = recordings.THINK.split("</think>")
REASONING = REASONING.removeprefix("<think>").strip("\n")
ANSWER = ANSWER.lstrip("\n")


@pytest.fixture(scope="module")
def client(replay_app: App) -> anthropic.Anthropic:
    return sdk(replay_app, API_KEY)


def sdk(app: App, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=app.base_url, api_key=key, http_client=app.http, max_retries=0, timeout=60)


def ask(name: str) -> list[Any]:
    return [{"role": "user", "content": f"What is the weather in Paris? {tag(name)}"}]


def billed(usage: Any) -> int:
    return int(usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens)


def test_create_answers_with_a_text_block(client: anthropic.Anthropic) -> None:
    m = client.messages.create(model=REPLAY, max_tokens=200, messages=ask("answer"))
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant" and m.model == REPLAY
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == recordings.ANSWER  # type: ignore[union-attr]
    assert m.stop_reason == "end_turn" and m.stop_sequence is None
    assert m.usage.output_tokens > 0 and billed(m.usage) > 0


def test_system_string_and_blocks_render_the_same(client: anthropic.Anthropic, replay_app: App) -> None:
    def count(system: Any) -> int:
        return client.messages.count_tokens(model=REPLAY, system=system, messages=ask("answer")).input_tokens

    blocks = [
        {"type": "text", "text": "You are terse."},
        {"type": "text", "text": "Answer in English.", "cache_control": {"type": "ephemeral"}},
    ]
    assert count(blocks) == count("You are terse.\n\nAnswer in English.") > count("You are terse.")


def test_stream_events_in_the_sdk_s_order(client: anthropic.Anthropic) -> None:
    with client.messages.stream(model=REPLAY, max_tokens=1000, messages=ask("long")) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert kinds.index("content_block_start") < kinds.index("content_block_stop") < kinds.index("message_delta")
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    streamed = "".join(d.text for d in deltas if d.type == "text_delta")
    assert streamed == recordings.LONG == final.content[0].text  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0


def test_thinking_enabled_is_answered_as_a_thinking_block(client: anthropic.Anthropic) -> None:
    thinking: Any = {"type": "enabled", "budget_tokens": 1024}
    m = client.messages.create(model=REPLAY, max_tokens=2048, messages=ask("think"), thinking=thinking)
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking == REASONING and m.content[1].text == ANSWER  # type: ignore[union-attr]
    with client.messages.stream(model=REPLAY, max_tokens=2048, messages=ask("think"), thinking=thinking) as s:
        deltas = [e.delta for e in s if e.type == "content_block_delta"]
        final = s.get_final_message()
    assert "".join(d.thinking for d in deltas if d.type == "thinking_delta") == REASONING
    assert any(d.type == "signature_delta" for d in deltas)
    assert final.content[0].thinking == REASONING  # type: ignore[union-attr]


def test_thinking_is_off_unless_asked_and_its_text_omitted_on_request(replay_app: App) -> None:
    def prompt_text(body: dict[str, Any]) -> int:
        r = replay_app.http.post("/v1/messages/count_tokens", json=body, headers={"x-api-key": API_KEY})
        assert r.status_code == 200, r.text
        return int(r.json()["input_tokens"])

    base = {"model": REPLAY, "messages": ask("answer")}
    off = prompt_text(base)
    assert prompt_text(base | {"thinking": {"type": "disabled"}}) == off
    assert prompt_text(base | {"thinking": {"type": "adaptive"}}) != off  # the template's switch
    body = base | {"max_tokens": 500, "messages": ask("think"), "thinking": {"type": "adaptive", "display": "omitted"}}
    r = replay_app.http.post("/v1/messages", json=body, headers={"x-api-key": API_KEY})
    thinking, text = r.json()["content"]
    assert thinking == {"type": "thinking", "thinking": "", "signature": ""} and text["text"] == ANSWER


def test_tool_use_then_tool_result_round_trip(client: anthropic.Anthropic) -> None:
    messages: list[Any] = [{"role": "user", "content": f"Run the marker. {tag('claude_bash')}"}]
    bash: Any = {"name": "Bash", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}
    m = client.messages.create(model=REPLAY, max_tokens=300, messages=messages, tools=[bash])
    (call,) = m.content
    assert call.type == "tool_use" and call.name == "Bash" and call.id.startswith("toolu_")
    assert call.input == {"command": "echo sparkgate-$((6*7))", "description": "Print a marker"}
    assert m.stop_reason == "tool_use"
    result = {"type": "tool_result", "tool_use_id": call.id, "content": [{"type": "text", "text": "sparkgate-42"}]}
    messages += [{"role": "assistant", "content": m.content}, {"role": "user", "content": [result]}]
    again = client.messages.create(model=REPLAY, max_tokens=300, messages=messages, tools=[bash])
    assert again.content[0].text == recordings.CLAUDE_BASH[1] and again.stop_reason == "end_turn"  # type: ignore[union-attr]


def test_tool_use_streamed_as_input_json(client: anthropic.Anthropic) -> None:
    thinking: Any = {"type": "adaptive"}
    kw: Any = {"model": REPLAY, "max_tokens": 300, "messages": ask("think_call"), "tools": [WEATHER]}
    with client.messages.stream(thinking=thinking, **kw) as s:
        events = list(s)
        final = s.get_final_message()
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert starts == ["thinking", "tool_use"]
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    partial = "".join(d.partial_json for d in deltas if d.type == "input_json_delta")
    assert json.loads(partial) == {"city": "Paris"}
    assert final.content[-1].type == "tool_use" and final.content[-1].input == {"city": "Paris"}
    assert final.stop_reason == "tool_use"


def test_tool_choice_none_reads_no_calls_and_forcing_a_server_tool_is_refused(client: anthropic.Anthropic) -> None:
    m = client.messages.create(
        model=REPLAY, max_tokens=300, messages=ask("call"), tools=[WEATHER], tool_choice={"type": "none"}
    )
    assert [b.type for b in m.content] == ["text"] and m.stop_reason == "end_turn"
    search: Any = {"type": "web_search_20250305", "name": "web_search"}
    m = client.messages.create(model=REPLAY, max_tokens=300, messages=ask("answer"), tools=[WEATHER, search])
    assert m.content[0].text == recordings.ANSWER  # type: ignore[union-attr]
    with pytest.raises(anthropic.BadRequestError) as e:
        forced: Any = {"type": "tool", "name": "web_search"}
        client.messages.create(model=REPLAY, max_tokens=300, messages=ask("answer"), tools=[search], tool_choice=forced)
    assert e.value.body["error"]["type"] == "invalid_request_error" and "web_search" in e.value.message  # type: ignore[index]


def test_disable_parallel_tool_use_keeps_the_first_call(client: anthropic.Anthropic) -> None:
    kw: Any = {"model": REPLAY, "max_tokens": 300, "messages": ask("parallel"), "tools": [WEATHER]}
    both = client.messages.create(**kw)
    assert [b.input for b in both.content if b.type == "tool_use"] == [{"city": "Paris"}, {"city": "Rome"}]
    one = client.messages.create(tool_choice={"type": "auto", "disable_parallel_tool_use": True}, **kw)
    assert [b.input for b in one.content if b.type == "tool_use"] == [{"city": "Paris"}]
    assert one.stop_reason == "tool_use"


def test_count_tokens_is_the_input_the_same_request_is_billed(client: anthropic.Anthropic) -> None:
    system = "x-anthropic-billing-header: cc_version=2.1.332.0b8; cch=1a2b3;\nYou are a coding agent."
    kw: Any = {"model": REPLAY, "system": system, "messages": ask("call"), "tools": [WEATHER]}
    counted = client.messages.count_tokens(**kw).input_tokens
    m = client.messages.create(max_tokens=300, **kw)
    assert counted == billed(m.usage) > 20
    with client.messages.stream(max_tokens=300, **kw) as s:
        final = s.get_final_message()
    assert billed(final.usage) == counted


def test_stop_sequences_and_max_tokens_stop_reasons(client: anthropic.Anthropic) -> None:
    m = client.messages.create(model=REPLAY, max_tokens=200, messages=ask("answer"), stop_sequences=["France"])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "France"
    assert m.content[0].text == recordings.ANSWER.split("France")[0]  # type: ignore[union-attr]
    m = client.messages.create(model=REPLAY, max_tokens=3, messages=ask("long"))
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3


def test_an_agent_s_request_fits_a_long_context(client: anthropic.Anthropic, replay_app: App) -> None:
    """Claude Code asks 32,000 output tokens on every request; Codex sets no limit at all, so
    its request reserves the whole context."""
    m = client.messages.create(model=REPLAY_AGENTS, max_tokens=32000, messages=ask("answer"))
    assert m.content[0].text == recordings.ANSWER  # type: ignore[union-attr]
    body = {"model": REPLAY_AGENTS, "input": "hi"}
    r = replay_app.http.post("/v1/responses", json=body, headers={"x-api-key": API_KEY})
    assert r.status_code == 200, r.text


def test_errors_in_anthropic_s_shape(client: anthropic.Anthropic, replay_app: App) -> None:
    with pytest.raises(anthropic.AuthenticationError) as auth:
        sdk(replay_app, "sk-wrong").messages.create(model=REPLAY, max_tokens=10, messages=ask("answer"))
    body: Any = auth.value.body
    assert body["type"] == "error" and body["error"]["type"] == "authentication_error" and body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="no-such-model", max_tokens=10, messages=ask("answer"))
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as too_long:
        client.messages.create(model=REPLAY, max_tokens=5000, messages=ask("answer"))
    assert "maximum context length" in too_long.value.message
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError) as img:
        blocks: Any = [{"role": "user", "content": [image]}]
        client.messages.create(model=REPLAY, max_tokens=10, messages=blocks)
    assert f"'{REPLAY}' does not take images: it has no vision encoder" in img.value.message
    no_max = {"model": REPLAY, "messages": ask("answer")}
    r = replay_app.http.post("/v1/messages", json=no_max, headers={"x-api-key": API_KEY})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in r.json()["error"]["message"]
    r = replay_app.http.post("/v1/messages", content=b"{not json", headers={"x-api-key": API_KEY})
    assert r.status_code == 400 and r.json()["type"] == "error"
    # The lifecycle checks chat's `stop`: its error names the field Messages has.
    with pytest.raises(anthropic.BadRequestError) as empty_stop:
        client.messages.create(model=REPLAY, max_tokens=10, messages=ask("answer"), stop_sequences=["a", ""])
    assert "Invalid 'stop_sequences': a stop sequence must not be empty." in empty_stop.value.message


def test_bearer_and_x_api_key_and_the_base_url_answer(replay_app: App) -> None:
    body = {"model": REPLAY, "max_tokens": 50, "messages": ask("answer")}
    for headers in ({"x-api-key": API_KEY}, {"Authorization": f"Bearer {API_KEY}"}):
        r = replay_app.http.post("/v1/messages?beta=true", json=body, headers=headers)
        assert r.status_code == 200, r.text
    assert replay_app.http.head("/").status_code == 200
    assert replay_app.http.get("/").status_code == 200
