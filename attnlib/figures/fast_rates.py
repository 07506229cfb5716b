"""Chapter 5 (fast rates): its figures.

Functions draw on a given matplotlib ``Axes`` (or make a figure) and return it; what several
chapters draw is :mod:`attnlib.figures.common`.
"""

from __future__ import annotations

import numpy as np

from .common import COLORS, band

__all__ = [
    "METHOD_COLORS",
    "finish",
    "method_bands",
    "rate_panels",
    "separators",
    "fit_residuals",
    "running_slope",
    "selection_fractions",
    "polyak_failure",
    "rates_overview",
]


# ------------------------------------------------------- GD, NGD and Polyak compared (fast rates)
#: One colour per optimizer, the same in every panel: GD grey, NGD red, Polyak blue.
METHOD_COLORS = {"gd": "tab:gray", "ngd": "tab:red", "polyak": "tab:blue"}


def finish(fig):
    """Minor ticks off (on log axes they are most of the cost of drawing, and add little), then a
    tight layout. Returns ``fig``."""
    for ax in fig.axes:
        ax.minorticks_off()
    fig.tight_layout()
    return fig


def method_bands(
    ax, runs, values, labels=None, members=None, upto=None, clock=False, transform=None, log=True, colors=None
):
    """One median band (10–90%) per optimizer against its iterations, on a log iteration axis.

    ``runs``: ``{method: Trajectory}``; ``values``: ``{method: (R_m, S)}`` on each run's records (e.g.
    ``curves[m]["direction_error"]``). Record 0 (``t = 0``) is left out. ``members``: the columns kept;
    ``upto``: the last step drawn; ``clock``: against the batch's wall-clock ``seconds`` instead;
    ``transform``: applied to the values first; ``log``: log value axis, non-positive values dropped.
    Colours: :data:`METHOD_COLORS` unless ``colors``.
    """
    colors = colors or METHOD_COLORS
    for m, run in runs.items():
        keep = run.steps <= (run.steps[-1] if upto is None else upto)
        keep[0] = False
        Y = np.asarray(values[m], float)[keep]
        Y = Y[:, members] if members is not None else Y
        Y = transform(Y) if transform is not None else Y
        if log:
            Y = np.where(Y > 0, Y, np.nan)
        x = (run.seconds if clock else run.steps)[keep]
        band(ax, x, Y, color=colors.get(m), label=labels.get(m) if labels else None, log=log)
    ax.set_xscale("log")
    return ax


def rate_panels(comparison, members, labels, wmm_norm, ngd_lr: float):
    """The six rate curves of GD, NGD and Polyak (a :class:`attnlib.experiments.fast_rates.Comparison`): direction
    error, ``1 − corr``, margin gap, ``−log10`` of the attention off the optimal tokens and of the
    loss gap, and the norm with ``‖W_mm‖ log t + c`` (GD) and ``η t`` (NGD). ``members``: the columns
    drawn; ``wmm_norm``: (S,) ``‖W_mm‖``. Returns a Figure (2 × 3)."""
    import matplotlib.pyplot as plt

    runs, cur = comparison.runs, comparison.curves
    fig, axes = plt.subplots(2, 3, figsize=(13, 7.6))
    minus_log10 = lambda y: -y / np.log(10)  # noqa: E731
    panels = (
        ("direction_error", r"$\|W_t/\|W_t\| - W^{mm}/\|W^{mm}\|\|$", "(a) direction error", None),
        ("one_minus_corr", r"$1 - \mathrm{corr}(W_t, W^{mm})$", "(b) one minus correlation", None),
        ("margin_gap", r"$1/\|W^{mm}\| - \gamma(W_t)$", "(c) margin gap (where positive)", None),
        (
            "log_mass",
            r"$-\log_{10} \max_i (1 - \sigma_{i,\mathrm{opt}})$",
            "(d) attention off the optimal tokens",
            minus_log10,
        ),
        ("log_gap", r"$-\log_{10}(\mathcal{L} - \mathcal{L}_\star)$", "(e) loss gap", minus_log10),
        ("norm", r"$\|W_t\|$", "(f) norm", None),
    )
    for ax, (key, ylabel, title, transform) in zip(axes.flat, panels):
        method_bands(ax, runs, {m: cur[m][key] for m in runs}, labels, members, transform=transform)
        ax.set(xlabel="iteration $t$", ylabel=ylabel, title=title)
    gd_t = runs["gd"].steps[runs["gd"].steps >= 3]
    wmm = np.nanmedian(np.asarray(wmm_norm)[members])
    offset = np.median(runs["gd"].norm[-1, members]) - wmm * np.log(gd_t[-1])  # the O(1) term, read off at the end
    axes[1, 2].plot(gd_t, wmm * np.log(gd_t) + offset, "k:", label=r"$\|W^{mm}\| \log t + c$")
    t_ngd = runs["ngd"].steps[1:]
    axes[1, 2].plot(t_ngd, ngd_lr * t_ngd, "k--", lw=1, label=r"$\eta t$")
    axes[0, 0].legend(loc="lower left")
    axes[1, 2].legend(loc="upper left")
    return finish(fig)


