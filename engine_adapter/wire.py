"""The engine host's wire format: engine values as JSON, one frame per line.

A gateway reaches an engine on another box (`sparkgate engine-host`) with the
same values it passes an in-process engine: token ids (and images) in, chunks out, the KV
spec and live stats. Pydantic validates every frame on the way in, so a
mismatched host fails loudly instead of feeding admission wrong numbers.
Non-finite floats (a sampled token outside the top-k has logprob -inf) travel
as JSON's `-Infinity` constants.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from engine_adapter.base import EngineChunk, EngineRequest, EngineStats, KVSpec

PROTOCOL = 2  # bumped on any incompatible change; host and gateway must agree (2: images)


class _Frame(BaseModel):
    # A request's images travel as base64 (JSON has no bytes).
    model_config = ConfigDict(
        ser_json_inf_nan="constants", ser_json_bytes="base64", val_json_bytes="base64", frozen=True
    )


class EngineInfo(_Frame):
    """What the gateway learns about a remote engine when it claims a share of it."""

    protocol: int = PROTOCOL
    name: str
    kv_spec: KVSpec  # the share granted to this gateway: blocks and slots it may use
    pool_blocks: int  # the engine's whole pool, for the operator's view
    healthy: bool
    tokenizer_fingerprint: str  # engine_adapter.hf_tokenizer.fingerprint of the engine's tokenizer


class Claim(_Frame):
    """A gateway's claim (the gateway named by its X-Sparkgate-Gateway header) on a share
    of a remote engine's KV pool and slots, renewed by its stats polls: two gateways can
    never admit more than the engine has."""

    share: float  # 0 < share <= 1


class StatsFrame(_Frame):
    stats: EngineStats
    healthy: bool


class GenerateFrame(_Frame):
    request: EngineRequest


ErrorKind = Literal["invalid", "unavailable"]


class StreamFrame(_Frame):
    """One line of a generate stream: a chunk, or the error that ended it."""

    chunk: EngineChunk | None = None
    error: ErrorKind | None = None
    message: str = ""


def chunk_line(chunk: EngineChunk) -> bytes:
    return StreamFrame.model_construct(chunk=chunk, error=None, message="").model_dump_json().encode() + b"\n"


def error_line(kind: ErrorKind, message: str) -> bytes:
    return StreamFrame(error=kind, message=message).model_dump_json().encode() + b"\n"
