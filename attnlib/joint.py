"""Joint training of the attention ``p`` and the head ``v`` ([MMTS], joint training).

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
from scipy.special import log_expit

from .losses import Loss, get_loss
from .metrics import direction_error, one_minus_cosine, orthogonal_offset
from .model import JointAttention, check_labels, log_softmax, logsumexp, token_selection
from .paths import check_radii, direction_bound
from .svm import LabelSVM, MaxMarginSolution, label_svm, least_distance_nnls, max_margin

__all__ = [
    "JointSVMs",
    "joint_svms",
    "balanced_direction",
    "random_joint_tokens",
    "angle_degrees",
    "classify_alignment",
    "ALIGNMENT_CLASSES",
    "offset_tolerance",
    "RandomJointRuns",
    "random_joint_runs",
    "StackedJointAttention",
    "train_joint_stack",
    "truncate_joint",
    "JointPath",
    "joint_regularization_path",
    "joint_log_gap",
    "joint_log_loss",
    "joint_path_bounds",
    "selected_mass",
    "classifier_confidence",
    "arc_position",
    "train_joint_ratio",
    "joint_path_rows",
    "joint_path_table",
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
    """Label SVM, its support set ``S`` and the full and relaxed p-SVMs ([MMTS], joint training).

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

    A second-order cone program, ``max τ`` s.t. ``⟨p, k_iα_i − k_it⟩ + ρ(m_i − min_j m_j) ≥ τ``,
    ``⟨p, k_iα_i − k_it⟩ ≥ 0``, ``‖p‖ ≤ 1``, solved exactly by bisection on ``τ`` over least-distance
    problems (:func:`_balanced_by_bisection`; no cvxpy import), with cvxpy (CLARABEL) as the
    fallback when that answer cannot be certified. ``rho = 0`` returns the full p-SVM direction;
    a large ``rho`` the relaxed one. This is a derivation of this book, not a result of [MMTS].

    >>> import attnlib as al
    >>> X, y = al.datasets.joint_tokens(third=(0.5, 1.2))
    >>> p = al.balanced_direction(al.joint_svms(X, y, select=1), rho=1.0)
    >>> [round(float(c), 3) for c in p]
    [0.991, 0.134]
    """
    if not np.isfinite(rho) or rho < 0:
        raise ValueError(f"rho must be a finite number >= 0, got {rho!r}")
    n, T, dk = svms.keys.shape
    rows = np.ones((n, T), bool)
    rows[np.arange(n), svms.select] = False
    diffs = (svms.keys[np.arange(n), svms.select][:, None, :] - svms.keys)[rows]
    shift = (rho * (svms.label_margins - svms.label_margins.min()))[:, None] * np.ones((1, T))
    exact = _balanced_by_bisection(diffs, shift[rows])
    if exact is not None:
        return exact
    import cvxpy as cp

    p, tau = cp.Variable(dk), cp.Variable()
    constraints = [diffs @ p + shift[rows] >= tau, diffs @ p >= 0, cp.norm(p) <= 1]
    problem = cp.Problem(cp.Maximize(tau), constraints)
    problem.solve(solver=cp.CLARABEL)
    if problem.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE):
        raise RuntimeError(f"balanced direction: solver status {problem.status!r}")
    p = np.asarray(p.value, float)
    return p / np.linalg.norm(p)


def _min_norm_point(D: np.ndarray, h: np.ndarray):
    """``argmin ‖p‖`` s.t. ``D p ≥ h`` (Lawson–Hanson's least-distance problem via NNLS), or None if infeasible."""
    if not np.any(h > 0):
        return np.zeros(D.shape[1])
    solved = least_distance_nnls(D, h)
    if solved is None:
        return None
    _, r = solved
    if not np.isfinite(r).all() or -r[-1] <= 1e-12:
        return None
    return -r[:-1] / r[-1]


def _balanced_by_bisection(D: np.ndarray, s: np.ndarray, rtol: float = 1e-13):
    """Unit ``p`` maximising ``min(D p + s)`` s.t. ``D p ≥ 0``, ``‖p‖ ≤ 1``; None if not certified.

    For a level ``τ`` the constraints ``D p ≥ max(τ − s, 0)`` have a least-norm point whose norm
    grows with ``τ``; the optimum ``τ*`` is the largest level where it is ``≤ 1``, and there the
    least-norm point (unique) is the optimal ``p``. Bisection on ``τ`` between 0 (``p = 0``) and
    ``min_i(s_i + ‖D_i‖)`` (above it row ``i`` is unreachable in the unit ball). The answer is
    returned only if it attains the bracket's level, is feasible, and ``τ* > 0``.
    """
    lo, hi = 0.0, float(np.min(s + np.linalg.norm(D, axis=1)))
    for _ in range(200):
        if hi - lo <= rtol * max(1.0, hi):
            break
        mid = 0.5 * (lo + hi)
        p = _min_norm_point(D, np.maximum(mid - s, 0.0))
        if p is not None and np.linalg.norm(p) <= 1.0:
            lo = mid
        else:
            hi = mid
    p = _min_norm_point(D, np.maximum(lo - s, 0.0))
    if p is None or lo <= 1e-9 or not np.isfinite(p).all() or np.linalg.norm(p) == 0:
        return None
    p = p / np.linalg.norm(p)
    scale = max(1.0, float(np.abs(D).max()))
    if np.min(D @ p) < -1e-9 * scale or np.min(D @ p + s) < lo - 1e-8 * scale:
        return None
    return p


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
    >>> [bool(a <= b) for a, b, _ in [al.offset_tolerance(t, good, [1, 0]), al.offset_tolerance(t, bad, [1, 0])]]
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


@dataclass(frozen=True, eq=False)
class RandomJointRuns:
    """Joint NGD on random instances (:func:`random_joint_runs`), one row per run.

    Per instance ``k`` (K of them): ``svms[k]`` (:class:`JointSVMs`) and ``predicted[k]`` (d_k,),
    the direction ``p̂(1)`` of :func:`balanced_direction`. Per run (K·B rows, instance-major;
    ``init == 0`` is the paper's initialisation): ``instance``, ``init``, ``p`` (d_k,) final,
    ``observed`` / ``expected`` alignment classes of ``p`` and of ``p̂(1)``
    (:func:`classify_alignment`), ``v_gap`` / ``v_tol`` (:func:`offset_tolerance` of ``v`` against
    ``v_mm``), ``sv_mass`` / ``other_mass`` (smallest softmax probability of the selected token over
    support-vector inputs / over the other inputs, NaN if none), ``on_selection`` (every input
    puts more than half of its attention on its selected token at the end), ``zero_row`` (per
    instance: a "select, no margin" row is active in ``p̂(1)``).
    """

    svms: tuple
    predicted: np.ndarray
    instance: np.ndarray
    init: np.ndarray
    p: np.ndarray
    observed: np.ndarray
    expected: np.ndarray
    v_gap: np.ndarray
    v_tol: np.ndarray
    sv_mass: np.ndarray
    other_mass: np.ndarray
    on_selection: np.ndarray
    zero_row: np.ndarray


def random_joint_runs(
    seed,
    instances: int,
    n: int = 6,
    inits: int = 3,
    steps: int = 1000,
    lr: float = 0.1,
    loss: str = "logistic",
    records: int = 40,
) -> RandomJointRuns:
    """Joint NGD on ``instances`` random instances of :func:`random_joint_tokens` (selection: token 1).

    Instance ``k`` is ``random_joint_tokens(n, d=2, seed=[seed, k])``; its ``inits`` initialisations
    (one batch) are the paper's ``p(0) = (0, −1)``, ``v(0) = (−1, 0)`` and ``inits − 1`` draws of
    ``N(0, I)`` for each of ``p`` and ``v`` (``numpy.random.default_rng(seed)``). Every run is
    recorded at ``records`` evenly spaced iterations, enough for :func:`offset_tolerance`.
    All instances train together as one batch (:func:`train_joint_stack`, one data set per row).

    >>> import attnlib as al
    >>> runs = al.random_joint_runs(seed=0, instances=2, inits=2, steps=200)
    >>> runs.p.shape, runs.instance.tolist(), runs.init.tolist()
    ((4, 2), [0, 0, 1, 1], [0, 1, 0, 1])
    """
    from .datasets import JOINT_P0, JOINT_V0

    if not isinstance(instances, (int, np.integer)) or instances < 1:
        raise ValueError(f"instances must be an integer >= 1, got {instances!r}")
    if not isinstance(inits, (int, np.integer)) or inits < 1:
        raise ValueError(f"inits must be an integer >= 1, got {inits!r}")
    if not isinstance(records, (int, np.integer)) or records < 4:
        raise ValueError(f"records must be an integer >= 4, got {records!r}")
    rng = np.random.default_rng(seed)
    rows = {k: [] for k in RandomJointRuns.__dataclass_fields__ if k not in ("svms", "predicted", "zero_row")}
    all_svms, predicted, zero_row, datasets, P, V = [], [], [], [], [], []
    for k in range(instances):
        X, y = random_joint_tokens(n=n, d=2, seed=[seed, k])
        svms = joint_svms(X, y, select=1)
        datasets.append((X, y))
        all_svms.append(svms)
        predicted.append(balanced_direction(svms, rho=1.0))
        P.append(np.vstack([JOINT_P0, rng.standard_normal((inits - 1, 2))]))
        V.append(np.vstack([JOINT_V0, rng.standard_normal((inits - 1, 2))]))
    # every instance's batch in one run (one data set per row)
    trajs = train_joint_stack(
        datasets, np.stack(P), np.stack(V), steps, loss=loss, lr=lr, record_every=max(1, steps // records)
    )
    for k, (svms, p_hat, traj) in enumerate(zip(all_svms, predicted, trajs)):
        v_gap, v_tol, _ = offset_tolerance(traj.steps, traj.v, svms.label.v)
        mass = np.exp(traj.problem.log_attention(traj.p[-1])[..., 1])  # (B, n)
        rows["instance"].append(np.full(inits, k))
        rows["init"].append(np.arange(inits))
        rows["p"].append(traj.p[-1])
        rows["observed"].append(classify_alignment(traj.p[-1], svms))
        rows["expected"].append(np.full(inits, classify_alignment(p_hat, svms)[()]))
        rows["v_gap"].append(v_gap)
        rows["v_tol"].append(v_tol)
        rows["sv_mass"].append(mass[:, svms.support].min(-1))
        rows["other_mass"].append(mass[:, ~svms.support].min(-1) if (~svms.support).any() else np.full(inits, np.nan))
        rows["on_selection"].append(np.all(mass > 0.5, axis=-1))
        zero_row.append(bool(np.min((svms.keys[:, 1] - svms.keys[:, 0]) @ p_hat) < 1e-6))
    out = {key: np.concatenate(value) for key, value in rows.items()}
    return RandomJointRuns(svms=tuple(all_svms), predicted=np.array(predicted), zero_row=np.array(zero_row), **out)


# ---------------------------------------------------------------------- batched training over data sets


@dataclass(frozen=True, eq=False)
class StackedJointAttention(JointAttention):
    """:class:`JointAttention` with one data set per batch row: ``X`` (R, n, T, d), ``y`` (R, n).

    Methods take ``p`` (*batch, R, d_k) and ``v`` (*batch, R, d): row ``r`` of the parameters is
    trained on data set ``r``, so trajectories on different data sets (same ``n``, ``T``, ``d``) step
    together as one batch (:func:`train_joint_stack`), as :func:`attnlib.stack_problems` does for
    fixed-head problems.
    """

    #: the data axes lead ``X`` and ``keys``: the inherited methods contract row by row.
    _data_axes = "..."

    def __post_init__(self):
        X = np.asarray(self.X, float)
        if X.ndim != 4:
            raise ValueError(f"X must be a 4-D array (R, n, T, d), got shape {X.shape}")
        y = check_labels(self.y, X.shape[:2])
        W = np.asarray(self.W, float)
        if W.ndim != 2 or W.shape[1] != X.shape[3]:
            raise ValueError(f"W must have shape (d_k, {X.shape[3]}), got {W.shape}")
        object.__setattr__(self, "X", X)
        object.__setattr__(self, "y", y)
        object.__setattr__(self, "W", W)
        object.__setattr__(self, "loss", get_loss(self.loss))


def train_joint_stack(datasets, p0, v0, steps: int, W=None, loss: str = "logistic", **options) -> list:
    """:func:`attnlib.train_joint` on several data sets at once: one batched run, one trajectory each.

    Args:
        datasets: sequence of ``(X, y)`` with the same ``X.shape`` (n, T, d).
        p0: (d_k,), (B, d_k) (the same starts for every data set) or (S, B, d_k) (one batch per data
            set); ``v0`` likewise with ``d``.
        steps, W, loss: as in :func:`attnlib.train_joint`.
        options: ``method``, ``lr``, ``record_every``, ``record_steps``, ``progress`` of
            :func:`attnlib.train_joint_problem`, which takes the one batched step.

    Returns a list of :class:`attnlib.optim.JointTrajectory`, one per data set, each with ``p``
    (R, B, d_k), ``v`` (R, B, d) and its own :class:`JointAttention` as ``problem``: the same as
    ``S`` separate :func:`attnlib.train_joint` calls, with one Python loop over the iterations.

    >>> import numpy as np, attnlib as al
    >>> sets = [al.datasets.joint_tokens(relaxed=r) for r in (False, True)]
    >>> trajs = al.joint.train_joint_stack(sets, al.datasets.JOINT_P0, al.datasets.JOINT_V0, steps=50)
    >>> one = al.train_joint(*sets[1], al.datasets.JOINT_P0, al.datasets.JOINT_V0, steps=50)
    >>> len(trajs), bool(np.allclose(trajs[1].p, one.p, rtol=1e-12, atol=1e-12))
    (2, True)
    """
    Xs = [np.asarray(X, float) for X, _ in datasets]
    ys = [np.asarray(y, float) for _, y in datasets]
    if not Xs or any(X.ndim != 3 or X.shape != Xs[0].shape for X in Xs):
        raise ValueError("datasets must be a non-empty sequence of (X, y) with X of one shape (n, T, d)")
    d = Xs[0].shape[2]
    W = np.eye(d) if W is None else np.asarray(W, float)

    def stack(B):
        return StackedJointAttention(np.repeat(np.stack(Xs), B, axis=0), np.repeat(np.stack(ys), B, axis=0), W, loss)

    def problem(s, rows):
        return JointAttention(Xs[s], ys[s], W, rows.loss)

    return _train_joint_rows(len(Xs), stack, (W.shape[0], d), p0, v0, steps, problem, **options)


def _train_joint_rows(S: int, stack, dims, p0, v0, steps: int, problem, **options) -> list:
    """Train ``S`` data sets as one batch and split the run into one trajectory per data set.

    ``stack(B)``: the stacked problem (a :class:`StackedJointAttention`) holding data set ``s`` in
    rows ``s·B … s·B + B − 1``; ``dims``: ``(d_k, d)`` of ``p`` and ``v``; ``p0``, ``v0`` as in
    :func:`train_joint_stack`;
    ``problem(s, rows)``: the unstacked problem of data set ``s``, recorded in its trajectory.
    """
    from .optim import JointTrajectory, train_joint_problem

    def per_set(name, value, dim):
        arr = np.asarray(value, float)
        arr = arr[None] if arr.ndim == 1 else arr
        arr = np.broadcast_to(arr, (S,) + arr.shape) if arr.ndim == 2 else arr
        if arr.ndim != 3 or arr.shape[0] != S or arr.shape[2] != dim:
            raise ValueError(f"{name} must have shape ({dim},), (B, {dim}) or ({S}, B, {dim}), got {np.shape(value)}")
        return arr

    P, V = per_set("p0", p0, dims[0]), per_set("v0", v0, dims[1])
    if P.shape[:2] != V.shape[:2]:
        raise ValueError(f"p0 and v0 must hold the same number of starts, got {P.shape[:2]} and {V.shape[:2]}")
    B = P.shape[1]
    rows = stack(B)
    traj = train_joint_problem(rows, P.reshape(S * B, -1), V.reshape(S * B, -1), steps, **options)
    out = []
    for s in range(S):
        cut = slice(s * B, (s + 1) * B)
        out.append(
            JointTrajectory(
                traj.p[:, cut],
                traj.v[:, cut],
                traj.steps,
                traj.loss[:, cut],
                traj.stopped[cut],
                traj.method,
                traj.lr,
                problem(s, rows),
            )
        )
    return out


def truncate_joint(traj, steps: int):
    """The records of a :class:`attnlib.optim.JointTrajectory` up to iteration ``steps`` (a view)."""
    import dataclasses

    keep = np.asarray(traj.steps) <= steps
    return dataclasses.replace(traj, p=traj.p[keep], v=traj.v[keep], steps=traj.steps[keep], loss=traj.loss[keep])


# ---------------------------------------------------------------------- the joint path (p and v on two balls)


def _log_loss(loss: Loss, u) -> np.ndarray:
    """``log ℓ(u)`` without underflow, for the logistic and the exponential loss."""
    u = np.asarray(u, float)
    if loss.name == "exponential":
        return -u
    if loss.name != "logistic":
        raise ValueError(f"the joint path needs the logistic or the exponential loss, got {loss.name!r}")
    with np.errstate(over="ignore", divide="ignore"):
        small = np.log(np.logaddexp(0.0, -np.minimum(u, 30.0)))
        large = -u + np.log1p(-0.5 * np.exp(-np.maximum(u, 30.0)))
    return np.where(u > 30.0, large, small)


def _log_abs_excess(loss: Loss, gamma, delta) -> tuple[np.ndarray, np.ndarray]:
    """``log|ℓ(γ − δ) − ℓ(γ)|`` and its sign (that of ``δ``), for any sign and size of ``δ`` and ``γ``.

    ``|δ| < 1e-8``: first order, ``log|ℓ'(γ)| + log|δ|``. ``γ > 30`` (logistic) or exponential:
    ``ℓ(u) = e^{−u}`` to relative ``e^{−γ}``, so the excess is ``e^{−γ} expm1(δ)``. Otherwise the
    direct difference (no cancellation for ``|δ| ≥ 1e-8`` and ``γ ≤ 30``).
    """
    gamma, delta = np.broadcast_arrays(np.asarray(gamma, float), np.asarray(delta, float))
    sign = np.sign(delta)
    ad = np.abs(delta)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        log_slope = np.log(-loss.derivative(gamma)) if loss.name == "exponential" else log_expit(-gamma)
        first = log_slope + np.log(ad)
        # log|expm1(δ)| for any δ: δ + log1p(−e^{−δ}) for large δ
        log_em1 = np.where(
            delta > 30.0,
            delta + np.log1p(-np.exp(-np.minimum(delta, 700.0))),
            np.log(np.abs(np.expm1(np.minimum(delta, 30.0)))),
        )
        tail = -gamma + log_em1
        direct = np.log(np.abs(loss.value(gamma - delta) - loss.value(gamma)))
    exp_like = (loss.name == "exponential") | (gamma > 30.0)
    out = np.where(ad < 1e-8, first, np.where(exp_like, tail, direct))
    return out, sign


def joint_log_gap(X, y, keys, select, p, v, loss) -> tuple[np.ndarray, np.ndarray]:
    """Signed excess of the joint loss over the floor of its selection at ``v``: ``L(p, v) − L_α(v)``.

    ``L_α(v) = (1/n) Σ_i ℓ(γ_iα_i)`` with ``γ_it = y_i vᵀ x_it``: the loss when every input attends
    to its selected token only. As in :func:`selection_log_gap`, with ``δ_i = Σ_t σ_it (γ_iα − γ_it)``
    in signed log space; accurate where the excess is far below the float resolution of ``L``.

    Args: ``X`` (*data, n, T, d), ``y`` (*data, n), ``keys`` (*data, n, T, d_k), ``select`` (*data, n),
    ``p`` (*batch, d_k), ``v`` (*batch, d), with ``data`` broadcastable against ``batch`` (one data
    set per batch member, or one for all).  Returns ``(log|L − L_α|, sign)``, each (*batch,).
    """
    loss = get_loss(loss)
    n = X.shape[-3]
    sel = np.asarray(select)
    gamma = np.asarray(y)[..., None] * np.einsum("...d,...itd->...it", np.asarray(v, float), X)
    g_sel = np.take_along_axis(gamma, np.broadcast_to(sel, gamma.shape[:-1])[..., None], axis=-1)[..., 0]
    diff = g_sel[..., None] - gamma
    log_sigma = log_softmax(np.einsum("...k,...itk->...it", np.asarray(p, float), keys), axis=-1)
    with np.errstate(divide="ignore"):
        terms = np.where(diff == 0, -np.inf, log_sigma + np.log(np.abs(diff)))
    log_delta, s_delta = logsumexp(terms, axis=-1, b=np.where(diff == 0, 1.0, np.sign(diff)), return_sign=True)
    log_e, s_e = _log_abs_excess(loss, g_sel, s_delta * np.exp(np.minimum(log_delta, 700.0)))
    # |δ| may underflow in exp(log_delta): the first-order branch then needs log_delta itself
    with np.errstate(divide="ignore"):
        log_slope = np.log(-loss.derivative(g_sel)) if loss.name == "exponential" else log_expit(-g_sel)
    tiny = log_delta < np.log(1e-8)
    log_e = np.where(tiny, log_slope + log_delta, log_e)
    s_e = np.where(tiny, s_delta, s_e)
    lg, sign = logsumexp(log_e, axis=-1, b=np.where(s_e == 0, 0.0, s_e), return_sign=True)
    return lg - np.log(n), sign


def joint_log_loss(X, y, keys, p, v, loss) -> np.ndarray:
    """``log L(p, v)``, accurate where ``L`` underflows: (*batch,) (shapes as :func:`joint_log_gap`)."""
    loss = get_loss(loss)
    log_sigma = log_softmax(np.einsum("...k,...itk->...it", np.asarray(p, float), keys), axis=-1)
    pooled = np.einsum("...it,...itd->...id", np.exp(log_sigma), X)
    u = np.asarray(y) * np.einsum("...d,...id->...i", np.asarray(v, float), pooled)
    return logsumexp(_log_loss(loss, u), axis=-1, precise=True) - np.log(X.shape[-3])


def _angle_search(objective, N: int, grid: int, zoom: int, levels: int) -> np.ndarray:
    """Global minimiser over the circle for each of ``N`` rows: ``objective(angles (N, M)) → (sign, key)``.

    Lower sign first, then lower key (the sign is that of an excess whose log is ``|key|``: ordering
    by ``(sign, sign·log|E|)`` orders by ``E``). A grid of ``grid`` angles, then ``levels`` zooms of
    ``zoom`` points over ± one spacing around the best.
    """
    angles = np.broadcast_to(np.linspace(0.0, 2 * np.pi, grid, endpoint=False), (N, grid))
    width = 2 * np.pi / grid
    best = None
    for level in range(levels + 1):
        sign, key = objective(angles)
        smin = np.min(sign, axis=1, keepdims=True)
        k = np.where(sign == smin, key, np.inf)
        idx = np.argmin(k, axis=1)
        best = angles[np.arange(N), idx]
        if level < levels:
            angles = best[:, None] + np.linspace(-width, width, zoom)[None, :]
            width = 2 * width / (zoom - 1)
    return best


@dataclass(frozen=True, eq=False)
class JointPath:
    """The joint regularization path ``(p̄, v̄)(R_p, R_v)`` of :func:`joint_regularization_path`.

    Attributes: ``radii_p`` (N,), ``radii_v`` (N,), ``p`` (*S, N, 2), ``v`` (*S, N, 2) the minimisers
    on the spheres (``S``: data sets of a stack), ``rounds`` (*S, N) alternations used,
    ``log_loss`` ``log L(p̄, v̄)``, ``log_gap`` / ``gap_sign`` the excess over the selection's floor
    at ``v̄``, ``select``, ``unsettled``: some row still moved at the last alternation.
    """

    radii_p: np.ndarray
    radii_v: np.ndarray
    p: np.ndarray
    v: np.ndarray
    rounds: np.ndarray
    log_loss: np.ndarray
    log_gap: np.ndarray
    gap_sign: np.ndarray
    select: np.ndarray
    unsettled: bool


def joint_regularization_path(
    X,
    y,
    select,
    radii_p,
    radii_v,
    W=None,
    loss: str = "logistic",
    grid: int = 360,
    zoom: int = 21,
    levels: int = 10,
    max_rounds: int = 8,
    tol: float = 1e-10,
) -> JointPath:
    """Joint regularization path of [MMTS]: ``(p̄, v̄) = argmin L(p, v)`` over ``‖p‖ = R_p``, ``‖v‖ = R_v``.

    For 2-D ``p`` and 2-D ``v`` (the paper's joint-training data): each parameter is an angle on its
    circle, and the path alternates exact block minimisations, each a global search over its circle
    (a grid of ``grid`` angles refined ``levels`` times), until neither angle moves by more than
    ``tol`` rad (at most ``max_rounds`` alternations, recorded in ``rounds``):

    - ``v`` at fixed ``p``: minimise ``log L(p, v)`` (:func:`joint_log_loss`); the samples' losses
      ``≈ e^{−R_v m_i}`` are large numbers in log space, no difference is formed;
    - ``p`` at fixed ``v``: minimise ``L(p, v) − L_α(v)`` in signed log space
      (:func:`joint_log_gap`): the part of the loss ``p`` can still change is far below the float
      resolution of ``L`` once ``R_v`` is large (sample ``i`` weighs ``|ℓ'(γ_iα)| ≈ e^{−R_v m_i}``).

    The search is on the spheres: at the radii used the loss decreases outwards in both blocks
    (the selected tokens win and are correctly classified), so the ball constraints are active.
    Every radius, and every data set of a stack, is one row of a single batched search.

    Args:
        X: (n, T, 2) tokens, or (S, n, T, 2) a stack of data sets (same ``n``, ``T``).
        y: (n,) or (S, n) labels.  select: (n,) or (S, n) the selected tokens ``α``.
        radii_p, radii_v: (N,) the two radii (e.g. ``R_v = R_p^κ``).  W: (2, 2) keys ``k = W x``.

    Returns :class:`JointPath` with ``p``, ``v`` of shape (N, 2), or (S, N, 2) for a stack.
    """
    X = np.asarray(X, float)
    stacked = X.ndim == 4
    Xs = X if stacked else X[None]
    S, n, T, d = Xs.shape
    ys = np.broadcast_to(np.asarray(y, float), (S, n))
    sels = np.broadcast_to(np.asarray(select), (S, n))
    W = np.eye(d) if W is None else np.asarray(W, float)
    keys = Xs @ W.T
    if d != 2 or keys.shape[-1] != 2:
        raise ValueError(f"the joint path searches circles: p and v must be 2-D, got d = {d}, d_k = {keys.shape[-1]}")
    rp, rv = check_radii(radii_p), np.asarray(radii_v, float)
    if rv.shape != rp.shape or np.any(rv <= 0):
        raise ValueError(f"radii_v must be positive with the shape of radii_p {rp.shape}, got {rv.shape}")
    N = len(rp)
    # rows: data set s, radius j  ->  row s * N + j; data carry a grid axis of length 1
    Xr, Kr = np.repeat(Xs, N, axis=0)[:, None], np.repeat(keys, N, axis=0)[:, None]
    yr, sr = np.repeat(ys, N, axis=0)[:, None], np.repeat(sels, N, axis=0)[:, None]
    Rp, Rv = np.tile(rp, S), np.tile(rv, S)
    rows = S * N

    def circle(angles, radius):
        return radius[:, None, None] * np.stack([np.cos(angles), np.sin(angles)], axis=-1)

    def f_v(angles, idx):
        lv = joint_log_loss(Xr[idx], yr[idx], Kr[idx], p[idx, None, :], circle(angles, Rv[idx]), loss)
        return np.zeros_like(lv), lv

    def f_p(angles, idx):
        lg, sign = joint_log_gap(Xr[idx], yr[idx], Kr[idx], sr[idx], circle(angles, Rp[idx]), v[idx, None, :], loss)
        return sign, sign * lg

    def turned(a, b):
        return np.abs(np.angle(np.exp(1j * (a - b)))) > tol

    p, v = np.zeros((rows, 2)), np.zeros((rows, 2))
    a_p, a_v = np.full(rows, np.nan), np.full(rows, np.nan)
    rounds = np.zeros(rows, int)
    active = np.ones(rows, bool)
    for it in range(max_rounds):
        idx = np.flatnonzero(active)
        new_v = _angle_search(lambda a, idx=idx: f_v(a, idx), len(idx), grid, zoom, levels)
        v[idx] = circle(new_v[:, None], Rv[idx])[:, 0]
        new_p = _angle_search(lambda a, idx=idx: f_p(a, idx), len(idx), grid, zoom, levels)
        moved = turned(new_p, a_p[idx]) | turned(new_v, a_v[idx]) | np.isnan(a_p[idx])
        rounds[idx] = it + 1
        a_p[idx], a_v[idx] = new_p, new_v
        p[idx] = circle(new_p[:, None], Rp[idx])[:, 0]
        active[idx] = moved
        if not active.any():
            break
    lg, sign = joint_log_gap(Xr[:, 0], yr[:, 0], Kr[:, 0], sr[:, 0], p, v, loss)
    ll = joint_log_loss(Xr[:, 0], yr[:, 0], Kr[:, 0], p, v, loss)
    shape = (S, N) if stacked else (N,)
    return JointPath(
        rp,
        rv,
        p.reshape(shape + (2,)),
        v.reshape(shape + (2,)),
        rounds.reshape(shape),
        ll.reshape(shape),
        lg.reshape(shape),
        sign.reshape(shape),
        np.asarray(select),
        bool(active.any()),
    )


def joint_path_bounds(X, y, select, path: JointPath, svms, W=None, loss: str = "logistic"):
    """Finite-radius bounds on the joint path's directions, from the two SVM rays (one data set).

    **Head.** ``v̄`` minimises ``L(p̄, ·)`` on its sphere, so ``L(p̄, v̄) ≤ L(p̄, R_v v̂_mm)``. When every
    non-selected token is 0, ``y_i v̄ᵀ x_iα ≥ u_i = y_i v̄ᵀ x̄_i`` (``x̄_i = σ_iα x_iα``) and
    ``L ≥ ℓ(u_min)/n ≥ e^{−u_min}/(2n)`` (logistic, ``u_min ≥ 0``; ``e^{−u}/n`` exponential), so the label
    margin ratio is ``ρ_v ≥ (−log(2n L(p̄, R_v v̂_mm))) ‖v_mm‖/R_v`` and
    ``1 − cos(v̄, v_mm) ≤ 1/ρ_v² − 1`` (:func:`direction_bound`).

    **Attention.** At ``v̄`` the scores ``γ_it = y_i v̄ᵀx_it`` are fixed and ``p̄`` minimises the excess
    ``E = L − L_α(v̄)`` on its sphere. With ``p_S`` the SVM of the support vectors' rows only, the ray
    ``R_p p̂_S`` bounds ``E(p̄)``; as in :func:`ray_margin_bound`, the smallest support-vector margin
    ``m`` of ``p̄`` has ``E ≥ w_S/(e^m + T − 1)`` (``w_S`` the smallest support-vector weight
    ``|ℓ'(γ_iα)|(γ_iα − γ_it)/n``, in log space: ``|ℓ'(γ_iα)| ≈ e^{−R_v m_i}``), and every other term of
    ``E`` is ``≥ 0`` when the selected tokens score highest. So ``ρ_S ≥ m_lo ‖p_S‖/R_p`` and
    ``1 − cos(p̄, p_S) ≤ 1/ρ_S² − 1``. ``p_S`` is the relaxed p-SVM whenever its ``≥ 0`` rows are
    inactive (``relaxed_is_support_svm``).

    Args:
        X: (n, T, 2), y, select: one data set.  path: its :class:`JointPath` (unstacked).
        svms: :func:`attnlib.joint_svms` of the data.

    Returns ``(v_bound (N,), p_bound (N,), p_support (2,), relaxed_is_support_svm)``; a bound is
    ``inf`` where it does not apply (non-zero non-selected tokens for ``v``; a selected token that
    does not score highest, or a vacuous log, for ``p``).
    """
    from .model import token_selection
    from .svm import max_margin

    loss = get_loss(loss)
    X, y = np.asarray(X, float), np.asarray(y, float)
    n, T, d = X.shape
    sel = np.asarray(select)
    W = np.eye(d) if W is None else np.asarray(W, float)
    keys = X @ W.T
    rp, rv = path.radii_p, path.radii_v
    others = np.arange(T) != sel[:, None]
    # head
    v_mm = np.asarray(svms.label.v, float)
    ray_v = rv[:, None] * v_mm / np.linalg.norm(v_mm)
    log_l = joint_log_loss(X, y, keys, path.p, ray_v, loss)
    c = np.log(2 * n) if loss.name == "logistic" else np.log(n)
    rho_v = np.maximum(-c - log_l, 0.0) * np.linalg.norm(v_mm) / rv
    v_bound = direction_bound(rho_v) if np.all(X[others] == 0) else np.full(len(rp), np.inf)
    # attention: SVM of the support vectors' rows only
    S = np.asarray(svms.support, bool)
    onehot = np.zeros((int(S.sum()), T))
    onehot[np.arange(int(S.sum())), sel[S]] = 1.0
    p_S = max_margin(token_selection(keys[S], onehot), sel[S]).theta
    same = bool(np.allclose(p_S, svms.relaxed.theta, atol=1e-6))
    p_bound = np.full(len(rp), np.inf)
    for j in range(len(rp)):
        gamma = y[:, None] * (X @ path.v[j])
        g_sel = gamma[np.arange(n), sel]
        if np.any(np.where(others, gamma, -np.inf) >= g_sel[:, None]):
            continue
        lg_ray, s_ray = joint_log_gap(X, y, keys, sel, rp[j] * p_S / np.linalg.norm(p_S), path.v[j], loss)
        if s_ray <= 0:
            continue
        with np.errstate(divide="ignore"):
            log_slope = np.log(-loss.derivative(g_sel)) if loss.name == "exponential" else log_expit(-g_sel)
            log_w = np.min(np.where(others[S], log_slope[S][:, None] + np.log(g_sel[S][:, None] - gamma[S]), np.inf))
        head = log_w - np.log(n) - lg_ray
        with np.errstate(over="ignore"):
            frac = (T - 1) * np.exp(-head)
        if frac >= 1:
            continue
        m_lo = head + np.log1p(-frac)
        p_bound[j] = direction_bound(m_lo * np.linalg.norm(p_S) / rp[j])
    return v_bound, p_bound, p_S, same


# ---------------------------------------------------------------------- reading joint runs and paths


def selected_mass(traj, select=1) -> np.ndarray:
    """Softmax probability ``σ_iα_i(p(t))`` of each sample's selected token along a joint run.

    ``traj``: a :class:`attnlib.optim.JointTrajectory` (``p`` of shape (R, B, d_k)); ``select``: the
    selected token, one index for every sample or (n,). Returns (R, B, n).

    >>> import attnlib as al
    >>> traj = al.train_joint(*al.datasets.joint_tokens(), al.datasets.JOINT_P0, al.datasets.JOINT_V0, steps=5)
    >>> al.joint.selected_mass(traj).shape
    (6, 1, 3)
    """
    log_sigma = traj.problem.log_attention(traj.p)
    sel = _selection(select, log_sigma.shape[-2], log_sigma.shape[-1])
    return np.exp(log_sigma[..., np.arange(sel.size), sel])


def classifier_confidence(traj) -> np.ndarray:
    """Logistic probability ``σ(y_i f(X_i))`` of every sample along a joint run: (R, B, n).

    Computed as ``(1 + tanh(u/2))/2`` with ``u = y_i f(X_i)``, which never overflows.
    """
    return 0.5 * (1.0 + np.tanh(traj.problem.output(traj.p, traj.v) / 2.0))


def arc_position(P, svms: JointSVMs) -> np.ndarray:
    """Where 2-D directions ``P`` (*batch, 2) lie on the arc from the relaxed (0) to the full (1) p-SVM.

    The signed angle from the relaxed p-SVM towards the full one, in units of the angle between them
    (values below 0 or above 1 lie beyond an end). Meaningful only when the two SVMs differ.

    >>> import attnlib as al
    >>> svms = al.joint_svms(*al.datasets.joint_tokens(relaxed=True), select=1)
    >>> [round(float(a), 6) for a in al.joint.arc_position([svms.relaxed.theta, svms.full.theta], svms)]
    [0.0, 1.0]
    """
    start = np.arctan2(svms.relaxed.theta[1], svms.relaxed.theta[0])
    sep = np.angle(np.exp(1j * (np.arctan2(svms.full.theta[1], svms.full.theta[0]) - start)))
    P = np.asarray(P, float)
    return np.angle(np.exp(1j * (np.arctan2(P[..., 1], P[..., 0]) - start))) / sep


def train_joint_ratio(
    datasets, p0, v0, steps: int, rho: float = 1.0, lr: float = 0.1, loss: str = "logistic", W=None, record_every=1
) -> list:
    """Joint NGD with step ``η`` on ``p`` and ``ρη`` on ``v``, so that ``‖v(t)‖/‖p(t)‖ → ρ``.

    Written as :func:`train_joint_stack` on the reparametrised problem ``v = ρ u``: the data
    ``ρ X`` with ``W/ρ`` have the same keys and the values ``uᵀ(ρ x) = vᵀ x``, and a normalised step
    of length ``η`` on ``u`` is one of length ``ρη`` on ``v`` along the same direction. ``rho = 1``
    is :func:`train_joint_stack` itself. Arguments as there (``datasets``: a sequence of ``(X, y)``);
    returns one :class:`attnlib.optim.JointTrajectory` per data set, in ``v`` (not ``u``), each with
    the original problem.

    >>> import numpy as np, attnlib as al
    >>> sets = [al.datasets.joint_tokens(relaxed=True)]
    >>> traj = al.joint.train_joint_ratio(sets, al.datasets.JOINT_P0, al.datasets.JOINT_V0, 400, rho=3.0)[0]
    >>> round(float(np.linalg.norm(traj.v[-1, 0]) / np.linalg.norm(traj.p[-1, 0])))
    3
    """
    import dataclasses

    if not np.isfinite(rho) or rho <= 0:
        raise ValueError(f"rho must be a finite number > 0, got {rho!r}")
    d = np.asarray(datasets[0][0]).shape[-1]
    W = np.eye(d) if W is None else np.asarray(W, float)
    scaled = [(rho * np.asarray(X, float), y) for X, y in datasets]
    trajs = train_joint_stack(
        scaled, p0, np.asarray(v0, float) / rho, steps, W=W / rho, loss=loss, lr=lr, record_every=record_every
    )
    return [
        dataclasses.replace(t, v=rho * t.v, problem=JointAttention(np.asarray(X, float), y, W, t.problem.loss))
        for t, (X, y) in zip(trajs, datasets)
    ]


def joint_path_rows(path: JointPath, X, y, svms_list, select=1, predicted=None) -> list[dict]:
    """Per data set of a stacked :class:`JointPath`, the end of the path against the SVMs (a table row).

    Args: ``path`` with ``p``, ``v`` of shape (S, N, 2); ``X`` (S, n, T, 2), ``y`` (S, n);
    ``svms_list``: S :class:`JointSVMs`; ``select``: the selected token of every sample.

    Returns one dict per data set, at the largest radius: ``v_ratio`` ``(1 − cos(v̄, v_mm))`` over its
    bound, ``p_ratio`` / ``full_ratio`` ``(1 − cos)`` of ``p̄`` to the relaxed / full p-SVM over the
    attention bound (NaN when that bound is not for the relaxed SVM, ``same`` False), the angles
    ``to_v``, ``to_relaxed``, ``to_full``, ``to_balanced`` (to ``p̂(1)``) in degrees, and ``cls``
    (:func:`classify_alignment`). Bounds from :func:`joint_path_bounds`. ``predicted``: the S
    directions ``p̂(1)`` if already computed (default: :func:`balanced_direction` of each).
    """
    p_hat = [balanced_direction(svms, rho=1.0) for svms in svms_list] if predicted is None else predicted
    rows = []
    for s, svms in enumerate(svms_list):
        one = JointPath(
            path.radii_p,
            path.radii_v,
            path.p[s],
            path.v[s],
            path.rounds[s],
            path.log_loss[s],
            path.log_gap[s],
            path.gap_sign[s],
            path.select,
            path.unsettled,
        )
        sel = _selection(select, X.shape[1], X.shape[2])
        v_bound, p_bound, _, same = joint_path_bounds(X[s], y[s], sel, one, svms)
        p_end, v_end = path.p[s, -1], path.v[s, -1]
        rows.append(
            dict(
                v_ratio=float(one_minus_cosine(v_end, svms.label.v) / v_bound[-1]),
                p_ratio=float(one_minus_cosine(p_end, svms.relaxed.theta) / p_bound[-1]) if same else np.nan,
                full_ratio=float(one_minus_cosine(p_end, svms.full.theta) / p_bound[-1]) if same else np.nan,
                to_relaxed=float(angle_degrees(p_end, svms.relaxed.theta)),
                to_full=float(angle_degrees(p_end, svms.full.theta)),
                to_balanced=float(angle_degrees(p_end, p_hat[s])),
                to_v=float(angle_degrees(v_end, svms.label.v)),
                cls=str(classify_alignment(p_end, svms)[()]),
                same=same,
            )
        )
    return rows


def joint_path_table(tables: dict, names: dict) -> str:
    """A Markdown table of :func:`joint_path_rows`: one line per data set and ratio exponent ``κ``.

    ``tables``: ``{(data, kappa): rows}``; ``names``: ``{data: [one name per row]}``.
    Columns: data, κ, ∠(v̄, v_mm), ∠(p̄, relaxed), ∠(p̄, full), ∠(p̄, p̂(1)), alignment class.
    """
    lines = [
        "| data | κ | ∠(v̄, v_mm) | ∠(p̄, relaxed) | ∠(p̄, full) | ∠(p̄, p̂(1)) | follows |",
        "|---|---|---|---|---|---|---|",
    ]
    for (data, kappa), rows in tables.items():
        for name, r in zip(names[data], rows):
            lines.append(
                f"| {name} | {kappa:g} | {r['to_v']:.2e}° | {r['to_relaxed']:.3g}° | {r['to_full']:.3g}° "
                f"| {r['to_balanced']:.3g}° | {r['cls']} |"
            )
    return "\n".join(lines)
