"""What several chapters draw: colours, tokens and paths in the key plane, directions, seed bands,
the table of selections.

Functions draw on a given matplotlib ``Axes`` and return it, so a notebook composes panels.
"""

from __future__ import annotations

import numpy as np

from ..model import TokenSelectionProblem

__all__ = [
    "selection_table",
    "COLORS",
    "SAMPLE_COLORS",
    "paths",
    "tokens",
    "direction",
    "band",
    "BASIN_COLORS",
    "basin_image",
    "basin_maps_panels",
]


def selection_table(prob: TokenSelectionProblem, reports, dims: int = 2) -> str:
    """Markdown table of every selection of a one-input problem: its key, score, SVM and neighbours.

    One row per :class:`~attnlib.svm.SelectionReport` (e.g. from
    :func:`~attnlib.svm.enumerate_selections`): token (numbered from 1, as in [MMTS]), its feature
    ``A_1t`` (first ``dims`` coordinates: the key plane of the paper's figures), its score
    ``γ_1t``, the SVM ``θ_mm(α)`` (or "infeasible"), its SVM-neighbours with their scores, and
    whether the selection is locally optimal.

    >>> import attnlib as al
    >>> prob = al.datasets.single_input(local=True)
    >>> print(selection_table(prob, al.enumerate_selections(prob)).splitlines()[3])
    | 2 | (1, 0) | 0.9 | (1.000, 0.000) | 3 (0) | **yes** |
    """
    if prob.n != 1:
        raise ValueError(f"selection_table lists the selections of one input, got n = {prob.n}")
    A = np.asarray(prob.A).reshape(prob.n, prob.T, -1)
    rows = [
        "| α (token) | key | score | $\\pmm(\\alpha)$ | SVM-neighbours (score) | locally optimal |",
        "|---|---|---|---|---|---|",
    ]
    for r in reports:
        t = int(r.select[0])
        key = "(" + ", ".join(f"{x:g}" for x in A[0, t, :dims]) + ")"
        score = f"{prob.gamma[0, t]:g}"
        if not r.feasible:
            rows.append(f"| {t + 1} | {key} | {score} | infeasible | – | no |")
            continue
        theta = np.asarray(r.solution.theta).ravel()[:dims]
        nbs = ", ".join(f"{j + 1} ({prob.gamma[0, j]:g})" for j in np.flatnonzero(r.solution.neighbors[0]))
        svm = "(" + ", ".join(f"{x:.3f}" for x in theta) + ")"
        rows.append(f"| {t + 1} | {key} | {score} | {svm} | {nbs} | {'**yes**' if r.locally_optimal else 'no'} |")
    return "\n".join(rows)


#: Colours used across the book: global SVM red, local/secondary blue, paths grey.
COLORS = {"global": "tab:red", "local": "tab:blue", "path": "0.45", "p": "tab:red", "v": "tab:blue"}


#: One colour per sample (cycled), as :func:`tokens` draws them when ``n > 1``.
SAMPLE_COLORS = ["tab:red", "tab:green", "tab:purple", "tab:orange", "tab:brown", "tab:pink", "tab:cyan"]


def paths(ax, theta, color=None, arrow_every: int = 10, label=None, alpha: float = 0.9, lw: float = 1.4):
    """Draw trajectories ``theta`` (R, B, ≥2) in the plane of their first two coordinates.

    Arrows every ``arrow_every`` recorded steps show the direction of travel: bare arrow patches,
    the pixels of ``ax.annotate("", xy, xytext, arrowprops=...)`` (whose arrow is scaled by the
    font size) without an empty text artist per arrow to lay out. Unlike an annotation, an arrow
    whose head lies outside the axes is clipped there rather than left out.
    """
    from matplotlib import rcParams
    from matplotlib.patches import FancyArrowPatch

    theta = np.asarray(theta, float)
    if theta.ndim != 3 or theta.shape[2] < 2:
        raise ValueError(f"theta must have shape (R, B, d>=2), got {theta.shape}")
    color = COLORS["path"] if color is None else color
    for b in range(theta.shape[1]):
        xy = theta[:, b, :2]
        ax.plot(xy[:, 0], xy[:, 1], color=color, lw=lw, alpha=alpha, label=label if b == 0 else None)
        for r in range(arrow_every, len(xy), arrow_every):
            arrow = FancyArrowPatch(
                xy[r - 1],
                xy[r],
                arrowstyle="->",
                color=color,
                lw=lw,
                alpha=alpha,
                mutation_scale=rcParams["font.size"],
                zorder=3,
            )
            ax.add_artist(arrow)  # not add_patch: an arrow does not move the data limits (nor did the annotation)
    return ax


def tokens(ax, prob: TokenSelectionProblem, select=None, annotate_scores: bool = True, size: float = 90):
    """Draw each sample's keys (first two feature coordinates): stars for the selected tokens.

    ``select`` defaults to the optimal tokens; one colour per sample, scores written beside.
    One scatter per marker (stars, circles) rather than one per token: the same points, a few
    artists instead of n·T (each scatter costs a marker path and a collection to lay out and draw).
    """
    sel = prob.opt if select is None else np.asarray(select)
    keys = prob.A.reshape(prob.n, prob.T, -1)[..., :2]
    cmap = SAMPLE_COLORS
    colors = [cmap[i % len(cmap)] if prob.n > 1 else "k" for i in range(prob.n)]
    chosen = np.arange(prob.T)[None, :] == np.asarray(sel)[:, None]  # (n, T): the stars
    for marker, where, scale in (("o", ~chosen, 0.6), ("*", chosen, 2)):
        i, t = np.nonzero(where)
        if i.size:
            ax.scatter(
                keys[i, t, 0],
                keys[i, t, 1],
                marker=marker,
                s=size * scale,
                color=[colors[k] for k in i],
                zorder=5,
                edgecolor="k",
                linewidth=0.5,
            )
    if annotate_scores:
        for i in range(prob.n):
            for t in range(prob.T):
                ax.annotate(
                    f"{prob.gamma[i, t]:.3g}",
                    keys[i, t],
                    textcoords="offset points",
                    xytext=(6, 6),
                    color=colors[i],
                )
    return ax


