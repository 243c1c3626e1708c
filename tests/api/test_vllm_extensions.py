"""vLLM's extensions of the OpenAI API, as scripts written for `vllm serve` send them, through
the gateway's own path on a real vLLM engine: structured outputs (and their 400s), the prompt's
logprobs and token ids, chat's echo and continued messages, usage on every chunk, truncated
prompts, n greedy choices, and the fields the gateway refuses by name."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import httpx
import pytest

from tests.conftest import API_KEY, DENSE, DENSE_MAX_LEN, Server

pytestmark = pytest.mark.engine  # starts vLLM engines

AUTH = {"Authorization": f"Bearer {API_KEY}"}
HI = [{"role": "user", "content": "hi"}]


def post(server: Server, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.api}/{path}", json={"model": DENSE, **body}, headers=AUTH, timeout=120)


def chat(server: Server, **body: Any) -> dict[str, Any]:
    r = post(server, "chat/completions", {"messages": HI, "max_tokens": 8, **body})
    assert r.status_code == 200, r.text
    return dict(r.json())


def events(server: Server, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """A stream's JSON events (not [DONE]); the status must be 200."""
    out = []
    with httpx.stream(
        "POST", f"{server.api}/{path}", json={"model": DENSE, "stream": True, **body}, headers=AUTH, timeout=120
    ) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[6:]))
    assert not any("error" in e for e in out), out
    return out


