"""Served models by name and alias: what the gateway routes a request's `model` to."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine_adapter.base import Engine
from gateway.errors import ModelNotFound
from gateway.settings import ModelSettings
from gateway.text.templates import OutputFormats
from gateway.vision import NO_VISION, Vision


@dataclass(frozen=True)
class ServedModel:
    settings: ModelSettings
    engine: Engine
    tokenizer: Any  # policies.tokens.ChatTokenizer
    formats: OutputFormats = field(default_factory=OutputFormats)  # how it writes tool calls, reasoning
    # Token ids the model's embedding has (config.json's vocab_size: Qwen pads it past the
    # tokenizer's 151,669 to 151,936); logit_bias and stop_token_ids may name any of them.
    vocab_size: int | None = None
    vision: Vision = NO_VISION  # whether it takes images, and what one costs it

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def token_ids(self) -> int:
        """How many token ids a request may name: the model's vocabulary, else the tokenizer's."""
        return self.vocab_size or len(self.tokenizer)

    @property
    def tokenizer_id(self) -> str:
        """Models with the same id count tokens alike (a prompt rendered for one fits the other)."""
        return self.settings.tokenizer or self.settings.path


def config_vocab_size(model_dir: Path) -> int | None:
    """`vocab_size` from a model directory's config.json (a multimodal model's text config's),
    None where there is none (a tokenizer-only directory, an engine on another box)."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return size if isinstance(size, int) and size > 0 else None


class ModelRegistry:
    def __init__(self, models: list[ServedModel]) -> None:
        self._models = models
        self._by_name = {n: m for m in models for n in m.settings.names}

    def resolve(self, name: str) -> ServedModel:
        try:
            return self._by_name[name]
        except KeyError:
            raise ModelNotFound(
                f"The model '{name}' does not exist or you do not have access to it.", param="model"
            ) from None

    def __iter__(self) -> Iterator[ServedModel]:
        return iter(self._models)
