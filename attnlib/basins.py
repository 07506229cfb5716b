"""Basins of attraction: where each trajectory of a batch of starts is heading.

A basin map trains a grid of initialisations as one batch and attributes each trajectory to the
locally-optimal selection ``α`` whose SVM direction ``θ_mm(α)`` its late motion follows ([MMTS]'s
local-convergence theorem: several directions attract, and the start decides which). Used by the
local-convergence chapter (GD and NGD maps of Fig. 1(b)) and the optimizer-geometry chapter (the
same map under mirror and steepest descent).

Attribution: trajectory ``b`` goes to candidate ``k`` when ``1 − cos(θ_b(T) − θ_b(T/2), θ_mm(α_k))``
is at most ``tol`` and its current selection is ``α_k``; otherwise it is undecided within the horizon.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .metrics import cosine
from .model import TokenSelectionProblem
from .optim import check_schedule, step_rule, train
from .svm import SelectionReport, locally_optimal_selections

__all__ = ["MOTION_TOL", "BasinMap", "classify_motion", "half_and_final_states", "basin_map", "key_plane_grid"]


#: Default attribution tolerance on ``1 − cos(Δθ, θ_mm(α))`` (see the module docstring).
MOTION_TOL = 1e-3


@dataclass(frozen=True, eq=False)
class BasinMap:
    """Where each trajectory of a batch is heading.

    Attributes:
        labels: (B,) index into ``candidates`` or ``-1`` (undecided within the horizon).
        candidates: the locally-optimal selections (:class:`~attnlib.svm.SelectionReport`).
        is_global: (K,) bool, candidate ``k`` is the optimal selection.
        final: (B, *shape) the last parameters.
        motion_cosine: (B, K) ``cos(Δθ, θ_mm(α_k))`` over the last half of the horizon.
        position_cosine: (B, K) ``cos(θ_final, θ_mm(α_k))``.
        extended: (B,) bool, the trajectory was undecided at the first horizon and continued.
        steps: the first horizon; ``readout_steps``, ``extend_steps`` as given.
        tol: the attribution tolerance.
    """

    labels: np.ndarray
    candidates: tuple
    is_global: np.ndarray
    final: np.ndarray
    motion_cosine: np.ndarray
    position_cosine: np.ndarray
    extended: np.ndarray
    steps: int
    readout_steps: int
    extend_steps: int
    tol: float

    def fractions(self) -> dict:
        """Fraction of the batch in each basin: ``{"global": …, "local": …, "undecided": …}``.

        Several local candidates are summed under "local"; the values sum to one.
        """
        glob = np.isin(self.labels, np.flatnonzero(self.is_global))
        undecided = self.labels < 0
        return {
            "global": float(np.mean(glob)),
            "local": float(np.mean(~glob & ~undecided)),
            "undecided": float(np.mean(undecided)),
        }

    def kind(self) -> np.ndarray:
        """(B,) ``0`` global, ``1`` local, ``-1`` undecided."""
        glob = np.isin(self.labels, np.flatnonzero(self.is_global))
        return np.where(self.labels < 0, -1, np.where(glob, 0, 1))


def classify_motion(
    prob: TokenSelectionProblem, theta_a, theta_b, candidates, tol: float = MOTION_TOL
) -> tuple[np.ndarray, np.ndarray]:
    """Attribute trajectories to candidates by their motion between two recorded states.

    Args:
        prob: the problem.  theta_a, theta_b: (B, *shape) earlier and later states.
        candidates: K :class:`~attnlib.svm.SelectionReport` (feasible) to attribute to.
        tol: trajectory ``b`` goes to ``k`` if ``1 − cos(θ_b − θ_a, θ_mm(α_k)) ≤ tol`` and
            ``prob.selection(θ_b) = α_k``.

    Returns ``labels`` (B,) (``-1``: none) and ``motion_cosine`` (B, K).
    """
    if not 0 < tol < 1:
        raise ValueError(f"tol must be in (0, 1), got {tol!r}")
    motion = np.asarray(theta_b, float) - np.asarray(theta_a, float)
    sel = prob.selection(theta_b)
    B = motion.shape[0]
    cos = np.empty((B, len(candidates)))
    hit = np.zeros((B, len(candidates)), bool)
    for k, cand in enumerate(candidates):  # K candidates (a handful), each over the whole batch
        with np.errstate(invalid="ignore"):
            cos[:, k] = cosine(motion, cand.solution.theta)
        hit[:, k] = (1.0 - cos[:, k] <= tol) & np.all(sel == np.asarray(cand.select), axis=-1)
    if np.any(hit.sum(axis=1) > 1):
        raise ValueError("tol is too loose: a trajectory matches two candidates")
    labels = np.where(hit.any(axis=1), np.argmax(hit, axis=1), -1)
    return labels, cos


def half_and_final_states(prob, theta0, steps, method, lr):
    """Train ``steps`` and return the states at ``steps // 2`` and ``steps``."""
    half = max(steps // 2, 1)
    traj = train(prob, theta0, steps, method, lr, record_every=half)
    mid = int(np.flatnonzero(traj.steps == half)[0])
    return traj.theta[mid], traj.theta[-1]


def basin_map(
    prob: TokenSelectionProblem,
    theta0,
    steps: int,
    method: str = "ngd",
    lr: float = 0.1,
    candidates=None,
    tol: float = MOTION_TOL,
    readout_steps: int = 0,
    readout_lr: float = 0.5,
    extend_steps: int = 0,
) -> BasinMap:
    """Train every initialisation in ``theta0`` as one batch and map it to its basin.

    Args:
        prob: the problem.  theta0: (B, *shape) initialisations (e.g. a grid).
        steps, method, lr: the optimizer whose basins are mapped.
        candidates: locally-optimal selections (default: all, by enumeration).
        tol: attribution tolerance (:func:`classify_motion`).
        readout_steps: if > 0, continue every trajectory with NGD (``readout_lr``) for this many
            steps and attribute by the motion during the read-out (use it for GD).
        extend_steps: continue the undecided ones with NGD for this many more steps.

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.single_input(local=True)
    >>> m = al.basins.basin_map(prob, al.datasets.SINGLE_INPUT_INITS, steps=400, lr=0.5)
    >>> m.kind().tolist()
    [0, 0, 0, 0, 1, 1]
    """
    step_rule(method)  # a ValueError for an unknown method
    check_schedule(steps, lr, 1)
    if candidates is None:
        candidates = locally_optimal_selections(prob)
    candidates = tuple(candidates)
    if not candidates or not all(isinstance(c, SelectionReport) and c.feasible for c in candidates):
        raise ValueError("candidates must be a non-empty list of feasible SelectionReports")
    theta0 = np.asarray(theta0, float)
    if readout_steps > 0:
        first = train(prob, theta0, steps, method, lr, record_every=max(steps, 1)).final
        a, b = half_and_final_states(prob, first, readout_steps, "ngd", readout_lr)
    else:
        a, b = half_and_final_states(prob, theta0, steps, method, lr)
    labels, mcos = classify_motion(prob, a, b, candidates, tol)
    extended = np.zeros(len(labels), bool)
    final = b.copy()
    undecided = np.flatnonzero(labels < 0)
    if extend_steps > 0 and undecided.size:
        ext_lr = lr if (readout_steps == 0 and method == "ngd") else readout_lr
        a2, b2 = half_and_final_states(prob, b[undecided], extend_steps, "ngd", ext_lr)
        labels[undecided], mcos[undecided] = classify_motion(prob, a2, b2, candidates, tol)
        final[undecided] = b2
        extended[undecided] = True
    pcos = np.stack([cosine(final, c.solution.theta) for c in candidates], axis=-1)
    return BasinMap(
        labels=labels,
        candidates=candidates,
        is_global=np.array([np.array_equal(c.select, prob.opt) for c in candidates]),
        final=final,
        motion_cosine=mcos,
        position_cosine=pcos,
        extended=extended,
        steps=int(steps),
        readout_steps=int(readout_steps),
        extend_steps=int(extend_steps),
        tol=float(tol),
    )


def key_plane_grid(lo: float, hi: float, size: int, dim: int = 3) -> np.ndarray:
    """A ``size × size`` grid of initialisations in the key plane (the first two coordinates).

    Returns (size², dim), zero beyond the first two coordinates, ordered so that
    ``labels.reshape(size, size)[j, i]`` belongs to the start ``(x_i, y_j)`` (the layout that
    :func:`attnlib.figures.common.basin_image` draws), ``x = y = linspace(lo, hi, size)``.

    >>> import attnlib as al
    >>> al.basins.key_plane_grid(0.0, 1.0, 2).tolist()
    [[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [1.0, 1.0, 0.0]]
    """
    if not (isinstance(size, (int, np.integer)) and size >= 2):
        raise ValueError(f"size must be an integer >= 2, got {size!r}")
    if not lo < hi:
        raise ValueError(f"lo must be below hi, got {lo} and {hi}")
    if dim < 2:
        raise ValueError(f"dim must be at least 2, got {dim}")
    axis = np.linspace(lo, hi, size)
    grid = np.zeros((size * size, dim))
    grid[:, 0], grid[:, 1] = (c.ravel() for c in np.meshgrid(axis, axis))
    return grid
