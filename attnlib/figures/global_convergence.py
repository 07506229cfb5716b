"""Chapter 1 (global convergence): its figures.

Functions draw on a given matplotlib ``Axes`` (or make a figure) and return it; what several
chapters draw is :mod:`attnlib.figures.common`.
"""

from __future__ import annotations

import numpy as np

from ..fits import fit_slope
from ..metrics import log_one_minus_mass, normalized_margin, one_minus_cosine, selection_mass
from ..model import TokenSelectionProblem
from .common import COLORS, SAMPLE_COLORS, direction, paths, tokens

__all__ = [
    "margin_strips",
    "gradient_cosine_map",
    "one_pass_layout",
    "path_with_direction_error",
    "start_paths",
    "direction_error_curves",
    "ngd_and_gd_overview",
    "input_gaps_by_angle",
    "offset_study",
    "random_start_runs",
    "gd_against_ngd",
    "gap_descent_and_w_panels",
    "norm_and_offset_settling",
    "flow_direction_panels",
    "trap_panels",
    "step_size_panels",
]


def _major_log_ticks(*axes) -> None:
    """No minor ticks on the log-scaled axes of ``axes``: matplotlib lays out and draws each minor
    tick (two marks, a grid line, two labels) at every draw, and a log axis over ten decades has
    about eighty of them, most of a figure's rendering time; the major ticks keep the decades labelled."""
    from matplotlib.ticker import NullLocator

    for ax in axes:
        for axis, scale in ((ax.xaxis, ax.get_xscale()), (ax.yaxis, ax.get_yscale())):
            if scale == "log":
                axis.set_minor_locator(NullLocator())


def margin_strips(
    ax,
    prob: TokenSelectionProblem,
    theta_mm,
    select=None,
    extent: float = 100.0,
    alpha: float = 0.0,
    ring_neighbors: bool = True,
    label: bool = True,
):
    """Draw each sample's margin strip of an ATT-SVM solution in the key plane.

    For sample ``i`` the strip lies between the level lines ``⟨θ̂, k⟩ = ⟨θ̂, k_iα_i⟩`` (through
    the selected token, solid) and ``⟨θ̂, k⟩ = ⟨θ̂, k_iα_i⟩ − 1/‖θ_mm‖`` (one margin below,
    dashed), drawn in the sample's colour (:data:`SAMPLE_COLORS`) and shaded with ``alpha``, with
    ``θ̂ = θ_mm/‖θ_mm‖``. The SVM constraints say exactly that no other token of sample ``i``
    enters its strip; the SVM-neighbours (active constraints) lie on its lower edge and are ringed.
    All strips have the width ``1/‖θ_mm‖``, the margin, which no other direction can exceed for
    every sample at once. The margin separates tokens *inside* each sample, so the strips of
    different samples sit at different heights.

    Args:
        prob: a problem whose features live in their first two coordinates (the key plane of the
            fixed-head instances); otherwise the picture would be a projection, and this raises.
        theta_mm: (d,) the SVM solution (e.g. ``max_margin(prob).theta``).
        select: (n,) the selection it was solved for (default: the optimal tokens).
        extent: half-length of the drawn lines (clip with the axes limits).
        ring_neighbors: circle the SVM-neighbour tokens (constraint value 1 up to ``1e-6``).
        alpha: opacity of the shading between the two lines (0: lines only, the default; shading
            overlapping strips muddies the picture).
        label: add legend entries for the lines, the shading (if any) and the rings.
    """
    A = prob.A.reshape(prob.n, prob.T, -1)
    if A.shape[-1] < 2 or np.any(A[..., 2:] != 0):
        raise ValueError("margin_strips needs features that live in their first two coordinates (the key plane)")
    theta = np.asarray(theta_mm, float).ravel()
    if theta.shape != (A.shape[-1],):
        raise ValueError(f"theta_mm must have {A.shape[-1]} entries, got {theta.shape}")
    sel = prob.opt if select is None else np.asarray(select)
    keys = A[..., :2]
    w = theta[:2]
    size = np.linalg.norm(w)
    unit = w / size
    perp = np.array([-unit[1], unit[0]])
    along = np.linspace(-extent, extent, 2)
    ring_label = "SVM-neighbour (on its input's margin)" if label else None
    for i in range(prob.n):
        color = SAMPLE_COLORS[i % len(SAMPLE_COLORS)] if prob.n > 1 else "k"
        top = unit @ keys[i, sel[i]]
        bottom = top - 1.0 / size
        hi = top * unit[None, :] + along[:, None] * perp[None, :]
        lo = bottom * unit[None, :] + along[:, None] * perp[None, :]
        if alpha > 0:
            poly = np.vstack([hi, lo[::-1]])
            strip_label = "margin strip of each input (width = margin)" if (label and i == 0) else None
            ax.fill(poly[:, 0], poly[:, 1], color=color, alpha=alpha, lw=0, label=strip_label)
        first = label and i == 0
        ax.plot(
            hi[:, 0],
            hi[:, 1],
            color=color,
            lw=1.0,
            ls="-",
            alpha=0.8,
            label="level of each input's selected token" if first else None,
        )
        ax.plot(
            lo[:, 0], lo[:, 1], color=color, lw=1.0, ls="--", alpha=0.8, label="one margin below it" if first else None
        )
        if ring_neighbors:
            values = (keys[i, sel[i]] - keys[i]) @ w
            active = np.abs(values - 1.0) <= 1e-6 * np.maximum(1.0, np.abs(values))
            active[sel[i]] = False
            for t in np.flatnonzero(active):
                ax.scatter(*keys[i, t], s=260, facecolor="none", edgecolor="k", lw=1.2, zorder=6, label=ring_label)
                ring_label = None
    return ax


