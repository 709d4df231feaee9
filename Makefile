# Two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SCENARIO ?= smoke
PYTEST_ARGS ?=

.PHONY: run test docs bench clean browser postgres

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

test: $(STAMP) browser postgres fuse
	$(BIN)/python -m pytest -n auto $(PYTEST_ARGS)

# The documentation site, built offline into site/ (the suite builds it strictly too).
docs: $(STAMP)
	$(BIN)/python -m chaos.docs --check
	$(BIN)/mkdocs build --strict

# The report page is checked in a headless browser; install one where we may (root, apt).
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	  && { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
	  || echo "note: no chromium; the browser check of report.html will fail until it is installed"; }

# The store's contract tests start a real PostgreSQL server of their own (initdb, pg_ctl) and
# never skip: install its binaries where we may (root, apt), else say what is missing. No
# main cluster is made, so the install starts no server of its own.
PG_BINS := $(shell { pg_config --bindir 2>/dev/null; ls -d /usr/lib/postgresql/*/bin 2>/dev/null; } \
             | while read d; do [ -x "$$d/initdb" ] && [ -x "$$d/pg_ctl" ] && echo "$$d"; done | head -n 1)
APT_QUIET := DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
             -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold
postgres:
	@[ -n "$(PG_BINS)" ] || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	  && { echo "installing PostgreSQL (apt) for the store tests"; \
	       [ -e /etc/postgresql-common/createcluster.conf ] || { mkdir -p /etc/postgresql-common \
	         && echo "create_main_cluster = false" >/etc/postgresql-common/createcluster.conf; }; \
	       apt-get update -qq && $(APT_QUIET) postgresql >/dev/null; } \
	  || echo "note: no PostgreSQL server binaries (initdb, pg_ctl); the PostgreSQL store tests will fail until they are installed"; }

# The power-loss tests mount a lost-fsync file system (FUSE, chaos.powerloss) and never skip:
# install fusermount3 and libfuse3 where we may (root, apt), else say what is missing.
fuse:
	@command -v fusermount3 >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	  && { echo "installing fuse3 (apt) for the power-loss tests"; \
	       apt-get update -qq && $(APT_QUIET) fuse3 >/dev/null; } \
	  || echo "note: no fusermount3; the power-loss tests will fail until fuse3 is installed"; }

# The benchmarks put other engines beside ours (DBOS, procrastinate) at the versions the
# README measured: the bench extra pins them. PostgreSQL's server binaries as for the tests.
BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP): $(STAMP)
	@echo "installing the benchmarks' engines into $(VENV) (log: $(LOG))"
	@$(PIP) -e '.[test,bench]' >$(LOG) 2>&1 \
	  || { cat $(LOG); echo "error: the install failed; the log above is in $(LOG)"; exit 1; }
	@touch $(BENCH_STAMP)

bench: $(BENCH_STAMP) postgres
	$(BIN)/python bench/engine_throughput.py
	$(BIN)/python bench/latency_throughput.py
	$(BIN)/python bench/postgres_throughput.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
