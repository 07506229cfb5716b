"""Chapter 1, global convergence of (normalised) GD to the max-margin direction [MMTS].

The chapter's theorem tolerances and not-applicable rules: the equilibrium of the orthogonal
offset and its horizon (:func:`offset_equilibrium`, :func:`offset_check_horizon`,
:func:`offset_relaxation_reason`), the descent bound of the gradient against ``p_mm``
(:func:`descent_bound`, :func:`descent_ratio`, :func:`gradient_cosine`), GD's gap constant and
norm slope (:func:`gd_gap_constant`, :func:`norm_log_slope`), and NGD's rate tolerance
(:func:`ngd_rate_tolerance`).
"""

from __future__ import annotations

import numpy as np

from ..fits import half_decade_slopes
from ..metrics import cosine, offset_exponent, one_minus_cosine, orthogonal_offset
from ..model import TokenSelectionProblem

__all__ = [
    "offset_equilibrium",
    "gradient_cosine",
    "descent_bound",
    "gd_gap_constant",
    "late_offset_exponent",
    "late_offset_ratio",
    "ngd_rate_tolerance",
    "descent_ratio",
    "offset_relaxation_reason",
    "offset_check_horizon",
    "norm_log_slope",
]


def offset_equilibrium(prob: TokenSelectionProblem, sol) -> tuple[np.ndarray, float]:
    """The sideways offset the SVM-neighbours pull a trajectory to, and how fast: ``(q_star, kappa)``.

    Write ``θ = a·û + q`` with ``û = θ_mm/‖θ_mm‖`` (``sol`` of :func:`attnlib.max_margin`) and ``q ⟂ û``.
    Once the attention is saturated, ``−∇L ∝ Σ_k w_k e^{−⟨θ, d_k⟩} d_k`` over the non-selected
    tokens, ``d_k = A_iα_i − A_it``, ``w_k = |ℓ'(γ_iα_i)| (γ_iα_i − γ_it)``. The SVM-neighbours
    (``⟨θ_mm, d_k⟩ = 1``) dominate, and along the path of GD or NGD the offset obeys

    .. math::

        \\frac{dq}{da} = -M\\,\\nabla_q \\log Z(q), \\qquad
        Z(q) = \\sum_{k \\in \\text{neighbours}} w_k e^{-\\langle q, d_k\\rangle}, \\qquad M = \\lVert θ_{mm} \\rVert,

    so ``q → q_star = argmin log Z`` over the span of the neighbours' components ``d_k^⊥``
    orthogonal to ``û`` (the offset of the Soudry et al. expansion ``θ(t) = θ_mm·log t + ρ``), and
    ``kappa = M·λ_min(Cov_π(d^⊥))`` with ``π_k ∝ w_k e^{−⟨q_star, d_k⟩}`` is the relaxation rate of
    the offset per unit of growth of ``a`` (NGD: ``a ≈ ηt``; GD: ``a ≈ M log t``, i.e. ``t^{−κM}``).
    With a single neighbour ``d^⊥ = 0``: nothing pulls the offset sideways, ``q_star = 0`` and
    ``kappa = 0`` (the offset is then set by the other tokens, whose pull fades like
    ``e^{−(c_k − 1) a/M}``, ``c_k = ⟨θ_mm, d_k⟩``).

    ``prob``: the problem (θ of any shape); ``sol``: its :class:`MaxMarginSolution` (any selection).
    Returns ``q_star`` with ``prob.shape`` and ``kappa`` (a float; ``nan`` and a ``nan`` offset
    when ``log Z`` has no minimiser, which the KKT conditions of the SVM exclude).

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.loss_study(3.0)        # d = (1, ±1): p2(∞) = ½ ln(3|ℓ'(3)|/|ℓ'(1)|)
    >>> q, kappa = offset_equilibrium(prob, al.max_margin(prob))
    >>> round(float(q[1]), 6), round(kappa, 6)
    (-0.318357, 1.0)
    """
    select = np.asarray(sol.select)
    theta_mm = np.asarray(sol.theta, float).ravel()
    M = float(np.linalg.norm(theta_mm))
    u = theta_mm / M
    A = prob.A.reshape(prob.n, prob.T, -1)
    rows, toks = np.nonzero(sol.neighbors)
    d = A[rows, select[rows]] - A[rows, toks]  # (m, D)
    gamma_sel = prob.gamma[rows, select[rows]]
    w = np.abs(prob.loss.derivative(gamma_sel)) * (gamma_sel - prob.gamma[rows, toks])
    perp = d - np.outer(d @ u, u)
    _, sv, vt = np.linalg.svd(perp, full_matrices=False) if len(d) else (None, np.zeros(0), None)
    rank = int(np.sum(sv > 1e-10 * max(1.0, sv.max(initial=0.0))))
    if rank == 0:
        return np.zeros(prob.shape), 0.0
    basis = vt[:rank]  # (rank, D)
    b = perp @ basis.T  # (m, rank): coordinates of d_k^⊥
    log_w = np.log(w)
    x = np.zeros(rank)
    for _ in range(200):  # Newton on the convex log Z, with backtracking
        z = log_w - b @ x
        pi = np.exp(z - z.max())
        pi /= pi.sum()
        mean = pi @ b
        cov = (b * pi[:, None]).T @ b - np.outer(mean, mean)
        try:
            step = np.linalg.solve(cov, mean)  # gradient of log Z is -mean
        except np.linalg.LinAlgError:
            return np.full(prob.shape, np.nan), float("nan")
        f0 = np.log(np.sum(np.exp(z - z.max()))) + z.max()
        s = 1.0
        while s > 1e-12:
            z1 = log_w - b @ (x + s * step)
            if np.log(np.sum(np.exp(z1 - z1.max()))) + z1.max() <= f0 + 1e-14:
                break
            s /= 2
        x = x + s * step
        if np.linalg.norm(s * step) < 1e-13 * (1 + np.linalg.norm(x)):
            break
    if not np.all(np.isfinite(x)) or np.linalg.norm(mean) > 1e-8 * (1 + np.abs(b).max()):
        return np.full(prob.shape, np.nan), float("nan")
    kappa = M * float(np.linalg.eigvalsh(cov).min())
    return (x @ basis).reshape(prob.shape), kappa


