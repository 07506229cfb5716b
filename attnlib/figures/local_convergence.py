"""Chapter 3 (local convergence): its figures.

Functions draw on a given matplotlib ``Axes`` (or make a figure) and return it; what several
chapters draw is :mod:`attnlib.figures.common`.
"""

from __future__ import annotations

import numpy as np
from matplotlib import colormaps
from matplotlib.colors import ListedColormap

from ..basins import MOTION_TOL, basin_map, key_plane_grid
from ..datasets import single_input
from ..model import TokenSelectionProblem, stack_problems
from ..optim import train
from .common import BASIN_COLORS, COLORS, basin_image, basin_maps_panels, direction, paths, tokens

plt_colormap = colormaps["viridis"]  # one colour per step size, dark (small) to light (large)

__all__ = [
    "ScoreBasinExplorer",
    "BASIN_COLORS",
    "basin_image",
    "paths_to_two_directions",
    "cone_run_curves",
    "basin_maps_panels",
    "basin_explorer_frame",
    "selection_alignment_curves",
    "local_path_curves",
    "SVMEQ_COLORS",
    "svm_equivalence_panels",
    "step_size_panels",
]


class ScoreBasinExplorer:
    """The explorer of [MMTS] Fig. 1's basins as the third token's score varies, with one NGD path.

    ``draw(score, start, lr, steps)`` returns a figure (for :func:`attnlib.book.widgets.explorer`):
    the basin map of ``datasets.single_input(third_score=score)`` over a ``size × size`` key-plane
    grid (:func:`basin_map`, NGD, ``map_steps`` at ``map_lr``, tolerance ``tol``), and the NGD path
    from ``start`` (``steps`` at ``lr``). Maps and paths are cached; :meth:`precompute` computes the
    maps of several scores and their paths from one start in few batches (the static book's slider).

    Args:
        lo, hi, size: the grid (:func:`key_plane_grid`).  map_steps, map_lr, tol: the maps' optimizer.
        shared: ``{score: BasinMap}`` already computed (NGD, the same ``map_steps``, ``map_lr``,
            ``tol``) on a finer grid of the same ``lo, hi``. When its size ``G`` has
            ``(G − 1) % (size − 1) == 0`` the sub-grid is used (labels before any extension: what
            :func:`basin_map` gives without one) instead of computing again; otherwise it is ignored.

    >>> import attnlib as al
    >>> ex = ScoreBasinExplorer(-4.0, 8.0, 5, map_steps=40, map_lr=0.5)
    >>> ex.precompute([0.9, 0.0], (6.0, -3.0), 0.1, 50)
    >>> sorted(ex.maps), ex.paths[(0.0, (6.0, -3.0), 0.1, 50)].shape
    ([0.0, 0.9], (51, 2))
    """

    def __init__(self, lo, hi, size, map_steps, map_lr, tol=MOTION_TOL, shared=None):
        self.lo, self.hi, self.size = float(lo), float(hi), int(size)
        self.map_steps, self.map_lr, self.tol = int(map_steps), float(map_lr), float(tol)
        self.grid = key_plane_grid(lo, hi, size)
        self.maps = {}  # score -> (size, size) kind
        self.fractions = {}  # score -> fraction of starts in the local basin(s)
        self.paths = {}  # (score, start, lr, steps) -> (steps + 1, 2)
        self._fig = None
        for score, m in (shared or {}).items():
            G = int(round(np.sqrt(m.labels.size)))
            if G * G != m.labels.size or (G - 1) % (self.size - 1):
                continue  # no sub-grid of this size: computed when needed
            k = (G - 1) // (self.size - 1)
            kind = np.where(m.extended, -1, m.kind()).reshape(G, G)[::k, ::k]  # before the extension
            self.maps[float(score)] = kind
            self.fractions[float(score)] = float(np.mean(kind == 1))

    @staticmethod
    def problem(score):

        return single_input(third_score=float(score))

    def _map(self, score):
        s = float(score)
        if s not in self.maps:
            m = basin_map(self.problem(s), self.grid, self.map_steps, "ngd", self.map_lr, tol=self.tol)
            self.maps[s] = m.kind().reshape(self.size, self.size)
            self.fractions[s] = m.fractions()["local"]
        return self.maps[s]

    def precompute(self, scores, start, lr, steps):
        """Compute the maps of ``scores`` and their paths from ``start``: all paths as one stacked batch."""

        scores, start = [float(s) for s in scores], tuple(float(x) for x in start)
        for s in scores:
            self._map(s)
        todo = [s for s in scores if (s, start, float(lr), int(steps)) not in self.paths]
        if todo:
            theta0 = np.array([start[0], start[1], 0.0])
            traj = train(stack_problems([self.problem(s) for s in todo]), theta0, int(steps), "ngd", lr)
            for j, s in enumerate(todo):
                self.paths[(s, start, float(lr), int(steps))] = traj.theta[:, j, :2]

    def draw(self, score, start=(6.0, -3.0), lr=0.1, steps=1000):
        """One explorer picture (the figure is reused from call to call)."""
        import matplotlib.pyplot as plt

        s, start = float(score), tuple(float(x) for x in start)
        kind = self._map(s)
        key = (s, start, float(lr), int(steps))
        if key not in self.paths:
            self.precompute([s], start, lr, steps)
        if self._fig is None:
            self._fig = plt.figure(figsize=(4.6, 4.2))
            self._fig.add_subplot()
        ax = self._fig.axes[0]
        for artist in [*ax.images, *ax.collections, *ax.lines, *ax.texts]:
            artist.remove()  # keep the axes and their ticks: clearing them costs more than the picture
        if ax.get_legend() is not None:
            ax.get_legend().remove()
        title = f"score of (0,0): {s:.2f}  local {self.fractions[s]:.2f}"
        basin_explorer_frame(ax, kind, (self.lo, self.hi), self.problem(s), self.paths[key], title)
        return self._fig


