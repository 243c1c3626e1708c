"""The engine host's frames: engine values survive the round trip exactly."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from engine_adapter.base import (
    ChoiceDelta,
    EngineChunk,
    EngineRequest,
    ImageInput,
    SamplingOptions,
    StructuredOutput,
    TokenLogprob,
)
from engine_adapter.wire import GenerateFrame, StreamFrame, chunk_line, error_line


def test_a_request_round_trips() -> None:
    request = EngineRequest(
        request_id="r1",
        prompt_token_ids=(1, 2, 3),
        sampling=SamplingOptions(
            max_tokens=8,
            stop=("\n\n",),
            logit_bias={5: -100.0},
            structured=StructuredOutput(json_schema={"type": "object"}),
        ),
        priority=2,
        cache_salt="team-a",
    )
    wire = GenerateFrame(request=request).model_dump_json()
    assert GenerateFrame.model_validate_json(wire).request == request


def test_a_request_with_images_round_trips_their_bytes() -> None:
    png = bytes(range(256)) * 3  # any bytes, not only text
    request = EngineRequest(
        request_id="r2",
        prompt_token_ids=(1, 9, 9, 9, 2),
        sampling=SamplingOptions(max_tokens=4),
        images=(ImageInput(data=png, sha256="ab" * 32, offset=1, tokens=3),),
    )
    wire = GenerateFrame(request=request).model_dump_json()
    assert GenerateFrame.model_validate_json(wire).request == request


def test_a_chunk_round_trips_with_a_minus_infinite_logprob() -> None:
    chunk = EngineChunk(
        choices=(
            ChoiceDelta(
                index=0,
                text="hi",
                token_ids=(7, 8),
                logprobs=(TokenLogprob(token_id=7, token="h", logprob=-math.inf, top=((9, "x", -0.1),)),),
                finish_reason="stop",
                stop_reason=151645,
            ),
        ),
        finished=True,
        prompt_tokens=3,
        num_cached_tokens=2,
    )
    line = chunk_line(chunk)
    assert line.endswith(b"\n") and b"-Infinity" in line
    assert StreamFrame.model_validate_json(line).chunk == chunk


def test_an_error_frame_and_a_malformed_one() -> None:
    frame = StreamFrame.model_validate_json(error_line("invalid", "max_tokens too large"))
    assert frame.chunk is None and frame.error == "invalid" and frame.message == "max_tokens too large"
    with pytest.raises(ValidationError):
        StreamFrame.model_validate_json(b'{"chunk": {"choices": "nope"}}')
