"""Shared fixtures: the book's notebooks executed once per test run, and the built site.

Both go through :mod:`attnlib.book.build`, the code path of ``make book``: a notebook is executed only
when it, attnlib or the requirements changed since its last successful execution, so after
``make book`` (which ``make test`` runs first) nothing is executed again here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _central_difference(f, x, eps=1e-6):
    """Central finite differences of a scalar function ``f`` over every entry of ``x``."""
    x = np.asarray(x, float)
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[idx] = eps
        grad[idx] = (f(x + e) - f(x - e)) / (2 * eps)
    return grad


@pytest.fixture
def central_difference():
    """The tests' one finite-difference gradient: ``central_difference(f, x, eps=1e-6)``."""
    return _central_difference


@pytest.fixture(scope="session")
def executed_book():
    """``{notebook (relative Path): ExecutionResult}`` for every notebook of ``_toc.yml``."""
    from attnlib.book import build as book

    return {result.notebook: result for result in book.execute_all(ROOT, jobs=2)}


@pytest.fixture(scope="session")
def built_site(executed_book):
    """The rendered site, ``_build/html`` (built if anything changed since the last build)."""
    from attnlib.book import build as book

    if not (ROOT / "node_modules").is_dir():
        pytest.fail("node_modules is missing: run `make assets` (npm ci) or `make book` first")
    failed = [str(nb) for nb, result in executed_book.items() if not result.ok]
    if failed:
        pytest.fail(f"the site cannot be built, notebooks failed: {failed}")
    book.build(ROOT)
    return ROOT / book.BUILD_DIR / "html"
