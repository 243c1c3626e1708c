import pytest
from pydantic import ValidationError

from gateway.http.schemas import ChatCompletionRequest, CompletionRequest


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
