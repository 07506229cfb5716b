"""Joint training of the attention ``p`` and the head ``v`` (THEORY §7, [MMTS]).

Trained together, ``v`` tends to the label SVM on the selected tokens, and ``p`` to an attention
SVM whose constraints the label SVM's *support vectors* decide:

- the **full** p-SVM (ATT-SVM of the selection): margin-1 rows for every sample;
- the **relaxed** p-SVM: margin-1 rows only for the support vectors ``S`` of the label SVM, and
  ``⟨p, k_iα_i − k_it⟩ ≥ 0`` (select, no margin) for ``i ∉ S``.

:func:`joint_svms` computes ``S`` from the label SVM (never hard-coded) and solves both.

Beyond the paper, :func:`balanced_direction` gives the direction predicted for ``p`` when ``‖v‖``
and ``‖p‖`` grow at a fixed ratio ``ρ = ‖v‖/‖p‖`` (joint NGD with one step size has ``ρ → 1``).
It is this book's first-order derivation, not a result of [MMTS]: with ``v = r v̂`` and ``p = R p̂``
the loss of sample ``i`` exceeds its floor by terms ``∝ exp(−(r m_i + R⟨p̂, k_iα_i − k_it⟩))``,
where ``m_i = y_i⟨v̂, x_iα_i⟩`` is the label margin, so ``p̂`` maximises the smallest exponent:

.. math::

    \\hat p(ρ) = \\arg\\max_{‖p‖ ≤ 1} \\min_{i, t ≠ α_i}
    \\big(⟨p, k_{iα_i} − k_{it}⟩ + ρ (m_i − \\min_j m_j)\\big)
    \\quad \\text{s.t.} \\quad ⟨p, k_{iα_i} − k_{it}⟩ ≥ 0 .

``ρ = 0`` gives the full p-SVM direction, ``ρ → ∞`` the relaxed one; in between, samples whose
label margin exceeds the smallest one by less than their attention deficit still pull ``p``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .metrics import direction_error
from .model import token_selection
from .svm import LabelSVM, MaxMarginSolution, label_svm, max_margin

__all__ = [
    "JointSVMs",
    "joint_svms",
    "balanced_direction",
    "random_joint_tokens",
    "angle_degrees",
    "classify_alignment",
    "ALIGNMENT_CLASSES",
]

#: Labels returned by :func:`classify_alignment`.
ALIGNMENT_CLASSES = ("relaxed", "full", "neither", "same")


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


@dataclass(frozen=True, eq=False)
class JointSVMs:
    """The label SVM of the selected tokens and the two attention SVMs it decides between.

    Attributes:
        label: the label SVM ``v_mm`` on ``x_iα_i`` (:class:`LabelSVM`).
        support: (n,) bool, the support vectors ``S`` of the label SVM (computed).
        full: ATT-SVM of the selection, margin-1 rows for every sample.
        relaxed: ATT-SVM with the rows of ``i ∉ S`` relaxed to ``≥ 0``.
        select: (n,) the selected token of each sample.
        keys: (n, T, d_k) ``k_it = W x_it``.
        label_margins: (n,) ``m_i = y_i⟨v̂_mm, x_iα_i⟩`` with ``v̂_mm`` of unit norm.
    """

    label: LabelSVM
    support: np.ndarray
    full: MaxMarginSolution
    relaxed: MaxMarginSolution
    select: np.ndarray
    keys: np.ndarray
    label_margins: np.ndarray

    @property
    def separation(self) -> float:
        """Angle between the full and the relaxed p-SVM directions, in degrees."""
        return float(angle_degrees(self.full.theta, self.relaxed.theta))


def _selection(select, n: int, T: int) -> np.ndarray:
    sel = np.full(n, select) if np.ndim(select) == 0 else np.asarray(select)
    if sel.shape != (n,) or not np.issubdtype(sel.dtype, np.integer):
        raise ValueError(f"select must be a token index or {n} integer indices, got {select!r}")
    if np.any((sel < 0) | (sel >= T)):
        raise ValueError(f"select must hold token indices in [0, {T - 1}], got {sel.tolist()}")
    return sel


def joint_svms(X, y, select, W=None) -> JointSVMs:
    """Label SVM, its support set ``S`` and the full and relaxed p-SVMs (THEORY §2, §7).

    Args:
        X: (n, T, d) tokens.  y: (n,) labels ±1.
        select: one token index for every sample, or (n,) indices: the selected tokens ``α``.
        W: (d_k, d) key matrix (identity if None): the p-SVMs use the keys ``k_it = W x_it``.

    Raises:
        InfeasibleError: the label SVM or a p-SVM is infeasible.

    >>> import attnlib as al
    >>> X, y = al.datasets.joint_tokens(relaxed=True)
    >>> svms = al.joint_svms(X, y, select=1)
    >>> svms.support.tolist(), [round(float(c), 4) + 0.0 for c in svms.relaxed.theta]
    ([True, True, False], [1.0, 0.0])
    """
    X = np.asarray(X, float)
    if X.ndim != 3:
        raise ValueError(f"X must be a 3-D array (n, T, d), got shape {X.shape}")
    n, T, d = X.shape
    y = np.asarray(y, float)
    sel = _selection(select, n, T)
    W = np.eye(d) if W is None else np.asarray(W, float)
    if W.ndim != 2 or W.shape[1] != d:
        raise ValueError(f"W must have shape (d_k, {d}), got {W.shape}")
    chosen = X[np.arange(n), sel]
    label = label_svm(chosen, y)
    keys = X @ W.T
    # ATT-SVM depends only on the keys and the selection; one-hot scores make ``sel`` the optimum.
    onehot = np.zeros((n, T))
    onehot[np.arange(n), sel] = 1.0
    prob = token_selection(keys, onehot)
    full = max_margin(prob, sel)
    relaxed = max_margin(prob, sel, relax=~label.support)
    margins = y * (chosen @ label.v) / np.linalg.norm(label.v)
    return JointSVMs(label, label.support.copy(), full, relaxed, sel, keys, margins)


def balanced_direction(svms: JointSVMs, rho: float = 1.0) -> np.ndarray:
    """Unit direction ``p̂(ρ)`` predicted for ``p`` when ``‖v‖/‖p‖ → ρ`` (module docstring).

    A second-order cone program (cvxpy, CLARABEL). ``rho = 0`` returns the full p-SVM direction;
    a large ``rho`` the relaxed one. This is a derivation of this book, not a result of [MMTS].

    >>> import attnlib as al
    >>> X, y = al.datasets.joint_tokens(third=(0.5, 1.2))
    >>> p = al.balanced_direction(al.joint_svms(X, y, select=1), rho=1.0)
    >>> [round(float(c), 3) for c in p]
    [0.991, 0.134]
    """
    import cvxpy as cp

    if not np.isfinite(rho) or rho < 0:
        raise ValueError(f"rho must be a finite number >= 0, got {rho!r}")
    n, T, dk = svms.keys.shape
    rows = np.ones((n, T), bool)
    rows[np.arange(n), svms.select] = False
    diffs = (svms.keys[np.arange(n), svms.select][:, None, :] - svms.keys)[rows]
    shift = (rho * (svms.label_margins - svms.label_margins.min()))[:, None] * np.ones((1, T))
    p, tau = cp.Variable(dk), cp.Variable()
    constraints = [diffs @ p + shift[rows] >= tau, diffs @ p >= 0, cp.norm(p) <= 1]
    problem = cp.Problem(cp.Maximize(tau), constraints)
    problem.solve(solver=cp.CLARABEL)
    if problem.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE):
        raise RuntimeError(f"balanced direction: solver status {problem.status!r}")
    p = np.asarray(p.value, float)
    return p / np.linalg.norm(p)


def random_joint_tokens(
    n: int = 6,
    d: int = 2,
    seed=0,
    tight: int | None = None,
    gap=(0.2, 1.0),
    attention=(0.3, 1.5),
    noise: float = 0.3,
) -> tuple[np.ndarray, np.ndarray]:
    """Random joint-training data in the shape of [MMTS] Fig. 3: ``(X, y)``, ``X`` (n, 2, d).

    Every sample has a zero token ``(0, …, 0)`` (index 0; key and value 0 whatever ``v``) and a
    relevant token (index 1)

    .. math::  x_i = a_i e_1 + y_i m_i e_2 + ε_i, \\qquad ε_i ⊥ e_1, e_2,

    with attention component ``a_i ~ U(attention)`` (positive, so the p-SVMs are feasible),
    planted label margin ``m_i = 1`` for ``tight`` samples and ``1 + U(gap)`` for the others (some
    samples have a larger label margin than others), and ``ε_i ~ noise·N(0, I)`` in the remaining
    ``d − 2`` coordinates. Labels are ±1 with both present. The planted margins are a recipe: the
    support set is what :func:`joint_svms` computes.

    Args:
        n: samples (>= 2).  d: token dimension (>= 2).  seed: an int or ``numpy.random.Generator``.
        tight: samples planted at margin 1 (default ``n // 2``, at least 1).

    >>> import attnlib as al
    >>> X, y = al.random_joint_tokens(n=5, seed=1)
    >>> X.shape, y.shape, bool((X[:, 0] == 0).all())
    ((5, 2, 2), (5,), True)
    """
    for name, value, low in (("n", n, 2), ("d", d, 2)):
        if not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    tight = max(1, n // 2) if tight is None else tight
    if not isinstance(tight, (int, np.integer)) or not 1 <= tight <= n:
        raise ValueError(f"tight must be an integer in [1, {n}], got {tight!r}")
    lo, hi = gap
    if not 0 <= lo <= hi:
        raise ValueError(f"gap must be (low, high) with 0 <= low <= high, got {gap!r}")
    a_lo, a_hi = attention
    if not 0 < a_lo <= a_hi:
        raise ValueError(f"attention must be (low, high) with 0 < low <= high, got {attention!r}")
    rng = np.random.default_rng(seed)
    y = rng.choice([-1.0, 1.0], size=n)
    y[:2] = (1.0, -1.0)
    margins = np.ones(n)
    margins[tight:] += rng.uniform(lo, hi, size=n - tight)
    X = np.zeros((n, 2, d))
    X[:, 1, 0] = rng.uniform(a_lo, a_hi, size=n)
    X[:, 1, 1] = y * margins
    X[:, 1, 2:] = noise * rng.standard_normal((n, d - 2))
    perm = rng.permutation(n)
    return X[perm], y[perm]


def classify_alignment(p, svms: JointSVMs, fraction: float = 0.25, min_separation: float = 2.0) -> np.ndarray:
    """Which p-SVM each ``p`` (*batch, d_k) follows: "relaxed", "full", "neither" or "same".

    With ``Δ`` the angle between the two SVM directions: "relaxed" if ``∠(p, p_relax) ≤
    fraction·Δ``, "full" if ``∠(p, p_full) ≤ fraction·Δ``, "neither" otherwise, and "same" for
    every ``p`` when ``Δ < min_separation`` degrees (the two predictions cannot be told apart).
    With ``fraction ≤ 1/4``, a "relaxed" ``p`` is (triangle inequality) at least three times
    closer in angle to the relaxed direction than to the full one.

    >>> import attnlib as al
    >>> X, y = al.datasets.joint_tokens(relaxed=True)
    >>> al.classify_alignment([[1.0, 0.01], [1.25, 0.25], [1.1, 0.12]], al.joint_svms(X, y, 1)).tolist()
    ['relaxed', 'full', 'neither']
    """
    if not 0 < fraction < 0.5:
        raise ValueError(f"fraction must be in (0, 0.5) so that the classes are disjoint, got {fraction!r}")
    to_relaxed = angle_degrees(p, svms.relaxed.theta)
    to_full = angle_degrees(p, svms.full.theta)
    sep = svms.separation
    out = np.full(np.shape(to_relaxed), "neither", dtype="<U7")
    if sep < min_separation:
        out[...] = "same"
        return out
    out[to_relaxed <= fraction * sep] = "relaxed"
    out[to_full <= fraction * sep] = "full"
    return out
