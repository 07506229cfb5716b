"""Max-margin problems: ATT-SVM for any token selection, the label SVM, local optimality.

ATT-SVM ([MMTS]; "W-SVM" in [TFSVM]/[FAST]) for a selection ``α`` (one token per sample):

.. math::

    θ_{mm}(α) = \\arg\\min ‖θ‖ \\quad \\text{s.t.} \\quad ⟨θ, A_{iα_i} − A_{it}⟩ ≥ 1
    \\quad \\forall i,\\; t ≠ α_i.

The margin separates *tokens inside each sample* (the selected one from the rest), not samples
of two classes. Rows of relaxed samples get right-hand side 0 instead of 1 (the relaxed p-SVM of
joint training). ``norm="nuc"`` gives the nuclear-norm SVM that the (K, Q)
factorisation converges to [TFSVM].

The Frobenius (Euclidean) problems are solved exactly by NNLS (Lawson–Hanson least-distance
programming, :func:`_least_distance`) when its answer passes a KKT certificate, about 50× faster
than building a cvxpy problem, and declared infeasible when NNLS returns a Farkas certificate
(:func:`farkas_margin_bound` ≤ :data:`INFEASIBLE_MARGIN`); otherwise, and for the nuclear norm,
by cvxpy with an explicit solver (CLARABEL), status checked (``solver="cvxpy"`` skips the NNLS
path). Infeasible selections raise :class:`InfeasibleError`. SVM-neighbours are the active
constraints, decided with a tolerance well above the solver's accuracy (``ACTIVE_TOL``) and well
below the gap to the next constraint on the book's instances.

Every max-margin program of the book is here: ATT-SVM and the label SVM, the joint SVM pair
and the balanced direction of joint training (:func:`joint_svms`, :func:`balanced_direction`),
the decoder's SVMs (:func:`decoder_svms`), the exact nuclear-norm SVM for self-attention
features (:func:`nuclear_svm`, Clarabel on the SDP reduced to the span of the constraints), the
batched certified Frobenius and nuclear solvers for many instances at once
(:func:`frobenius_svm_batch`, :func:`nuclear_svm_batch`, :func:`svm_pair_batch`), and NNLS with
its Farkas certificates (:func:`least_distance_nnls`, :func:`svm_feasibility`).
"""

from __future__ import annotations

import itertools
import warnings
from dataclasses import dataclass

import numpy as np

from .metrics import angle_degrees
from .model import DecoderAttention, TokenSelectionProblem, check_labels, finite_array, token_selection

__all__ = [
    "ACTIVE_TOL",
    "MAX_ENUMERATION",
    "InfeasibleError",
    "MaxMarginSolution",
    "LabelSVM",
    "least_distance_nnls",
    "farkas_margin_bound",
    "INFEASIBLE_MARGIN",
    "SOLVERS",
    "max_margin",
    "label_svm",
    "SelectionReport",
    "is_locally_optimal",
    "enumerate_selections",
    "locally_optimal_selections",
    "JointSVMs",
    "check_selection",
    "joint_svms",
    "balanced_direction",
    "decoder_svms",
    "svm_constraints",
    "SVMEquivalence",
    "svm_equivalence",
    "NuclearSVM",
    "nuclear_svm",
    "SVMBatch",
    "frobenius_svm_batch",
    "nuclear_svm_batch",
    "svm_pair_batch",
    "svm_feasibility",
    "NORM_NAMES",
    "check_norm",
    "norm_value",
    "dual_norm",
    "max_margin_norm",
    "max_margin_norms",
    "norm_certificate",
    "face_min_l2",
]


#: Relative tolerance for "constraint active": CLARABEL is run to ~1e-10, so slacks of active
#: constraints are far below 1e-6, while inactive ones on the book's instances are above 1e-3.
ACTIVE_TOL = 1e-6


#: Largest number of selections ``T^n`` that :func:`enumerate_selections` will solve.
MAX_ENUMERATION = 20_000


_CLARABEL_OPTS = dict(tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10, tol_ktratio=1e-8)


class InfeasibleError(ValueError):
    """The max-margin problem has no solution: no θ separates the selected tokens."""


@dataclass(frozen=True, eq=False)
class MaxMarginSolution:
    """Solution of ATT-SVM for one selection.

    Attributes:
        theta: (*shape) the max-margin parameter θ_mm(α).
        margin: ``1/‖θ_mm‖`` in the chosen norm.
        status: the solver's status ("optimal").
        select: (n,) the selection α.
        neighbors: (n, T) bool, the active constraints (SVM-neighbours); False at ``α_i``.
        constraint_values: (n, T) ``⟨θ, A_iα − A_it⟩`` (0 at ``α_i``).
        relax: (n,) bool, samples whose rows have right-hand side 0.
        norm: "fro" or "nuc".
        duals: (n, T) dual variables of the constraints (0 at ``α_i``).
    """

    theta: np.ndarray
    margin: float
    status: str
    select: np.ndarray
    neighbors: np.ndarray
    constraint_values: np.ndarray
    relax: np.ndarray
    norm: str
    duals: np.ndarray

    @property
    def direction(self) -> np.ndarray:
        """``θ_mm/‖θ_mm‖_F``."""
        return self.theta / np.linalg.norm(self.theta)


@dataclass(frozen=True, eq=False)
class LabelSVM:
    """Label SVM ``v_mm = argmin ‖v‖ s.t. y_i vᵀ x_i ≥ 1`` (no bias) [MMTS].

    Attributes: ``v`` (d,), ``margin = 1/‖v_mm‖``, ``support`` (n,) bool (active samples),
    ``status``.
    """

    v: np.ndarray
    margin: float
    support: np.ndarray
    status: str


def _check_select(prob: TokenSelectionProblem, select) -> np.ndarray:
    if select is None:
        return prob.opt.copy()
    sel = np.asarray(select)
    if sel.shape != (prob.n,) or not np.issubdtype(sel.dtype, np.integer):
        raise ValueError(f"select must be {prob.n} integer token indices (one per sample), got {select!r}")
    if np.any((sel < 0) | (sel >= prob.T)):
        raise ValueError(f"select must hold token indices in [0, {prob.T - 1}], got {sel.tolist()}")
    return sel


def _check_relax(relax, n: int) -> np.ndarray:
    if relax is None:
        return np.zeros(n, bool)
    r = np.asarray(relax)
    if r.dtype == bool:
        if r.shape != (n,):
            raise ValueError(f"relax as a mask must have shape ({n},), got {r.shape}")
        return r.copy()
    mask = np.zeros(n, bool)
    idx = r.astype(int).ravel()
    if np.any((idx < 0) | (idx >= n)):
        raise ValueError(f"relax must hold sample indices in [0, {n - 1}], got {idx.tolist()}")
    mask[idx] = True
    return mask


def least_distance_nnls(G: np.ndarray, h: np.ndarray):
    """Lawson–Hanson's reduction of ``min ‖x‖₂ s.t. G x ≥ h`` to NNLS (their ch. 23): ``(u, r)`` or None.

    ``G`` (m, k), ``h`` (m,). With ``E = [Gᵀ; hᵀ]`` (k + 1, m), ``u = argmin_{u ≥ 0} ‖E u − e_last‖``
    and ``r = E u − e_last``: if ``r[-1] < 0`` the least-norm point is ``x = −r[:-1]/r[-1] = Gᵀλ``
    with multipliers ``λ = u/(−r[-1])``; if ``r[-1] ≈ 0`` then ``Gᵀu ≈ 0`` with ``hᵀu ≈ 1``, a Farkas
    certificate that ``G x ≥ h`` is infeasible. None when NNLS hits its iteration limit. The callers
    decide what to certify (:func:`attnlib.max_margin`, :func:`attnlib.svm.balanced_direction`,
    :func:`attnlib.svm.svm_feasibility`).

    >>> import numpy as np
    >>> u, r = least_distance_nnls(np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([1.0, 2.0]))
    >>> -r[:-1] / r[-1]
    array([1., 2.])
    """
    from scipy.optimize import nnls

    E = np.vstack([G.T, h[None, :]])
    f = np.zeros(E.shape[0])
    f[-1] = 1.0
    try:
        u, _ = nnls(E, f, maxiter=50 * max(E.shape))
    except RuntimeError:  # iteration limit
        return None
    return u, E @ u - f


def farkas_margin_bound(G: np.ndarray, h: np.ndarray, u: np.ndarray) -> float:
    """The bound ``‖Gᵀu‖ / hᵀu`` on the margin ``1/‖x‖`` of every ``x`` with ``G x ≥ h``, from any ``u ≥ 0``.

    For such ``x``, ``hᵀu ≤ uᵀ G x ≤ ‖Gᵀu‖ ‖x‖``, so ``‖x‖ ≥ hᵀu/‖Gᵀu‖`` (Farkas: ``Gᵀu = 0`` with
    ``hᵀu > 0`` proves infeasibility). ``inf`` (no bound) unless ``hᵀu > 0``.

    >>> import numpy as np
    >>> float(farkas_margin_bound(np.array([[1.0], [-1.0]]), np.ones(2), np.array([1.0, 1.0])))  # x ≥ 1 and −x ≥ 1
    0.0
    """
    total = float(h @ u)
    if not total > 0:
        return np.inf
    return float(np.linalg.norm(G.T @ u)) / total


#: :func:`attnlib.max_margin` and :func:`attnlib.label_svm` report a problem infeasible without
#: cvxpy when the NNLS certificate bounds every feasible margin below this (``‖θ‖ ≥ 10⁷``): far
#: below any margin the book meets (≥ 1e-3) and below what CLARABEL resolves at its tolerances.
INFEASIBLE_MARGIN = 1e-7


