"""Legacy completions through the real server with the OpenAI SDK."""

from __future__ import annotations

import openai
import pytest

from tests.conftest import DENSE, MOE

pytestmark = pytest.mark.engine  # starts vLLM engines


def count(tok, text: str) -> int:  # type: ignore[no-untyped-def]
    return len(tok.encode(text, add_special_tokens=False))


def test_string_prompt(client: openai.OpenAI, hf_tokenizer) -> None:  # type: ignore[no-untyped-def]
    prompt = "The quick brown fox jumps over"
    r = client.completions.create(model=DENSE, prompt=prompt, max_tokens=7, temperature=0)
    assert r.object == "text_completion"
    assert r.choices[0].text
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None
    assert r.usage.prompt_tokens == count(hf_tokenizer, prompt)
    assert r.usage.completion_tokens == 7


def test_default_max_tokens_is_16(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MOE, prompt="Once upon a time")
    assert r.usage is not None and r.usage.completion_tokens == 16


def test_list_of_prompts_and_n(client: openai.OpenAI, hf_tokenizer) -> None:  # type: ignore[no-untyped-def]
    prompts = ["Hello there", "A much longer prompt than the first one"]
    r = client.completions.create(model=DENSE, prompt=prompts, max_tokens=4, n=2, temperature=0.8, seed=1)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.usage is not None
    assert r.usage.prompt_tokens == sum(count(hf_tokenizer, p) for p in prompts)
    assert r.usage.completion_tokens == 16


def test_token_id_prompt(client: openai.OpenAI, hf_tokenizer) -> None:  # type: ignore[no-untyped-def]
    ids = hf_tokenizer.encode("token ids in, text out", add_special_tokens=False)
    r = client.completions.create(model=DENSE, prompt=ids, max_tokens=3, temperature=0)
    text = client.completions.create(model=DENSE, prompt="token ids in, text out", max_tokens=3, temperature=0)
    assert r.usage is not None and r.usage.prompt_tokens == len(ids)
    assert r.choices[0].text == text.choices[0].text


def test_echo_of_a_token_id_prompt(client: openai.OpenAI, hf_tokenizer) -> None:  # type: ignore[no-untyped-def]
    ids = hf_tokenizer.encode("ids echoed as text", add_special_tokens=False)
    r = client.completions.create(model=DENSE, prompt=ids, max_tokens=2, echo=True, temperature=0)
    assert r.choices[0].text.startswith("ids echoed as text")  # decoded for the echo only


def test_echo_with_logprobs(client: openai.OpenAI, hf_tokenizer) -> None:  # type: ignore[no-untyped-def]
    prompt = "Echo this prompt back"
    r = client.completions.create(model=DENSE, prompt=prompt, max_tokens=4, echo=True, logprobs=2, temperature=0)
    c = r.choices[0]
    assert c.text.startswith(prompt)
    lp = c.logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
    n_prompt = count(hf_tokenizer, prompt)
    assert len(lp.tokens) == n_prompt + 4
    assert "".join(lp.tokens) == c.text
    assert lp.token_logprobs[0] is None  # nothing predicts the first token
    assert all(v is not None for v in lp.token_logprobs[1:])
    assert lp.text_offset is not None and lp.text_offset[0] == 0
    assert lp.text_offset == sorted(lp.text_offset)


def test_logprobs_without_echo(client: openai.OpenAI) -> None:
    r = client.completions.create(model=DENSE, prompt="Count", max_tokens=5, logprobs=3, temperature=0)
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.top_logprobs is not None
    assert len(lp.tokens) == 5
    assert all(len(t or {}) == 3 for t in lp.top_logprobs)


def test_stream(client: openai.OpenAI) -> None:
    chunks = list(
        client.completions.create(
            model=DENSE,
            prompt="Streaming",
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    whole = client.completions.create(model=DENSE, prompt="Streaming", max_tokens=6, temperature=0)
    assert text == whole.choices[0].text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_stream_echo(client: openai.OpenAI) -> None:
    chunks = list(
        client.completions.create(model=DENSE, prompt="Say it", max_tokens=3, echo=True, stream=True, temperature=0)
    )
    assert chunks[0].choices[0].text.startswith("Say it")
