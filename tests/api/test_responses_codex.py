"""/v1/responses as Codex CLI 0.171.0 uses it, on the replay engine (engine_adapter/replay.py):
the request it really sends (tests/api/codex_request.json: namespace, custom and hosted tools,
its hints, zstd-compressed or not), a freeform `apply_patch` call coming back as a
`custom_tool_call` with the exact patch (whole and streamed), the next turns with the call's
output, a namespaced call's round trip, and the requests the gateway refuses. Every stream
event and response object is read with the openai SDK's models."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import zstandard
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from engine_adapter import recordings
from engine_adapter.recordings import tag
from tests.conftest import API_KEY, DENSE, REPLAY_AGENTS, Server

EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
SAMPLE = json.loads((Path(__file__).parent / "codex_request.json").read_text())
PATCH = json.loads(recordings.CODEX_PATCH[0].split("\n")[1])["arguments"]["input"]
HEADERS = {"Authorization": f"Bearer {API_KEY}", **{k: v for k, v in SAMPLE["headers"].items() if k != "accept"}}


def codex_body(recording: str, *, stream: bool = True) -> dict[str, Any]:
    """The captured request, on the replay model, its last user message tagged."""
    body: dict[str, Any] = copy.deepcopy(SAMPLE["body"])
    body["model"] = REPLAY_AGENTS
    body["stream"] = stream
    last = body["input"][-1]
    assert last["role"] == "user"
    last["content"][-1]["text"] += f" {tag(recording)}"
    return body


@pytest.fixture(scope="module")
def http(replay_server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=replay_server.api, headers=HEADERS, timeout=60) as c:
        yield c


def post(http: httpx.Client, body: dict[str, Any], encoding: str | None = None) -> httpx.Response:
    raw = json.dumps(body).encode()
    headers = {"content-type": "application/json"}
    if encoding == "zstd":
        raw, headers["content-encoding"] = zstandard.ZstdCompressor().compress(raw), "zstd"
    return http.post("/responses", content=raw, headers=headers)


def events_of(r: httpx.Response) -> list[Any]:
    """The SSE frames, each checked against the SDK's event models."""
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    out = []
    for frame in r.text.strip().split("\n\n"):
        head, data = frame.split("\n")
        event = EVENT.validate_python(json.loads(data.removeprefix("data: ")))
        assert head == f"event: {event.type}"
        out.append(event)
    assert [e.sequence_number for e in out] == list(range(len(out)))
    return out


def final(events: list[Any]) -> Response:
    assert events[-1].type == "response.completed"
    response: Response = events[-1].response
    return response


@pytest.mark.parametrize("encoding", [None, "zstd"])
def test_the_captured_codex_request_calls_apply_patch(http: httpx.Client, encoding: str | None) -> None:
    events = events_of(post(http, codex_body("codex_patch"), encoding))
    response = final(events)
    (call,) = response.output
    assert call.type == "custom_tool_call" and call.name == "apply_patch" and call.input == PATCH
    assert call.call_id.startswith("call_") and call.id is not None and call.id.startswith("ctc_")
    # Streamed as the SDK expects a custom tool call: added, the input in deltas, done.
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[2] == "response.output_item.added" and events[2].item.type == "custom_tool_call"
    assert "".join(e.delta for e in events if e.type == "response.custom_tool_call_input.delta") == PATCH
    (done,) = [e for e in events if e.type == "response.custom_tool_call_input.done"]
    assert done.input == PATCH and done.item_id == call.id
    (item_done,) = [e for e in events if e.type == "response.output_item.done"]
    assert item_done.item.type == "custom_tool_call" and item_done.item.input == PATCH
    # The tools come back as sent (web_search too), and so do Codex's hints.
    assert [t.type for t in response.tools] == [t["type"] for t in SAMPLE["body"]["tools"]]
    assert response.store is False and response.prompt_cache_key == SAMPLE["body"]["prompt_cache_key"]
    assert response.parallel_tool_calls is True and response.tool_choice == "auto"
    assert response.usage is not None and response.usage.input_tokens > 5000  # the whole Codex prompt


def test_not_streamed_too(http: httpx.Client) -> None:
    r = post(http, codex_body("codex_patch", stream=False))
    assert r.status_code == 200, r.text
    response = Response.model_validate(r.json())
    (call,) = response.output
    assert call.type == "custom_tool_call" and call.input == PATCH
    r = post(http, codex_body("answer", stream=False), "zstd")
    assert r.status_code == 200, r.text
    assert Response.model_validate(r.json()).output_text == recordings.ANSWER


def test_the_next_turn_sends_the_call_and_its_output_back(http: httpx.Client) -> None:
    first = final(events_of(post(http, codex_body("codex_patch"))))
    (call,) = first.output
    body = codex_body("codex_patch")
    # As Codex sends it: the call as it came, then its output (Codex's apply_patch result).
    body["input"] += [
        call.model_dump(exclude_none=True),
        {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Success. Updated: A hello.txt"},
    ]
    events = events_of(post(http, body, "zstd"))
    second = final(events)
    assert second.output_text == recordings.CODEX_PATCH[1]
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens  # the call and its output are in the prompt


def test_a_namespaced_call_round_trip(http: httpx.Client) -> None:
    events = events_of(post(http, codex_body("codex_wait")))
    response = final(events)
    (call,) = response.output
    assert call.type == "function_call" and (call.name, call.namespace) == ("wait_agent", "multi_agent_v1")
    assert json.loads(call.arguments) == {"targets": ["agent-1"], "timeout_ms": 30000}
    added = [e.item for e in events if e.type == "response.output_item.added"]
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [(i.name, i.namespace) for i in added + done] == [("wait_agent", "multi_agent_v1")] * 2
    # Stateless, as Codex does it: the call comes back with its namespace.
    body = codex_body("codex_wait")
    body["input"] += [
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"status": "completed"}'},
    ]
    assert final(events_of(post(http, body))).output_text == recordings.CODEX_WAIT[1]


