"""One module per chapter that draws, named like its notebook, plus ``common`` for what several
chapters draw (colours, token scatters, directions, paths, bands, the selection table). A figure
module imports the core, its own chapter's experiment module and ``common``.

A notebook reaches them as ``al.figures.<chapter>`` (its import cell names it ``figs``) and
``al.figures.common`` (``common``).
"""

from . import (
    common,
    factorization,
    fast_rates,
    global_convergence,
    joint_training,
    local_convergence,
    optimizer_geometry,
    real_tokens,
    regularization_path,
    sweeps,
)

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
