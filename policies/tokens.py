"""Prompt -> token ids, once, with the model's own tokenizer and chat template.

The ids computed here are what the engine receives: nothing downstream
tokenizes the prompt again, so counts, KV estimates and billing agree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class ChatTokenizer(Protocol):
    """The part of a Hugging Face tokenizer this module uses."""

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, **kwargs: Any) -> list[int]: ...

    def decode(self, ids: Sequence[int], **kwargs: Any) -> str: ...


@dataclass(frozen=True, slots=True)
class Prompt:
    """A rendered prompt: the text (for echo and debugging) and its ids."""

    text: str
    token_ids: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.token_ids)


def render_chat(
    tokenizer: ChatTokenizer,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    add_generation_prompt: bool = True,
) -> Prompt:
    """Apply the chat template, then tokenize the text without extra specials."""
    text = tokenizer.apply_chat_template(
        list(messages),
        tools=list(tools) if tools else None,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
        **dict(template_kwargs or {}),
    )
    if not isinstance(text, str):  # some tokenizers return a list for batched input
        text = "".join(text)
    return Prompt(text=text, token_ids=tuple(tokenizer.encode(text, add_special_tokens=False)))


def encode_text(tokenizer: ChatTokenizer, text: str) -> Prompt:
    """A raw completion prompt: tokenized as is (Qwen adds no BOS)."""
    return Prompt(text=text, token_ids=tuple(tokenizer.encode(text, add_special_tokens=False)))


def from_ids(tokenizer: ChatTokenizer, ids: Sequence[int]) -> Prompt:
    """A prompt given as ids; the text is decoded for echo."""
    return Prompt(text=tokenizer.decode(list(ids), skip_special_tokens=False), token_ids=tuple(ids))
