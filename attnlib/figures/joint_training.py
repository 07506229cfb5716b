"""Chapter 4 (joint training): its figures.

Functions draw on a given matplotlib ``Axes`` (or make a figure) and return it; what several
chapters draw is :mod:`attnlib.figures.common`.
"""

from __future__ import annotations

import numpy as np

from ..metrics import angle_degrees
from .common import COLORS, direction, paths

__all__ = [
    "joint_paths",
    "joint_angles",
    "selection_probabilities",
    "loss_angles",
    "arc_positions",
    "joint_run_figure",
    "radius_angles",
]


def _joint_labels(plain_text: bool) -> dict:
    # Plain-text labels skip mathtext layout, which dominates the cost of small explorer pictures.
    if plain_text:
        return dict(
            p="attention p(t)",
            v="head v(t)",
            vmm="label SVM v_mm",
            full="full p-SVM",
            pred="first-order p\u0302(\u03c1)",
        )
    return dict(
        p="attention $p(t)$",
        v="head $v(t)$",
        vmm=r"label SVM $v^{\mathrm{mm}}$",
        full=r"full p-SVM $p^{\mathrm{mm}}$",
        pred=r"first-order $\hat p(\rho)$",
    )


def joint_paths(ax, traj, svms, upto=None, predicted=None, arrow_every: int = 10, plain_text: bool = False):
    """Joint training in the key plane: the paths of ``p(t)`` (red) and ``v(t)`` (blue), and the SVMs.

    Args:
        traj: a :class:`attnlib.optim.JointTrajectory` with 2-D ``p`` and ``v`` (R, B, 2).
        svms: the data's :class:`attnlib.svm.JointSVMs`: draws the label SVM ``v_mm`` (dotted
            blue), the relaxed p-SVM (dashed red) and the full p-SVM (dashed grey; one red line when
            they coincide), the selected keys (filled: support vectors of ``v_mm``) and the other
            keys (squares).
        upto: draw the iterations ``≤ upto`` only (default: all).
        predicted: a direction drawn dash-dotted black (e.g. ``p̂(ρ)``), or None.
        plain_text: labels without mathtext (faster).
    """
    lab = _joint_labels(plain_text)
    shown = slice(None) if upto is None else np.asarray(traj.steps) <= upto
    p, v = traj.p[shown], traj.v[shown]
    length = 1.08 * max(np.linalg.norm(p, axis=-1).max(), np.linalg.norm(v, axis=-1).max())
    paths(ax, p, color=COLORS["p"], arrow_every=arrow_every, label=lab["p"])
    paths(ax, v, color=COLORS["v"], arrow_every=arrow_every, label=lab["v"])
    direction(ax, svms.label.v, length, color=COLORS["v"], label=lab["vmm"], ls=":")
    if svms.separation < 1e-3:
        direction(ax, svms.full.theta, length, color=COLORS["p"], label="full = relaxed p-SVM")
    else:
        direction(ax, svms.full.theta, length, color="0.5", label=lab["full"])
        direction(ax, svms.relaxed.theta, length, color=COLORS["p"], label="relaxed p-SVM")
    if predicted is not None:
        direction(ax, predicted, length, color="k", ls="-.", lw=1.2, label=lab["pred"])
    n, T = svms.keys.shape[:2]
    chosen = svms.keys[np.arange(n), svms.select]
    others = svms.keys[np.arange(T)[None, :] != np.asarray(svms.select)[:, None]]
    ax.scatter(chosen[:, 0], chosen[:, 1], c=["k" if s else "w" for s in svms.support], edgecolors="k", s=30, zorder=6)
    ax.scatter(others[:, 0], others[:, 1], marker="s", c="k", s=18, zorder=6)
    ax.set_aspect("equal")
    return ax


def joint_angles(ax, steps, p, svms, v=None, predicted=None, ylim=(1e-4, 200.0), plain_text: bool = False):
    """Angles (degrees, log scale) of ``p`` (R, 2) to the relaxed (red) and full (grey, dashed) p-SVMs.

    Also of ``v`` (R, 2) to ``v_mm`` (blue) if given, and of ``p`` to ``predicted`` (black,
    dash-dotted) if given, against ``steps`` (R,). Colours as :func:`joint_paths`.
    """

    lab = _joint_labels(plain_text)
    ax.plot(steps, angle_degrees(p, svms.relaxed.theta), color=COLORS["p"], label="p to relaxed p-SVM")
    ax.plot(steps, angle_degrees(p, svms.full.theta), color="0.5", ls="--", label="p to full p-SVM")
    if predicted is not None:
        ax.plot(steps, angle_degrees(p, predicted), color="k", ls="-.", label="p to " + lab["pred"])
    if v is not None:
        ax.plot(steps, angle_degrees(v, svms.label.v), color=COLORS["v"], label="v to " + lab["vmm"])
    ax.set_yscale("log")
    ax.set_ylim(*ylim)
    ax.minorticks_off()  # labelled decades only: minor log ticks double the cost of the figure
    ax.set_xlabel("iteration")
    return ax


def selection_probabilities(ax, steps, mass, confidence):
    """Mean softmax probability of the selected tokens (red) and mean ``σ(y f)`` (blue) against ``steps``.

    ``mass``, ``confidence``: (R, n) per sample (:func:`attnlib.experiments.joint_training.selected_mass`,
    :func:`attnlib.experiments.joint_training.classifier_confidence` of one run).
    """
    ax.plot(steps, np.mean(mass, -1), color=COLORS["p"], label="mean softmax probability of the selected tokens")
    ax.plot(steps, np.mean(confidence, -1), color=COLORS["v"], label=r"mean logistic probability $\sigma(y f)$")
    ax.set_xlabel("iteration")
    return ax


