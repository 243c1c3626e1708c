from engine_adapter.base import ChoiceDelta, TokenLogprob
from gateway.http.bodies import ChoiceState, CompletionLogprobs, Usage, chat_logprobs


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