def gradient_cosine_map(ax, grid, cos, label=True):
    """Map of ``cos(∇L(p), d)`` over a square grid of ``p`` in the key plane, with its zero level.

    ``grid`` (G,) coordinates of both axes; ``cos`` (G·G,) or (G, G) with ``cos[a, b]`` at
    ``p = (grid[a], grid[b])`` (as :func:`attnlib.experiments.global_convergence.gradient_cosine` returns for the box
    ``np.column_stack([np.repeat(grid, G), np.tile(grid, G), ...])``). Blue where the gradient
    points against ``d`` (a descent direction along ``d``, the descent lemma), red where it fails;
    the black line is ``cos = 0``. Returns the image (for a colour bar).
    """
    grid = np.asarray(grid, float)
    cos = np.asarray(cos, float).reshape(grid.size, grid.size)
    image = ax.pcolormesh(grid, grid, cos.T, cmap="RdBu_r", vmin=-1, vmax=1, shading="nearest")
    if np.nanmin(cos) < 0 < np.nanmax(cos):
        ax.contour(grid, grid, cos.T, levels=[0.0], colors="k", linewidths=1.2)
    if label:
        ax.set(xlabel="$p_1$", ylabel="$p_2$")
    ax.set_aspect("equal")
    return image


def one_pass_layout(fig, wspace: float = 0.3) -> None:
    """Space a row of panels with fixed margins instead of ``fig.tight_layout()``.

    ``tight_layout`` lays every text out once more before the picture is drawn, and the inline
    backend's ``bbox_inches="tight"`` already crops the picture to its artists (labels outside
    the margins included), so the margins only have to leave room *between* the panels:
    ``wspace`` (a fraction of the mean panel width) covers the tick labels and the label of the
    right-hand panel. The same pixels apart from the panels' spacing, with one layout pass fewer.

    >>> import matplotlib.pyplot as plt
    >>> fig, axes = plt.subplots(1, 2)
    >>> one_pass_layout(fig); fig.subplotpars.wspace
    0.3
    """
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.14, top=0.9, wspace=wspace)