def error(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 400, r.text
    return dict(r.json()["error"])


# -- structured outputs ---------------------------------------------------------------------


@pytest.mark.parametrize("path", ["chat/completions", "completions"])
def test_choice_constrains_the_answer(server: Server, path: str) -> None:
    choices = ["alpha", "beta", "gamma"]
    body: dict[str, Any] = {"max_tokens": 8, "temperature": 1.0, "seed": 3, "structured_outputs": {"choice": choices}}
    body |= {"messages": HI} if path.startswith("chat") else {"prompt": "pick one:"}
    for seed in range(3):
        r = post(server, path, body | {"seed": seed})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        text = choice["message"]["content"] if path.startswith("chat") else choice["text"]
        assert text in choices


def test_regex_constrains_the_answer(server: Server) -> None:
    body = chat(server, max_tokens=16, structured_outputs={"regex": "[a-c]{3}-[0-9]{2}"})
    assert re.fullmatch("[a-c]{3}-[0-9]{2}", body["choices"][0]["message"]["content"])


def test_json_schema_constrains_the_answer_given_as_object_or_text(server: Server) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    for given in (schema, json.dumps(schema)):
        body = chat(server, max_tokens=32, structured_outputs={"json": given})
        assert isinstance(json.loads(body["choices"][0]["message"]["content"])["ok"], bool)


@pytest.mark.parametrize(
    "grammar",
    ['root ::= "yes" | "no"', 'start: "yes" | "no"'],  # EBNF (GBNF), then Lark
    ids=["ebnf", "lark"],
)
def test_grammar_constrains_the_answer(server: Server, grammar: str) -> None:
    body = chat(server, max_tokens=8, structured_outputs={"grammar": grammar})
    assert body["choices"][0]["message"]["content"] in ("yes", "no")


def test_structural_tag_is_accepted_in_either_field(server: Server) -> None:
    tag = {
        "type": "structural_tag",
        "structures": [{"begin": "<n>", "schema": {"type": "integer"}, "end": "</n>"}],
        "triggers": ["<n>"],
    }
    assert chat(server, structured_outputs={"structural_tag": json.dumps(tag)})["choices"]
    assert chat(server, response_format=tag)["choices"]
    # xgrammar's own format: the whole answer is the tag's content.
    fmt = {"type": "structural_tag", "format": {"type": "const_string", "value": "fixed"}}
    assert chat(server, response_format=fmt)["choices"][0]["message"]["content"] == "fixed"
    bad = post(
        server,
        "chat/completions",
        {"messages": HI, "response_format": {"type": "structural_tag", "format": {"type": "nope"}}},
    )
    assert error(bad)["param"] == "response_format"


@pytest.mark.parametrize(
    ("constraint", "stream"),
    [
        ({"regex": "(unclosed"}, False),
        ({"regex": "(unclosed"}, True),  # a 400 before the stream, not an error event in it
        ({"json": {"type": "object", "properties": {"a": {"type": "no-such-type"}}}}, False),
        ({"json": "{not json"}, False),
        ({"grammar": 'root ::= "a" | '}, False),
        ({"structural_tag": "{}"}, False),
    ],
    ids=["regex", "regex-streamed", "schema", "schema-text", "grammar", "structural-tag"],
)
def test_an_invalid_constraint_is_a_400_naming_it(server: Server, constraint: dict[str, Any], stream: bool) -> None:
    r = post(
        server,
        "chat/completions",
        {"messages": HI, "max_tokens": 4, "stream": stream, "structured_outputs": constraint},
    )
    assert error(r)["param"].startswith("structured_outputs")


def test_two_constraints_or_none_are_a_400(server: Server) -> None:
    for constraint in ({"regex": "a", "choice": ["a"]}, {}, {"disable_any_whitespace": True}):
        r = post(server, "completions", {"prompt": "x", "structured_outputs": constraint})
        assert error(r)["param"] == "structured_outputs"
    both = {"prompt": "x", "structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}}
    assert error(post(server, "completions", both))["param"] == "structured_outputs"


def test_an_invalid_tool_schema_is_a_400_before_a_forced_call_streams(server: Server) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": 5}}}}
    body = {"messages": HI, "tools": [tool], "tool_choice": "required", "stream": True, "max_tokens": 8}
    assert error(post(server, "chat/completions", body))["param"] == "tool_choice"


def strict_json(text: str) -> Any:
    """JSON as a strict parser reads it (Python's reads NaN and -Infinity, which are not JSON)."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", ["chat/completions", "completions"])
def test_logprobs_a_grammar_masked_are_floored_as_vllm_does(server: Server, path: str, stream: bool) -> None:
    """The grammar masks all but a few tokens: their logprob is -inf, which JSON cannot carry
    (a 500 whole, `-Infinity` streamed); vLLM's server answers -9999.0, and so does this one."""
    body: dict[str, Any] = {"max_tokens": 4, "seed": 1, "stream": stream, "structured_outputs": {"choice": ["ab"]}}
    if path.startswith("chat"):
        body |= {"messages": HI, "logprobs": True, "top_logprobs": 5}
    else:
        body |= {"prompt": "pick one:", "logprobs": 5}
    with httpx.stream("POST", f"{server.api}/{path}", json={"model": DENSE, **body}, headers=AUTH, timeout=120) as r:
        text = r.read().decode()
    assert r.status_code == 200, text
    if stream:
        docs = [strict_json(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    else:
        docs = [strict_json(text)]
    assert not any("error" in d for d in docs), docs
    values: list[float] = []
    for d in docs:
        for c in d["choices"]:
            lps = c["logprobs"] or {}
            for entry in lps.get("content") or ():  # chat
                values += [entry["logprob"], *(t["logprob"] for t in entry["top_logprobs"])]
            values += [v for v in lps.get("token_logprobs") or () if v is not None]  # completions
            values += [v for top in lps.get("top_logprobs") or () if top for v in top.values()]
    assert -9999.0 in values and all(-9999.0 <= v <= 0 for v in values), values


# -- the prompt's logprobs and token ids -----------------------------------------------------


def test_prompt_logprobs_cover_every_prompt_token(server: Server) -> None:
    body = chat(server, prompt_logprobs=2, return_token_ids=True)
    ids, lps = body["prompt_token_ids"], body["prompt_logprobs"]
    assert len(ids) == len(lps) == body["usage"]["prompt_tokens"]
    assert lps[0] is None  # nothing precedes the first token
    for token_id, entry in zip(ids[1:], lps[1:], strict=True):
        assert str(token_id) in entry and 2 <= len(entry) <= 3  # the prompt's token and the top 2
        assert {"logprob", "rank", "decoded_token"} <= set(entry[str(token_id)])
        assert sorted(e["rank"] for e in entry.values())[:2] == [1, 2] or entry[str(token_id)]["rank"] <= 2


def test_completion_prompt_logprobs_are_per_choice(server: Server) -> None:
    r = post(server, "completions", {"prompt": "one two three", "max_tokens": 2, "prompt_logprobs": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    lps = body["choices"][0]["prompt_logprobs"]
    assert len(lps) == body["usage"]["prompt_tokens"] and lps[0] is None
    assert all(len(e) == 1 for e in lps[1:])  # 0: the prompt's own token alone


def test_prompt_logprobs_are_null_when_not_asked(server: Server) -> None:
    """As vLLM's server answers: its clients read the field (`completion.prompt_logprobs is None`)."""
    body = chat(server)
    assert "prompt_logprobs" in body and body["prompt_logprobs"] is None
    r = post(server, "completions", {"prompt": "one two", "max_tokens": 2})
    choice = r.json()["choices"][0]
    assert "prompt_logprobs" in choice and choice["prompt_logprobs"] is None


def test_prompt_logprobs_are_refused_when_streamed(server: Server) -> None:
    r = post(server, "chat/completions", {"messages": HI, "stream": True, "prompt_logprobs": 1})
    assert error(r)["param"] == "prompt_logprobs"


def test_token_ids_match_the_usage_streamed_and_not(server: Server) -> None:
    body = chat(server, return_token_ids=True, ignore_eos=True)
    assert len(body["choices"][0]["token_ids"]) == body["usage"]["completion_tokens"] == 8
    streamed = events(
        server,
        "chat/completions",
        {"messages": HI, "max_tokens": 8, "ignore_eos": True, "return_token_ids": True},
    )
    assert streamed[0]["prompt_token_ids"] == body["prompt_token_ids"]
    assert sum(len(c.get("token_ids") or ()) for e in streamed for c in e["choices"]) == 8

    r = post(
        server, "completions", {"prompt": [1, 2, 3], "max_tokens": 5, "ignore_eos": True, "return_token_ids": True}
    )
    choice = r.json()["choices"][0]
    assert choice["prompt_token_ids"] == [1, 2, 3] and len(choice["token_ids"]) == 5
    chunks = events(
        server, "completions", {"prompt": [1, 2, 3], "max_tokens": 5, "ignore_eos": True, "return_token_ids": True}
    )
    assert chunks[0]["choices"][0]["prompt_token_ids"] == [1, 2, 3]
    assert sum(len(c["token_ids"]) for e in chunks for c in e["choices"]) == 5


# -- chat's echo and continued messages ------------------------------------------------------

PREFILL = [{"role": "user", "content": "Count."}, {"role": "assistant", "content": "One, two,"}]


def test_echo_puts_the_last_assistant_text_first(server: Server) -> None:
    body = chat(server, messages=PREFILL, echo=True, add_generation_prompt=False, continue_final_message=True)
    assert body["choices"][0]["message"]["content"].startswith("One, two,")
    streamed = events(
        server,
        "chat/completions",
        {
            "messages": PREFILL,
            "max_tokens": 4,
            "echo": True,
            "add_generation_prompt": False,
            "continue_final_message": True,
        },
    )
    text = "".join(c["delta"].get("content") or "" for e in streamed for c in e["choices"])
    assert text.startswith("One, two,")
    # With the prompt's logprobs (vLLM answers an echo so: at top_logprobs' k, here 0).
    lps = body["prompt_logprobs"]
    assert len(lps) == body["usage"]["prompt_tokens"] and all(len(e) == 1 for e in lps[1:])
    # After a user message with a generation prompt, nothing is echoed (vLLM's rule).
    assert not chat(server, echo=True, max_tokens=1)["choices"][0]["message"]["content"].startswith("hi")


def test_continue_final_message_leaves_the_message_open(server: Server, hf_tokenizer: Any) -> None:
    body = chat(
        server, messages=PREFILL, add_generation_prompt=False, continue_final_message=True, return_token_ids=True
    )
    text = hf_tokenizer.decode(body["prompt_token_ids"])
    assert text.endswith("One, two,")  # no end-of-turn after the assistant's text
    closed = chat(server, messages=PREFILL, add_generation_prompt=False, return_token_ids=True)
    assert hf_tokenizer.decode(closed["prompt_token_ids"]).rstrip().endswith("<|im_end|>")
    r = post(server, "chat/completions", {"messages": PREFILL, "continue_final_message": True})
    assert "add_generation_prompt" in error(r)["message"]


# -- usage on every chunk --------------------------------------------------------------------


@pytest.mark.parametrize("path", ["chat/completions", "completions"])
def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk(server: Server, path: str) -> None:
    body: dict[str, Any] = {
        "max_tokens": 6,
        "ignore_eos": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    body |= {"messages": HI} if path.startswith("chat") else {"prompt": "hi"}
    chunks = events(server, path, body)
    assert all(c["usage"] is not None for c in chunks)
    done = [c["usage"]["completion_tokens"] for c in chunks]
    assert done == sorted(done) and done[-1] == 6
    assert all(
        c["usage"]["total_tokens"] == c["usage"]["prompt_tokens"] + c["usage"]["completion_tokens"] for c in chunks
    )
    # vLLM's test: each chunk's count grows (chat's opening role chunk counts 0); only the
    # usage-only last chunk repeats the count before it.
    assert all(a < b for a, b in itertools.pairwise(done[:-1])) and done[-2] == done[-1], done
    without = events(server, path, body | {"stream_options": {"include_usage": True}})
    assert [c["usage"] is None for c in without] == [True] * (len(without) - 1) + [False]


# -- truncated prompts -----------------------------------------------------------------------


def test_truncate_prompt_tokens_keeps_the_side_asked(server: Server) -> None:
    prompt = list(range(100, 150))
    for side, kept in (("left", prompt[-10:]), ("right", prompt[:10])):
        r = post(
            server,
            "completions",
            {
                "prompt": prompt,
                "max_tokens": 1,
                "truncate_prompt_tokens": 10,
                "truncation_side": side,
                "return_token_ids": True,
            },
        )
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == 10
        assert r.json()["choices"][0]["prompt_token_ids"] == kept
    whole = post(server, "completions", {"prompt": prompt, "max_tokens": 1, "truncate_prompt_tokens": -1})
    assert whole.json()["usage"]["prompt_tokens"] == 50
    chat_cut = chat(server, max_tokens=1, truncate_prompt_tokens=3, truncation_side="left")
    assert chat_cut["usage"]["prompt_tokens"] == 3
    r = post(server, "completions", {"prompt": prompt, "truncate_prompt_tokens": DENSE_MAX_LEN + 1})
    assert error(r)["param"] == "truncate_prompt_tokens"


# -- n greedy choices ------------------------------------------------------------------------


def test_n_greedy_choices_are_answered(server: Server) -> None:
    body = chat(server, n=2, temperature=0, max_tokens=6, ignore_eos=True)
    texts = [c["message"]["content"] for c in body["choices"]]
    assert [c["index"] for c in body["choices"]] == [0, 1] and texts[0] == texts[1]
    assert body["usage"]["completion_tokens"] == 12  # billed per choice, as OpenAI bills n
    chunks = events(server, "chat/completions", {"messages": HI, "n": 2, "temperature": 0, "max_tokens": 6})
    assert all(len(c["choices"]) == 1 for c in chunks)
    finished = sorted(c["choices"][0]["index"] for c in chunks if c["choices"][0]["finish_reason"])
    assert finished == [0, 1]


# -- a forced call the token limit cuts ------------------------------------------------------

WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


@pytest.mark.parametrize("stream", [False, True])
def test_a_cut_forced_call_never_has_unparsable_arguments(server: Server, stream: bool) -> None:
    body = {
        "messages": HI,
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "function": {"name": "weather"}},
        "max_completion_tokens": 2,
    }
    if stream:
        chunks = events(server, "chat/completions", body)
        calls = [c["delta"].get("tool_calls") for e in chunks for c in e["choices"] if c["delta"].get("tool_calls")]
        finish = [c["finish_reason"] for e in chunks for c in e["choices"] if c["finish_reason"]]
    else:
        r = post(server, "chat/completions", body)
        assert r.status_code == 200, r.text
        message = r.json()["choices"][0]["message"]
        calls = message["tool_calls"]
        assert calls is None  # as vLLM answers a forced call with none in it, not []
        finish = [r.json()["choices"][0]["finish_reason"]]
    assert not calls and finish == ["length"]
    whole = post(server, "chat/completions", body | {"max_completion_tokens": 64, "seed": 7}).json()
    call = whole["choices"][0]["message"]["tool_calls"][0]
    assert isinstance(json.loads(call["function"]["arguments"]), dict)


# -- what the gateway does not honour --------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [("use_beam_search", True), ("cache_salt", "x" * 43), ("vllm_xargs", {"a": 1}), ("priority", 5)],
)
def test_a_field_not_honoured_is_a_400_naming_it(server: Server, field: str, value: Any) -> None:
    err = error(post(server, "chat/completions", {"messages": HI, field: value}))
    assert err["param"] == field and err["code"] == "unsupported_parameter" and field in err["message"]


def test_several_bad_logit_bias_keys_are_all_named(server: Server) -> None:
    err = error(post(server, "chat/completions", {"messages": HI, "logit_bias": {"-1": 1, "abc": 1, "5": 1}}))
    assert err["param"] == "logit_bias" and "'-1', 'abc'" in err["message"], err


def test_a_refused_field_at_its_default_is_accepted(server: Server) -> None:
    assert chat(server, use_beam_search=False, spaces_between_special_tokens=True, add_special_tokens=False)
    r = post(server, "completions", {"prompt": "x", "max_tokens": 1, "add_special_tokens": True, "length_penalty": 1.0})
    assert r.status_code == 200, r.text
