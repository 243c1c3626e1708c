import re
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
    assert m.kv_cache_bytes == 128 * 1024**2
    assert s.model_path(m) == ROOT / "models" / "tiny-qwen3"
    assert s.auth.required and s.auth.keys[0].sha256 == hash_key("sk-sparkgate-dev")


def test_env_overrides_yaml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKGATE_SERVER__PORT", "9123")
    s = load_settings(ROOT / "config" / "default.yaml")
    assert s.server.port == 9123


def test_duplicate_model_names_rejected() -> None:
    with pytest.raises(ValidationError, match="used by both"):
        Settings(models=(ModelSettings(name="a", path="x"), ModelSettings(name="b", path="y", aliases=("a",))))


@pytest.mark.parametrize(
    "where",
    [
        {"auth": {"keys": [{"name": "k", "sha256": hash_key("sk-x"), "slo_class": "snapy"}]}},
        {"quotas": {"teams": [{"name": "t", "defaults": {"slo_class": "snapy"}}]}},
        {"quotas": {"defaults": {"slo_class": "snapy"}}},
    ],
)
def test_an_unknown_slo_class_is_rejected(where: dict) -> None:  # type: ignore[type-arg]
    routing = {"enabled": True, "classes": {"snappy": {"ttft_s": 2.0}}, "default_class": "snappy"}
    with pytest.raises(ValidationError, match=r"slo_class \['snapy'\] not in routing\.classes"):
        Settings(models=(ModelSettings(name="a", path="x"),), routing=routing, **where)  # type: ignore[arg-type]


def test_an_unknown_box_model_is_rejected() -> None:
    message = "unknown box model 'qwen3.6-35b-a3b'; known: Qwen3.6-35B-A3B, "
    with pytest.raises(ValidationError, match=re.escape(message)):
        ModelSettings(name="a", path="x", engine="simulated", simulated={"model": "qwen3.6-35b-a3b"})  # type: ignore[arg-type]


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


def test_a_remote_model_needs_its_host_a_tokenizer_and_a_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.settings import BoxSettings, RemoteSettings

    with pytest.raises(ValidationError, match="engine 'remote' needs a 'remote' section"):
        Settings(models=(ModelSettings(name="a", path="x", engine="remote"),))
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer_config.json").write_text("{}")
    remote = ModelSettings(
        name="far", path="tok", engine="remote", remote=RemoteSettings(address="http://spark-2:8001", token_env="T")
    )
    local = ModelSettings(name="near", path="tok", weights_bytes=1 << 30)
    s = Settings(models=(local, remote), base_dir=str(tmp_path), box=BoxSettings(memory="8GiB", reserved="1GiB"))
    # Only the tokenizer is needed here for the remote model; the local one needs its weights.
    assert s.missing_model_dirs() == [f"model 'near': {tmp_path / 'tok'} has no config.json"]
    monkeypatch.delenv("T", raising=False)
    assert s.missing_secrets() == ["model 'far': $T (the engine host's token) is not set"]
    monkeypatch.setenv("T", "secret")
    assert s.missing_secrets() == []
    # The remote model's memory is the other box's: this box's plan gives all KV to the local one.
    from policies.memory_plan import MemoryPlan

    plan = s.memory_plan()
    assert isinstance(plan, MemoryPlan) and list(plan.kv_cache) == ["near"]
    planned = s.with_kv_plan(plan)
    assert planned.models[1].kv_cache_bytes is None and planned.models[0].kv_cache_bytes == plan.kv_cache["near"]