def path_with_direction_error(prob: TokenSelectionProblem, theta_mm, steps, theta, title=None, figsize=(9, 3.6)):
    """One trajectory: its path in the key plane over the margin strips, and its direction error.

    ``steps`` (R,) the recorded iterations, ``theta`` (R, d) the parameters there (keys in the first
    two coordinates, as in :func:`margin_strips`), ``theta_mm`` the SVM it should converge to. Left:
    tokens, margin strips of ``theta_mm``, its ray, the path and its start; right:
    ``1 − cos(θ(t), θ_mm)`` against ``t`` on log axes. Returns the Figure.
    """
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogFormatter, LogLocator, NullLocator

    steps = np.asarray(steps, float)
    theta = np.asarray(theta, float)
    if theta.ndim != 2 or theta.shape[0] != steps.shape[0]:
        raise ValueError(f"theta must have shape (R, d) with R = {steps.shape[0]}, got {theta.shape}")
    fig, axes = plt.subplots(1, 2, figsize=figsize)
    ax = axes[0]
    margin_strips(ax, prob, theta_mm, label=False)
    tokens(ax, prob, annotate_scores=False, size=50)
    reach = max(12.0, 1.1 * float(np.abs(theta[:, :2]).max()))
    direction(ax, theta_mm, length=2 * reach, label="p_mm*")
    ax.plot(theta[:, 0], theta[:, 1], "k", lw=1.5, label=f"path, {int(steps[-1])} steps")
    ax.plot(*theta[0, :2], "o", color="tab:orange", ms=7, zorder=7, label="p(0)")
    ax.set(xlim=(-reach / 2, reach), ylim=(-reach / 2, reach / 2), xlabel="p₁", ylabel="p₂")
    ax.set_aspect("equal")
    ax.legend(loc="lower right")
    later = steps > 0
    axes[1].loglog(steps[later], one_minus_cosine(theta[later], theta_mm), "k")
    axes[1].set(xlabel="iteration t", ylabel="1 − cos(p(t), p_mm*)")  # plain text: TeX costs a parse per picture
    axes[1].yaxis.set_major_locator(LogLocator(numticks=4))
    for axis in (axes[1].xaxis, axes[1].yaxis):
        axis.set_minor_locator(NullLocator())  # log-axis minor ticks are most of the rendering time
        axis.set_major_formatter(LogFormatter())  # plain-text labels: parsing TeX ones costs more
    if title:
        fig.suptitle(title)
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.15, top=0.85, wspace=0.3)  # no tight_layout: one draw
    return fig


def start_paths(ax, prob: TokenSelectionProblem, theta, theta_mm, colors, title="", xlim=(-4, 10), ylim=(-2, 10)):
    """Trajectories from several starts, one colour each, with the tokens and the SVM ray.

    ``theta`` (R, B, d): the recorded parameters of B runs (all R records are drawn, so slice the
    steps to show first); ``colors`` B colours; ``theta_mm`` the SVM direction drawn as a ray.
    """
    theta = np.asarray(theta, float)
    tokens(ax, prob)
    for b, c in enumerate(colors):
        paths(ax, theta[:, b : b + 1], color=c, arrow_every=20)
        ax.plot(*theta[0, b, :2], "o", color=c, ms=5)
    direction(ax, theta_mm, length=30, label=r"$p^{\mathrm{mm}\star}$ (global SVM direction)")
    ax.set(xlim=xlim, ylim=ylim, xlabel="$p_1$", ylabel="$p_2$", title=title)
    ax.set_aspect("equal")
    return ax


def direction_error_curves(ax, steps, theta, theta_mm, colors, labels, slope=None):
    """``1 − cos(θ_b(t), θ_mm)`` of each run against ``t`` on log axes, one colour and label per run.

    ``steps`` (R,), ``theta`` (R, B, d). ``slope``: also draw the guide ``∝ t^slope`` through the
    largest final error (dashed black).
    """

    steps = np.asarray(steps, float)
    error = one_minus_cosine(theta, theta_mm)
    for b, (c, lab) in enumerate(zip(colors, labels)):
        ax.loglog(steps[1:], error[1:, b], color=c, label=lab)
    if slope is not None:
        guide = error[-1].max() * (steps[1:] / steps[-1]) ** slope
        ax.loglog(steps[1:], guide, "k--", lw=1, label=rf"slope ${slope:g}$: bounded offset")
    ax.set(xlabel="iteration $t$", ylabel=r"$1 - \cos(p(t), p^{\mathrm{mm}\star})$")
    _major_log_ticks(ax)
    return ax


