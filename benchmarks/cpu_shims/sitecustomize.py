"""On PYTHONPATH, for processes that build Qwen4Exp on the CPU build (benchmarks/meta_engine.py):
transformers' torchvision image processor for Qwen2-VL, which vLLM's Qwen3-VL module imports,
is served by its PIL twin when torchvision is absent. Every interpreter started with this path
(a gateway, vLLM's model inspection subprocess, an engine core) gets it; nothing is imported
until that module is."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType

_ALIASED = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
_TWIN = "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl"


class _TwinLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(_TWIN)

    def exec_module(self, module: ModuleType) -> None:
        return None


class _TwinFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != _ALIASED or importlib.util.find_spec("torchvision") is not None:
            return None
        return importlib.util.spec_from_loader(fullname, _TwinLoader())


sys.meta_path.insert(0, _TwinFinder())