#: What :func:`_least_distance` returns for a certified infeasible problem.
_INFEASIBLE = "infeasible"


def _least_distance(G: np.ndarray, h: np.ndarray):
    """``min ‖x‖₂ s.t. G x ≥ h`` exactly, by :func:`least_distance_nnls`, certified.

    The answer is returned only when the KKT conditions certify it (primal feasibility and
    complementary slackness, both to 1e-9 relative). When NNLS instead returns a Farkas
    certificate with :func:`farkas_margin_bound` ≤ :data:`INFEASIBLE_MARGIN`, the result is
    ``"infeasible"``. Otherwise ``None`` and the caller falls back to cvxpy. ~100× faster than
    building a cvxpy problem. Returns ``(x, duals)`` with the duals scaled as cvxpy's for
    ``sum_squares`` (``2λ``).
    """
    solved = least_distance_nnls(G, h)
    if solved is None:
        return None
    u, r = solved
    if not np.isfinite(r).all():
        return None
    if -r[-1] <= 1e-8:  # infeasible or nearly so: certified, or cvxpy decides
        return _INFEASIBLE if farkas_margin_bound(G, h, u) <= INFEASIBLE_MARGIN else None
    x = -r[:-1] / r[-1]
    lam = u / -r[-1]
    slack = G @ x - h
    scale = max(1.0, float(np.abs(G).max(initial=0.0) * np.abs(x).max(initial=0.0)))
    infeasible = slack.min(initial=0.0) < -1e-9 * scale
    not_complementary = np.abs(lam * slack).max(initial=0.0) > 1e-9 * scale * max(1.0, lam.max(initial=0.0))
    if infeasible or not_complementary:
        return None
    return x, 2.0 * lam


SOLVERS = ("auto", "cvxpy")


def _solve_min_norm(G: np.ndarray, h: np.ndarray, shape: tuple[int, ...], norm: str, solver: str = "auto"):
    """``min ‖θ‖ s.t. G vec(θ) ≥ h``; returns (theta, status, duals) or raises.

    ``solver="auto"``: the Euclidean/Frobenius problem by the exact NNLS least-distance method when
    it certifies its answer, else (and for the nuclear norm) cvxpy; ``"cvxpy"``: always cvxpy.
    """
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {list(SOLVERS)}, got {solver!r}")
    if norm == "fro" and solver == "auto":
        fast = _least_distance(G, h)
        if fast is _INFEASIBLE:
            return None, "infeasible", None
        if fast is not None:
            return fast[0].reshape(shape), "optimal", fast[1]
    import cvxpy as cp

    if norm == "fro":
        x = cp.Variable(G.shape[1])
        objective = cp.sum_squares(x)
        flat = x
    else:
        if len(shape) != 2:
            raise ValueError(f"norm='nuc' needs a matrix parameter, got parameter shape {shape}")
        x = cp.Variable(shape)
        objective = cp.normNuc(x)
        flat = cp.vec(x, order="C")
    constraint = G @ flat >= h
    problem = cp.Problem(cp.Minimize(objective), [constraint])
    try:
        problem.solve(solver=cp.CLARABEL, **_CLARABEL_OPTS)
    except cp.error.SolverError:
        problem.solve(solver=cp.SCS, eps=1e-9, max_iters=200_000)
    status = problem.status
    if status in (cp.INFEASIBLE, cp.INFEASIBLE_INACCURATE):
        return None, status, None
    if status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE):
        raise RuntimeError(f"max-margin solve failed with solver status {status!r}")
    return np.asarray(x.value, float).reshape(shape), status, np.asarray(constraint.dual_value, float)


def max_margin(
    prob: TokenSelectionProblem, select=None, norm: str = "fro", relax=None, solver: str = "auto"
) -> MaxMarginSolution:
    """ATT-SVM / W-SVM for the selection ``select`` (``None``: the optimal tokens ``prob.opt``).

    Args:
        prob: the problem (its features ``A`` are the keys, not the raw tokens).
        select: (n,) token index per sample.
        norm: "fro" (Euclidean / Frobenius) or "nuc" (nuclear, matrix parameters only).
        relax: sample indices or an (n,) mask whose rows only require ``⟨θ, A_iα − A_it⟩ ≥ 0``.
        solver: "auto" (exact NNLS least-distance solve for "fro" when it certifies its answer,
            else cvxpy with CLARABEL) or "cvxpy" (always cvxpy).

    Raises:
        InfeasibleError: no θ separates the selected tokens.

    >>> import numpy as np, attnlib as al
    >>> X = np.array([[[-0.1, 1.0, 1.0], [1.0, 0.0, 0.9], [0.0, 0.0, 0.9]]])
    >>> prob = al.prompt_attention(X, [1], v=[0, 0, 1], W=np.diag([1.0, 1.0, 0.0]))
    >>> sol = al.max_margin(prob)
    >>> np.round(sol.theta, 3).tolist(), sol.neighbors.tolist()
    ([-0.099, 0.99, 0.0], [[False, False, True]])
    """
    if norm not in ("fro", "nuc"):
        raise ValueError(f"norm must be 'fro' or 'nuc', got {norm!r}")
    sel = _check_select(prob, select)
    rel = _check_relax(relax, prob.n)
    n, T = prob.n, prob.T
    A = prob.A.reshape(n, T, prob.size)
    diffs = A[np.arange(n), sel][:, None, :] - A  # (n, T, size)
    rows = np.ones((n, T), bool)
    rows[np.arange(n), sel] = False
    rhs = np.where(rel, 0.0, 1.0)[:, None] * np.ones((1, T))
    G, h = diffs[rows], rhs[rows]
    theta, status, duals = _solve_min_norm(G, h, prob.shape, norm, solver)
    if theta is None:
        raise InfeasibleError(
            f"ATT-SVM is infeasible for selection {sel.tolist()} (n={n}, T={T}, parameter shape "
            f"{prob.shape}): no θ puts every selected token's logit above the others in its sample"
        )
    values = np.zeros((n, T))
    values[rows] = G @ theta.ravel()
    # Active: the constraint holds with equality up to the solver's accuracy.
    neighbors = np.zeros((n, T), bool)
    neighbors[rows] = np.abs(values[rows] - h) <= ACTIVE_TOL * np.maximum(1.0, np.abs(values[rows]))
    dual_grid = np.zeros((n, T))
    dual_grid[rows] = duals
    size = np.linalg.norm(theta) if norm == "fro" else np.linalg.norm(theta, "nuc")
    return MaxMarginSolution(
        theta=theta,
        margin=float(1.0 / size) if size > 0 else np.inf,
        status=status,
        select=sel,
        neighbors=neighbors,
        constraint_values=values,
        relax=rel,
        norm=norm,
        duals=dual_grid,
    )


def label_svm(X_selected, y) -> LabelSVM:
    """Label SVM on the selected tokens: ``v_mm = argmin ‖v‖ s.t. y_i v·x_i ≥ 1``.

    Args:
        X_selected: (n, d) the selected token of each sample.  y: (n,) labels ±1.

    >>> import attnlib as al
    >>> sv = al.label_svm([[1.0, 1.0], [1.0, -1.0], [0.5, 1.0]], [1, -1, 1])
    >>> [round(float(c), 6) for c in sv.v], sv.support.tolist()
    ([0.0, 1.0], [True, True, True])
    """
    X = finite_array("X_selected", X_selected, ndim=2)
    y = check_labels(y, X.shape[0])
    G = y[:, None] * X
    v, status, _ = _solve_min_norm(G, np.ones(len(y)), (X.shape[1],), "fro")
    if v is None:
        raise InfeasibleError(f"the label SVM is infeasible: no v (without bias) separates the {len(y)} samples")
    values = G @ v
    support = np.abs(values - 1.0) <= ACTIVE_TOL * np.maximum(1.0, np.abs(values))
    return LabelSVM(v=v, margin=float(1.0 / np.linalg.norm(v)), support=support, status=status)


@dataclass(frozen=True, eq=False)
class SelectionReport:
    """One selection's ATT-SVM verdict: feasible or not, solution, locally optimal or not."""

    select: tuple[int, ...]
    feasible: bool
    locally_optimal: bool
    solution: MaxMarginSolution | None


def _locally_optimal(prob: TokenSelectionProblem, sol: MaxMarginSolution) -> bool:
    # Strict inequality on every neighbour (ties are not locally optimal).
    sel_scores = prob.gamma[np.arange(prob.n), sol.select][:, None]
    return bool(np.all(~sol.neighbors | (sel_scores > prob.gamma)))


def is_locally_optimal(prob: TokenSelectionProblem, select) -> bool:
    """[MMTS]: ``α`` is locally optimal if ATT-SVM(α) is feasible and ``γ_iα_i > γ_it`` for every
    SVM-neighbour ``t`` of every sample. An infeasible selection is not locally optimal."""
    try:
        sol = max_margin(prob, select)
    except InfeasibleError:
        return False
    return _locally_optimal(prob, sol)


def enumerate_selections(prob: TokenSelectionProblem, max_count: int = MAX_ENUMERATION) -> list[SelectionReport]:
    """Solve ATT-SVM for all ``T^n`` selections (small problems only)."""
    count = prob.T**prob.n
    if count > max_count:
        raise ValueError(
            f"cannot enumerate T^n = {prob.T}^{prob.n} = {count} selections (max_count={max_count}); "
            "use a smaller problem or raise max_count"
        )
    reports = []
    for sel in itertools.product(range(prob.T), repeat=prob.n):
        try:
            sol = max_margin(prob, np.array(sel))
        except InfeasibleError:
            reports.append(SelectionReport(sel, False, False, None))
            continue
        reports.append(SelectionReport(sel, True, _locally_optimal(prob, sol), sol))
    return reports