def gradient_cosine(prob: TokenSelectionProblem, theta, direction) -> np.ndarray:
    """``cos(∇L(θ), d)``: (*batch,), from the scaled gradient, so exact where ``∇L`` underflows.

    The descent lemma of [MMTS]'s global theorem says ``⟨∇L(p), p_mm*⟩ < 0`` at every ``p`` when
    each input's non-optimal tokens share one score; :func:`descent_bound` gives how negative.

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.single_input()
    >>> bool(gradient_cosine(prob, np.zeros(3), al.max_margin(prob).theta) < 0)
    True
    """
    return cosine(prob.scaled_grad(theta)[1], direction)


def descent_bound(prob: TokenSelectionProblem, theta_mm) -> float:
    """Upper bound on ``cos(∇L(θ), θ_mm)`` at every ``θ`` under equal non-optimal scores: a float < 0.

    With ``γ_it = γ_opt − Δ_i`` for every ``t ≠ opt_i``, the gradient is exactly
    ``∇L = −Σ_it w_it d_it`` with ``w_it = (1/n)|ℓ'(u_i)| σ_i,opt σ_it Δ_i ≥ 0`` and
    ``d_it = A_i,opt − A_it``. Every SVM constraint value ``⟨θ_mm, d_it⟩`` is at least 1, so
    ``⟨∇L, θ_mm⟩ ≤ −Σ w`` while ``‖∇L‖ ≤ Σ w · max ‖d‖``:

    .. math:: \\cos(∇L(θ), θ_{mm}) \\le -\\frac{1}{\\lVert θ_{mm}\\rVert \\max_{it} \\lVert d_{it}\\rVert}.

    ``theta_mm``: the SVM of the optimal tokens (``max_margin(prob).theta``). With unequal scores
    some weights are negative and the bound (even the sign) can fail.

    >>> import attnlib as al
    >>> prob = al.datasets.loss_study(3.0)   # d = (1, ±1, ·), θ_mm = (1, 0, 0)
    >>> round(descent_bound(prob, al.max_margin(prob).theta), 6)
    -0.707107
    """
    theta_mm = np.asarray(theta_mm, float).ravel()
    A = prob.A.reshape(prob.n, prob.T, -1)
    d = A[np.arange(prob.n), prob.opt][:, None, :] - A
    return float(-1.0 / (np.linalg.norm(theta_mm) * np.linalg.norm(d, axis=-1).max()))


