# The few commands a person types. Everything runs inside .venv, created on first use.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup lint format test bench book lock clean

setup: $(STAMP)

# Reinstall only when the requirements, the lock or the project metadata changed.
$(STAMP): requirements.txt constraints.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt -c constraints.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e .
	@touch $@

lint: setup
	$(VENV)/bin/ruff check attnlib tests benchmarks notebooks
	$(VENV)/bin/ruff format --check attnlib tests benchmarks notebooks

format: setup
	$(VENV)/bin/ruff check --fix attnlib tests benchmarks notebooks
	$(VENV)/bin/ruff format attnlib tests benchmarks notebooks

test: setup lint
	MPLBACKEND=Agg $(PY) -m pytest -q $(PYTEST_ARGS)

bench: setup
	$(PY) benchmarks/run.py

# Freeze the whole resolved environment after changing requirements.txt.
lock: setup
	$(PY) -m pip freeze --exclude-editable | grep -v '^-e' > constraints.txt

clean:
	rm -rf _build
