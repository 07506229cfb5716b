"""Chapter 7 (the factorisation ``W = K Qᵀ``): its figures.

Functions draw on a given matplotlib ``Axes`` and return it; what several chapters draw is
:mod:`attnlib.figures.common`.
"""

from __future__ import annotations

import numpy as np

from ..experiments.factorization import PlanePaths
from .common import COLORS

__all__ = ["INPUT_COLORS", "plane_paths_panel", "shown_draw"]

#: One colour per input of a 2-D panel (the official figure's red and blue), and its tokens' fill.
INPUT_COLORS = (("tab:red", "c"), ("tab:blue", "y"))


def shown_draw(applicable) -> int:
    """The draw a panel shows: the first whose two SVMs differ for both kinds (``applicable`` (N, 2)), else 0.

    >>> shown_draw(np.array([[True, False], [True, True]]))
    1
    """
    both = np.flatnonzero(np.all(np.asarray(applicable, bool), axis=1))
    return int(both[0]) if both.size else 0


def _unit_scaled(W, scale):
    """Each matrix of a path (R, d, d') at Frobenius norm ``scale`` (its direction, at the SVM's size)."""
    norms = np.linalg.norm(W, axis=(-2, -1), keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norms > 0, W * (scale / norms), np.nan)


def plane_paths_panel(ax, plane: PlanePaths, family: int, draw: int):
    """One draw of a [TFSVM] 2-D family: tokens, both SVM directions ``W z_i``, their hyperplanes, both paths.

    Input ``i`` in its colour (:data:`INPUT_COLORS`): its tokens (star: the optimal one), the ray of
    ``W_mm z_i`` (solid, the Frobenius SVM of the ``W`` run's selection) and of ``W*_mm z_i`` (dashed,
    the nuclear SVM of the ``(K, Q)`` run's selection), each SVM's separating line
    ``{x : xᵀ W z_i = x_{iα_i}ᵀ W z_i − 1/2}`` (dotted: Frobenius, dash-dot: nuclear), and the paths
    ``W(t) z_i`` (thick solid) and ``K(t)Q(t)ᵀ z_i`` (thick dashed), each rescaled to the Frobenius norm
    of its own SVM (the paths grow without bound; their direction is what converges), so that a path
    that has converged ends on its SVM's point ``W z_i`` (filled circle: Frobenius, open: nuclear).

    >>> import matplotlib.pyplot as plt
    >>> from attnlib.experiments.factorization import plane_paths
    >>> fig, ax = plt.subplots()
    >>> plane_paths_panel(ax, plane_paths(draws=[0], steps=20), 0, 0) is ax
    True
    >>> plt.close(fig)
    """
    T = plane.Ts[family]
    X, Z, opt = plane.X[family, draw, :, :T], plane.Z[family, draw], plane.opt[family, draw]
    extent = 1.2 * np.abs(X).max()
    for kind, line, plane_line in ((0, "-", ":"), (1, "--", "-.")):
        svm = plane.svms[kind, family, draw, kind]
        path = _unit_scaled(plane.W[:, family, draw, kind], np.linalg.norm(svm) if np.all(np.isfinite(svm)) else 1.0)
        sel = plane.select[family, draw, kind]
        for i, (color, _) in enumerate(INPUT_COLORS):
            pz = path @ Z[i]
            ax.plot(pz[:, 0], pz[:, 1], line, color=color, lw=2.2, alpha=0.85, zorder=3)
            if not np.all(np.isfinite(svm)):
                continue
            p = svm @ Z[i]
            extent = max(extent, 1.2 * np.linalg.norm(p))
            ax.scatter(*p, marker="o", s=45, facecolors=color if kind == 0 else "white", edgecolors=color, zorder=5)
            ray = p / np.linalg.norm(p) * 100.0
            ax.plot([0, ray[0]], [0, ray[1]], line, color=color, lw=1.0, alpha=0.6, zorder=1)
            # the line halfway between the selected token's margin and the others': pᵀx = pᵀx_α − 1/2
            level, normal = p @ X[i, sel[i]] - 0.5, p / np.dot(p, p)
            along = np.array([-p[1], p[0]]) / np.linalg.norm(p) * 100.0
            ends = level * normal + np.outer([-1.0, 1.0], along)
            ax.plot(ends[:, 0], ends[:, 1], plane_line, color=color, lw=1.0, alpha=0.6, zorder=0)
    for i, (_, fill) in enumerate(INPUT_COLORS):
        for t in range(T):
            star = t == opt[i]
            ax.scatter(*X[i, t], marker="*" if star else ("d", "o")[i], s=200 if star else 70, color=fill,
                       edgecolors="k", linewidths=1.0, zorder=4)  # fmt: skip
    ax.plot([], [], "k-", lw=2.2, label="W(t) zᵢ")
    ax.plot([], [], "k--", lw=2.2, label="K(t)Q(t)ᵀ zᵢ")
    ax.plot([], [], "-", color=COLORS["path"], lw=1.0, label="W_mm zᵢ (Frobenius)")
    ax.plot([], [], "--", color=COLORS["path"], lw=1.0, label="W*_mm zᵢ (nuclear)")
    ax.set(xlim=(-extent, extent), ylim=(-extent, extent), aspect="equal", xlabel="coordinate 1",
           ylabel="coordinate 2")  # fmt: skip
    ax.grid(alpha=0.3)
    return ax
