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
from scipy.special import expit

from .losses import Loss
from .model import AttentionProblem, ProblemStack, TokenSelectionProblem
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
    >>> run = al.gradient_flow(al.datasets.single_input(), np.zeros((2, 3)), t_max=1e6)
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
        m, g = prob.scaled_grad_from(prob.terms_from_flat(flat))
        with np.errstate(under="ignore"):
            scale = np.exp(np.where(np.isfinite(m), u + m, -np.inf))  # 0 where the gradient is exactly 0
        return (-scale[:, None] * g).ravel()

    log_times = np.log1p(times)
    start = time.perf_counter()
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        sol = solve_ivp(
            field, (0.0, log_times[-1]), theta.ravel(), method=solver, t_eval=log_times, rtol=rtol, atol=atol
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
