"""Chapter 2, the regularization path against the SVM ray ([MMTS], [TFSVM]).

The path solver is :func:`attnlib.paths.regularization_path`. This module holds the chapter's
bounds and drivers: parameter norms and margins along a path (:func:`parameter_norm`,
:func:`min_margin`, :func:`margin_ratio`), the margin bound of the SVM ray
(:func:`ray_margin_bound`) and the path's excess over it (:func:`ray_gap_excess`,
:func:`uncertified`), many problems' paths against their SVMs (:func:`paths_against_svm`), the
Frobenius and nuclear paths of one problem (:func:`matrix_paths`), and the radius table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..metrics import one_minus_cosine
from ..model import NonlinearHeadAttention, TokenSelectionProblem
from ..paths import RegularizationPath, check_radii, direction_bound, regularization_path, regularization_paths
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
    )
