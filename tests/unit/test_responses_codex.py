"""/v1/responses as Codex CLI uses it, without a server: namespace, custom (freeform) and
hosted tools, the client's hints, reasoning sent back through `encrypted_content`, and the
output items (and stream events) calls of namespaced and custom tools become. Events and
bodies are checked against the openai SDK's own models."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.exceptions import RequestValidationError
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from engine_adapter.base import ChoiceDelta, EngineChunk, EngineRequest, SamplingOptions, StructuredOutput
from gateway.errors import InvalidRequest
from gateway.http.errors import validation_message as _validation_message
from gateway.http.responses.output import OutputItems, ResponseEncoder, custom_input, input_so_far
from gateway.http.responses.schemas import ResponsesRequest, parse
from gateway.http.responses.translate import force_custom, output_messages, translate
from gateway.job import Meter
from gateway.lifecycle.generate import metered
from gateway.text.assistant import (
    ContentDelta,
    Event,
    ReasoningDelta,
    ToolCallArgs,
    ToolCallEnd,
    ToolCallStart,
    TurnSpec,
)

EVENT = TypeAdapter(ResponseStreamEvent)
SAMPLE = Path(__file__).resolve().parents[1] / "api" / "codex_request.json"
PATCH = '*** Begin Patch\n*** Add File: hello.txt\n+hello from "sparkgate" \\o/ ✓\n*** End Patch\n'
LARK = 'start: "yes" | "no"\n'
APPLY_PATCH: dict[str, Any] = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files. A FREEFORM tool.",
    "format": {"type": "grammar", "syntax": "lark", "definition": LARK},
}
SPAWN: dict[str, Any] = {
    "type": "function",
    "name": "spawn_agent",
    "description": "Spawn a sub-agent.",
    "parameters": {"type": "object", "properties": {"task": {"type": "string"}}, "required": ["task"]},
}
AGENTS: dict[str, Any] = {"type": "namespace", "name": "agents", "description": "Sub-agents.", "tools": [SPAWN]}
EXEC: dict[str, Any] = {"type": "function", "name": "exec_command", "parameters": {"type": "object"}}


def req(**kw: Any) -> ResponsesRequest:
    return parse(json.dumps({"model": "m", "input": "hi", **kw}).encode())


def codex_body() -> dict[str, Any]:
    body: dict[str, Any] = json.loads(SAMPLE.read_text())["body"]
    return body


def chat_tools(t: Any) -> dict[str, dict[str, Any]]:
    return {tool.function.name: tool.function.model_dump(exclude_none=True) for tool in t.chat.tools or ()}


# --- the captured request ---------------------------------------------------------------


def test_the_captured_codex_request_translates() -> None:
    body = codex_body()
    r = parse(json.dumps(body).encode())
    assert r.store is False and r.encrypted_reasoning and r.prompt_cache_key and r.client_metadata
    t = translate(r)
    names = list(chat_tools(t))
    # Function tools as they are, the namespace's flattened in its place, apply_patch a function
    # of one string; web_search is not offered.
    assert names[:4] == ["exec_command", "write_stdin", "request_user_input", "apply_patch"]
    assert "multi_agent_v1__spawn_agent" in names and "web_search" not in names
    assert len(names) == len(body["tools"]) - 2 + 5  # namespace (5 inside) and web_search out
    patch = chat_tools(t)["apply_patch"]
    assert patch["parameters"]["required"] == ["input"]
    assert "FREEFORM" in patch["description"] and "begin_patch" in patch["description"]  # its grammar, shown
    # The response repeats the tools as sent, hosted ones included.
    assert t.echo["tools"][-1] == {"type": "web_search", "external_web_access": False}
    assert [x.get("type") for x in t.echo["tools"]] == [x["type"] for x in body["tools"]]
    assert t.echo["prompt_cache_key"] == body["prompt_cache_key"] and t.echo["store"] is False
    assert [m.role for m in t.chat.messages] == ["developer", "developer", "user", "user"]
    assert t.tools["multi_agent_v1__wait_agent"].namespace == "multi_agent_v1"
    assert t.tools["apply_patch"].kind == "custom" and t.forced_custom is None


# --- tools --------------------------------------------------------------------------------


def test_namespace_tools_are_flattened_and_mapped_back() -> None:
    t = translate(req(tools=[EXEC, AGENTS]))
    spawn = chat_tools(t)["agents__spawn_agent"]
    assert spawn["description"] == "Spawn a sub-agent." and spawn["parameters"] == SPAWN["parameters"]
    ref = t.tools["agents__spawn_agent"]
    assert (ref.kind, ref.name, ref.namespace) == ("function", "spawn_agent", "agents")
    assert t.echo["tools"][1] == AGENTS


def test_a_flattened_name_must_not_collide() -> None:
    clash = {**EXEC, "name": "agents__spawn_agent"}
    for tools in ([clash, AGENTS], [AGENTS, clash], [AGENTS, AGENTS]):
        with pytest.raises(InvalidRequest) as e:
            translate(req(tools=tools))
        assert e.value.param == "tools" and "agents__spawn_agent" in e.value.message
    with pytest.raises(InvalidRequest) as e:
        translate(req(tools=[APPLY_PATCH, {**EXEC, "name": "apply_patch"}]))
    assert e.value.param == "tools"


def test_a_namespace_holds_function_and_custom_tools_only() -> None:
    with pytest.raises(InvalidRequest) as e:
        translate(req(tools=[{**AGENTS, "tools": [SPAWN, {"type": "web_search"}]}]))
    assert e.value.param == "tools[0].tools[1].type" and "web_search" in e.value.message
    with pytest.raises(RequestValidationError) as v:
        translate(req(tools=[{**AGENTS, "tools": [{**SPAWN, "name": "bad name"}]}]))
    assert _validation_message(v.value)[1] == "tools[0].tools[0].name"
    with pytest.raises(RequestValidationError) as v:
        translate(req(tools=[{**AGENTS, "name": "bad name"}]))
    assert _validation_message(v.value)[1] == "tools[0].name"


@pytest.mark.parametrize(
    ("fmt", "shown"),
    [
        (None, None),
        ({"type": "text"}, None),
        ({"type": "grammar", "syntax": "lark", "definition": LARK}, "lark grammar"),
        ({"type": "grammar", "syntax": "regex", "definition": "(yes|no)"}, "regex grammar"),
    ],
)
def test_custom_tools_are_functions_of_one_string(fmt: dict[str, Any] | None, shown: str | None) -> None:
    tool = {"type": "custom", "name": "answer", "description": "Say yes or no."}
    if fmt is not None:
        tool["format"] = fmt
    t = translate(req(tools=[tool]))
    fn = chat_tools(t)["answer"]
    assert fn["parameters"] == {
        "type": "object",
        "properties": {"input": {"type": "string", "description": "The tool's input, as plain text."}},
        "required": ["input"],
        "additionalProperties": False,
    }
    assert fn["description"].startswith("Say yes or no.")
    assert (shown in fn["description"]) if shown else fn["description"] == "Say yes or no."
    assert t.tools["answer"].kind == "custom" and t.echo["tools"] == [tool]


def test_a_grammar_needs_its_syntax_and_definition() -> None:
    with pytest.raises(RequestValidationError) as v:
        translate(req(tools=[{**APPLY_PATCH, "format": {"type": "grammar", "syntax": "lark"}}]))
    assert _validation_message(v.value)[1] == "tools[0].format"
    with pytest.raises(RequestValidationError) as v:
        translate(req(tools=[{**APPLY_PATCH, "format": {"type": "grammar", "syntax": "ebnf", "definition": "x"}}]))
    assert _validation_message(v.value)[1] == "tools[0].format.syntax"


def test_hosted_tools_are_accepted_not_offered() -> None:
    hosted: list[dict[str, Any]] = [
        {"type": "web_search", "external_web_access": False},
        {"type": "web_search_preview"},
        {"type": "tool_search"},
        {"type": "file_search", "vector_store_ids": ["vs_1"]},
        {"type": "code_interpreter", "container": {"type": "auto"}},
        {"type": "image_generation"},
        {"type": "mcp", "server_label": "wiki", "server_url": "https://x"},
        {"type": "local_shell"},
        {"type": "computer_use_preview", "display_width": 8, "display_height": 8, "environment": "linux"},
    ]
    t = translate(req(tools=[*hosted, EXEC]))
    assert list(chat_tools(t)) == ["exec_command"] and t.echo["tools"][:-1] == hosted
    assert translate(req(tools=hosted)).chat.tools is None
    future = [{"type": "some_future_tool", "x": 1}]
    assert translate(req(tools=future)).echo["tools"] == future
    body = {"id": "resp_1", "object": "response", "created_at": 1, "model": "m", "output": [], **t.echo}
    Response.model_validate(body)  # the SDK reads the echoed tools


def test_forcing_a_hosted_tool_is_a_400_naming_it() -> None:
    for kind in ("web_search", "web_search_preview", "file_search", "mcp", "image_generation"):
        message, param, _ = _validation_message(_refused(tools=[{"type": kind}], tool_choice={"type": kind}))
        assert param == "tool_choice" and f"'{kind}'" in message
    for name, kind in (("web_search", "web_search"), ("wiki", "mcp")):
        tools = [{"type": "web_search"}, {"type": "mcp", "server_label": "wiki"}]
        with pytest.raises(InvalidRequest) as e:
            translate(req(tools=tools, tool_choice={"type": "function", "name": name}))
        assert e.value.param == "tool_choice" and f"'{kind}'" in e.value.message


def _refused(**kw: Any) -> RequestValidationError:
    with pytest.raises(RequestValidationError) as e:
        req(**kw)
    return e.value


def test_tool_choice_names_function_custom_and_namespaced_tools() -> None:
    tools = [EXEC, AGENTS, APPLY_PATCH]
    t = translate(req(tools=tools, tool_choice={"type": "function", "name": "agents__spawn_agent"}))
    assert t.chat.forced_function == "agents__spawn_agent" and t.forced_custom is None
    t = translate(req(tools=tools, tool_choice={"type": "function", "name": "spawn_agent"}))  # the one namespaced
    assert t.chat.forced_function == "agents__spawn_agent"
    twice = [*tools, {**AGENTS, "name": "helpers"}]  # spawn_agent in two namespaces: name which
    choice = {"type": "function", "name": "spawn_agent", "namespace": "helpers"}
    t = translate(req(tools=twice, tool_choice=choice))
    assert t.chat.forced_function == "helpers__spawn_agent" and t.echo["tool_choice"] == choice
    with pytest.raises(InvalidRequest) as e:
        translate(req(tools=twice, tool_choice={"type": "function", "name": "spawn_agent"}))
    assert e.value.param == "tool_choice"
    t = translate(req(tools=tools, tool_choice={"type": "custom", "name": "apply_patch"}))
    assert t.chat.forced_function == "apply_patch" and t.forced_custom is not None
    assert t.forced_custom.name == "apply_patch" and t.echo["tool_choice"] == {"type": "custom", "name": "apply_patch"}
    with pytest.raises(InvalidRequest) as e:
        translate(req(tools=tools, tool_choice={"type": "custom", "name": "exec_command"}))
    assert e.value.param == "tool_choice" and "is a function tool" in e.value.message
    message, param, _ = _validation_message(_refused(tools=tools, tool_choice={"type": "custom"}))
    assert param == "tool_choice" and '{"type": "custom", "name": ...}' in message
    with pytest.raises(InvalidRequest) as e:
        translate(req(tools=tools, tool_choice={"type": "function", "name": "nope"}))
    assert e.value.param == "tool_choice"


def test_client_hints_are_accepted() -> None:
    r = req(
        include=["reasoning.encrypted_content"],
        prompt_cache_key="k",
        client_metadata={"session_id": "s", "n": 1},
        store=False,
        service_tier="auto",
        text={"verbosity": "low"},
        reasoning={"summary": "auto"},
        parallel_tool_calls=False,
    )
    t = translate(r)
    assert t.chat.parallel_tool_calls is False and r.encrypted_reasoning and r.store is False
    assert t.echo["text"] == {"format": {"type": "text"}, "verbosity": "low"} and t.echo["service_tier"] == "default"
    assert not req().encrypted_reasoning and "prompt_cache_key" not in translate(req()).echo
    assert _validation_message(_refused(include="reasoning.encrypted_content"))[1] == "include"
    assert _validation_message(_refused(text={"verbosity": "loud"}))[1] == "text.verbosity"


# --- input items ---------------------------------------------------------------------------


def test_codex_items_become_chat_messages() -> None:
    secret = base64.b64encode(b"I should add the file.").decode()
    items = [
        {"type": "message", "id": "msg_1", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "s"}],
            "encrypted_content": secret,
        },
        {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_1", "name": "apply_patch", "input": PATCH},
        {"type": "custom_tool_call_output", "call_id": "call_1", "output": "Done!"},
        {"type": "reasoning", "summary": [], "content": None, "encrypted_content": "gAAAAB" + "x" * 40},  # not ours
        {"type": "function_call", "call_id": "call_2", "name": "spawn_agent", "namespace": "agents", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "ok"}]},
    ]
    t = translate(req(input=items, tools=[APPLY_PATCH, AGENTS]))
    assert t.conversation == [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "I should add the file.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "apply_patch", "arguments": json.dumps({"input": PATCH}, ensure_ascii=False)},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Done!"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "call_2", "type": "function", "function": {"name": "agents__spawn_agent", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_2", "content": "ok"},
    ]


def test_custom_tool_items_are_checked_at_their_place() -> None:
    _, param, _ = _validation_message(_refused(input=[{"type": "custom_tool_call", "call_id": "c", "name": "x"}]))
    assert param == "input[0].input"
    _, param, _ = _validation_message(_refused(input=[{"type": "custom_tool_call_output", "output": "x"}]))
    assert param == "input[0].call_id"


# --- a forced custom tool -----------------------------------------------------------------


def fake_request_job(structured: StructuredOutput | None) -> Any:
    from gateway.job import Job

    request = EngineRequest(
        request_id="r", prompt_token_ids=(1, 2), sampling=SamplingOptions(max_tokens=8, structured=structured)
    )
    turn = TurnSpec(forced="named", forced_name="apply_patch")
    return Job(
        kind="chat",
        id="r",
        created=0,
        served=SimpleNamespace(),  # type: ignore[arg-type]
        principal=SimpleNamespace(),  # type: ignore[arg-type]
        prompts=((1, 2),),  # type: ignore[arg-type]
        requests=(request,),
        n=1,
        stream=False,
        include_usage=False,
        logprobs=None,
        turn=turn,
    )


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        ({"type": "grammar", "syntax": "lark", "definition": LARK}, StructuredOutput(grammar=LARK)),
        ({"type": "grammar", "syntax": "regex", "definition": "(yes|no)"}, StructuredOutput(regex="(yes|no)")),
        ({"type": "text"}, None),
        (None, None),
    ],
)
def test_a_forced_custom_tool_is_generated_under_its_grammar(
    fmt: dict[str, Any] | None, expected: StructuredOutput | None
) -> None:
    tool = {**APPLY_PATCH, "format": fmt} if fmt else {k: v for k, v in APPLY_PATCH.items() if k != "format"}
    t = translate(req(tools=[tool], tool_choice={"type": "custom", "name": "apply_patch"}))
    assert t.forced_custom is not None
    job = fake_request_job(StructuredOutput(json_schema={"type": "object"}))  # what prepare_chat set
    forced = force_custom(job, t.forced_custom)
    assert forced.requests[0].sampling.structured == expected
    assert forced.turn.forced_text == "input" and forced.turn.forced_name == "apply_patch"
    assert forced.requests[0].sampling.max_tokens == 8 and forced.meter is job.meter


# --- output items --------------------------------------------------------------------------


REFS = translate(req(tools=[EXEC, AGENTS, APPLY_PATCH])).tools


def check_events(events: list[dict[str, Any]]) -> list[Any]:
    return [EVENT.validate_python({**e, "sequence_number": i}) for i, e in enumerate(events)]


def test_a_namespaced_call_carries_its_namespace() -> None:
    items = OutputItems(tools=REFS)
    events = items.apply(
        [
            ToolCallStart(0, "call_a", "agents__spawn_agent"),
            ToolCallArgs(0, '{"task": "x"}'),
            ToolCallEnd(0, '{"task": "x"}'),
            ToolCallStart(1, "call_b", "exec_command"),
            ToolCallEnd(1, "{}"),
        ]
    )
    typed = check_events(events)
    added = [e for e in typed if e.type == "response.output_item.added"]
    done = [e for e in typed if e.type == "response.output_item.done"]
    assert [(e.item.name, e.item.namespace) for e in added] == [("spawn_agent", "agents"), ("exec_command", None)]
    assert [(e.item.name, e.item.namespace) for e in done] == [("spawn_agent", "agents"), ("exec_command", None)]
    assert "namespace" not in items.output[1]
    assert items.output[0] == {
        "id": items.output[0]["id"],
        "type": "function_call",
        "call_id": "call_a",
        "name": "spawn_agent",
        "arguments": '{"task": "x"}',
        "status": "completed",
        "namespace": "agents",
    }
    # The stored conversation names it as the model saw it.
    assert output_messages(items.output)[0]["tool_calls"][0]["function"]["name"] == "agents__spawn_agent"


ARGS = json.dumps({"input": PATCH}, ensure_ascii=False)


@pytest.mark.parametrize(
    "pieces",
    [
        [ARGS],  # a hermes call: whole when its block closes
        [ARGS[:-1], "}"],  # an XML call: the parameter, then the closing brace
        [ARGS[i : i + 3] for i in range(0, len(ARGS), 3)],  # a forced call, in pieces (escapes cut)
        [ARGS[i : i + 1] for i in range(0, len(ARGS), 1)],
    ],
)
def test_a_custom_tool_call_streams_its_input(pieces: list[str]) -> None:
    items = OutputItems(tools=REFS)
    calls: list[Event] = [ToolCallStart(0, "call_p", "apply_patch"), *(ToolCallArgs(0, p) for p in pieces)]
    events = items.apply([ContentDelta("Patching."), *calls, ToolCallEnd(0, ARGS)]) + items.close("completed")
    typed = check_events(events)
    kinds = [e.type for e in typed if "custom" in e.type or e.type.startswith("response.output_item")]
    assert kinds[:3] == ["response.output_item.added", "response.output_item.done", "response.output_item.added"]
    assert kinds[-2:] == ["response.custom_tool_call_input.done", "response.output_item.done"]
    assert "".join(e.delta for e in typed if e.type == "response.custom_tool_call_input.delta") == PATCH
    (done,) = [e for e in typed if e.type == "response.custom_tool_call_input.done"]
    assert done.input == PATCH and done.item_id.startswith("ctc_") and done.output_index == 1
    assert not [e for e in typed if e.type.startswith("response.function_call")]
    call = items.output[1]
    assert call == {
        "id": done.item_id,
        "type": "custom_tool_call",
        "call_id": "call_p",
        "name": "apply_patch",
        "input": PATCH,
        "status": "completed",
    }
    # The next turn sees the call as the model wrote it.
    (msg,) = output_messages(items.output)
    assert msg["tool_calls"][0]["function"] == {"name": "apply_patch", "arguments": ARGS}


def test_input_so_far_and_at_the_end() -> None:
    assert input_so_far('{"input": "a\\nb') == "a\nb"
    assert input_so_far('{"input": "a\\') == "a"  # cut inside an escape
    assert input_so_far('{"input": "a\\u00') == "a"
    assert input_so_far('{"input": "a\\u00e9"}') == "aé"
    assert input_so_far('{"input": "\\ud83d') == ""  # half a pair waits for the other half
    assert input_so_far('{"input": "\\ud83d\\ude00') == "😀"
    assert input_so_far('{"other": "x"}') == ""
    assert custom_input('{"input": "x"}') == "x" and custom_input('{"patch": "y"}') == "y"
    assert custom_input("not json") == "not json" and custom_input('{"a": 1}') == '{"a": 1}'


def test_reasoning_travels_in_encrypted_content() -> None:
    items = OutputItems(encrypted=True, summary=True)
    events = items.apply([ReasoningDelta("think "), ReasoningDelta("hard"), ContentDelta("ok")])
    events += items.close("completed")
    check_events(events)
    reasoning = items.output[0]
    assert base64.b64decode(reasoning["encrypted_content"]).decode() == "think hard"
    assert "encrypted_content" not in OutputItems().apply([ReasoningDelta("x")])[0]["item"]
    # Sent back as Codex does (content dropped), it is the reasoning again.
    back = {k: v for k, v in reasoning.items() if k != "content"}
    t = translate(req(input=[{"role": "user", "content": "q"}, back, {"role": "assistant", "content": "ok"}]))
    assert t.conversation[-1] == {"role": "assistant", "content": "ok", "reasoning_content": "think hard"}


# --- the encoder, on a fake job ---------------------------------------------------------------


def fake_job(turn: TurnSpec) -> Any:
    served = SimpleNamespace(
        name="tiny",
        engine=SimpleNamespace(kv_spec=SimpleNamespace(block_size=16)),
        settings=SimpleNamespace(enable_prefix_caching=True),
    )
    return SimpleNamespace(prompts=([0] * 40,), turn=turn, created=1700000000, served=served, meter=Meter())


async def chunks_of(pieces: list[str]) -> Any:
    for k, text in enumerate(pieces):
        last = k == len(pieces) - 1
        delta = ChoiceDelta(index=0, text=text, token_ids=(1,), finish_reason="stop" if last else None)
        yield 0, EngineChunk(choices=(delta,), finished=last, prompt_tokens=40)


def test_a_codex_turn_end_to_end_through_the_encoder() -> None:
    r = req(tools=[EXEC, AGENTS, APPLY_PATCH], include=["reasoning.encrypted_content"], store=False)
    t = translate(r)
    saved: list[Any] = []

    async def save(body: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        saved.append(messages)

    enc = ResponseEncoder(
        id="resp_1", echo=t.echo, conversation=t.conversation, save=save, tools=t.tools, encrypted=True
    )
    calls = (
        "<think>\nA file.\n</think>\n\n"
        f'<tool_call>\n{{"name": "apply_patch", "arguments": {ARGS}}}\n</tool_call>\n'
        '<tool_call>\n{"name": "agents__spawn_agent", "arguments": {"task": "t"}}\n</tool_call>'
    )
    spec = TurnSpec(reasoning="maybe", tool_format="hermes", tools=t.chat.function_tools)
    job = fake_job(spec)
    pieces = [calls[i : i + 7] for i in range(0, len(calls), 7)]
    body = asyncio.run(enc.complete(job, metered(job, chunks_of(pieces))))
    resp = Response.model_validate(body)
    reasoning, patch, spawn = resp.output
    assert reasoning.type == "reasoning" and reasoning.encrypted_content is not None
    assert patch.type == "custom_tool_call" and patch.input == PATCH and patch.name == "apply_patch"
    assert spawn.type == "function_call" and (spawn.name, spawn.namespace) == ("spawn_agent", "agents")
    assert saved[0][-1]["tool_calls"][1]["function"]["name"] == "agents__spawn_agent"


def test_a_lark_grammar_reaches_a_vllm_server() -> None:
    from engine_adapter.vllm_server import completion_body

    sampling = SamplingOptions(max_tokens=8, structured=StructuredOutput(grammar=LARK))
    body = completion_body(EngineRequest(request_id="r", prompt_token_ids=(1,), sampling=sampling), "m")
    assert body["structured_outputs"] == {"grammar": LARK}
