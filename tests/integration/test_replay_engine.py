"""ReplayEngine: recorded Qwen3 turns through the Engine protocol, with the real tokenizer (no vLLM)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from engine_adapter.base import (
    Engine,
    EngineChunk,
    EngineRequest,
    EngineRequestInvalid,
    EngineUnavailable,
    SamplingOptions,
    StructuredOutput,
)
from engine_adapter.recordings import RECORDINGS, tag
from engine_adapter.replay import ReplayEngine, ReplayEngineConfig

TOKENIZER = Path(__file__).resolve().parents[2] / "models" / "tiny-qwen3"
EOS = 151645  # <|im_end|>


@pytest_asyncio.fixture
async def engine() -> AsyncIterator[ReplayEngine]:
    if not TOKENIZER.exists():
        pytest.fail(f"{TOKENIZER} is missing: run `sparkgate prepare-models --root models`")
    eng = ReplayEngine(ReplayEngineConfig(name="replay", tokenizer=str(TOKENIZER)))
    await eng.start()
    try:
        yield eng
    finally:
        await eng.shutdown()


def chat_prompt(engine: ReplayEngine, *users: str) -> list[int]:
    """A chat prompt as the gateway renders it: user turns (with assistant turns between)."""
    messages: list[dict[str, str]] = []
    for i, content in enumerate(users):
        if i:
            messages.append({"role": "assistant", "content": "Noted."})
        messages.append({"role": "user", "content": content})
    text = engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(engine.tokenizer.encode(text, add_special_tokens=False))


def request(rid: str, prompt: list[int], max_tokens: int = 1000, **kw: object) -> EngineRequest:
    return EngineRequest(
        request_id=rid,
        prompt_token_ids=tuple(prompt),
        sampling=SamplingOptions(max_tokens=max_tokens, **kw),  # type: ignore[arg-type]
    )


async def collect(engine: ReplayEngine, req: EngineRequest) -> list[EngineChunk]:
    return [chunk async for chunk in engine.generate(req)]


def joined(chunks: list[EngineChunk], index: int = 0) -> str:
    return "".join(c.text for ch in chunks for c in ch.choices if c.index == index)


def ids(chunks: list[EngineChunk], index: int = 0) -> list[int]:
    return [t for ch in chunks for c in ch.choices if c.index == index for t in c.token_ids]


async def test_implements_the_engine_protocol(engine: ReplayEngine) -> None:
    assert isinstance(engine, Engine)
    assert engine.is_healthy
    assert engine.tokenizer.convert_tokens_to_ids("<|im_end|>") == EOS
    spec = engine.kv_spec
    assert spec.block_size == 16 and spec.num_blocks == 4097 and not spec.prefix_caching
    assert spec.max_model_len == engine.max_model_len == 4096 and spec.max_num_seqs == 8
    assert engine.stats().running == 0


@pytest.mark.parametrize("name", sorted(RECORDINGS))
async def test_each_recording_streams_back_exactly_its_text(engine: ReplayEngine, name: str) -> None:
    prompt = chat_prompt(engine, f"Tell me. {tag(name)}")
    chunks = await collect(engine, request(f"r-{name}", prompt))
    assert joined(chunks) == RECORDINGS[name]
    out = ids(chunks)
    assert out[-1] == EOS and EOS not in out[:-1]
    assert out[:-1] == engine.tokenizer.encode(RECORDINGS[name], add_special_tokens=False)
    assert engine.tokenizer.decode(out, skip_special_tokens=True) == RECORDINGS[name]
    assert all(len(c.choices) == 1 and len(c.choices[0].token_ids) == 1 for c in chunks)  # one token per chunk
    assert [c.finished for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[-1].choices[0].finish_reason == "stop" and chunks[-1].choices[0].stop_reason is None
    assert chunks[-1].choices[0].text == ""  # the EOS token has no text
    assert all(c.prompt_tokens == len(prompt) and c.num_cached_tokens == 0 for c in chunks)


async def test_no_tag_gets_the_plain_answer(engine: ReplayEngine) -> None:
    chunks = await collect(engine, request("plain", chat_prompt(engine, "What is the capital of France?")))
    assert joined(chunks) == RECORDINGS["answer"] == "The capital of France is Paris."


async def test_the_last_tag_wins(engine: ReplayEngine) -> None:
    prompt = chat_prompt(engine, f"first {tag('long')}", f"then {tag('think')} and {tag('call')}")
    assert joined(await collect(engine, request("last", prompt))) == RECORDINGS["call"]


async def test_a_multibyte_character_is_never_split(engine: ReplayEngine) -> None:
    chunks = await collect(engine, request("u", chat_prompt(engine, tag("unicode"))))
    assert joined(chunks) == RECORDINGS["unicode"]
    assert not any("\ufffd" in c.choices[0].text for c in chunks)
    assert any(c.choices[0].text == "" for c in chunks[:-1])  # a partial character was held back


async def test_max_tokens_cuts_with_length(engine: ReplayEngine) -> None:
    chunks = await collect(engine, request("len", chat_prompt(engine, tag("long")), max_tokens=20))
    out = ids(chunks)
    assert len(out) == 20 and EOS not in out
    assert chunks[-1].finished and chunks[-1].choices[0].finish_reason == "length"
    assert joined(chunks) == engine.tokenizer.decode(out)
    assert RECORDINGS["long"].startswith(joined(chunks))
    # max_tokens exactly the recording plus EOS: it still ends with "stop".
    n = len(engine.tokenizer.encode(RECORDINGS["answer"], add_special_tokens=False))
    whole = await collect(engine, request("len2", chat_prompt(engine, "hi"), max_tokens=n + 1))
    assert whole[-1].choices[0].finish_reason == "stop" and ids(whole)[-1] == EOS


async def test_a_stop_string_cuts_the_text(engine: ReplayEngine) -> None:
    prompt = chat_prompt(engine, tag("think"))
    chunks = await collect(engine, request("stop", prompt, stop=("</think>",)))
    last = chunks[-1].choices[0]
    assert last.finish_reason == "stop" and last.stop_reason == "</think>"
    assert joined(chunks) == RECORDINGS["think"].split("</think>")[0]
    kept = await collect(engine, request("stop2", prompt, stop=("France is",), include_stop_str_in_output=True))
    think = RECORDINGS["think"]
    assert joined(kept) == think[: think.index("France is") + len("France is")]
    assert kept[-1].choices[0].stop_reason == "France is"


async def test_n_streams_the_recording_for_every_choice(engine: ReplayEngine) -> None:
    chunks = await collect(engine, request("n", chat_prompt(engine, tag("call")), n=3))
    assert all([c.index for c in ch.choices] == [0, 1, 2] for ch in chunks)
    assert [joined(chunks, i) for i in range(3)] == [RECORDINGS["call"]] * 3
    assert [c.finish_reason for c in chunks[-1].choices] == ["stop"] * 3


async def test_logprobs_are_zero_for_the_emitted_token(engine: ReplayEngine) -> None:
    chunks = await collect(engine, request("lp", chat_prompt(engine, "hi"), logprobs=1))
    for ch in chunks:
        (lp,) = ch.choices[0].logprobs or ()
        assert lp.token_id == ch.choices[0].token_ids[0] and lp.logprob == 0.0


async def test_an_unknown_tag_is_rejected(engine: ReplayEngine) -> None:
    with pytest.raises(EngineRequestInvalid, match="no recording 'nope'"):
        await collect(engine, request("bad", chat_prompt(engine, tag("nope"))))
    assert engine.stats().running == 0


async def test_the_crash_tag_kills_the_engine_and_its_streams(engine: ReplayEngine) -> None:
    stream = engine.generate(request("live", chat_prompt(engine, tag("long"))))
    first = await anext(stream)
    assert not first.finished and engine.is_healthy
    with pytest.raises(EngineUnavailable, match="died"):
        await collect(engine, request("boom", chat_prompt(engine, tag("crash"))))
    assert not engine.is_healthy
    with pytest.raises(EngineUnavailable):  # the stream in flight fails, as on a dead vLLM core
        async for _ in stream:
            pass
    with pytest.raises(EngineUnavailable):  # and it stays dead: a new engine must be started
        await collect(engine, request("after", chat_prompt(engine, "hi")))


async def test_structured_output_is_rejected(engine: ReplayEngine) -> None:
    req = request("json", chat_prompt(engine, "hi"), structured=StructuredOutput(json_object=True))
    with pytest.raises(EngineRequestInvalid, match="cannot follow a grammar"):
        await collect(engine, req)


async def test_abort_ends_the_stream_with_abort(engine: ReplayEngine) -> None:
    stream = engine.generate(request("ab", chat_prompt(engine, tag("long"))))
    first = await anext(stream)
    assert not first.finished and engine.stats().running == 1
    await engine.abort("ab")
    rest = [chunk async for chunk in stream]
    assert rest[-1].finished and rest[-1].choices[0].finish_reason == "abort"
    assert len(rest) <= 2  # at most the token already on its way, then the abort
    assert engine.stats().running == 0
    await engine.abort("ab")  # finished: a no-op


async def test_closing_the_iterator_stops_the_stream(engine: ReplayEngine) -> None:
    stream = engine.generate(request("close", chat_prompt(engine, tag("long"))))
    got = [await anext(stream) for _ in range(3)]
    assert engine.stats().running == 1 and engine.stats().generation_tokens >= 3
    await stream.aclose()  # type: ignore[attr-defined]
    assert engine.stats().running == 0
    assert len(got) == 3 and not got[-1].finished
    # The same id may be used again once the stream is gone.
    assert joined(await collect(engine, request("close", chat_prompt(engine, "hi")))) == RECORDINGS["answer"]


async def test_shutdown_makes_it_unhealthy() -> None:
    eng = ReplayEngine(ReplayEngineConfig(name="r", tokenizer=str(TOKENIZER), max_model_len=8192, max_num_seqs=2))
    await eng.start()
    assert eng.is_healthy and eng.kv_spec.max_model_len == 8192
    await eng.shutdown()
    assert not eng.is_healthy
    with pytest.raises(EngineUnavailable, match="not started"):
        await collect(eng, request("x", [1, 2, 3]))
