"""Fuzzing vLLM's extensions on a real vLLM engine: 1,200 generated chat and completions
requests (a fixed seed), each mixing the fields scripts written for `vllm serve` send, valid
and not (structured outputs that compile and that do not, prompt logprobs, token ids, echo,
continued messages, truncation, usage on every chunk, n greedy choices, forced tools, ids at
the vocabulary's edge, refused fields, wrong types). Every answer must be a 2xx or a 4xx in
OpenAI's error shape, never a 5xx; a stream must end with [DONE] and carry no server error.
benchmarks/fuzz.py fuzzes the whole OpenAPI document on the simulated engine."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from tests.conftest import API_KEY, DENSE, Server

pytestmark = pytest.mark.engine  # runs on the shared vLLM engines

CASES = 1200
VOCAB = 151936  # config.json's vocab_size of models/tiny-qwen3

JUNK = st.one_of(
    st.none(), st.text(max_size=5), st.integers(-(2**40), 2**40), st.floats(), st.lists(st.integers(), max_size=2)
)
CONSTRAINTS = st.one_of(
    st.fixed_dictionaries({"choice": st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=3)}),
    st.fixed_dictionaries({"regex": st.sampled_from(["[a-z]{2}", "(a|b)+", "(unclosed", "\\d{1,3}", "a{2,1}", ""])}),
    st.fixed_dictionaries(
        {
            "json": st.sampled_from(
                [
                    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                    {"type": "array", "items": {"type": "string"}, "maxItems": 2},
                    {"type": "no-such-type"},
                    {"$ref": "#/$defs/missing"},
                    '{"type": "boolean"}',
                    "{broken",
                ]
            )
        }
    ),
    st.fixed_dictionaries({"grammar": st.sampled_from(['root ::= "y" | "n"', 'start: "a"+', "root ::= (", "?"])}),
    st.fixed_dictionaries(
        {
            "structural_tag": st.sampled_from(
                [
                    json.dumps({"type": "structural_tag", "format": {"type": "const_string", "value": "ok"}}),
                    json.dumps({"type": "structural_tag", "structures": [], "triggers": []}),
                    "{}",
                    "not json",
                ]
            )
        }
    ),
    st.fixed_dictionaries({"json_object": st.booleans()}),
    st.dictionaries(
        st.sampled_from(["regex", "choice", "json", "disable_any_whitespace", "whitespace_pattern", "other"]),
        JUNK,
        max_size=3,
    ),
)
RESPONSE_FORMATS = st.sampled_from(
    [
        {"type": "text"},
        {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
        {"type": "structural_tag", "format": {"type": "const_string", "value": "ok"}},
        {"type": "structural_tag", "format": {"type": "nope"}},
        {"type": "structural_tag"},
        {"type": "grammar"},
    ]
)
TOOL = {
    "type": "function",
    "function": {
        "name": "f",
        "parameters": {
            "type": "object",
            "properties": {"c": {"$ref": "#/$defs/C"}},
            "$defs": {"C": {"type": "string", "maxLength": 4}},
        },
    },
}
TOKEN_IDS = st.one_of(st.integers(0, 10), st.integers(VOCAB - 300, VOCAB + 2), st.integers(-2, -1))
# The extension fields, each present or not, valid or junk.
EXTENSIONS: dict[str, Any] = {
    "structured_outputs": st.one_of(CONSTRAINTS, JUNK),
    "response_format": st.one_of(RESPONSE_FORMATS, JUNK),
    "prompt_logprobs": st.one_of(st.integers(-2, 22), JUNK),
    "return_token_ids": st.one_of(st.booleans(), JUNK),
    "truncate_prompt_tokens": st.one_of(st.integers(-2, 40_000), JUNK),
    "truncation_side": st.sampled_from(["left", "right", "middle", None, 1]),
    "stream_options": st.one_of(
        st.fixed_dictionaries(
            {"include_usage": st.booleans()}, optional={"continuous_usage_stats": st.one_of(st.booleans(), JUNK)}
        ),
        JUNK,
    ),
    "n": st.one_of(st.integers(1, 3), JUNK),
    "temperature": st.sampled_from([0, 0.0, 1.0, 2.5, None]),
    "logit_bias": st.dictionaries(TOKEN_IDS.map(str), st.floats(-100, 100), max_size=3),
    "stop_token_ids": st.lists(TOKEN_IDS, max_size=3),
    "logprobs": st.one_of(st.booleans(), st.integers(-1, 6), JUNK),
    "top_logprobs": st.one_of(st.integers(-1, 21), JUNK),
    "use_beam_search": st.one_of(st.booleans(), JUNK),
    "cache_salt": st.one_of(st.text(max_size=4), JUNK),
    "priority": st.one_of(st.integers(-2, 2), JUNK),
    "add_special_tokens": st.one_of(st.booleans(), JUNK),
}
CHAT_ONLY: dict[str, Any] = {
    "echo": st.one_of(st.booleans(), JUNK),
    "add_generation_prompt": st.one_of(st.booleans(), JUNK),
    "continue_final_message": st.one_of(st.booleans(), JUNK),
    "tool_choice": st.sampled_from(["required", "auto", "none", {"type": "function", "function": {"name": "f"}}]),
}
MESSAGES = st.sampled_from(
    [
        [{"role": "user", "content": "hi"}],
        [{"role": "user", "content": "Count."}, {"role": "assistant", "content": "One, two,"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "x " * 40}],
    ]
)


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    chat = draw(st.booleans())
    fields = EXTENSIONS | (CHAT_ONLY if chat else {})
    names = draw(st.lists(st.sampled_from(sorted(fields)), max_size=5, unique=True))
    body: dict[str, Any] = {"model": DENSE, "max_tokens": draw(st.integers(1, 3)), "stream": draw(st.booleans())}
    for name in names:
        body[name] = draw(fields[name])
    if chat:
        body["messages"] = draw(MESSAGES)
        if "tool_choice" in body:
            body["tools"] = [TOOL]
        return "chat/completions", body
    body["prompt"] = draw(st.one_of(st.just("one two"), st.lists(st.integers(1, 5000), min_size=1, max_size=30)))
    return "completions", body


def _check(path: str, body: dict[str, Any], r: httpx.Response, lines: list[str]) -> None:
    assert r.status_code < 500, (path, body, r.status_code, "".join(lines)[:500])
    if r.status_code >= 400:
        err = json.loads("".join(lines))["error"]
        assert isinstance(err["message"], str) and err["type"], (path, body, err)
        return
    assert r.status_code == 200, (path, body, r.status_code)
    if r.headers["content-type"].startswith("text/event-stream"):
        events = [line[6:] for line in lines if line.startswith("data: ")]
        assert events and events[-1] == "[DONE]", (path, body, events[-3:])
        for e in events[:-1]:
            parsed = json.loads(e)
            assert "error" not in parsed or parsed["error"].get("code") not in (None, 500), (path, body, parsed)
    else:
        assert isinstance(json.loads("".join(lines))["choices"], list), (path, body)


def test_vllm_extensions_never_get_a_server_error(server: Server) -> None:
    statuses: Counter[int] = Counter()
    client = httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120)

    @seed(43)
    @settings(
        max_examples=CASES,
        deadline=None,
        database=None,
        derandomize=False,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=requests())
    def run(case: tuple[str, dict[str, Any]]) -> None:
        path, body = case
        # NaN and Infinity as Python writes them: not JSON, which the gateway must refuse (400).
        content = json.dumps(body)
        with client.stream("POST", path, content=content, headers={"Content-Type": "application/json"}) as r:
            lines = (
                list(r.iter_lines())
                if r.headers.get("content-type", "").startswith("text/event-stream")
                else [r.read().decode()]
            )
        statuses[r.status_code] += 1
        _check(path, body, r, lines)

    run()
    client.close()
    assert sum(statuses.values()) >= 1000, statuses
    # Both sides exercised: answers that ran on the engine, and refusals.
    assert statuses[200] > 200 and statuses[400] > 200, statuses
