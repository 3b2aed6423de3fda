# pgidgen: `make demo` runs the main job on throwaway local servers; `make test` runs the tests.
# Both install what they need: a venv with pgidgen, and PostgreSQL's server programs when missing.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PGIDGEN := $(VENV)/bin/pgidgen
PYTEST_ARGS ?=

.PHONY: help venv deps test demo bench clean

help:
	@echo "make demo   - start two sandbox servers, init 2000 shards, insert and decode IDs"
	@echo "make test   - run the test suite against real throwaway PostgreSQL servers"
	@echo "make bench  - benchmarks, as ratios against their baselines"

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

venv: $(PY)
	$(PY) -m pip install -q -e '.[test]'

# PostgreSQL's server programs (initdb, pg_ctl) and libfaketime (clock-skew tests), installed when absent.
deps:
	@bash tests/ensure-deps.sh

test: deps venv
	$(PY) -m pytest $(PYTEST_ARGS)

demo: deps venv
	PATH="$(abspath $(VENV))/bin:$$PATH" bash examples/demo.sh

bench: deps venv
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) .pytest_cache .pgidgen-sandbox
