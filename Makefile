# Two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SCENARIO ?= smoke
PYTEST_ARGS ?=

.PHONY: run test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/ninelives run $(SCENARIO)

test: $(STAMP)
	$(BIN)/python -m pytest -n auto $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python bench/engine_throughput.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