def ngd_and_gd_overview(prob: TokenSelectionProblem, theta_mm, ngd, gd, starts, shown: int, ngd_lr, gd_lr):
    """The multi-input figure of [MMTS]: paths with the margin strips, attention, norm growth.

    ``ngd``, ``gd``: :class:`attnlib.Trajectory` runs from the B ``starts`` (B, d), recorded every
    step; the first ``shown`` steps are drawn. (a) NGD paths over each input's margin strip; (b) mean
    softmax mass on the optimal tokens and (c) ``‖p(t)‖``, NGD against GD from the start ``p(0) = 0``
    (the row of ``starts`` that is zero). Returns the Figure.
    """
    import matplotlib.pyplot as plt

    zero = int(np.flatnonzero(np.all(np.asarray(starts) == 0, axis=1))[0])
    fig, axes = plt.subplots(1, 3, figsize=(16, 5), gridspec_kw={"width_ratios": [1.5, 1, 1]})
    ax = axes[0]
    margin_strips(ax, prob, theta_mm)
    tokens(ax, prob, annotate_scores=False)
    paths(ax, ngd.theta[: shown + 1], arrow_every=20)
    ax.plot(*np.asarray(starts)[:, :2].T, "o", color=COLORS["path"], ms=4)
    direction(ax, theta_mm, length=30, label=r"$p^{\mathrm{mm}\star}$")
    ax.plot([], [], color=COLORS["path"], label=f"NGD paths, {shown} steps")
    ax.plot([], [], "k*", ms=10, ls="none", label="optimal tokens (score 1)")
    ax.plot([], [], "ko", ms=5, ls="none", label="other tokens (score 0.5)")
    ax.set(xlim=(-2, 6), ylim=(-2, 4), xlabel="$p_1$ (key coordinate 1)", ylabel="$p_2$ (key coordinate 2)")
    ax.set_title("(a) paths, SVM direction and margins\n(one colour per input)")
    ax.set_aspect("equal")
    ax.legend(loc="upper right")
    rows = slice(0, shown + 1)
    runs = [(ngd, COLORS["global"], rf"NGD, $\eta = {ngd_lr:g}$"), (gd, COLORS["local"], rf"GD, $\eta = {gd_lr:g}$")]
    for run, color, label in runs:
        axes[1].plot(run.steps[rows], selection_mass(prob, run.theta[rows, zero]).mean(-1), color=color, label=label)
        axes[2].plot(run.steps[rows], run.norm[rows, zero], color=color, label=label)
    axes[2].plot(ngd.steps[rows], ngd_lr * ngd.steps[rows], "k:", lw=1, label=r"$\eta t$")
    axes[1].set(xlabel="iteration $t$", ylabel="mean softmax mass on the optimal tokens", ylim=(0, 1.02))
    axes[1].set_title("(b) attention on the optimal tokens, $p(0) = 0$")
    axes[1].legend(loc="lower right")
    axes[2].set(xlabel="iteration $t$", ylabel=r"$\|p(t)\|$", title="(c) norm growth, $p(0) = 0$")
    axes[2].legend(loc="upper left")
    one_pass_layout(fig)
    return fig


def input_gaps_by_angle(ax, prob: TokenSelectionProblem, theta_mm, step_degrees: float = 0.25) -> float:
    """Each input's gap ``min_{t≠opt} ⟨p̂, k_opt − k_t⟩`` and their minimum over unit directions ``p̂``.

    The directions sweep the key plane (first two coordinates) on a grid of ``step_degrees``; the
    minimum over inputs is the normalised margin of ``p̂`` (:func:`attnlib.normalized_margin`),
    largest at the SVM direction ``theta_mm``. Returns the angle (degrees) of the grid's best direction.
    """

    phi = np.arange(-180, 180 + step_degrees / 2, step_degrees)
    U = np.zeros((phi.size,) + prob.shape)
    U[:, 0], U[:, 1] = np.cos(np.radians(phi)), np.sin(np.radians(phi))
    logits = prob.logits(U)  # (directions, n, T)
    opt_logit = np.take_along_axis(logits, np.broadcast_to(prob.opt, logits.shape[:2])[..., None], axis=-1)
    others = np.arange(prob.T) != prob.opt[:, None]
    gaps = np.min(np.where(others, opt_logit - logits, np.inf), axis=-1)  # (directions, n)
    margin = normalized_margin(prob, U)
    u = np.asarray(theta_mm, float).ravel()
    phi_star = np.degrees(np.arctan2(u[1], u[0]))
    for i in range(prob.n):
        ax.plot(phi, gaps[:, i], color=SAMPLE_COLORS[i % len(SAMPLE_COLORS)], lw=1, label=f"input {i + 1}: its own gap")
    ax.plot(phi, margin, "k", lw=2.5, label="minimum over inputs (normalised margin)")
    label = rf"direction of $p^{{\mathrm{{mm}}\star}}$ ({phi_star:.1f}°)"
    ax.axvline(phi_star, color=COLORS["global"], ls="--", label=label)
    M = np.linalg.norm(u)
    ax.axhline(1 / M, color="0.3", ls=":", label=rf"SVM margin $1/\|p^{{\mathrm{{mm}}\star}}\| = {1 / M:.3f}$")
    ax.set(xlim=(-90, 90), ylim=(-1.5, 2.2), xlabel=r"angle of the unit direction $\hat p$ in the key plane (degrees)")
    ax.set_ylabel(r"gap $\min_{t \neq opt}\, \langle \hat p, k_{opt} - k_t \rangle$")
    ax.legend(loc="lower center")
    return float(phi[np.argmax(margin)])


