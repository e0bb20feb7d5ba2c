# swerl: `make run` runs the pipeline on the CPU default config; `make test` runs the whole test suite.
# Both create .venv on first use (torch==2.13.0 first, then the project) and are quick on a second call.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
CONFIG ?= configs/local.yaml
STAMP  := $(VENV)/.swerl-installed
PYTEST_ARGS ?=

.PHONY: setup sysdeps run test lint format up serve clean-runs

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Reinstalled only when the project's dependencies change.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev,e2b]'
	touch $(STAMP)

setup: $(STAMP) sysdeps

# System packages the sandboxes need, installed only when missing: bubblewrap, and a C compiler that builds the
# local sandbox supervisor (swerl/sandbox/nsinit.c) once, at its first use.
sysdeps:
	@command -v bwrap >/dev/null 2>&1 || { \
	  echo "installing bubblewrap"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq bubblewrap >/dev/null; }
	@command -v $${CC:-cc} >/dev/null 2>&1 || { \
	  echo "installing gcc"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq gcc libc6-dev >/dev/null; }

run: setup
	$(BIN)/swerl run $(CONFIG)

test: setup
	$(BIN)/pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy swerl flows tasks
	$(BIN)/lint-imports
	$(BIN)/python scripts/check_rooms.py
	$${CC:-cc} -fsyntax-only -Wall -Wextra -Werror swerl/sandbox/nsinit.c

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

up: setup
	$(BIN)/swerl up $(CONFIG)

serve: setup
	$(BIN)/swerl serve $(CONFIG)

clean-runs:
	rm -rf runs
