"""The assistant-turn parser: reasoning, Qwen tool calls (JSON and XML), forced calls, streamed in any pieces."""

from __future__ import annotations

import json

import pytest

from gateway.text.assistant import (
    ContentDelta,
    Event,
    ReasoningDelta,
    ToolCallArgs,
    ToolCallEnd,
    ToolCallStart,
    Turn,
    TurnParser,
    TurnSpec,
    convert_param,
    finish_reason,
)

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"}},
}
TOOLS = {"get_weather": WEATHER}
JSON_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
XML_CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n</function>\n</tool_call>"
)


def parse(spec: TurnSpec, text: str, step: int) -> tuple[Turn, list[Event]]:
    parser = TurnParser(spec)
    events: list[Event] = []
    for i in range(0, len(text), step):
        events += parser.feed(text[i : i + step])
    events += parser.finish()
    turn = Turn()
    turn.apply(events)
    return turn, events


STEPS = [1, 2, 3, 7, 1000]


@pytest.mark.parametrize("step", STEPS)
def test_a_think_block_is_reasoning_and_the_rest_the_answer(step: int) -> None:
    turn, _ = parse(TurnSpec(reasoning="maybe"), "<think>\nLet me think.\nDone.\n</think>\n\nHello there!", step)
    assert (turn.reasoning, turn.content, turn.saw_reasoning) == ("Let me think.\nDone.", "Hello there!", True)


@pytest.mark.parametrize("step", STEPS)
def test_an_answer_without_a_think_block_is_all_content(step: int) -> None:
    turn, _ = parse(TurnSpec(reasoning="maybe"), "  Just an <answer>, no thinking.", step)
    assert (turn.reasoning, turn.content, turn.saw_reasoning) == ("", "  Just an <answer>, no thinking.", False)


@pytest.mark.parametrize("step", STEPS)
def test_a_think_block_the_prompt_opened(step: int) -> None:
    turn, _ = parse(TurnSpec(reasoning="open"), "thinking on\n</think>\n\nThe answer.", step)
    assert (turn.reasoning, turn.content) == ("thinking on", "The answer.")


def test_reasoning_cut_short_is_all_reasoning() -> None:
    turn, _ = parse(TurnSpec(reasoning="open"), "still thinking </thi", 4)
    assert (turn.reasoning, turn.content) == ("still thinking </thi", "")


def test_thinking_off_leaves_tags_alone() -> None:
    turn, events = parse(TurnSpec(), "<think>x</think>y", 2)
    assert turn.content == "<think>x</think>y" and all(isinstance(e, ContentDelta) for e in events)


@pytest.mark.parametrize("step", STEPS)
def test_json_tool_calls_after_thinking(step: int) -> None:
    text = "<think>\nweather?\n</think>\n\n" + JSON_CALL + "\n" + JSON_CALL.replace("Paris", "Rome")
    turn, _ = parse(TurnSpec(reasoning="maybe", tool_format="hermes", tools=TOOLS), text, step)
    assert turn.reasoning == "weather?" and turn.content == ""
    assert [(c.name, json.loads(c.arguments)) for c in turn.tool_calls] == [
        ("get_weather", {"city": "Paris", "days": 2}),
        ("get_weather", {"city": "Rome", "days": 2}),
    ]
    assert len({c.id for c in turn.tool_calls}) == 2 and all(c.id.startswith("call_") for c in turn.tool_calls)


@pytest.mark.parametrize("step", STEPS)
def test_xml_tool_call_arguments_follow_the_schema_types(step: int) -> None:
    turn, events = parse(TurnSpec(tool_format="qwen3_xml", tools=TOOLS), "Let me look.\n\n" + XML_CALL, step)
    assert turn.content == "Let me look."
    (call,) = turn.tool_calls
    assert json.loads(call.arguments) == {"city": "Paris", "days": 3, "metric": True}
    # Streamed parameter by parameter: the deltas concatenate to the final arguments.
    pieces = [e.delta for e in events if isinstance(e, ToolCallArgs)]
    assert len(pieces) == 4 and "".join(pieces) == call.arguments
    (end,) = [e for e in events if isinstance(e, ToolCallEnd)]
    assert end.arguments == call.arguments


@pytest.mark.parametrize("step", STEPS)
def test_malformed_calls_come_back_as_content(step: int) -> None:
    bad = 'Hi <tool_call>\n{"name": "get_weather", "arguments": {"city": \n</tool_call> bye'
    turn, _ = parse(TurnSpec(tool_format="hermes", tools=TOOLS), bad, step)
    assert turn.tool_calls == [] and turn.content == bad
    unknown = JSON_CALL.replace("get_weather", "launch_rockets")
    turn, _ = parse(TurnSpec(tool_format="hermes", tools=TOOLS), unknown, step)
    assert turn.tool_calls == [] and turn.content == unknown
    xml_bad = "<tool_call>\nnot a function</tool_call>"
    turn, _ = parse(TurnSpec(tool_format="qwen3_xml", tools=TOOLS), xml_bad, step)
    assert turn.tool_calls == [] and turn.content == xml_bad


def test_a_call_cut_off_before_its_closing_tag_is_kept_when_whole() -> None:
    turn, _ = parse(TurnSpec(tool_format="hermes", tools=TOOLS), JSON_CALL.removesuffix("\n</tool_call>"), 5)
    assert [c.name for c in turn.tool_calls] == ["get_weather"]
    turn, _ = parse(TurnSpec(tool_format="hermes", tools=TOOLS), '<tool_call>{"name": "get_w', 5)
    assert turn.tool_calls == [] and turn.content == '<tool_call>{"name": "get_w'
    turn, _ = parse(TurnSpec(tool_format="qwen3_xml", tools=TOOLS), XML_CALL.split("<parameter=days>")[0], 5)
    assert [json.loads(c.arguments) for c in turn.tool_calls] == [{"city": "Paris"}]


