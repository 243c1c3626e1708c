"""A request once prepared: validated, tokenized once, its model chosen, its budget set."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from engine_adapter.base import EngineRequest
from gateway.auth import Principal
from gateway.registry import ServedModel
from gateway.text.assistant import TurnSpec
from policies import tokens
from policies.load import RouteInfo


@dataclass
class Meter:
    """What the engine really did for a job so far: the quota is settled with this, and the
    usage an answer shows is read from it (one count, so the two cannot differ). The tokens
    are counted as the chunks reach the encoders (gateway/lifecycle/generate.py)."""

    prompt_tokens: int = 0  # counted once a prompt is prefilled (its first output)
    sent_prompt_tokens: int = 0  # counted once a prompt is sent to the engine (its prefill starts)
    completion_tokens: int = 0
    # Also for the request log (gateway/request_log.py): what the engine reported on the way.
    cached_tokens: int = 0  # prompt tokens the engine found in its prefix cache (per prompt, the most it said)
    reasoning_tokens: int = 0  # of the completion tokens, those inside think blocks (set by the encoder)
    first_output_at: float | None = None  # time.monotonic() of the first output token
    finish_reasons: list[str] = field(default_factory=list)  # one per finished choice
    error_code: str | None = None  # a failure reported in-band, after a stream's status line
    # On the engine's clock (for /metrics): when the run started, the first and last output.
    started: float | None = None
    first_token: float | None = None
    last_token: float | None = None


@dataclass(frozen=True)
class Job:
    """A validated request, tokenized once, ready for its engine."""

    kind: Literal["chat", "completion"]  # what it asks of the model; which API asked is its Surface
    id: str
    created: int
    served: ServedModel
    principal: Principal
    prompts: tuple[tokens.Prompt, ...]
    requests: tuple[EngineRequest, ...]  # one per prompt
    n: int
    stream: bool
    include_usage: bool
    logprobs: int | None  # top-k to report, None when not requested
    echo: bool = False
    meter: Meter = field(default_factory=Meter, compare=False)
    # What prompt normalization changed ("off" when it did not run), for a response header.
    prefix_changes: tuple[str, ...] = ("off",)
    # Routing's decision (None when routing is off); its timing record starts when it runs.
    route: RouteInfo | None = None
    # How to read the output (reasoning, tool calls); plain text for completions.
    turn: TurnSpec = field(default_factory=TurnSpec)
    # vLLM's extensions: chat's echoed text, the prompt's logprobs (top-k), the token ids of
    # the prompt and the answer, the usage so far on every streamed chunk.
    echo_text: str = ""
    prompt_logprobs: int | None = None
    return_token_ids: bool = False
    continuous_usage: bool = False

    @property
    def worst_case_tokens(self) -> int:
        """Prompt + every choice's max_tokens: what the quota reserves."""
        return sum(len(p) + r.sampling.max_tokens * self.n for p, r in zip(self.prompts, self.requests, strict=True))
