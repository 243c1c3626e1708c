"""The assistant-turn parser: reasoning, Qwen tool calls (JSON and XML), forced calls, streamed in any pieces.

The chunk-size tests of tool calls and reasoning run over every registered format
(gateway/text/formats), each writing its own samples (`render_call`, its think markers).
"""

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
    finish_reason,
)
from gateway.text.formats import REASONING_FORMATS, TOOL_FORMATS, ReasoningFormat, ToolFormat
from gateway.text.formats.qwen3_xml import convert_param

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
# Every registered family: a new one runs these tests with its own samples.
EACH_FORMAT = pytest.mark.parametrize("fmt", TOOL_FORMATS, ids=lambda f: f.name)
EACH_THINK = pytest.mark.parametrize("think", REASONING_FORMATS, ids=lambda f: f.name)


def test_the_samples_are_the_qwen_formats_as_written() -> None:
    """The formats' samples for the Qwen families are the texts these tests were written with."""
    hermes, xml = (next(f for f in TOOL_FORMATS if f.name == n) for n in ("hermes", "qwen3_xml"))
    assert hermes.render_call("get_weather", {"city": "Paris", "days": 2}) == JSON_CALL
    assert xml.render_call("get_weather", {"city": "Paris", "days": 3, "metric": True}) == XML_CALL


@EACH_THINK
@pytest.mark.parametrize("step", STEPS)
def test_a_think_block_is_reasoning_and_the_rest_the_answer(think: ReasoningFormat, step: int) -> None:
    text = f"{think.think_start}\nLet me think.\nDone.\n{think.think_end}\n\nHello there!"
    turn, _ = parse(TurnSpec(reasoning="maybe", reasoning_format=think.name), text, step)
    assert (turn.reasoning, turn.content, turn.saw_reasoning) == ("Let me think.\nDone.", "Hello there!", True)


@EACH_THINK
@pytest.mark.parametrize("step", STEPS)
def test_an_answer_without_a_think_block_is_all_content(think: ReasoningFormat, step: int) -> None:
    turn, _ = parse(TurnSpec(reasoning="maybe", reasoning_format=think.name), "  Just an <answer>, no thinking.", step)
    assert (turn.reasoning, turn.content, turn.saw_reasoning) == ("", "  Just an <answer>, no thinking.", False)


@EACH_THINK
@pytest.mark.parametrize("step", STEPS)
def test_a_think_block_the_prompt_opened(think: ReasoningFormat, step: int) -> None:
    text = f"thinking on\n{think.think_end}\n\nThe answer."
    turn, _ = parse(TurnSpec(reasoning="open", reasoning_format=think.name), text, step)
    assert (turn.reasoning, turn.content) == ("thinking on", "The answer.")


def test_reasoning_cut_short_is_all_reasoning() -> None:
    turn, _ = parse(TurnSpec(reasoning="open"), "still thinking </thi", 4)
    assert (turn.reasoning, turn.content) == ("still thinking </thi", "")


def test_thinking_off_leaves_tags_alone() -> None:
    turn, events = parse(TurnSpec(), "<think>x</think>y", 2)
    assert turn.content == "<think>x</think>y" and all(isinstance(e, ContentDelta) for e in events)


@EACH_FORMAT
@pytest.mark.parametrize("step", STEPS)
def test_without_parallel_calls_a_turn_keeps_its_first(fmt: ToolFormat, step: int) -> None:
    paris, rome = (fmt.render_call("get_weather", {"city": city, "days": 2}) for city in ("Paris", "Rome"))
    spec = TurnSpec(tool_format=fmt.name, tools=TOOLS, parallel=False)
    parser = TurnParser(spec)
    text = paris + "\n" + rome
    events: list[Event] = []
    for i in range(0, len(text), step):
        events += parser.feed(text[i : i + step])
    events += parser.finish()
    turn = Turn()
    turn.apply(events)
    (call,) = turn.tool_calls
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris", "days": 2})
    assert parser.calls == 1 and turn.content == ""
    assert all(e.index == 0 for e in events if isinstance(e, ToolCallStart | ToolCallArgs | ToolCallEnd))


@EACH_FORMAT
@pytest.mark.parametrize("step", STEPS)
def test_tool_calls_after_thinking(fmt: ToolFormat, step: int) -> None:
    paris, rome = (fmt.render_call("get_weather", {"city": city, "days": 2}) for city in ("Paris", "Rome"))
    text = "<think>\nweather?\n</think>\n\n" + paris + "\n" + rome
    turn, _ = parse(TurnSpec(reasoning="maybe", tool_format=fmt.name, tools=TOOLS), text, step)
    assert turn.reasoning == "weather?" and turn.content == ""
    assert [(c.name, json.loads(c.arguments)) for c in turn.tool_calls] == [
        ("get_weather", {"city": "Paris", "days": 2}),
        ("get_weather", {"city": "Rome", "days": 2}),
    ]
    assert len({c.id for c in turn.tool_calls}) == 2 and all(c.id.startswith("call_") for c in turn.tool_calls)


