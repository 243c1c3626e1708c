import json

import pytest
from pydantic import ValidationError

from gateway.lifecycle.requests import ChatCompletionRequest, CompletionRequest


def chat(**kw: object) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw})


def test_unknown_fields_ignored() -> None:
    r = chat(store=True, metadata={"a": 1}, service_tier="auto")
    assert r.model == "m"


def test_max_completion_tokens_wins() -> None:
    assert chat(max_tokens=10, max_completion_tokens=5).requested_max_tokens == 5
    assert chat(max_tokens=10).requested_max_tokens == 10
    assert chat().requested_max_tokens is None


def test_stop_forms() -> None:
    assert chat(stop="x").stop_list == ("x",)
    assert chat(stop=["a", "b"]).stop_list == ("a", "b")
    assert chat().stop_list == ()


def test_top_logprobs_needs_logprobs() -> None:
    with pytest.raises(ValidationError):
        chat(top_logprobs=2)


def test_json_schema_needs_schema() -> None:
    with pytest.raises(ValidationError):
        chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}})
    r = chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}})
    assert r.response_format is not None and r.response_format.json_schema is not None
    assert r.response_format.json_schema.schema_ == {"type": "object"}


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("a", ["a"]),
        (["a", "b"], ["a", "b"]),
        ([1, 2, 3], [[1, 2, 3]]),
        ([[1], [2, 3]], [[1], [2, 3]]),
        (["1", "2"], ["1", "2"]),  # strings stay strings: the union's exact match, not ids
    ],
)
def test_completion_prompt_shapes(prompt: object, expected: list[object]) -> None:
    r = CompletionRequest.model_validate({"model": "m", "prompt": prompt})
    assert r.prompts == expected
    assert r.max_tokens == 16


@pytest.mark.parametrize("bad", [{"prompt": []}, {"prompt": "x", "best_of": 3}, {"prompt": "x", "suffix": "y"}])
def test_completion_rejections(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"model": "m", **bad})


# --- OpenAI's rules: strict types, ranges, combinations; errors named as OpenAI names them ---


def refusal(model: type[ChatCompletionRequest] | type[CompletionRequest], body: dict[str, object]) -> tuple[str, str]:
    """(param, code) of the 400 a body gets, through the gateway's one mapping."""
    from fastapi.exceptions import RequestValidationError

    from gateway.http.errors import validation_message as _validation_message

    base: dict[str, object] = {"model": "m"}
    base |= {"messages": [{"role": "user", "content": "hi"}]} if model is ChatCompletionRequest else {"prompt": "x"}
    with pytest.raises(ValidationError) as e:
        model.model_validate({**base, **body})
    errors = [{**err, "loc": ("body", *err["loc"])} for err in e.value.errors()]
    _, param, code = _validation_message(RequestValidationError(errors))
    assert param is not None
    return param, code


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"seed": 2**80}, "seed", "invalid_value"),
        ({"seed": -(2**63) - 1}, "seed", "invalid_value"),
        ({"stream": "yes"}, "stream", "invalid_type"),
        ({"stream": 1}, "stream", "invalid_type"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "invalid_value"),
        ({"stream": False, "stream_options": {}}, "stream_options", "invalid_value"),
        ({"n": 2.0}, "n", "invalid_type"),
        ({"n": "2"}, "n", "invalid_type"),
        ({"temperature": float("nan")}, "temperature", "invalid_value"),
        ({"temperature": float("inf")}, "temperature", "invalid_value"),
        ({"temperature": "1"}, "temperature", "invalid_type"),
        ({"top_p": 0.0}, "top_p", "invalid_value"),
        ({"max_completion_tokens": 0}, "max_completion_tokens", "invalid_value"),
        ({"top_k": 2**31}, "top_k", "invalid_value"),
        ({"logit_bias": {"-1": 1}}, "logit_bias.-1", "invalid_value"),
        ({"logit_bias": {"7": -101}}, "logit_bias.7", "invalid_value"),
        ({"stop": 3}, "stop", "invalid_type"),
        ({"stop": ["a", 1]}, "stop[1]", "invalid_type"),
        ({"stop_token_ids": [-1]}, "stop_token_ids[0]", "invalid_value"),
        (
            {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": 5}]},
            "messages[1].content",
            "invalid_type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
            "messages[0].content[0].text",
            "invalid_type",
        ),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", "invalid_value"),
        ({"messages": [{"content": "x"}]}, "messages[0].role", "missing_required_parameter"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"x": 2**64}}}]},
            "tools[0].function.parameters",
            "invalid_value",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"x": float("nan")}}}},
            "response_format.json_schema.schema",
            "invalid_value",
        ),
        ({"chat_template_kwargs": {"n": -(2**70)}}, "chat_template_kwargs", "invalid_value"),
        ({"logprobs": 1}, "logprobs", "invalid_type"),
    ],
)
def test_chat_refusals(body: dict[str, object], param: str, code: str) -> None:
    assert refusal(ChatCompletionRequest, body) == (param, code)


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"prompt": [1, -2]}, "prompt[1]", "invalid_value"),  # the token-id member, not the string one
        ({"prompt": [[1], [2**40]]}, "prompt[1][0]", "invalid_value"),
        ({"prompt": 5}, "prompt", "invalid_type"),
        ({"logprobs": 6}, "logprobs", "invalid_value"),  # OpenAI's maximum for completions is 5
        ({"echo": "true"}, "echo", "invalid_type"),
    ],
)
def test_completion_refusals(body: dict[str, object], param: str, code: str) -> None:
    assert refusal(CompletionRequest, body) == (param, code)