def direction(ax, theta, length: float, color=None, label=None, ls="--", lw: float = 2.0):
    """Draw the ray from the origin along the first two coordinates of ``theta``."""
    v = np.asarray(theta, float).ravel()[:2]
    v = v / np.linalg.norm(v)
    ax.plot(
        [0, length * v[0]],
        [0, length * v[1]],
        ls=ls,
        color=COLORS["global"] if color is None else color,
        lw=lw,
        label=label,
    )
    return ax


def band(ax, x, Y, color=None, label=None, quantiles=(0.1, 0.9), log: bool = True):
    """Median over the last axis of ``Y`` (R, S) against ``x`` (R,), with a quantile band."""
    Y = np.asarray(Y, float)
    lo, mid, hi = np.nanquantile(Y, [quantiles[0], 0.5, quantiles[1]], axis=-1)
    line = ax.plot(x, mid, color=color, label=label)[0]
    ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, lw=0)
    if log:
        ax.set_yscale("log")
    return ax


def _plain_log_axes(ax):
    """Few major ticks and no minor ones on a log-log panel: much cheaper to render."""
    from matplotlib.ticker import LogLocator, NullLocator

    ax.yaxis.set_major_locator(LogLocator(numticks=5))
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_minor_locator(NullLocator())


#: Colours of :func:`basin_image`: global basin, local basin(s), undecided within the horizon.
BASIN_COLORS = {"global": "#f4a6a6", "local": "#a6c8f4", "undecided": "k"}


def basin_image(ax, kind, extent, legend: bool = True, undecided_size: float = 6.0):
    """Draw a basin map: ``kind`` (G_y, G_x) with 0 global, 1 local, −1 undecided.

    Rows of ``kind`` run along the second coordinate (``kind[j, i]`` is the initialisation
    ``(x_i, y_j)``); ``extent = (x_min, x_max, y_min, y_max)`` are the grid's end points. The two
    basins are filled (global red, local blue, the colours of :data:`COLORS`); undecided
    initialisations are drawn as black dots on top, so that even a single one is visible.
    """
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    kind = np.asarray(kind)
    if kind.ndim != 2:
        raise ValueError(f"kind must be a 2-D grid of labels, got shape {kind.shape}")
    x0, x1, y0, y1 = extent
    gy, gx = kind.shape
    dx = (x1 - x0) / max(gx - 1, 1) / 2
    dy = (y1 - y0) / max(gy - 1, 1) / 2
    cmap = ListedColormap([BASIN_COLORS["global"], BASIN_COLORS["local"]])
    ax.imshow(
        np.where(kind == 1, 1, 0),
        origin="lower",
        extent=(x0 - dx, x1 + dx, y0 - dy, y1 + dy),
        cmap=cmap,
        vmin=0,
        vmax=1,
        interpolation="nearest",
        aspect="auto",
    )
    jj, ii = np.nonzero(kind < 0)
    if jj.size:
        xs = np.linspace(x0, x1, gx)[ii]
        ys = np.linspace(y0, y1, gy)[jj]
        ax.scatter(xs, ys, s=undecided_size, color=BASIN_COLORS["undecided"], zorder=4)
    if legend:
        handles = [
            Patch(color=BASIN_COLORS["global"], label="→ global p_mm*"),
            Patch(color=BASIN_COLORS["local"], label="→ local p_mm(α)"),
            Patch(color=BASIN_COLORS["undecided"], label=f"undecided ({jj.size})"),
        ]
        ax.legend(handles=handles, loc="upper right", framealpha=0.9)
    return ax


def basin_maps_panels(axes, maps: dict, lo: float, hi: float, prob: TokenSelectionProblem, inits=None, tie_dir=None):
    """One basin map per axes: ``maps`` ``{name: BasinMap}`` over a square key-plane grid from ``lo`` to ``hi``.

    Draws :func:`basin_image`, the tokens, the initialisations ``inits`` (B, ≥2) as crosses and the
    direction ``tie_dir`` dotted; the title gives each map's global and local fractions.
    """
    for ax, (name, m) in zip(axes, maps.items()):
        size = int(round(np.sqrt(m.labels.size)))
        basin_image(ax, m.kind().reshape(size, size), (lo, hi, lo, hi))
        tokens(ax, prob, annotate_scores=False, size=50)
        if inits is not None:
            ax.scatter(*np.asarray(inits)[:, :2].T, marker="x", color="k", s=25, label="official inits")
        if tie_dir is not None:
            direction(ax, tie_dir, 20, color="k", ls=":", lw=1, label="tie of tokens 1, 3")
        f = m.fractions()
        ax.set(xlim=(lo, hi), ylim=(lo, hi), xlabel="$p_1(0)$", ylabel="$p_2(0)$")
        ax.set_title(f"{name.upper()}: global {f['global']:.3f}, local {f['local']:.3f}")
    return axes