def separators(ax, X, y, directions, reference, labels=None, extent: float = 1.3):
    """Labelled points in the plane (``X`` (n, 2), ``y`` ±1: red +, blue −) and the separators through
    0 of linear classifiers: ``directions`` (k, 2) in grey shades darkening with the index (labels
    ``labels``), ``reference`` (2,) dashed black (the max-margin separator)."""
    X, y = np.asarray(X, float), np.asarray(y)
    ax.scatter(*X[y > 0].T, marker="+", color="tab:red", s=60, label="$y = +1$")
    ax.scatter(*X[y < 0].T, marker="_", color="tab:blue", s=60, label="$y = -1$")
    shades = np.linspace(0.8, 0.3, len(directions))
    for k, w in enumerate(np.asarray(directions, float)):
        w = w / np.linalg.norm(w)
        label = labels[k] if labels is not None else None
        ax.plot(
            [-extent * w[1], extent * w[1]], [extent * w[0], -extent * w[0]], color=str(shades[k]), lw=1.5, label=label
        )
    w = np.asarray(reference, float) / np.linalg.norm(reference)
    ax.plot([-extent * w[1], extent * w[1]], [extent * w[0], -extent * w[0]], "k--", lw=2, label="max-margin separator")
    ax.set_aspect("equal")
    return ax


def fit_residuals(ax, t, fits):
    """The residuals (in ``log err``) of the two fits of each :class:`attnlib.fits.ShapeFit` of ``fits``
    against ``t`` (R,): the best power law in orange, ``1/(a + b log t)`` in black."""
    for f in fits:
        ax.plot(t, f.residual_power, color="tab:orange", lw=0.8, alpha=0.6)
        ax.plot(t, f.residual_inverse_log, color="k", lw=0.8, alpha=0.6)
    ax.plot([], [], color="tab:orange", label=r"best power law $c\,t^{-p}$")
    ax.plot([], [], color="k", label=r"$1/(a + b \log t)$")
    ax.axhline(0, color="0.5", lw=0.8)
    ax.set(xscale="log", xlabel="iteration $t$", ylabel="residual in log(direction error)")
    return ax


def running_slope(ax, ends, slopes, tolerance: float, color=None, label=None):
    """Slopes (len(ends), S) against the ends of their windows, median and 10–90% band (linear axis),
    with the target 1 and the band ``1 ± tolerance`` shaded."""
    band(ax, ends, slopes, color=color, label=label, log=False)
    ax.axhline(1, color="k", lw=1, label="target 1")
    ax.axhspan(1 - tolerance, 1 + tolerance, color="k", alpha=0.08, label=f"±{tolerance:.3g}")
    ax.set_xscale("log")
    return ax


def selection_fractions(ax, d, feasible_fraction, global_fraction, threshold=None):
    """Against the dimension ``d``: the fraction of problems whose W-SVM of opt is feasible (grey
    squares) and, among those, the fraction whose run selects opt (red dots); ``threshold`` dotted."""
    ax.plot(d, feasible_fraction, "s-", color="0.4", label="W-SVM of opt feasible")
    ax.plot(d, global_fraction, "o-", color=COLORS["global"], label="selects opt (among feasible)")
    if threshold is not None:
        ax.axvline(threshold, color="k", ls=":", lw=1, label=r"$d = \max(n, T-1)$")
    ax.set(xscale="log", xlabel="token dimension $d$", ylabel="fraction of problems", ylim=(-0.03, 1.05))
    ax.set_xticks(list(d), [str(k) for k in d])
    ax.minorticks_off()
    ax.legend(loc="lower right")
    return ax


