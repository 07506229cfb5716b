"""Chapter 2 (regularization path): its figures.

Functions draw on a given matplotlib ``Axes`` (or make a figure) and return it; what several
chapters draw is :mod:`attnlib.figures.common`.
"""

from __future__ import annotations

import numpy as np

from ..model import TokenSelectionProblem
from .common import COLORS, SAMPLE_COLORS, direction

__all__ = [
    "path_directions",
    "direction_error",
    "loss_gap_by_subtraction",
    "margin_deficit",
    "singular_value_spectra",
    "attention_on_keys",
    "NORM_COLORS",
    "margin_deficits_and_spectra",
]


def path_directions(ax, directions, radii, length: float = 1.4, cmap: str = "viridis", colorbar: bool = True):
    """Arrows from the origin along the directions ``θ̄(R)/R`` of a regularization path, coloured by ``R``.

    Args:
        directions: (N, ≥2) unit directions (first two coordinates drawn), e.g. ``path.direction``.
        radii: (N,) the radii, increasing; the colour scale is logarithmic in ``R``.
        length: arrow length in data units.  colorbar: add a colour bar labelled with ``R``.
    """
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    directions = np.asarray(directions, float).reshape(len(radii), -1)
    norm = LogNorm(float(radii[0]), float(radii[-1]))
    colors = plt.get_cmap(cmap)(norm(np.asarray(radii, float)))
    for c, d in zip(colors, directions):
        ax.annotate("", xy=length * d[:2], xytext=(0, 0), arrowprops=dict(arrowstyle="->", color=c, lw=1.6))
    if colorbar:
        mappable = plt.cm.ScalarMappable(cmap=cmap, norm=norm)
        ax.figure.colorbar(mappable, ax=ax, label=r"radius $R$ of the arrow $\bar p(R)/R$")
    return ax


def direction_error(
    ax, radii, error, bound=None, others=None, color=None, label=None, scale=None, floor: float = 1e-20
):
    """A path's directional error ``1 − cos`` against ``R`` on log axes, with its bound and other instances.

    Args:
        radii: (N,).  error: (N,) ``1 − cos(θ̄(R), θ_mm)``, drawn with markers in ``color``.
        bound: (N,) the bound ``B(R)``, dashed in the same colour where it is below 1 (else ``None``).
        others: (K, N) errors of other instances, thin grey lines (label ``"other seeds"``).
        scale: (N,) factor applied to every curve (e.g. ``R²`` to show ``R²(1 − cos)``).
        floor: values are clipped below at ``floor`` (``1 − cos`` can be exactly 0 in floating point).
    """
    radii = np.asarray(radii, float)
    color = COLORS["global"] if color is None else color
    s = np.ones_like(radii) if scale is None else np.asarray(scale, float)
    for k, e in enumerate(np.atleast_2d(others) if others is not None else []):
        ax.loglog(radii, np.maximum(s * e, floor), color="0.6", lw=1, label="other seeds" if k == 0 else None)
    ax.loglog(radii, np.maximum(s * np.asarray(error, float), floor), "o-", color=color, label=label)
    if bound is not None:
        bound = np.asarray(bound, float)
        ax.loglog(radii, np.where(bound < 1, s * bound, np.nan), "--", color=color, label=r"bound $B(R)$")
    ax.set_xlabel("radius $R$")
    return ax


def loss_gap_by_subtraction(ax, radii, log_gap, subtracted, resolution: float):
    """The loss gap ``L − L*`` along a path, computed in log space and by subtracting the floor.

    Args: ``radii`` (N,); ``log_gap`` (N,) ``log(L − L*)``; ``subtracted`` (N,) ``L − L*`` computed as
    value minus floor (drawn where positive); ``resolution``: the float resolution of ``L``, dotted.
    """
    subtracted = np.asarray(subtracted, float)
    ax.semilogy(radii, np.exp(log_gap), "o-", label=r"$\mathcal{L}-\mathcal{L}_\star$ from attnlib (log space)")
    ax.semilogy(radii, np.where(subtracted > 0, subtracted, np.nan), "s--", label="value − floor (subtraction)")
    ax.axhline(resolution, color="k", lw=0.8, ls=":", label=r"float resolution of $\mathcal{L}$")
    ax.set_xscale("log")
    ax.set_xlabel("radius $R$")
    ax.set_ylabel(r"loss gap at $\bar p(R)$")
    return ax


def margin_deficit(ax, radii, rho, bound, other: float, color, label: str):
    """A path's margin deficit ``1 − ρ(R)`` (markers), its bound ``1 − ρ_lo(R)`` (dotted, where ``ρ_lo > 0``)
    and the deficit ``1 − other`` of a competing direction (dash-dot), all in ``color``, log axes."""
    bound = np.asarray(bound, float)
    ax.loglog(radii, 1 - np.asarray(rho, float), "o-", color=color, label=f"{label}: $1-\\rho$")
    ax.loglog(radii, np.where(bound > 0, 1 - bound, np.nan), ":", color=color, label=r"bound $1-\rho_{lo}(R)$")
    ax.axhline(1 - other, color=color, ls="-.", lw=0.8, label="other SVM in this norm")
    ax.set_xlabel("radius $R$")
    ax.set_ylabel(r"margin deficit $1-\rho$")
    return ax