def gd_gap_constant(prob: TokenSelectionProblem, steps, theta, lr: float, M: float) -> tuple[float, float]:
    """Plain GD's loss gap in units of its prediction, ``η t (L − L*) / M²``, and a tolerance.

    Under GD with step ``η`` and equal non-optimal scores, ``d(L − L*)/dt = −η‖∇L‖²`` with
    ``‖∇L‖ = (L − L*)/M`` to leading order (``M = ‖p_mm*‖``), so ``L − L* ≈ M²/(ηt)``. ``steps`` (R,)
    recorded steps (log-spaced, all positive), ``theta`` (R, *shape) one run. Returns the value at
    the last record and ``2|change since t_end/√10|``: if the deviation from 1 shrinks by at least
    3/2 per half-decade, what is left of it is at most twice that change.

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.loss_study(3.0)
    >>> run = al.train(prob, np.zeros(3), steps=3000, method="gd", lr=1.0, record_steps=al.log_steps(3000, 16))
    >>> value, tol = gd_gap_constant(prob, run.steps[1:], run.theta[1:, 0], 1.0, 1.0)
    >>> bool(abs(value - 1) <= tol < 0.01)
    True
    """
    steps = np.asarray(steps, float)
    ratio = lr * steps * prob.gap(theta) / M**2
    earlier = int(np.searchsorted(steps, steps[-1] / np.sqrt(10)))
    return float(ratio[-1]), float(2 * abs(ratio[-1] - ratio[earlier]))


def late_offset_exponent(steps, theta, direction) -> np.ndarray:
    """Growth exponent of the offset from ``direction`` against ``‖θ‖`` over the second half: (B,).

    From the record of largest offset in ``[T/4, T/2]`` to the last one (:func:`offset_exponent`);
    the largest, because an offset converging from the other side passes near zero. A bounded
    offset gives about 0, a run heading for another fixed direction 1. ``steps`` (R,), ``theta``
    (R, B, *shape).
    """
    steps = np.asarray(steps, float)
    theta = np.asarray(theta, float)
    quarter, half = np.searchsorted(steps, [steps[-1] / 4, steps[-1] / 2])
    largest = quarter + np.argmax(orthogonal_offset(theta[quarter : half + 1], direction), axis=0)
    return offset_exponent(theta[largest, np.arange(theta.shape[1])], theta[-1], direction)


def late_offset_ratio(steps, theta, direction) -> np.ndarray:
    """``1 − cos(θ(T), d)`` over the value an offset of ``√2 B`` gives, ``B`` the largest in ``[T/4, T/2]``: (B,).

    Exactly ``1 − cos = 1 − √(1 − ‖q‖²/‖θ‖²)`` with ``q`` the offset from the line of ``d``. An offset
    growing at most like ``‖θ‖^{1/2}`` while ``‖θ‖`` doubles (the growth exponent ≤ 1/2 of
    :func:`late_offset_exponent`) keeps the ratio at most 1; a fixed wrong direction gives ≫ 1.
    ``steps`` (R,), ``theta`` (R, B, *shape).
    """
    steps = np.asarray(steps, float)
    theta = np.asarray(theta, float)
    quarter, half = np.searchsorted(steps, [steps[-1] / 4, steps[-1] / 2])
    B = orthogonal_offset(theta[quarter : half + 1], direction).max(axis=0)
    norm = np.linalg.norm(theta[-1].reshape(theta.shape[1], -1), axis=-1)
    return one_minus_cosine(theta[-1], direction) / (1 - np.sqrt(1 - 2 * B**2 / norm**2))


def ngd_rate_tolerance(prob: TokenSelectionProblem, theta_mm, steps, theta, lr: float) -> float:
    """Tolerance on an NGD decay rate ``rate·M/η`` fitted over ``[T/2, T]`` (:func:`exponential_rate`).

    ``log(1 − σ̄_opt)`` and ``log(L − L*)`` are ``−ηt/M + Φ(t)`` plus a constant, ``Φ`` a log-sum-exp
    over the N non-optimal tokens of ``−(c − 1)a/M − ⟨q, d⟩``. Over the window ``Φ`` changes by at most
    ``2 B D_⊥ + ln N`` (``B`` the largest offset in the window, ``D_⊥`` the largest component of a
    key difference orthogonal to ``θ_mm``, ``ln N`` the fading of the non-neighbours), so the fitted
    rate times ``M/η`` is within ``M (2 B D_⊥ + ln N)/(η (T − T/2))`` of 1.
    """
    steps = np.asarray(steps, float)
    half = int(np.searchsorted(steps, steps[-1] / 2))
    A = prob.A.reshape(prob.n, prob.T, -1)
    diffs = (A[np.arange(prob.n), prob.opt][:, None] - A)[np.arange(prob.T) != prob.opt[:, None]]
    B = orthogonal_offset(np.asarray(theta)[half:], theta_mm).max()
    spread = 2 * B * orthogonal_offset(diffs, np.asarray(theta_mm).ravel()).max() + np.log(len(diffs))
    return float(spread * np.linalg.norm(theta_mm) / (lr * (steps[-1] - steps[half])))


