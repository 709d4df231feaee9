# Two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SCENARIO ?= smoke
PYTEST_ARGS ?=

.PHONY: run test bench clean browser

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/ninelives run $(SCENARIO)

test: $(STAMP) browser
	$(BIN)/python -m pytest -n auto $(PYTEST_ARGS)

# The report page is checked in a headless browser; install one where we may (root, apt).
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	  && { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
	  || echo "note: no chromium; the browser check of report.html will be skipped"; }

bench: $(STAMP)
	$(BIN)/python bench/engine_throughput.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