def loss_angles(axes, trajectories: dict, svms, head_reference, colors=None):
    """Joint runs under several losses: angles of ``p`` (``axes[0]``) and ``v`` (``axes[1]``), log scale.

    ``trajectories``: ``{loss name: JointTrajectory}`` (first run of each drawn). Left: ``p`` to the
    relaxed (solid) and full (dashed) p-SVM; right: ``v`` to ``v_mm`` (solid) and to
    ``head_reference`` (dotted, e.g. ``Σ_i y_i x_iα_i``). One colour per loss.
    """

    colors = colors or {"logistic": "tab:red", "exponential": "tab:orange", "linear": "tab:purple"}
    for name, traj in trajectories.items():
        c = colors.get(name)
        p, v = traj.p[:, 0], traj.v[:, 0]
        axes[0].plot(traj.steps, angle_degrees(p, svms.relaxed.theta), color=c, label=name)
        axes[0].plot(traj.steps, angle_degrees(p, svms.full.theta), color=c, ls="--")
        axes[1].plot(traj.steps, angle_degrees(v, svms.label.v), color=c, label=name)
        axes[1].plot(traj.steps, angle_degrees(v, head_reference), color=c, ls=":")
    axes[0].plot([], [], color="k", label="to relaxed p-SVM")
    axes[0].plot([], [], color="k", ls="--", label="to full p-SVM")
    axes[1].plot([], [], color="k", label=r"to $v^{\mathrm{mm}}$")
    axes[1].plot([], [], color="k", ls=":", label=r"to $\sum_i y_i x_{i\alpha_i}$")
    for ax, title in zip(axes, ("attention $p$", "head $v$")):
        ax.set(yscale="log", ylim=(1e-3, 200), xlabel="iteration", ylabel="angle (degrees)", title=title)
        ax.minorticks_off()
        ax.legend()
    return axes


def arc_positions(ax, series, bands: bool = True):
    """Positions on the arc from the relaxed (0) to the full (1) p-SVM, one column per instance.

    ``series``: a list of ``(positions, label, style)``: ``positions`` one array-like per column
    (:func:`attnlib.experiments.joint_training.arc_position`), ``style`` keyword arguments of ``ax.scatter``. With
    ``bands``, shades the quarter-separation zones of the two SVMs (red: relaxed, grey: full).
    """
    if bands:
        ax.axhspan(-0.25, 0.25, color=COLORS["p"], alpha=0.12, lw=0, label="follows the relaxed p-SVM")
        ax.axhspan(0.75, 1.25, color="0.5", alpha=0.15, lw=0, label="follows the full p-SVM")
    columns = 0
    for positions, label, style in series:
        for x, pos in enumerate(positions):
            pos = np.atleast_1d(np.asarray(pos, float))
            ax.scatter(np.full(pos.shape, x), pos, label=label if x == 0 else None, **style)
        columns = max(columns, len(positions))
    ax.axhline(0, color=COLORS["p"], lw=0.8)
    ax.axhline(1, color="0.5", lw=0.8, ls="--")
    ax.set_xticks(range(columns))
    ax.set_ylabel("position of $p$: 0 = relaxed, 1 = full")
    return ax


def joint_run_figure(traj, svms, predicted, title: str, figsize=(9.5, 3.8)):
    """One joint run as a two-panel Figure: :func:`joint_paths` and :func:`joint_angles` of ``p``.

    Plain-text labels (fast enough to redraw on every change of an explorer). ``predicted``: the
    first-order direction drawn in both panels. Returns the Figure.
    """
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=figsize)
    joint_paths(ax, traj, svms, predicted=predicted, arrow_every=max(1, len(traj.steps) // 8), plain_text=True)
    ax.legend(loc="center right")
    ax.set_title(title)
    joint_angles(ax2, traj.steps, traj.p[:, 0], svms, predicted=predicted, ylim=(1e-3, 200.0), plain_text=True)
    ax2.set_yticks([1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0], ["0.001", "0.01", "0.1", "1", "10", "100"])
    ax2.minorticks_off()
    ax2.set_ylabel("angle of p (degrees)")
    ax2.legend(loc="lower left")
    fig.subplots_adjust(wspace=0.3)
    return fig


def radius_angles(ax, radii, p, svms, label: str, **style):
    """Angles (degrees, log-log) of regularization-path points ``p`` (N, 2) to the p-SVMs against ``radii`` (N,).

    To the relaxed p-SVM in red (floored at 1e-6° for the log scale) and, when the two SVMs differ,
    to the full one in grey; ``style``: further ``ax.plot`` keywords (line style, marker).
    """

    rel = np.maximum(angle_degrees(p, svms.relaxed.theta), 1e-6)
    ax.plot(radii, rel, color=COLORS["p"], label=f"{label}: ∠(p̄, relaxed)", **style)
    if svms.separation > 1e-3:
        ax.plot(radii, angle_degrees(p, svms.full.theta), color="0.5", label=f"{label}: ∠(p̄, full)", **style)
    ax.set(xscale="log", yscale="log", xlabel="attention radius R_p", ylabel="angle (degrees)")
    ax.minorticks_off()
    return ax
