"""Engine flags with open corruption reports (policies/known_issues.py), and `sparkgate check`'s
section on them (gateway/check.py): refused, or a warning where the model accepts the issue."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.check import check_config
from gateway.settings import ModelSettings
from policies.known_issues import (
    ISSUE_IDS,
    KNOWN_ISSUES,
    UNSPECIFIED,
    EngineFlags,
    KnownIssue,
    findings,
    parse_version,
    unknown_issues,
)

ROOT = Path(__file__).resolve().parents[2]
RANGED = KnownIssue(
    id="x#1",
    url="https://example.invalid/1",
    effect="wrong",
    methods=frozenset({"mtp"}),
    since=(0, 30),
    fixed_in=(0, 33),
)


def flags(**over: Any) -> EngineFlags:
    base: dict[str, Any] = {"model": "m", "speculative_method": "mtp", "prefix_caching": True, "hybrid": True}
    return EngineFlags(**(base | over))


def ids(fs: list[Any]) -> list[str]:
    return [f.issue.id for f in fs]


# -- the decision ------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["mtp", "dflash", "eagle", "eagle3", UNSPECIFIED])
def test_eagle_family_speculation_with_prefix_caching_on_a_hybrid_model_is_refused(method: str) -> None:
    (f,) = findings(flags(speculative_method=method, architecture="Qwen3_5"))
    assert f.issue.id == "vllm#53912" and not f.accepted
    assert "enable_prefix_caching: false" in f.message and "accept_known_issues: ['vllm#53912']" in f.message


@pytest.mark.parametrize(
    "over",
    [
        {"speculative_method": None},  # no speculative decoding
        {"prefix_caching": False},  # the alternative the report gives
        {"hybrid": False},  # every layer full attention: no recurrent state to restore
        {"speculative_method": "ngram"},  # drafts without the target's hidden states
    ],
)
def test_without_the_whole_combination_nothing_is_found(over: dict[str, Any]) -> None:
    assert findings(flags(**over)) == []


def test_flash_next_with_mtp_also_gets_its_own_zero_hit_report() -> None:
    assert ids(findings(flags(architecture="Qwen4ExpForCausalLM"))) == ["vllm#53912", "vllm-backport#73"]
    assert ids(findings(flags(architecture="Qwen4Exp", speculative_method="dflash"))) == ["vllm#53912"]
    assert ids(findings(flags(architecture=None))) == ["vllm#53912"]  # unknown architecture: the general one


def test_an_accepted_issue_is_a_warning_naming_the_alternative() -> None:
    (f,) = findings(flags(accepted=("vllm#53912",)))
    assert f.accepted
    assert "accepted" in f.message and "the canary checks it" in f.message and "enable_prefix_caching" in f.message


def test_version_ranges() -> None:
    table = [RANGED]
    assert findings(flags(vllm_version=None), table) != []  # unknown: assume affected
    assert findings(flags(vllm_version=(0, 29, 9)), table) == []  # before it
    assert findings(flags(vllm_version=(0, 30)), table) != []
    assert findings(flags(vllm_version=(0, 32, 1)), table) != []
    assert findings(flags(vllm_version=(0, 33, 0)), table) == []  # fixed
    assert RANGED.versions() == "vLLM 0.30+, fixed in 0.33"
    assert KNOWN_ISSUES[0].versions() == "vLLM all releases, open"


def test_open_reports_affect_every_version() -> None:
    for issue in KNOWN_ISSUES:
        assert issue.fixed_in is None and issue.affects((0, 32, 0)) and issue.affects((9, 0))


@pytest.mark.parametrize(
    ("text", "want"),
    [("0.32.0", (0, 32, 0)), ("0.32.1rc1.dev5+gabc", (0, 32, 1)), ("v0.28", (0, 28)), (None, None), ("dev", None)],
)
def test_parse_version(text: str | None, want: tuple[int, ...] | None) -> None:
    assert parse_version(text) == want


def test_unknown_accepted_ids_are_named() -> None:
    assert unknown_issues(["vllm#53912", "vllm#1"]) == ["vllm#1"]
    assert unknown_issues(list(ISSUE_IDS)) == []


def test_the_model_setting_refuses_an_unknown_issue() -> None:
    with pytest.raises(ValueError, match="'vllm#1' is not a known issue"):
        ModelSettings(name="m", path="p", accept_known_issues=("vllm#1",))
    assert ModelSettings(name="m", path="p", accept_known_issues=("vllm#53912",)).accept_known_issues == ("vllm#53912",)


# -- sparkgate check ---------------------------------------------------------------------------


def _config(tmp_path: Path, **model: Any) -> Path:
    m = {
        "name": "qwen3.8-27b",
        "path": "/models/Qwen3.8-27B-NVFP4",
        "engine_args": {"speculative_config": {"method": "dflash", "num_speculative_tokens": 8}},
    } | model
    out = tmp_path / "c.yaml"
    out.write_text(yaml.safe_dump({"models": [m]}))
    return out


def test_check_refuses_the_combination_with_its_own_code(tmp_path: Path) -> None:
    report = check_config(_config(tmp_path), skip_local=True)
    assert report.codes == {"known_issue"}
    assert "qwen3.8-27b" in report.problems[0].message and "vllm#53912" in report.problems[0].message
    assert report.warnings == ()


def test_check_warns_where_the_model_accepts_it(tmp_path: Path) -> None:
    report = check_config(_config(tmp_path, accept_known_issues=["vllm#53912"]), skip_local=True)
    assert report.ok
    (w,) = report.warnings
    assert "vllm#53912" in w and "enable_prefix_caching: false" in w


@pytest.mark.parametrize(
    "model",
    [
        {"enable_prefix_caching": False},
        {"engine_args": {"speculative_config": {"method": "dflash"}, "enable_prefix_caching": False}},
        {"engine_args": {}},
        {"engine": "simulated", "simulated": {"model": "Qwen3.8-27B"}},  # a box model has no engine flags
    ],
)
def test_check_passes_without_the_combination(tmp_path: Path, model: dict[str, Any]) -> None:
    assert "known_issue" not in check_config(_config(tmp_path, **model), skip_local=True).codes


def test_check_reads_the_json_string_form_and_the_local_config_json(tmp_path: Path) -> None:
    model_dir = tmp_path / "flash"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(
        '{"architectures": ["Qwen4ExpForCausalLM"], "layer_types": ["linear_attention"]}'
    )
    spec = '{"method": "mtp", "num_speculative_tokens": 4}'
    report = check_config(
        _config(tmp_path, name="flash", path=str(model_dir), engine_args={"speculative_config": spec})
    )
    found = {p.message.split("report, ")[1].split(" ")[0] for p in report.problems if p.code == "known_issue"}
    assert found == {"vllm#53912", "vllm-backport#73"}
    garbled = check_config(
        _config(tmp_path, name="flash", path=str(model_dir), engine_args={"speculative_config": "{"})
    )
    assert "known_issue" in garbled.codes  # unreadable: the method is unknown, so assume the worst


@pytest.mark.parametrize("name", ["dgx-spark.yaml", "dgx-spark-2.yaml"])
def test_shipped_spark_configs_run_no_known_issue(name: str) -> None:
    report = check_config(ROOT / "config" / name, skip_local=True)
    assert report.ok and report.warnings == (), report.problems