def offset_study(runs: dict, predicted, shown: int, labels: dict, colors: dict):
    """The loss and score-magnitude study: paths, the offset ``p_2(t)`` settling, final offset against C.

    ``runs``: ``{(loss, C): Trajectory}`` of one run each from ``p(0) = 0`` (recorded at
    ``run.steps``); ``predicted(C, loss)`` the predicted final offset ``p_2(∞)``; the first ``shown``
    steps of each path are drawn. Darker: larger C; dashed: the largest C. Returns the Figure.
    """
    import matplotlib.pyplot as plt

    losses = list(dict.fromkeys(loss for loss, _ in runs))
    scores = sorted({C for _, C in runs})
    lo, hi = min(scores), max(scores)
    shade = {C: 0.35 + 0.65 * np.log(C / lo) / max(np.log(hi / lo), 1e-12) for C in scores}
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    for (loss, C), run in runs.items():
        style = dict(color=colors[loss], alpha=shade[C], ls="--" if C == hi else "-", lw=1.3)
        kept = run.steps <= shown
        axes[0].plot(run.theta[kept, 0, 0], run.theta[kept, 0, 1], **style)
        axes[1].plot(run.steps, run.theta[:, 0, 1], **style)
        axes[1].axhline(predicted(C, loss), color=colors[loss], lw=0.6, ls=":", alpha=shade[C])
    for loss in losses:
        axes[0].plot([], [], color=colors[loss], label=labels[loss])
        Cs = np.geomspace(lo, hi, 200)
        axes[2].semilogx(Cs, predicted(Cs, loss), color=colors[loss], lw=1, label=f"{labels[loss]}: formula")
        final = [runs[loss, C].theta[-1, 0, 1] for C in scores]
        axes[2].semilogx(scores, final, "o", color=colors[loss], mfc="none", label="measured")
    axes[0].plot([], [], "k--", label=f"C = {hi:g}")
    axes[0].axhline(0, color=COLORS["global"], lw=1, ls=":", label=r"direction of $p^{\mathrm{mm}\star} = (1, 0)$")
    axes[0].set(xlabel="$p_1$", ylabel="$p_2$", title=f"(a) NGD paths, first {shown} steps (darker: larger C)")
    axes[1].plot([], [], "k:", lw=0.8, label="predicted $p_2(\\infty)$")
    axes[1].set(xlabel="iteration $t$", ylabel="$p_2(t)$: offset from the $p_1$ axis", title="(b) the offset settles")
    axes[2].set(xlabel="score C of input 1's optimal token", ylabel=r"$p_2$ at the last step")
    axes[2].set_title("(c) final offset vs C")
    for ax in axes:
        ax.legend(loc="lower left")
    _major_log_ticks(*axes)
    one_pass_layout(fig)
    return fig


