"""Chapter 2, the regularization path against the SVM ray ([MMTS], [TFSVM]).

The path solver is :func:`attnlib.paths.regularization_path`. This module holds the chapter's
bounds and drivers: parameter norms and margins along a path (:func:`parameter_norm`,
:func:`min_margin`, :func:`margin_ratio`), the margin bound of the SVM ray
(:func:`ray_margin_bound`) and the path's excess over it (:func:`ray_gap_excess`,
:func:`uncertified`), many problems' paths against their SVMs (:func:`paths_against_svm`), the
Frobenius and nuclear paths of one problem (:func:`matrix_paths`), and the radius table.

The checks that can fail (issue 22): on the page's prompt instances the keys span a plane, so the
minimiser lies on a circle, where an exact search certifies it (:func:`exact_circle_path`); the rate
of ``1 − cos(p̄(R), p_mm*)`` is predicted by the first-order theory of [MMTS]'s proof
(:func:`path_rate`), before the path is solved. The matrix paths cannot be searched exactly;
:func:`matrix_paths_from_rays` starts each from its own SVM ray, so the premise of the page's bound
(a point no worse than the ray) holds by construction.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize_scalar

from ..metrics import one_minus_cosine
from ..model import NonlinearHeadAttention, TokenSelectionProblem, log_softmax
from ..paths import (
    RegularizationPath,
    ball_stationarity_gap,
    check_radii,
    direction_bound,
    regularization_path,
    regularization_paths,
)
from ..svm import max_margin, nuclear_svm

__all__ = [
    "NORMS",
    "parameter_norm",
    "min_margin",
    "margin_ratio",
    "ray_margin_bound",
    "ray_gap_excess",
    "CERTIFICATE_SLACK",
    "uncertified",
    "PathAgainstSVM",
    "paths_against_svm",
    "radius_table",
    "MatrixPaths",
    "matrix_paths",
    "ExactCirclePath",
    "PathRate",
    "circle_max_margin_direction",
    "exact_circle_path",
    "key_plane_basis",
    "linearized_log_gap",
    "matrix_paths_from_rays",
    "path_rate",
]


NORMS = ("fro", "nuc")


def _features(prob) -> np.ndarray:
    """Logit features ``A`` (n, T, *shape): the keys of a nonlinear-head model, ``prob.A`` otherwise."""
    return prob.keys if isinstance(prob, NonlinearHeadAttention) else prob.A


def parameter_norm(theta, norm: str = "fro", param_ndim: int = 1) -> np.ndarray:
    """``‖θ‖_F`` (``"fro"``) or the nuclear norm ``‖θ‖_*`` (``"nuc"``) over the last ``param_ndim`` axes.

    Args:
        theta: (*batch, *shape) with ``len(shape) == param_ndim`` (2 for ``"nuc"``).

    Returns (*batch,).

    >>> float(parameter_norm(np.diag([3.0, 4.0]), "fro", 2)), float(parameter_norm(np.diag([3.0, 4.0]), "nuc", 2))
    (5.0, 7.0)
    """
    theta = np.asarray(theta, float)
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {list(NORMS)}, got {norm!r}")
    if param_ndim < 1 or theta.ndim < param_ndim or (norm == "nuc" and param_ndim != 2):
        raise ValueError(f"cannot take the {norm!r} norm over {param_ndim} trailing axes of shape {theta.shape}")
    if norm == "nuc":
        return np.sum(np.linalg.svd(theta, compute_uv=False), axis=-1)
    return np.sqrt(np.sum(theta**2, axis=tuple(range(-param_ndim, 0))))


def min_margin(prob, theta) -> np.ndarray:
    """Smallest token margin ``m(θ) = min_{i, t≠opt_i} ⟨θ, A_{i,opt_i} − A_it⟩`` (ATT-SVM constraints): (*batch,).

    ``θ/m(θ)`` is feasible for the SVM whenever ``m(θ) > 0``. ``prob``: a
    :class:`TokenSelectionProblem` or a :class:`NonlinearHeadAttention` (its keys and induced ``opt``).
    """
    A = _features(prob)
    n, T = A.shape[:2]
    shape = A.shape[2:]
    theta = np.asarray(theta, float)
    batch = theta.shape[: theta.ndim - len(shape)]
    flat = theta.reshape(batch + (-1,))
    logits = np.einsum("...k,itk->...it", flat, A.reshape(n, T, -1))
    opt = np.asarray(prob.opt)
    diff = logits[..., np.arange(n), opt][..., None] - logits
    return np.min(np.where(np.arange(T) != opt[:, None], diff, np.inf), axis=(-2, -1))


def margin_ratio(prob, theta, theta_mm, norm: str = "fro") -> np.ndarray:
    """Normalised margin of ``θ`` against the SVM's: ``ρ(θ) = m(θ)/‖θ‖ · ‖θ_mm‖`` (in ``norm``): (*batch,).

    ``θ_mm`` is the max-margin solution in the same norm (margin ``1/‖θ_mm‖``), so ``ρ ≤ 1`` for every
    ``θ``, with equality on the SVM ray only (for ``"fro"``; the nuclear SVM need not be unique).
    """
    theta, theta_mm = np.asarray(theta, float), np.asarray(theta_mm, float)
    k = theta_mm.ndim
    return min_margin(prob, theta) / parameter_norm(theta, norm, k) * float(parameter_norm(theta_mm, norm, k))


def ray_margin_bound(prob, theta_mm, radii, norm: str = "fro") -> np.ndarray:
    """Lower bound on the margin ratio ``ρ(θ̄(R))`` of any ``θ̄`` in the ``R``-ball that is no worse than the ray.

    Let ``θ_R = R θ_mm/‖θ_mm‖`` (the SVM ray: every margin ``≥ R/‖θ_mm‖``) and ``θ̄`` with
    ``‖θ̄‖ ≤ R`` and ``L(θ̄) ≤ L(θ_R)`` (true for the minimiser over the ball). For a convex decreasing
    loss, ``L − L* ≥ (1/n) |ℓ'(γ_i,opt)| (γ_i,opt − γ_it) σ_it`` for every ``(i, t)``; at the pair
    with the smallest margin ``m = m(θ̄)``, ``σ_it ≥ 1/(e^m + T − 1)``. Hence, with
    ``w = min_{i,t≠opt} |ℓ'(γ_i,opt)| (γ_i,opt − γ_it)/n``,

    .. math::

        m(\\bar θ) \\ge m_{lo}(R) = \\log\\Big(\\frac{w}{\\mathcal L(θ_R) - \\mathcal L_\\star} - (T-1)\\Big),
        \\qquad ρ(\\bar θ(R)) \\ge \\frac{m_{lo}(R)\\, ‖θ_{mm}‖}{R}.

    ``L(θ_R) − L* ≈ c e^{−R/‖θ_mm‖}``, so the bound is ``1 − O(1/R)``: the argument of the
    regularization-path theorem of [MMTS] made quantitative. For a nonlinear head with a convex
    ``h`` (:class:`NonlinearHeadAttention`) the same bound holds with the single-token scores (Jensen).

    Args:
        prob: :class:`TokenSelectionProblem` or :class:`NonlinearHeadAttention`.
        theta_mm: (*shape) the SVM solution in ``norm``.  radii: (N,).  norm: ``"fro"`` or ``"nuc"``.

    Returns ``ρ_lo`` (N,); ``-inf`` where the bound is vacuous (the argument of the log is ``≤ 0``).

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.single_input()
    >>> lo = ray_margin_bound(prob, al.max_margin(prob).theta, [10.0, 100.0, 1000.0])
    >>> bool(lo[0] < lo[1] < lo[2] < 1), bool(lo[2] > 0.99)
    (True, True)
    """
    r = check_radii(radii)
    theta_mm = np.asarray(theta_mm, float)
    scale = float(parameter_norm(theta_mm, norm, theta_mm.ndim))
    ray = r.reshape((-1,) + (1,) * theta_mm.ndim) * (theta_mm / scale)
    gamma = np.asarray(prob.gamma, float)
    n, T = gamma.shape
    g_opt = gamma[np.arange(n), prob.opt]
    slope = -prob.loss.derivative(g_opt)  # |ℓ'(γ_opt)|, > 0 for a decreasing loss
    w = np.min(np.where(np.arange(T) != prob.opt[:, None], slope[:, None] * (g_opt[:, None] - gamma), np.inf)) / n
    # m_lo = log(w e^{-g} − (T−1)) in log space (e^{-g} overflows for g = log(L − L*) < −709)
    head = np.log(w) - prob.log_gap(ray)
    frac = (T - 1) * np.exp(-head)  # (T−1)/(w e^{-g}); < 1 where the bound is not vacuous
    with np.errstate(divide="ignore", invalid="ignore"):
        m_lo = np.where(frac < 1, head + np.log1p(-np.minimum(frac, 1.0)), -np.inf)
    return m_lo * scale / r


def ray_gap_excess(prob, path: RegularizationPath, theta_mm, norm: str = "fro") -> np.ndarray:
    """How far the path's solutions beat the SVM ray: ``log(L(θ_R) − L*) − log(L(θ̄(R)) − L*)``, (N,).

    ``θ_R = R θ_mm/‖θ_mm‖`` (``norm``: ``"fro"`` for a direct path, ``"nuc"`` for a ``"kq"`` path,
    whose ball is ``‖W‖_* ≤ R``) lies in the ball, so the true minimiser has a value ``≥ 0``; a negative
    value means the search stopped at a worse point, and :func:`ray_margin_bound` does not apply to it.

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.single_input(local=True)
    >>> sol = al.max_margin(prob)
    >>> path = al.regularization_path(prob, [10.0, 100.0], n_starts=2)
    >>> bool(np.all(ray_gap_excess(prob, path, sol.theta) >= 0))
    True
    """
    theta_mm = np.asarray(theta_mm, float)
    unit = theta_mm / float(parameter_norm(theta_mm, norm, theta_mm.ndim))
    ray = path.radii.reshape((-1,) + (1,) * theta_mm.ndim) * unit
    return prob.log_gap(ray) - path.log_gap


#: Slack of the certificate ``log(L(θ_R) − L*) − log(L(θ̄) − L*) ≥ −slack``: the log-gaps are accurate
#: to about 1e-12, and the solver stops at a relative tolerance; see :func:`uncertified`.
CERTIFICATE_SLACK = 1e-9


def uncertified(excess, slack: float = CERTIFICATE_SLACK) -> str | None:
    """Why the SVM-ray bounds do not apply to a path's solution, or ``None`` when they do.

    The bounds (:func:`ray_margin_bound`, :func:`direction_bound`) hold for any point of the ball no
    worse than the SVM ray. A multi-start search of a non-convex problem is not certified to reach
    the minimiser, so its solution is checked against that premise, from the losses alone, before
    its direction or margin is looked at.

    Args: ``excess``: the :func:`ray_gap_excess` at the radius of interest (a number).

    >>> uncertified(0.3) is None, uncertified(-0.5)[:28]
    (True, 'the multi-start search ended')
    """
    excess = float(excess)
    if excess >= -slack:
        return None
    where = f"the multi-start search ended above the SVM ray's loss (log-gap excess {excess:.3g})"
    return where + ": minimiser not certified"


@dataclass(frozen=True, eq=False)
class PathAgainstSVM:
    """A regularization path next to the SVM ray it should approach, and the bound between them.

    Attributes:
        problem: the problem (a :class:`TokenSelectionProblem` or :class:`NonlinearHeadAttention`).
        svm: the Euclidean/Frobenius SVM of its optimal tokens (:func:`attnlib.max_margin`), solved to
            status ``"optimal"``.
        path: its :class:`RegularizationPath` (direct parametrization).
        error: (N,) ``1 − cos(θ̄(R), θ_mm)``.
        bound: (N,) ``B(R) = 1/ρ_lo(R)² − 1`` (:func:`direction_bound` of :func:`ray_margin_bound`),
            computed from the problem and its SVM alone; ``inf`` where vacuous.
        ray_excess: (N,) :func:`ray_gap_excess`, ``≥ −slack`` where the bound applies to the solution.
    """

    problem: object
    svm: object
    path: RegularizationPath
    error: np.ndarray
    bound: np.ndarray
    ray_excess: np.ndarray

    @property
    def certified(self) -> bool:
        """The solution at the largest radius is no worse than the SVM ray (:func:`uncertified`)."""
        return uncertified(self.ray_excess[-1]) is None


def paths_against_svm(problems, radii, n_starts: int = 8, seeds=None, **solver) -> list[PathAgainstSVM]:
    """Solve each problem's SVM and regularization path, and compare them: one :class:`PathAgainstSVM` each.

    Token-selection problems of equal sizes are solved in one batch (:func:`regularization_paths`); a
    :class:`NonlinearHeadAttention` is solved alone, its SVM being that of its induced optimal tokens
    (``token_problem``). A solver status other than ``"optimal"`` raises: an inaccurate SVM is never
    counted as a result.

    Args: ``problems`` (a sequence), ``radii`` (N,), ``seeds`` one per problem (default ``0, 1, ...``),
    ``n_starts`` and ``solver`` (``max_iter``, ``tol``, ...) as :func:`regularization_path`.

    >>> import attnlib as al
    >>> [c] = paths_against_svm([al.datasets.single_input(local=True)], [10.0, 100.0], n_starts=2)
    >>> c.certified, bool(c.error[-1] <= c.bound[-1])
    (True, True)
    """

    problems = list(problems)
    seeds = list(range(len(problems))) if seeds is None else list(seeds)
    if len(seeds) != len(problems):
        raise ValueError(f"seeds must hold one seed per problem ({len(problems)}), got {len(seeds)}")
    r = check_radii(radii)
    svms = []
    for prob in problems:
        sol = max_margin(prob.token_problem if isinstance(prob, NonlinearHeadAttention) else prob)
        if sol.status != "optimal":
            raise RuntimeError(f"the SVM solve ended with status {sol.status!r}: no result is computed from it")
        svms.append(sol)
    if all(isinstance(p, TokenSelectionProblem) for p in problems):
        paths = regularization_paths(problems, r, n_starts=n_starts, seeds=seeds, **solver)
    else:
        paths = [regularization_path(p, r, n_starts=n_starts, seed=s, **solver) for p, s in zip(problems, seeds)]

    return [
        PathAgainstSVM(
            problem=prob,
            svm=sol,
            path=path,
            error=one_minus_cosine(path.theta, sol.theta),
            bound=direction_bound(ray_margin_bound(prob, sol.theta, r)),
            ray_excess=ray_gap_excess(prob, path, sol.theta),
        )
        for prob, sol, path in zip(problems, svms, paths)
    ]


def radius_table(radii, rows: dict, radius_format: str = "{:.3g}", value_format: str = "{:.2e}") -> str:
    """A Markdown table with one column per radius: a header row of ``radii`` and one row per entry.

    Args: ``radii`` (N,); ``rows``: ``{label: (N,) values}`` (labels may hold TeX between ``$``).

    >>> print(radius_table([1.0, 10.0], {"error": [0.5, 0.01]}))
    | $R$ | 1 | 10 |
    |---|---|---|
    | error | 5.00e-01 | 1.00e-02 |
    """
    radii = np.asarray(radii, float).ravel()
    lines = ["| $R$ | " + " | ".join(radius_format.format(x) for x in radii) + " |", "|---|" + "---|" * len(radii)]
    for label, values in rows.items():
        values = np.asarray(values, float).ravel()
        if values.shape != radii.shape:
            raise ValueError(f"row {label!r} must hold one value per radius ({len(radii)}), got {values.shape}")
        lines.append(f"| {label} | " + " | ".join(value_format.format(v) for v in values) + " |")
    return "\n".join(lines)


@dataclass(frozen=True, eq=False)
class MatrixPaths:
    """The ``W`` path (Frobenius ball) and the ``(K, Q)`` path (nuclear ball) of one problem, against both SVMs.

    [TFSVM]: ``W̄(R)/R`` tends to the Frobenius W-SVM, ``K̄Q̄ᵀ/R`` to the nuclear-norm SVM. The two limits
    are told apart by margins: each path's margin ratio in its own norm is at least the bound ``ρ_lo(R)``
    (:func:`ray_margin_bound`) once its search is certified (:func:`ray_gap_excess` ``≥ −slack``), and the
    other SVM's direction has a margin ratio ``< 1`` in that norm.

    Attributes:
        fro, nuc: the solutions (``(d, d_z)`` arrays) of the Frobenius W-SVM (:func:`attnlib.max_margin`) and
            of the nuclear-norm SVM (:func:`attnlib.svm.nuclear_svm` when the problem has ``factors``, else
            :func:`attnlib.max_margin` with ``norm="nuc"``), both solved to a certified accuracy.
        w, kq: the :class:`RegularizationPath` of ``W`` (direct) and of ``(K, Q)`` (``"kq"``).
        rho_w, rho_kq: (N,) the Frobenius margin ratio of the ``W`` path, the nuclear one of the ``(K, Q)`` path.
        lo_fro, lo_nuc: (N,) their lower bounds ``ρ_lo(R)`` from the SVM rays.
        nuc_in_fro: the Frobenius margin ratio of the nuclear SVM; ``fro_in_nuc``: the nuclear margin ratio
            of the W-SVM (both ``≤ 1``).
        excess_w, excess_kq: (N,) :func:`ray_gap_excess` of each path against its own SVM ray.
        gap_w, gap_kq: (N,) the relative Frank–Wolfe gap (:func:`attnlib.paths.ball_stationarity_gap`) of the
            ``W`` path on the Frobenius ball and of the ``(K, Q)`` path's ``K̄Q̄ᵀ`` on the nuclear ball.
        gap_w_nuc, gap_kq_fro: (N,) the same gaps in the other geometry: the ``W`` path on the nuclear ball,
            the ``(K, Q)`` path on the Frobenius ball (each path's own ball radius ``R``, rescaled onto it).
    """

    fro: np.ndarray
    nuc: np.ndarray
    w: RegularizationPath
    kq: RegularizationPath
    rho_w: np.ndarray
    rho_kq: np.ndarray
    lo_fro: np.ndarray
    lo_nuc: np.ndarray
    nuc_in_fro: float
    fro_in_nuc: float
    excess_w: np.ndarray
    excess_kq: np.ndarray
    gap_w: np.ndarray
    gap_kq: np.ndarray
    gap_w_nuc: np.ndarray
    gap_kq_fro: np.ndarray


def _matrix_paths_against(prob, r, fro, nuc, w, kq) -> MatrixPaths:
    """The two paths ``w`` and ``kq`` at radii ``r`` measured against the Frobenius and nuclear SVMs."""
    return MatrixPaths(
        fro=fro,
        nuc=nuc,
        w=w,
        kq=kq,
        rho_w=margin_ratio(prob, w.theta, fro, "fro"),
        rho_kq=margin_ratio(prob, kq.theta, nuc, "nuc"),
        lo_fro=ray_margin_bound(prob, fro, r, "fro"),
        lo_nuc=ray_margin_bound(prob, nuc, r, "nuc"),
        nuc_in_fro=float(margin_ratio(prob, nuc, fro, "fro")),
        fro_in_nuc=float(margin_ratio(prob, fro, nuc, "nuc")),
        excess_w=ray_gap_excess(prob, w, fro, "fro"),
        excess_kq=ray_gap_excess(prob, kq, nuc, "nuc"),
        gap_w=ball_stationarity_gap(prob, w.theta, r, "fro"),
        gap_kq=ball_stationarity_gap(prob, kq.theta, r, "nuc"),
        gap_w_nuc=ball_stationarity_gap(prob, _rescaled(w.theta, r, "nuc"), r, "nuc"),
        gap_kq_fro=ball_stationarity_gap(prob, _rescaled(kq.theta, r, "fro"), r, "fro"),
    )


def _rescaled(theta, r, norm: str) -> np.ndarray:
    """Matrices ``theta`` (N, d, d_z) rescaled to norm ``r`` (N,) in ``norm`` (``"fro"`` or ``"nuc"``)."""
    return theta * (r / parameter_norm(theta, norm, 2))[:, None, None]


def matrix_paths(prob: TokenSelectionProblem, radii, seed=0, n_starts_w: int = 2, n_starts_kq: int = 1, **solver):
    """Solve the two SVMs and the ``W`` and ``(K, Q)`` paths of a matrix-parameter problem: a :class:`MatrixPaths`.

    The ``(K, Q)`` path gets the ``W`` path's solutions as ``guide`` (one more start per radius, factorised):
    random starts at a large radius saturate the softmax on arbitrary tokens, and the guide starts from the
    Frobenius limit, the one the ``(K, Q)`` path must move away from. The nuclear SVM is solved by
    :func:`attnlib.svm.nuclear_svm` (Clarabel on the reduced SDP, no cvxpy import) when ``prob.factors`` is
    set. An SVM solve that is not certified (status other than ``"optimal"``; relative duality gap or
    constraint violation above ``1e-8``) raises.

    Args: ``prob`` with a matrix parameter ``W`` (d, d_z); ``radii`` (N,); ``seed`` for both paths'
    random starts; ``solver``: ``max_iter``, ``tol``... as :func:`regularization_path`.

    >>> import attnlib as al
    >>> m = matrix_paths(al.datasets.random_tokens(3, 4, 4, seed=0), [1.0, 30.0], tol=1e-6, max_iter=300)
    >>> bool(m.nuc_in_fro < 1 and m.fro_in_nuc < 1), m.kq.parametrization
    (True, 'kq')
    """

    r = check_radii(radii)
    sol = max_margin(prob)
    if sol.status != "optimal":
        raise RuntimeError(f"the Frobenius SVM solve ended with status {sol.status!r}: no result is computed from it")
    fro = sol.theta
    if prob.factors is not None:
        nsol = nuclear_svm(*prob.factors, prob.opt)
        if not nsol.feasible or not (nsol.gap <= 1e-8 and nsol.violation <= 1e-8):
            raise RuntimeError(f"the nuclear SVM solve is not certified: {nsol.status}, gap {nsol.gap:.2g}")
        nuc = nsol.W
    else:
        nsol = max_margin(prob, norm="nuc")
        if nsol.status != "optimal":
            raise RuntimeError(f"the nuclear SVM solve ended with status {nsol.status!r}: no result is computed")
        nuc = nsol.theta
    w = regularization_path(prob, r, n_starts=n_starts_w, seed=seed, **solver)
    kq = regularization_path(prob, r, n_starts=n_starts_kq, seed=seed, parametrization="kq", guide=w.theta, **solver)
    return _matrix_paths_against(prob, r, fro, nuc, w, kq)


# -- chapter 2's checks that can fail (issue 22) ------------------------------------------------


def key_plane_basis(prob) -> np.ndarray:
    """An orthonormal basis (r, d) of the span of the key differences ``A_iopt − A_it``.

    The loss depends on ``p`` only through these differences (a logit shift common to an input's
    tokens cancels in its softmax), so a component of ``p`` outside their span spends norm for
    nothing: the minimiser on the ball lies in the span.
    """
    D = (prob.A[np.arange(prob.n), prob.opt][:, None] - prob.A).reshape(-1, prob.A.shape[-1])
    _, s, Vt = np.linalg.svd(D, full_matrices=False)
    return Vt[: int(np.sum(s > 1e-12 * s[0]))]


#: Grid angles evaluated per call of the objective in :func:`_circle_minima`.
_GRID_BLOCK = 2048


def _circle_grid(basis, grid: int):
    """The angles ``phi`` (grid,) of :func:`_circle_minima` and the unit points ``cos φ b_0 + sin φ b_1`` (grid, d)."""
    phi = np.linspace(0.0, 2 * np.pi, grid, endpoint=False)
    return phi, np.cos(phi)[:, None] * basis[0] + np.sin(phi)[:, None] * basis[1]


def _circle_minima(objective, basis, R: float, grid: int, slope_bound: float, unit_grid=None):
    """Every local minimum of ``objective`` on the circle of radius ``R`` in ``basis`` (2, d) that can be
    the global one, refined to 1e-13 rad: ``[(value, angle)]``, best first; and the excess of the best
    grid minimum of any *other* basin (another branch; ``inf`` if there is none).

    A grid minimum is refined when it lies within ``slope_bound · h`` of the best grid value (``h``
    the grid step): a basin whose grid values are all higher cannot hold a lower minimum, since the
    objective changes by at most ``slope_bound`` per radian. ``unit_grid``: :func:`_circle_grid`
    ``(basis, grid)``, computed once for every radius (default: computed here).
    """
    phi, unit = _circle_grid(basis, grid) if unit_grid is None else unit_grid
    h = 2 * np.pi / grid

    def at(a):
        a = np.atleast_1d(a)
        return objective(R * (np.cos(a)[:, None] * basis[0] + np.sin(a)[:, None] * basis[1]))

    # The grid in blocks that stay in cache (about twice as fast as one (grid, n, T) batch; the
    # objective is row by row, so the values are the same to the last bit).
    f = np.concatenate([objective(R * unit[k : k + _GRID_BLOCK]) for k in range(0, grid, _GRID_BLOCK)])
    grid_minima = (f <= np.roll(f, 1)) & (f <= np.roll(f, -1))
    local = np.flatnonzero(grid_minima & (f <= f.min() + slope_bound * h))
    minima = []
    for k in local:
        res = minimize_scalar(
            lambda a: float(at(a)[0]), bounds=(phi[k] - h, phi[k] + h), method="bounded", options=dict(xatol=1e-13)
        )
        minima.append((float(min(res.fun, f[k])), float(res.x if res.fun <= f[k] else phi[k])))
    minima.sort()
    distinct = [minima[0]]
    for value, angle in minima[1:]:  # one entry per basin: a plateau's grid minima refine to one point
        if all(abs(np.angle(np.exp(1j * (angle - a)))) > 4 * h for _, a in distinct):
            distinct.append((value, angle))
    best = distinct[0][1]
    far = np.abs(np.angle(np.exp(1j * (phi - best)))) > 4 * h
    # a plateau (attention saturated on one token) has grid "minima" at equal values: one basin, its lowest point
    other = f[grid_minima & far]
    return distinct, float(other.min() - distinct[0][0]) if other.size else np.inf


@dataclass(frozen=True)
class ExactCirclePath:
    """The regularization path of a problem whose keys span a plane, found by an exact search.

    Attributes:
        radii: (N,).  log_gap: (N,) the smallest ``log(L − L*)`` on each circle ``‖p‖ = R`` of the key
        plane.  theta: (N, d) the minimisers.  second: (N,) the excess of the best point of any *other*
        basin (another branch of the path: a grid minimum more than 4 grid steps from the minimiser;
        ``inf`` if the circle has one basin) over the smallest.  minima: (N,) how many local minima
        could hold the global one (refined).
    """

    radii: np.ndarray
    log_gap: np.ndarray
    theta: np.ndarray
    second: np.ndarray
    minima: np.ndarray


def exact_circle_path(prob, radii, grid: int = 1 << 14, objective=None) -> ExactCirclePath:
    """``argmin_{‖p‖ ≤ R} L(p)`` on a problem whose key differences span a plane: an exact search.

    The minimiser lies on the sphere and in the key plane (:func:`key_plane_basis`), that is on a
    circle. A grid of ``grid`` angles finds every basin, each candidate is refined by a bounded
    scalar search, and a basin is skipped only when the slope bound ``R · max‖A_iopt − A_it‖`` of
    ``log(L − L*)`` per radian proves it cannot hold the minimum. ``objective`` (default
    ``prob.log_gap``) maps (B, d) points to (B,) values.

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.multi_input(0)
    >>> exact = exact_circle_path(prob, [1.0, 50.0])
    >>> bool(np.allclose(np.linalg.norm(exact.theta, axis=1), [1.0, 50.0]))
    True
    """
    basis = key_plane_basis(prob)
    if basis.shape[0] != 2:
        raise ValueError(f"exact_circle_path needs key differences that span a plane, got rank {basis.shape[0]}")
    objective = prob.log_gap if objective is None else objective
    D = prob.A[np.arange(prob.n), prob.opt][:, None] - prob.A
    reach = float(np.max(np.linalg.norm(D, axis=-1)))
    rows, unit_grid = [], _circle_grid(basis, grid)  # the grid's points on the unit circle, for every radius
    for R in np.asarray(radii, float):
        minima, other = _circle_minima(objective, basis, float(R), grid, 2 * R * reach, unit_grid)
        value, angle = minima[0]
        theta = R * (np.cos(angle) * basis[0] + np.sin(angle) * basis[1])
        rows.append((value, theta, other, len(minima)))
    value, theta, second, count = zip(*rows)
    return ExactCirclePath(
        np.asarray(radii, float), np.array(value), np.array(theta), np.array(second), np.array(count)
    )


def linearized_log_gap(prob, loss=None, select=None):
    """The first-order log-gap of [MMTS]'s proof, ``p ↦ log Σ_{i, t ≠ opt_i} c_it e^{−⟨p, A_iopt − A_it⟩}``
    with ``c_it = |ℓ'(γ_iopt)| (γ_iopt − γ_it)/n``: (B, d) → (B,).

    ``L − L* = (1/n) Σ_i [ℓ(γ_iopt − δ_i) − ℓ(γ_iopt)]`` with ``δ_i = Σ_t σ_it (γ_iopt − γ_it)`` and
    ``σ_it = e^{−⟨p, A_iopt − A_it⟩} σ_iopt``: to first order in the σ's this is the sum above, with
    relative error ``O(Σ_t σ_it)``, which is ``e^{−R·margin}`` small on the path at large ``R``. It is
    convex in ``p``, so its minimiser on the ball is unique. ``loss`` replaces the problem's loss in
    ``c`` (a control: the theory of the wrong loss); ``select`` (n, T) bool keeps only those terms
    (a control: the support tokens alone).
    """
    loss = prob.loss if loss is None else loss
    n, T = prob.n, prob.T
    rows = np.arange(n)
    D = prob.A[rows, prob.opt][:, None] - prob.A  # (n, T, d)
    gap = prob.gamma_opt[:, None] - prob.gamma
    keep = np.arange(T)[None, :] != prob.opt[:, None]
    if select is not None:
        keep &= np.asarray(select, bool)
    with np.errstate(divide="ignore"):
        log_c = np.log(np.abs(loss.derivative(prob.gamma_opt)))[:, None] + np.log(np.where(keep, gap, 1.0)) - np.log(n)
    log_c, D = log_c[keep], D[keep]

    def objective(points):
        z = np.asarray(points, float) @ D.T
        np.subtract(log_c[None, :], z, out=z)  # in place: the same operations, no temporaries
        top = z.max(axis=1, keepdims=True)
        z -= top
        return top[:, 0] + np.log(np.exp(z, out=z).sum(axis=1))

    return objective


def circle_max_margin_direction(prob, grid: int = 1 << 14) -> np.ndarray:
    """The max-margin direction ``argmax_{‖u‖=1} min_{i, t≠opt_i} ⟨u, A_iopt − A_it⟩`` of a problem whose key
    differences span a plane, by an exact search on the unit circle (d,): a computation independent of
    the SVM solvers (the limit of the linearised path, :func:`linearized_log_gap`, as ``R → ∞``).

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.multi_input(0)
    >>> u = circle_max_margin_direction(prob)
    >>> bool(al.one_minus_cosine(u, al.max_margin(prob).theta) < 1e-12)
    True
    """
    basis = key_plane_basis(prob)
    if basis.shape[0] != 2:
        raise ValueError(
            f"circle_max_margin_direction needs key differences that span a plane, got rank {basis.shape[0]}"
        )
    keep = np.arange(prob.T)[None, :] != prob.opt[:, None]
    D = (prob.A[np.arange(prob.n), prob.opt][:, None] - prob.A)[keep]  # (K, d)

    def neg_margin(a):
        a = np.atleast_1d(a)
        return -np.min((np.cos(a)[:, None] * basis[0] + np.sin(a)[:, None] * basis[1]) @ D.T, axis=1)

    phi = np.linspace(0.0, 2 * np.pi, grid, endpoint=False)
    k = int(np.argmin(neg_margin(phi)))
    h = 2 * np.pi / grid
    res = minimize_scalar(
        lambda a: float(neg_margin(a)[0]), bounds=(phi[k] - h, phi[k] + h), method="bounded", options=dict(xatol=1e-14)
    )
    if -res.fun <= 0:
        raise ValueError("no direction separates the optimal tokens: the SVM is infeasible")
    return np.cos(res.x) * basis[0] + np.sin(res.x) * basis[1]


@dataclass(frozen=True)
class PathRate:
    """The directional error of the path against the rate the theory gives, at the radii of a path.

    Attributes (all (N,) over the radii unless said):
        radii: the radii.  predicted: ``1 − cos(p_lin(R), u)``, the linearised path's error against
        the max-margin direction ``u`` computed on the circle (no SVM solver).  accuracy: the relative
        accuracy to which the path solver resolves the error at ``R`` (``20 · tol · R/‖offset‖``, the
        offset ``‖offset‖ = R·√(2·predicted)``).  linearization: the relative size of the neglected
        terms, ``Σ_t σ_it`` of the linearised path's worst input.  supports: the number of
        SVM-neighbours.  support_only: (N,) the error predicted from the support tokens alone (the
        "bounded offset" theory, a control).
    """

    radii: np.ndarray
    predicted: np.ndarray
    accuracy: np.ndarray
    linearization: np.ndarray
    supports: int
    support_only: np.ndarray


def path_rate(prob, sol, radii, solver_tol: float = 1e-8) -> PathRate:
    """What [MMTS]'s proof gives for ``1 − cos(p̄(R), p_mm*)`` at each radius, before any path is solved.

    To first order in the attention on the non-optimal tokens, ``log(L − L*)`` is the convex
    :func:`linearized_log_gap`; its minimiser ``p_lin(R)`` on the circle, measured against the
    max-margin direction found on the circle (:func:`circle_max_margin_direction`), is the
    prediction. When the SVM-neighbours' key differences, projected orthogonally to ``p_mm*``, span
    the orthogonal complement (two neighbours on either side in the plane), the offset tends to a
    constant and the error to ``‖offset‖²/(2R²)``: slope −2. With a single neighbour nothing holds
    the offset: only the non-neighbours push it, with weights ``e^{−R(g − margin)}``, and the error
    falls faster than any power of ``R``.
    """
    radii = np.asarray(radii, float)
    u = circle_max_margin_direction(prob)
    lin = exact_circle_path(prob, radii, objective=linearized_log_gap(prob))
    support = sol.neighbors | (np.arange(prob.T)[None, :] == prob.opt[:, None])
    only = exact_circle_path(prob, radii, objective=linearized_log_gap(prob, select=support))
    predicted = one_minus_cosine(lin.theta, u)
    offset = radii * np.sqrt(2 * np.maximum(predicted, 1e-300))
    log_sigma = log_softmax(prob.logits(lin.theta))  # (N, n, T)
    off = np.arange(prob.T)[None, :] != prob.opt[:, None]
    neglected = np.max(np.sum(np.where(off, np.exp(log_sigma), 0.0), axis=-1), axis=-1)
    return PathRate(
        radii,
        predicted,
        20 * solver_tol * radii / offset,
        neglected,
        int(sol.neighbors.sum()),
        one_minus_cosine(only.theta, u),
    )


def matrix_paths_from_rays(prob, radii, seed=0, n_starts_w: int = 2, n_starts_kq: int = 1, **solver) -> MatrixPaths:
    """:func:`attnlib.matrix_paths` with each path also started from its own SVM ray.

    The ``W`` path gets the Frobenius SVM ray ``R W_mm/‖W_mm‖_F`` as one more start (``guide``) at every
    radius, and the ``(K, Q)`` path the better (lower ``log(L − L*)``) of the ``W`` path's solution and the
    nuclear SVM ray ``R W_*/‖W_*‖_*``, both on the nuclear sphere. Projected descent from a start never
    ends above it, so each path ends no worse than its ray: the premise of the page's margin bound holds
    by construction, where random starts alone left it unmet on some seeds (an uncertified search is a
    failed computation, not an instance outside the theorem).
    """
    r = np.asarray(radii, float)
    fro = max_margin(prob).theta
    if prob.factors is not None:
        nsol = nuclear_svm(*prob.factors, prob.opt)
        if not nsol.feasible or not (nsol.gap <= 1e-8 and nsol.violation <= 1e-8):
            raise RuntimeError(f"the nuclear SVM solve is not certified: {nsol.status}, gap {nsol.gap:.2g}")
        nuc = nsol.W
    else:
        nuc = max_margin(prob, norm="nuc").theta
    ray_fro = r[:, None, None] * fro / np.linalg.norm(fro)
    w = regularization_path(prob, r, n_starts=n_starts_w, seed=seed, guide=ray_fro, **solver)
    on_nuclear = w.theta * (r / parameter_norm(w.theta, "nuc", 2))[:, None, None]
    ray_nuc = r[:, None, None] * nuc / parameter_norm(nuc, "nuc", 2)
    guide = np.where((prob.log_gap(on_nuclear) <= prob.log_gap(ray_nuc))[:, None, None], w.theta, ray_nuc)
    kq = regularization_path(prob, r, n_starts=n_starts_kq, seed=seed, parametrization="kq", guide=guide, **solver)
    return _matrix_paths_against(prob, r, fro, nuc, w, kq)
