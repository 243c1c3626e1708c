"""Test configs from the shipped ones: `shipped_config("replay", server={"port": port})` is
config/replay.yaml with a test's changes, so a test says only what it changes.

Overrides merge deeply: a mapping into a mapping key by key, a mapping into a list of named
items (`models`, `auth.keys`, ...) item by item, by name (`"*"`: every item); anything else
replaces what was there."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from tests.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "config"
EVERY = "*"  # in an override of a list of named items: every item


def shipped_config(name: str, **overrides: Any) -> dict[str, Any]:
    """config/<name>.yaml as the tree's server would read it (relative paths and the caches
    inside this tree, on a loopback port of its own if `server.port` is not given), with
    `overrides` merged in (see the module's docstring)."""
    cfg: dict[str, Any] = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
    cfg["base_dir"] = str(ROOT)
    cfg.setdefault("server", {})["port"] = free_port()
    return merge(cfg, overrides)


def merge(base: Any, override: Any) -> Any:
    """`override` merged into a copy of `base` (see the module's docstring)."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for key, value in override.items():
            out[key] = merge(base[key], value) if key in base else copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(override, dict) and all(isinstance(item, dict) for item in base):
        names = {item.get("name") for item in base}
        unknown = set(override) - names - {EVERY}
        if unknown:
            raise KeyError(f"no item named {sorted(unknown)} to override (there are {sorted(map(str, names))})")
        out_list = []
        for item in base:
            item = merge(item, override.get(EVERY, {}))
            out_list.append(merge(item, override.get(item.get("name"), {})))
        return out_list
    return copy.deepcopy(override)


def write_config(cfg: dict[str, Any], directory: Path, name: str = "sparkgate.yaml") -> Path:
    """`cfg` as a YAML file in `directory`, for `sparkgate serve --config`."""
    path = directory / name
    path.write_text(yaml.safe_dump(cfg))
    return path
