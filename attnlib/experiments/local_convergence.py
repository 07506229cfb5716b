"""Chapter 3, local convergence: basins of the locally-optimal directions, cone runs, local paths.

Local convergence ([MMTS], [TFSVM]): GD started in a cone around a *locally optimal*
``θ_mm(α)`` converges in direction to it, so a dense grid of initialisations splits into basins,
one per locally-optimal selection. :func:`basin_map` trains a grid as one batch and attributes
each trajectory to the direction it is heading to, or to none ("undecided within the horizon").

How a trajectory is attributed. A trajectory converging to ``θ_mm(α)`` does so with a bounded
orthogonal offset: ``θ(t) = a(t) d̂ + r(t)`` with ``r(t)`` converging, so its
*motion* ``Δθ = θ(t_b) − θ(t_a)`` over the last half of the horizon points along ``d̂`` up to
``‖Δr‖/‖Δθ‖ → 0``, much sooner than its position does (``1 − cos θ ≈ ‖r‖²/2‖θ‖²``, slow when
``r`` is large, as it is after a long stay near a basin boundary). A trajectory is attributed to
``α`` when ``1 − cos(Δθ, θ_mm(α)) ≤ tol`` and it selects ``α``; otherwise it is *undecided*. A
trajectory that lingers near a basin boundary moves along a direction between the candidates
(for [MMTS] Fig. 1(b) the direction where two tokens' logits tie, at ``1 − cos ≈ 5·10⁻³``
from ``p_mm(α=2)``), so ``tol`` must sit below the gap between the candidates and such
directions, and above the decay of ``‖Δr‖/‖Δθ‖``. Undecided trajectories can be continued for
longer (``extend_steps``): a small second batch, not a loop.

GD's direction converges like ``1/log t``: within any affordable horizon it does not settle.
``readout_steps`` continues every trajectory with NGD (``readout_lr``) after the ``steps`` of
``method``; NGD follows the same gradient-flow paths at unit speed, so the read-out tells where
the first ``steps`` of GD have sent each initialisation.

The cone machinery of the local regularization path (:func:`admissible_cone_angle`,
:func:`cone_min_norm`, :func:`cone_margin_bound`, :func:`local_path_case`) lives here too; the
path solver itself is :func:`attnlib.paths.local_regularization_path`.

Seeds reach the page (issue 22): seed 0 is [MMTS]'s Fig. 1 exactly, every other seed perturbs it by a
stated amount that keeps the hypotheses (:func:`perturbed_single_input`); the W version's real
prediction, a locally-optimal final selection, is :func:`final_selection_report`.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import numpy as np

from ..basins import MOTION_TOL, BasinMap, basin_map, classify_motion, half_and_final_states, key_plane_grid
from ..datasets import cone_starts, relu_head_instances, single_input
from ..flow import gradient_flow, hessian, sampled_smoothness, smoothness_bound
from ..metrics import cosine, normalized_margin, one_minus_cosine, orthogonal_offset, selection_mass
from ..model import ReluHeadStack, TokenSelectionProblem, relu_head_stack, token_selection
from ..optim import check_schedule, train, train_together
from ..paths import RegularizationPath, check_radii, direction_bound, local_regularization_path, selection_log_gap
from ..svm import InfeasibleError, SelectionReport, frobenius_svm_batch, max_margin, svm_equivalence

__all__ = [
    "admissible_cone_angle",
    "cone_min_norm",
    "cone_margin_bound",
    "LocalPathCase",
    "local_path_case",
    "local_path_table",
    "neighbour_scores",
    "MOTION_TOL",
    "BasinMap",
    "classify_motion",
    "basin_map",
    "key_plane_grid",
    "ngd_and_gd_basin_maps",
    "basin_table",
    "ConeRuns",
    "cone_runs",
    "margin_rate",
    "SelectionAlignment",
    "selection_alignment",
    "KEY_JITTER",
    "SCORE_JITTER",
    "FinalSelections",
    "final_selection_report",
    "locally_optimal_within",
    "perturbed_single_input",
    "svm_or_none",
    "StepSizeBasins",
    "step_size_basins",
    "discretisation_band",
    "BAND_POINTS",
    "transverse_direction",
    "tie_direction",
    "SVMEQ_SELECTED",
    "SVMEQ_MASKED",
    "head_optimum",
    "mixture_edge",
    "SVMEqRuns",
    "svm_equivalence_runs",
    "SVMEQ_WELL_MASKED",
    "SVMEQ_FACTOR",
    "SVMEQ_AGREEMENT",
    "head_agreement",
    "svmeq_statistics",
]


def _cone_geometry(prob: TokenSelectionProblem, select, theta_mm):
    """Per-token quantities of the cone bounds: ``d = A_iα − A_it`` norms, angles to the axis, lower/higher masks."""
    sel = np.asarray(select, int)
    n, T = prob.n, prob.T
    A = np.asarray(prob.A, float).reshape(n, T, -1)
    d = A[np.arange(n), sel][:, None, :] - A
    dn = np.linalg.norm(d, axis=-1)
    u = np.asarray(theta_mm, float).ravel()
    u = u / np.linalg.norm(u)
    with np.errstate(invalid="ignore", divide="ignore"):
        phi = np.arccos(np.clip((d @ u) / dn, -1.0, 1.0))
    gamma = np.asarray(prob.gamma, float)
    g_sel = gamma[np.arange(n), sel]
    others = np.arange(T) != sel[:, None]
    lower = others & (gamma < g_sel[:, None])
    higher = others & (gamma > g_sel[:, None])
    return sel, dn, phi, gamma, g_sel, others, lower, higher


def admissible_cone_angle(prob: TokenSelectionProblem, select, theta_mm) -> float:
    """Largest cone half-angle ``β`` around ``θ_mm(α)`` inside which the local path bound applies.

    Two conditions on every direction ``v`` of the cone: ``α`` wins every sample (``⟨v, d_it⟩ > 0``,
    ``d_it = A_iα − A_it``), and every token scoring *above* ``α_i`` keeps a normalised margin above
    the SVM's, ``⟨v, d_it⟩ > 1/‖θ_mm(α)‖``: then, at a large norm, the excess ``L − L_α`` is dominated
    by the lower-scoring SVM-neighbours and its minimiser is pulled to the axis. With ``φ_it`` the
    angle of ``d_it`` to the axis, ``β = min(min_t (π/2 − φ_it), min_{higher} (arccos(1/(‖θ_mm‖‖d_it‖)) − φ_it))``.
    Positive for every locally-optimal ``α`` (the higher tokens are not neighbours, so
    ``⟨θ_mm, d_it⟩ > 1``); ``0.0`` when ``α`` is not locally optimal (a neighbour does not score lower).

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.single_input(local=True)
    >>> round(float(np.degrees(admissible_cone_angle(prob, [1], [1.0, 0.0, 0.0]))), 2)
    5.45
    """
    sel, dn, phi, gamma, g_sel, others, lower, higher = _cone_geometry(prob, select, theta_mm)
    nrm = float(np.linalg.norm(theta_mm))
    A = np.asarray(prob.A, float).reshape(prob.n, prob.T, -1)
    d = A[np.arange(prob.n), sel][:, None, :] - A
    values = d @ np.asarray(theta_mm, float).ravel()
    neighbours = others & (np.abs(values - 1.0) <= 1e-6 * np.maximum(1.0, np.abs(values)))
    if not np.all(~neighbours | lower):
        return 0.0
    beta = np.min(np.pi / 2 - phi[others])
    if higher.any():
        beta = min(beta, np.min(np.arccos(np.clip(1.0 / (nrm * dn[higher]), -1.0, 1.0)) - phi[higher]))
    return float(max(beta, 0.0))


def cone_min_norm(prob: TokenSelectionProblem, select, theta_mm, mu: float) -> float:
    """Inner radius ``R_0`` of the cone beyond which the excess ``L − L_α`` is positive (locally-optimal ``α``).

    In the notation of :func:`cone_margin_bound`, ``E(θ) ≥ e^{−m}(w/T − Σ_higher a_it e^{−m(‖θ_mm‖ c_it − 1)})``
    with ``m`` the smallest lower-token margin of ``θ``; in the cone ``m ≥ ‖θ‖ c_low``,
    ``c_low = min_lower ‖d_it‖ cos(φ_it + β)``. ``m*`` is where the sum falls to half of ``w/T`` (it
    decreases in ``m``, every ``‖θ_mm‖ c_it > 1`` in an admissible cone), and ``R_0 = m*/c_low``: on
    ``‖θ‖ ≥ R_0`` the excess is at least half its leading term. ``inf`` when the cone is wider than
    :func:`admissible_cone_angle` (or ``α`` is not locally optimal).

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.single_input(local=True)
    >>> bool(0 <= cone_min_norm(prob, [1], [1.0, 0.0, 0.0], 0.001) < 100)
    True
    """
    theta_mm = np.asarray(theta_mm, float)
    beta = np.arccos(1.0 - mu)
    if beta > admissible_cone_angle(prob, select, theta_mm):
        return float("inf")
    sel, dn, phi, gamma, g_sel, others, lower, higher = _cone_geometry(prob, select, theta_mm)
    if not higher.any():
        return 0.0
    n, T = prob.n, prob.T
    nrm = float(np.linalg.norm(theta_mm))
    c = dn * np.cos(np.minimum(phi + beta, np.pi))
    slope = -prob.loss.derivative(g_sel)
    w = np.min(np.where(lower, slope[:, None] * (g_sel[:, None] - gamma), np.inf)) / n
    a = (slope[:, None] * (gamma - g_sel[:, None]) / n)[higher]
    rate = c[higher] * nrm - 1.0

    def ratio(m):
        return float(np.sum(a * np.exp(-m * rate)) * T / w)

    if ratio(0.0) <= 0.5:
        return 0.0
    lo, hi = 0.0, 1.0
    while ratio(hi) > 0.5:
        hi *= 2.0
        if hi > 1e15:  # a rate at 0 (the cone at the admissible angle): no finite R_0
            return float("inf")
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if ratio(mid) > 0.5 else (lo, mid)
    c_low = np.min(c[lower])
    return float(hi / c_low)


def cone_margin_bound(
    prob: TokenSelectionProblem, select, theta_mm, radii, mu: float, min_norm: float, grid: int = 2001
) -> np.ndarray:
    """Lower bound on the margin ratio ``ρ_α(θ̄_α(R))`` of the local path (:func:`local_regularization_path`).

    The cone analogue of :func:`ray_margin_bound`, for a locally-optimal ``α`` and a cone no wider
    than :func:`admissible_cone_angle`. Let ``θ_R = R θ_mm(α)/‖θ_mm(α)‖`` (in the cone and the ball, so
    ``E(θ̄) ≤ E(θ_R)`` with ``E = L − L_α``). Split the tokens into *lower* (``γ_it < γ_iα``) and *higher*
    (``γ_it > γ_iα``). By convexity of ``ℓ``, ``E ≥ (1/n) Σ_i |ℓ'(γ_iα)| δ_i``. Let ``m`` be the smallest
    margin of ``θ̄`` over lower tokens; all margins are ``≥ 0`` in the cone, so that token has
    ``σ ≥ e^{−m}/T``. The SVM of the lower tokens alone is ``θ_mm(α)`` (its active constraints are all
    lower), so ``m ≤ ‖θ̄‖/‖θ_mm‖``; a higher token has ``σ ≤ e^{−‖θ̄‖ c_it} ≤ e^{−m ‖θ_mm‖ c_it}`` with
    ``c_it = min_{v ∈ cone} ⟨v, d_it⟩ = ‖d_it‖ cos(φ_it + β)``. Hence ``F(m) ≤ E(θ_R)`` with

    .. math::

        F(m) = \\frac{w}{T} e^{-m} - \\sum_{\\text{higher}} a_{it}\\, e^{-m ‖θ_{mm}‖ c_{it}},\\quad
        w = \\min_{\\text{lower}} \\tfrac{|ℓ'(γ_{iα})| (γ_{iα} - γ_{it})}{n},\\;
        a_{it} = \\tfrac{|ℓ'(γ_{iα})| (γ_{it} - γ_{iα})}{n},

    With the inner radius ``R_0`` of the path (``min_norm``, at least :func:`cone_min_norm`), every
    feasible point has ``m ≥ m_0 = R_0 c_low`` and ``F > 0`` there, so
    ``m ≥ m_lo(R) = inf{m ≥ m_0 : F(m) ≤ E(θ_R)}`` (bracketed on a grid, then bisected; ``F`` is
    unimodal). The margin ratio over all tokens is ``ρ ≥ min(m_lo ‖θ_mm‖/R, ‖θ_mm‖ min_higher c_it)`` (``‖θ̄‖ ≤ R``), and
    :func:`direction_bound` gives ``1 − cos(θ̄_α(R), θ_mm(α)) ≤ 1/ρ² − 1``.

    Returns ``ρ_lo`` (N,): ``-inf`` where the bound does not apply (``α`` not locally optimal, the cone
    wider than :func:`admissible_cone_angle`, ``min_norm`` below :func:`cone_min_norm`, or ``E(θ_R) ≤ 0``).

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.single_input(local=True)
    >>> r0 = cone_min_norm(prob, [1], [1.0, 0.0, 0.0], 0.001)
    >>> lo = cone_margin_bound(prob, [1], [1.0, 0.0, 0.0], [100.0, 1000.0], mu=0.001, min_norm=r0)
    >>> bool(0.9 < lo[0] < lo[1] < 1)
    True
    """
    r = check_radii(radii)
    theta_mm = np.asarray(theta_mm, float)
    nrm = float(np.linalg.norm(theta_mm))
    out = np.full(len(r), -np.inf)
    beta = np.arccos(1.0 - mu)
    if beta > admissible_cone_angle(prob, select, theta_mm) or min_norm < cone_min_norm(prob, select, theta_mm, mu):
        return out
    sel, dn, phi, gamma, g_sel, others, lower, higher = _cone_geometry(prob, select, theta_mm)
    n, T = prob.n, prob.T
    c = dn * np.cos(np.minimum(phi + beta, np.pi))
    slope = -prob.loss.derivative(g_sel)
    w = np.min(np.where(lower, slope[:, None] * (g_sel[:, None] - gamma), np.inf)) / n
    a = (slope[:, None] * (gamma - g_sel[:, None]) / n)[higher]
    rate = c[higher] * nrm
    c_hi = np.min(c[higher]) if higher.any() else np.inf
    ray = r[:, None] * (theta_mm.ravel() / nrm)
    lg_R, s_R = selection_log_gap(prob, sel, ray.reshape((len(r),) + prob.shape))
    for j, R in enumerate(r):
        if s_R[j] <= 0:
            continue
        m0 = min_norm * np.min(c[lower])

        def log_f(m):
            m = np.atleast_1d(np.asarray(m, float))
            neg = np.zeros_like(m)
            if a.size:
                neg = np.exp(np.log(a)[None, :] - m[:, None] * (rate[None, :] - 1.0) + np.log(T / w)).sum(axis=1)
            with np.errstate(divide="ignore", invalid="ignore"):
                return np.where(neg < 1, np.log(w / T) - m + np.log1p(-np.minimum(neg, 1.0)), -np.inf)

        # F is unimodal (F' is an exponential sum with one sign change) and positive from m0 on:
        # F > E_R on [m0, m_lo); bracket the crossing on a grid, then bisect
        m = np.linspace(m0, max(R / nrm, m0), grid)
        below = np.flatnonzero(log_f(m) <= lg_R[j])
        if below.size == 0:
            continue
        if below[0] == 0:
            m_lo = m0
        else:
            lo, hi = m[below[0] - 1], m[below[0]]
            for _ in range(80):
                mid = 0.5 * (lo + hi)
                lo, hi = (mid, hi) if log_f(mid)[0] > lg_R[j] else (lo, mid)
            m_lo = lo
        out[j] = min(m_lo * nrm / R, nrm * c_hi)
    return out


@dataclass(frozen=True, eq=False)
class LocalPathCase:
    """One selection's local regularization path and what the page predicts for it.

    Attributes:
        select: (n,) the selection ``α``.  theta_mm: ``θ_mm(α)``.
        locally_optimal: from the SVM-neighbours (strict).  all_higher: every SVM-neighbour scores
            strictly above ``α_i`` (the class the page predicts to leave its cone).
        mu, min_norm: the cone's width and inner radius ``R_0``.  radii: (N,).
        path: the :class:`RegularizationPath` over ball ∩ cone.
        omc: (N,) ``1 − cos(θ̄_α(R), θ_mm(α))`` (NaN at the apex).
        bound: (N,) :func:`direction_bound` of :func:`cone_margin_bound` (``inf`` where it does not apply).
        resolved: the bound at the largest radius is below ``bound_target·μ`` (decided from the SVM ray
            before the path is solved; if not, the cone constraint alone implies ``omc ≤ μ`` and a
            direction check could not fail).
        leave: ``max(omc/μ, 1 − ‖θ̄‖/R)`` at the largest radius: 1 on the cone's boundary or pinned at
            ``R_0 ≪ R``, near 0 for a path that converges inside its cone.
    """

    select: tuple
    theta_mm: np.ndarray
    locally_optimal: bool
    all_higher: bool
    mu: float
    min_norm: float
    radii: np.ndarray
    path: RegularizationPath
    omc: np.ndarray
    bound: np.ndarray
    resolved: bool
    leave: float


def neighbour_scores(prob: TokenSelectionProblem, solution) -> str:
    """Where the SVM-neighbours of a feasible selection score against it: ``"all below"`` (locally optimal),
    ``"all above"`` (the page predicts that its local path leaves the cone) or ``"mixed"`` (no prediction).

    >>> import attnlib as al
    >>> prob = al.datasets.single_input(local=True)
    >>> [neighbour_scores(prob, r.solution) for r in al.enumerate_selections(prob)]
    ['all below', 'all below', 'all above']
    """
    g_sel = prob.gamma[np.arange(prob.n), np.asarray(solution.select)][:, None]
    if np.all(~solution.neighbors | (g_sel > prob.gamma)):
        return "all below"
    return "all above" if np.all(~solution.neighbors | (prob.gamma > g_sel)) else "mixed"


def local_path_case(
    prob: TokenSelectionProblem,
    solution,
    cone_fraction: float = 0.5,
    trap_mu: float = 1e-3,
    trap_min_norm: float = 1.0,
    bound_target: float = 0.25,
    max_radius: float = 1e9,
    per_decade: int = 3,
    n_starts: int = 2,
    seed=0,
) -> LocalPathCase:
    """Solve the local regularization path of one feasible selection, with the page's cone and radii.

    For a locally-optimal ``α``: half-angle ``cone_fraction·β_adm`` (:func:`admissible_cone_angle`),
    inner radius :func:`cone_min_norm`, and radii ``R_0 + 10^{k/per_decade}`` up to the first power of
    ten where the bound :func:`cone_margin_bound` is at most ``bound_target·μ`` (at most
    ``max_radius``). Otherwise ``R_0 = trap_min_norm``, radii up to 1e5 and
    ``μ = min(trap_mu, 1 − cos(cone_fraction·β_win))``, with ``β_win = min_t (π/2 − φ_it)`` the largest
    half-angle of a cone in which ``α`` wins every sample.

    Args:
        solution: the :class:`attnlib.svm.MaxMarginSolution` of ``α`` (feasible).
    """
    sel = np.asarray(solution.select)
    theta_mm = np.asarray(solution.theta, float)
    side = neighbour_scores(prob, solution)
    lo_ok, all_higher = side == "all below", side == "all above"
    beta = admissible_cone_angle(prob, sel, theta_mm) if lo_ok else 0.0
    resolved = False
    if beta > 0:
        mu = float(1.0 - np.cos(cone_fraction * beta))
        r0 = cone_min_norm(prob, sel, theta_mm, mu)

        def bound_at(top):
            return direction_bound(cone_margin_bound(prob, sel, theta_mm, [r0 + 10.0**top], mu, r0))[0]

        top = 2.0
        while top < np.log10(max_radius) and bound_at(top) > bound_target * mu:
            top += 1.0
        top = min(top, np.log10(max_radius))
        resolved = bool(bound_at(top) <= bound_target * mu)
    else:  # a cone inside the region where α wins every sample (a tie plane inside it could hold the minimiser)
        _, _, phi, _, _, others, _, _ = _cone_geometry(prob, sel, theta_mm)
        region = float(np.min(np.pi / 2 - phi[others]))
        mu, r0, top = float(min(trap_mu, 1.0 - np.cos(cone_fraction * region))), float(trap_min_norm), 5.0
    radii = r0 + np.logspace(0.0, top, int(round(top * per_decade)) + 1)
    path = local_regularization_path(
        prob, sel, radii, mu, min_norm=r0, direction=theta_mm, n_starts=n_starts, seed=seed
    )
    flat = path.theta.reshape(len(radii), -1)
    with np.errstate(invalid="ignore", divide="ignore"):
        omc = 1.0 - (flat / np.linalg.norm(flat, axis=1, keepdims=True)) @ (theta_mm.ravel() / np.linalg.norm(theta_mm))
    bound = np.full(len(radii), np.inf)
    if beta > 0:
        bound = direction_bound(cone_margin_bound(prob, sel, theta_mm, radii, mu, r0))
    leave = float(max(np.nan_to_num(omc[-1] / mu, nan=1.0), 1.0 - path.norm[-1] / radii[-1]))
    return LocalPathCase(
        select=tuple(int(a) for a in sel),
        theta_mm=theta_mm,
        locally_optimal=lo_ok,
        all_higher=all_higher,
        mu=mu,
        min_norm=r0,
        radii=radii,
        path=path,
        omc=omc,
        bound=bound,
        resolved=resolved,
        leave=leave,
    )


def local_path_table(cases) -> str:
    """Markdown table of local regularization paths ``[(instance name, LocalPathCase)]``.

    One row per case: the selection (tokens numbered from 1), locally optimal or not, where its
    SVM-neighbours score ("all below", "all above", "mixed"), ``μ``, ``R_0``, the largest radius,
    ``1 − cos`` there, the bound there, and "leave" (:class:`LocalPathCase`).
    """
    lines = [
        "| instance | α (tokens, from 1) | locally optimal | neighbours | μ | R₀ | largest R "
        "| 1 − cos at largest R | bound | leave |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, c in cases:
        kind = "all below" if c.locally_optimal else ("all above" if c.all_higher else "mixed")
        lines.append(
            f"| {name} | {tuple(a + 1 for a in c.select)} | {'yes' if c.locally_optimal else 'no'} | {kind} "
            f"| {c.mu:.2g} | {c.min_norm:.3g} | {c.radii[-1]:.3g} | {c.omc[-1]:.2e} | {c.bound[-1]:.2e} "
            f"| {c.leave:.3f} |"
        )
    return "\n".join(lines)


def ngd_and_gd_basin_maps(
    prob: TokenSelectionProblem,
    theta0,
    candidates,
    tol: float,
    ngd_steps: int,
    ngd_lr: float,
    gd_steps: int,
    gd_lr: float,
    extend_steps: int = 0,
) -> dict:
    """The NGD basin map and the GD basin map (with an NGD read-out) of the same starts, in shared batches.

    Equal to ``basin_map(prob, theta0, ngd_steps, "ngd", ngd_lr, candidates, tol, extend_steps=...)``
    and ``basin_map(prob, theta0, gd_steps, "gd", gd_lr, candidates, tol, readout_steps=ngd_steps,
    readout_lr=ngd_lr, extend_steps=...)``, but the NGD map and the GD read-out are one NGD batch
    (2B trajectories), and the two extensions one more: two Python loops instead of four.

    Returns ``{"ngd": BasinMap, "gd": BasinMap}``.

    >>> import attnlib as al
    >>> prob = al.datasets.single_input(local=True)
    >>> maps = ngd_and_gd_basin_maps(prob, al.datasets.SINGLE_INPUT_INITS, al.svm.locally_optimal_selections(prob),
    ...                                 1e-3, 400, 0.5, 60, 1.0)
    >>> maps["ngd"].kind().tolist(), maps["gd"].kind().tolist()
    ([0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 1, 1])
    """
    candidates = tuple(candidates)
    if not candidates or not all(isinstance(c, SelectionReport) and c.feasible for c in candidates):
        raise ValueError("candidates must be a non-empty list of feasible SelectionReports")
    check_schedule(ngd_steps, ngd_lr, 1)
    check_schedule(gd_steps, gd_lr, 1)
    theta0 = np.asarray(theta0, float)
    B = theta0.shape[0]
    after_gd = train(prob, theta0, gd_steps, "gd", gd_lr, record_every=max(gd_steps, 1)).final
    a, b = half_and_final_states(prob, np.concatenate([theta0, after_gd]), ngd_steps, "ngd", ngd_lr)
    labels, mcos = classify_motion(prob, a, b, candidates, tol)
    extended = np.zeros(2 * B, bool)
    final = b.copy()
    undecided = np.flatnonzero(labels < 0)
    if extend_steps > 0 and undecided.size:
        a2, b2 = half_and_final_states(prob, b[undecided], extend_steps, "ngd", ngd_lr)
        labels[undecided], mcos[undecided] = classify_motion(prob, a2, b2, candidates, tol)
        final[undecided] = b2
        extended[undecided] = True
    pcos = np.stack([cosine(final, c.solution.theta) for c in candidates], axis=-1)
    is_global = np.array([np.array_equal(c.select, prob.opt) for c in candidates])
    maps = {}
    for name, part, steps, readout in (
        ("ngd", slice(0, B), ngd_steps, 0),
        ("gd", slice(B, 2 * B), gd_steps, ngd_steps),
    ):
        maps[name] = BasinMap(
            labels=labels[part],
            candidates=candidates,
            is_global=is_global,
            final=final[part],
            motion_cosine=mcos[part],
            position_cosine=pcos[part],
            extended=extended[part],
            steps=int(steps),
            readout_steps=int(readout),
            extend_steps=int(extend_steps),
            tol=float(tol),
        )
    return maps


def basin_table(maps: dict) -> str:
    """Markdown table of basin maps ``{name: BasinMap}``: fractions and undecided counts per map.

    Columns: the fraction of starts heading to the global and to the local direction(s), the
    number undecided at the first horizon (then extended) and after the extension.

    >>> import attnlib as al
    >>> prob = al.datasets.single_input(local=True)
    >>> m = basin_map(prob, al.datasets.SINGLE_INPUT_INITS, steps=400, lr=0.5)
    >>> basin_table({"ngd": m}).splitlines()[2]
    '| NGD | 0.6667 | 0.3333 | 0 | 0 |'
    """
    lines = [
        "| optimizer | global | local | undecided at the first horizon | undecided after extension |",
        "|---|---|---|---|---|",
    ]
    for name, m in maps.items():
        f = m.fractions()
        first, after = int(m.extended.sum()), int((m.labels < 0).sum())
        lines.append(f"| {name.upper()} | {f['global']:.4f} | {f['local']:.4f} | {first} | {after} |")
    return "\n".join(lines)


@dataclass(frozen=True, eq=False)
class ConeRuns:
    """Trajectories started in the cones of the local theorem, one cone per selection, NGD and GD.

    Attributes:
        owner: (B,) the key of the cone each start is in (as in ``directions``).
        directions: ``{key: θ_mm(α)}`` the cones' axes.
        steps: (R,) recorded steps (log-spaced, with the half-way step ``half``).
        ngd, gd: the two :class:`~attnlib.optim.Trajectory` (same starts).
        omc: (R, B) NGD ``1 − cos(θ(t), θ_mm(α))`` against the run's own cone axis.
        offset: (R, B) NGD distance from the line of its cone's axis (:func:`~attnlib.metrics.orthogonal_offset`).
        start_offset: (B,) the cone's own offset at the start, ``‖θ(0)‖ sin φ_μ`` (``cos φ_μ = 1 − μ``).
        half: index into ``steps`` of the half-way step.
        mu, radius: the cone's width and norm (in units of ``‖θ_mm(α)‖``).
    """

    owner: np.ndarray
    directions: dict
    steps: np.ndarray
    ngd: object
    gd: object
    omc: np.ndarray
    offset: np.ndarray
    start_offset: np.ndarray
    half: int
    mu: float
    radius: float


def cone_runs(
    prob: TokenSelectionProblem,
    directions: dict,
    count: int,
    *,
    mu: float,
    radius: float,
    steps: int,
    ngd_lr: float,
    gd_lr: float,
    rng=None,
    span=None,
    records: int = 60,
) -> ConeRuns:
    """Train ``count`` starts per cone (:func:`cone_starts`, two on the edges) with NGD and with GD.

    Args:
        directions: ``{key: θ_mm(α)}``, one cone per entry (e.g. by token).
        count: starts per cone (≥ 3): two on its edges, the others inside.
        mu, radius, rng, span: as in :func:`cone_starts`.  steps: horizon of both optimizers.
        ngd_lr, gd_lr: their step sizes.  records: about this many log-spaced recorded steps.

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.single_input(local=True)
    >>> r = {x.select[0] + 1: x.solution.theta for x in al.enumerate_selections(prob) if x.locally_optimal}
    >>> runs = cone_runs(prob, r, 3, mu=1e-3, radius=20, steps=100, ngd_lr=0.1, gd_lr=1.0, rng=0,
    ...                     span=np.eye(3)[:2])
    >>> runs.omc.shape, bool(runs.omc.max() <= 1e-3 + 1e-12)
    ((41, 6), True)
    """

    if count < 3:
        raise ValueError(f"count must be at least 3 (two edge starts and one inside), got {count}")
    rng = np.random.default_rng(rng)
    kw = dict(mu=mu, radius=radius, rng=rng, span=span)
    starts = []
    for d in directions.values():
        starts += [cone_starts(d, 2, edge=True, **kw), cone_starts(d, count - 2, **kw)]
    keys = list(directions)
    owner = np.repeat(keys, count)
    half = steps // 2
    record = np.unique(np.r_[0, np.geomspace(1, steps, records).astype(int), half])
    theta0 = np.concatenate(starts)
    ngd = train(prob, theta0, steps, "ngd", ngd_lr, record_steps=record)
    gd = train(prob, theta0, steps, "gd", gd_lr, record_steps=record)
    R, B = ngd.theta.shape[:2]
    omc, offset = np.empty((R, B)), np.empty((R, B))
    for key in keys:
        mine = owner == key
        omc[:, mine] = one_minus_cosine(ngd.theta[:, mine], directions[key])
        offset[:, mine] = orthogonal_offset(ngd.theta[:, mine], directions[key])
    start_offset = np.linalg.norm(theta0.reshape(B, -1), axis=-1) * np.sin(np.arccos(1 - mu))
    return ConeRuns(
        owner=owner,
        directions=dict(directions),
        steps=record,
        ngd=ngd,
        gd=gd,
        omc=omc,
        offset=offset,
        start_offset=start_offset,
        half=int(np.flatnonzero(record == half)[0]),
        mu=float(mu),
        radius=float(radius),
    )


def margin_rate(prob: TokenSelectionProblem, select, theta, steps, start: int, lr: float, theta_mm) -> np.ndarray:
    """Growth of the attention margin of ``select`` per NGD step, from record ``start`` to the last, in units
    of ``lr/‖θ_mm(α)‖``: (B,).

    The margin is ``g(θ) = min_{i, t≠α_i} ⟨θ, A_iα_i − A_it⟩`` (:func:`~attnlib.metrics.normalized_margin`
    times ``‖θ‖``). An NGD step has length ``lr``; taken along ``θ_mm(α)/‖θ_mm(α)‖`` it raises ``g`` by
    ``lr/‖θ_mm(α)‖``, the SVM's margin [FAST], so a run that converges in direction to ``θ_mm(α)`` grows
    its margin at rate 1 in these units. The rate ties three things together: the step's length, the
    SVM's norm and the run's direction (a step 3% longer reads 1.03, an SVM 15% too long 1.15).

    Args: ``theta`` (R, B, *shape) recorded at ``steps`` (R,); ``start`` an index into ``steps``;
    ``lr`` the NGD step; ``theta_mm`` the SVM solution of ``select``.

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.single_input(local=True)
    >>> sol = al.max_margin(prob, select=[1])
    >>> run = al.train(prob, 20 * sol.theta[None], 200, "ngd", 0.1, record_steps=[0, 100, 200])
    >>> rate = margin_rate(prob, [1], run.theta, run.steps, 1, 0.1, sol.theta)
    >>> round(float(rate[0]), 4)  # 1 − 9e-6: token 1's pull still turns the steps a little at this norm
    1.0
    """
    theta = np.asarray(theta, float)
    steps = np.asarray(steps, float)
    flat = theta.reshape(theta.shape[:2] + (-1,))
    gap = normalized_margin(prob, theta, select) * np.linalg.norm(flat, axis=-1)  # (R, B)
    unit = float(lr) / float(np.linalg.norm(np.ravel(theta_mm)))
    return (gap[-1] - gap[start]) / (unit * (steps[-1] - steps[start]))


@dataclass(frozen=True, eq=False)
class SelectionAlignment:
    """How ``θ(t)`` of a batch of problems lines up with the SVM of the tokens it selects ([TFSVM]).

    Attributes (S problems, R recorded steps):
        alpha_hat: (S, n) the final selection (argmax of each input's attention).
        is_opt: (S,) ``α̂`` is the optimal selection.
        corr: ``{"alpha_hat": (R, S), "opt": (R, S)}`` ``cos(θ(t), θ_mm(·))``; NaN where that SVM is
            infeasible.
        mass: (R, S) mean attention on ``α̂`` over the inputs.
        svm_norm: (S,) ``‖θ_mm(α̂)‖`` (NaN if infeasible).
        offset: (S,) final distance from the line of ``θ_mm(α̂)``, in units of ``‖θ_mm(α̂)‖``.
    """

    alpha_hat: np.ndarray
    is_opt: np.ndarray
    corr: dict
    mass: np.ndarray
    svm_norm: np.ndarray
    offset: np.ndarray

    def infeasible(self) -> int:
        """Number of infeasible SVMs met (of ``α̂`` and of the optimal selection, over problems)."""
        return int(np.isnan(self.corr["opt"][-1]).sum() + np.isnan(self.corr["alpha_hat"][-1]).sum())


def selection_alignment(problems, traj) -> SelectionAlignment:
    """Compare each problem's trajectory with the SVM of its final selection and of the optimal one.

    Args:
        problems: S :class:`~attnlib.model.TokenSelectionProblem` (e.g. one per seed).
        traj: a :class:`~attnlib.optim.Trajectory` of ``train(stack_problems(problems), ...)``, theta
            (R, S, *shape).

    One SVM per distinct selection (``α̂ = opt`` solves once); an infeasible SVM gives NaN.

    >>> import numpy as np, attnlib as al
    >>> probs = [al.datasets.random_tokens(3, 4, 5, seed=s, queries="cross") for s in range(2)]
    >>> traj = al.train(al.stack_problems(probs), np.zeros((5, 5)), 300, "ngd", 0.1, record_every=100)
    >>> selection_alignment(probs, traj).corr["alpha_hat"].shape
    (4, 2)
    """

    R, S = traj.theta.shape[:2]
    if len(problems) != S:
        raise ValueError(f"got {len(problems)} problems for a trajectory of {S}")
    alpha_hat = np.array([p.selection(w) for p, w in zip(problems, traj.final)])
    is_opt = np.array([np.array_equal(a, p.opt) for a, p in zip(alpha_hat, problems)])
    corr = {key: np.full((R, S), np.nan) for key in ("opt", "alpha_hat")}
    mass = np.empty((R, S))
    svm_norm, offset = np.full(S, np.nan), np.full(S, np.nan)
    for j, (p, a) in enumerate(zip(problems, alpha_hat)):
        mass[:, j] = selection_mass(p, traj.theta[:, j], a).mean(axis=-1)
        svm = {}
        for key, sel in (("opt", p.opt), ("alpha_hat", a)):
            if tuple(sel) not in svm:
                try:
                    svm[tuple(sel)] = max_margin(p, sel).theta
                except InfeasibleError:
                    svm[tuple(sel)] = None
            if svm[tuple(sel)] is not None:
                corr[key][:, j] = cosine(traj.theta[:, j], svm[tuple(sel)])
        if svm[tuple(a)] is not None:
            svm_norm[j] = np.linalg.norm(svm[tuple(a)])
            offset[j] = orthogonal_offset(traj.final[j], svm[tuple(a)]) / svm_norm[j]
    return SelectionAlignment(alpha_hat, is_opt, corr, mass, svm_norm, offset)


# -- instances that reach every seed, and the final selection (issue 22) -----------------------

#: standard deviation of the key noise, and half-width of the score noise, of a perturbed Fig. 1 (seed ≠ 0)
KEY_JITTER, SCORE_JITTER = 0.02, 0.02


def perturbed_single_input(seed: int, local: bool, loss: str = "logistic") -> TokenSelectionProblem:
    """[MMTS] Fig. 1(a) (``local=False``) or 1(b) (``local=True``), exactly at ``seed = 0``; otherwise
    the keys moved by ``KEY_JITTER · N(0, I)`` and the non-optimal scores by ``U(−SCORE_JITTER, SCORE_JITTER)``.

    The perturbation keeps the hypotheses the page uses: the optimal token keeps score 1; in (a)
    the two non-optimal scores still tie (one draw moves both), so the global regime holds; in (b)
    token 2 (score ``0.9 + δ``) stays locally optimal, its neighbour token 3 scoring ``δ' ≈ 0``. The
    same seed perturbs (a) and (b) alike, so the two panels differ only in the third score.

    >>> import numpy as np
    >>> bool(np.array_equal(perturbed_single_input(0, True).A, single_input(local=True).A))
    True
    >>> perturbed_single_input(3, False).gamma[0, 1] == perturbed_single_input(3, False).gamma[0, 2]
    np.True_
    """
    base = single_input(local=local, loss=loss)
    if seed == 0:
        return base
    rng = np.random.default_rng(seed)
    keys = base.A.copy()  # (1, 3, 3): the key plane's two coordinates and a third that multiplies nothing
    keys[0, :, :2] += KEY_JITTER * rng.standard_normal((3, 2))
    d2, d3 = rng.uniform(-SCORE_JITTER, SCORE_JITTER, size=2)
    scores = np.array([1.0, 0.9 + d2, 0.9 + d2 if not local else d3])
    return token_selection(keys, scores[None], loss=loss)


def tie_direction(prob: TokenSelectionProblem) -> np.ndarray:
    """The unit direction along which tokens 1 and 3 of a Fig. 1 instance tie in logit while token 2
    wins: ``⟨d, k_1 − k_3⟩ = 0``, ``⟨d, k_2 − k_3⟩ > 0`` (``(1, 0.1)/‖·‖`` for the paper's keys). A start
    exactly on it keeps the two logits balanced: the basin boundary runs along it far out."""
    k = prob.A[0]
    diff = k[0] - k[2]
    d = np.zeros_like(diff)
    d[0], d[1] = diff[1], -diff[0]  # the key plane's first two coordinates
    d = d if d @ (k[1] - k[2]) > 0 else -d
    return d / np.linalg.norm(d)


@dataclass(frozen=True)
class FinalSelections:
    """Whether each run's final selection is locally optimal, and the same for a nearby wrong selection.

    Attributes (S runs):
        alpha_hat: (S, n) the final selections.  locally_optimal: (S,) bool.  one_off: (S, n) the
        selection one token off (the input with the smallest attention margin switched to its
        runner-up token).  one_off_locally_optimal: (S,) bool.
    """

    alpha_hat: np.ndarray
    locally_optimal: np.ndarray
    one_off: np.ndarray
    one_off_locally_optimal: np.ndarray


def locally_optimal_within(prob: TokenSelectionProblem, select, score_tol: float = 0.0) -> bool:
    """:func:`attnlib.is_locally_optimal` with ties resolved at ``score_tol``: ``α`` passes when ATT-SVM(α) is
    feasible and no SVM-neighbour scores more than ``score_tol`` above the selected token.

    ``score_tol = 0`` is the strict definition. A run of horizon ``‖W(T)‖`` cannot leave a selection
    whose higher neighbour wins by less than about ``1/‖W(T)‖`` in score (its pull is proportional
    to the gap), so at a finite horizon such a near-tie is not a falsification.
    """
    select = np.asarray(select)
    try:
        sol = max_margin(prob, select)
    except InfeasibleError:
        return False
    chosen = prob.gamma[np.arange(prob.n), select][:, None]
    return bool(np.all(~sol.neighbors | (prob.gamma < chosen + score_tol)))


def final_selection_report(problems, final, score_tol: float = 0.0) -> FinalSelections:
    """The local theorem's prediction for runs that converge in direction: the final selection is
    locally optimal ([MMTS], [TFSVM]) (ties resolved at ``score_tol``, :func:`locally_optimal_within`).
    ``problems``: S problems, ``final``: (S, *shape) last parameters.

    The control is the selection one token off: in the input where the run's attention margin
    (log-weight of the selected token minus that of the runner-up) is smallest, the runner-up token
    in place of the selected one: the nearest wrong answer a mis-read of the attention would give.
    """
    alpha, ok, off, off_ok = [], [], [], []
    for prob, theta in zip(problems, final):
        logits = prob.logits(theta)  # (n, T)
        order = np.argsort(-logits, axis=-1)
        a = order[:, 0].copy()
        margin = logits[np.arange(prob.n), order[:, 0]] - logits[np.arange(prob.n), order[:, 1]]
        wrong = a.copy()
        i = int(np.argmin(margin))
        wrong[i] = order[i, 1]
        alpha.append(a)
        ok.append(locally_optimal_within(prob, a, score_tol))
        off.append(wrong)
        off_ok.append(locally_optimal_within(prob, wrong, score_tol))
    return FinalSelections(np.array(alpha), np.array(ok), np.array(off), np.array(off_ok))


def svm_or_none(prob, select):
    """``θ_mm(select)``, or None when ATT-SVM(select) is infeasible."""
    try:
        return max_margin(prob, np.asarray(select)).theta
    except InfeasibleError:
        return None


# -- [TFSVM] nonlinear heads: the SVM equivalence (issue 24) -----------------------------------

#: [TFSVM]'s thresholds: a token is selected when its final softmax is at least SVMEQ_SELECTED, masked
#: when at most SVMEQ_MASKED; a run with a softmax entry between the two, or without a masked token,
#: is discarded (``multi_token_converge``).
SVMEQ_SELECTED, SVMEQ_MASKED = 1e-3, 1e-6


@dataclass(frozen=True, eq=False)
class StepSizeBasins:
    """GD at ``η = c/L`` for several ``c``, NGD and gradient flow from the same starts, each read out by the flow.

    Attributes:
        products: (C,) the ``c = η·L``; ``L`` the computed smoothness bound (:func:`attnlib.flow.smoothness_bound`).
        loss: (C, K + 1, B) GD's loss at every step.
        monotone: (C,) whether every run's loss never rises (a rise: more than 1e-12 relative, as in chapter 1).
        path_curvature: (C,) the largest sampled ``‖∇²L‖₂`` over every GD iterate of that ``c``
            (:func:`attnlib.flow.sampled_smoothness`): the curvature the steps actually met.
        gd, ngd, flow: (C, B, n), (B, n), (B, n) the selection (token index per input) each start
            ends on, after its own steps and then gradient flow to ``t_max`` (the flow's own run for
            ``flow``): the basin the method has sent the start to.
        gd_unread: (C, B, n) the selection at GD's last step, without the read-out (a finite
            step's selection, which a slow run has not yet decided).
        band: (C, B) GD's first-order discretisation band at each ``c`` (:func:`discretisation_band`):
            how far, across its own flow line, GD at ``η = c/L`` can displace each start.
        in_band: (C, B) bool, the flow's basin boundary passes within ``band`` of the start: the flow
            from some point ``x₀ + s·n₀``, ``|s| ≤ band`` (``BAND_POINTS`` evenly spaced values of ``s`` on
            each side, ``n₀`` :func:`transverse_direction`), ends in another basin than the start's. Tested
            for ``c ≤ 1`` only (False above, where a first-order band is no bound).
    """

    products: np.ndarray
    L: float
    steps: int
    loss: np.ndarray
    monotone: np.ndarray
    path_curvature: np.ndarray
    gd: np.ndarray
    ngd: np.ndarray
    flow: np.ndarray
    gd_unread: np.ndarray
    band: np.ndarray
    in_band: np.ndarray

    def disagreements(self, labels, outside=None) -> int:
        """How many starts end in another basin than gradient flow's (``labels`` (B, n)); with
        ``outside`` (B,) bool, only those starts count (the starts outside a discretisation band)."""
        moved = np.any(np.asarray(labels) != self.flow, axis=-1)
        return int(np.sum(moved if outside is None else moved & np.asarray(outside, bool)))


#: how many evenly spaced points on each side of a start test whether the basin boundary is within the band
BAND_POINTS = 4


def transverse_direction(prob: TokenSelectionProblem, theta) -> np.ndarray:
    """The unit normal to ``∇L(θ)`` in the key plane of a Fig. 1 instance: (B, 3) for ``theta`` (B, 3).

    The parameter's third coordinate multiplies no key (its gradient is 0), so the flow moves in
    the plane of the first two, and the direction across a start's own flow line is ``∇L`` turned by 90°.

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.single_input(local=True)
    >>> n = transverse_direction(prob, al.datasets.SINGLE_INPUT_INITS[:2])
    >>> bool(np.allclose(np.einsum("bi,bi->b", n, prob.grad(al.datasets.SINGLE_INPUT_INITS[:2])), 0))
    True
    """
    g = np.asarray(prob.grad(np.asarray(theta, float)))
    n = np.stack([-g[..., 1], g[..., 0], np.zeros_like(g[..., 0])], axis=-1)
    return n / np.linalg.norm(n, axis=-1, keepdims=True)


def discretisation_band(prob: TokenSelectionProblem, theta, lr: float) -> np.ndarray:
    """A first-order bound on how far GD at step ``lr`` displaces each start across its flow line: (B,).

    ``theta`` (K + 1, B, 3): GD's iterates ``x_0 … x_K`` at step ``η = lr`` (every step). One GD step
    from ``x`` differs from gradient flow over the time ``η`` by the local error
    ``−∫₀^η (∇L(x) − ∇L(φ_s x)) ds = −(η²/2) ∇²L(x) ∇L(x) + O(η³)``. Pulled back to the start by the
    inverse of the linearised map ``P_{k+1} = (D_k ⋯ D_0)^{-1}``, ``D_j = I − η∇²L(x_j)``, the errors add
    up: GD's end point is, to first order in ``η``, the flow's image (at time ``Kη``) of the start
    ``x_0 + Δ``, ``Δ = −(η²/2) Σ_k P_{k+1} ∇²L(x_k) ∇L(x_k)``. A move along the start's own flow
    line (along ``∇L(x_0)``: flow lines map to flow lines) is a shift in time and keeps the basin, so
    only the transverse component of ``Δ`` can change it, and the triangle inequality bounds it:

    ``band = (η²/2) Σ_k ‖Π_⊥ P_{k+1} ∇²L(x_k) ∇L(x_k)‖``, ``Π_⊥ = I − ĝĝᵀ``, ``ĝ = ∇L(x_0)/‖∇L(x_0)‖``.

    GD can end in another basin than the flow from ``x_0`` only if the flow's basin boundary
    passes within ``band`` of ``x_0`` (to first order in ``η``; at ``η·L ≤ 1`` the next order is of
    relative size about ``η‖∇²L‖/3`` from the curvature, the third derivative adding its own, and the
    triangle inequality over the steps leaves a margin besides).

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.single_input(local=True)
    >>> eta = 1.0 / float(al.flow.smoothness_bound(prob))
    >>> run = al.train(prob, al.datasets.SINGLE_INPUT_INITS[:2], 100, "gd", eta)
    >>> b = discretisation_band(prob, run.theta, eta)
    >>> b.shape, bool(np.all((b > 0) & (b < 0.2)))
    ((2,), True)
    """
    theta = np.asarray(theta, float)
    if theta.ndim != 3 or theta.shape[0] < 2:
        raise ValueError(f"theta must be GD's iterates (K + 1 >= 2, B, size), got shape {theta.shape}")
    iterates = theta[:-1]  # x_0 … x_{K−1}: the local error of step k is made at x_k
    H = hessian(prob, iterates)  # (K, B, S, S)
    Hg = np.einsum("kbij,kbj->kbi", H, prob.grad(iterates))  # (K, B, S)
    g0 = prob.grad(theta[0])
    g0 = g0 / np.linalg.norm(g0, axis=-1, keepdims=True)
    eye = np.eye(theta.shape[-1])
    band = np.zeros(theta.shape[1])
    pulled = np.broadcast_to(eye, H.shape[1:]).copy()  # P_k, (B, S, S)
    for k in range(iterates.shape[0]):
        pulled = pulled @ np.linalg.inv(eye - lr * H[k])
        back = np.einsum("bij,bj->bi", pulled, Hg[k])
        back -= np.einsum("bi,bi->b", back, g0)[:, None] * g0  # Π_⊥: along the flow line is a time shift
        band += lr**2 / 2 * np.linalg.norm(back, axis=-1)
    return band


def flow_basins(prob: TokenSelectionProblem, points, t_max: float = 1e15, rtol: float = 1e-6) -> np.ndarray:
    """The basin of each start: the selection (B, n) where gradient flow from ``points`` (B, 3) is at ``t_max``
    (one batch of :func:`attnlib.flow.gradient_flow`, ``rtol = atol``), the read-out of this chapter's step-size
    experiments.

    >>> import attnlib as al
    >>> flow_basins(al.datasets.single_input(local=True), al.datasets.SINGLE_INPUT_INITS)[:, 0].tolist()
    [0, 0, 0, 0, 1, 1]
    """
    flow = gradient_flow(prob, points, times=np.array([0.0, t_max]), rtol=rtol, atol=rtol)
    return prob.selection(flow.theta[-1])


def step_size_basins(
    prob: TokenSelectionProblem,
    starts,
    products,
    steps: int,
    ngd_lr: float,
    ngd_steps: int,
    t_max: float = 1e15,
    rtol: float = 1e-6,
) -> StepSizeBasins:
    """The step-size experiment of chapter 3: which basin GD at ``η·L = c`` sends each start to.

    All GD runs (one per ``c``) and the NGD run are one batch of :func:`attnlib.optim.train_together`;
    their end points and the starts themselves are then one gradient-flow batch to ``t = t_max``
    (log time, :func:`attnlib.flow.gradient_flow`), which reads out the basin: the selection at
    ``t_max``. Gradient flow is GD's small-step limit, so for ``c`` small GD's read-out must match the
    flow's own; a large step can move a start across the basin boundary. A start close enough to the
    flow's boundary changes basin at any step: ``band`` is GD's first-order discretisation band at each
    ``c`` (:func:`discretisation_band`) and ``in_band`` marks the starts the flow's boundary passes
    within it (a flow batch of its own from ``BAND_POINTS`` points on each side). Chapter 1's
    :func:`attnlib.experiments.global_convergence.step_size_sweep` is the same experiment on its
    trap, against the flow at equal time.

    >>> import attnlib as al
    >>> prob = al.datasets.single_input(local=True)
    >>> r = step_size_basins(prob, al.datasets.SINGLE_INPUT_INITS, [0.1, 100.0], 400, 0.5, 100)
    >>> r.flow[:, 0].tolist(), r.disagreements(r.gd[0]), r.disagreements(r.gd[1]) > 0
    ([0, 0, 0, 0, 1, 1], 0, True)
    """
    products = np.asarray(products, float)
    if products.ndim != 1 or products.size < 1 or not np.all(products > 0):
        raise ValueError(f"products must be a non-empty list of positive η·L, got {products!r}")
    check_schedule(steps, 1.0, 1)
    check_schedule(ngd_steps, ngd_lr, 1)
    starts = np.asarray(starts, float)
    L = float(smoothness_bound(prob))
    every_step = np.arange(steps + 1)
    runs = train_together(
        prob, [("gd", starts, c / L, every_step) for c in products] + [("ngd", starts, ngd_lr, [0, ngd_steps])]
    )
    ends = np.concatenate([r.final for r in runs] + [starts])
    labels = flow_basins(prob, ends, t_max, rtol).reshape((len(runs) + 1, starts.shape[0], prob.n))
    gd_loss = np.stack([r.loss for r in runs[:-1]])  # (C, K + 1, B)
    with np.errstate(invalid="ignore"):
        rises = np.diff(gd_loss, axis=1) > 1e-12 * np.abs(gd_loss[:, :-1])
    curvature = np.array([sampled_smoothness(prob, r.theta).max() for r in runs[:-1]])
    band = np.stack([discretisation_band(prob, r.theta, c / L) for c, r in zip(products, runs[:-1])])  # (C, B)
    # Is the flow's basin boundary within the band? The flow from points across each start's flow line, in
    # a batch of its own (the read-out above stays as it was)
    normal = transverse_direction(prob, starts)  # (B, 3)
    offsets = np.r_[-np.arange(BAND_POINTS, 0, -1), np.arange(1, BAND_POINTS + 1)] / BAND_POINTS  # (2P,)
    below = products <= 1  # above 1/L the first-order band says nothing (and its far probes are slow to integrate)
    probes = starts[None, :, None] + (band[below, :, None] * offsets)[..., None] * normal[None, :, None]
    probe_labels = flow_basins(prob, probes.reshape(-1, starts.shape[-1]), t_max, rtol)
    probe_labels = probe_labels.reshape(probes.shape[:3] + (prob.n,))
    in_band = np.zeros(band.shape, bool)
    in_band[below] = np.any(probe_labels != labels[-1][None, :, None], axis=(-2, -1))
    return StepSizeBasins(
        products=products,
        L=L,
        steps=int(steps),
        loss=gd_loss,
        monotone=~rises.any(axis=(1, 2)),
        path_curvature=curvature,
        gd=labels[:-2],
        ngd=labels[-2],
        flow=labels[-1],
        gd_unread=prob.selection(np.stack([r.final for r in runs[:-1]])),
        band=band,
        in_band=in_band,
    )


@dataclass(frozen=True, eq=False)
class BoundaryPairs:
    """GD at 1/L, a large step and NGD from a pair of starts just outside GD's band around the flow's basin boundary.

    Attributes:
        crossing: (3,) where the flow's basin boundary crosses the line of starts (to ``±half_width``).
        half_width: half the bracket the flow's bisection left around ``crossing``, along the line.
        incidence: ``|n·u|``, ``n`` :func:`transverse_direction` at ``crossing``, ``u`` the line's direction.
        product, control_product: the ``η·L`` of the test (at most 1) and of the control (above 1).
        band: :func:`discretisation_band` of GD at ``product`` from ``crossing``.
        distance: how far along the line the pair sits from ``crossing``:
            ``(1 + next_order)·band/incidence + half_width``.
        flow, gd, control, ngd: (2,) the basin (token of the single input) each sends the pair to, the
            start on the line's first side first: gradient flow, GD at ``product``, GD at ``control_product``, NGD.
    """

    crossing: np.ndarray
    half_width: float
    incidence: float
    product: float
    control_product: float
    band: float
    distance: float
    flow: np.ndarray
    gd: np.ndarray
    control: np.ndarray
    ngd: np.ndarray

    def moved(self, labels) -> int:
        """How many of the pair ``labels`` (2,) puts in another basin than the flow does."""
        return int(np.sum(np.asarray(labels) != self.flow))


def boundary_pairs(
    prob: TokenSelectionProblem,
    line,
    product: float,
    control_product: float,
    steps: int,
    ngd_lr: float,
    ngd_steps: int,
    curvature_ratio: float,
    refine_points: int = 7,
    refine_rounds: int = 2,
    t_max: float = 1e15,
    rtol: float = 1e-6,
) -> BoundaryPairs | None:
    """Two starts just outside GD's discretisation band, one on each side of the flow's basin boundary.

    The test of :func:`discretisation_band` with power on every instance: the starts of
    :func:`step_size_basins` may all lie far from the boundary, where no step moves them. The flow's
    basin boundary is found where it crosses ``line`` ((G, 3) evenly spaced starts in order: the first
    consecutive two whose flow basins differ, then ``refine_rounds`` rounds of ``refine_points``
    flow starts between the two that still differ). GD's band at ``c = product ≤ 1`` is computed from
    the crossing, and the pair is put on the line at ``(1 + next_order)·band/incidence + half_width``
    on each side, ``next_order = c·curvature_ratio/3`` (the next order's relative size in ``η``, with
    ``curvature_ratio = max ‖∇²L‖/L`` the curvature the paths meet). To first order, GD's boundary lies
    within ``band`` of the flow's, across the flow line, so GD at ``c`` must send both starts where the
    flow does. GD at ``control_product`` and NGD from the same pair are the controls: their boundary
    moves further. Returns None when the flow's boundary does not cross ``line``.

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.single_input(local=True)
    >>> line = np.stack([np.zeros(13), np.linspace(8, -4, 13), np.zeros(13)], axis=-1)
    >>> r = boundary_pairs(prob, line, 1.0, 100.0, 400, 0.5, 100, curvature_ratio=0.1)
    >>> r.flow.tolist(), r.moved(r.gd), r.moved(r.control) > 0, r.moved(r.ngd) > 0
    ([0, 1], 0, True, True)
    """
    if not (0 < product <= 1 < control_product):
        raise ValueError(
            f"product must be in (0, 1] and control_product above 1, got {product!r} and {control_product!r}"
        )
    line = np.asarray(line, float)
    if line.ndim != 2 or line.shape[0] < 2 or line.shape[1] != prob.shape[-1]:
        raise ValueError(f"line must be (G >= 2, {prob.shape[-1]}) starts in order, got shape {line.shape}")
    L = float(smoothness_bound(prob))

    def basins(points):  # of the single input
        return flow_basins(prob, points, t_max, rtol)[:, 0]

    points, labels = line, basins(line)
    for round_ in range(refine_rounds + 1):
        change = np.flatnonzero(labels[1:] != labels[:-1])
        if change.size == 0:
            return None
        lo, hi, sides = points[change[0]], points[change[0] + 1], labels[change[0] : change[0] + 2]
        if round_ == refine_rounds:
            break
        inner = lo + np.linspace(0.0, 1.0, refine_points + 2)[1:-1, None] * (hi - lo)
        points, labels = np.concatenate([lo[None], inner, hi[None]]), np.r_[sides[0], basins(inner), sides[1]]
    u = (hi - lo) / np.linalg.norm(hi - lo)
    crossing, half_width = (lo + hi) / 2, float(np.linalg.norm(hi - lo) / 2)
    incidence = float(abs(transverse_direction(prob, crossing[None])[0] @ u))
    (from_crossing,) = train_together(prob, [("gd", crossing, product / L, np.arange(steps + 1))])
    band = float(discretisation_band(prob, from_crossing.theta, product / L)[0])
    distance = (1 + product * curvature_ratio / 3) * band / incidence + half_width
    pair = crossing + np.array([-distance, distance])[:, None] * u
    runs = train_together(
        prob,
        [
            ("gd", pair, product / L, [0, steps]),
            ("gd", pair, control_product / L, [0, steps]),
            ("ngd", pair, ngd_lr, [0, ngd_steps]),
        ],
    )
    ended = basins(np.concatenate([r.final for r in runs] + [pair])).reshape(4, 2)
    return BoundaryPairs(
        crossing=crossing,
        half_width=half_width,
        incidence=incidence,
        product=float(product),
        control_product=float(control_product),
        band=band,
        distance=float(distance),
        flow=ended[3],
        gd=ended[0],
        control=ended[1],
        ngd=ended[2],
    )


def _unit_rows(M: np.ndarray) -> np.ndarray:
    M = M.reshape(M.shape[:-2] + (-1,))
    return M / np.linalg.norm(M, axis=-1, keepdims=True)


def head_optimum(U, y) -> tuple[np.ndarray, np.ndarray]:
    """The support of the head's best attention ``argmin_{s∈Δ} ℓ(y f(s))``, ``f(s) = 1ᵀ relu(Σ_t s_t U_t)``.

    For ``y = +1`` the head is convex in ``s``, so the best attention is the best single token. For
    ``y = −1``, ``f`` is minimised: a convex piecewise-linear function on the simplex, whose minimum is
    at a vertex of the arrangement of the kinks ``Σ_t s_t U_tj = 0`` with the faces of the simplex;
    every such point (a support ``P`` of ``k`` tokens, ``k − 1`` kinks) is enumerated and solved as a
    ``k×k`` system, all samples at once. When the minimum is 0 at more than one such point, the
    optimum is a region (every attention with ``f = 0``): ``region`` is True there.

    Args: ``U`` (m, T, h) the head's values ``Vᵀ x_t``, ``y`` (m,) ±1.
    Returns ``support`` (m, T) bool and ``region`` (m,) bool.

    >>> import numpy as np
    >>> U = np.array([[[1.0, -2.0], [-1.0, 1.0]]])        # f(e1) = 1, f(e2) = 1, f(½, ½) = 0
    >>> head_optimum(U, np.array([-1.0]))[0].tolist(), head_optimum(U, np.array([1.0]))[0].tolist()
    ([[True, True]], [[True, False]])
    """
    U, y = np.asarray(U, float), np.asarray(y, float)
    m, T, h = U.shape
    best = np.full(m, np.inf)
    support = np.zeros((m, T), bool)
    zeros = np.zeros(m, int)
    for k in range(1, T + 1):
        for P in combinations(range(T), k):
            for J in combinations(range(h), k - 1):
                M = np.ones((m, k, k))
                M[:, 1:, :] = np.swapaxes(U[:, list(P)][:, :, list(J)], 1, 2)
                ok = np.abs(np.linalg.det(M)) > 1e-12
                s = np.full((m, k), -1.0)
                rhs = np.zeros((int(ok.sum()), k, 1))
                rhs[:, 0] = 1.0
                s[ok] = np.linalg.solve(M[ok], rhs)[..., 0]
                feasible = ok & (s.min(axis=1) >= -1e-12)
                value = np.maximum(np.einsum("mk,mkh->mh", s, U[:, list(P)]), 0.0).sum(-1)
                value = np.where(feasible, value, np.inf)
                zeros += feasible & (value <= 1e-12) & (s.min(axis=1) > 1e-9)
                better = value < best - 1e-12
                best = np.where(better, value, best)
                support[better] = False
                rows = np.flatnonzero(better)
                support[np.ix_(rows, list(P))] = s[better] > 1e-9
    single = np.maximum(U, 0.0).sum(-1).argmax(axis=1)
    positive = y > 0
    support[positive] = np.arange(T) == single[positive, None]
    region = ~positive & (best <= 1e-12) & (zeros > 1)
    return support, region


@dataclass(frozen=True)
class SVMEqRuns:
    """Accepted runs of [TFSVM]'s ReLU-head experiment and their three reference directions.

    Attributes:
        d_values: the widths; ``candidates``, ``accepted`` (len(d_values),) run counts per width;
        ``rejected`` reasons → (len(d_values),) counts.
        d: (A,) width of each accepted run; ``steps`` (R,) recorded steps.
        one_minus_corr: ``"svmeq"``, ``"mm"`` (``W_dir``), ``"one_token"`` → (A, R), and
            ``"svmeq_off"`` → (A,) at the last step for the selected set one token off (the control).
        masked_max: (A,) the largest masked softmax entry of each run.
        selected, predicted: (A, n, T) the final selected sets and the head's optimum
        (:func:`head_optimum`); ``region`` (A, n) where that optimum is a region; ``y`` (A, n);
        ``head_value`` (A, n) the head's output ``f_i`` at the final attention.
        example: a mixture that beats both of its tokens, ``(f along the edge (101,), the trained
        attention's weight on the second token, a label)``, or None (:func:`mixture_edge`).
        seconds: the training time of the stack.
    """

    d_values: tuple
    candidates: np.ndarray
    accepted: np.ndarray
    rejected: dict
    d: np.ndarray
    steps: np.ndarray
    one_minus_corr: dict
    masked_max: np.ndarray
    selected: np.ndarray
    predicted: np.ndarray
    region: np.ndarray
    y: np.ndarray
    head_value: np.ndarray
    example: tuple | None
    seconds: float


def mixture_edge(U, y, selected, log_sigma, points: int = 101):
    """The first ``y = −1`` sample selecting exactly two tokens whose head output along the edge between
    them dips to at most half its value at the better end, itself at least a tenth of the worse end
    (a mixture clearly beats both tokens): ``(f (points,), weight,
    index)`` or None. ``U`` (m, T, h), ``y`` (m,), ``selected`` and ``log_sigma`` (m, T)."""
    lam = np.linspace(0.0, 1.0, points)[:, None]
    for i in np.flatnonzero((np.asarray(y) < 0) & (selected.sum(-1) == 2)):
        a, b = np.flatnonzero(selected[i])
        f = np.maximum((1 - lam) * U[i, a] + lam * U[i, b], 0.0).sum(-1)
        better_end = min(f[0], f[-1])
        if better_end >= 0.1 * f.max() and f.min() <= 0.5 * better_end:  # a visible dip below both tokens
            return f, float(1.0 / (1.0 + np.exp(log_sigma[i, a] - log_sigma[i, b]))), int(i)
    return None


def _one_token_off(selected: np.ndarray, log_sigma: np.ndarray) -> np.ndarray:
    """The selected sets with sample 0 of each run one token off: its least-attended selected token
    dropped when it has two or more, else its most-attended masked token added."""
    off = selected.copy()
    ls = log_sigma[:, 0]
    drop = selected[:, 0].sum(-1) >= 2
    weakest = np.where(selected[:, 0], ls, np.inf).argmin(-1)
    strongest = np.where(selected[:, 0], -np.inf, ls).argmax(-1)
    rows = np.arange(len(off))
    off[rows, 0, np.where(drop, weakest, strongest)] = ~drop
    return off


def svm_equivalence_runs(
    d_values=(4, 6, 8, 10), candidates: int = 60, steps: int = 2000, record_every: int = 100, lr=0.1, seed=0
) -> SVMEqRuns:
    """[TFSVM] ``multi_token_converge``: ``candidates`` runs per width, all widths trained as one stack.

    NGD from torch's default start on :func:`attnlib.datasets.relu_head_instances` (n = 3, T = 4),
    one :class:`attnlib.model.ReluHeadStack` for every run of every width (``U`` padded with inert
    zero columns). A run is kept as the official code keeps it (:data:`SVMEQ_SELECTED`,
    :data:`SVMEQ_MASKED`, feasible SVMs); its trained ``W`` is compared over the recorded steps with
    ``W^SVMeq``, ``W_dir`` and the one-token SVM of its final argmax (:func:`attnlib.svm.svm_equivalence`,
    :func:`attnlib.svm.frobenius_svm_batch`).

    Raises ValueError when no run of any width is kept (too few candidates or steps).

    >>> runs = svm_equivalence_runs(d_values=(4,), candidates=20, steps=1000, seed=0)
    >>> runs.one_minus_corr["svmeq"].shape[1], int(runs.candidates[0])
    (11, 20)
    """
    check_schedule(steps, lr, record_every)
    d_values = tuple(int(d) for d in d_values)
    groups = []
    for k, d in enumerate(d_values):
        data = relu_head_instances(candidates, d, seed=[int(seed), k])
        stack, basis = relu_head_stack(data.X, data.Z, data.V, data.y)
        groups.append((data, stack, basis, np.einsum("sqk,sq->sk", basis, data.W0.reshape(candidates, -1))))
    width = max(d_values)
    joint = ReluHeadStack(
        np.concatenate([g[1].A for g in groups]),
        np.concatenate([np.pad(g[1].U, [(0, 0)] * 3 + [(0, width - g[1].U.shape[-1])]) for g in groups]),
        np.concatenate([g[1].y for g in groups]),
        "logistic",
    )
    traj = train(joint, np.concatenate([g[3] for g in groups]), steps, "ngd", lr, record_every, progress=False)
    log_sigma_all = joint.terms_from_flat(traj.theta[-1]).log_sigma
    example = None
    parts, rejected = [], {"in between": [], "no masked token": [], "infeasible SVM": []}
    for k, (data, _stack, basis, theta0) in enumerate(groups):
        rows = slice(k * candidates, (k + 1) * candidates)
        log_sigma = log_sigma_all[rows]
        sigma = np.exp(log_sigma)
        between = ((sigma > SVMEQ_MASKED) & (sigma < SVMEQ_SELECTED)).any(axis=(1, 2))
        no_mask = ~between & ~(sigma <= SVMEQ_MASKED).any(axis=(1, 2))
        keep = np.flatnonzero(~between & ~no_mask)
        rejected["in between"].append(int(between.sum()))
        rejected["no masked token"].append(int(no_mask.sum()))
        d = d_values[k]
        if not keep.size:
            rejected["infeasible SVM"].append(0)
            continue
        moved = np.einsum("sqk,rsk->rsq", basis[keep], traj.theta[:, rows][:, keep] - theta0[keep])
        W = data.W0[keep] + moved.reshape(moved.shape[:2] + (d, d))  # (R, a, d, d)
        X, Z, ls = data.X[keep], data.Z[keep], log_sigma[keep]
        selected = np.exp(ls) >= SVMEQ_SELECTED
        eq = svm_equivalence(X, Z, selected, ls, W[-1])
        off = svm_equivalence(X, Z, _one_token_off(selected, ls), ls, W[-1])
        top = ls.argmax(-1)
        others = np.arange(X.shape[2]) != top[..., None]
        a = (np.take_along_axis(X, top[..., None, None], axis=2) - X)[others].reshape(len(keep), -1, d)
        z = np.repeat(Z, X.shape[2] - 1, axis=1)
        one = frobenius_svm_batch(a, z)
        ok = eq.solved & one.certified & off.solved
        rejected["infeasible SVM"].append(int((~ok).sum()))
        W, unit = W[:, ok], _unit_rows(W[:, ok])
        corr = {
            name: np.einsum("rap,ap->ar", unit, _unit_rows(ref[ok]))
            for name, ref in (("svmeq", eq.W_eq), ("mm", eq.W_dir), ("one_token", one.W))
        }
        corr["svmeq_off"] = corr["svmeq"][:, -1] * 0 + np.einsum("ap,ap->a", unit[-1], _unit_rows(off.W_eq[ok]))
        y = data.y[keep][ok]
        U = (X @ data.V[keep][:, None])[ok]
        predicted, region = head_optimum(U.reshape(-1, *U.shape[2:]), y.ravel())
        masked = np.where(selected[ok], 0.0, np.exp(ls[ok])).max(axis=(1, 2))
        head_value = np.maximum(np.einsum("ant,anth->anh", np.exp(ls[ok]), U), 0.0).sum(-1)
        if example is None:
            flat = lambda v: v.reshape((-1,) + v.shape[2:])  # noqa: E731
            found = mixture_edge(flat(U), y.ravel(), flat(selected[ok]), flat(ls[ok]))
            if found is not None:
                example = (found[0], found[1], f"d = {d}, run {found[2] // y.shape[1]}, sample {found[2] % y.shape[1]}")
        parts.append(
            (
                np.full(ok.sum(), d),
                corr,
                masked,
                selected[ok],
                predicted.reshape(y.shape + (-1,)),
                region.reshape(y.shape),
                y,
                head_value,
            )
        )
    if not parts:
        raise ValueError(
            f"no run was kept out of {candidates} candidates per width after {steps} steps: raise candidates or steps"
        )
    cat = lambda j: np.concatenate([p[j] for p in parts])  # noqa: E731
    one_minus = {name: 1.0 - np.concatenate([p[1][name] for p in parts]) for name in parts[0][1]}
    return SVMEqRuns(
        d_values,
        np.full(len(d_values), candidates),
        np.array([int((cat(0) == d).sum()) for d in d_values]),
        {key: np.array(v) for key, v in rejected.items()},
        cat(0),
        traj.steps,
        one_minus,
        cat(2),
        cat(3),
        cat(4),
        cat(5),
        cat(6),
        cat(7),
        example,
        float(traj.seconds[-1]),
    )


#: The checks' stated levels: a run is *well masked* when its largest masked softmax is at most
#: SVMEQ_WELL_MASKED ([TFSVM]'s scatter: below it ``1 − corr`` sits near 1e-3); SVMEQ_FACTOR (one decade,
#: a chosen factor: the ratio to the one-token SVM is now reported against it, not checked); the head's
#: prediction must hold on a share SVMEQ_AGREEMENT of the samples of the well-masked runs.
SVMEQ_WELL_MASKED, SVMEQ_FACTOR, SVMEQ_AGREEMENT = 1e-12, 10.0, 0.9


def head_agreement(runs: SVMEqRuns, one_token_off: bool = False) -> np.ndarray:
    """Does each sample's final selected set match what the head's optimum predicts? (A, n) bool.

    ``y = +1``: the head is convex in the attention, so its optimum over the simplex is a vertex: one
    token is selected (which one is the local-convergence question of this page). ``y = −1``: ``f`` is
    minimised, a convex problem, and the support of its minimiser (:func:`head_optimum`) is predicted.
    Where that minimum is 0 on a whole region (``runs.region``) the head predicts no set: those
    samples are left out by :func:`svmeq_statistics`. ``one_token_off=True`` is the control: every
    prediction one token off (two tokens for ``y = +1``; token 1's membership flipped for ``y = −1``).
    """
    size = runs.selected.sum(-1)
    predicted = runs.predicted.copy()
    if one_token_off:
        predicted[..., 0] = ~predicted[..., 0]
    negative = (runs.selected == predicted).all(-1)
    return np.where(runs.y > 0, size == (2 if one_token_off else 1), negative)


def svmeq_statistics(runs: SVMEqRuns) -> dict:
    """The page's check values on the well-masked runs: ``1 − corr`` ratios (geometric means over runs)
    and the shares of samples whose selected set is the head's prediction (and the control's).

    ``ratio_eq_off`` is the check's statistic: ``1 − corr(W, W^SVMeq)`` over ``1 − corr(W, W^SVMeq_off)``,
    the SVM-eq of the selected sets one token off in the first input (the nearest wrong answer). Its bound,
    1, needs no chosen factor: at most 1 means the trained ``W`` lies nearer the predicted SVM-eq than the
    wrong one (nearest-reference attribution; ``1 − corr`` grows with the angle). ``ratio_off_eq`` is the
    same statistic with the two exchanged (the control: the wrong set put forward as the prediction).
    ``ratio_one_token`` (against the one-token SVM) is reported: the wrong set's SVM-eq beats the one-token
    SVM too, so no derived bound on it separates the truth from the nearest wrong answer.

    The ratios are taken over the well-masked runs with a *mixture* (a sample selecting two tokens or
    more): without one, ``W_fin = 0`` and ``W_dir`` is the one-token SVM, so the three coincide.
    ``positive_mixtures`` counts the label +1 inputs with an active head (``f > 0`` at the trained
    attention) that select two tokens or more; ``dead_positive`` the label +1 inputs whose head is dead
    there (every ReLU off: no gradient from their own loss), which the count leaves out.
    """
    well = runs.masked_max <= SVMEQ_WELL_MASKED
    mixed = well & (runs.selected.sum(-1) >= 2).any(-1)
    decided = well[:, None] & ~runs.region
    negative = decided & (runs.y < 0)
    final = {name: (v if v.ndim == 1 else v[:, -1])[mixed] for name, v in runs.one_minus_corr.items()}
    alive = runs.head_value > 0  # (A, n): some ReLU of the head is on at the trained attention

    def geometric_ratio(top, bottom):  # geometric mean over the runs of the ratio of the final 1 − corr
        return float(np.exp(np.mean(np.log(final[top] / final[bottom])))) if mixed.any() else np.nan

    return {
        "well_masked": int(well.sum()),
        "mixed_runs": int(mixed.sum()),
        "median": {name: float(np.median(v)) if v.size else np.nan for name, v in final.items()},
        "ratio_one_token": geometric_ratio("svmeq", "one_token"),
        "ratio_mm": geometric_ratio("svmeq", "mm"),
        "ratio_mm_one_token": geometric_ratio("mm", "one_token"),
        "ratio_off": geometric_ratio("svmeq_off", "one_token"),
        # the nearest wrong answer: W against its own W^SVMeq, over W against the SVM-eq of the sets one token off
        "ratio_eq_off": geometric_ratio("svmeq", "svmeq_off"),
        "ratio_off_eq": geometric_ratio("svmeq_off", "svmeq"),
        "decided_samples": int(decided.sum()),
        "agreement": float(head_agreement(runs)[decided].mean()) if decided.any() else np.nan,
        "agreement_off": float(head_agreement(runs, True)[decided].mean()) if decided.any() else np.nan,
        "negative_agreement": float(head_agreement(runs)[negative].mean()) if negative.any() else np.nan,
        # label +1: a convex head has no stationary mixture where it is active, so every such input selects one
        # token. An input whose head is dead at the trained attention (f = 0: every ReLU off) gets no gradient
        # from its own loss, which is flat there: the vertex argument does not reach it (left out, counted)
        "positive_mixtures": int((well[:, None] & (runs.y > 0) & alive & (runs.selected.sum(-1) >= 2)).sum()),
        "dead_positive": int((well[:, None] & (runs.y > 0) & ~alive).sum()),
        "dead_positive_mixtures": int((well[:, None] & (runs.y > 0) & ~alive & (runs.selected.sum(-1) >= 2)).sum()),
        # the control: the same count on the label −1 inputs (concave head: mixtures can win)
        "negative_mixtures": int((well[:, None] & (runs.y < 0) & (runs.selected.sum(-1) >= 2)).sum()),
        "mixtures": int((runs.selected.sum(-1) >= 2)[well].sum()),
    }
