"""torchvision's CUDA wheel on CPU torch: the only torchvision built for torch 2.13 on the package
index is the CUDA build, whose compiled ops (`torchvision._C`) cannot load on `torch+cpu`. Its
Python side (the transforms Qwen's image and video processors use) works; only the import of
`torchvision._meta_registrations`, which registers fake kernels for those compiled ops, raises.

`install()` puts a finder on `sys.meta_path` that runs that module and, when it raises because
the ops are missing, leaves it empty. `make setup` runs it from a `.pth` file, so every
interpreter of the virtualenv gets it (the gateway, vLLM's engine core and its model inspection
subprocess). Where torchvision's ops load (the GPU image), the module imports as usual and the
finder does nothing else. Nothing here imports torch or torchvision.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

TARGET = "torchvision._meta_registrations"


class _Tolerant(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        try:
            self._inner.exec_module(module)
        except RuntimeError as error:
            # "operator torchvision::nms does not exist": the ops it describes did not load.
            if "does not exist" not in str(error):
                raise


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Tolerant(spec.loader)
        return spec


def install() -> None:
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


install()
