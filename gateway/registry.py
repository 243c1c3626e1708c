"""Served models by name and alias: what the gateway routes a request's `model` to."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from engine_adapter.base import Engine
from gateway.errors import ModelNotFound
from gateway.settings import ModelSettings
from gateway.text.templates import OutputFormats


@dataclass(frozen=True)
class ServedModel:
    settings: ModelSettings
    engine: Engine
    tokenizer: Any  # policies.tokens.ChatTokenizer
    formats: OutputFormats = field(default_factory=OutputFormats)  # how it writes tool calls, reasoning

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def tokenizer_id(self) -> str:
        """Models with the same id count tokens alike (a prompt rendered for one fits the other)."""
        return self.settings.tokenizer or self.settings.path


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
