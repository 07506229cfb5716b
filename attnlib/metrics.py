"""Measurements of a trajectory against the max-margin direction.

All functions take parameters with leading batch axes, ``theta`` (*batch, *shape), and return
arrays of shape (*batch,) (or (*batch, n) for per-sample quantities).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .model import TokenSelectionProblem, logsumexp

__all__ = [
    "cosine",
    "one_minus_cosine",
    "direction_error",
    "orthogonal_offset",
    "normalized_margin",
    "selection_mass",
    "log_one_minus_mass",
    "CURVES",
    "curves",
    "offset_exponent",
    "angle_degrees",
    "offset_tolerance",
    "numerical_rank",
    "rotate_toward",
    "rotation_resolution",
]


def _unit_pair(theta, direction):
    direction = np.asarray(direction, float)
    theta = np.asarray(theta, float)
    k = direction.ndim
    if theta.shape[theta.ndim - k :] != direction.shape:
        raise ValueError(f"theta's trailing shape must be {direction.shape}, got {theta.shape}")
    flat = theta.reshape(theta.shape[: theta.ndim - k] + (-1,))
    with np.errstate(invalid="ignore", divide="ignore"):
        unit = flat / np.linalg.norm(flat, axis=-1, keepdims=True)
    return unit, direction.ravel() / np.linalg.norm(direction)


def cosine(theta, direction) -> np.ndarray:
    """``⟨θ, d⟩ / (‖θ‖‖d‖)`` (the "correlation" of [TFSVM]): (*batch,). NaN at θ = 0.

    >>> import attnlib as al
    >>> float(al.cosine([[1.0, 1.0]], [1.0, 0.0])[0])
    0.7071067811865475
    """
    unit, d = _unit_pair(theta, direction)
    return unit @ d


def one_minus_cosine(theta, direction) -> np.ndarray:
    """``1 − cos(θ, d)`` as ``‖θ̂ − d̂‖²/2``: accurate when the two are nearly parallel."""
    unit, d = _unit_pair(theta, direction)
    return 0.5 * np.sum((unit - d) ** 2, axis=-1)


def direction_error(theta, direction) -> np.ndarray:
    """``‖θ/‖θ‖ − d/‖d‖‖`` (Frobenius for matrices): (*batch,)."""
    unit, d = _unit_pair(theta, direction)
    return np.linalg.norm(unit - d, axis=-1)


def orthogonal_offset(theta, direction) -> np.ndarray:
    """Distance of ``θ`` from the line spanned by ``d``: ``‖θ − ⟨θ, d̂⟩ d̂‖``, (*batch,).

    Directional convergence leaves this offset bounded while ‖θ‖ grows, so
    ``1 − cos ≈ offset² / (2‖θ‖²)``: tolerances on cosines are set from it.

    >>> import attnlib as al
    >>> float(al.orthogonal_offset([[3.0, 0.5]], [1.0, 0.0])[0])
    0.5
    """
    direction = np.asarray(direction, float)
    theta = np.asarray(theta, float)
    _unit_pair(theta, direction)  # validates the trailing shape
    flat = theta.reshape(theta.shape[: theta.ndim - direction.ndim] + (-1,))
    unit = direction.ravel() / np.linalg.norm(direction)
    return np.linalg.norm(flat - (flat @ unit)[..., None] * unit, axis=-1)


def _select(prob: TokenSelectionProblem, select) -> np.ndarray:
    return prob.opt if select is None else np.asarray(select)


def normalized_margin(prob: TokenSelectionProblem, theta, select=None) -> np.ndarray:
    """``γ(θ) = min_{i, t≠α_i} ⟨θ, A_iα_i − A_it⟩ / ‖θ‖``; tends to ``1/‖θ_mm(α)‖`` [FAST]."""
    flat, batch = prob.flatten(theta)
    sel = _select(prob, select)
    logits = prob.logits(theta)
    chosen = np.take_along_axis(logits, np.broadcast_to(sel, batch + (prob.n,))[..., None], axis=-1)
    diff = chosen - logits
    mask = np.arange(prob.T) != np.asarray(sel)[..., None]
    smallest = np.min(np.where(mask, diff, np.inf), axis=(-2, -1))
    return smallest / np.linalg.norm(flat, axis=-1)


def selection_mass(prob: TokenSelectionProblem, theta, select=None) -> np.ndarray:
    """Softmax probability of the selected token, ``σ_iα_i``: (*batch, n)."""
    _, batch = prob.flatten(theta)
    sel = np.broadcast_to(_select(prob, select), batch + (prob.n,))
    return np.exp(np.take_along_axis(prob.log_attention(theta), sel[..., None], axis=-1)[..., 0])


def log_one_minus_mass(prob: TokenSelectionProblem, theta, select=None) -> np.ndarray:
    """``log(1 − σ_iα_i) = logsumexp_{t≠α_i} log σ_it``: (*batch, n).

    Exact where ``1 − σ`` is far below machine epsilon (it underflows to 0 if computed directly).
    """
    _, batch = prob.flatten(theta)
    sel = np.broadcast_to(_select(prob, select), batch + (prob.n,))
    log_sigma = prob.log_attention(theta)
    others = np.where(np.arange(prob.T) == sel[..., None], -np.inf, log_sigma)
    return logsumexp(others, axis=-1)


# ---------------------------------------------------------------------- rate curves of a batch
CURVES = (
    "direction_error",
    "one_minus_corr",
    "margin_gap",
    "log_mass",
    "sparsity_rate",
    "log_gap",
    "norm",
    "selects_opt",
)


def curves(
    problems: Sequence[TokenSelectionProblem],
    traj,
    solutions: Sequence,
) -> dict[str, np.ndarray]:
    """The rate metrics of each problem's trajectory, as (R, S) arrays.

    ``traj``: an :class:`attnlib.optim.Trajectory` of S trajectories, one per problem;
    ``solutions``: each problem's :class:`attnlib.svm.MaxMarginSolution`, or ``None``.

    Keys: ``direction_error`` ``‖W_t/‖W_t‖ − W_mm/‖W_mm‖‖``; ``one_minus_corr``; ``margin_gap``
    ``1/‖W_mm‖ − γ(W_t)``; ``log_mass`` ``log max_i(1 − σ_i,opt)`` (log space: it underflows
    otherwise); ``sparsity_rate`` ``−log max_i(1 − σ_i,opt)/‖W_t‖`` (tends to ``1/‖W_mm‖``);
    ``log_gap`` ``log(L − L*)``; ``norm`` ``‖W_t‖``; ``selects_opt`` (1.0 where every sample
    attends most to its optimal token). Columns of problems whose solution is ``None``
    (an infeasible W-SVM) are NaN for the metrics that need ``W_mm``.
    """
    problems = list(problems)
    R, S = traj.theta.shape[:2]
    if len(problems) != S or len(solutions) != S:
        raise ValueError(f"need {S} problems and {S} solutions (one per trajectory)")
    out = {key: np.full((R, S), np.nan) for key in CURVES}
    out["norm"] = traj.norm
    out["log_gap"] = np.array(traj.log_gap)
    for s, (prob, sol) in enumerate(zip(problems, solutions)):
        theta = traj.theta[:, s]
        with np.errstate(invalid="ignore", divide="ignore"):
            out["log_mass"][:, s] = np.max(log_one_minus_mass(prob, theta), axis=-1)
            out["sparsity_rate"][:, s] = -out["log_mass"][:, s] / out["norm"][:, s]
            out["selects_opt"][:, s] = np.all(prob.selection(theta) == prob.opt, axis=-1)
            if sol is not None:
                out["direction_error"][:, s] = direction_error(theta, sol.theta)
                out["one_minus_corr"][:, s] = one_minus_cosine(theta, sol.theta)
                out["margin_gap"][:, s] = sol.margin - normalized_margin(prob, theta)
    return out


def offset_exponent(theta_from, theta_to, direction) -> np.ndarray:
    """How the orthogonal offset grows with the norm between two iterates: (*batch,).

    .. math::

        e = \\frac{\\log\\big(\\mathrm{off}(\\theta_{to}) / \\mathrm{off}(\\theta_{from})\\big)}
                 {\\log\\big(\\lVert\\theta_{to}\\rVert / \\lVert\\theta_{from}\\rVert\\big)},
        \\qquad \\mathrm{off}(\\theta) = \\lVert\\theta - \\langle\\theta, \\hat d\\rangle \\hat d\\rVert .

    Directional convergence to ``direction`` with a bounded offset ([MMTS]) gives ``e → 0``; a
    trajectory heading for a fixed wrong direction has an offset proportional to its norm, ``e → 1``.
    So ``1 − cos ≈ off²/(2‖θ‖²)`` falls like ``‖θ‖^(2e − 2)``. ``theta_from``, ``theta_to``:
    (*batch, *shape), the later iterate of larger norm; ``direction``: (*shape).

    >>> import numpy as np, attnlib as al
    >>> d = np.array([1.0, 0.0])
    >>> offset_exponent([[10.0, 2.0], [10.0, 2.0]], [[40.0, 2.0], [40.0, 8.0]], d).round(6).tolist()
    [0.0, 1.0]
    """
    a = orthogonal_offset(theta_from, direction)
    b = orthogonal_offset(theta_to, direction)
    flat_a = np.asarray(theta_from, float).reshape(np.shape(a) + (-1,))
    flat_b = np.asarray(theta_to, float).reshape(np.shape(b) + (-1,))
    growth = np.log(np.linalg.norm(flat_b, axis=-1) / np.linalg.norm(flat_a, axis=-1))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(b / a) / growth


def angle_degrees(theta, direction) -> np.ndarray:
    """Angle between ``theta`` (*batch, d) and ``direction`` (d,) in degrees: (*batch,).

    Computed as ``2 arcsin(‖θ̂ − d̂‖/2)``, accurate for tiny angles (``arccos`` of a cosine near 1
    is not).

    >>> import attnlib as al
    >>> [round(float(a), 6) for a in al.angle_degrees([[1.0, 1.0], [0.0, 2.0]], [1.0, 0.0])]
    [45.0, 90.0]
    """
    err = np.asarray(direction_error(theta, direction))
    return np.degrees(2.0 * np.arcsin(np.clip(err / 2.0, 0.0, 1.0)))


def offset_tolerance(steps, theta, direction, slack: float = 1.5, floor: float = 1e-14):
    """Directional convergence with a bounded offset, tested at the last record: ``(1 − cos, tol, c)``.

    If ``θ(t) = a(t) d̂ + o(t)`` with a bounded offset ``o`` while ``‖θ‖`` grows, then
    ``1 − cos(θ, d) ≈ ‖o‖² / (2‖θ‖²)`` (``‖o‖`` is :func:`orthogonal_offset`). The offset is bounded by
    what it was over ``[T/4, T/2]``: ``B = max ‖o(t)‖`` there, and the tolerance at ``T`` is
    ``tol = (slack·B)² / (2‖θ(T)‖²)`` (at least ``floor``, float rounding). A run converging to
    another direction has an offset that grows like ``‖θ‖`` (doubling from ``T/2`` to ``T`` under
    NGD) and fails for ``slack < 2``; a max over a window, not one record, because the offset can
    pass near zero while it settles.

    Args:
        steps: (R,) recorded iterations (with records inside ``[T/4, T/2]``).
        theta: (R, *batch, d) recorded parameters.  direction: (d,) the predicted limit.

    Returns:
        ``(one_minus_cos, tol, offset_bound)``, each (*batch,): ``1 − cos`` at the last record, its
        tolerance, and the offset bound ``c = slack·B`` it was computed from.

    >>> import numpy as np, attnlib as al
    >>> t = np.arange(0, 101)
    >>> good = np.stack([t + 1.0, np.ones_like(t)], -1)  # offset 1, norm ~ t
    >>> bad = np.stack([t + 1.0, 0.2 * (t + 1.0)], -1)  # another direction
    >>> [bool(a <= b) for a, b, _ in [offset_tolerance(t, good, [1, 0]), offset_tolerance(t, bad, [1, 0])]]
    [True, False]
    """
    steps = np.asarray(steps)
    theta = np.asarray(theta, float)
    if steps.ndim != 1 or theta.shape[0] != steps.size:
        raise ValueError(f"steps (R,) and theta (R, ...) must have the same length, got {steps.shape}, {theta.shape}")
    T = steps[-1]
    lo, hi = np.searchsorted(steps, [T / 4, T / 2])
    if hi < lo or steps[lo] > T / 2:
        raise ValueError("offset_tolerance needs at least one record inside [T/4, T/2]")
    B = np.max(orthogonal_offset(theta[lo : hi + 1], direction), axis=0)
    final = theta[-1]
    tol = np.maximum((slack * B) ** 2 / (2.0 * np.linalg.norm(final, axis=-1) ** 2), floor)
    return one_minus_cosine(final, direction), tol, slack * B


def numerical_rank(singular_values, tol: float) -> np.ndarray:
    """Number of singular values above ``tol`` times the largest: (*batch,); ``-1`` where NaN (infeasible).

    Args: ``singular_values`` (*batch, k), sorted decreasingly (NaN rows for infeasible instances).
    """
    s = np.asarray(singular_values, float)
    rank = np.sum(s > tol * s[..., :1], axis=-1)
    return np.where(np.isnan(s[..., 0]), -1, rank)


# -- the power of a direction check (issue 22): how small a rotation of its reference it detects --


def rotate_toward(reference, toward, degrees: float) -> np.ndarray:
    """``reference`` rotated by ``degrees`` in the plane it spans with ``toward`` (norm kept; any shape).

    The rotation moves ``reference`` toward the component of ``toward`` orthogonal to it; matrices
    are rotated as flattened vectors (Frobenius geometry).

    >>> from attnlib.metrics import rotate_toward
    >>> rotate_toward([2.0, 0.0], [0.0, 1.0], 90.0).round(12)
    array([0., 2.])
    """
    reference = np.asarray(reference, float)
    toward = np.asarray(toward, float)
    if toward.shape != reference.shape:
        raise ValueError(f"toward must have the reference's shape {reference.shape}, got {toward.shape}")
    r = reference.ravel()
    size = np.linalg.norm(r)
    u = r / size
    w = toward.ravel() - (toward.ravel() @ u) * u
    if np.linalg.norm(w) <= 1e-12 * np.linalg.norm(toward):
        raise ValueError("toward must not be parallel to the reference: it spans no plane with it")
    w /= np.linalg.norm(w)
    angle = np.radians(degrees)
    return (size * (np.cos(angle) * u + np.sin(angle) * w)).reshape(reference.shape)


def rotation_resolution(
    passes,
    reference,
    toward=None,
    *,
    max_degrees: float = 90.0,
    tol_degrees: float = 1e-3,
    seed: int = 0,
    rotate=rotate_toward,
) -> float:
    """The smallest rotation of ``reference`` (degrees) that a direction check detects.

    ``passes(candidate) -> bool`` evaluates the check's statistic with ``candidate`` in place of
    its reference and applies the check's own predicate. The reference is rotated in the plane it
    spans with ``toward`` (a list of such directions: the largest resolution over the planes, i.e. an
    angle detected in every plane tried; default one random plane drawn from ``seed``). A log-spaced
    scan from ``tol_degrees`` finds the first detected angle, bisection refines it to
    ``tol_degrees``. Returns ``inf`` if no rotation up to ``max_degrees`` is detected, and NaN if
    the unrotated reference itself fails (so a failed check still records, and fails, as itself).
    ``rotate(reference, toward, degrees)`` (default
    :func:`rotate_toward`) may rotate a stack of references one by one (a check over many runs,
    each with its own reference).

    >>> from attnlib.metrics import one_minus_cosine, rotation_resolution
    >>> theta = [10.0, 0.1]                       # a run 0.57 degrees off the reference (1, 0)
    >>> check = lambda ref: float(one_minus_cosine([theta], ref)[0]) <= 1e-3
    >>> round(rotation_resolution(check, [1.0, 0.0], [0.0, -1.0]), 2)  # 1 - cos <= 1e-3 allows 2.56 degrees
    1.99
    >>> round(rotation_resolution(check, [1.0, 0.0], [[0.0, -1.0], [0.0, 1.0]]), 2)  # through the run: 0.57 + 2.56
    3.14
    """
    reference = np.asarray(reference, float)
    if not passes(reference):  # the check fails on the truth: it resolves nothing (the check's verdict says so)
        return math.nan
    if toward is None:
        toward = [np.random.default_rng(seed).standard_normal(reference.shape)]
    elif np.asarray(toward, float).shape == reference.shape:
        toward = [toward]
    worst = 0.0
    for direction in toward:
        direction = np.asarray(direction, float)
        angles = np.geomspace(tol_degrees, max_degrees, 64)
        hi = next((a for a in angles if not passes(rotate(reference, direction, a))), None)
        if hi is None:
            return math.inf
        lo = float(angles[np.searchsorted(angles, hi) - 1]) if hi > angles[0] else 0.0
        while hi - lo > tol_degrees:
            mid = 0.5 * (lo + hi)
            if passes(rotate(reference, direction, mid)):
                lo = mid
            else:
                hi = mid
        worst = max(worst, float(hi))
    return worst
