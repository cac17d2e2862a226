# Set-up is two commands on a fresh machine: `make demo` and `make test`.
# Both create .venv with Python 3.12 when it is missing and install the project into it.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml examples/plugin-arm/pyproject.toml
	@test -x $(PY) || $$(bash .ci/find-python) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip install -q -e examples/plugin-arm
	@touch $(STAMP)

demo: $(STAMP)
	$(PY) -m examples.demo

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -n 2 -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: $(STAMP)
	$(PY) -m benchmarks_perf store

clean:
	rm -rf $(VENV) .medomni .pytest_cache