def test_a_tool_call_inside_the_think_block_ends_it() -> None:
    turn, _ = parse(TurnSpec(reasoning="open", tool_format="hermes", tools=TOOLS), "hmm\n" + JSON_CALL, 3)
    assert turn.reasoning == "hmm" and [c.name for c in turn.tool_calls] == ["get_weather"]


@pytest.mark.parametrize("step", STEPS)
def test_a_forced_named_call_streams_its_arguments(step: int) -> None:
    spec = TurnSpec(tools=TOOLS, forced="named", forced_name="get_weather")
    turn, events = parse(spec, '{"city":"Oslo"}', step)
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [("get_weather", '{"city":"Oslo"}')]
    assert isinstance(events[0], ToolCallStart) and sum(isinstance(e, ToolCallArgs) for e in events) >= 1


PATCH = '*** Begin Patch\n*** Add File: a.txt\n+say "hi" \\o/ ✓\n*** End Patch\n'


@pytest.mark.parametrize("step", STEPS)
def test_a_forced_freeform_call_is_its_text_argument(step: int) -> None:
    spec = TurnSpec(forced="named", forced_name="apply_patch", forced_text="input")
    turn, events = parse(spec, PATCH, step)
    (call,) = turn.tool_calls
    assert call.name == "apply_patch" and json.loads(call.arguments) == {"input": PATCH}
    assert isinstance(events[-1], ToolCallEnd) and events[-1].arguments == call.arguments
    if step < len(PATCH):  # streamed as it comes, each piece JSON-escaped
        assert sum(isinstance(e, ToolCallArgs) for e in events) > 3
    # Leading spaces are the text's (its grammar may allow them); only newlines after </think> go.
    turn, _ = parse(spec, "  x", step)
    assert json.loads(turn.tool_calls[0].arguments) == {"input": "  x"}
    thinking = TurnSpec(reasoning="maybe", forced="named", forced_name="apply_patch", forced_text="input")
    turn, _ = parse(thinking, "<think>\nplan\n</think>\n\n" + PATCH, step)
    assert turn.reasoning == "plan" and json.loads(turn.tool_calls[0].arguments) == {"input": PATCH}
    turn, _ = parse(spec, "", step)
    assert json.loads(turn.tool_calls[0].arguments) == {"input": ""}  # forced: a call, even of no text


@pytest.mark.parametrize("step", STEPS)
def test_a_forced_required_array_becomes_calls(step: int) -> None:
    text = '[{"name":"get_weather","parameters":{"city":"a}\\"]"}},{"name":"get_weather","parameters":{}}]'
    turn, _ = parse(TurnSpec(tools=TOOLS, forced="required"), text, step)
    assert [json.loads(c.arguments) for c in turn.tool_calls] == [{"city": 'a}"]'}, {}]


def test_a_forced_array_cut_before_one_call_is_content() -> None:
    turn, _ = parse(TurnSpec(tools=TOOLS, forced="required"), '[{"name":"get_we', 4)
    assert turn.tool_calls == [] and turn.content == '[{"name":"get_we'


def test_reasoning_tokens_are_counted_up_to_the_end_tag() -> None:
    end = 99
    parser = TurnParser(TurnSpec(reasoning="maybe", think_end_id=end))
    parser.feed("<think>", [1])
    parser.feed("a b", [2, 3])
    parser.feed("</think>\n\nok", [end, 4, 5])
    parser.feed(" more", [6])
    assert parser.reasoning_tokens == 4
    plain = TurnParser(TurnSpec(reasoning="maybe", think_end_id=end))
    plain.feed("Hello", [1])
    plain.feed(" world", [2])
    assert plain.reasoning_tokens == 0


def test_plain_text_passes_through_untouched() -> None:
    parser = TurnParser(TurnSpec())
    assert parser.feed("a <tool_call> b") == [ContentDelta("a <tool_call> b")]
    assert parser.finish() == []


@pytest.mark.parametrize(
    ("value", "schema", "want"),
    [
        ("3", {"type": "integer"}, 3),
        ("3.5", {"type": "number"}, 3.5),
        ("x", {"type": "integer"}, "x"),
        ("TRUE", {"type": "boolean"}, True),
        ('{"a": 1}', {"type": "object"}, {"a": 1}),
        ("[1", {"type": "array"}, "[1"),
        ("null", {"type": ["string", "null"]}, None),
        (" spaced ", None, " spaced "),
    ],
)
def test_xml_parameter_conversion(value: str, schema: dict[str, object] | None, want: object) -> None:
    assert convert_param(value, schema) == want


def test_finish_reason_names_tool_calls() -> None:
    assert finish_reason("stop", 1) == "tool_calls"
    assert finish_reason("length", 1) == "length"
    assert finish_reason("stop", 0) == "stop"


def test_events_in_order_for_a_stream() -> None:
    _, events = parse(
        TurnSpec(reasoning="maybe", tool_format="hermes", tools=TOOLS), "<think>r</think>a" + JSON_CALL, 4
    )
    kinds = [type(e) for e in events]
    assert kinds[0] is ReasoningDelta and ContentDelta in kinds
    assert kinds[-3:] == [ToolCallStart, ToolCallArgs, ToolCallEnd]
