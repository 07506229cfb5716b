"""Measurements of a trajectory against the max-margin direction.

All functions take parameters with leading batch axes, ``theta`` (*batch, *shape), and return
arrays of shape (*batch,) (or (*batch, n) for per-sample quantities).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from .model import TokenSelectionProblem, logsumexp

if TYPE_CHECKING:  # annotations only: optim and svm import this module's neighbours
    from .optim import Trajectory
    from .svm import MaxMarginSolution

__all__ = [
    "cosine",
    "one_minus_cosine",
    "direction_error",
    "orthogonal_offset",
    "normalized_margin",
    "selection_mass",
    "log_one_minus_mass",
    "fit_slope",
    "offset_exponent",
    "offset_equilibrium",
    "CURVES",
    "curves",
    "gradient_cosine",
    "descent_bound",
    "exponential_rate",
    "gd_gap_constant",
    "late_offset_exponent",
    "late_offset_ratio",
    "ngd_rate_tolerance",
    "descent_ratio",
    "offset_relaxation_reason",
    "offset_check_horizon",
    "norm_log_slope",
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
    traj: Trajectory,
    solutions: Sequence[MaxMarginSolution | None],
) -> dict[str, np.ndarray]:
    """The rate metrics of each problem's trajectory, as (R, S) arrays.

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


def fit_slope(x, y, log_x: bool = True, log_y: bool = True) -> tuple[float, float]:
    """Least-squares line through ``(x, y)`` on the chosen axes: returns ``(slope, intercept)``.

    Use it for measured rates: ``fit_slope(t, err)`` is the exponent of a power law,
    ``fit_slope(t, log_err, log_y=False)`` an exponential rate, ``fit_slope(t, norm, log_y=False)``
    the coefficient of ``log t`` growth.

    >>> import numpy as np, attnlib as al
    >>> t = np.arange(1.0, 100.0)
    >>> [round(v, 6) for v in al.fit_slope(t, 3 * t**-0.5)]
    [-0.5, 1.098612]
    """
    x = np.asarray(x, float)
    y = np.asarray(y, float)
    if x.shape != y.shape or x.ndim != 1 or x.size < 2:
        raise ValueError(f"x and y must be 1-D of equal length >= 2, got {x.shape} and {y.shape}")
    xs = np.log(x) if log_x else x
    ys = np.log(y) if log_y else y
    ok = np.isfinite(xs) & np.isfinite(ys)
    if ok.sum() < 2:
        raise ValueError("fit_slope needs at least two finite points on the chosen axes")
    slope, intercept = np.polyfit(xs[ok], ys[ok], 1)
    return float(slope), float(intercept)


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
    >>> al.offset_exponent([[10.0, 2.0], [10.0, 2.0]], [[40.0, 2.0], [40.0, 8.0]], d).round(6).tolist()
    [0.0, 1.0]
    """
    a = orthogonal_offset(theta_from, direction)
    b = orthogonal_offset(theta_to, direction)
    flat_a = np.asarray(theta_from, float).reshape(np.shape(a) + (-1,))
    flat_b = np.asarray(theta_to, float).reshape(np.shape(b) + (-1,))
    growth = np.log(np.linalg.norm(flat_b, axis=-1) / np.linalg.norm(flat_a, axis=-1))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(b / a) / growth


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
    >>> q, kappa = al.offset_equilibrium(prob, al.max_margin(prob))
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
    >>> bool(al.gradient_cosine(prob, np.zeros(3), al.max_margin(prob).theta) < 0)
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
    >>> round(al.descent_bound(prob, al.max_margin(prob).theta), 6)
    -0.707107
    """
    theta_mm = np.asarray(theta_mm, float).ravel()
    A = prob.A.reshape(prob.n, prob.T, -1)
    d = A[np.arange(prob.n), prob.opt][:, None, :] - A
    return float(-1.0 / (np.linalg.norm(theta_mm) * np.linalg.norm(d, axis=-1).max()))


def exponential_rate(t, log_y, start: float = 0.5) -> np.ndarray:
    """Fitted decay rate ``−d log y / dt`` over ``[start·T, T]`` (``T = t[-1]``), per column: (B,).

    ``t`` (R,) steps; ``log_y`` (R,) or (R, B) logarithms of a decaying quantity (a loss gap from
    ``prob.log_gap``, the attention left off the optimal tokens...). Under normalised GD with step
    ``η`` both decay like ``e^{−ηt/M}``, ``M = ‖p_mm*‖``: the rate times ``M/η`` tends to 1.

    >>> import numpy as np, attnlib as al
    >>> t = np.arange(0.0, 101.0)
    >>> al.exponential_rate(t, -0.3 * t + 2.0).round(6).tolist()
    [0.3]
    """
    t = np.asarray(t, float)
    log_y = np.asarray(log_y, float)
    log_y = log_y[:, None] if log_y.ndim == 1 else log_y
    if log_y.ndim != 2 or log_y.shape[0] != t.shape[0]:
        raise ValueError(f"log_y must have shape (R,) or (R, B) with R = {t.shape[0]}, got {log_y.shape}")
    first = int(np.searchsorted(t, start * t[-1]))
    return np.array(
        [-fit_slope(t[first:], log_y[first:, b], log_x=False, log_y=False)[0] for b in range(log_y.shape[1])]
    )


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
    >>> value, tol = al.gd_gap_constant(prob, run.steps[1:], run.theta[1:, 0], 1.0, 1.0)
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
    >>> al.offset_check_horizon(prob, al.max_margin(prob), 100, 0.1)
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
    :func:`attnlib.half_decade_slopes`), ``theta`` (R, d) the run.
    """
    from .rates import half_decade_slopes

    steps = np.asarray(steps, float)
    M = float(np.linalg.norm(direction))
    s_last, s_prev = half_decade_slopes(steps, norm)
    start = int(np.searchsorted(steps, steps[-1] / np.sqrt(10) * (1 - 1e-12)))
    return s_last / M, float(2 * abs(s_last - s_prev) / M + one_minus_cosine(theta[start], direction))


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
