#!/bin/sh
# torchvision for the CPU vLLM venv, outside it (docs/design/images.md): PyPI's torchvision 0.28.0 (pairs with torch 2.13)
# is a CUDA build whose _C.so cannot load on torch+cpu; only its fake-kernel registration then fails.
set -e
D=${1:-.cache/vision-probe/tv}  # from the repository root
.venv/bin/python -m pip install --quiet --no-deps --target "$D" torchvision==0.28.0
.venv/bin/python - "$D/torchvision/__init__.py" <<'PY'
import sys
p = sys.argv[1]; s = open(p).read()
old = "from torchvision import (\n    _autograd_registrations,\n    _meta_registrations,\n"
new = ("try:  # the CUDA wheel's _C does not load on CPU torch: skip its fake kernels (nms, roi_align, ...)\n"
       "    from torchvision import _meta_registrations\nexcept RuntimeError:\n    pass\n"
       "from torchvision import (\n    _autograd_registrations,\n")
if old in s:
    open(p, "w").write(s.replace(old, new))
PY
echo "export PYTHONPATH=$D"