def descent_ratio(prob: TokenSelectionProblem, theta_mm, theta) -> float:
    """Largest ``cos(∇L(θ), θ_mm)`` over the points ``theta`` (*batch, *shape), in units of :func:`descent_bound`.

    The descent lemma with equal non-optimal scores says it is at most ``−1`` at every point.
    """
    theta = np.asarray(theta, float).reshape((-1,) + prob.shape)
    return float(np.max(gradient_cosine(prob, theta, theta_mm)) / -descent_bound(prob, theta_mm))


def offset_relaxation_reason(prob: TokenSelectionProblem, sol, T: int, lr: float) -> str | None:
    """Why NGD's direction checks do not apply at horizon ``T``, or ``None``: decided from the SVM.

    With at least two SVM-neighbours the offset relaxes to its limit like ``e^{−κ a}``
    (:func:`offset_equilibrium`) with ``a ≈ ηT``; the check needs ``κ η T/2 ≥ 6`` (six e-foldings
    after mid-run). A single neighbour has ``κ = 0`` and nothing to relax: the check applies.
    """
    kappa = offset_equilibrium(prob, sol)[1]
    relaxation = kappa * lr * T / 2
    if sol.neighbors.sum() >= 2 and not relaxation >= 6:
        return (
            f"offset relaxation rate kappa = {kappa:.3g} (>= 2 SVM-neighbours): kappa * eta * T/2 = "
            f"{relaxation:.2f} < 6, the offset is still travelling to its limit at T = {T}"
        )
    return None


def offset_check_horizon(prob: TokenSelectionProblem, sol, base: int, lr: float, cap: int = 4) -> int:
    """NGD steps the direction checks need, decided from the SVM alone: ``base``, or more.

    With at least two SVM-neighbours the offset relaxes at the rate ``κ`` of
    :func:`offset_equilibrium`; six e-foldings after mid-run need ``κ η T/2 ≥ 6``, so the horizon is
    ``max(base, 12/(κη))``, at most ``cap·base`` (beyond it :func:`offset_relaxation_reason` reports
    the check as not applicable). With one neighbour: ``base``.

    >>> import attnlib as al
    >>> prob = al.datasets.loss_study(3.0)   # two neighbours, κ = 1
    >>> offset_check_horizon(prob, al.max_margin(prob), 100, 0.1)
    120
    """
    if sol.neighbors.sum() < 2:
        return int(base)
    kappa = offset_equilibrium(prob, sol)[1]
    return int(min(max(base, np.ceil(12 / (kappa * lr))), cap * base))


def norm_log_slope(steps, norm, theta, direction) -> tuple[float, float]:
    """Plain GD's ``d‖p‖/d log t`` over the last half-decade in units of ``M = ‖direction‖``, and a tolerance.

    ``‖p(t)‖ = M log t + O(1)`` under GD, so the slope tends to ``M``. The neglected terms are of
    relative order ``1/t`` up to logarithms: if they shrink by at least 3/2 per half-decade, the drift
    left in the last slope is at most twice its change ``Δ`` from the half-decade before; the
    offset lowers the slope by about ``M(1 − cos)`` at the window's start. Returns
    ``(slope/M, 2Δ/M + (1 − cos))``. ``steps``, ``norm`` (R,) log-spaced positive records (see
    :func:`attnlib.fits.half_decade_slopes`), ``theta`` (R, d) the run.
    """

    steps = np.asarray(steps, float)
    M = float(np.linalg.norm(direction))
    s_last, s_prev = half_decade_slopes(steps, norm)
    start = int(np.searchsorted(steps, steps[-1] / np.sqrt(10) * (1 - 1e-12)))
    return s_last / M, float(2 * abs(s_last - s_prev) / M + one_minus_cosine(theta[start], direction))