def polyak_failure(axes, polyak, ngd, stop_at: int, floor_gap: float, labels, refused=None):
    """A Polyak run stopped by its detector next to NGD on the same problem (one-member
    Trajectories): the norm (log-log) and ``log10(L − L*)`` against iterations, the stop marked, and
    the floor ``L*(α) − L*`` of the local selection dashed. ``labels``: ``{"polyak": .., "ngd": ..}``;
    ``refused``: the length of the refused step, annotated."""
    for run, m, style in ((polyak, "polyak", ".-"), (ngd, "ngd", "-")):
        upto = run.steps <= (stop_at if m == "polyak" else run.steps[-1])
        upto[0] = False
        color = METHOD_COLORS[m]
        axes[0].plot(run.steps[upto], run.norm[upto, 0], style, color=color, label=labels[m])
        axes[1].plot(run.steps[upto], run.log_gap[upto, 0] / np.log(10), style, color=color, label=labels[m])
    for ax in axes:
        ax.axvline(stop_at, color=METHOD_COLORS["polyak"], ls=":", lw=1, label=f"Polyak stopped (step {stop_at})")
    label = r"$\mathcal{L}_\star(\alpha) - \mathcal{L}_\star$"
    axes[1].axhline(np.log10(floor_gap), color="k", ls="--", lw=1, label=label)
    axes[0].set(xscale="log", yscale="log", xlabel="iteration $t$", ylabel=r"$\|W_t\|$", title="norm")
    ylabel = r"$\log_{10}(\mathcal{L} - \mathcal{L}_\star)$"
    axes[1].set(xscale="log", xlabel="iteration $t$", ylabel=ylabel, title="loss gap")
    if refused is not None:
        axes[0].annotate(
            f"next step refused:\nlength {refused:.2g}",
            (stop_at, polyak.norm[-1, 0]),
            xytext=(25, -55),
            textcoords="offset points",
            arrowprops=dict(arrowstyle="->"),
        )
    axes[0].legend(loc="lower right")
    axes[1].legend(loc="upper right")
    return axes


def rates_overview(comparison, members, labels, ngd_lr: float, wmm: float, upto=None, fig=None):
    """Two panels of a GD/NGD/Polyak comparison (a :class:`attnlib.experiments.fast_rates.Comparison`, any subset of
    the methods): the direction error, and ``−log10 max_i(1 − σ_i,opt)`` with NGD's predicted line
    ``η t/(‖W_mm‖ ln 10)`` (``wmm``: the median ``‖W_mm‖``) when NGD is shown. ``members``: the columns
    drawn; ``upto``: the last iteration drawn. Returns a Figure (1 × 2): ``fig``, if given (a figure
    this function drew before), cleared and redrawn with its layout kept (not faster than a new figure:
    clearing the axes costs about as much as making them)."""
    import matplotlib.pyplot as plt

    runs, cur = comparison.runs, comparison.curves
    if fig is None:
        fig, axes = plt.subplots(1, 2, figsize=(9.5, 3.4))
    else:
        axes = fig.axes[:2]
        for ax in axes:
            ax.clear()
    method_bands(axes[0], runs, {m: cur[m]["direction_error"] for m in runs}, labels, members, upto=upto)
    mass = {m: cur[m]["log_mass"] for m in runs}
    method_bands(axes[1], runs, mass, None, members, upto=upto, transform=lambda y: -y / np.log(10))
    if "ngd" in runs:
        t = runs["ngd"].steps[1:]
        t = t[t <= (t[-1] if upto is None else upto)]
        axes[1].plot(t, ngd_lr * t / wmm / np.log(10), "k:", lw=1, label=r"$\eta t/(\|W^{mm}\| \ln 10)$ (NGD)")
    axes[0].set(xlabel="iteration $t$", ylabel="direction error", ylim=(1e-4, 2))
    axes[1].set(xlabel="iteration $t$", ylabel=r"$-\log_{10}\max_i(1-\sigma_{i,\mathrm{opt}})$", ylim=(0.03, 2e3))
    axes[0].legend(loc="lower left")
    axes[1].legend(loc="upper left")
    return fig
