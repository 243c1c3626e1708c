"""Codex CLI's configuration for this gateway (`sparkgate codex-config`): a model provider in
its `config.toml`, and a model catalog (`model_catalog_json`) with an entry per served model.

Codex talks to a custom provider with `wire_api = "responses"`: HTTP POST /v1/responses and
server-sent events (no WebSocket: the catalog says `prefer_websockets: false`), its body
maybe zstd-compressed. Without a catalog entry for the model, Codex knows nothing of it and
leaves tools out, its freeform `apply_patch` among them; the entry asks for that tool
(`apply_patch_tool_type: "freeform"`, a custom tool the gateway offers the model as a
function of one string) and a shell tool, and gives the model's context window.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

PROVIDER = "sparkgate"
KEY_ENV = "SPARKGATE_API_KEY"
BASE_INSTRUCTIONS = (
    "You are a coding agent working in the user's workspace through Codex CLI's tools. "
    "Run commands with the shell tool and edit files with apply_patch. Be concise."
)
TOOL_OUTPUT_TOKENS = 10_000  # Codex truncates a tool's output to this before sending it back


@dataclass(frozen=True)
class CodexModel:
    name: str  # what requests name (the served model name)
    context_window: int  # tokens: prompt and output together
    images: bool = False  # it takes images: Codex then sends `--image` files and pasted images


def catalog(models: Sequence[CodexModel]) -> dict[str, Any]:
    """The model catalog Codex reads (`model_catalog_json`)."""
    return {
        "models": [
            {
                "slug": m.name,
                "display_name": m.name,
                "description": f"{m.name} on sparkgate",
                "apply_patch_tool_type": "freeform",
                "prefer_websockets": False,
                "context_window": m.context_window,
                "supports_parallel_tool_calls": True,
                "shell_type": "shell_command",
                "base_instructions": BASE_INSTRUCTIONS,
                "supported_reasoning_levels": [],
                "visibility": "list",
                "supported_in_api": True,
                "priority": i + 1,
                "truncation_policy": {"mode": "tokens", "limit": TOOL_OUTPUT_TOKENS},
                "input_modalities": ["text", "image"] if m.images else ["text"],
                "support_verbosity": True,
                "experimental_supported_tools": [],
            }
            for i, m in enumerate(models)
        ]
    }


def _toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def config_toml(*, model: str, base_url: str, catalog_path: str, key_env: str = KEY_ENV) -> str:
    """Codex's `config.toml`: sparkgate as the model provider, `model` its default model."""
    api = base_url.rstrip("/") + "/v1"
    return (
        f"model = {_toml_string(model)}\n"
        f"model_provider = {_toml_string(PROVIDER)}\n"
        f"model_catalog_json = {_toml_string(catalog_path)}\n"
        "\n"
        f"[model_providers.{PROVIDER}]\n"
        f"name = {_toml_string(PROVIDER)}\n"
        f"base_url = {_toml_string(api)}\n"
        f"env_key = {_toml_string(key_env)}\n"
        'wire_api = "responses"\n'
    )
