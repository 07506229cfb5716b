"""One module per chapter that draws, named like its notebook, plus ``common`` for what several
chapters draw (colours, token scatters, directions, paths, bands, the selection table). A figure
module imports the core, its own chapter's experiment module and ``common``.

A notebook reaches them as ``al.figures.<chapter>`` (its import cell names it ``figs``) and
``al.figures.common`` (``common``).
"""

import importlib

# Each chapter's module loads on first use (``al.figures.<chapter>``, the module ``__getattr__``
# below, PEP 562), so a page pays the imports of its own chapter only.

__all__ = [
    "common",
    "global_convergence",
    "regularization_path",
    "local_convergence",
    "optimizer_geometry",
    "joint_training",
    "fast_rates",
    "real_tokens",
    "factorization",
    "sweeps",
]


def __getattr__(name: str):
    """Import the chapter module ``name`` on first access."""
    if name in __all__:
        return importlib.import_module(f".{name}", __name__)  # the import binds it in this namespace
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