def locally_optimal_selections(prob: TokenSelectionProblem, max_count: int = MAX_ENUMERATION) -> list[SelectionReport]:
    """Every locally-optimal selection: the directions GD can converge to [MMTS]."""
    return [r for r in enumerate_selections(prob, max_count) if r.locally_optimal]


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


def check_selection(select, n: int, T: int) -> np.ndarray:
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
    sel = check_selection(select, n, T)
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
    >>> p = balanced_direction(al.joint_svms(X, y, select=1), rho=1.0)
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


def decoder_svms(joint: DecoderAttention, select) -> JointSVMs:
    """Label SVM of the selected tokens and the full and relaxed W-SVMs, for ``(W, u)`` training.

    :func:`attnlib.joint_svms` for the keys ``vec(x_it z_iᵀ)`` of a :class:`DecoderAttention`:
    ``label`` is ``u_mm(α) = argmin ‖u‖ s.t. y_i uᵀx_iα_i ≥ 1``, ``full`` and ``relaxed`` hold
    ``vec W`` (reshape to ``joint.shape``). Pass the result to :func:`attnlib.svm.balanced_direction`
    for the direction of ``vec W`` predicted when ``‖u‖/‖W‖ → ρ``.

    Args: ``joint`` the problem, ``select`` (n,) the selected token of each sequence.

    >>> import numpy as np, attnlib as al
    >>> D = al.datasets.planted_tokens(3, 4, 5, seed=0)
    >>> svms = decoder_svms(al.model.joint_self_attention(D.X, D.y), D.signal)
    >>> svms.full.theta.shape, bool(np.all(svms.label_margins > 0))
    ((25,), True)
    """
    n, T, _ = joint.X.shape
    sel = np.asarray(select)
    if sel.shape != (n,) or not np.issubdtype(sel.dtype, np.integer) or np.any((sel < 0) | (sel >= T)):
        raise ValueError(f"select must hold {n} token indices in [0, {T - 1}], got {select!r}")
    rows = np.arange(n)
    chosen = joint.X[rows, sel]
    label = label_svm(chosen, joint.y)
    onehot = np.zeros((n, T))
    onehot[rows, sel] = 1.0
    prob = token_selection(joint.keys, onehot)  # the SVM depends only on the keys and the selection
    full = max_margin(prob, sel)
    relaxed = max_margin(prob, sel, relax=~label.support)
    margins = joint.y * (chosen @ label.v) / np.linalg.norm(label.v)
    return JointSVMs(label, label.support.copy(), full, relaxed, sel, joint.keys, margins)


# ---------------------------------------------------------------------------------------- SVMs
def svm_constraints(X, Z, select) -> tuple[np.ndarray, np.ndarray]:
    """Rank-one constraints of W-SVM for self-attention: ``a_kᵀ W z_k ≥ 1``.

    Args: ``X`` (n, T, d) tokens, ``Z`` (n, d_z) queries, ``select`` (n,) selected token per sample.
    Returns ``a`` (n·(T−1), d) key differences ``x_iα_i − x_it`` (t ≠ α_i) and ``z`` (n·(T−1), d_z).
    """
    X, Z = np.asarray(X, float), np.asarray(Z, float)
    n, T, _ = X.shape
    sel = np.asarray(select)
    rows = np.ones((n, T), bool)
    rows[np.arange(n), sel] = False
    a = (X[np.arange(n), sel][:, None, :] - X)[rows]
    z = np.broadcast_to(Z[:, None, :], (n, T, Z.shape[1]))[rows]
    return a, z


def _basis(M: np.ndarray) -> np.ndarray:
    """Orthonormal basis (columns) of the row span of ``M`` (k, d)."""
    _, s, vt = np.linalg.svd(M, full_matrices=False)
    keep = s > s.max(initial=0.0) * max(M.shape) * np.finfo(float).eps
    return vt[keep].T


_SVEC_CACHE: dict = {}


def _svec_index(N: int):
    """Rows, columns and scales of Clarabel's PSD-triangle vector (upper triangle, column by column,
    off-diagonal entries times √2)."""
    if N not in _SVEC_CACHE:
        rows = np.array([i for j in range(N) for i in range(j + 1)])
        cols = np.array([j for j in range(N) for i in range(j + 1)])
        scale = np.where(rows == cols, 1.0, np.sqrt(2.0))
        _SVEC_CACHE[N] = rows, cols, scale
    return _SVEC_CACHE[N]


@dataclass(frozen=True)
class SVMEquivalence:
    """[TFSVM]'s SVM-equivalence of S trained cross-attention runs (a selected *set* of tokens per sample).

    Attributes (NaN where ``solved`` is False):
        W_dir: (S, d, d) ``argmin ‖W‖_F`` s.t. ``(x_ia − x_ib)ᵀ W z_i = 0`` for ``a, b ∈ O_i`` and
            ``(x_ia − x_iτ)ᵀ W z_i ≥ 1`` for ``a ∈ O_i, τ ∉ O_i`` (the max-margin direction of the sets).
        W_fin: (S, d, d) ``argmin ‖W‖_F`` s.t. ``(x_ib − x_ia)ᵀ W z_i = log(σ_ib/σ_ia)`` for ``a, b ∈ O_i``.
        R: (S,) the least-squares coefficient of ``W − W_fin`` on ``W_dir``.
        W_eq: (S, d, d) ``W_fin + R·W_dir``.
        solved: (S,) bool: ``W_dir`` certified (KKT) feasible and optimal; False if infeasible.
    """

    W_dir: np.ndarray
    W_fin: np.ndarray
    R: np.ndarray
    W_eq: np.ndarray
    solved: np.ndarray


def _selection_rows(X, Z, selected, log_sigma):
    """Equality rows (pairs inside ``O_i`` against its first token), their log-ratio targets, and
    inequality rows (``a ∈ O_i`` against ``τ ∉ O_i``) of one run, as vectorised ``d×d`` matrices."""
    eq, target, ineq = [], [], []
    for i in range(X.shape[0]):
        inside, outside = np.flatnonzero(selected[i]), np.flatnonzero(~selected[i])
        for b in inside[1:]:
            eq.append(np.outer(X[i, b] - X[i, inside[0]], Z[i]).ravel())
            target.append(log_sigma[i, b] - log_sigma[i, inside[0]])
        for a in inside:
            for tau in outside:
                ineq.append(np.outer(X[i, a] - X[i, tau], Z[i]).ravel())
    size = X.shape[2] * Z.shape[1]
    return (np.reshape(eq, (-1, size)), np.asarray(target), np.reshape(ineq, (-1, size)))


def svm_equivalence(X, Z, selected, log_sigma, W) -> SVMEquivalence:
    """``W^SVMeq = W_fin + R·W_dir`` of S runs ([TFSVM], nonlinear heads): see :class:`SVMEquivalence`.

    The equalities are removed by a reduction: ``W_dir`` lies in the orthogonal complement ``E⊥`` of
    the equality rows, where ``⟨G, W⟩ = ⟨P G, W⟩``, so ``W_dir = argmin ‖W‖ s.t. ⟨P G_k, W⟩ ≥ 1``: a
    least-distance problem (Lawson–Hanson NNLS, KKT-certified, :func:`least_distance_nnls`).
    ``W_fin`` is the minimum-norm solution of the equalities (``E⁺ r``), so ``W_fin ∈ E`` and
    ``W_fin ⊥ W_dir``. ``R = ⟨W − W_fin, W_dir⟩/‖W_dir‖²``.

    Args: ``X`` (S, n, T, d), ``Z`` (S, n, d_z), ``selected`` (S, n, T) bool (every sample selects at
    least one token), ``log_sigma`` (S, n, T) the final log-softmax, ``W`` (S, d, d_z) the trained
    matrices.

    >>> import numpy as np
    >>> X = np.eye(3)[None, None]                       # one run, one sample, tokens e1, e2, e3
    >>> sel = np.array([[[True, True, False]]])
    >>> eq = svm_equivalence(X, np.array([[[0, 0, 1.0]]]), sel, np.log([[[0.5, 0.5, 1e-9]]]), np.zeros((1, 3, 3)))
    >>> bool(eq.solved[0]), np.round(eq.W_dir[0] @ [0, 0, 1], 3).tolist()
    (True, [0.333, 0.333, -0.667])
    """
    X, Z, log_sigma, W = (np.asarray(v, float) for v in (X, Z, log_sigma, W))
    selected = np.asarray(selected, bool)
    S, n, T, d = X.shape
    if Z.shape[:2] != (S, n) or selected.shape != (S, n, T) or log_sigma.shape != (S, n, T):
        raise ValueError(f"Z must be (S, n, d_z), selected and log_sigma (S, n, T); got {Z.shape}, {selected.shape}")
    if not selected.any(axis=-1).all():
        raise ValueError("selected must contain at least one token of every sample")
    shape = (d, Z.shape[2])
    W_dir, W_fin = np.full((2, S) + shape, np.nan)
    solved = np.zeros(S, bool)
    for s in range(S):
        eq, target, ineq = _selection_rows(X[s], Z[s], selected[s], log_sigma[s])
        W_fin[s] = (np.linalg.pinv(eq) @ target).reshape(shape) if len(eq) else 0.0
        if not len(ineq):
            continue
        basis = _basis(eq) if len(eq) else np.zeros((eq.shape[1], 0))
        projected = ineq - (ineq @ basis) @ basis.T
        found = _least_distance(projected, np.ones(len(ineq)))
        if isinstance(found, tuple):
            W_dir[s], solved[s] = found[0].reshape(shape), True
    R = np.einsum("sij,sij->s", W - W_fin, W_dir) / np.einsum("sij,sij->s", W_dir, W_dir)
    return SVMEquivalence(W_dir, W_fin, R, W_fin + R[:, None, None] * W_dir, solved)


