"""One module per chapter, named like its notebook: the chapter's drivers, theorem tolerances,
not-applicable rules and tables. An experiment module imports only the core (never another
chapter's module), so a chapter reads its experiments in one file.

A notebook reaches them as ``al.experiments.<chapter>`` (its import cell names it ``ex``).
"""

from . import (
    factorization,
    fast_rates,
    global_convergence,
    joint_training,
    local_convergence,
    real_tokens,
    regularization_path,
)

__all__ = [
    "global_convergence",
    "regularization_path",
    "local_convergence",
    "joint_training",
    "fast_rates",
    "real_tokens",
    "factorization",
]
