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

from .metrics import direction_error, one_minus_cosine, orthogonal_offset
from .model import token_selection
from .optim import train_joint
from .svm import LabelSVM, MaxMarginSolution, label_svm, max_margin

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
    One training run per instance (each has its own data): a Python loop over instances.

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
    all_svms, predicted, zero_row = [], [], []
    for k in range(instances):
        X, y = random_joint_tokens(n=n, d=2, seed=[seed, k])
        svms = joint_svms(X, y, select=1)
        p_hat = balanced_direction(svms, rho=1.0)
        p0 = np.vstack([JOINT_P0, rng.standard_normal((inits - 1, 2))])
        v0 = np.vstack([JOINT_V0, rng.standard_normal((inits - 1, 2))])
        traj = train_joint(X, y, p0, v0, steps=steps, loss=loss, lr=lr, record_every=max(1, steps // records))
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
        all_svms.append(svms)
        predicted.append(p_hat)
        zero_row.append(bool(np.min((svms.keys[:, 1] - svms.keys[:, 0]) @ p_hat) < 1e-6))
    out = {key: np.concatenate(value) for key, value in rows.items()}
    return RandomJointRuns(svms=tuple(all_svms), predicted=np.array(predicted), zero_row=np.array(zero_row), **out)