@dataclass(frozen=True, eq=False)
class NuclearSVM:
    """Nuclear-norm W-SVM ``W*_mm(α) = argmin ‖W‖_* s.t. a_kᵀ W z_k ≥ 1`` [TFSVM].

    Attributes:
        W: (d, d_z) the solution (``None`` when infeasible).  status: Clarabel's status string.
        feasible: bool.  nuclear_norm: ``‖W‖_*``.  dual_value: the dual objective ``Σ λ_k``.
        violation: ``max_k max(0, 1 − a_kᵀ W z_k)`` (primal accuracy).
        gap: ``(‖W‖_* − Σλ)/‖W‖_*`` (relative duality gap, the optimality accuracy).
    """

    W: np.ndarray | None
    status: str
    feasible: bool
    nuclear_norm: float
    dual_value: float
    violation: float
    gap: float


def nuclear_svm(X, Z, select, tol: float = 1e-10) -> NuclearSVM:
    """Exact nuclear-norm W-SVM for self-attention features, fast (Clarabel on a reduced SDP).

    Reduction: the constraints see W only through ``P_U W P_V`` (U = span of the key differences
    ``a_k``, V = span of the queries), and projecting does not increase ``‖W‖_*``; so
    ``W = Q_U M Q_Vᵀ`` with ``M`` (p, r), p = dim U, r = dim V. The dual,

    .. math::

        \\max_{λ ≥ 0} \\sum_k λ_k \\quad \\text{s.t.} \\quad
        \\Big\\|\\sum_k λ_k ã_k z̃_k^⊤\\Big\\|_{op} ≤ 1
        \\iff \\begin{pmatrix} I_p & S(λ) \\\\ S(λ)^⊤ & I_r \\end{pmatrix} ⪰ 0,

    has one variable per constraint and a (p + r)-dimensional PSD cone; ``M = 2 Y_{12}`` from the
    cone's dual matrix ``Y``. Several times faster than the cvxpy problem (PSD cone of size 2d, rebuilt
    per instance); the time is Clarabel's factorisation of the dense cone block. The verdict
    "infeasible" is Clarabel's (dual unbounded).

    Args: ``X`` (n, T, d), ``Z`` (n, d_z), ``select`` (n,) as in :func:`svm_constraints`;
    ``tol``: Clarabel's gap and feasibility tolerances.

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.random_tokens(4, 5, 6, seed=0, queries="cross")
    >>> X, Z = prob.factors
    >>> sol = nuclear_svm(X, Z, prob.opt)
    >>> ref = al.max_margin(prob, norm="nuc")
    >>> sol.feasible, bool(np.isclose(sol.nuclear_norm, 1 / ref.margin, rtol=1e-8)), sol.violation < 1e-8
    (True, True, True)
    """
    return _nuclear_clarabel(*svm_constraints(X, Z, select), tol)


def _nuclear_clarabel(a: np.ndarray, z: np.ndarray, tol: float = 1e-10) -> NuclearSVM:
    """:func:`nuclear_svm` from the constraint vectors ``a`` (k, d), ``z`` (k, d_z)."""
    import clarabel
    from scipy import sparse

    k = len(a)
    zero = np.all(a == 0, axis=1)
    if zero.any():  # a selected token equal to another one of its sample: 0 ≥ 1
        return NuclearSVM(None, "infeasible (a constraint row is zero)", False, np.nan, np.nan, np.nan, np.nan)
    QU, QV = _basis(a), _basis(z)
    at, zt = a @ QU, z @ QV  # (k, p), (k, r)
    p, r = at.shape[1], zt.shape[1]
    N = p + r
    rows, cols, scale = _svec_index(N)
    # column k of the cone matrix: svec of [[0, ã z̃ᵀ], [z̃ ãᵀ, 0]] (only the upper block is in the triangle)
    upper = (rows < p) & (cols >= p)
    E = np.zeros((len(rows), k))
    E[upper] = (at[:, rows[upper]] * zt[:, cols[upper] - p]).T * scale[upper, None]
    A = sparse.csc_matrix(np.vstack([-np.eye(k), E]))
    b = np.concatenate([np.zeros(k), np.where(rows == cols, 1.0, 0.0)])
    settings = clarabel.DefaultSettings()
    settings.verbose = False
    settings.tol_gap_abs = settings.tol_gap_rel = settings.tol_feas = tol
    settings.tol_ktratio = 1e-8
    settings.direct_solve_method = "faer"  # dense-friendly factorisation: ~2× qdldl on these KKT systems
    settings.max_threads = 1
    cones = [clarabel.NonnegativeConeT(k), clarabel.PSDTriangleConeT(N)]
    solver = clarabel.DefaultSolver(sparse.csc_matrix((k, k)), -np.ones(k), A, b, cones, settings)
    sol = solver.solve()
    status = str(sol.status)
    if "Infeasible" in status:  # the dual is unbounded: no W meets the constraints
        return NuclearSVM(None, status, False, np.nan, np.nan, np.nan, np.nan)
    if "Solved" not in status:
        raise RuntimeError(f"nuclear-norm SVM: Clarabel returned {status}")
    y = np.asarray(sol.z)[k:] / scale
    Y = np.zeros((N, N))
    Y[rows, cols] = y
    M = 2.0 * Y[:p, p:]
    W = QU @ M @ QV.T
    values = np.einsum("kd,de,ke->k", a, W, z)
    nuc = float(np.linalg.svd(W, compute_uv=False).sum())
    lam = float(np.sum(sol.x))
    return NuclearSVM(W, status, True, nuc, lam, float(max(0.0, 1.0 - values.min())), (nuc - lam) / nuc)


# ---------------------------------------------------------------------------------------- batched SVMs
def _sym(B: np.ndarray) -> np.ndarray:
    return 0.5 * (B + np.swapaxes(B, -1, -2))


def _inverse_cholesky(X: np.ndarray, done: np.ndarray) -> np.ndarray:
    """``L⁻¹`` with ``X = L Lᵀ`` for the S matrices (S, N, N); an instance whose ``X`` is no longer
    numerically positive definite is marked ``done`` (in place) and gets the identity."""
    X = np.where(done[:, None, None], np.eye(X.shape[-1]), X)
    try:
        L = np.linalg.cholesky(X)
    except np.linalg.LinAlgError:
        ev = np.linalg.eigvalsh(X)
        bad = ev[:, 0] <= 1e-13 * ev[:, -1]
        done |= bad
        L = np.linalg.cholesky(np.where(bad[:, None, None], np.eye(X.shape[-1]), X))
    return _triangular_inverse(L)


def _psd_step(Linv: np.ndarray, dX: np.ndarray, skip: np.ndarray, exact: bool = True) -> np.ndarray:
    """Largest α ≤ 1 with ``X + α dX ⪰ 0``, ``X = L Lᵀ``: (S,); 0 where ``skip``.

    ``exact=False``: a cheap lower bound from ``λ_min(B) ≥ m − s√(N−1)`` (``B = L⁻¹dXL⁻ᵀ``, ``m`` and ``s²``
    the mean and variance of its eigenvalues, from its trace and Frobenius norm; Wolkowicz–Styan)."""
    B = Linv @ dX @ np.swapaxes(Linv, -1, -2)
    if exact:
        low = np.linalg.eigvalsh(_sym(B))[:, 0]
    else:
        N = B.shape[-1]
        m = np.trace(B, axis1=1, axis2=2) / N
        low = m - np.sqrt(np.maximum(np.sum(B * B, (1, 2)) / N - m * m, 0.0) * (N - 1))
    return np.where(skip, 0.0, np.where(low < 0, np.minimum(1.0, -1.0 / np.where(low < 0, low, -1.0)), 1.0))


def _triangular_inverse(L: np.ndarray) -> np.ndarray:
    """``L⁻¹`` of the S lower-triangular matrices (S, N, N), by forward substitution row after row,
    all S at once: ``X_i = −(L_{i,:i} X_{:i,:i}) / L_ii`` and ``X_ii = 1/L_ii``.

    N batched products instead of S LAPACK calls: as fast as ``dtrtri`` per matrix on these sizes
    (N ≤ 50), and it keeps scipy out of the batched SVMs (its import costs more than a whole batch).

    >>> L = np.array([[[2.0, 0.0], [1.0, 4.0]]])
    >>> (_triangular_inverse(L) @ L).round(15).tolist()
    [[[1.0, 0.0], [0.0, 1.0]]]
    """
    diagonal = np.diagonal(L, axis1=1, axis2=2)
    if not np.all(diagonal != 0):
        raise np.linalg.LinAlgError("singular triangular factor (a zero on the diagonal)")
    inv_diag = 1.0 / diagonal
    out = np.zeros_like(L)
    out[:, 0, 0] = inv_diag[:, 0]
    for i in range(1, L.shape[1]):
        out[:, i, :i] = (L[:, i : i + 1, :i] @ out[:, :i, :i])[:, 0, :] * -inv_diag[:, i : i + 1]
        out[:, i, i] = inv_diag[:, i]
    return out


def _cholesky_or_stop(M: np.ndarray, done: np.ndarray) -> np.ndarray:
    """Cholesky factors of the S matrices (S, K, K); an instance whose ``M`` is not numerically positive
    definite is marked ``done`` (in place) and gets the identity."""
    try:
        return np.linalg.cholesky(M)
    except np.linalg.LinAlgError:
        out = np.repeat(np.eye(M.shape[-1])[None], len(M), 0)
        for j in range(len(M)):
            try:
                out[j] = np.linalg.cholesky(M[j])
            except np.linalg.LinAlgError:
                done[j] = True
        return out


