"""`sparkgate check CONFIG`: the shipped configs pass, each broken one fails with its own code and
a message naming the model or field, and the CLI exits 2 with one `error [code]` line per problem."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gateway.check import CODES, check_config
from gateway.cli import app
from tests.conftest import ROOT

CONFIG = ROOT / "config"
BROKEN = Path(__file__).resolve().parent / "broken_configs"
# The tiny models exist on this machine (`make models`); the DGX Spark's /models do not.
LOCAL = ["default.yaml", "frontend.yaml", "replay.yaml", "sim-dgx-spark.yaml"]
SPARK = ["dgx-spark.yaml", "dgx-spark-2.yaml", "dgx-spark-vllm-server.yaml"]
TOKEN = "SPARKGATE_ENGINE_TOKEN"
_EXPECT = re.compile(r"^# expect \[(\w+)\] (.+)$", re.MULTILINE)


@pytest.fixture(autouse=True)
def _tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken configs with a remote engine fail only where they mean to: the shared token is
    set, and the variable token_env.yaml names is not (whatever this machine has)."""
    monkeypatch.setenv(TOKEN, "test-token")
    monkeypatch.delenv("SPARKGATE_CHECK_TEST_TOKEN", raising=False)


def expectations(path: Path) -> list[tuple[str, str]]:
    """(code, text) from the file's `# expect [code] text` lines."""
    return _EXPECT.findall(path.read_text())


def test_every_shipped_config_is_checked() -> None:
    """A config added to config/ must join one of the lists above, or nothing checks it."""
    assert sorted(LOCAL + SPARK) == sorted(p.name for p in CONFIG.glob("*.yaml"))


@pytest.mark.parametrize("name", LOCAL)
def test_shipped_configs_pass_with_local_checks(name: str) -> None:
    report = check_config(CONFIG / name)
    assert report.ok, report.problems
    assert report.plan and not report.skipped


@pytest.mark.parametrize("name", SPARK)
def test_spark_configs_pass_when_checked_for_another_machine(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN)
    report = check_config(CONFIG / name, skip_local=True)
    assert report.ok, report.problems
    assert "model directories" in report.skipped and "token environment variables" in report.skipped


def test_spark_config_checked_here_names_the_missing_models_and_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN)
    report = check_config(CONFIG / "dgx-spark.yaml")
    assert report.codes == {"model_dir", "token_env"}
    lines = [p.line() for p in report.problems]
    assert "error [model_dir] model 'qwen3.8-27b': /models/Qwen3.8-27B-NVFP4 does not exist (models[].path)" in lines
    assert any("'qwen3.6-35b-a3b': /models/Qwen3.6-35B-A3B-NVFP4" in line for line in lines)
    assert any("'qwen3.8-flash-next': /models/Qwen3.8-Flash-Next-tokenizer" in line for line in lines)
    assert (
        "error [token_env] model 'qwen3.8-flash-next': $SPARKGATE_ENGINE_TOKEN (the engine host's token) is not set"
        in lines
    )
    monkeypatch.setenv(TOKEN, "set")
    assert check_config(CONFIG / "dgx-spark.yaml").codes == {"model_dir"}


def test_every_broken_config_says_what_it_expects() -> None:
    files = sorted(BROKEN.glob("*.yaml"))
    assert len(files) >= len(CODES)
    for f in files:
        codes = {code for code, _ in expectations(f)}
        assert len(codes) == 1 and codes <= set(CODES), f
        assert f.name.split("--")[0].removesuffix(".yaml") in codes, f  # the file is named after its code
    # Every code has a broken config that produces it.
    assert {f.name.split("--")[0].removesuffix(".yaml") for f in files} == set(CODES)


@pytest.mark.parametrize("path", sorted(BROKEN.glob("*.yaml")), ids=lambda p: p.stem)
def test_a_broken_config_fails_with_exactly_its_code(path: Path) -> None:
    report = check_config(path)
    expected = expectations(path)
    assert report.codes == {expected[0][0]}, report.problems
    messages = [p.message for p in report.problems]
    for _, text in expected:
        assert any(text in m for m in messages), (text, messages)


def test_every_problem_is_reported_not_only_the_first(tmp_path: Path) -> None:
    cfg = yaml.safe_load((BROKEN / "team.yaml").read_text())
    cfg["models"][0]["path"] = str(ROOT / "models/tiny-qwen3")  # the copy lives elsewhere
    cfg["models"].append({"name": "flash", "engine": "remote", "path": str(ROOT / "models/tiny-qwen3")})
    cfg["models"][-1]["remote"] = {"address": "ftp://spark-2:8001"}
    cfg["placement"] = {"name": "p", "boxes": [{"name": "spark-1", "models": ["tiny"]}]}
    path = tmp_path / "many.yaml"
    path.write_text(yaml.safe_dump(cfg))
    report = check_config(path)
    assert report.codes == {"team", "remote_address", "placement"}
    assert "placement: model 'flash' is on no box" in [p.message for p in report.problems]