def paths_to_two_directions(
    ax, prob: TokenSelectionProblem, theta, global_dir, local_dir, local_label: str, local_ls="--", limits=None
):
    """Trajectories ``theta`` (R, B, ≥2) with the tokens, the global SVM direction and a local one.

    The global direction is drawn in ``COLORS["global"]`` (labelled "global p_mm*"), the local one in
    ``COLORS["local"]`` with ``local_label`` and line style ``local_ls`` (e.g. dotted when it is not a
    limit of anything). ``limits = (x0, x1, y0, y1)`` sets the axes (default: ``(-4, 12, -3, 10)``,
    the window of [MMTS] Fig. 1).
    """
    paths(ax, theta, arrow_every=40)
    tokens(ax, prob)
    direction(ax, global_dir, 14, color=COLORS["global"], label="global p_mm*")
    direction(ax, local_dir, 14, color=COLORS["local"], label=local_label, ls=local_ls)
    x0, x1, y0, y1 = (-4, 12, -3, 10) if limits is None else limits
    ax.set(xlim=(x0, x1), ylim=(y0, y1), xlabel="$p_1$", ylabel="$p_2$")
    ax.legend(loc="upper right")
    return ax


def cone_run_curves(axes, runs, colors: dict):
    """Two panels of cone initialisations (an :class:`attnlib.experiments.local_convergence.ConeRuns`).

    ``axes[0]``: NGD ``(1 − cos(θ(t), θ_mm(α)))/μ`` per run, with the cone's edge at 1;
    ``axes[1]``: ``‖θ(t)‖/‖θ(0)‖`` for NGD (solid) and GD (dotted). One colour per cone,
    ``colors[key]`` for the runs whose ``owner`` is ``key``.
    """
    x = np.maximum(runs.steps, 1)
    for key in runs.directions:
        for j, b in enumerate(np.flatnonzero(runs.owner == key)):
            label = f"start in the cone of α={key}" if j == 0 else None
            kw = dict(color=colors[key], lw=1, alpha=0.8, label=label)
            axes[0].plot(x, np.maximum(runs.omc[:, b] / runs.mu, 1e-9), **kw)
            axes[1].plot(x, runs.ngd.norm[:, b] / runs.ngd.norm[0, b], **kw)
            axes[1].plot(x, runs.gd.norm[:, b] / runs.ngd.norm[0, b], color=colors[key], lw=1, ls=":")
    axes[0].axhline(1.0, color="k", ls="--", lw=1, label="cone edge")
    axes[0].set(xscale="log", yscale="log", xlabel="iteration", ylabel="(1 − cos(p(t), p_mm(α))) / μ")
    axes[0].set_title("(a) NGD: distance to the cone's direction")
    axes[1].plot([], [], color="k", ls=":", label="GD (all cones)")
    axes[1].set(xscale="log", yscale="log", xlabel="iteration", ylabel="‖p(t)‖ / ‖p(0)‖")
    axes[1].set_title("(b) norm: NGD (solid) and GD (dotted)")
    for ax in axes:
        ax.legend()
    return axes


def basin_explorer_frame(ax, kind, limits, prob: TokenSelectionProblem, path, title: str = ""):
    """One picture of the basin explorer: a basin map ``kind`` (G, G) over the square ``limits = (lo, hi)``,
    the tokens of ``prob``, and a path (R, 2) from its start (a black dot)."""
    lo, hi = limits
    basin_image(ax, kind, (lo, hi, lo, hi))
    tokens(ax, prob, size=40)
    path = np.asarray(path, float)
    ax.plot(path[:, 0], path[:, 1], color="k", lw=1.2)
    ax.plot(*path[0, :2], "ko", ms=5)
    ax.set(xlim=(lo, hi), ylim=(lo, hi), xlabel="p₁(0)", ylabel="p₂(0)")  # no mathtext: redrawn per position
    ax.set_title(title)
    return ax