def random_start_runs(theta, steps, long_steps, long_theta, theta_mm, adversarial, length: float):
    """Many starts: (a) their paths in the key plane, (b) every run's direction error, log axes.

    ``theta`` (R, B, d) the runs drawn in (a); ``long_steps`` (R',), ``long_theta`` (R', B, d) the same
    runs continued, drawn in (b) with the figures' horizon ``steps`` marked; ``adversarial`` (B,) bool,
    drawn in orange. Returns the Figure.
    """
    import matplotlib.pyplot as plt

    adversarial = np.asarray(adversarial, bool)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    error = one_minus_cosine(long_theta, theta_mm)
    for kind, style in (
        (~adversarial, dict(color="0.6", lw=0.6, alpha=0.6)),
        (adversarial, dict(color="tab:orange", lw=1.3)),
    ):
        axes[0].plot(theta[:, kind, 0], theta[:, kind, 1], **style)  # one call: a line per column
        axes[1].loglog(long_steps[1:], error[1:, kind], **style)
    axes[0].plot(*theta[0, :, :2].T, "k.", ms=3)
    direction(axes[0], theta_mm, length=length, label=r"$p^{\mathrm{mm}\star}$")
    axes[0].plot([], [], color="0.6", label="random starts")
    axes[0].plot([], [], color="tab:orange", label="adversarial starts")
    axes[0].set(xlabel="$p_1$", ylabel="$p_2$", title=f"(a) {theta.shape[1]} NGD paths, {steps} steps")
    axes[0].legend(loc="upper left")
    axes[1].axvline(steps, color="k", lw=0.8, ls=":")
    axes[1].annotate(" the figures' horizon", (steps, 2e-6))
    axes[1].set(xlabel="iteration $t$", ylabel=r"$1 - \cos(p(t), p^{\mathrm{mm}\star})$", ylim=(1e-7, 3))
    axes[1].set_title(f"(b) direction error of every run, continued to {int(long_steps[-1])} steps")
    _major_log_ticks(*axes)
    one_pass_layout(fig)
    return fig


def gd_against_ngd(prob: TokenSelectionProblem, theta_mm, gd, ngd, zero: int, window):
    """Plain GD from several starts against NGD from ``p(0) = 0`` (run index ``zero``), log axes.

    (a) direction error, (b) attention left off the optimal tokens (with a ``1/t`` guide), (c) GD's
    ``‖p(t)‖`` against ``log t`` with the line fitted over the records ``window`` (a slice).
    ``gd``, ``ngd``: :class:`attnlib.Trajectory`. Returns ``(fig, slope)``, the fitted slope.
    """
    import matplotlib.pyplot as plt

    tg, tn = gd.steps, ngd.steps
    B = gd.theta.shape[1]
    shades = plt.cm.Blues(np.linspace(0.45, 1, B))
    off_gd = np.exp(log_one_minus_mass(prob, gd.theta)).mean(-1)
    off_ngd = np.exp(log_one_minus_mass(prob, ngd.theta[:, zero])).mean(-1)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4))
    err_gd = one_minus_cosine(gd.theta, theta_mm)
    for b in range(B):
        label = f"GD, {B} starts" if b == 0 else None
        axes[0].loglog(tg[1:], err_gd[1:, b], color=shades[b], label=label)
        axes[1].loglog(tg[1:], off_gd[1:, b], color=shades[b], label=label)
        axes[2].semilogx(tg[1:], gd.norm[1:, b], color=shades[b], label=label)
    slope, icpt = fit_slope(tg[window], gd.norm[window, zero], log_y=False)
    fit_label = rf"fit: {slope:.3f}$\,\log t$ + c"
    axes[2].semilogx(tg[window], slope * np.log(tg[window]) + icpt, "k--", lw=1.2, label=fit_label)
    M = np.linalg.norm(theta_mm)
    axes[2].set(xlabel="iteration $t$ (log scale)", ylabel=r"$\|p(t)\|$")
    axes[2].set_title(rf"(c) GD norm against $\log t$ ($M = \|p^{{\mathrm{{mm}}\star}}\| = {M:.3f}$)")
    ngd_label = "NGD from $p(0) = 0$"
    axes[0].loglog(tn[1:], one_minus_cosine(ngd.theta[1:, zero], theta_mm), color=COLORS["global"], label=ngd_label)
    axes[1].loglog(tn[1:], off_ngd[1:], color=COLORS["global"], label=ngd_label)
    axes[1].loglog(tg[10:], off_gd[-1, zero] * tg[-1] / tg[10:], "k--", lw=1, label=r"$\propto 1/t$")
    axes[0].set(xlabel="iteration $t$", ylabel=r"$1 - \cos(p(t), p^{\mathrm{mm}\star})$", ylim=(1e-6, 3))
    axes[0].set_title("(a) direction error: GD decreases, slowly")
    axes[1].set(xlabel="iteration $t$", ylabel=r"$1 -$ mean softmax mass on the optimal tokens", ylim=(1e-12, 1.5))
    axes[1].set_title("(b) attention not on the optimal tokens")
    for ax in axes:
        ax.legend(loc="lower left" if ax is not axes[2] else "upper left")
    _major_log_ticks(*axes)
    one_pass_layout(fig)
    return fig, slope


