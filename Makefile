# Every target sets up what it needs: on a fresh clone `make test` and `make demo` are enough.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Two stamps, each newer than pyproject.toml once its install is done: the runtime dependencies (`make demo`) and
# the dev extra on top of them (tests, lint, benchmarks). A venv made by `make demo` gets the dev extra from the
# first `make test`; installing the dev extra installs the runtime too, so it stamps both.
RUNTIME := $(VENV)/.installed-runtime
DEV := $(VENV)/.installed-dev
# -qq: only pip's errors are printed (a failed install still stops make with them); its warnings, about the
# machine's own pip configuration or the build back end's notes on an editable install, are left out. `make
# PIP_QUIET= venv` shows them all.
PIP_QUIET ?= -qq
PIP := $(BIN)/python -m pip install $(PIP_QUIET) --disable-pip-version-check
# Tools the tests run that cannot share the project's venv: openapi-python-client pins typer below the CLI's.
TOOLS := .venv-tools
TOOLS_STAMP := $(TOOLS)/.installed
# `make test` spreads the suite over pytest-xdist workers, each with databases and files of its own: two per CPU,
# as the suite waits on subprocesses, servers, timeouts and databases about as much as it computes (on 2 CPUs, 4
# workers finished it in about four fifths of the time 2 did). `make test PYTEST_WORKERS=0` runs it in one process.
PYTEST_WORKERS ?= $(shell $(PYTHON) -c 'import os; print(2 * (os.cpu_count() or 1))')
PYTEST := $(BIN)/python -m pytest -q

export RAILYARD_TEST_POSTGRES_URL ?= postgresql+psycopg://postgres@127.0.0.1:5432/test

.PHONY: all venv demo test test-core bench bench-quick lint db-upgrade clean

all: test

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip

$(RUNTIME): pyproject.toml | $(BIN)/python
	$(PIP) -e .
	touch $(RUNTIME)

$(DEV): pyproject.toml | $(BIN)/python
	$(PIP) -e '.[dev]'
	touch $(RUNTIME) $(DEV)

$(TOOLS_STAMP):
	test -x $(TOOLS)/bin/python || $(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/python -m pip install $(PIP_QUIET) --disable-pip-version-check 'openapi-python-client==0.29.1'
	touch $(TOOLS_STAMP)

venv: $(DEV)

demo: $(RUNTIME)
	$(BIN)/railyard db upgrade
	$(BIN)/railyard demo

test: $(DEV) $(TOOLS_STAMP)
	$(PYTEST) -n $(PYTEST_WORKERS) --dist worksteal

# The pure core (engine/core): no database, no subprocess, no server; seconds, in this one process.
test-core: $(DEV)
	$(PYTEST) -m core

# bench/figures.py runs every benchmark in bench/ (its BENCHES, in order) and ends with one table of every target.
bench: $(DEV)
	$(BIN)/python bench/figures.py

bench-quick: $(DEV)
	$(BIN)/python bench/figures.py --quick

lint: $(DEV)
	$(BIN)/ruff format --check engine workflows migrations tests bench tools
	$(BIN)/ruff check engine workflows migrations tests bench tools
	$(BIN)/mypy engine workflows tests bench
	$(BIN)/lint-imports

db-upgrade: $(RUNTIME)
	$(BIN)/railyard db upgrade

clean:
	rm -rf $(VENV) railyard.db railyard.db-wal railyard.db-shm
