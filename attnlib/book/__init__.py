"""The book's machinery, apart from the mathematics.

- :mod:`.checks`: a chapter's claims, each passed, failed or not applicable;
- :mod:`.params`: a chapter's parameters declared once and validated;
- :mod:`.style`: the one figure style of the book (:func:`.style.use` in every import cell);
- :mod:`.prose`: parameters glued for the prose (:func:`glue_parameters`);
- :mod:`.widgets`: explorers, live in a kernel and precomputed in the static site (:func:`explorer`);
- :mod:`.run`: one parameterised papermill run and its JSON summary (``python -m attnlib run``);
- :mod:`.sweep`: grids of runs on a process pool or Dask (``python -m attnlib sweep``);
- :mod:`.build`: stage, execute what changed, render the site (``python -m attnlib book``).

- :mod:`.mutants`: planted errors for the mutation test (``ATTNLIB_MUTANT=name``, planted on import).

``run``, ``sweep`` and ``build`` import papermill and Jupyter Book only when they execute, so
``import attnlib`` works without Jupyter.
"""

import importlib

from .checks import CHECK_MIME, STATUSES, Check, Checks, Control
from .files import find_upwards
from .params import boolean, check_parameter, integer, list_of, one_of, real, text, validate
from .prose import glue_parameters
from .timing import blas_threads, timed

# ``style``, ``widgets`` (and its ``explorer``, ``static_explorers``) and ``performance`` load on
# first use (the module ``__getattr__`` below, PEP 562): they import matplotlib, which a page
# imports anyway but a script or a sweep driver that only trains and checks does not need.
_LAZY_MODULES = ("performance", "style", "widgets")
_LAZY_NAMES = {"explorer": "widgets", "static_explorers": "widgets"}

__all__ = [
    "performance",
    "style",
    "widgets",
    "glue_parameters",
    "CHECK_MIME",
    "STATUSES",
    "Check",
    "Checks",
    "Control",
    "find_upwards",
    "blas_threads",
    "timed",
    "boolean",
    "check_parameter",
    "integer",
    "list_of",
    "one_of",
    "real",
    "text",
    "validate",
    "explorer",
    "static_explorers",
]


def __getattr__(name: str):
    """Load ``style``, ``widgets`` or ``performance`` (or a name of ``widgets``) on first access."""
    if name in _LAZY_MODULES:
        return importlib.import_module(f".{name}", __name__)  # the import binds it in this namespace
    if name in _LAZY_NAMES:
        return getattr(importlib.import_module(f".{_LAZY_NAMES[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_MODULES) | set(_LAZY_NAMES))


# The mutation test's hook: with $ATTNLIB_MUTANT set (tests/test_mutations.py), plant that error now,
# when a notebook's `import attnlib` reaches this package; without it, nothing happens.
from . import mutants  # noqa: E402

mutants.apply_from_environment()
