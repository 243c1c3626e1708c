"""Chat completions through the real server, driven by the official OpenAI SDK."""

from __future__ import annotations

import json

import openai
import pytest

from tests.conftest import DENSE, MOE, Server

pytestmark = pytest.mark.engine  # starts vLLM engines

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name three colours."},
]


def expected_prompt_tokens(tok, messages, **kwargs) -> int:  # type: ignore[no-untyped-def]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
    return len(tok.encode(text, add_special_tokens=False))


def test_chat_text_and_exact_usage(client: openai.OpenAI, hf_tokenizer) -> None:  # type: ignore[no-untyped-def]
    r = client.chat.completions.create(model=DENSE, messages=MESSAGES, max_tokens=12, temperature=0)
    assert r.object == "chat.completion"
    assert r.model == DENSE
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason == "length"
    assert r.usage is not None
    assert r.usage.prompt_tokens == expected_prompt_tokens(hf_tokenizer, MESSAGES)
    assert r.usage.completion_tokens == 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12


def test_max_completion_tokens_wins_over_max_tokens(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=DENSE, messages=MESSAGES, max_tokens=20, max_completion_tokens=5, temperature=0
    )
    assert r.usage is not None and r.usage.completion_tokens == 5
    assert r.choices[0].finish_reason == "length"


def test_stream_with_usage_chunk(client: openai.OpenAI, hf_tokenizer) -> None:  # type: ignore[no-untyped-def]
    stream = client.chat.completions.create(
        model=DENSE,
        messages=MESSAGES,
        max_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert all(c.usage is None for c in chunks[:-1])
    assert last.usage.completion_tokens == 10
    assert last.usage.prompt_tokens == expected_prompt_tokens(hf_tokenizer, MESSAGES)
    # Same greedy request without streaming: same text.
    whole = client.chat.completions.create(model=DENSE, messages=MESSAGES, max_tokens=10, temperature=0)
    assert whole.choices[0].message.content == text


def test_stream_without_usage_has_no_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(model=DENSE, messages=MESSAGES, max_tokens=3, stream=True))
    assert all(c.choices for c in chunks)
    assert all(getattr(c, "usage", None) is None for c in chunks)


def test_n_choices(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=DENSE, messages=MESSAGES, max_tokens=8, n=2, temperature=1.0, seed=3)
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert r.usage is not None and r.usage.completion_tokens == 16
    assert r.choices[0].message.content != r.choices[1].message.content


def test_n_choices_streamed(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=DENSE, messages=MESSAGES, max_tokens=6, n=2, stream=True, stream_options={"include_usage": True}
        )
    )
    indices = {c.choices[0].index for c in chunks if c.choices}
    assert indices == {0, 1}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12


def test_stop_string_cuts_output(client: openai.OpenAI) -> None:
    kwargs = dict(model=DENSE, messages=MESSAGES, max_tokens=24, temperature=1.0, seed=11)
    full = client.chat.completions.create(**kwargs).choices[0].message.content  # type: ignore[call-overload]
    assert full and len(full) > 8
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    cut = client.chat.completions.create(**kwargs, stop=[stop])  # type: ignore[call-overload]
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == full[: full.index(stop)]


def test_seed_makes_sampling_repeatable(client: openai.OpenAI) -> None:
    a = client.chat.completions.create(model=DENSE, messages=MESSAGES, max_tokens=8, temperature=1.0, seed=5)
    b = client.chat.completions.create(model=DENSE, messages=MESSAGES, max_tokens=8, temperature=1.0, seed=5)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_logprobs(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=DENSE, messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    lp = r.choices[0].logprobs
    assert lp is not None and lp.content is not None
    assert len(lp.content) == 6
    text = "".join(t.token for t in lp.content)
    assert text == r.choices[0].message.content
    for t in lp.content:
        assert len(t.top_logprobs) == 3
        assert t.logprob <= 0.0
        # greedy: the sampled token is the most likely one
        assert t.logprob == pytest.approx(t.top_logprobs[0].logprob, abs=1e-4)
        assert bytes(t.bytes or []) == t.token.encode()


def test_json_object_output_parses(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=DENSE,
        messages=[{"role": "user", "content": "Reply with a JSON object."}],
        max_tokens=64,
        temperature=0,
        response_format={"type": "json_object"},
    )
    content = r.choices[0].message.content
    assert content is not None
    assert isinstance(json.loads(content), dict)
    assert r.choices[0].finish_reason == "stop"


def test_json_schema_output_validates(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
        "required": ["colour"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model=DENSE,
        messages=[{"role": "user", "content": "Pick a colour."}],
        max_tokens=64,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "pick", "schema": schema, "strict": True}},
    )
    data = json.loads(r.choices[0].message.content or "")
    assert data["colour"] in {"red", "green", "blue"}
    assert set(data) == {"colour"}


