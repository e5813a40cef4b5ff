# Every target sets up what it needs: on a fresh clone `make test` and `make demo` are enough.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Tools the tests run that cannot share the project's venv: openapi-python-client pins typer below the CLI's.
TOOLS := .venv-tools
TOOLS_STAMP := $(TOOLS)/.installed

export RAILYARD_TEST_POSTGRES_URL ?= postgresql+psycopg://postgres@127.0.0.1:5432/test

.PHONY: all venv demo test bench bench-quick lint db-upgrade clean

all: test

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

$(TOOLS_STAMP):
	test -x $(TOOLS)/bin/python || $(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/python -m pip install --quiet 'openapi-python-client==0.29.1'
	touch $(TOOLS_STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/railyard db upgrade
	$(BIN)/railyard demo

test: $(STAMP) $(TOOLS_STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python bench/replay.py
	$(BIN)/python bench/append.py
	$(BIN)/python bench/agent_step.py
	$(BIN)/python bench/workers.py
	$(BIN)/python bench/checkpoint.py
	$(BIN)/python bench/llm_bound.py
	$(BIN)/python bench/scale.py

bench-quick: $(STAMP)
	$(BIN)/python bench/replay.py --quick
	$(BIN)/python bench/append.py --quick
	$(BIN)/python bench/agent_step.py --quick
	$(BIN)/python bench/workers.py --quick
	$(BIN)/python bench/checkpoint.py --quick
	$(BIN)/python bench/llm_bound.py --quick
	$(BIN)/python bench/scale.py --quick

lint: $(STAMP)
	$(BIN)/ruff format --check engine workflows migrations tests bench tools
	$(BIN)/ruff check engine workflows migrations tests bench tools
	$(BIN)/mypy engine workflows tests bench
	$(BIN)/lint-imports

db-upgrade: $(STAMP)
	$(BIN)/railyard db upgrade

clean:
	rm -rf $(VENV) railyard.db railyard.db-wal railyard.db-shm