def _solve_or_stop(H: np.ndarray, rhs: np.ndarray, done: np.ndarray) -> np.ndarray:
    """``H⁻¹ rhs`` for the S systems (S, K, K), (S, K); an instance whose ``H`` is numerically singular
    is marked ``done`` (in place) and gets 0."""
    try:
        return np.linalg.solve(H, rhs[..., None])[..., 0]
    except np.linalg.LinAlgError:
        out = np.zeros_like(rhs)
        for j in range(len(H)):
            try:
                out[j] = np.linalg.solve(H[j], rhs[j])
            except np.linalg.LinAlgError:
                done[j] = True
        return out


def _max_step_pos(x: np.ndarray, dx: np.ndarray) -> np.ndarray:
    """Largest α ≤ 1 with ``x + α dx ≥ 0`` for positive ``x``: (S, K) → (S,)."""
    ratio = np.where(dx < 0, -x / np.where(dx < 0, dx, -1.0), np.inf)
    return np.minimum(1.0, ratio.min(axis=-1, initial=np.inf))


@dataclass(frozen=True, eq=False)
class SVMBatch:
    """Max-margin W-SVMs of a batch of S instances, each with a certificate of optimality.

    Attributes:
        W: (S, d, d_z) the solutions, rescaled to be exactly feasible (``min_k a_kᵀ W z_k = 1``); NaN
            where ``certified`` is False.
        norm: (S,) ``‖W‖`` (Frobenius or nuclear), an upper bound on the optimal norm.
        lower: (S,) a lower bound on the optimal norm, from a dual-feasible point.
        gap: (S,) ``(norm − lower)/norm``, the certified relative optimality gap.
        certified: (S,) bool: a feasible ``W`` with ``gap ≤`` the requested accuracy.
        iterations: interior-point iterations used (the batch's largest).
    """

    W: np.ndarray
    norm: np.ndarray
    lower: np.ndarray
    gap: np.ndarray
    certified: np.ndarray
    iterations: int


def _span_bases(M: np.ndarray):
    """Orthonormal bases (columns) of the row spans of the S matrices ``M`` (S, K, d), padded with zero
    columns to the largest dimension of the batch: (S, d, p)."""
    _, s, vt = np.linalg.svd(M, full_matrices=False)
    keep = s > s[:, :1] * max(M.shape[1:]) * np.finfo(float).eps
    width = max(int(keep.sum(axis=1).max(initial=0)), 1)
    return np.swapaxes(vt * keep[:, :, None], -1, -2)[:, :, :width]


def _certify(a, z, W, lower_fn, norm: str, gap_tol: float):
    """Rescale ``W`` (S, d, d_z) to be exactly feasible; upper bound, lower bound, gap, certified."""
    v = np.einsum("skd,sde,ske->sk", a, W, z).min(axis=1)
    ok = np.isfinite(v) & (v > 0)
    W = np.where(ok[:, None, None], W / np.where(ok, v, 1.0)[:, None, None], np.nan)
    with np.errstate(invalid="ignore"):
        sv = np.linalg.svd(np.nan_to_num(W), compute_uv=False)
    upper = np.where(ok, sv.sum(1) if norm == "nuc" else np.sqrt((sv**2).sum(1)), np.nan)
    lower = lower_fn()
    gap = (upper - lower) / upper
    certified = ok & (gap <= gap_tol)
    W[~certified] = np.nan
    return W, upper, lower, gap, certified


