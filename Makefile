# Two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SCENARIO ?= smoke
PYTEST_ARGS ?=

.PHONY: run test bench clean browser

PIP    := $(BIN)/python -m pip install --quiet --disable-pip-version-check
LOG    := $(VENV)/install.log

# The install's chatter (a build backend's notices, an index's warnings) goes to a log,
# shown whole only when the install fails.
$(STAMP): pyproject.toml
	@$(PYTHON) -m venv $(VENV)
	@echo "installing ninelives and its test tools into $(VENV) (log: $(LOG))"
	@{ $(PIP) --upgrade pip && $(PIP) -e '.[test]'; } >$(LOG) 2>&1 \
	  || { cat $(LOG); echo "error: the install failed; the log above is in $(LOG)"; exit 1; }
	@touch $(STAMP)

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
