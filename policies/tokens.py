"""Prompt -> token ids, once, with the model's own tokenizer and chat template.

The ids computed here are what the engine receives: nothing downstream
tokenizes the prompt again, so counts, KV estimates and billing agree.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class ChatTokenizer(Protocol):
    """The part of a Hugging Face tokenizer this module uses."""

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, **kwargs: Any) -> list[int]: ...

    def decode(self, ids: Sequence[int], **kwargs: Any) -> str: ...


@dataclass(frozen=True, slots=True)
class PromptImage:
    """An image in a prompt: its pad tokens' place in the ids and the hash of its bytes."""

    offset: int  # the first pad's index in `Prompt.token_ids`
    tokens: int  # how many pads (its merged patches)
    sha256: str


@dataclass(frozen=True, slots=True)
class Prompt:
    """A rendered prompt: its ids, and the text they were tokenized from (None for a prompt
    given as ids: decoding thousands of them costs as much as the engine's own detokenizer,
    so `text_of` does it only when echo asks).

    With images, the ids are the prompt as the engine holds it: each image's pad token repeated
    once per token it becomes, so that its length, KV footprint and bill are the engine's."""

    text: str | None
    token_ids: tuple[int, ...]
    images: tuple[PromptImage, ...] = ()

    def __len__(self) -> int:
        return len(self.token_ids)

    def cache_keys(self) -> Sequence[Hashable]:
        """What the engine's prefix cache keys each position on: the token, except in an image,
        where it is the image (vLLM hashes the image's bytes into every block that holds it)."""
        if not self.images:
            return self.token_ids
        keys: list[Hashable] = list(self.token_ids)
        for image in self.images:
            keys[image.offset : image.offset + image.tokens] = [image.sha256] * image.tokens
        return keys


@dataclass(frozen=True)
class PlaceholderMismatch:
    """The rendered prompt's image pads do not pair with the images sent (the text holds one)."""

    pads: int
    images: int

    @property
    def message(self) -> str:
        return (
            f"The prompt holds {self.pads} image placeholder tokens for {self.images} images: "
            "a message's text may not contain the model's image token."
        )


def with_images(prompt: Prompt, pad_id: int, images: Sequence[tuple[int, str]]) -> Prompt | PlaceholderMismatch:
    """The prompt with each image's one pad (as the chat template writes it) repeated to its
    token count; `images` are (tokens, sha256) in the order the template placed them."""
    ids = prompt.token_ids
    pads = ids.count(pad_id)  # C loops, not a Python one over a long prompt's ids (event loop)
    if pads != len(images):
        return PlaceholderMismatch(pads, len(images))
    at: list[int] = []
    for _ in images:
        at.append(ids.index(pad_id, at[-1] + 1 if at else 0))
    out: list[int] = []
    placed = []
    start = 0
    for i, (count, sha256) in zip(at, images, strict=True):
        out += ids[start:i]
        placed.append(PromptImage(len(out), count, sha256))
        out += [pad_id] * count
        start = i + 1
    out += ids[start:]
    return Prompt(text=prompt.text, token_ids=tuple(out), images=tuple(placed))


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
