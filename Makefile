# Set-up is two commands on a fresh machine: `make demo` and `make test`.
# Both create .venv with Python 3.12 when it is missing and install the project into it.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint docs bench clean docker-engine docker-engine-stop browser

$(STAMP): pyproject.toml examples/plugin-arm/pyproject.toml adapters/harbor/pyproject.toml
	@test -x $(PY) || $$(bash .ci/find-python) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q -e examples/plugin-arm
	$(PY) -m pip install -q -e adapters/harbor
	@touch $(STAMP)

demo: $(STAMP)
	$(PY) -m examples.demo

# --dist loadfile: a module's tests share its fixtures (a Docker job, LLM trials, a world), which
# plain `load` would build once on each worker (xdist's loadgroup does not group under pytest 9)
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -n 2 --dist loadfile -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# The reference site, into site/ (git-ignored); --strict makes a broken link or nav entry an
# error. Its reference pages and schema files are generated from the code by docs/hooks.py.
docs: $(STAMP)
	@$(PY) -c 'import mkdocs, material' 2>/dev/null || $(PY) -m pip install -q -e '.[docs]'
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

bench: $(STAMP)
	$(PY) -m benchmarks_perf store

clean:
	rm -rf $(VENV) .medomni .pytest_cache .mypy_cache site

# A private Docker engine in .docker/ (root: installs docker.io, containerd, runc, busybox-static,
# bash-static and tmux from apt when missing), with the images local/base:1 and local/terminus:1.
# The tests use it when it answers; without it they start one of their own. Prints the
# DOCKER_HOST to export.
docker-engine:
	bash .ci/docker-engine install
	bash .ci/docker-engine start .docker
	bash .ci/docker-engine image .docker
	@echo "export DOCKER_HOST=$$(bash .ci/docker-engine host .docker)"

docker-engine-stop:
	bash .ci/docker-engine stop .docker

# Headless Chromium and chromium-driver from apt (root), for the viewer's browser test
# (tests/test_view.py; it skips without them unless MEDOMNI_REQUIRE_BROWSER=1).
browser:
	bash .ci/browser install