@EACH_FORMAT
@pytest.mark.parametrize("step", STEPS)
def test_tool_call_arguments_arrive_whole_and_typed(fmt: ToolFormat, step: int) -> None:
    want = {"city": "Paris", "days": 3, "metric": True}
    block = fmt.render_call("get_weather", want)
    turn, events = parse(TurnSpec(tool_format=fmt.name, tools=TOOLS), "Let me look.\n\n" + block, step)
    assert turn.content == "Let me look."
    (call,) = turn.tool_calls
    assert call.name == "get_weather" and json.loads(call.arguments) == want
    pieces = [e.delta for e in events if isinstance(e, ToolCallArgs)]
    assert pieces and "".join(pieces) == call.arguments
    (end,) = [e for e in events if isinstance(e, ToolCallEnd)]
    assert end.arguments == call.arguments
    # Read whole, the block says the same.
    body = block.removeprefix(fmt.call_start).removesuffix(fmt.call_end)
    assert fmt.parse_call(body, TOOLS) == ("get_weather", call.arguments)


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


@EACH_FORMAT
@pytest.mark.parametrize("step", STEPS)
def test_calls_that_are_not_calls_come_back_as_content(fmt: ToolFormat, step: int) -> None:
    unknown = fmt.render_call("launch_rockets", {"city": "Paris", "days": 2})
    garbage = fmt.call_start + "\nnot a function" + fmt.call_end
    for text in (unknown, garbage, "Hi " + unknown + " bye", "Hi " + garbage + " bye"):
        turn, _ = parse(TurnSpec(tool_format=fmt.name, tools=TOOLS), text, step)
        assert turn.tool_calls == [] and turn.content == text
    assert fmt.parse_call("\nnot a function") is None


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


@EACH_FORMAT
def test_a_tool_call_inside_the_think_block_ends_it(fmt: ToolFormat) -> None:
    call = fmt.render_call("get_weather", {"city": "Paris", "days": 2})
    turn, _ = parse(TurnSpec(reasoning="open", tool_format=fmt.name, tools=TOOLS), "hmm\n" + call, 3)
    assert turn.reasoning == "hmm" and [c.name for c in turn.tool_calls] == ["get_weather"]


@pytest.mark.parametrize("step", STEPS)
def test_a_forced_named_call_is_sent_when_its_object_closes(step: int) -> None:
    spec = TurnSpec(tools=TOOLS, forced="named", forced_name="get_weather")
    args = '{"city":"O}{\\"slo","n":[{}]}'
    turn, events = parse(spec, " \n" + args, step)
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [("get_weather", args)]
    starts = [e for e in events if isinstance(e, ToolCallStart)]
    pieces = [e for e in events if isinstance(e, ToolCallArgs)]
    assert len(starts) == 1 and [p.delta for p in pieces] == [args]  # whole, once
    assert isinstance(events[-1], ToolCallEnd)


@pytest.mark.parametrize("step", STEPS)
def test_a_forced_named_call_cut_short_is_text_not_a_call(step: int) -> None:
    spec = TurnSpec(tools=TOOLS, forced="named", forced_name="get_weather")
    turn, events = parse(spec, '{"city":"Os', step)
    assert turn.tool_calls == [] and turn.content == '{"city":"Os'
    assert not any(isinstance(e, ToolCallStart | ToolCallArgs) for e in events)


@pytest.mark.parametrize("step", STEPS)
def test_a_raw_tab_the_grammar_let_through_is_escaped_in_the_arguments(step: int) -> None:
    """vLLM's JSON grammar allows a raw tab inside a string (a random-weight model wrote
    `{"city":".$\tread"}`): strict parsers refuse that, so the call's arguments escape it."""
    spec = TurnSpec(tools=TOOLS, forced="named", forced_name="get_weather")
    turn, events = parse(spec, '{"city":".$\tread +="}', step)
    [call] = turn.tool_calls
    assert call.arguments == '{"city":".$\\tread +="}' and json.loads(call.arguments) == {"city": ".$\tread +="}
    assert [e.delta for e in events if isinstance(e, ToolCallArgs)] == [call.arguments]
    required = TurnSpec(tools=TOOLS, forced="required")
    turn, _ = parse(required, '[{"name":"get_weather","parameters":{"city":"a\tb"}}]', step)
    assert [json.loads(c.arguments) for c in turn.tool_calls] == [{"city": "a\tb"}]


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
