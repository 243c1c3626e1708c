"""gateway/lifecycle/generate.py: the job's meter, the one count of its tokens, counts each chunk
as the encoders get it, and still every chunk the engine sent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from engine_adapter.base import ChoiceDelta, EngineChunk
from gateway.errors import EngineUnavailableError
from gateway.job import Meter
from gateway.lifecycle import generate


def chunk(tokens: int, *, cached: int = 0, finish: Any = None) -> EngineChunk:
    delta = ChoiceDelta(index=0, text="x" * tokens, token_ids=tuple(range(tokens)), finish_reason=finish)
    return EngineChunk(choices=(delta,), finished=finish is not None, prompt_tokens=40, num_cached_tokens=cached)


class Engine:
    """Scripted streams, one per request id; `sent` is what each has yielded so far."""

    def __init__(self, scripts: dict[str, list[EngineChunk]], pauses: int = 1) -> None:
        self.scripts, self.pauses = scripts, pauses
        self.sent: list[EngineChunk] = []
        self.clock = None

    async def generate(self, request: Any) -> AsyncIterator[EngineChunk]:
        for c in self.scripts[request.request_id]:
            for _ in range(self.pauses):
                await asyncio.sleep(0)
            self.sent.append(c)
            yield c


def job(engine: Engine, prompts: int) -> Any:
    return SimpleNamespace(
        served=SimpleNamespace(engine=engine),
        prompts=tuple([0] * 40 for _ in range(prompts)),
        requests=tuple(SimpleNamespace(request_id=f"r{i}") for i in range(prompts)),
        meter=Meter(),
    )


def test_a_merged_stream_is_counted_as_it_is_handed_on() -> None:
    """Several prompts' streams run ahead of their reader; the meter counts what the reader
    has had (its usage so far), and at the end what the engine sent, cached tokens at the most
    each prompt reported (a vLLM server says them on its last chunk only)."""
    scripts = {
        "r0": [chunk(2), chunk(1), chunk(3, cached=16, finish="stop")],
        "r1": [chunk(1, cached=16), chunk(2, cached=32), chunk(0, cached=32, finish="length")],
    }
    j = job(Engine(scripts, pauses=0), prompts=2)

    async def read() -> list[tuple[int, int]]:
        seen, out = 0, []
        async for _, c in generate.run(j):
            seen += sum(len(d.token_ids) for d in c.choices)
            await asyncio.sleep(0)  # the pumps run on meanwhile
            out.append((seen, j.meter.completion_tokens))
        return out

    counts = asyncio.run(read())
    assert [meter for _, meter in counts] == [seen for seen, _ in counts] and counts[-1][0] == 9
    m = j.meter
    assert (m.prompt_tokens, m.sent_prompt_tokens, m.cached_tokens) == (80, 80, 48)
    assert sorted(m.finish_reasons) == ["length", "stop"]


def test_chunks_never_handed_on_are_counted_when_the_stream_closes() -> None:
    """The reader went away with chunks still queued: the engine made them, the quota counts them."""
    engine = Engine({"r0": [chunk(1)] * 5, "r1": [chunk(2)] * 5}, pauses=0)
    j = job(engine, prompts=2)

    async def read_one() -> None:
        chunks = generate.run(j)
        async for _ in chunks:
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            break
        await chunks.aclose()

    asyncio.run(read_one())
    assert len(engine.sent) > 1 and j.meter.completion_tokens == sum(len(c.choices[0].token_ids) for c in engine.sent)


def test_an_engine_side_abort_is_a_503_and_its_tokens_count() -> None:
    j = job(Engine({"r0": [chunk(2), chunk(1, finish="abort")]}), prompts=1)

    async def read() -> None:
        async for _ in generate.run(j):
            pass

    with pytest.raises(EngineUnavailableError):
        asyncio.run(read())
    assert j.meter.completion_tokens == 3 and j.meter.finish_reasons == []


def test_metered_counts_a_scripted_stream_as_run_does() -> None:
    """For chunks that do not come from an engine (a test's): the encoders' usage is the meter's."""
    j = job(Engine({}), prompts=1)

    async def chunks() -> AsyncIterator[tuple[int, EngineChunk]]:
        yield 0, chunk(2)
        yield 0, chunk(3, cached=16, finish="stop")

    async def read() -> list[int]:
        return [j.meter.completion_tokens async for _ in generate.metered(j, chunks())]

    assert asyncio.run(read()) == [2, 5]
    assert (j.meter.prompt_tokens, j.meter.cached_tokens, j.meter.finish_reasons) == (40, 16, ["stop"])