def test_schema_errors_stop_the_checks_each_with_its_field(tmp_path: Path) -> None:
    cfg = {
        "auth": {"keys": [{"name": "dev", "sha256": "0" * 64, "team": "nobody"}]},  # a team problem, unchecked
        "models": [{"name": "tiny", "path": "nowhere", "max_model_len": 8, "dtype": 16}],
        "box": {"memory": "lots"},
    }
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    report = check_config(path)
    assert report.codes == {"schema"} and report.plan == ()
    messages = sorted(p.message for p in report.problems)
    assert len(messages) == 3, messages
    assert messages[0].startswith("box.memory: not a size: 'lots'")
    assert "model 'tiny': models[0].dtype: Input should be a valid string (got 16)" in messages
    assert "model 'tiny': models[0].max_model_len: Input should be greater than or equal to 16 (got 8)" in messages


@pytest.mark.parametrize("text", ["models: [unclosed", "- a list\n- at the top", "1: x\nmodels: []"])
def test_unreadable_yaml_is_a_schema_problem(tmp_path: Path, text: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    report = check_config(path)
    assert report.codes == {"schema"} and str(path) in report.problems[0].message
    assert check_config(tmp_path / "missing.yaml").codes == {"schema"}


def test_a_config_without_models_is_a_schema_problem(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("models: []")
    assert [p.line() for p in check_config(path).problems] == ["error [schema] models: at least one model is required"]


def test_the_plan_shows_boxes_kv_and_slots() -> None:
    plan = "\n".join(check_config(CONFIG / "dgx-spark.yaml", skip_local=True).plan)
    assert "spark-1 (this gateway): qwen3.6-35b-a3b (vllm), qwen3.8-27b (vllm)" in plan
    assert "spark-2: qwen3.8-flash-next (remote)" in plan
    assert "KV cache: qwen3.8-27b 30.00 GiB, qwen3.6-35b-a3b 30.00 GiB" in plan
    assert "qwen3.8-27b: engine vllm, max_model_len 262144, slots 4, KV 30.00 GiB" in plan
    assert "qwen3.8-flash-next: engine remote at http://spark-2:8001" in plan
    # 64 MiB of the tiny Qwen3's KV: 2 layers x K,V x 2 heads x 32 dims x 2 bytes = 512 B a token.
    tiny = "\n".join(check_config(CONFIG / "default.yaml").plan)
    assert "sparkgate-tiny: engine vllm, max_model_len 4096, slots 8, KV 64 MiB, 131072 tokens" in tiny


def test_simulated_kv_tokens_are_the_box_models() -> None:
    from engine_adapter.spark import DGX_SPARK, MODELS, BoxSim, GiB, SimConfig

    sim = BoxSim(MODELS["Qwen3.8-27B"], DGX_SPARK, SimConfig(max_num_seqs=4, kv_cache_bytes=30 * GiB))
    plan = check_config(CONFIG / "sim-dgx-spark.yaml").plan
    line = next(x for x in plan if x.strip().startswith("qwen3.8-27b:"))
    assert f"KV 30.00 GiB, {sim.kv_spec().capacity_tokens} tokens" in line


def test_cli_prints_the_plan_and_ok() -> None:
    r = CliRunner().invoke(app, ["check", str(CONFIG / "default.yaml")])
    assert r.exit_code == 0, r.output
    assert "sparkgate-tiny: engine vllm" in r.stdout and r.stdout.rstrip().splitlines()[-1].startswith("ok")
    assert r.stderr == ""


def test_cli_skip_local_says_what_it_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN)
    r = CliRunner().invoke(app, ["check", str(CONFIG / "dgx-spark.yaml"), "--skip-local"])
    assert r.exit_code == 0, r.output
    assert "skipped (--skip-local): model directories, tokenizer files" in r.stdout


def test_cli_exits_2_with_one_error_line_per_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN)
    r = CliRunner().invoke(app, ["check", str(CONFIG / "dgx-spark.yaml")])
    assert r.exit_code == 2
    errors = [line for line in r.stderr.splitlines() if line.startswith("error [")]
    assert len(errors) == 4 and sum(line.startswith("error [model_dir] ") for line in errors) == 3
    assert errors[-1].startswith("error [token_env] model 'qwen3.8-flash-next'")
    assert "ok" not in r.stdout.splitlines()[-1]


def test_cli_schema_error_goes_to_stderr() -> None:
    r = CliRunner().invoke(app, ["check", str(BROKEN / "schema.yaml")])
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.startswith("error [schema] model 'tiny': models[0].max_num_seqs")


def test_check_loads_neither_torch_nor_vllm() -> None:
    code = (
        "import sys; from gateway.check import check_config\n"
        "for c in ('default', 'frontend', 'sim-dgx-spark', 'dgx-spark'): check_config(f'config/{c}.yaml')\n"
        "print(sorted(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