def selection_alignment_curves(axes, steps, alignment):
    """Two panels of an :class:`attnlib.experiments.local_convergence.SelectionAlignment` against ``steps`` (R,).

    ``axes[0]``: mean attention on ``α̂`` (mean ± std over problems); ``axes[1]``: correlation of
    ``θ(t)`` with ``θ_mm(α̂)`` (``COLORS["local"]``) and with ``θ_mm(opt)`` (``COLORS["global"]``).
    The first recorded step is skipped when it is step 0 (``W(0) = 0`` has no direction).
    """
    first = 1 if steps[0] == 0 else 0
    x = np.asarray(steps)[first:]
    mass = alignment.mass[first:]
    mean, sd = mass.mean(axis=1), mass.std(axis=1)
    axes[0].plot(x, mean, color="k")
    axes[0].fill_between(x, mean - sd, np.minimum(mean + sd, 1), color="k", alpha=0.15)
    axes[0].set(xscale="log", xlabel="iteration", ylabel="mean attention on α̂", ylim=(0, 1.05), title="(a) selection")
    for key, color, label in (
        ("alpha_hat", COLORS["local"], "corr(W(t), W_mm(α̂))"),
        ("opt", COLORS["global"], "corr(W(t), W_mm(opt))"),
    ):
        corr = alignment.corr[key][first:]
        mean, sd = np.nanmean(corr, axis=1), np.nanstd(corr, axis=1)
        axes[1].plot(x, mean, color=color, label=label)
        axes[1].fill_between(x, mean - sd, np.minimum(mean + sd, 1), color=color, alpha=0.2)
    n_off, S = int((~alignment.is_opt).sum()), alignment.is_opt.size
    axes[1].set(xscale="log", xlabel="iteration", ylabel="correlation (mean ± std over seeds)", ylim=(0, 1.05))
    axes[1].set_title(f"(b) {n_off} of {S} seeds end with α̂ ≠ opt")
    axes[1].legend(loc="lower right")
    return axes


def local_path_curves(axes, cases):
    """Local regularization paths (``[(name, LocalPathCase)]``, from
    :func:`attnlib.experiments.local_convergence.local_path_case`).

    ``axes[0]``, locally optimal: ``1 − cos(θ̄_α(R), θ_mm(α))`` (solid), its bound (dashed), the cone's
    ``μ`` (dotted), one colour per case. ``axes[1]``, the others: ``(1 − cos)/μ`` (solid when every
    SVM-neighbour scores higher, dotted when mixed) and ``‖θ̄‖/R`` (grey).
    """
    j = 0
    for name, c in cases:
        label = f"{name}, α={tuple(a + 1 for a in c.select)}"
        if c.locally_optimal:
            color = f"C{j}"
            j += 1
            axes[0].plot(c.radii, np.maximum(c.omc, 1e-18), color=color, label=label)
            axes[0].plot(c.radii, np.where(np.isfinite(c.bound), c.bound, np.nan), color=color, ls="--", lw=1)
            axes[0].axhline(c.mu, color=color, ls=":", lw=1)
        else:
            style = "-" if c.all_higher else ":"
            label += "" if c.all_higher else " (mixed)"
            axes[1].plot(c.radii, np.nan_to_num(c.omc / c.mu, nan=1.0), ls=style, label=label)
            axes[1].plot(c.radii, c.path.norm / c.radii, ls=style, color="grey", lw=0.8)
    axes[0].set(xscale="log", yscale="log", xlabel="R", ylabel="1 − cos(p̄_α(R), p_mm(α))")
    axes[0].set_title("(a) locally optimal: path (solid), bound (dashed), cone μ (dotted)")
    axes[1].set(xscale="log", xlabel="R", ylabel="(1 − cos)/μ (colour), ‖p̄‖/R (grey)")
    axes[1].set_title("(b) not locally optimal")
    for ax in axes:
        ax.legend()
    return axes


#: One colour per width of [TFSVM]'s ReLU-head experiment (the official figure's order).
SVMEQ_COLORS = ("tab:blue", "tab:green", "tab:red", "tab:cyan")
SVMEQ_STYLES = {
    "svmeq": ("-", r"$W^{\mathrm{SVMeq}}$"),
    "mm": (":", r"$W^{\mathrm{mm}}$"),
    "one_token": ("--", r"$W^{\mathrm{1token}}$"),
}


