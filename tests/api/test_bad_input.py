"""Bad input gets a 400 (413 for a body too large) naming the parameter, never a 5xx, and
nothing reaches the engine: through the real openai SDK (raw HTTP where the SDK cannot
send the bad body), on a gateway with the simulated engine (benchmarks/fuzz.py's config)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from benchmarks.fuzz import API_KEY, MODEL, gateway_config
from tests.conftest import Fleet, Launch, Server, config_launch, free_port

MAX_BODY = 65536
MAX_MESSAGES = 16
HI = [{"role": "user", "content": "hi"}]


def side_by_side(request: pytest.FixtureRequest, tmp: Path) -> list[Launch]:
    """This module's server, started with the session's others (tests/conftest.py: `fleet`)."""
    cfg = gateway_config(free_port(), max_body_bytes=MAX_BODY, max_messages=MAX_MESSAGES)
    return [config_launch(cfg, tmp)]


@pytest.fixture(scope="module")
def gateway(fleet: Fleet) -> Iterator[Server]:
    with fleet.servers(__name__) as (srv,):
        yield srv


@pytest.fixture(scope="module")
def sdk(gateway: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.api, api_key=API_KEY, max_retries=0, timeout=60)


def engine_work(server: Server) -> tuple[int, int, int]:
    """What reached the engine so far: admitted requests, scheduler steps, tokens generated."""
    r = httpx.get(f"{server.base_url}/sparkgate/stats", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30)
    stats = r.json()
    engine = stats["engines"][MODEL]["stats"]
    return stats["admission"]["admitted"], engine["steps"], engine["generation_tokens"]


def assert_refused(
    server: Server, send: Any, status: int, code: str, param: str | None, *, message_has: str = ""
) -> None:
    """`send()` is answered with this error, and the engine gets nothing."""
    before = engine_work(server)
    try:
        response = send()
    except openai.APIStatusError as e:
        response = e.response
    response = getattr(response, "http_response", response)  # the SDK's raw response: its HTTP one
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", code, param), error
    assert message_has in error["message"] and "Traceback" not in error["message"]
    assert engine_work(server) == before


def test_a_valid_request_reaches_the_engine(gateway: Server, sdk: openai.OpenAI) -> None:
    """The check every case below relies on can see a request that does reach the engine."""
    before = engine_work(gateway)
    done = sdk.chat.completions.create(model=MODEL, messages=HI, max_tokens=3, seed=2**63 - 1)  # type: ignore[arg-type]
    assert done.usage is not None and done.usage.completion_tokens == 3
    after = engine_work(gateway)
    assert after[0] == before[0] + 1 and after[2] >= before[2] + 3


CHAT_CASES: list[tuple[dict[str, Any], str, str]] = [
    # (extra body, code, param)
    ({"seed": 2**80}, "invalid_value", "seed"),  # was 503 "engine failed: can't serialize ints"
    ({"seed": -(2**63) - 1}, "invalid_value", "seed"),
    ({"stream": "yes"}, "invalid_type", "stream"),
    ({"stream_options": {"include_usage": True}}, "invalid_value", "stream_options"),
    ({"stream": True, "stream_options": {"include_usage": "yes"}}, "invalid_type", "stream_options.include_usage"),
    ({"temperature": -0.1}, "invalid_value", "temperature"),
    ({"temperature": "0.5"}, "invalid_type", "temperature"),
    ({"top_p": 1.5}, "invalid_value", "top_p"),
    ({"top_p": 0}, "invalid_value", "top_p"),
    ({"max_tokens": 0}, "invalid_value", "max_tokens"),
    ({"max_tokens": 2.5}, "invalid_type", "max_tokens"),
    ({"max_completion_tokens": -5}, "invalid_value", "max_completion_tokens"),
    ({"n": 0}, "invalid_value", "n"),
    ({"n": 9}, "invalid_value", "n"),  # limits.max_n
    ({"logprobs": True, "top_logprobs": 21}, "invalid_value", "top_logprobs"),
    ({"top_logprobs": 2}, "invalid_value", "top_logprobs"),  # without logprobs
    ({"logprobs": "yes"}, "invalid_type", "logprobs"),
    ({"presence_penalty": 2.5}, "invalid_value", "presence_penalty"),
    ({"frequency_penalty": -3}, "invalid_value", "frequency_penalty"),
    ({"logit_bias": {"5": 101}}, "invalid_value", "logit_bias.5"),
    ({"logit_bias": {"99999999": 1}}, "invalid_value", "logit_bias"),  # not in the vocabulary
    ({"logit_bias": {str(i): 1 for i in range(301)}}, "invalid_value", "logit_bias"),  # limits.max_logit_bias
    ({"stop": ["a", "b", "c", "d", "e"]}, "invalid_value", "stop"),  # limits.max_stop
    ({"stop": ["x" * 257]}, "invalid_value", "stop[0]"),  # limits.max_stop_chars
    ({"stop": [""]}, "invalid_value", "stop[0]"),
    ({"stop": [1]}, "invalid_type", "stop[0]"),
    ({"stop_token_ids": [99999999]}, "invalid_value", "stop_token_ids[0]"),
    ({"stop_token_ids": list(range(65))}, "invalid_value", "stop_token_ids"),  # limits.max_stop_token_ids
    ({"top_k": 2**40}, "invalid_value", "top_k"),
    ({"messages": HI * (MAX_MESSAGES + 1)}, "invalid_value", "messages"),  # limits.max_messages
    ({"messages": []}, "invalid_value", "messages"),
    ({"messages": [*HI, {"role": "user", "content": 5}]}, "invalid_type", "messages[1].content"),
    ({"messages": [{"content": "hi"}]}, "missing_required_parameter", "messages[0].role"),
    ({"messages": [{"role": "user"}]}, "missing_required_parameter", "messages[0].content"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "missing_required_parameter", "messages[0].tool_call_id"),
    (
        {"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]},
        "invalid_value",
        "tools",
    ),  # limits.max_tools
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"maximum": 2**70}}}]},
        "invalid_value",
        "tools[0].function.parameters",
    ),
    ({"model": 5}, "invalid_type", "model"),
]


@pytest.mark.parametrize(("extra", "code", "param"), CHAT_CASES, ids=[p for _, _, p in CHAT_CASES])
def test_chat(gateway: Server, sdk: openai.OpenAI, extra: dict[str, Any], code: str, param: str) -> None:
    assert_refused(
        gateway,
        lambda: sdk.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=HI,  # type: ignore[arg-type]
            max_tokens=2,
            extra_body=extra,
        ),
        400,
        code,
        param,
    )


COMPLETION_CASES: list[tuple[dict[str, Any], str, str]] = [
    ({"prompt": [1, -1]}, "invalid_value", "prompt[1]"),
    ({"prompt": [99999999]}, "invalid_value", "prompt"),  # not in the vocabulary
    ({"prompt": [[1, 2], [3, 2**40]]}, "invalid_value", "prompt[1][1]"),
    ({"prompt": ["a"] * (MAX_MESSAGES + 1)}, "invalid_value", "prompt"),  # limits.max_messages
    ({"prompt": 7}, "invalid_type", "prompt"),
    ({"logprobs": 6}, "invalid_value", "logprobs"),
    ({"echo": "true"}, "invalid_type", "echo"),
    ({"seed": 2**64}, "invalid_value", "seed"),
    ({"stream_options": {"include_usage": True}}, "invalid_value", "stream_options"),
]


@pytest.mark.parametrize(("extra", "code", "param"), COMPLETION_CASES, ids=[p for _, _, p in COMPLETION_CASES])
def test_completions(gateway: Server, sdk: openai.OpenAI, extra: dict[str, Any], code: str, param: str) -> None:
    assert_refused(
        gateway,
        lambda: sdk.completions.with_raw_response.create(model=MODEL, prompt="hi", max_tokens=2, extra_body=extra),
        400,
        code,
        param,
    )


RESPONSES_CASES: list[tuple[dict[str, Any], str, str]] = [
    ({"max_output_tokens": 0}, "invalid_value", "max_output_tokens"),
    ({"temperature": 3}, "invalid_value", "temperature"),
    ({"stream": "yes"}, "invalid_type", "stream"),
    ({"input": [{"role": "user", "content": "x"}] * (MAX_MESSAGES + 1)}, "invalid_value", "input"),
    ({"input": [{"role": "user", "content": 5}]}, "invalid_type", "input[0].content"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "invalid_value", "metadata"),
    ({"metadata": {"k": "v" * 513}}, "invalid_value", "metadata.k"),
    (
        {"text": {"format": {"type": "json_schema", "schema": {"maxItems": 2**80}}}},
        "invalid_value",
        "text.format.schema",
    ),
]


@pytest.mark.parametrize(("extra", "code", "param"), RESPONSES_CASES, ids=[p for _, _, p in RESPONSES_CASES])
def test_responses(gateway: Server, sdk: openai.OpenAI, extra: dict[str, Any], code: str, param: str) -> None:
    assert_refused(
        gateway,
        lambda: sdk.responses.with_raw_response.create(model=MODEL, input="hi", max_output_tokens=2, extra_body=extra),
        400,
        code,
        param,
    )


def post(server: Server, content: Any, content_type: str | None = "application/json") -> httpx.Response:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    if content_type is not None:
        headers["Content-Type"] = content_type
    return httpx.post(f"{server.api}/chat/completions", content=content, headers=headers, timeout=60)


def body(**extra: Any) -> bytes:
    return json.dumps({"model": MODEL, "messages": HI, "max_tokens": 2, **extra}).encode()


def test_bodies_that_are_not_json_documents(gateway: Server) -> None:
    too_big = body(messages=[{"role": "user", "content": "x" * MAX_BODY}])
    assert_refused(gateway, lambda: post(gateway, too_big), 413, "request_too_large", None)

    def chunked() -> Iterator[bytes]:  # no Content-Length: the gateway counts what arrives
        yield too_big[: len(too_big) // 2]
        yield too_big[len(too_big) // 2 :]

    assert_refused(gateway, lambda: post(gateway, chunked()), 413, "request_too_large", None)
    not_utf8 = body().replace(b'"hi"', b'"h\xffi"')
    assert_refused(gateway, lambda: post(gateway, not_utf8), 400, "invalid_encoding", None)
    assert_refused(gateway, lambda: post(gateway, b'{"model": '), 400, "invalid_json", None)
    deep = b'{"model": "m", "messages": ' + b"[" * 65 + b"]" * 65 + b"}"
    assert_refused(gateway, lambda: post(gateway, deep), 400, "json_too_deep", None)
    very_deep = b"[" * 1_000_000 + b"]" * 1_000_000  # no recursion anywhere: refused by counting
    assert_refused(gateway, lambda: post(gateway, very_deep[: MAX_BODY - 2] + b"]]"), 400, "json_too_deep", None)
    for kind in ("text/plain", "application/xml", "multipart/form-data; boundary=x"):
        assert_refused(gateway, lambda kind=kind: post(gateway, body(), kind), 400, "unsupported_content_type", None)
    nan = body().replace(b'"max_tokens": 2', b'"max_tokens": 2, "temperature": NaN')
    assert_refused(gateway, lambda: post(gateway, nan), 400, "invalid_value", "temperature")
    huge = body().replace(b'"max_tokens": 2', b'"max_tokens": 2, "top_p": 1e999')  # parses to infinity
    assert_refused(gateway, lambda: post(gateway, huge), 400, "invalid_value", "top_p")


def test_lenient_content_types_are_still_read_as_json(gateway: Server) -> None:
    """curl -d sends form encoding; some clients send no Content-Type: both are JSON here."""
    for kind in (None, "application/x-www-form-urlencoded", "application/json; charset=utf-8"):
        r = post(gateway, body(), kind)
        assert r.status_code == 200, (kind, r.text)


def test_token_ids_reach_the_model_s_whole_vocabulary_and_every_bad_one_is_named(
    gateway: Server, sdk: openai.OpenAI
) -> None:
    """Qwen's embedding has 151,936 rows (config.json's vocab_size), past the tokenizer's 151,669:
    vLLM accepts ids up to it, and so does the gateway; a 400 lists every id beyond it."""
    padded = {"logit_bias": {"151669": 1, "151935": -1}, "stop_token_ids": [151700, 151935]}
    r = sdk.chat.completions.create(model=MODEL, messages=HI, max_tokens=2, extra_body=padded)  # type: ignore[arg-type]
    assert r.choices[0].finish_reason in ("stop", "length")
    bias: Any = {"logit_bias": {"5": 1, "151936": 1, "200000": 1}}
    assert_refused(
        gateway,
        lambda: sdk.chat.completions.create(model=MODEL, messages=HI, max_tokens=2, extra_body=bias),  # type: ignore[arg-type]
        400,
        "invalid_value",
        "logit_bias",
        message_has="151936, 200000 are not token ids of this model (0..151935)",
    )
    stops: Any = {"stop_token_ids": [5, 151936, 160000]}
    assert_refused(
        gateway,
        lambda: sdk.chat.completions.create(model=MODEL, messages=HI, max_tokens=2, extra_body=stops),  # type: ignore[arg-type]
        400,
        "invalid_value",
        "stop_token_ids[1]",
        message_has="stop_token_ids[1] = 151936, stop_token_ids[2] = 160000",
    )