def _apply_inverse(Li: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``(L Lᵀ)⁻¹ v`` from ``Li = L⁻¹`` (S, K, K), ``v`` (S, K, c): two products, never ``(LLᵀ)⁻¹`` itself."""
    return np.swapaxes(Li, -1, -2) @ (Li @ v)


def frobenius_svm_batch(a, z, tol: float = 1e-13, max_iter: int = 60) -> SVMBatch:
    """Frobenius-norm W-SVMs ``W_mm = argmin ‖W‖_F s.t. a_kᵀ W z_k ≥ 1`` of S instances at once.

    ``W_mm = p/‖p‖²`` with ``p`` the point of the convex hull of the ``D_k = a_k z_kᵀ`` nearest to 0
    (hard-margin SVM through the origin); the hull contains 0 exactly when the SVM is infeasible. A
    primal–dual interior-point method (Mehrotra) solves ``min ½ λᵀGλ`` over the simplex
    (``G_kl = (a_k·a_l)(z_k·z_l)``, K×K per instance, all instances in one batch, finished ones
    dropped from it). An active-set polish then solves ``G_AA μ_A = 1`` on the support and keeps it
    when the KKT conditions hold, so the zeros of ``W = Σ μ_k D_k`` are exact to rounding.

    Certificate: ``W`` rescaled to be exactly feasible is an upper bound on ``‖W_mm‖_F``; any ``λ ≥ 0``
    gives the lower bound ``1ᵀλ/‖Σλ_k D_k‖_F`` (weak duality, best scaling). ``certified`` when the
    relative gap is at most ``100·tol`` (or 1e-10). An instance without a feasible ``W`` (0 in the hull,
    up to rounding) comes back uncertified: decide it with an LP.

    Args: ``a`` (S, K, d), ``z`` (S, K, d_z) as in :func:`svm_constraints`.

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.random_tokens(4, 5, 6, seed=0, queries="cross")
    >>> a, z = svm_constraints(*prob.factors, prob.opt)
    >>> sol = frobenius_svm_batch(a[None], z[None])
    >>> bool(sol.certified[0]), bool(np.allclose(sol.W[0], al.max_margin(prob).theta, atol=1e-10))
    (True, True)
    """
    a, z = np.asarray(a, float), np.asarray(z, float)
    S, K, _ = a.shape
    G = (a @ np.swapaxes(a, 1, 2)) * (z @ np.swapaxes(z, 1, 2))
    scale = np.maximum(np.einsum("skk->s", G) / K, 1e-300)
    Gs = G / scale[:, None, None]  # unit mean diagonal
    lam, s, nu = np.full((S, K), 1.0 / K), np.ones((S, K)), np.zeros(S)
    done = np.zeros(S, bool)
    it = 0
    while it < max_iter and not done.all():
        it += 1
        act = np.nonzero(~done)[0]
        Ga, la, sa, na = Gs[act], lam[act], s[act], nu[act]
        rd = np.einsum("skl,sl->sk", Ga, la) - na[:, None] - sa
        re = 1.0 - la.sum(1)
        mu = np.sum(la * sa, 1) / K
        value = np.einsum("sk,skl,sl->s", la, Ga, la)
        # converged (relative to the squared distance), or the distance is 0 to rounding (infeasible)
        stop = (mu <= tol * value) & (np.abs(rd).max(1) <= 100 * tol) & (np.abs(re) <= 100 * tol)
        stop |= (value <= 1e-14) & (mu <= 1e-15)
        fail = np.zeros(act.size, bool)
        Li = _triangular_inverse(_cholesky_or_stop(Ga + (sa / la)[:, :, None] * np.eye(K), fail))
        done[act[stop | fail]] = True
        one = _apply_inverse(Li, np.ones((act.size, K, 1)))[..., 0]

        def direction(comp, Li=Li, rd=rd, re=re, la=la, sa=sa, one=one):
            # G Δλ − Δν 1 − Δs = −r_d, 1ᵀΔλ = r_e, s∘Δλ + λ∘Δs = comp
            h = _apply_inverse(Li, (-rd + comp / la)[..., None])[..., 0]
            dn = (re - h.sum(1)) / one.sum(1)
            dl = h + dn[:, None] * one
            return dl, dn, (comp - sa * dl) / la

        dl, dn, ds = direction(-la * sa)
        al_ = np.minimum(_max_step_pos(la, dl), _max_step_pos(sa, ds))
        mu_aff = np.sum((la + al_[:, None] * dl) * (sa + al_[:, None] * ds), 1) / K
        sigma = np.clip(mu_aff / np.maximum(mu, 1e-300), 0, 1) ** 3
        dl, dn, ds = direction((sigma * mu)[:, None] - la * sa - dl * ds)
        step = np.minimum(1.0, 0.99 * np.minimum(_max_step_pos(la, dl), _max_step_pos(sa, ds)))
        step = np.where(stop | fail, 0.0, step)
        lam[act], s[act], nu[act] = la + step[:, None] * dl, sa + step[:, None] * ds, na + step * dn
    # active-set polish: G_AA μ_A = 1 on the support, kept where μ_A > 0 and (Gμ)_k ≥ 1 off it
    eye = np.eye(K)
    active = lam > s
    Hp = np.where(active[:, :, None] & active[:, None, :], Gs, 0.0) + (~active)[:, :, None] * eye
    with np.errstate(all="ignore"):
        try:
            mp = np.linalg.solve(Hp, active.astype(float)[..., None])[..., 0]
        except np.linalg.LinAlgError:
            mp = np.full_like(lam, np.nan)
        vals = np.einsum("skl,sl->sk", Gs, mp)
        good = np.all(np.where(active, mp > 0, vals >= 1 - 1e-9), axis=1) & np.all(np.isfinite(mp), axis=1)
        lam = np.where(good[:, None], mp, lam) / scale[:, None]
    W = np.einsum("skd,sk,ske->sde", a, lam, z)

    def lower():
        with np.errstate(divide="ignore", invalid="ignore"):
            return lam.sum(1) / np.linalg.norm(W, axis=(1, 2))

    W, upper, low, gap, cert = _certify(a, z, W, lower, "fro", max(100 * tol, 1e-10))
    return SVMBatch(W, upper, low, gap, cert, it)


def nuclear_svm_batch(a, z, tol: float = 1e-10, max_iter: int = 80) -> SVMBatch:
    """Nuclear-norm W-SVMs ``W*_mm = argmin ‖W‖_* s.t. a_kᵀ W z_k ≥ 1`` of S instances at once [TFSVM].

    A primal–dual interior-point method (HKM direction, Mehrotra predictor–corrector) on the SDP pair

    .. math::

        \\max_{λ ≥ 0} \\sum_k λ_k \\ \\text{s.t.}\\ \\begin{pmatrix} I_p & S(λ) \\\\ S(λ)^⊤ & I_r \\end{pmatrix} ⪰ 0,
        \\quad S(λ) = \\sum_k λ_k ã_k z̃_k^⊤;
        \\qquad \\min \\operatorname{tr} Y \\ \\text{s.t.}\\ 2ã_k^⊤ Y_{12} z̃_k ≥ 1,\\ Y ⪰ 0,

    in the span of the constraints (``ã_k``, ``z̃_k``: coordinates in orthonormal bases of the spans of
    the ``a_k`` and of the ``z_k``; ``W = 2 Q_U Y_{12} Q_Vᵀ``). Every constraint matrix has rank two,
    ``u_k w_kᵀ + w_k u_kᵀ`` with ``u_k = (ã_k, 0)``, ``w_k = (0, z̃_k)``, so the Newton (Schur complement)
    matrix ``M_kl = tr(A_k Y A_l F⁻¹)`` is a sum of four Hadamard products of K×K matrices
    (``(w_kᵀYu_l)(w_lᵀF⁻¹u_k) + …``): each step costs a few K×K and (p+r)² operations per instance,
    never the dense ((p+r)(p+r+1)/2)² cone block that a generic conic solver factorises.

    Certificate per instance: ``W`` rescaled to be exactly feasible gives the upper bound ``‖W‖_*``;
    ``λ/max(1, ‖S(λ)‖_op)`` is dual feasible, so its sum is a lower bound; ``certified`` when their
    relative gap is at most ``100·tol``. Every instance must be feasible (decide it first, e.g. with
    :func:`frobenius_svm_batch` and an LP).

    Args: ``a`` (S, K, d), ``z`` (S, K, d_z) as in :func:`svm_constraints`.

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.random_tokens(4, 5, 6, seed=0, queries="cross")
    >>> a, z = svm_constraints(*prob.factors, prob.opt)
    >>> sol = nuclear_svm_batch(a[None], z[None])
    >>> ref = al.max_margin(prob, norm="nuc")
    >>> bool(sol.certified[0]), bool(np.isclose(sol.norm[0], 1 / ref.margin, rtol=1e-7))
    (True, True)
    """
    a, z = np.asarray(a, float), np.asarray(z, float)
    S, K, _ = a.shape
    QU, QV = _span_bases(a), _span_bases(z)
    at, zt = a @ QU, z @ QV  # (S, K, p), (S, K, r)
    p, r = at.shape[2], zt.shape[2]
    N = p + r

    def T(B):
        return np.swapaxes(B, -1, -2)

    def S_of(lam, at=at, zt=zt):  # S(λ) = Σ_k λ_k ã_k z̃_kᵀ: (S, p, r)
        return T(at * lam[:, :, None]) @ zt

    def off(Sl):  # [[0, Sl], [Slᵀ, 0]]
        B = np.zeros((len(Sl), N, N))
        B[:, :p, p:], B[:, p:, :p] = Sl, T(Sl)
        return B

    def A_of(B, b_nn, at, zt):  # A_k(B) = 2 ã_kᵀ B12 z̃_k − b_k (B symmetric)
        return 2.0 * np.sum((at @ B[:, :p, p:]) * zt, axis=2) - b_nn

    eye_K, eye_N = np.eye(K), np.eye(N)
    s1 = np.linalg.norm(S_of(np.ones((S, K))), ord=2, axis=(1, 2))
    lam = np.repeat((0.5 / np.maximum(s1, 1e-300))[:, None], K, 1)
    Y, x = np.repeat(eye_N[None], S, 0), np.ones((S, K))
    Z = eye_N - off(S_of(lam))
    done = np.zeros(S, bool)
    it = 0
    while it < max_iter and not done.all():
        it += 1
        act = np.nonzero(~done)[0]  # finished instances leave the batch
        a_, z_, Ya, xa, Za, la = at[act], zt[act], Y[act], x[act], Z[act], lam[act]
        rp = 1.0 - A_of(Ya, xa, a_, z_)
        mu = (np.einsum("sij,sij->s", Ya, Za) + np.sum(xa * la, 1)) / (N + K)
        primal, dual = np.trace(Ya, axis1=1, axis2=2), la.sum(1)
        # converged, or stalled at rounding (the certificate below judges the result either way)
        stop = (np.abs(primal - dual) <= tol * (1 + dual)) & (np.abs(rp).max(1) <= 10 * tol)
        stop |= mu <= 1e-14 * (1 + dual)
        LY, LZ = _inverse_cholesky(Ya, stop), _inverse_cholesky(Za, stop)
        P = T(LZ) @ LZ  # Z⁻¹
        XUU, XWW, XWU = a_ @ Ya[:, :p, :p] @ T(a_), z_ @ Ya[:, p:, p:] @ T(z_), z_ @ Ya[:, p:, :p] @ T(a_)
        PUU, PWW, PWU = a_ @ P[:, :p, :p] @ T(a_), z_ @ P[:, p:, p:] @ T(z_), z_ @ P[:, p:, :p] @ T(a_)
        cross = XWU * T(PWU)  # its transpose is the fourth product, T(XWU) * PWU, to the bit
        M = cross + XWW * PUU + XUU * PWW + T(cross) + (xa / la)[:, :, None] * eye_K
        M[stop] = eye_K
        # M grows like 1/μ: apply L⁻¹ and L⁻ᵀ in turn, never an explicit M⁻¹
        Li = _triangular_inverse(_cholesky_or_stop(M, stop))
        done[act[stop]] = True

        def direction(R, R_nn, stop=stop, rp=rp, a_=a_, z_=z_, Li=Li, Ya=Ya, P=P, xa=xa, la=la):
            # ΔX + sym(X ΔZ P) = R, A(ΔX) = r_p, ΔZ = −Aᵀ Δλ
            rhs = np.where(stop[:, None], 0.0, rp - A_of(R, R_nn, a_, z_))
            dl = _apply_inverse(Li, rhs[..., None])[..., 0]
            dZ = -off(S_of(dl, a_, z_))
            return R - _sym(Ya @ dZ @ P), R_nn - xa * dl / la, dZ, dl

        # predictor: step lengths from a cheap eigenvalue bound (they only set the centring σ)
        dY, dx, dZ, dl = direction(-Ya, -xa)
        ap = np.minimum(_psd_step(LY, dY, stop, exact=False), _max_step_pos(xa, dx))
        ad = np.minimum(_psd_step(LZ, dZ, stop, exact=False), _max_step_pos(la, dl))
        mu_aff = (
            np.einsum("sij,sij->s", Ya + ap[:, None, None] * dY, Za + ad[:, None, None] * dZ)
            + np.sum((xa + ap[:, None] * dx) * (la + ad[:, None] * dl), 1)
        ) / (N + K)
        sm = (np.clip(mu_aff / np.maximum(mu, 1e-300), 0, 1) ** 3 * mu)[:, None]
        R = sm[:, :, None] * P - Ya - _sym(dY @ dZ @ P)
        dY, dx, dZ, dl = direction(R, sm / la - xa - dx * dl / la)
        ap = np.minimum(1.0, 0.98 * np.minimum(_psd_step(LY, dY, stop), _max_step_pos(xa, dx)))
        ad = np.minimum(1.0, 0.98 * np.minimum(_psd_step(LZ, dZ, stop), _max_step_pos(la, dl)))
        ap, ad = np.where(stop, 0.0, ap), np.where(stop, 0.0, ad)
        Y[act], x[act] = Ya + ap[:, None, None] * dY, xa + ap[:, None] * dx
        Z[act], lam[act] = Za + ad[:, None, None] * dZ, la + ad[:, None] * dl
    W = 2.0 * QU @ Y[:, :p, p:] @ T(QV)

    def lower():
        return lam.sum(1) / np.maximum(1.0, np.linalg.norm(S_of(lam), ord=2, axis=(1, 2)))

    W, upper, low, gap, cert = _certify(a, z, W, lower, "nuc", 100 * tol)
    return SVMBatch(W, upper, low, gap, cert, it)


def _feasible(a: np.ndarray, z: np.ndarray) -> bool:
    """Is ``{W : a_kᵀ W z_k ≥ 1 ∀k}`` non-empty? An LP (HiGHS), certified either way."""
    from scipy.optimize import linprog

    G = (a[:, :, None] * z[:, None, :]).reshape(len(a), -1)
    res = linprog(np.zeros(G.shape[1]), A_ub=-G, b_ub=-np.ones(len(G)), bounds=(None, None), method="highs")
    if res.status not in (0, 2):
        raise RuntimeError(f"feasibility LP failed: {res.message}")
    return res.status == 0


def _frobenius_clarabel(a: np.ndarray, z: np.ndarray) -> np.ndarray | None:
    """``W_mm`` of one instance by Clarabel (QP ``min ½‖W‖² s.t. a_kᵀ W z_k ≥ 1``); None if infeasible."""
    import clarabel
    from scipy import sparse

    G = (a[:, :, None] * z[:, None, :]).reshape(len(a), -1)
    settings = clarabel.DefaultSettings()
    settings.verbose = False
    settings.tol_gap_abs = settings.tol_gap_rel = settings.tol_feas = 1e-12
    solver = clarabel.DefaultSolver(
        sparse.identity(G.shape[1], format="csc"),
        np.zeros(G.shape[1]),
        sparse.csc_matrix(-G),
        -np.ones(len(G)),
        [clarabel.NonnegativeConeT(len(G))],
        settings,
    )
    sol = solver.solve()
    if "Infeasible" in str(sol.status):
        return None
    if "Solved" not in str(sol.status):
        raise RuntimeError(f"Frobenius SVM: Clarabel returned {sol.status}")
    return np.asarray(sol.x).reshape(a.shape[1], z.shape[1])


def svm_pair_batch(a, z):
    """Frobenius and nuclear W-SVMs of S instances, certified, infeasible ones decided by an LP.

    :func:`frobenius_svm_batch` first: a certified solution proves feasibility. An instance without
    one is decided by the LP (HiGHS); the rare one the LP calls feasible but a batched solve did not
    certify is solved by Clarabel per instance (QP, or the SDP of :func:`nuclear_svm`) and counted in
    ``fallbacks``. :func:`nuclear_svm_batch` solves the feasible ones.

    Args: ``a`` (S, K, d), ``z`` (S, K, d_z) as in :func:`svm_constraints`.
    Returns: ``W`` (2, S, d, d_z) Frobenius and nuclear solutions (NaN if infeasible), ``gaps`` (2, S)
    certified relative optimality gaps, ``feasible`` (S,) bool, ``fallbacks`` int.

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.random_tokens(4, 5, 6, seed=0, queries="cross")
    >>> a, z = svm_constraints(*prob.factors, prob.opt)
    >>> W, gaps, feasible, fallbacks = svm_pair_batch(a[None], z[None])
    >>> W.shape, bool(feasible[0]), bool(gaps.max() < 1e-8), fallbacks
    ((2, 1, 6, 6), True, True, 0)
    """
    a, z = np.asarray(a, float), np.asarray(z, float)
    S = len(a)
    W = np.full((2, S, a.shape[2], z.shape[2]), np.nan)
    gaps = np.full((2, S), np.nan)
    fro = frobenius_svm_batch(a, z)
    feasible = fro.certified.copy()
    for j in np.nonzero(~fro.certified)[0]:
        feasible[j] = not np.any(np.all(a[j] == 0, axis=1)) and _feasible(a[j], z[j])
    W[0], gaps[0] = fro.W, fro.gap
    idx = np.nonzero(fro.certified)[0]
    if idx.size:
        nuc = nuclear_svm_batch(a[idx], z[idx])
        W[1, idx], gaps[1, idx] = nuc.W, nuc.gap
    fallbacks = 0
    for j in np.nonzero(feasible & ~(np.isfinite(W[0, :, 0, 0]) & np.isfinite(W[1, :, 0, 0])))[0]:
        fallbacks += 1
        f, ref = _frobenius_clarabel(a[j], z[j]), _nuclear_clarabel(a[j], z[j])
        if f is None or not ref.feasible:
            raise RuntimeError(f"the LP and Clarabel disagree on the feasibility of instance {j}")
        W[0, j], W[1, j], gaps[:, j] = f, ref.W, (np.nan, max(ref.gap, ref.violation))
    W[:, ~feasible] = np.nan
    return W, gaps, feasible, fallbacks


def svm_feasibility(prob: TokenSelectionProblem, select=None, tol: float = 1e-7) -> bool | None:
    """Is the W-SVM of ``select`` (default opt) feasible? ``True``/``False`` with a certificate, else ``None``.

    With ``G`` the rows ``A_iα_i − A_it`` (``t ≠ α_i``) and ``h = 1``, Lawson–Hanson's reduction of
    ``min ‖θ‖ s.t. Gθ ≥ h`` to NNLS (as :func:`attnlib.max_margin` does) gives ``u ≥ 0`` and the residual
    ``r = [Gᵀu; hᵀu] − e_last``. Either ``θ = −r[:-1]/r[-1]`` satisfies ``Gθ ≥ h`` (checked: feasible),
    or ``Gᵀu ≈ 0`` with ``hᵀu ≈ 1``, a Farkas certificate: every feasible ``θ`` would have
    ``‖θ‖ ≥ hᵀu/‖Gᵀu‖``, so the margin is at most ``‖Gᵀu‖/hᵀu``; below ``tol`` the selection is reported
    infeasible (``False``). Neither: ``None`` (let :func:`attnlib.max_margin` decide). No cvxpy.

    >>> import attnlib as al
    >>> svm_feasibility(al.datasets.single_input())
    True
    """

    n, T = prob.n, prob.T
    sel = prob.opt if select is None else np.asarray(select)
    A = prob.A.reshape(n, T, prob.size)
    rows = np.ones((n, T), bool)
    rows[np.arange(n), sel] = False
    G = (A[np.arange(n), sel][:, None, :] - A)[rows]
    solved = least_distance_nnls(G, np.ones(G.shape[0]))
    if solved is None:
        return None
    u, r = solved
    if np.isfinite(r).all() and -r[-1] > 1e-12:
        theta = -r[:-1] / r[-1]
        if np.all(G @ theta >= 1 - 1e-9):
            return True
    if farkas_margin_bound(G, np.ones(G.shape[0]), u) <= tol:
        return False
    return None


# ---------------------------------------------------------------------- other norms
# The ATT-SVM / W-SVM under the ℓp (entrywise, p in (1, ∞)), ℓ1, ℓ∞, spectral and nuclear norms:
# the limits that mirror descent, steepest descent and Adam are measured against
# (the optimizer-geometry chapter). Same constraints as :func:`max_margin`.

#: Norm names :func:`max_margin_norm` accepts besides a number ``p`` in (1, ∞) (entrywise ℓp).
NORM_NAMES = ("l1", "l2", "linf", "spectral", "nuc")
#: The dual of each named norm (ℓp's dual is ℓq, ``q = p/(p − 1)``).
DUAL_NORMS = {"l1": "linf", "linf": "l1", "l2": "l2", "spectral": "nuc", "nuc": "spectral"}


def check_norm(norm):
    """``norm`` validated: a name of :data:`NORM_NAMES` or a float ``p`` in (1, ∞); ``p = 2`` is "l2".

    >>> check_norm(3), check_norm(2.0), check_norm("linf")
    (3.0, 'l2', 'linf')
    """
    if isinstance(norm, str):
        if norm not in NORM_NAMES:
            raise ValueError(f"norm must be one of {list(NORM_NAMES)} or a number p in (1, inf), got {norm!r}")
        return norm
    if isinstance(norm, bool) or not isinstance(norm, (int, float, np.integer, np.floating)) or not 1 < norm < np.inf:
        raise ValueError(f"norm must be one of {list(NORM_NAMES)} or a number p in (1, inf), got {norm!r}")
    return "l2" if float(norm) == 2.0 else float(norm)


def norm_value(theta, norm, shape=None) -> np.ndarray:
    """``‖θ‖`` in ``norm`` over the trailing parameter axes: (*batch,).

    ``theta`` (*batch, *shape); ``shape`` the parameter shape (default: the last axis, or the last
    two for "spectral" and "nuc"). Entrywise norms act on the flattened parameter.

    >>> import numpy as np
    >>> float(norm_value(np.array([3.0, -4.0]), "l1")), float(norm_value(np.array([3.0, -4.0]), 3.0))
    (7.0, 4.497941445275415)
    """
    norm = check_norm(norm)
    theta = np.asarray(theta, float)
    if shape is None:
        shape = theta.shape[-2:] if norm in ("spectral", "nuc") else theta.shape[-1:]
    batch = theta.shape[: theta.ndim - len(shape)]
    if norm in ("spectral", "nuc"):
        if len(shape) != 2:
            raise ValueError(f"norm {norm!r} needs matrix parameters, got parameter shape {tuple(shape)}")
        s = np.linalg.svd(theta.reshape(batch + tuple(shape)), compute_uv=False)
        return s.max(axis=-1) if norm == "spectral" else s.sum(axis=-1)
    flat = np.abs(theta.reshape(batch + (-1,)))
    if norm == "l1":
        return flat.sum(axis=-1)
    if norm == "linf":
        return flat.max(axis=-1)
    p = 2.0 if norm == "l2" else norm
    top = flat.max(axis=-1, keepdims=True)
    safe = np.where(top > 0, top, 1.0)
    return (safe[..., 0] * np.sum((flat / safe) ** p, axis=-1) ** (1.0 / p)) * (top[..., 0] > 0)


def dual_norm(norm):
    """The dual norm's name (or exponent): ``ℓp ↔ ℓq``, ``ℓ1 ↔ ℓ∞``, spectral ↔ nuclear.

    >>> dual_norm(3.0), dual_norm("spectral")
    (1.5, 'nuc')
    """
    norm = check_norm(norm)
    return DUAL_NORMS[norm] if isinstance(norm, str) else check_norm(norm / (norm - 1.0))


def _norm_atom(x, norm):
    import cvxpy as cp

    if norm not in ("spectral", "nuc") and len(x.shape) == 2:
        x = cp.vec(x, order="C")  # entrywise norms act on the flattened matrix
    if norm == "l1":
        return cp.norm1(x)
    if norm == "linf":
        return cp.norm_inf(x)
    if norm == "l2":
        return cp.norm2(x)
    if norm == "spectral":
        return cp.sigma_max(x)
    if norm == "nuc":
        return cp.normNuc(x)
    return cp.pnorm(x, norm)


def _constraint_rows(prob: TokenSelectionProblem, sel: np.ndarray):
    """``(G, h, rows)``: the ATT-SVM constraints ``G vec θ ≥ h`` of :func:`max_margin`, vectorised."""
    n, T = prob.n, prob.T
    A = prob.A.reshape(n, T, prob.size)
    diffs = A[np.arange(n), sel][:, None, :] - A
    rows = np.ones((n, T), bool)
    rows[np.arange(n), sel] = False
    return diffs[rows], np.ones(int(rows.sum())), rows


#: Relative duality gap (and absolute constraint violation) up to which :func:`max_margin_norms`
#: accepts a solution CLARABEL reports as "optimal_inaccurate" (:func:`norm_certificate`).
CERTIFY_TOL = 1e-7


def max_margin_norms(problems, norm, selects=None) -> list[MaxMarginSolution]:
    """ATT-SVM / W-SVM of S problems under one norm, in one convex program:

    .. math::

        θ_{mm}^{(s)} = \\arg\\min ‖θ‖ \\quad \\text{s.t.} \\quad ⟨θ, A_{iα_i} − A_{it}⟩ ≥ 1,

    with ``‖·‖`` the entrywise ℓp (``norm`` a number p in (1, ∞)), "l1", "l2", "linf", or for
    matrix parameters "spectral" or "nuc". The objective ``Σ_s ‖θ_s‖`` is separable, so each
    ``θ_s`` is the problem's own minimiser (one cvxpy/CLARABEL solve instead of S). The ℓ1, ℓ∞ and
    spectral minimisers need not be unique: the solver returns one of them. ``duals`` are the
    multipliers ``λ`` of ``min ‖θ‖`` (not of the squared norm): ``Σλ_k G_k`` has dual norm 1.

    Args:
        problems: S problems (or one), any parameter shapes.  selects: S selections (None: ``opt``).

    Raises:
        InfeasibleError: some problem's selection cannot be separated (named in the message).

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.single_input()
    >>> [np.round(s.theta[:2], 3).tolist() for s in max_margin_norms([prob], "linf")]
    [[-0.909, 0.909]]
    """
    import cvxpy as cp

    norm = check_norm(norm)
    problems = [problems] if isinstance(problems, TokenSelectionProblem) else list(problems)
    if not problems:
        raise ValueError("problems must hold at least one problem")
    selects = [None] * len(problems) if selects is None else list(selects)
    if len(selects) != len(problems):
        raise ValueError(f"selects must hold one selection per problem ({len(problems)}), got {len(selects)}")
    if not isinstance(norm, str) and len(problems) > 1:
        # Power cones: one program per problem is faster than one joint program (measured 3.7x for
        # ten 4×5 W-SVMs with p = 3), so only the linear and semidefinite norms are batched.
        return [max_margin_norms([prob], norm, [select])[0] for prob, select in zip(problems, selects)]
    parts = []
    for prob, select in zip(problems, selects):
        if norm in ("spectral", "nuc") and len(prob.shape) != 2:
            raise ValueError(f"norm {norm!r} needs matrix parameters, got parameter shape {prob.shape}")
        sel = _check_select(prob, select)
        G, h, rows = _constraint_rows(prob, sel)
        x = cp.Variable(prob.shape) if len(prob.shape) == 2 else cp.Variable(prob.size)
        flat = cp.vec(x, order="C") if len(prob.shape) == 2 else x
        parts.append((prob, sel, G, h, rows, x, G @ flat >= h))
    objective = cp.sum(cp.hstack([_norm_atom(part[5], norm) for part in parts]))
    problem = cp.Problem(cp.Minimize(objective), [part[6] for part in parts])
    with warnings.catch_warnings():
        # "optimal_inaccurate" is not taken on trust: each solution is certified below.
        warnings.filterwarnings("ignore", message="Solution may be inaccurate")
        try:
            problem.solve(solver=cp.CLARABEL, **_CLARABEL_OPTS)
        except cp.error.SolverError:
            problem.solve(solver=cp.SCS, eps=1e-9, max_iters=200_000)
    if problem.status in (cp.INFEASIBLE, cp.INFEASIBLE_INACCURATE):
        bad = []
        for prob, sel, *_ in parts:
            try:  # which problem: the exact Euclidean test (feasibility does not depend on the norm)
                max_margin(prob, sel)
            except InfeasibleError:
                bad.append(sel.tolist())
        raise InfeasibleError(f"ATT-SVM ({norm}) is infeasible for the selections {bad}")
    if problem.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE):
        raise RuntimeError(f"max-margin solve ({norm}) failed with solver status {problem.status!r}")
    out = []
    for prob, sel, G, h, rows, x, constraint in parts:
        theta = np.asarray(x.value, float).reshape(prob.shape)
        values = np.zeros((prob.n, prob.T))
        values[rows] = G @ theta.ravel()
        neighbors = np.zeros((prob.n, prob.T), bool)
        neighbors[rows] = np.abs(values[rows] - h) <= ACTIVE_TOL * np.maximum(1.0, np.abs(values[rows]))
        duals = np.zeros((prob.n, prob.T))
        duals[rows] = np.asarray(constraint.dual_value, float)
        size = float(norm_value(theta, norm, prob.shape))
        if problem.status != cp.OPTIMAL:
            solution = MaxMarginSolution(
                theta, 1.0, problem.status, sel, neighbors, values, np.zeros(prob.n, bool), "", duals
            )
            cert = norm_certificate(prob, solution, norm)
            if not (cert["min_slack"] > -CERTIFY_TOL and cert["primal"] - cert["dual"] <= CERTIFY_TOL * cert["primal"]):
                raise RuntimeError(f"max-margin solve ({norm}) is inaccurate and not certified: {cert}")
        out.append(
            MaxMarginSolution(
                theta=theta,
                margin=1.0 / size if size > 0 else np.inf,
                status=problem.status,
                select=sel,
                neighbors=neighbors,
                constraint_values=values,
                relax=np.zeros(prob.n, bool),
                norm=norm if isinstance(norm, str) else f"l{norm:g}",
                duals=duals,
            )
        )
    return out


def max_margin_norm(prob: TokenSelectionProblem, norm, select=None) -> MaxMarginSolution:
    """ATT-SVM / W-SVM of one problem under ``norm`` (see :func:`max_margin_norms`).

    >>> import numpy as np, attnlib as al
    >>> sol = max_margin_norm(al.datasets.single_input(), 3.0)
    >>> sol.norm, bool(sol.constraint_values[0, 1:].min() > 1 - 1e-6)
    ('l3', True)
    """
    return max_margin_norms([prob], norm, None if select is None else [select])[0]


def norm_certificate(prob: TokenSelectionProblem, sol: MaxMarginSolution, norm) -> dict:
    """Optimality certificate of an SVM under ``norm`` from its multipliers (weak duality).

    For ``λ ≥ 0`` with ``‖Σ λ_k G_k‖_* ≤ 1`` (the dual norm), every feasible θ has
    ``‖θ‖ ≥ Σλ_k h_k``; so ``θ`` is optimal when the primal value meets that bound. Returns
    ``{"primal": ‖θ‖, "dual": Σλh/‖Σλ G‖_*, "min_slack": min(Gθ − h), "min_dual": min λ}``
    (``dual`` is rescaled so that the dual norm is exactly 1: a valid lower bound).
    """
    norm = check_norm(norm)
    G, h, rows = _constraint_rows(prob, sol.select)
    lam = np.maximum(sol.duals[rows], 0.0)
    combo = (lam @ G).reshape(prob.shape)
    dual_size = float(norm_value(combo, dual_norm(norm), prob.shape))
    return {
        "primal": float(norm_value(sol.theta, norm, prob.shape)),
        "dual": float(lam @ h) / dual_size if dual_size > 0 else 0.0,
        "min_slack": float((G @ sol.theta.ravel() - h).min()),
        "min_dual": float(sol.duals[rows].min()),
    }


def face_min_l2(prob: TokenSelectionProblem, sol: MaxMarginSolution, norm, slack: float = 1e-6) -> float:
    """The smallest Euclidean norm on the optimal set of the ``norm`` SVM ``sol`` (its "face"):

    .. math::

        \\min ‖θ‖_2 \\ \\text{s.t.} \\ ⟨θ, A_{iα_i} − A_{it}⟩ ≥ 1, \\ ‖θ‖_N ≤ (1 + \\text{slack})\\,‖θ_{mm,N}‖_N .

    For ℓp (p in (1, ∞)) the set is one point; for ℓ1, ℓ∞ and spectral it can be a face, and a
    trajectory may converge to any point of it. Every point θ of the face has
    ``ρ_2(θ) ≤ ‖θ_mm,2‖ / face_min_l2``. cvxpy with CLARABEL; when it fails, the solver's own
    point's norm (an upper bound).
    """
    import cvxpy as cp

    norm = check_norm(norm)
    point = float(np.linalg.norm(sol.theta))
    if not isinstance(norm, str) or norm == "l2":
        return point  # strictly convex: the optimal set is the one point
    G, h, _ = _constraint_rows(prob, sol.select)
    x = cp.Variable(prob.shape) if len(prob.shape) == 2 else cp.Variable(prob.size)
    flat = cp.vec(x, order="C") if len(prob.shape) == 2 else x
    limit = (1.0 + slack) * float(norm_value(sol.theta, norm, prob.shape))
    problem = cp.Problem(cp.Minimize(cp.norm2(flat)), [G @ flat >= h, _norm_atom(x, norm) <= limit])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Solution may be inaccurate")
        try:  # CLARABEL's default accuracy: the norm constraint is nearly tight by construction
            problem.solve(solver=cp.CLARABEL)
        except cp.error.SolverError:
            return point
    if problem.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE):
        return point
    # Never above the solver's own point (which lies on the face). A failed or inexact solve gives
    # at most that point's norm: the minimum may look larger than it is, never smaller, which can
    # only make a check's control (run's ℓ2 deficit over the face's smallest) come out lower.
    return min(float(problem.value), point)
