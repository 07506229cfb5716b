# The few commands a person types. Everything runs inside .venv, created on first use.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
KERNEL_CONFIG := $(VENV)/etc/ipython/ipython_kernel_config.py
NODE_STAMP := node_modules/.installed
CHROMIUM ?= /usr/bin/chromium
JOBS ?= 2
PYTEST_ARGS ?=

.PHONY: setup assets browser lint format book pdf test bench robustness lock clean lab

# attnlib's byte-code is compiled here (in no time when it is current): an editable install has none,
# and where PYTHONDONTWRITEBYTECODE is set (as on the CI machines) Python never writes it, so every
# kernel and worker would compile attnlib again on import (about 40 ms a process).
setup: $(STAMP) $(KERNEL_CONFIG)
	@$(PY) -m compileall -q attnlib >/dev/null

# Reinstall only when the requirements, the lock or the project metadata changed.
$(STAMP): requirements.txt constraints.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt -c constraints.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e .
	@touch $@

# The venv's IPython kernels keep raw papermill's "TCP without encryption" warning out of their log
# (book/kernel/ipython_kernel_config.py says why; attnlib's own runs encrypt instead).
$(KERNEL_CONFIG): book/kernel/ipython_kernel_config.py $(STAMP)
	install -D -m 644 $< $@

# Browser assets the site serves itself (MathJax, require.js, the widget manager), pinned in
# package-lock.json. `npm ci` only when the lock changed.
assets: $(NODE_STAMP)

$(NODE_STAMP): package.json package-lock.json
	npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
	@touch $@

# Chromium for the browser test: Debian's package (never `playwright install`). Installed when
# missing and we are root; otherwise the browser test is skipped (and fails under CI=true).
browser:
	@if [ -x $(CHROMIUM) ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing chromium with apt-get"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q chromium >/dev/null || { apt-get update -q && apt-get install -y -q chromium >/dev/null; }; \
	else echo "chromium is not installed and cannot be installed here (not root, or no apt): the browser test will be skipped"; fi

lint: setup
	$(VENV)/bin/ruff check attnlib tests benchmarks notebooks
	$(VENV)/bin/ruff format --check attnlib tests benchmarks notebooks

format: setup
	$(VENV)/bin/ruff check --fix attnlib tests benchmarks notebooks
	$(VENV)/bin/ruff format attnlib tests benchmarks notebooks

# papermill executes the notebooks of _toc.yml that changed into _build/stage, then Jupyter Book
# renders the staged copy (execution off, warnings as errors) into _build/html.
# One BLAS thread per kernel: two notebooks run at once on two cores, and BLAS threads fighting over
# them made chapters twice as slow (benchmarks/book_profile.py).
book: setup assets
	OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 $(PY) -m attnlib book --jobs $(JOBS)

# The whole book as one PDF, _build/pdf/attnlib-book.pdf, also copied into the site (the
# introduction links it): Jupyter Book's single-page build of the staged book, printed by Chromium
# once MathJax has typeset every formula. CHROMIUM=/path/to/chrome to print with another one.
pdf: book browser
	$(PY) -m attnlib pdf --chromium $(CHROMIUM)

test: setup lint assets browser book pdf
	MPLBACKEND=Agg OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 $(PY) -m pytest -q $(PYTEST_ARGS)

bench: setup
	$(PY) benchmarks/run.py

# Every theorem chapter swept over fresh seeds; refreshes the committed tables in book/robustness/
# that the robustness page shows. SEEDS=A:B, BACKEND=local|dask. Resumes an interrupted run.
SEEDS ?= 1000:1099
BACKEND ?= local
robustness: setup
	OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 $(PY) -m attnlib robustness --seeds $(SEEDS) --jobs $(JOBS) --backend $(BACKEND)

# JupyterLab on the project's environment, on this machine only (127.0.0.1), opened on working
# copies of the chapters in _build/lab/notebooks (refreshed from notebooks/ unless you edited them;
# the book's MathJax macros defined in a cell on top): autosave never writes into notebooks/. Rerun
# a chapter and its explorers recompute live (attnlib.explorer). Open the URL it prints (it carries
# the access token). The kernels' traffic is encrypted (CurveZMQ keys from the kernel manager);
# root (a container) is allowed. LAB_PORT=0 picks a free port; LAB_ARGS=--no-browser on a machine
# without a browser.
LAB_PORT ?= 8888
LAB_ARGS ?=
lab: setup
	$(PY) -m attnlib lab --port $(LAB_PORT) -- $(LAB_ARGS)

# Freeze the whole resolved environment after changing requirements.txt.
lock: setup
	$(PY) -m pip freeze --exclude-editable | grep -v '^-e' > constraints.txt

clean:
	rm -rf _build