def svm_equivalence_panels(axes, runs, well_masked: float, mixture=None):
    """[TFSVM] ``multi_token_converge``'s two panels, and a mixture that beats both its tokens.

    (a) geometric mean over the accepted runs of each width of ``1 − corr(W(t), ·)`` for ``W^SVMeq``,
    ``W_mm`` (= ``W_dir``) and the one-token SVM; (b) the largest masked softmax of each run against
    its final ``1 − corr(W, W^SVMeq)`` (filled: a run with a mixture; the line: ``well_masked``);
    (c) if ``mixture = (f, weights, label)`` is given, the head output ``f`` along the edge between
    two tokens of a ``y = −1`` sample, with the trained attention's weight marked.
    """
    ax_a, ax_b = axes[0], axes[1]
    for color, d in zip(SVMEQ_COLORS, runs.d_values):
        mine = runs.d == d
        if not mine.any():
            continue
        for name, (style, label) in SVMEQ_STYLES.items():
            curve = np.exp(np.log(np.maximum(runs.one_minus_corr[name][mine], 1e-300)).mean(axis=0))
            ax_a.plot(runs.steps, curve, style, color=color, label=f"{label}, d = {d}" if name == "svmeq" else None)
        mixed = (runs.selected[mine].sum(-1) >= 2).any(-1)
        final = runs.one_minus_corr["svmeq"][mine, -1]
        ax_b.scatter(runs.masked_max[mine][mixed], final[mixed], color=color, s=18, label=f"d = {d}")
        ax_b.scatter(runs.masked_max[mine][~mixed], final[~mixed], facecolors="none", edgecolors=color, s=18)
    for style, label in SVMEQ_STYLES.values():
        ax_a.plot([], [], style, color="0.3", label=label)
    ax_a.set(
        yscale="log",
        xlabel="NGD iteration",
        ylabel="1 − corr(W(t), reference)",
        title="(a) distance to the three references",
    )
    ax_a.legend(ncol=2)
    ax_b.axvline(well_masked, color="0.5", lw=0.8)
    ax_b.set(
        xscale="log",
        yscale="log",
        xlabel="largest masked softmax of the run",
        ylabel=r"final 1 − corr(W, $W^{\mathrm{SVMeq}}$)",
        title="(b) masking and the SVM equivalence",
    )
    ax_b.legend()
    for ax, axis in ((ax_a, "y"), (ax_b, "both")):  # few log tick labels: their mathtext is most of the cost
        ax.locator_params(axis=axis, numticks=5)
        ax.minorticks_off()
    if mixture is not None and len(axes) > 2:
        f, weights, label = mixture
        lam = np.linspace(0.0, 1.0, len(f))
        axes[2].plot(lam, f, color=COLORS["global"])
        axes[2].axvline(weights, color=COLORS["local"], lw=1, label="trained attention")
        axes[2].set(
            xlabel="weight on the second token",
            ylabel="head output f (label −1: lower is better)",
            title=f"(c) {label}",
        )
        axes[2].legend()
    return axes


def step_size_panels(axes, result, start_labels, global_select: int = 0):
    """The step-size experiment (a :class:`attnlib.experiments.local_convergence.StepSizeBasins`).

    ``axes[0]``: GD's loss, averaged over the starts, against the step (from 1), one line per ``η·L``;
    ``axes[1]``: the basin each start ends in (columns, named by ``start_labels``) per method
    (rows: gradient flow, GD at each ``η·L``, NGD), red the global direction (first input's
    token ``global_select``), blue another; the number is the token (from 1).
    """
    steps = np.arange(1, result.loss.shape[1])  # from step 1: the log axis has no step 0
    shades = plt_colormap(np.linspace(0.0, 0.85, result.products.size))
    for c, loss, shade in zip(result.products, result.loss, shades):
        axes[0].plot(steps, loss[1:].mean(axis=-1), color=shade, label=f"ηL = {c:g}")
    axes[0].set(xscale="log", xlabel="GD step", ylabel="loss (mean over the starts)")
    axes[0].set_title("(a) GD's loss at each step size")
    axes[0].legend(loc="best")
    rows = [result.flow] + list(result.gd) + [result.ngd]
    names = ["gradient flow"] + [f"GD, ηL = {c:g}" for c in result.products] + ["NGD"]
    token = np.stack([r[:, 0] for r in rows])  # (methods, B): the first input's token
    cmap = ListedColormap([BASIN_COLORS["global"], BASIN_COLORS["local"]])
    axes[1].imshow((token != global_select).astype(float), cmap=cmap, vmin=0, vmax=1, aspect="auto")
    for (i, j), t in np.ndenumerate(token):
        axes[1].text(j, i, str(t + 1), ha="center", va="center", fontsize=11)
    axes[1].set_xticks(range(token.shape[1]), list(start_labels))
    axes[1].set_yticks(range(len(names)), names)
    axes[1].set(xlabel="start: second coordinate of p(0)")
    axes[1].grid(False)
    axes[1].set_title("(b) the token each start ends on")
    return axes
