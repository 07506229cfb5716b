"""Figures of the optimizer-geometry chapter: paths against the ℓ1/ℓ2/ℓ∞ SVMs, basin maps, the explorer."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from ..experiments.optimizer_geometry import Runs, norm_label
from ..optim import MirrorDescent, RuleBlocks, step_rule, train
from ..svm import check_norm, max_margin_norm
from .common import basin_maps_panels, direction, tokens

__all__ = ["NORM_STYLES", "OPTIMIZER_COLORS", "svm_directions", "paths_against_norms", "basin_panels", "PathExplorer"]

#: Colour and line style of each norm's SVM ray.
NORM_STYLES = {"l1": ("tab:green", "--"), "l2": ("tab:red", "--"), "linf": ("tab:purple", "--")}
#: Colour of each optimizer's paths.
OPTIMIZER_COLORS = {
    "NGD": "tab:red",
    "sign": "tab:purple",
    "l1 steepest": "tab:green",
    "Adam": "tab:pink",
    "spectral": "tab:brown",
}


def _color(label: str) -> str:
    if label.startswith("MD p="):
        return "tab:blue" if label.endswith("1.5") else "tab:cyan"
    return OPTIMIZER_COLORS.get(label, "0.4")


def svm_directions(ax, svms: dict, length: float, norms=("l1", "l2", "linf")):
    """Draw the rays of the SVMs ``{norm: [solution]}`` (first problem) in the key plane, one style per norm."""
    for norm in norms:
        color, ls = NORM_STYLES.get(norm, ("0.3", ":"))
        direction(ax, svms[norm][0].theta, length, color=color, ls=ls, lw=1.6, label=f"{norm_label(norm)} SVM")
    return ax


def paths_against_norms(runs: Runs, labels, upto: int | None = None, lim=(-6.0, 6.0), figsize=(11, 4.4)):
    """One panel per optimizer in ``labels``: its paths from every start (first two coordinates, up to
    step ``upto``) over the tokens, with the ℓ1, ℓ2 and ℓ∞ SVM directions."""
    fig, axes = plt.subplots(1, len(labels), figsize=figsize, sharex=True, sharey=True)
    for ax, label in zip(np.atleast_1d(axes), labels):
        traj = runs.trajectories[label]
        keep = traj.steps <= (traj.steps[-1] if upto is None else upto)
        for b in range(traj.theta.shape[1]):
            xy = traj.theta[keep, b, :2]
            ax.plot(xy[:, 0], xy[:, 1], color=_color(label), lw=1.2, alpha=0.85)
            ax.plot(*xy[0], "o", color=_color(label), ms=3)
        svm_directions(ax, runs.svms, 2 * max(abs(lim[0]), abs(lim[1])))
        tokens(ax, runs.instance.problems[0], annotate_scores=False, size=40)
        ax.set(xlim=lim, ylim=lim, xlabel="$p_1$", title=label)
        ax.set_aspect("equal")
    np.atleast_1d(axes)[0].set_ylabel("$p_2$")
    np.atleast_1d(axes)[-1].legend(loc="lower left")
    fig.tight_layout()
    return fig


def basin_panels(maps: dict, lo: float, hi: float, prob, inits=None, figsize=(11, 4.6)):
    """Basin maps ``{name: BasinMap}`` side by side (:func:`attnlib.figures.common.basin_maps_panels`)."""
    fig, axes = plt.subplots(1, len(maps), figsize=figsize)
    basin_maps_panels(np.atleast_1d(axes), maps, lo, hi, prob, inits)
    fig.tight_layout()
    return fig


class PathExplorer:
    """The explorer's pictures: the path of one optimizer from one start on a key-plane problem, with
    the SVM of the optimizer's norm (ℓp for mirror descent with exponent p).

    ``choices`` ``{label: (rule or None for mirror descent, norm)}``; :meth:`draw` trains (or reuses
    a precomputed path) and returns the figure. One figure is reused (its artists redrawn).
    ``svms`` ``{norm: MaxMarginSolution}``: SVMs of ``prob`` already solved (e.g. the page's), used
    instead of solving them again; any other norm is solved on first use.
    """

    def __init__(self, prob, choices: dict, lim=(-6.0, 6.0), svms=None):
        self.prob, self.choices, self.lim = prob, dict(choices), lim
        self.fig, self.ax = plt.subplots(figsize=(5.2, 4.6))
        plt.close(self.fig)
        self._cache = {}
        self._svms = {check_norm(norm): sol for norm, sol in (svms or {}).items()}

    def _rule_and_norm(self, choice: str, p: float):
        rule, norm = self.choices[choice]
        if rule is None:  # mirror descent: the exponent comes from the control
            return MirrorDescent(p=float(p), normalized=True), float(p)
        return step_rule(rule), norm

    @staticmethod
    def _key(choice: str, p: float, start, steps: int, lr: float) -> tuple:
        return (choice, float(p), tuple(np.round(start, 12)), int(steps), float(lr))

    def path(self, choice: str, p: float, start, steps: int, lr: float) -> np.ndarray:
        """(R, 2) the first two coordinates of the path (cached)."""
        key = self._key(choice, p, start, steps, lr)
        if key not in self._cache:
            rule, _ = self._rule_and_norm(choice, p)
            theta0 = np.zeros(self.prob.shape)
            theta0[:2] = start
            self._cache[key] = train(self.prob, theta0, int(steps), rule, float(lr), progress=False).theta[:, 0, :2]
        return self._cache[key]

    def precompute(self, choices, p: float, start, steps: int, lr: float) -> None:
        """Train the paths of every choice in ``choices`` from one start in one batch
        (:class:`attnlib.optim.RuleBlocks`; the per-step cost is shared), so that :meth:`draw` reuses them."""
        choices = [c for c in choices if self._key(c, p, start, steps, lr) not in self._cache]
        if not choices:
            return
        rules = tuple(self._rule_and_norm(choice, p)[0] for choice in choices)
        theta0 = np.zeros((len(choices),) + self.prob.shape)
        theta0[:, :2] = start
        blocks = RuleBlocks(rules, (1,) * len(rules))
        theta = train(self.prob, theta0, int(steps), blocks, float(lr), progress=False).theta
        for k, choice in enumerate(choices):
            self._cache[self._key(choice, p, start, steps, lr)] = theta[:, k, :2]

    def svm(self, norm):
        norm = check_norm(norm)
        if norm not in self._svms:
            self._svms[norm] = max_margin_norm(self.prob, norm)
        return self._svms[norm]

    def draw(self, choice: str, p: float = 1.5, start=(2.0, -3.0), steps: int = 300, lr: float = 0.1):
        rule, norm = self._rule_and_norm(choice, p)
        xy = self.path(choice, p, start, steps, lr)
        ax = self.ax
        ax.clear()
        tokens(ax, self.prob, annotate_scores=False, size=40)
        span = 2 * max(abs(self.lim[0]), abs(self.lim[1]))
        direction(ax, self.svm("l2").theta, span, color="0.6", ls=":", lw=1.2, label="l2 SVM")
        direction(
            ax,
            self.svm(norm).theta,
            span,
            color="tab:red",
            ls="--",
            lw=1.8,
            label=f"{norm_label(norm)} SVM".replace("ℓ", "l"),
        )
        ax.plot(xy[:, 0], xy[:, 1], color="k", lw=1.3, label=choice.replace("ℓ", "l"))
        ax.plot(*xy[0], "ko", ms=4)
        ax.set(xlim=self.lim, ylim=self.lim, xlabel="p1", ylabel="p2")
        ax.set_title(f"{choice} (p = {p:g})" if rule.name == "mirror" else choice)
        ax.legend(loc="lower left")
        return self.fig
