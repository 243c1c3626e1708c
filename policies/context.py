"""Does a prompt plus its output fit the model's context? A value either way."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class OutputBudget:
    """The request fits; `max_tokens` is what the engine may generate."""

    max_tokens: int


@dataclass(frozen=True, slots=True)
class ContextTooLong:
    """The prompt (plus the requested output) exceeds the model's context."""

    limit: int
    prompt_tokens: int
    requested_output: int | None

    @property
    def message(self) -> str:
        if self.requested_output is None:
            return (
                f"This model's maximum context length is {self.limit} tokens. However, your "
                f"prompt has {self.prompt_tokens} tokens, which leaves no room for output."
            )
        return (
            f"This model's maximum context length is {self.limit} tokens. However, you requested "
            f"{self.prompt_tokens + self.requested_output} tokens ({self.prompt_tokens} in the "
            f"prompt, {self.requested_output} for the completion). Please reduce the prompt "
            "or the completion length."
        )


@dataclass(frozen=True, slots=True)
class OutputTooLong:
    """More output was requested than this model may produce in one response."""

    cap: int
    requested: int

    @property
    def message(self) -> str:
        return f"max_tokens is too large: {self.requested}. This model supports at most {self.cap} completion tokens."


def plan_output(
    *,
    prompt_tokens: int,
    requested: int | None,
    max_model_len: int,
    max_output_cap: int | None = None,
) -> OutputBudget | ContextTooLong | OutputTooLong:
    """Resolve `max_tokens`: an explicit request must fit whole; a missing one
    takes what the context leaves (bounded by the model's output cap)."""
    room = max_model_len - prompt_tokens
    if requested is not None:
        if max_output_cap is not None and requested > max_output_cap:
            return OutputTooLong(max_output_cap, requested)
        if requested > room:
            return ContextTooLong(max_model_len, prompt_tokens, requested)
        return OutputBudget(requested)
    if room < 1:
        return ContextTooLong(max_model_len, prompt_tokens, None)
    return OutputBudget(min(room, max_output_cap) if max_output_cap else room)


@dataclass(frozen=True, slots=True)
class TruncationTooLong:
    """`truncate_prompt_tokens` asks to keep more tokens than the context holds."""

    keep: int
    limit: int

    @property
    def message(self) -> str:
        return (
            f"truncate_prompt_tokens={self.keep} cannot be greater than the maximum context length "
            f"{self.limit}. Please request a smaller truncation size."
        )


def truncate(
    token_ids: tuple[int, ...], *, keep: int | None, side: str, max_model_len: int
) -> tuple[int, ...] | TruncationTooLong:
    """The prompt's ids as vLLM truncates them: `keep` of them (-1: as many as the context
    holds with one token left for output), the last ones for side "left", else the first."""
    if keep is None:
        return token_ids
    if keep > max_model_len:
        return TruncationTooLong(keep, max_model_len)
    if keep < 0:
        keep = max_model_len - 1
    if keep >= len(token_ids):
        return token_ids
    return token_ids[len(token_ids) - keep :] if side == "left" else token_ids[:keep]
