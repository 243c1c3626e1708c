"""engine_adapter/torchvision_cpu.py, as `make setup`'s .pth file runs it in every interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def _import_fake_torchvision(tmp_path: Path, error: str) -> subprocess.CompletedProcess[str]:
    package = tmp_path / "torchvision"
    package.mkdir()
    (package / "__init__.py").write_text("from torchvision import _meta_registrations\nLOADED = True\n")
    (package / "_meta_registrations.py").write_text(f"raise RuntimeError({error!r})\n")
    code = "import engine_adapter.torchvision_cpu, torchvision; print(torchvision.LOADED)"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)}, capture_output=True, text=True
    )


def test_missing_compiled_ops_leave_the_fake_kernels_out(tmp_path: Path) -> None:
    done = _import_fake_torchvision(tmp_path, "operator torchvision::nms does not exist")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"


def test_any_other_failure_still_raises(tmp_path: Path) -> None:
    done = _import_fake_torchvision(tmp_path, "something else broke")
    assert done.returncode != 0
    assert "something else broke" in done.stderr


@pytest.mark.parametrize(
    "module", ["torchvision.transforms.v2", "transformers.models.qwen3_vl.video_processing_qwen3_vl"]
)
def test_the_venv_imports_what_qwens_processors_need(module: str) -> None:
    done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