def test_a_namespaced_call_continued_from_the_store(http: httpx.Client) -> None:
    body = codex_body("codex_wait", stream=False)
    body["store"] = True
    r = post(http, body)
    assert r.status_code == 200, r.text
    first = Response.model_validate(r.json())
    (call,) = first.output
    assert call.type == "function_call" and call.namespace == "multi_agent_v1"
    stored = http.get(f"/responses/{first.id}")
    assert stored.status_code == 200 and stored.json()["output"][0]["namespace"] == "multi_agent_v1"
    follow = {
        "model": REPLAY_AGENTS,
        "previous_response_id": first.id,
        "tools": SAMPLE["body"]["tools"],
        "input": [{"type": "function_call_output", "call_id": call.call_id, "output": "done"}],
    }
    r = post(http, follow)
    assert r.status_code == 200, r.text
    assert Response.model_validate(r.json()).output_text == recordings.CODEX_WAIT[1]


def test_reasoning_comes_back_through_encrypted_content(http: httpx.Client) -> None:
    body = codex_body("think", stream=False)
    r = post(http, body)
    assert r.status_code == 200, r.text
    reasoning, message = Response.model_validate(r.json()).output
    assert reasoning.type == "reasoning" and reasoning.encrypted_content
    assert [s.text for s in reasoning.summary] == [c.text for c in reasoning.content or ()]  # reasoning.summary: auto
    assert message.type == "message"
    text = "".join(c.text for c in reasoning.content or ())
    assert base64.b64decode(reasoning.encrypted_content).decode() == text  # not secret: the client's own
    # Sent back as Codex keeps it (summary and encrypted_content, no content), with a call of
    # the same turn: accepted (what the prompt makes of it is the unit tests').
    kept = reasoning.model_dump(exclude_none=True, exclude={"content"})
    call = {"type": "function_call", "call_id": "call_1", "name": "exec_command", "arguments": '{"cmd": "ls"}'}
    result = {"type": "function_call_output", "call_id": "call_1", "output": "hello.txt"}
    body = codex_body("answer", stream=False)
    body["input"] += [kept, call, result]
    r = post(http, body)
    assert r.status_code == 200, r.text
    assert Response.model_validate(r.json()).output_text == recordings.ANSWER


def test_forcing_a_hosted_tool_is_refused(http: httpx.Client) -> None:
    for choice in ({"type": "web_search"}, {"type": "function", "name": "web_search"}):
        body = codex_body("answer", stream=False)
        body["tool_choice"] = choice
        r = post(http, body)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "tool_choice" and "'web_search'" in error["message"]


def test_bodies_the_gateway_cannot_read(http: httpx.Client) -> None:
    # A decompression bomb: 64 MiB of zeros in a few KiB, far over the 32 MiB body limit decoded.
    bomb = zstandard.ZstdCompressor(level=19).compress(b"\0" * (8 * 1024 * 1024)) * 8
    r = http.post("/responses", content=bomb, headers={"content-type": "application/json", "content-encoding": "zstd"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    r = http.post("/responses", content=b"{}", headers={"content-type": "application/json", "content-encoding": "br"})
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_content_encoding"
    r = http.post("/responses", content=b"\x28\xb5\x2f\xfd junk", headers={"content-encoding": "zstd"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_content_encoding"


# --- a forced custom tool, under its grammar, on a real engine ----------------------------------
# The replay engine cannot follow a grammar; the session's tiny vLLM engine (random weights)
# can, and its noise shows the constraint: only the grammar's strings come out.


def forced(server: Server, fmt: dict[str, Any], *, stream: bool = False) -> httpx.Response:
    body = {
        "model": DENSE,
        "input": "Answer.",
        "tools": [{"type": "custom", "name": "answer", "description": "Answer.", "format": fmt}],
        "tool_choice": {"type": "custom", "name": "answer"},
        "max_output_tokens": 48,
        "temperature": 0,
        "stream": stream,
    }
    headers = {"Authorization": f"Bearer {API_KEY}"}
    return httpx.post(f"{server.api}/responses", json=body, headers=headers, timeout=120)


@pytest.mark.engine
@pytest.mark.parametrize(
    ("fmt", "allowed"),
    [
        ({"type": "grammar", "syntax": "lark", "definition": 'start: "yes" | "no"\n'}, {"yes", "no"}),
        ({"type": "grammar", "syntax": "regex", "definition": "(red|green|blue)"}, {"red", "green", "blue"}),
    ],
)
def test_a_forced_custom_tool_follows_its_grammar(server: Server, fmt: dict[str, Any], allowed: set[str]) -> None:
    r = forced(server, fmt)
    assert r.status_code == 200, r.text
    response = Response.model_validate(r.json())
    (call,) = response.output
    assert call.type == "custom_tool_call" and call.name == "answer" and call.input in allowed
    assert response.status == "completed"
    events = events_of(forced(server, fmt, stream=True))
    (done,) = [e for e in events if e.type == "response.custom_tool_call_input.done"]
    assert done.input in allowed
    assert "".join(e.delta for e in events if e.type == "response.custom_tool_call_input.delta") == done.input


@pytest.mark.engine
def test_a_forced_apply_patch_is_a_patch(server: Server) -> None:
    (codex_patch,) = [t for t in SAMPLE["body"]["tools"] if t.get("name") == "apply_patch"]
    r = forced(server, codex_patch["format"])
    assert r.status_code == 200, r.text
    (call,) = Response.model_validate(r.json()).output
    assert call.type == "custom_tool_call" and call.input.startswith("*** Begin Patch\n*** ")
