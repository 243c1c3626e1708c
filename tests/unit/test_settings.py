from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.settings import ModelSettings, Settings, hash_key, load_settings, parse_bytes

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("64MiB", 64 * 1024**2),
        ("2 GiB", 2 * 1024**3),
        ("500MB", 500 * 1000**2),
        ("1048576", 1048576),
        ("10B", 10),
        ("1.5KiB", 1536),
        (4096, 4096),
    ],
)
def test_parse_bytes(text: str | int, value: int) -> None:
    assert parse_bytes(text) == value


@pytest.mark.parametrize("bad", ["", "lots", "12 parsecs", "-1MiB"])
def test_parse_bytes_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_bytes(bad)


def test_default_config_loads_and_resolves_paths() -> None:
    s = load_settings(ROOT / "config" / "default.yaml")
    assert s.server.port == 8000 and s.server.host == "127.0.0.1"
    m = s.models[0]
    assert m.kv_cache_bytes == 64 * 1024**2
    assert s.model_path(m) == ROOT / "models" / "tiny-qwen3"
    assert s.auth.required and s.auth.keys[0].sha256 == hash_key("sk-sparkgate-dev")


def test_env_overrides_yaml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKGATE_SERVER__PORT", "9123")
    s = load_settings(ROOT / "config" / "default.yaml")
    assert s.server.port == 9123


def test_duplicate_model_names_rejected() -> None:
    with pytest.raises(ValidationError, match="used by both"):
        Settings(models=(ModelSettings(name="a", path="x"), ModelSettings(name="b", path="y", aliases=("a",))))


def test_unknown_keys_rejected() -> None:
    with pytest.raises(ValidationError):
        Settings(models=(ModelSettings(name="a", path="x"),), serverr={})  # type: ignore[call-arg]


def test_auth_required_needs_keys() -> None:
    with pytest.raises(ValidationError, match=r"neither auth\.keys nor auth\.admin_keys"):
        Settings(models=(ModelSettings(name="a", path="x"),), auth={"required": True})  # type: ignore[arg-type]


def test_missing_model_dirs_are_named(tmp_path: Path) -> None:
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "config.json").write_text("{}")
    s = Settings(
        models=(ModelSettings(name="a", path="ok"), ModelSettings(name="b", path="gone")), base_dir=str(tmp_path)
    )
    assert s.missing_model_dirs() == [f"model 'b': {tmp_path / 'gone'} has no config.json"]


def test_quota_teams_are_checked() -> None:
    from gateway.settings import ApiKey, AuthSettings, KeyLimits, QuotaSettings, TeamSettings, hash_key

    with pytest.raises(ValidationError, match=r"team 'lab' is not in quotas\.teams"):
        Settings(
            models=(ModelSettings(name="a", path="x"),),
            auth=AuthSettings(keys=(ApiKey(name="k", sha256=hash_key("k"), team="lab"),)),
        )
    with pytest.raises(ValidationError, match="team names must be unique"):
        QuotaSettings(teams=(TeamSettings(name="t"), TeamSettings(name="t")))
    with pytest.raises(ValidationError):
        KeyLimits(rpm=0)  # zero would refuse everything: leave the key out instead
    base = KeyLimits(rpm=10, tpm=100, priority="batch")
    assert KeyLimits(tpm=5).over(base) == KeyLimits(rpm=10, tpm=5, priority="batch")
    assert KeyLimits().over(base) is base
