"""`sparkgate codex-config` (gateway/codex.py): the config.toml it prints and the model catalog
it writes, for the configured models."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gateway.cli import app
from gateway.codex import CodexModel, catalog, config_toml

MODELS = Path(__file__).resolve().parents[2] / "models"


def write_config(tmp_path: Path, host: str = "0.0.0.0") -> Path:
    path = str(MODELS / "tiny-qwen3")
    cfg = {
        "server": {"host": host, "port": 8123},
        "models": [
            {"name": "big", "engine": "replay", "path": path, "max_model_len": 131072},
            {"name": "capped", "engine": "replay", "path": path, "max_model_len": 32768, "max_context": 16384},
        ],
    }
    out = tmp_path / "c.yaml"
    out.write_text(yaml.safe_dump(cfg))
    return out


def test_the_config_is_toml_with_a_responses_provider() -> None:
    text = config_toml(model='a "quoted" name', base_url="http://h:1/", catalog_path="/x/c.json")
    assert tomllib.loads(text) == {
        "model": 'a "quoted" name',
        "model_provider": "sparkgate",
        "model_catalog_json": "/x/c.json",
        "model_providers": {
            "sparkgate": {
                "name": "sparkgate",
                "base_url": "http://h:1/v1",
                "env_key": "SPARKGATE_API_KEY",
                "wire_api": "responses",
            }
        },
    }


def test_the_catalog_offers_freeform_apply_patch_over_http() -> None:
    (entry,) = catalog([CodexModel("m", 4096)])["models"]
    assert entry["slug"] == "m" and entry["context_window"] == 4096
    assert entry["apply_patch_tool_type"] == "freeform" and entry["prefer_websockets"] is False
    assert entry["shell_type"] == "shell_command" and entry["supported_in_api"] is True


def test_the_command_writes_the_catalog_and_prints_the_config(tmp_path: Path) -> None:
    target = tmp_path / "home" / "models.json"
    r = CliRunner().invoke(app, ["codex-config", "--config", str(write_config(tmp_path)), "--catalog", str(target)])
    assert r.exit_code == 0, r.output
    config = tomllib.loads(r.stdout)
    assert config["model"] == "big" and config["model_catalog_json"] == str(target.resolve())
    assert config["model_providers"]["sparkgate"]["base_url"] == "http://127.0.0.1:8123/v1"  # not 0.0.0.0
    windows = {m["slug"]: m["context_window"] for m in json.loads(target.read_text())["models"]}
    assert windows == {"big": 131072, "capped": 16384}  # max_context caps max_model_len
    r = CliRunner().invoke(
        app,
        [
            "codex-config",
            "-c",
            str(write_config(tmp_path)),
            "--catalog",
            str(target),
            "--model",
            "capped",
            "--url",
            "https://gw.example",
        ],
    )
    config = tomllib.loads(r.stdout)
    assert config["model"] == "capped" and config["model_providers"]["sparkgate"]["base_url"] == "https://gw.example/v1"


def test_an_unknown_model_is_refused(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["codex-config", "-c", str(write_config(tmp_path)), "--model", "nope"])
    assert r.exit_code == 2 and "nope" in r.output


def test_the_catalog_goes_to_codex_home_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CODEX_HOME", str(tmp_path / "cx"))
    r = CliRunner().invoke(app, ["codex-config", "-c", str(write_config(tmp_path, host="10.0.0.5"))])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "cx" / "sparkgate-models.json").exists()
    assert tomllib.loads(r.stdout)["model_providers"]["sparkgate"]["base_url"] == "http://10.0.0.5:8123/v1"
