"""One module per chapter, named like its notebook: the chapter's drivers, theorem tolerances,
not-applicable rules and tables. An experiment module imports only the core (never another
chapter's module), so a chapter reads its experiments in one file.

A notebook reaches them as ``al.experiments.<chapter>`` (its import cell names it ``ex``).
"""

import importlib

# Each chapter's module loads on first use (``al.experiments.<chapter>``, the module ``__getattr__``
# below, PEP 562), so a page pays the imports of its own chapter only.

__all__ = [
    "global_convergence",
    "regularization_path",
    "local_convergence",
    "optimizer_geometry",
    "joint_training",
    "fast_rates",
    "real_tokens",
    "factorization",
]


def __getattr__(name: str):
    """Import the chapter module ``name`` on first access."""
    if name in __all__:
        return importlib.import_module(f".{name}", __name__)  # the import binds it in this namespace
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
