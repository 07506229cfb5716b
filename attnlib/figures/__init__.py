"""One module per chapter that draws, named like its notebook, plus ``common`` for what several
chapters draw (colours, token scatters, directions, paths, bands, the selection table). A figure
module imports the core, its own chapter's experiment module and ``common``.

A notebook reaches them as ``al.figures.<chapter>`` (its import cell names it ``figs``) and
``al.figures.common`` (``common``).
"""

from .._lazy import lazy_submodules

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


__getattr__, __dir__ = lazy_submodules(__name__, __all__, globals())
