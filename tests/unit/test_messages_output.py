"""gateway/http/anthropic/output.py: engine chunks as Anthropic's stream, to its end or its error."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from engine_adapter.base import ChoiceDelta, EngineChunk, EngineUnavailable
from gateway.errors import from_exception
from gateway.http.anthropic import errors as anthropic_errors
from gateway.http.anthropic.output import MessageEncoder
from gateway.job import Meter
from gateway.lifecycle.generate import metered
from gateway.text.assistant import TurnSpec


def job(prompt_tokens: int = 40) -> Any:
    """What the encoder reads of a job (a stand-in: no engine, no registry)."""
    served = SimpleNamespace(
        engine=SimpleNamespace(kv_spec=SimpleNamespace(block_size=16)),
        settings=SimpleNamespace(enable_prefix_caching=True),
    )
    return SimpleNamespace(
        id="chatcmpl-abc", prompts=(list(range(prompt_tokens)),), served=served, turn=TurnSpec(), meter=Meter()
    )


def chunk(text: str, *, cached: int = 0, finish: Any = None, stop: Any = None) -> EngineChunk:
    ids = tuple(range(len(text.split())))
    delta = ChoiceDelta(index=0, text=text, token_ids=ids, finish_reason=finish, stop_reason=stop)
    return EngineChunk(choices=(delta,), finished=finish is not None, prompt_tokens=40, num_cached_tokens=cached)


def events(lines: list[str]) -> list[dict[str, Any]]:
    out = []
    for frame in "".join(lines).split("\n\n"):
        if frame:
            kind, data = frame.split("\n")
            event = json.loads(data.removeprefix("data: "))
            assert kind == f"event: {event['type']}"
            out.append(event)
    return out


async def collect(encoder: MessageEncoder, j: Any, chunks: AsyncIterator[tuple[int, EngineChunk]]) -> list[str]:
    """The stream's lines; the chunks are metered on the way, as when serving (the usage is the meter's)."""
    return [line async for line in encoder.stream(j, metered(j, chunks))]


def test_a_stream_ends_with_the_stop_reason_and_usage() -> None:
    async def chunks() -> AsyncIterator[tuple[int, EngineChunk]]:
        yield 0, chunk("Hello ", cached=16)
        yield 0, chunk("world", finish="stop", stop="STOP")

    out = events(asyncio.run(collect(MessageEncoder(model="m"), job(), chunks())))
    kinds = [e["type"] for e in out]
    assert kinds == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    usage = out[0]["message"]["usage"]
    # 40 prompt tokens: 16 read from the cache, 16 more written in whole blocks (39 // 16 * 16 = 32).
    assert usage == {
        "input_tokens": 8,
        "cache_creation_input_tokens": 16,
        "cache_read_input_tokens": 16,
        "output_tokens": 0,
    }
    assert out[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "STOP"}
    assert out[-2]["usage"] | {"output_tokens": 0} == usage and out[-2]["usage"]["output_tokens"] == 2


def test_an_engine_death_mid_stream_is_an_error_event() -> None:
    """The encoder lets the error through; the lifecycle ends the stream with the surface's
    event (gateway/lifecycle/run.py, tests/api/test_surface_contract.py)."""
    j = job()
    seen: list[str] = []

    async def chunks() -> AsyncIterator[tuple[int, EngineChunk]]:
        yield 0, chunk("Hello ")
        raise EngineUnavailable("engine m died")

    async def run() -> None:
        async for line in MessageEncoder(model="m").stream(j, metered(j, chunks())):
            seen.append(line)

    with pytest.raises(EngineUnavailable) as died:
        asyncio.run(run())
    assert [e["type"] for e in events(seen)][:2] == ["message_start", "ping"]
    end = events([anthropic_errors.stream_error(from_exception(died.value))])
    assert end == [{"type": "error", "error": {"type": "api_error", "message": "engine m died"}}]


def test_a_tool_call_cut_by_the_token_limit_stops_at_max_tokens() -> None:
    """Its input is incomplete: Anthropic's API says `max_tokens`, and a client retries with
    more; a whole call is `tool_use`, whatever else ended the turn."""
    from gateway.http.anthropic.output import _stop

    def tally(finish: str, stop: Any = None) -> Any:
        return SimpleNamespace(finish_reason=finish, stop_reason=stop)

    assert _stop(tally("length"), tool_calls=1) == ("max_tokens", None)
    assert _stop(tally("stop"), tool_calls=1) == ("tool_use", None)
    assert _stop(tally("stop", "STOP"), tool_calls=1) == ("tool_use", None)
    assert _stop(tally("length"), tool_calls=0) == ("max_tokens", None)
    assert _stop(tally("stop"), tool_calls=0) == ("end_turn", None)
