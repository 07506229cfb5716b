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
"""

from __future__ import annotations

import itertools
import warnings
from dataclasses import dataclass

import numpy as np

from .model import TokenSelectionProblem, check_labels, finite_array

__all__ = [
    "least_distance_nnls",
    "farkas_margin_bound",
    "INFEASIBLE_MARGIN",
    "InfeasibleError",
    "MaxMarginSolution",
    "LabelSVM",
    "SelectionReport",
    "max_margin",
    "label_svm",
    "is_locally_optimal",
    "enumerate_selections",
    "locally_optimal_selections",
    "ACTIVE_TOL",
    "MAX_ENUMERATION",
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
    decide what to certify (:func:`attnlib.max_margin`, :func:`attnlib.balanced_direction`,
    :func:`attnlib.rates.svm_feasibility`).

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
