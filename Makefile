# raylab: two commands on a fresh machine with Python 3.11 and pip.
#   make train   install into .venv and run the main job (APPO on microduck_balance)
#   make test    install into .venv and run the whole test suite (what CI runs)
#
# torch build: TORCH_SPEC / TORCH_INDEX_URL choose it, before anything else is installed.
#   CPU (default here; pip takes the CPU wheel that lies on this machine's disk):
#     make train
#   CPU anywhere:   make install TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
#   CUDA 12.8:      make install TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128

PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX_URL ?=
ARGS ?=
PYTEST_ARGS ?=

BIN := $(VENV)/bin
STAMP := $(VENV)/.raylab-installed

.PHONY: install train test test-fast lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)" $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL))
	$(BIN)/python -m pip install -q -e ".[dev]"
	@touch $@

install: $(STAMP)

train: $(STAMP)
	$(BIN)/raylab train $(ARGS)

# Everything (what CI runs), in two phases (docs/testing.md): the suite on two pytest-xdist
# workers (TEST_WORKERS; 1 runs it serially), then the tests marked `alone` (a learning run on
# a wall-clock budget) one at a time with the machine to themselves. Both phases run; either
# failing fails the target. The 25 slowest tests of each phase are listed at its end.
# The first phase is stopped (SIGINT: pytest prints its summary and the tests still running)
# after TEST_PHASE_LIMIT_S (twice its usual time on the CI machine), so that a hang still
# leaves the second phase and CI's report its time.
TEST_WORKERS ?= 2
FAST_WORKERS ?= 2
TEST_PHASE_LIMIT_S ?= 3600
workers = $(if $(filter 1,$(1)),,-n $(1))  # xdist's flag; its scheduler: tests/conftest.py
test: lint
	timeout --foreground -s INT -k 60 $(TEST_PHASE_LIMIT_S) $(BIN)/python -m pytest $(call workers,$(TEST_WORKERS)) -m "not alone" --durations=25 $(PYTEST_ARGS); first=$$?; \
	$(BIN)/python -m pytest -m alone --durations=5 $(PYTEST_ARGS); second=$$?; \
	exit $$(( first || second ))

# The inner loop, on two xdist workers: no learning runs, no multi-process fault scenarios
# (tests marked slow).
test-fast: lint
	$(BIN)/python -m pytest $(call workers,$(FAST_WORKERS)) -m "not slow" --durations=10 $(PYTEST_ARGS)

# ruff (lint + format) and the layer contracts in pyproject.toml. import-linter reads one
# package tree, so the installed layout (envs/ -> raylab/envs, algorithms/ -> raylab/algorithms)
# is assembled under build/lint for it.
LINT_TREE := build/lint
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	rm -rf $(LINT_TREE) && mkdir -p $(LINT_TREE)
	cp -r raylab $(LINT_TREE)/raylab && cp -r envs $(LINT_TREE)/raylab/envs && cp -r algorithms $(LINT_TREE)/raylab/algorithms
	cd $(LINT_TREE) && PYTHONPATH=. $(abspath $(BIN))/lint-imports --no-cache $(abspath pyproject.toml)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
