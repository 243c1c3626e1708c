import json
import math

from engine_adapter.base import ChoiceDelta, TokenLogprob
from gateway.http.openai.bodies import (
    LOGPROB_FLOOR,
    ChoiceState,
    CompletionLogprobs,
    Usage,
    chat_logprobs,
    prompt_logprobs,
)


def lp(token: str, value: float) -> TokenLogprob:
    return TokenLogprob(token_id=1, token=token, logprob=value, top=((1, token, value), (2, "x", value - 1)))


def test_completion_logprobs_offsets_run_across_chunks() -> None:
    acc = CompletionLogprobs(top_k=1)
    acc.add([None, lp(" b", -1.0)], ["a", " b"])
    first = acc.take()
    acc.add([lp("cd", -2.0)], ["cd"])
    second = acc.take()
    assert first["text_offset"] == [0, 1] and first["token_logprobs"] == [None, -1.0]
    assert first["top_logprobs"] == [None, {" b": -1.0}]
    assert second["text_offset"] == [3] and second["tokens"] == ["cd"]


def test_completion_top_logprobs_carry_the_sampled_token() -> None:
    zero = CompletionLogprobs(top_k=0)
    zero.add([lp(" b", -1.0)], [" b"])
    assert zero.body()["top_logprobs"] == [{" b": -1.0}]
    off_top = TokenLogprob(token_id=3, token=" z", logprob=-5.0, top=((1, " a", -0.5), (2, " c", -1.5)))
    two = CompletionLogprobs(top_k=2)
    two.add([off_top], [" z"])
    assert two.body()["top_logprobs"] == [{" z": -5.0, " a": -0.5, " c": -1.5}]


def test_choice_state_accumulates() -> None:
    s = ChoiceState(index=0)
    s.add(ChoiceDelta(index=0, text="ab", token_ids=(1, 2)))
    s.add(ChoiceDelta(index=0, text="c", token_ids=(3,), finish_reason="length"))
    assert (s.text, s.completion_tokens, s.finish_reason) == ("abc", 3, "length")


def test_usage_body() -> None:
    assert Usage(prompt_tokens=5, completion_tokens=2, cached_tokens=4, reasoning_tokens=1).body() == {
        "prompt_tokens": 5,
        "completion_tokens": 2,
        "total_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 4},
        "completion_tokens_details": {"reasoning_tokens": 1},
    }


def test_chat_logprobs_shape() -> None:
    body = chat_logprobs([lp("é", -0.5)], top_k=2)
    entry = body["content"][0]
    assert entry["bytes"] == list("é".encode())
    assert [t["token"] for t in entry["top_logprobs"]] == ["é", "x"]


def test_logprobs_json_cannot_carry_are_floored_as_vllm_does() -> None:
    """-inf (a token a grammar masked) and NaN become vLLM's -9999.0: strict JSON, no 500."""
    masked = TokenLogprob(
        token_id=1, token="a", logprob=-math.inf, top=((2, "b", math.nan), (1, "a", -math.inf)), rank=2
    )
    chat = chat_logprobs([masked], 2)
    legacy = CompletionLogprobs(top_k=2)
    legacy.add([masked], ["a"])
    prompt = prompt_logprobs((None, masked), 2, 2)
    for body in (chat, legacy.body(), prompt):
        json.dumps(body, allow_nan=False)  # raises on any non-finite float
    assert chat["content"][0]["logprob"] == LOGPROB_FLOOR == -9999.0
    assert [t["logprob"] for t in chat["content"][0]["top_logprobs"]] == [-9999.0, -9999.0]
    assert legacy.body()["token_logprobs"] == [-9999.0] and legacy.body()["top_logprobs"] == [
        {"a": -9999.0, "b": -9999.0}
    ]
    assert prompt[1] == {
        "1": {"logprob": -9999.0, "rank": 2, "decoded_token": "a"},
        "2": {"logprob": -9999.0, "rank": 1, "decoded_token": "b"},
    }
    assert chat_logprobs([lp("c", math.inf)], 0)["content"][0]["logprob"] == 0.0
    assert chat_logprobs([lp("c", -0.25)], 0)["content"][0]["logprob"] == -0.25  # a finite one as it is
