"""One module per chapter, named like its notebook: the chapter's drivers, theorem tolerances,
not-applicable rules and tables. An experiment module imports only the core (never another
chapter's module), so a chapter reads its experiments in one file.

A notebook reaches them as ``al.experiments.<chapter>`` (its import cell names it ``ex``).
"""

from .._lazy import lazy_submodules

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
    "decoder_and_initialisation",
]


__getattr__, __dir__ = lazy_submodules(__name__, __all__, globals())