def gap_descent_and_w_panels(axes, gap_curves, grid, cos, theta_mm, w_steps, w_errors):
    """Three panels: GD's loss gap in units of ``M²/(ηt)``, a map of ``cos(∇L, p_mm*)``, W's direction error.

    ``gap_curves``: ``[(t (R,), ηt(L − L*)/M² (R,), label), ...]`` drawn on ``axes[0]`` against the
    constant 1; ``grid``, ``cos``, ``theta_mm``: the map of :func:`gradient_cosine_map` with the SVM
    ray; ``w_steps`` (R,) and ``w_errors``: ``[(1 − corr (R, B), colour, label), ...]`` on log axes.
    """
    for t, value, label in gap_curves:
        axes[0].semilogx(t, value, label=label)
    axes[0].axhline(1, color="k", ls=":", lw=1, label=r"$M^2/(\eta t)$ exactly")
    axes[0].set(xlabel="iteration $t$", ylabel=r"$\eta\,t\,(L - L_\star)/M^2$", title="(a) plain GD: the loss gap")
    axes[0].legend(loc="lower right")
    image = gradient_cosine_map(axes[1], grid, cos)
    direction(axes[1], theta_mm, length=0.7 * float(np.max(np.abs(grid))), label=r"$p^{\mathrm{mm}\star}$")
    axes[1].figure.colorbar(image, ax=axes[1], label=r"$\cos(\nabla L(p), p^{\mathrm{mm}\star})$")
    lim = (float(grid[0]), float(grid[-1]))
    axes[1].set(xlim=lim, ylim=lim, title="(b) unequal scores: red = no descent along $p^{\\mathrm{mm}\\star}$")
    axes[1].legend(loc="upper right")
    for error, color, label in w_errors:
        axes[2].loglog(w_steps[1:], error[1:], color=color, lw=1)
        axes[2].plot([], [], color=color, label=label)
    axes[2].set(xlabel="iteration $t$", ylabel=r"$1 - \mathrm{corr}(W(t), \cdot)$", title="(c) NGD on $W$")
    axes[2].legend(loc="lower left")
    _major_log_ticks(*axes)
    return axes


def norm_and_offset_settling(axes, steps, norm, M, offset_error, kappa_M):
    """GD on a log grid: ``‖p(t)‖`` against ``log t`` with slope ``M``, and ``|p_2 − p_2(∞)|`` with ``t^{−κM}``.

    ``steps``, ``norm``, ``offset_error``: (R,) positive steps and the run's values there; the guides
    pass through the last record.
    """
    color = COLORS["local"]
    axes[0].semilogx(steps, norm, color=color, label=r"GD, $\|p(t)\|$")
    guide = M * np.log(steps / steps[-1]) + norm[-1]
    axes[0].semilogx(steps, guide, "k--", lw=1, label=rf"$M \log t + c$, $M = {M:.3g}$")
    axes[0].set(xlabel="iteration $t$ (log scale)", ylabel=r"$\|p(t)\|$", title=r"(a) norm: slope $M$ against $\log t$")
    axes[1].loglog(steps, offset_error, color=color, label=r"$|p_2(t) - p_2(\infty)|$")
    guide = offset_error[-1] * (steps / steps[-1]) ** (-kappa_M)
    axes[1].loglog(steps, guide, "k--", lw=1, label=rf"$\propto t^{{-\kappa M}}$, $\kappa M = {kappa_M:.3g}$")
    axes[1].set(xlabel="iteration $t$", ylabel=r"$|p_2(t) - p_2(\infty)|$", title="(b) the offset settles")
    for ax in axes:
        ax.legend(loc="best")
    _major_log_ticks(*axes)
    return axes