def test_what_openai_allows_still_passes() -> None:
    r = chat(seed=2**63 - 1, stream=True, stream_options={"include_usage": True}, temperature=0, top_p=1, n=3)
    assert r.include_usage and r.seed == 2**63 - 1
    assert chat(stream_options=None).stream_options is None  # null is "not given"
    assert chat(top_logprobs=0).top_logprobs == 0  # 0 without logprobs: nothing asked
    assert chat(temperature=1).temperature == 1.0  # an integer is a number
    assert chat(logit_bias={"42": -100}).logit_bias == {"42": -100.0}
    assert CompletionRequest.model_validate({"model": "m", "prompt": [[1, 2], [3]]}).prompts == [[1, 2], [3]]


def test_type_error_messages_read_like_openai_s() -> None:
    from fastapi.exceptions import RequestValidationError

    from gateway.http.errors import validation_message as _validation_message

    with pytest.raises(ValidationError) as e:
        chat(stop=3)
    errors = [{**err, "loc": ("body", *err["loc"])} for err in e.value.errors()]
    message, _, _ = _validation_message(RequestValidationError(errors))
    assert message == "Invalid type for 'stop': expected a string or an array, but got an integer instead."


def test_vllm_fields_not_honoured_are_named_unless_at_their_default() -> None:
    from gateway.lifecycle.requests import refused_fields

    body = {"model": "m", "use_beam_search": True, "priority": 0, "cache_salt": "s", "add_special_tokens": False}
    assert refused_fields(body, "chat") == ["use_beam_search", "cache_salt"]
    assert refused_fields(body, "completion") == ["use_beam_search", "cache_salt", "add_special_tokens"]
    assert refused_fields({"use_beam_search": None, "bad_words": []}, "chat") == []
    assert refused_fields([1], "chat") == []


def test_structured_outputs_take_exactly_one_constraint() -> None:
    base = {"model": "m", "prompt": "x"}
    for given in ({}, {"regex": "a", "choice": ["a"]}, {"choice": []}):
        with pytest.raises(ValidationError):
            CompletionRequest.model_validate(base | {"structured_outputs": given})
    req = CompletionRequest.model_validate(base | {"structured_outputs": {"json": '{"type": "object"}'}})
    assert req.structured_outputs is not None and req.structured_outputs.json_schema == {"type": "object"}
    for text in ("[1]", "{oops"):
        req = CompletionRequest.model_validate(base | {"structured_outputs": {"json": text}})
        with pytest.raises(ValueError, match=r"structured_outputs\.json"):
            _ = req.structured_outputs.json_schema  # type: ignore[union-attr]


def test_chat_cannot_both_continue_the_last_message_and_open_a_new_one() -> None:
    msgs = [{"role": "assistant", "content": "a"}]
    with pytest.raises(ValidationError, match="add_generation_prompt"):
        ChatCompletionRequest.model_validate({"model": "m", "messages": msgs, "continue_final_message": True})
    ok = {"model": "m", "messages": msgs, "continue_final_message": True, "add_generation_prompt": False}
    assert ChatCompletionRequest.model_validate(ok).continue_final_message


def test_prompt_logprobs_are_not_streamed_and_usage_so_far_needs_usage() -> None:
    base = {"model": "m", "prompt": "x"}
    with pytest.raises(ValidationError, match="prompt_logprobs"):
        CompletionRequest.model_validate(base | {"stream": True, "prompt_logprobs": 1})
    only = CompletionRequest.model_validate(base | {"stream": True, "stream_options": {"continuous_usage_stats": True}})
    assert not only.continuous_usage
    both = {"include_usage": True, "continuous_usage_stats": True}
    assert CompletionRequest.model_validate(base | {"stream": True, "stream_options": both}).continuous_usage


def test_structural_tag_response_format_needs_its_tag() -> None:
    base = {"model": "m", "prompt": "x"}
    with pytest.raises(ValidationError, match="structural_tag"):
        CompletionRequest.model_validate(base | {"response_format": {"type": "structural_tag"}})
    fmt = {"type": "structural_tag", "format": {"type": "const_string", "value": "a"}}
    rf = CompletionRequest.model_validate(base | {"response_format": fmt}).response_format
    assert rf is not None and json.loads(rf.structural_tag) == fmt
    legacy = {"type": "structural_tag", "structures": [{"begin": "<a>", "end": "</a>"}], "triggers": ["<a>"]}
    rf = CompletionRequest.model_validate(base | {"response_format": legacy}).response_format
    assert rf is not None and json.loads(rf.structural_tag) == legacy


def test_several_bad_logit_bias_entries_are_named_in_one_error() -> None:
    """One bad key names its place (above); several are named together, as vLLM names them."""
    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(ValidationError) as e:
        ChatCompletionRequest.model_validate(base | {"logit_bias": {"-1": 1, "abc": 2, "5": 1, "6": 101}})
    (err,) = e.value.errors()
    assert err["loc"] == ("logit_bias",)
    assert "'-1', 'abc'" in err["msg"] and "-100 to 100: '6'" in err["msg"]
    with pytest.raises(ValidationError) as e:
        CompletionRequest.model_validate({"model": "m", "prompt": "x", "logit_bias": {"x": 1, "y": 1}})
    assert [x["loc"] for x in e.value.errors()] == [("logit_bias",)]