def singular_value_spectra(ax, matrices, threshold: float | None = None, floor: float = 1e-14):
    """Normalised singular values ``s_k/s_1`` of matrices, one line each.

    Args: ``matrices``: ``{label: (M, color, marker)}``; ``threshold``: a rank threshold drawn dotted.
    """
    for label, (M, color, marker) in matrices.items():
        s = np.linalg.svd(np.asarray(M, float), compute_uv=False)
        k = np.arange(1, len(s) + 1)
        ax.semilogy(k, np.maximum(s / s[0], floor), marker + "-", color=color, label=label, ms=8, alpha=0.8)
    if threshold is not None:
        ax.axhline(threshold, color="k", lw=0.8, ls=":", label="rank threshold")
    ax.set_xlabel("singular value index")
    ax.set_ylabel(r"$s_k/s_1$")
    return ax


def attention_on_keys(ax, prob: TokenSelectionProblem, theta, theta_mm=None, ring_area: float = 900.0):
    """Keys in their plane (stars: optimal tokens, one colour per input) with the attention that ``θ`` gives.

    Each token gets a ring of area ``ring_area·σ_it(θ)``; a black arrow shows ``θ/‖θ‖`` and, if given,
    a dashed line the SVM direction ``θ_mm``. ``prob.A`` (n, T, ≥2): its first two coordinates are drawn.
    """
    keys = prob.A.reshape(prob.n, prob.T, -1)[..., :2]
    for i in range(prob.n):  # as :func:`tokens`, two scatters per input (cheaper to redraw)
        c = SAMPLE_COLORS[i % len(SAMPLE_COLORS)] if prob.n > 1 else "k"
        opt = np.arange(prob.T) == prob.opt[i]
        ax.scatter(*keys[i, ~opt].T, s=25, color=c, edgecolor="k", lw=0.5, zorder=5)
        ax.scatter(*keys[i, opt].T, s=160, marker="*", color=c, edgecolor="k", lw=0.5, zorder=5)
    weights = np.exp(prob.log_attention(np.asarray(theta, float)))
    ax.scatter(*keys.reshape(-1, 2).T, s=ring_area * weights.ravel(), facecolors="none", edgecolors="k", lw=1.2)
    d = np.asarray(theta, float).ravel()[:2] / np.linalg.norm(theta)
    ax.annotate("", xy=1.4 * d, xytext=(0, 0), arrowprops=dict(arrowstyle="-|>", color="k", lw=2))
    if theta_mm is not None:
        direction(ax, theta_mm, length=1.9)
    ax.set_aspect("equal")
    return ax


#: Colours of the two matrix geometries, the same in every panel: the ``W`` path with the Frobenius W-SVM,
#: the ``(K, Q)`` path with the nuclear-norm SVM.
NORM_COLORS = {"fro": "tab:blue", "nuc": "tab:orange"}


def margin_deficits_and_spectra(mat, figsize=(10, 4)):
    """Two panels for a :class:`attnlib.experiments.regularization_path.MatrixPaths`: margin deficits
    against ``R``, and singular values.

    Left: :func:`margin_deficit` of the ``W`` path (Frobenius) and of the ``(K, Q)`` path (nuclear).
    Right: :func:`singular_value_spectra` of both SVMs (markers ``o``, ``s``) and both paths at the
    largest radius (``x``, ``+``). Each geometry keeps its colour (:data:`NORM_COLORS`) in both panels.
    Returns the Figure.
    """
    import matplotlib.pyplot as plt

    fro, nuc = NORM_COLORS["fro"], NORM_COLORS["nuc"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=figsize, layout="constrained")  # laid out when drawn
    radii = mat.w.radii
    margin_deficit(ax1, radii, mat.rho_w, mat.lo_fro, mat.nuc_in_fro, fro, "W path, Frobenius")
    margin_deficit(ax1, radii, mat.rho_kq, mat.lo_nuc, mat.fro_in_nuc, nuc, "KQ path, nuclear")
    ax1.legend()
    spectra = {
        "Frobenius W-SVM": (mat.fro, fro, "o"),
        f"W path, R={radii[-1]:g}": (mat.w.theta[-1], fro, "x"),
        "nuclear-norm SVM": (mat.nuc, nuc, "s"),
        f"KQ path, R={radii[-1]:g}": (mat.kq.theta[-1], nuc, "+"),
    }
    singular_value_spectra(ax2, spectra, threshold=1e-6)
    ax2.legend()
    return fig