def flow_direction_panels(axes, runs):
    """GD's direction error against time on log axes: gradient flow to 10¹⁵ and GD at η = c/L.

    ``runs``: list of ``(t (R,), theta (R, B, d), theta_mm (d,), label, style)``; the error is the
    angle (degrees) between θ(t) and ``theta_mm``, worst over the batch. ``axes[1]``: the same
    against ``1/log t`` (a bounded offset over a norm growing like ``M log t``: a line through 0).
    """
    for t, theta, theta_mm, label, style in runs:
        keep = t > 1
        with np.errstate(invalid="ignore", divide="ignore"):  # θ = 0 at t = 0 for a start at the origin
            cos = np.sum(theta * theta_mm, -1) / (np.linalg.norm(theta, axis=-1) * np.linalg.norm(theta_mm))
        angle = np.degrees(np.arccos(np.clip(cos, -1, 1))).max(-1)
        axes[0].loglog(t[keep], angle[keep], style, label=label)
        axes[1].plot(1 / np.log(t[keep]), angle[keep], style, label=label)
    axes[0].set(xlabel=r"time $t$ (GD: $\eta k$)", ylabel=r"angle to $p^{mm}$ (degrees)", title="(a) direction error")
    axes[1].set(xlabel=r"$1/\log t$", ylabel="angle (degrees)", title=r"(b) against $1/\log t$")
    axes[1].set_xlim(left=0)
    for ax in axes:
        ax.legend(loc="best")
    _major_log_ticks(*axes)
    return axes


def trap_panels(axes, prob: TokenSelectionProblem, flow, theta_mm, grid, trapped):
    """The counterexample: (a) the two flows in the key plane, (b) input 2's attention on its optimal
    token, (c) the basin of the trap in the plane of starts (``trapped`` (G, G) bool over ``grid``)."""
    t = flow.steps
    names = ["from $p(0) = (3, 0)$: trapped", "from $p(0) = 0$: converges"]
    for b, (name, color) in enumerate(zip(names, [COLORS["local"], COLORS["global"]])):
        axes[0].plot(flow.theta[:, b, 0], flow.theta[:, b, 1], color=color, label=name)
        log_sigma = prob.log_attention(flow.theta[:, b])[:, 1, 0]
        axes[1].semilogx(t[1:], log_sigma[1:], color=color, label=name)
    direction(axes[0], theta_mm, length=40, color="k", ls="--", label=r"$p^{mm\star} = (1, 40)$")
    axes[0].set(
        xlabel="$p_1$", ylabel="$p_2$", title="(a) gradient flow to $t = 10^{15}$", xlim=(-1, 40), ylim=(-2, 45)
    )
    axes[1].set(xlabel="time $t$", ylabel=r"$\log \sigma_{2,\mathrm{opt}}$", title="(b) input 2's optimal token")
    extent = (grid[0], grid[-1], grid[0], grid[-1])
    axes[2].imshow(trapped, origin="lower", extent=extent, cmap="Reds", vmin=0, vmax=1.5, aspect="auto")
    axes[2].plot(*[[3.0], [0.0]], "k^", label="$p(0) = (3, 0)$")
    axes[2].plot(0, 0, "ko", label="$p(0) = 0$")
    axes[2].set(xlabel="$p_1(0)$", ylabel="$p_2(0)$", title=f"(c) trapped starts (red): {trapped.mean():.0%}")
    for ax in axes:
        ax.legend(loc="best")
    _major_log_ticks(*axes)
    return axes


def step_size_panels(axes, rows, labels):
    """The step-size experiment: (a) share of runs whose loss never rises, (b) share ending trapped, against η·L."""
    c = np.array([r["c"] for r in rows])
    axes[0].semilogx(c, [r["monotone"] for r in rows], "o-", color=COLORS["local"])
    axes[0].axvline(1, color="k", ls=":", lw=1)
    axes[0].set(
        xlabel=r"$\eta L$", ylabel="share of runs with monotone loss", title="(a) monotone descent", ylim=(-0.05, 1.05)
    )
    for key, style in labels:
        axes[1].semilogx(c, [np.mean(r[key]) for r in rows], style, label=key)
    axes[1].axvline(1, color="k", ls=":", lw=1)
    axes[1].set(xlabel=r"$\eta L$", ylabel="share of starts trapped", title="(b) the basin of the trap")
    axes[1].legend(loc="best")
    _major_log_ticks(*axes)
    return axes
