"""Gradient flow to ``t = 10¹⁵``, a smoothness bound ``L``, and plain GD below ``1/L`` ([MMTS]).

The convergence theorems of [MMTS] and [TFSVM] are about **plain gradient descent with a step
below 1/L**, ``L`` a bound on the smoothness of the loss (paraphrase; the papers' exact constants
are not verified here). GD's direction converges only like ``1/log t``, so the theorems'
regime is reached at astronomically many steps. This module gives the three pieces that make it
reachable and checkable:

- :func:`smoothness_bound`: an upper bound ``L ≥ sup_θ ‖∇²L(θ)‖₂`` computed from the logit
  features, the scores and the loss's curvature (the derivation is in its docstring), and
  :func:`hessian` / :func:`sampled_smoothness`, the exact Hessian it bounds;
- :func:`gradient_flow`: the limit ``η → 0`` of GD, ``dθ/dt = −∇L(θ)``, integrated in the log time
  ``u = log(1 + t)`` by an adaptive solver of scipy, for a batch of starts (and of problems), recorded
  on a log grid up to ``t = 10¹⁵`` in a fraction of a second;
- :func:`train_below_smoothness`: GD at ``η = c/L`` through :func:`attnlib.train`.

GD at step ``η`` after ``k`` steps is compared with the flow at time ``t = ηk``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy.integrate import solve_ivp
from scipy.optimize import nnls
from scipy.sparse import block_diag
from scipy.special import expit

from .losses import Loss
from .model import AttentionProblem, ProblemStack, TokenSelectionProblem, logsumexp, terms_and_scaled_grad
from .optim import Trajectory, train

__all__ = [
    "loss_curvature_bounds",
    "smoothness_bound",
    "hessian",
    "sampled_smoothness",
    "FlowTrajectory",
    "gradient_flow",
    "flow_grid",
    "step_below_smoothness",
    "train_below_smoothness",
    "tail_weights",
    "support_offset",
    "tail_flow",
    "tail_gd",
    "tail_error_rate",
    "GDDirection",
    "gd_direction",
    "gd_norm_slope",
]


# ---------------------------------------------------------------------- the smoothness bound


def _second_derivative(loss: Loss, u: np.ndarray) -> np.ndarray:
    """``ℓ''(u)`` for the library's losses (the Hessian needs it; :mod:`attnlib.losses` gives ℓ and ℓ')."""
    u = np.asarray(u, float)
    if loss.name == "logistic":
        return expit(u) * expit(-u)
    if loss.name == "exponential":
        return np.exp(-u)
    if loss.name == "linear":
        return np.zeros_like(u)
    if loss.name == "cross-entropy":
        return 1.0 / u**2
    raise ValueError(
        f"no second derivative known for loss {loss.name!r}; known: logistic, exponential, linear, cross-entropy"
    )


def loss_curvature_bounds(loss: Loss, lo, hi) -> tuple[np.ndarray, np.ndarray]:
    """``(max |ℓ'|, max ℓ'')`` of ``loss`` over outputs ``u ∈ [lo, hi]`` (arrays broadcast together).

    The output of sample ``i`` is a softmax average of its scores, so it stays in
    ``[min_t γ_it, max_t γ_it]`` whatever θ: these are the constants of :func:`smoothness_bound`.
    Logistic: ``|ℓ'| = sigmoid(−u)`` is largest at ``lo``, ``ℓ'' = sigmoid(u)sigmoid(−u)`` at the point of
    ``[lo, hi]`` nearest 0. Exponential: ``e^{−lo}`` for both. Linear: ``(1, 0)``. Cross-entropy
    ``−log u``: ``(1/lo, 1/lo²)`` (infinite when ``lo ≤ 0``: the loss is not smooth there).

    >>> import attnlib as al
    >>> d1, d2 = loss_curvature_bounds(al.get_loss("logistic"), 0.0, 1.0)
    >>> float(d1), float(d2)
    (0.5, 0.25)
    """
    lo, hi = np.broadcast_arrays(np.asarray(lo, float), np.asarray(hi, float))
    if loss.name == "logistic":
        return expit(-lo), _second_derivative(loss, np.clip(0.0, lo, hi))
    if loss.name == "exponential":
        return np.exp(-lo), np.exp(-lo)
    if loss.name == "linear":
        return np.ones_like(lo), np.zeros_like(lo)
    if loss.name == "cross-entropy":
        with np.errstate(divide="ignore"):
            inv = np.where(lo > 0, 1.0 / np.where(lo > 0, lo, 1.0), np.inf)
        return inv, inv**2
    raise ValueError(
        f"no curvature bounds known for loss {loss.name!r}; known: logistic, exponential, linear, cross-entropy"
    )


def _features(prob) -> np.ndarray:
    """The logit features of a problem or of a stack, ``(*stack, n, T, size)``."""
    if isinstance(prob, ProblemStack):
        return np.stack([_features(p) for p in prob.problems])
    if not isinstance(prob, TokenSelectionProblem):
        raise ValueError(f"prob must be a TokenSelectionProblem or a ProblemStack, got {type(prob).__name__}")
    return prob.A.reshape(prob.n, prob.T, prob.size)


def smoothness_bound(prob) -> float | np.ndarray:
    """An upper bound ``L`` on ``‖∇²L(θ)‖₂`` over all θ: GD with ``η ≤ 1/L`` is the theorems' regime.

    Derivation. Write ``u_i = Σ_t σ_it γ_it`` and let ``E``, ``Cov`` be the mean and covariance
    over the tokens of sample ``i`` under the softmax ``σ_i``. Differentiating
    ``E[f] = Σ_t σ_t f_t`` gives ``∇E[f] = E[∇f] + Cov(f, A)``, hence

    .. math::

        ∇u_i = E[(γ − u_i)(A − Ā_i)], \\qquad ∇²u_i = E[(γ − u_i)(A − Ā_i)(A − Ā_i)^⊤],

    with ``Ā_i = E[A]`` (``∇Ā_i = Cov(A)``), and
    ``∇²L = (1/n) Σ_i (ℓ''(u_i) ∇u_i ∇u_iᵀ + ℓ'(u_i) ∇²u_i)``. For a unit vector ``w`` put
    ``X = ⟨w, A − Ā_i⟩``: it lies in an interval of width ``D_i = max_{t,τ} ‖A_it − A_iτ‖``, so
    ``E[X²] ≤ D_i²/4`` (variance of a bounded variable); likewise ``Var(γ) ≤ Δ_i²/4`` with
    ``Δ_i = max_t γ_it − min_t γ_it``, and ``|γ_t − u_i| ≤ Δ_i``. By Cauchy–Schwarz
    ``|⟨w, ∇u_i⟩| = |Cov(γ, X)| ≤ Δ_i D_i/4`` and ``|wᵀ∇²u_i w| ≤ Δ_i E[X²] ≤ Δ_i D_i²/4``. With
    ``ℓ'`` and ``ℓ''`` bounded over the outputs' range ``[min γ_i, max γ_i]``
    (:func:`loss_curvature_bounds`),

    .. math::

        L = \\frac1n \\sum_i \\Big( \\max ℓ''\\,\\frac{Δ_i^2 D_i^2}{16} + \\max|ℓ'|\\,\\frac{Δ_i D_i^2}{4} \\Big).

    (ℓ'' ≥ 0 for the convex losses here; the bound is on ``|wᵀ∇²L w|``.) It is attained only in
    the limit of two-point softmaxes with aligned worst cases, so it is typically a few times the
    largest sampled Hessian (:func:`sampled_smoothness`; the tests check ``bound ≥ sampled``).

    Returns a float, or (S,) for a :class:`attnlib.ProblemStack`.

    >>> import attnlib as al
    >>> round(al.flow.smoothness_bound(al.datasets.single_input()), 5)
    0.01625
    """
    A = _features(prob)
    gamma = np.asarray(prob.gamma, float)
    width = np.sqrt(((A[..., :, None, :] - A[..., None, :, :]) ** 2).sum(-1)).max(axis=(-2, -1))  # D_i
    lo, hi = gamma.min(-1), gamma.max(-1)
    spread = hi - lo  # Δ_i
    d1, d2 = loss_curvature_bounds(prob.loss, lo, hi)
    per_sample = d2 * spread**2 * width**2 / 16 + d1 * spread * width**2 / 4
    bound = per_sample.mean(-1)
    return float(bound) if np.ndim(bound) == 0 else bound


def hessian(prob, theta) -> np.ndarray:
    """The exact Hessian ``∇²L(θ)`` (formula of :func:`smoothness_bound`): (*batch, size, size).

    ``prob`` a :class:`attnlib.TokenSelectionProblem` or a stack (then ``theta`` is
    (*batch, S, *shape)); computed from the log-softmax, float64.

    >>> import numpy as np, attnlib as al
    >>> H = al.flow.hessian(al.datasets.single_input(), np.zeros((2, 3)))
    >>> H.shape, bool(np.allclose(H, np.swapaxes(H, -1, -2)))
    ((2, 3, 3), True)
    """
    flat, _ = prob.flatten(theta)
    terms = prob.terms_from_flat(flat)
    A = _features(prob)  # (*stack, n, T, size)
    sigma = np.exp(terms.log_sigma)  # (*batch, n, T)
    gamma = np.asarray(prob.gamma, float)
    centred = A - (sigma[..., None] * A).sum(-2, keepdims=True)  # A − Ā_i: (*batch, n, T, size)
    # γ_t − u_i from the reference token, as in the cancellation-free gradient.
    ref = np.argmax(terms.log_sigma, axis=-1)[..., None]
    gamma_b = np.broadcast_to(gamma, sigma.shape)
    gamma_ref = np.take_along_axis(gamma_b, ref, -1)
    diff = (gamma_b - gamma_ref) + (sigma * (gamma_ref - gamma_b)).sum(-1, keepdims=True)
    weighted = sigma * diff  # σ_t (γ_t − u_i)
    grad_u = (weighted[..., None] * centred).sum(-2)  # (*batch, n, size)
    hess_u = np.einsum("...t,...ta,...tb->...ab", weighted, centred, centred)
    d1 = prob.loss.derivative(terms.output)
    d2 = _second_derivative(prob.loss, terms.output)
    per_sample = d2[..., None, None] * grad_u[..., :, None] * grad_u[..., None, :] + d1[..., None, None] * hess_u
    return per_sample.mean(-3)


def sampled_smoothness(prob, theta) -> np.ndarray:
    """``‖∇²L(θ)‖₂`` (largest absolute eigenvalue of :func:`hessian`) at each point: (*batch,).

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.single_input()
    >>> pts = np.random.default_rng(0).normal(scale=3, size=(100, 3))
    >>> bool(sampled_smoothness(prob, pts).max() <= al.flow.smoothness_bound(prob))
    True
    """
    return np.abs(np.linalg.eigvalsh(hessian(prob, theta))).max(-1)


# ---------------------------------------------------------------------- gradient flow


@dataclass(frozen=True, eq=False)
class FlowTrajectory(Trajectory):
    """Gradient flow ``dθ/dt = −∇L`` recorded at times ``steps`` (a :class:`attnlib.Trajectory`).

    ``steps`` holds the *times* ``t`` (floats, 0 first); GD at step ``η`` after ``k`` steps sits
    near the flow at ``t = ηk``. ``method`` is ``"flow"``, ``lr`` is 1 (one unit of time).

    Extra attributes: ``solver`` (scipy's method), ``rtol``, ``atol`` (its tolerances), ``nfev``
    (right-hand side evaluations, each one batched gradient), ``message`` (the solver's).
    """

    solver: str = "LSODA"
    rtol: float = 0.0
    atol: float = 0.0
    nfev: int = 0
    message: str = ""

    @property
    def times(self) -> np.ndarray:
        """The recorded times ``t``: (R,)."""
        return self.steps


def flow_grid(t_max: float = 1e15, per_decade: int = 8, t_min: float = 1e-2) -> np.ndarray:
    """Record times: 0, then ``per_decade`` log-spaced times per decade from ``t_min`` to ``t_max``.

    >>> flow_grid(1e2, per_decade=1, t_min=1.0).tolist()
    [0.0, 1.0, 10.0, 100.0]
    """
    if not (np.isfinite(t_max) and t_max > t_min > 0):
        raise ValueError(f"need 0 < t_min < t_max < inf, got t_min={t_min!r}, t_max={t_max!r}")
    if not isinstance(per_decade, (int, np.integer)) or per_decade < 1:
        raise ValueError(f"per_decade must be a positive integer, got {per_decade!r}")
    decades = np.log10(t_max / t_min)
    count = int(np.ceil(decades * per_decade - 1e-9)) + 1
    return np.r_[0.0, t_min * 10.0 ** np.linspace(0, decades, count)]


_SOLVERS = ("LSODA", "BDF", "Radau", "DOP853", "RK45")


def gradient_flow(
    prob: AttentionProblem,
    theta0,
    times=None,
    t_max: float = 1e15,
    rtol: float = 1e-10,
    atol: float = 1e-10,
    solver: str = "LSODA",
) -> FlowTrajectory:
    """Integrate gradient flow ``dθ/dt = −∇L(θ)`` for a batch of starts to ``t = 10¹⁵``.

    In the log time ``u = log(1 + t)`` the flow reads

    .. math::

        \\frac{dθ}{du} = −(1 + t)\\,∇L(θ) = −\\exp\\big(u + m(θ)\\big)\\, g(θ),

    with ``∇L = e^m g`` the cancellation-free scaled gradient of the problem
    (``scaled_grad_from``), so the right-hand side is of order one when ``∇L ~ 1/t`` (GD's
    asymptotic regime, ``‖θ‖ ~ M log t``) and the whole horizon costs a few hundred steps of an
    adaptive solver. The batch is one ODE system: the solver's error control applies to every
    member at once (``rtol``, ``atol`` on each coordinate of every θ).

    Args:
        prob: an :class:`attnlib.AttentionProblem` (a problem, or a stack of S problems).
        theta0: (*shape) or (B, *shape) starts; for a stack (S, *shape), one per problem (or
            (*shape), shared).
        times: increasing record times starting at 0 (default :func:`flow_grid` up to ``t_max``).
        t_max: the horizon when ``times`` is not given.
        rtol, atol: the solver's tolerances.
        solver: a method of ``scipy.integrate.solve_ivp`` (LSODA switches between Adams and BDF as
            the system turns stiff).

    Returns a :class:`FlowTrajectory` (``steps`` are the times). Raises RuntimeError when the solver
    fails (nothing half-computed is returned).

    >>> import numpy as np, attnlib as al
    >>> run = al.flow.gradient_flow(al.datasets.single_input(), np.zeros((2, 3)), t_max=1e6)
    >>> run.theta.shape[1:], bool(run.norm[-1, 0] > run.norm[1, 0])
    ((2, 3), True)
    """
    if solver not in _SOLVERS:
        raise ValueError(f"solver must be one of {list(_SOLVERS)}, got {solver!r}")
    for name, tol in (("rtol", rtol), ("atol", atol)):
        if not (np.isscalar(tol) and np.isfinite(tol) and tol > 0):
            raise ValueError(f"{name} must be a positive finite number, got {tol!r}")
    times = flow_grid(t_max) if times is None else np.asarray(times, float)
    if times.ndim != 1 or times.size < 2 or times[0] != 0 or np.any(np.diff(times) <= 0) or not np.isfinite(times[-1]):
        raise ValueError("times must be increasing finite record times starting at 0 (at least two)")
    theta = np.array(theta0, dtype=float)
    stacked = isinstance(prob, ProblemStack)
    if theta.shape == tuple(prob.shape):
        theta = np.repeat(theta[None], prob.S if stacked else 1, axis=0)
    if theta.ndim != len(prob.shape) + 1 or theta.shape[1:] != tuple(prob.shape) or (stacked and len(theta) != prob.S):
        want = f"(S={prob.S}, *{prob.shape})" if stacked else f"(B, *{prob.shape})"
        raise ValueError(f"theta0 must have shape {prob.shape} or {want}, got {theta.shape}")
    if not np.all(np.isfinite(theta)):
        raise ValueError("theta0 must be finite")
    B, size = theta.shape[0], int(np.prod(prob.shape))

    def field(u, y):
        flat = y.reshape(B, size)
        # the trainers' fused step (the same numbers up to rounding), without log δ, which the field never reads
        _, m, g = terms_and_scaled_grad(prob, flat, log_delta=False)
        with np.errstate(under="ignore"):
            scale = np.exp(np.where(np.isfinite(m), u + m, -np.inf))  # 0 where the gradient is exactly 0
        return (-scale[:, None] * g).ravel()

    log_times = np.log1p(times)
    # Members do not interact: the Jacobian is block-diagonal with (size × size) blocks, i.e. banded
    # with half-bandwidth size − 1, so the stiff solvers estimate it with 2·size − 1 evaluations
    # instead of B·size (what makes a basin map of thousands of starts one cheap call).
    if solver == "LSODA":
        structure = {"lband": size - 1, "uband": size - 1}
    elif solver in ("BDF", "Radau"):
        structure = {"jac_sparsity": block_diag([np.ones((size, size))] * B, format="csc")}
    else:
        structure = {}
    start = time.perf_counter()
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        sol = solve_ivp(
            field,
            (0.0, log_times[-1]),
            theta.ravel(),
            method=solver,
            t_eval=log_times,
            rtol=rtol,
            atol=atol,
            **structure,
        )
    seconds = time.perf_counter() - start
    if sol.status != 0 or sol.y.shape[1] != times.size or not np.all(np.isfinite(sol.y)):
        raise RuntimeError(f"gradient flow ({solver}) failed before t = {times[-1]:g}: {sol.message}")
    flat = sol.y.T.reshape(times.size, B, size)
    with np.errstate(divide="ignore"):
        terms = prob.terms_from_flat(flat)
        m, g = prob.scaled_grad_from(terms)
        log_gn = m + np.log(np.linalg.norm(g, axis=-1))
    return FlowTrajectory(
        theta=flat.reshape((times.size, B) + tuple(prob.shape)),
        steps=times,
        loss=np.mean(prob.loss.value(terms.output), axis=-1),
        log_gap=prob.log_gap_from(terms),
        log_grad_norm=log_gn,
        stopped=(None,) * B,
        method="flow",
        lr=1.0,
        seconds=np.full(times.size, seconds),
        solver=solver,
        rtol=float(rtol),
        atol=float(atol),
        nfev=int(sol.nfev),
        message=str(sol.message),
    )


# ---------------------------------------------------------------------- GD below 1/L


def step_below_smoothness(prob, fraction: float = 0.1) -> float | np.ndarray:
    """The GD step ``η = fraction / L`` with ``L`` from :func:`smoothness_bound` ((S,) for a stack).

    ``fraction`` must be in (0, 2): above ``2/L`` GD's descent lemma gives nothing.

    >>> import attnlib as al
    >>> round(al.flow.step_below_smoothness(al.datasets.single_input(), 1.0), 2)
    61.52
    """
    if not (np.isscalar(fraction) and 0 < fraction < 2):
        raise ValueError(f"fraction must be a number in (0, 2) (η·L), got {fraction!r}")
    return fraction / smoothness_bound(prob)


def train_below_smoothness(prob, theta0, steps: int, fraction: float = 0.1, **kwargs) -> Trajectory:
    """Plain GD at ``η = fraction / L`` (:func:`step_below_smoothness`) via :func:`attnlib.train`.

    For a stack of S problems each problem gets its own step (``lr`` (S,)). Other keyword
    arguments go to :func:`attnlib.train` (``record_steps``, ``record_every``, ``progress``).

    >>> import numpy as np, attnlib as al
    >>> run = al.flow.train_below_smoothness(al.datasets.single_input(), np.zeros(3), steps=10, fraction=1.0)
    >>> run.method, round(float(run.lr), 2)
    ('gd', 61.52)
    """
    lr = step_below_smoothness(prob, fraction)
    return train(prob, theta0, steps=steps, method="gd", lr=lr, **kwargs)


# ---------------------------------------------------------------------- GD's asymptotic regime


def tail_weights(prob: TokenSelectionProblem, select=None) -> tuple[np.ndarray, np.ndarray]:
    """The exponential-tail form of ``−∇L`` once every sample attends to its token ``α_i``.

    With ``σ_iα → 1`` the softmax gives ``σ_it = σ_iα e^{−⟨θ, d_it⟩}``, ``d_it = A_iα − A_it``, and

    .. math::

        −∇L(θ) ≈ \\sum_{i, t ≠ α_i} w_{it}\\, e^{−⟨θ, d_{it}⟩}\\, d_{it}, \\qquad
        w_{it} = \\frac{|ℓ'(γ_{iα})|\\,(γ_{iα} − γ_{it})}{n},

    the gradient of an exponential-tail separation problem (Soudry et al.'s setting), with relative
    error of the order of the mass ``1 − σ_iα`` left off the selected tokens (:func:`gd_direction`).

    Returns ``(d (n, T, size), w (n, T))`` (``w = 0`` at ``α_i``). ``select`` defaults to ``prob.opt``.

    >>> import attnlib as al
    >>> d, w = al.flow.tail_weights(al.datasets.loss_study(3.0))
    >>> d.shape, w.round(4).tolist()
    ((2, 2, 3), [[0.0711, 0.0], [0.1345, 0.0]])
    """
    select = prob.opt if select is None else np.asarray(select, int)
    n, T = prob.n, prob.T
    if select.shape != (n,) or np.any((select < 0) | (select >= T)):
        raise ValueError(f"select must be {n} token indices in [0, {T}), got {select!r}")
    A = prob.A.reshape(n, T, prob.size)
    rows = np.arange(n)
    d = A[rows, select][:, None, :] - A
    gamma_sel = prob.gamma[rows, select]
    w = -prob.loss.derivative(gamma_sel)[:, None] * (gamma_sel[:, None] - prob.gamma) / n
    w[rows, select] = 0.0
    return d, w


def support_offset(prob: TokenSelectionProblem, sol) -> tuple[np.ndarray, bool]:
    """``p̃`` of the decomposition ``θ(t) = θ_mm log t + p̃ + o(1)`` on the span of the support set.

    Put ``θ = θ_mm log t + p̃`` into the tail flow (:func:`tail_weights`): the support vectors
    (SVM-neighbours, ``⟨θ_mm, d_j⟩ = 1``) contribute ``w_j e^{−⟨p̃, d_j⟩} d_j / t`` and the others
    decay faster, so ``Σ_S w_j e^{−⟨p̃, d_j⟩} d_j = θ_mm``. With the KKT form ``θ_mm = Σ_S a_j d_j``
    (``a ≥ 0`` by non-negative least squares), ``⟨p̃, d_j⟩ = log(w_j / a_j)`` on the support set
    fixes ``p̃`` on the span of the ``d_j``; the component outside it is set by the transient and by
    the non-neighbours, whose pull decays only like ``t^{−(c_j − 1)}`` (``c_j = ⟨θ_mm, d_j⟩ > 1``).
    Returns ``(p̃ (size,), determined)``, ``determined`` when the support set spans every ``d_it``
    (then ``p̃`` is the whole offset). Needs every support weight ``w_j > 0`` (local optimality).

    >>> import attnlib as al
    >>> prob = al.datasets.loss_study(3.0)
    >>> p_tilde, determined = al.flow.support_offset(prob, al.max_margin(prob))
    >>> p_tilde.round(3).tolist(), determined
    ([-1.632, -0.318, 0.0], True)
    """
    d, w = tail_weights(prob, sol.select)
    support = np.asarray(sol.neighbors, bool)
    if np.any(w[support] <= 0):
        raise ValueError("support_offset needs a locally optimal selection (every SVM-neighbour scores below α_i)")
    d_support = d[support]
    coef, _ = nnls(d_support.T, np.ravel(sol.theta))
    with np.errstate(divide="ignore"):
        target = np.log(w[support] / coef)
    if not np.all(np.isfinite(target)):
        raise ValueError("a support vector has a zero dual weight: p̃ is not determined by the dual")
    p_tilde, *_ = np.linalg.lstsq(d_support, target, rcond=None)
    rank_all = np.linalg.matrix_rank(d.reshape(-1, prob.size), tol=1e-10)
    return p_tilde, bool(np.linalg.matrix_rank(d_support, tol=1e-10) == rank_all)


def _tail_terms(d, w, select):
    keep = np.arange(d.shape[1])[None, :] != np.asarray(select)[:, None]
    return d[keep], w[keep]  # (J, size), (J,)


def tail_flow(prob, select, theta_start, t_start: float, times) -> np.ndarray:
    """Integrate the tail flow ``dθ/dt = Σ_j w_j e^{−⟨θ, d_j⟩} d_j`` from ``θ(t_start)``: (R, B, size).

    In log time ``s = log t`` (LSODA, rtol 1e-11). ``theta_start`` (B, size); ``times`` (R,) ≥ ``t_start``.
    """
    d, w = _tail_terms(*tail_weights(prob, select), select)
    start = np.asarray(theta_start, float).reshape(-1, prob.size)
    B = start.shape[0]

    def field(s, y):
        theta = y.reshape(B, prob.size)
        return ((w * np.exp(s - theta @ d.T)) @ d).ravel()

    s = np.log(np.asarray(times, float))
    sol = solve_ivp(field, (np.log(t_start), s[-1]), start.ravel(), method="LSODA", t_eval=s, rtol=1e-11, atol=1e-11)
    if sol.status != 0 or sol.y.shape[1] != s.size:
        raise RuntimeError(f"tail flow failed: {sol.message}")
    return sol.y.T.reshape(s.size, B, prob.size)


def tail_gd(prob, select, theta_start, lr: float, steps: int) -> np.ndarray:
    """``steps`` GD steps of size ``lr`` on the tail form from ``theta_start`` (B, size): the end (B, size)."""
    d, w = _tail_terms(*tail_weights(prob, select), select)
    theta = np.array(theta_start, float).reshape(-1, prob.size)
    lrs = np.broadcast_to(np.asarray(lr, float), (theta.shape[0],))[:, None]
    # A run far from the regime (not selected α) overflows: its prediction is NaN, and the checks fail it.
    with np.errstate(over="ignore", invalid="ignore"):
        for _ in range(int(steps)):
            theta += lrs * ((w * np.exp(-theta @ d.T)) @ d)
    return theta


def tail_error_rate(prob, select, theta) -> np.ndarray:
    """Relative error ``ε`` of the tail form of ``−∇L`` at ``theta`` (*batch, *shape): (*batch,).

    Per sample, with ``m_i = 1 − σ_iα``: ``σ_it`` differs from ``e^{−⟨θ, d_it⟩}`` by the factor
    ``1 − m_i``; ``γ_it − u_i`` from ``γ_it − γ_iα`` by ``δ_i ≤ m_i Δ_i``; ``A_it − Ā_i`` from
    ``−d_it`` by at most ``m_i D_i``; ``ℓ'(u_i)`` from ``ℓ'(γ_iα)`` by ``max ℓ'' · δ_i``; the
    selected token's own term is ``O(m_i²)``. Relative to the term itself:
    ``ε_i = m_i (2 + Δ_i/g_i + D_i/d_i + Δ_i max ℓ''/|ℓ'(γ_iα)|)``, with ``g_i`` the smallest score
    gap and ``d_i`` the shortest ``‖d_it‖``; returned is ``max_i ε_i``.
    """
    select = np.asarray(select, int)
    rows = np.arange(prob.n)
    mass_off = np.exp(_log_mass_off(prob, select, theta))  # m_i, accurate far below machine epsilon
    d, w = tail_weights(prob, select)
    others = np.arange(prob.T)[None, :] != select[:, None]
    gaps = np.abs(prob.gamma[rows, select][:, None] - prob.gamma)
    lengths = np.linalg.norm(d, axis=-1)
    spread = prob.gamma.max(1) - prob.gamma.min(1)
    width = np.sqrt(((d[:, :, None, :] - d[:, None, :, :]) ** 2).sum(-1)).max((-2, -1))
    g_min = np.where(others & (gaps > 0), gaps, np.inf).min(1)
    d_min = np.where(others, lengths, np.inf).min(1)
    gamma_sel = prob.gamma[rows, select]
    _, d2 = loss_curvature_bounds(prob.loss, prob.gamma.min(1), prob.gamma.max(1))
    factor = 2 + spread / g_min + width / d_min + spread * d2 / -prob.loss.derivative(gamma_sel)
    return (mass_off * factor).max(-1)


@dataclass(frozen=True, eq=False)
class GDDirection:
    """GD (or gradient flow) against its asymptotic regime: the tail flow of the selection ``α``.

    The check :func:`gd_direction` makes: from ``t_start`` on, the run follows the tail flow of ``α``
    (whose solutions are ``θ_mm(α) log t + p̃ + z(t)``, with ``z`` the slow non-neighbour drift), to
    within the neglected terms. Attributes, per run (B,):

    - ``angle``: degrees between the run's end ``θ(T)`` and the prediction ``P(T)`` (180 where the
      prediction overflowed: the run was far from the regime);
    - ``tolerance``: degrees subtended at ``‖θ(T)‖`` by the bound ``2 ε(t_start) V`` on the
      accumulated neglected terms (``ε`` :func:`tail_error_rate`, which decays like ``1/t``;
      ``V`` the largest log-time speed ``‖dP/d log t‖`` of the prediction);
    - ``mass_off``: ``max_i (1 − σ_iα)`` at ``t_start`` (the premise: the run has selected ``α``;
      the tolerance is 0 when ``ε(t_start) ≥ 1/2``);
    - ``direction_error``: degrees between ``θ(T)`` and ``θ_mm`` (what ``1/log t`` leaves), and
      ``predicted_error`` the same for ``P(T)``;
    - ``predicted`` (B, size) ``P(T)``; ``log_window`` ``log T − log t_start``.
    """

    angle: np.ndarray
    tolerance: np.ndarray
    mass_off: np.ndarray
    direction_error: np.ndarray
    predicted_error: np.ndarray
    predicted: np.ndarray
    final: np.ndarray
    theta_mm: np.ndarray
    log_window: float
    t_start: float
    t_end: float

    def against(self, reference) -> np.ndarray:
        """The same angle when the prediction's leading term ``θ_mm log t`` is replaced by ``reference log t``.

        A control: ``P(T) + (reference − θ_mm)(log T − log t_start)``. (B,) degrees.
        """
        shifted = self.predicted + (np.ravel(reference) - self.theta_mm) * self.log_window
        return _angle(self.final, shifted)

    def resolution(self) -> float:
        """The smallest rotation (degrees) of ``θ_mm`` that :meth:`against` detects (in the plane of θ(T), P(T)).

        The angle grows by about ``φ ‖θ_mm‖ log-window / ‖θ(T)‖``; solved for the largest tolerance.
        """
        norm = np.linalg.norm(self.final, axis=-1)
        gain = np.linalg.norm(self.theta_mm) * self.log_window / norm
        return float(np.max((self.tolerance + self.angle) / gain))


def _angle(a, b) -> np.ndarray:
    a, b = np.asarray(a, float), np.asarray(b, float)
    cross = np.linalg.norm(a[..., :, None] * b[..., None, :] - a[..., None, :] * b[..., :, None], axis=(-2, -1))
    return np.degrees(np.arctan2(cross / np.sqrt(2), (a * b).sum(-1)))


def _numerical_error(lr, solver_rtol: float, norm) -> np.ndarray:
    """What integration adds to a position: ``100·rtol·(1 + ‖θ‖)`` for a flow (LSODA's global error
    measured at about 40 rtol on these problems), ``10⁻¹²(1 + ‖θ‖)`` for GD (rounding)."""
    return (100 * solver_rtol if lr is None else 1e-12) * (1 + np.asarray(norm, float))


def gd_direction(
    prob: TokenSelectionProblem,
    sol,
    times,
    theta,
    lr=None,
    start: float = 0.5,
    max_error: float = 0.1,
    solver_rtol: float = 1e-10,
) -> GDDirection:
    """Check a GD run or a gradient flow against the tail flow of ``sol.select`` (the Soudry-type regime).

    ``times`` (R,) the recorded times of a flow (``lr=None``) or the recorded *steps* of a GD run at
    step ``lr`` (then the prediction is GD on the tail form, :func:`tail_gd`, with the same step);
    ``theta`` (R, B, *shape). The prediction starts at the first record with ``log t ≥ start·log T``
    (``t = ηk`` for GD) at which every run has selected ``α`` (``ε ≤ max_error``; if none, at the
    first record after ``T^start``) from the run's own state there, so the test is whether the run has
    entered the regime in which ``θ(t) = θ_mm log t + p̃ + z(t)`` holds (:func:`support_offset`), and
    stays in it to ``T``. The tolerance is fixed by the theory before the comparison: the
    neglected terms are at most ``ε(t)`` relative (:func:`tail_error_rate`), ``ε ∝ 1/t`` once the
    run has selected ``α``, so their accumulated effect is at most ``2 ε(t_start) V`` (``V`` the
    largest speed ``‖dP/d log t‖``). A run that has not selected ``α`` (a trap) has ``ε ≥ 1``.
    For a flow the bound adds the integration error ``100·solver_rtol·(1 + ‖θ‖)`` (``solver_rtol``:
    the flow's ``rtol``). Returns a :class:`GDDirection`.
    """
    steps = np.asarray(times, float)
    t = steps if lr is None else steps * float(lr)
    theta = np.asarray(theta, float)
    R, B = theta.shape[:2]
    flat = theta.reshape(R, B, prob.size)
    positive = t > 0
    log_t = np.log(np.where(positive, t, 1.0))
    candidates = np.flatnonzero(positive & (log_t >= start * log_t[-1]))[:-1]
    # The premise, decided before the comparison: start where every run has selected α (ε ≤
    # max_error); if that never happens, at T^start, where the runs that have not fail.
    # (the first such record: later ones are not evaluated)
    selected = (k for k in candidates if np.all(tail_error_rate(prob, sol.select, theta[k]) <= max_error))
    k0 = int(next(selected, candidates[0]))
    if lr is None:
        path = tail_flow(prob, sol.select, flat[k0], t[k0], t[k0:])
        predicted = path[-1]
        speed = np.linalg.norm(np.diff(path, axis=0), axis=-1) / np.diff(log_t[k0:])[:, None]
    else:
        predicted = tail_gd(prob, sol.select, flat[k0], lr, int(steps[-1] - steps[k0]))
        speed = np.linalg.norm(predicted - flat[k0], axis=-1)[None] / (log_t[-1] - log_t[k0])
        speed = np.maximum(speed, np.linalg.norm(np.ravel(sol.theta)))
    eps = tail_error_rate(prob, sol.select, theta[k0])
    # The bound needs the tail form to be an approximation (ε < 1/2) at the start; a run that has
    # not selected α by then (a trap) gets tolerance 0: it fails, it is not "not applicable".
    norm_end = np.linalg.norm(flat[-1], axis=-1)
    bound = np.where(eps < 0.5, 2 * eps * speed.max(0) + _numerical_error(lr, solver_rtol, norm_end), 0.0)
    theta_mm = np.ravel(sol.theta)
    angle = np.where(np.all(np.isfinite(predicted), -1), _angle(flat[-1], predicted), 180.0)
    return GDDirection(
        angle=angle,
        tolerance=np.degrees(np.arctan(bound / norm_end)),
        mass_off=np.exp(np.max(_log_mass_off(prob, sol.select, theta[k0]), axis=-1)),
        direction_error=_angle(flat[-1], theta_mm),
        predicted_error=_angle(predicted, theta_mm),
        predicted=predicted,
        final=flat[-1],
        theta_mm=theta_mm,
        log_window=float(log_t[-1] - log_t[k0]),
        t_start=float(t[k0]),
        t_end=float(t[-1]),
    )


def _log_mass_off(prob, select, theta) -> np.ndarray:
    """``log(1 − σ_iα)`` per sample at ``theta`` (*batch, *shape): (*batch, n)."""
    flat, _ = prob.flatten(theta)
    log_sigma = prob.terms_from_flat(flat).log_sigma
    others = np.arange(prob.T)[None, :] != np.asarray(select, int)[:, None]
    # log Σ_{t≠α} σ_t, not log(1 − σ_α): the latter rounds to log 0 once σ_α is within ε of 1
    return logsumexp(np.where(others, log_sigma, -np.inf), axis=-1)


def _half_decade_start(t) -> int:
    return int(np.searchsorted(t, t[-1] / np.sqrt(10) * (1 - 1e-12)))


def gd_norm_slope(
    prob: TokenSelectionProblem, sol, times, theta, lr=None, solver_rtol: float = 1e-10
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The book's one rule for GD's norm slope: ``d‖θ‖/d log t`` over the last half-decade, against the tail model.

    ``‖θ(t)‖ = M log t + O(1)`` (``M = ‖θ_mm‖``), but the slope reaches ``M`` only as fast as the
    slowest correction: a non-neighbour with constraint value ``c`` adds a term ``t^{−(c−1)}``,
    which at ``c`` near 1 keeps the slope well below ``M`` for many decades (the multi-input data).
    The rule compares the measured slope with the one of the tail model (:func:`tail_flow`, or
    :func:`tail_gd` for a GD run at step ``lr``) started from the run at the window's start, which
    carries those corrections. ``times``, ``theta`` as in :func:`gd_direction`.

    Returns ``(measured, predicted, tolerance)``, each (B,) in units of ``M``; the tolerance is the
    bound ``2 ε V`` of :func:`gd_direction` on the position, over the window's length in log time
    (0 when the run has not selected ``α``, ``ε ≥ 1/2``), plus the integration error of
    :func:`gd_direction` for a flow.
    """
    steps = np.asarray(times, float)
    t = steps if lr is None else steps * float(lr)
    theta = np.asarray(theta, float)
    R, B = theta.shape[:2]
    flat = theta.reshape(R, B, prob.size)
    k0 = _half_decade_start(t)
    window = np.log(t[-1] / t[k0])
    if lr is None:
        path = tail_flow(prob, sol.select, flat[k0], t[k0], t[k0:])
        end = path[-1]
        speed = np.linalg.norm(np.diff(path, axis=0), axis=-1).max(0) / np.diff(np.log(t[k0:])).min()
    else:
        end = tail_gd(prob, sol.select, flat[k0], lr, int(steps[-1] - steps[k0]))
        speed = np.maximum(np.linalg.norm(end - flat[k0], axis=-1) / window, np.linalg.norm(sol.theta))
    M = float(np.linalg.norm(sol.theta))
    start_norm = np.linalg.norm(flat[k0], axis=-1)
    measured = (np.linalg.norm(flat[-1], axis=-1) - start_norm) / (window * M)
    predicted = (np.linalg.norm(end, axis=-1) - start_norm) / (window * M)
    eps = tail_error_rate(prob, sol.select, theta[k0])
    numerical = _numerical_error(lr, solver_rtol, np.linalg.norm(flat[-1], axis=-1))
    tolerance = np.where(eps < 0.5, (2 * eps * speed + numerical) / (window * M), 0.0)
    return measured, predicted, tolerance
