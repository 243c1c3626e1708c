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
    """A rendered prompt: its ids, and the text they were tokenized from (None for a prompt
    given as ids: decoding thousands of them costs as much as the engine's own detokenizer,
    so `text_of` does it only when echo asks)."""

    text: str | None
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
    continue_final_message: bool = False,
) -> Prompt:
    """Apply the chat template, then tokenize the text without extra specials.
    `continue_final_message`: the last (assistant) message is left open, to be written on."""
    text = tokenizer.apply_chat_template(
        list(messages),
        tools=list(tools) if tools else None,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        tokenize=False,
        **dict(template_kwargs or {}),
    )
    if not isinstance(text, str):  # some tokenizers return a list for batched input
        text = "".join(text)
    return Prompt(text=text, token_ids=tuple(tokenizer.encode(text, add_special_tokens=False)))


def encode_text(tokenizer: ChatTokenizer, text: str) -> Prompt:
    """A raw completion prompt: tokenized as is (Qwen adds no BOS)."""
    return Prompt(text=text, token_ids=tuple(tokenizer.encode(text, add_special_tokens=False)))


def from_ids(ids: Sequence[int]) -> Prompt:
    """A prompt given as ids: its text is not decoded (see `text_of`)."""
    return Prompt(text=None, token_ids=tuple(ids))


def text_of(tokenizer: ChatTokenizer, prompt: Prompt) -> str:
    """The prompt's text: as rendered, or decoded from its ids."""
    if prompt.text is not None:
        return prompt.text
    return tokenizer.decode(list(prompt.token_ids), skip_special_tokens=False)