def test_free_text_is_not_json(client: openai.OpenAI) -> None:
    """Guards the two tests above: without the constraint the model emits noise."""
    r = client.chat.completions.create(
        model=DENSE, messages=[{"role": "user", "content": "Reply with a JSON object."}], max_tokens=64, temperature=0
    )
    with pytest.raises(ValueError):
        json.loads(r.choices[0].message.content or "")


def test_enable_thinking_reaches_the_template(client: openai.OpenAI, hf_tokenizer) -> None:  # type: ignore[no-untyped-def]
    on = client.chat.completions.create(model=DENSE, messages=MESSAGES, max_tokens=1)
    off = client.chat.completions.create(
        model=DENSE, messages=MESSAGES, max_tokens=1, extra_body={"chat_template_kwargs": {"enable_thinking": False}}
    )
    assert on.usage and off.usage
    assert off.usage.prompt_tokens == expected_prompt_tokens(hf_tokenizer, MESSAGES, enable_thinking=False)
    assert off.usage.prompt_tokens > on.usage.prompt_tokens


def test_content_parts_and_developer_role(client: openai.OpenAI, hf_tokenizer) -> None:  # type: ignore[no-untyped-def]
    r = client.chat.completions.create(
        model=DENSE,
        messages=[
            {"role": "developer", "content": "You are terse."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "Name three "}, {"type": "text", "text": "colours."}],
            },
        ],
        max_tokens=2,
    )
    assert r.usage is not None
    assert r.usage.prompt_tokens == expected_prompt_tokens(hf_tokenizer, MESSAGES)


def test_unknown_fields_are_ignored(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=DENSE,
        messages=MESSAGES,
        max_tokens=2,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        top_p=0.9,
        user="alice",
        store=False,
        metadata={"team": "a"},
        parallel_tool_calls=False,
        extra_body={"some_future_field": {"x": 1}, "top_k": 20},
    )
    assert r.choices[0].message.content is not None


def test_two_models_in_one_process(client: openai.OpenAI) -> None:
    models = {m.id: m for m in client.models.list()}
    assert {DENSE, MOE, "dense-alias"} <= set(models)
    for name in (DENSE, MOE):
        r = client.chat.completions.create(model=name, messages=MESSAGES, max_tokens=4)
        assert r.model == name
        assert r.usage is not None and r.usage.completion_tokens == 4
    alias = client.chat.completions.create(model="dense-alias", messages=MESSAGES, max_tokens=1)
    assert alias.model == DENSE


async def test_concurrent_requests_on_both_models(aclient: openai.AsyncOpenAI) -> None:
    import asyncio

    async def one(model: str, i: int) -> int:
        r = await aclient.chat.completions.create(
            model=model, messages=[{"role": "user", "content": f"request {i}"}], max_tokens=8
        )
        assert r.usage is not None
        return r.usage.completion_tokens

    counts = await asyncio.gather(*(one(DENSE if i % 2 else MOE, i) for i in range(8)))
    assert counts == [8] * 8


def test_prompts_are_counted_with_tiktoken(server: Server) -> None:
    """The gateway's encode runs on tiktoken for the Qwen tokenizer (verified equal to HF at
    start-up); the usage tests above check its counts against an independent HF tokenizer."""
    engines = server.stats()["engines"]
    assert engines[DENSE]["tokenizer"] == "tiktoken" and engines[MOE]["tokenizer"] == "tiktoken"
