"""Regularization path: the constrained minimiser of the loss on growing balls ([MMTS], [TFSVM]).

.. math::

    \\bar θ(R) = \\arg\\min_{‖θ‖ ≤ R} L(θ), \\qquad
    \\lim_{R→∞} \\frac{\\bar θ(R)}{R} = \\frac{θ_{mm}^*}{‖θ_{mm}^*‖}

for the prompt ``p`` of [MMTS] (any loss of the class, no condition on the non-optimal scores)
and for ``W`` with the Frobenius W-SVM [TFSVM]. For the factorisation ``W = K Qᵀ`` under
``‖K‖²_F + ‖Q‖²_F ≤ 2R`` the limit of ``K̄Q̄ᵀ/R`` is the *nuclear-norm* SVM direction [TFSVM].

The problem is non-convex, so every radius is solved from several starts (random points on the
sphere plus the previous radius's solution, scaled), all stepped together as one batch by
projected gradient descent with Barzilai–Borwein steps and an Armijo backtracking test.

Why not minimise ``L`` directly: ``L − L* ≈ e^{−R·margin}`` falls below the float
resolution of ``L`` already at ``R ≈ 20–40``, so every candidate has the same computed loss and a
solver has nothing to compare. ``log(L − L*)`` has the same minimisers (a monotone transform) and
stays well scaled at every ``R``, because attnlib computes the gap without subtracting ``L*``. Its
gradient is taken in log space from the library's scaled gradient ``∇L = e^m g``:

.. math::

    ∇ \\log(L − L^*) = \\frac{∇L}{L − L^*} = e^{\\,m − \\log(L − L^*)}\\, g .
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .losses import Loss, get_loss
from .model import Terms, TokenSelectionProblem, log_softmax, logsumexp

__all__ = [
    "RegularizationPath",
    "regularization_path",
    "log_gap_grad",
    "factor_grad",
    "NonlinearHeadAttention",
    "nonlinear_head",
    "OBJECTIVES",
    "PARAMETRIZATIONS",
    "NORMS",
    "parameter_norm",
    "min_margin",
    "margin_ratio",
    "ray_margin_bound",
    "direction_bound",
    "ray_gap_excess",
    "cone_project",
    "selection_log_gap",
    "local_regularization_path",
    "cone_margin_bound",
    "admissible_cone_angle",
    "cone_min_norm",
    "LocalPathCase",
    "local_path_case",
    "regularization_paths",
    "CERTIFICATE_SLACK",
    "uncertified",
    "PathAgainstSVM",
    "paths_against_svm",
    "radius_table",
    "local_path_table",
    "MatrixPaths",
    "matrix_paths",
]

#: ``"auto"`` picks, per radius, the plain loss while ``(L − L*)/L ≥ switch_gap`` at every start,
#: and ``log(L − L*)`` afterwards.
OBJECTIVES = ("auto", "loss", "log_gap")
#: ``"direct"``: θ itself in the ball ``‖θ‖_F ≤ R``. ``"kq"``: ``W = K Qᵀ`` with ``‖K‖²_F + ‖Q‖²_F ≤ 2R``.
PARAMETRIZATIONS = ("direct", "kq")


@dataclass(frozen=True, eq=False)
class RegularizationPath:
    """The solutions ``θ̄(R)`` at every radius, with what it took to find them.

    Attributes:
        radii: (N,) the radii ``R`` (increasing).
        theta: (N, *shape) the minimisers ``θ̄(R)`` (for ``"kq"``: the product ``K̄ Q̄ᵀ``).
        objective: (N,) which objective the optimizer saw at each radius, ``"loss"`` or ``"log_gap"``.
        loss: (N,) ``L(θ̄(R))``.
        log_gap: (N,) ``log(L − L*)`` at ``θ̄(R)`` (accurate where the gap underflows).
        norm: (N,) the constrained norm at the solution: ``‖θ̄‖_F`` (direct) or
            ``(‖K̄‖²_F + ‖Q̄‖²_F)/2`` (kq); equal to ``R`` when the constraint is active.
        start_objective: (N, S) final objective of each of the ``S = 2·n_starts + 1`` starts (``+ 1``
            with a ``guide``, last): first the branches carried from the previous radius (best
            first), then fresh random points on the sphere (all random at the first radius); ``inf``
            where a start failed.
        start_cosine: (N, S) cosine between each start's final ``θ`` and the best one.
        iterations: (N,) iterations until every start stopped.
        converged: (N,) the best start met the stopping test (not the iteration cap).
        parametrization: ``"direct"`` or ``"kq"``.
        factors: ``None``, or ``(K, Q)`` with shapes (N, d, m) and (N, d_z, m) for ``"kq"``.
    """

    radii: np.ndarray
    theta: np.ndarray
    objective: np.ndarray
    loss: np.ndarray
    log_gap: np.ndarray
    norm: np.ndarray
    start_objective: np.ndarray
    start_cosine: np.ndarray
    iterations: np.ndarray
    converged: np.ndarray
    parametrization: str
    factors: tuple | None = None

    @property
    def direction(self) -> np.ndarray:
        """``θ̄(R)/‖θ̄(R)‖_F``: (N, *shape)."""
        flat = self.theta.reshape(len(self.radii), -1)
        return (flat / np.linalg.norm(flat, axis=1, keepdims=True)).reshape(self.theta.shape)

    @property
    def objective_spread(self) -> np.ndarray:
        """Max minus min of the final objective over the starts, per radius: (N,).

        Zero when every start found the same minimum; large values flag local minima (the
        landscape is non-convex) that multi-start has stepped over.
        """
        return np.max(self.start_objective, axis=1) - np.min(self.start_objective, axis=1)

    @property
    def n_agree(self) -> np.ndarray:
        """Number of starts whose solution is parallel to the best one (cosine > 1 − 1e-6): (N,)."""
        return np.sum(self.start_cosine > 1.0 - 1e-6, axis=1)


# ---------------------------------------------------------------------- objectives and gradients


def log_gap_grad(prob, theta) -> tuple[np.ndarray, np.ndarray]:
    """``log(L − L*)`` and its gradient ``∇L/(L − L*)``, both computed in log space.

    With the scaled gradient ``∇L = e^m g`` of the library, ``∇ log(L − L*) = e^{m − log(L − L*)} g``:
    no quantity below the float range is ever formed.

    Args:
        prob: any :class:`attnlib.AttentionProblem` (a :class:`TokenSelectionProblem`, a
            :class:`NonlinearHeadAttention`, ...).
        theta: (*batch, *shape).

    Returns ``(f (*batch,), grad (*batch, *shape))``: finite and of order one even where
    ``L − L*`` and ``∇L`` underflow (``R·margin`` up to several hundred).

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.single_input()
    >>> f, g = al.log_gap_grad(prob, np.array([-100.0, 1000.0, 0.0]))
    >>> bool(np.exp(f) == 0.0), bool(np.all(np.isfinite(g))), bool(np.linalg.norm(g) > 0.1)
    (True, True, True)
    """
    flat, batch = prob.flatten(theta)
    terms = prob.terms_from_flat(flat)
    f = prob.log_gap_from(terms)
    m, g = prob.scaled_grad_from(terms, batch)
    scale = np.exp(m - f).reshape(np.shape(f) + (1,) * len(prob.shape))
    return f, scale * g


def _loss_grad(prob, theta) -> tuple[np.ndarray, np.ndarray]:
    """``L(θ)`` and ``∇L(θ)`` of an :class:`attnlib.AttentionProblem` at ``theta`` (*batch, *shape)."""
    flat, batch = prob.flatten(theta)
    terms = prob.terms_from_flat(flat)
    f = np.mean(prob.loss.value(terms.output), axis=-1)
    m, g = prob.scaled_grad_from(terms, batch)
    return f, np.exp(m).reshape(np.shape(f) + (1,) * len(prob.shape)) * g


def factor_grad(grad_W, K, Q) -> tuple[np.ndarray, np.ndarray]:
    """Chain rule through ``W = K Qᵀ``: ``∇_K = ∇_W Q`` and ``∇_Q = ∇_Wᵀ K``.

    Args:
        grad_W: (*batch, d, d_z).  K: (*batch, d, m).  Q: (*batch, d_z, m).

    >>> import numpy as np
    >>> gK, gQ = factor_grad(np.ones((2, 3)), np.ones((2, 1)), np.ones((3, 1)))
    >>> gK.ravel().tolist(), gQ.ravel().tolist()
    ([3.0, 3.0], [2.0, 2.0, 2.0])
    """
    grad_W, K, Q = (np.asarray(a, float) for a in (grad_W, K, Q))
    return grad_W @ Q, np.swapaxes(grad_W, -1, -2) @ K


# ---------------------------------------------------------------------- a nonlinear head (reconstructed)


@dataclass(frozen=True, eq=False)
class NonlinearHeadAttention:
    """Prompt attention with a nonlinear head after pooling: ``f(X) = h(Xᵀ σ(K p))`` (RECONSTRUCTED).

    .. math::

        h(x) = u^⊤ \\mathrm{relu}(V x), \\qquad \\bar x_i(p) = \\sum_t σ_{it}(p)\\, x_{it}, \\qquad
        L(p) = \\frac1n \\sum_i ℓ\\big(y_i\\, h(\\bar x_i(p))\\big).

    [MMTS] extends its regularization-path theorem to nonlinear heads; the exact statement could
    not be checked, so this is a reconstruction: the optimal token of sample ``i`` is the one with
    the best single-token score ``γ_it = y_i h(x_it)``, and the path should turn towards
    ``p_mm`` of these tokens (:attr:`token_problem` gives that SVM). The floor
    ``L* = (1/n) Σ_i ℓ(γ_i,opt)`` is the infimum only when no *mixture* of tokens beats the best
    single one; with ``y_i = +1`` and ``u ≥ 0`` the head is convex, which guarantees it
    (``h(x̄) ≤ Σ_t σ_t h(x_t) ≤ h(x_opt)``). The constructor checks that condition.

    Attributes: ``X`` (n, T, d) tokens (the head's inputs), ``keys`` (n, T, k) logit features
    (``K_i = X_i Wᵀ``), ``y`` (n,), ``V`` (h, d), ``u`` (h,), ``loss``. Parameter ``p``: (*batch, k).
    It implements the :class:`attnlib.AttentionProblem` protocol, so :func:`attnlib.train` and
    :func:`log_gap_grad` take it like a :class:`TokenSelectionProblem`.
    """

    X: np.ndarray
    keys: np.ndarray
    y: np.ndarray
    V: np.ndarray
    u: np.ndarray
    loss: Loss

    def __post_init__(self):
        X = np.asarray(self.X, float)
        keys = np.asarray(self.keys, float)
        if X.ndim != 3 or keys.ndim != 3 or keys.shape[:2] != X.shape[:2]:
            raise ValueError(f"X must be (n, T, d) and keys (n, T, k) with the same n, T; got {X.shape}, {keys.shape}")
        V = np.asarray(self.V, float)
        u = np.asarray(self.u, float)
        if V.ndim != 2 or V.shape[1] != X.shape[2] or u.shape != (V.shape[0],):
            raise ValueError(f"V must be (h, {X.shape[2]}) and u (h,), got {V.shape} and {u.shape}")
        y = np.asarray(self.y, float)
        if y.shape != (X.shape[0],) or not np.all(y == 1.0) or np.any(u < 0):
            raise ValueError(
                "this reconstruction needs labels y = +1 and a head u >= 0 (a convex head, so that no "
                "mixture of tokens beats the best single token and L* is the infimum)"
            )
        for name, val in (("X", X), ("keys", keys), ("y", y), ("V", V), ("u", u)):
            object.__setattr__(self, name, val)
        object.__setattr__(self, "loss", get_loss(self.loss))
        gamma = self.head(X) * y[:, None]
        top2 = np.sort(gamma, axis=1)[:, -2:]
        if np.any(top2[:, 1] == top2[:, 0]):
            raise ValueError("the best single token must be unique in every sample")

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.keys.shape[2],)

    @property
    def n(self) -> int:
        return self.X.shape[0]

    def head(self, x) -> np.ndarray:
        """``h(x) = uᵀ relu(V x)`` over the last axis of ``x``."""
        return np.maximum(np.asarray(x, float) @ self.V.T, 0.0) @ self.u

    @cached_property
    def gamma(self) -> np.ndarray:
        """Single-token scores ``γ_it = y_i h(x_it)``: (n, T)."""
        return self.y[:, None] * self.head(self.X)

    @cached_property
    def opt(self) -> np.ndarray:
        """The induced optimal tokens ``argmax_t y_i h(x_it)``: (n,)."""
        return np.argmax(self.gamma, axis=1)

    @cached_property
    def token_problem(self) -> TokenSelectionProblem:
        """Same keys and single-token scores as a fixed-score problem: its ``max_margin`` is ``p_mm(opt)``."""
        return TokenSelectionProblem(self.keys, self.gamma, self.loss)

    @cached_property
    def loss_floor(self) -> float:
        return float(np.mean(self.loss.value(self.gamma[np.arange(self.n), self.opt])))

    @property
    def size(self) -> int:
        return self.shape[0]

    def flatten(self, p) -> tuple[np.ndarray, tuple[int, ...]]:
        """Validate ``p`` (*batch, k): ``(p, batch)`` (the parameter is already a vector)."""
        p = np.asarray(p, float)
        if p.ndim < 1 or p.shape[-1] != self.shape[0]:
            raise ValueError(f"p must have shape (*batch, {self.shape[0]}), got {p.shape}")
        return p, p.shape[:-1]

    def terms(self, p) -> Terms:
        """The per-sample :class:`attnlib.Terms` at ``p`` (*batch, k)."""
        return self.terms_from_flat(self.flatten(p)[0])

    def terms_from_flat(self, p) -> Terms:
        """``log σ`` (*batch, n, T), ``log δ_i`` and the outputs ``u_i`` (*batch, n) at ``p`` (*batch, k)."""
        p, batch = self.flatten(p)
        log_sigma = log_softmax(np.einsum("...k,itk->...it", p, self.keys), axis=-1)
        idx = np.arange(self.n)
        x_opt = self.X[idx, self.opt]  # (n, d)
        # δ_i = x̄_i − x_opt = Σ_{t≠opt} σ_it (x_it − x_opt), carried as exp(M_i) · δ_scaled
        others = np.where(np.arange(self.X.shape[1]) == self.opt[:, None], -np.inf, log_sigma)
        M = np.max(others, axis=-1)  # (*batch, n)
        w = np.exp(others - M[..., None])
        dx = self.X - x_opt[:, None, :]
        delta_s = np.einsum("...it,itd->...id", w, dx)
        a = x_opt @ self.V.T  # (n, h) pre-activations at the optimal token
        b_s = delta_s @ self.V.T  # (*batch, n, h)
        scale = np.exp(M)[..., None]
        # Δ_i = y_i (h(x_opt) − h(x̄_i)) ≥ 0. Where the move cannot flip a unit (saturated), the
        # ReLU is linear and Δ = −e^M y uᵀ(D b_s), exact at any scale; else evaluate directly.
        linear = np.all(scale * np.abs(b_s) < 1e-3 * np.abs(a), axis=-1)  # (*batch, n)
        lin = -(self.y[:, None] * ((a > 0) * b_s)) @ self.u
        with np.errstate(divide="ignore", invalid="ignore"):
            log_lin = M + np.log(lin)
            x_bar = x_opt + scale * delta_s
            direct = self.y * (self.head(x_opt) - self.head(x_bar))
            log_delta = np.where(linear, log_lin, np.log(direct))
        out = self.gamma[idx, self.opt] - np.exp(log_delta)
        return Terms(log_sigma, log_delta, out)

    def value(self, p) -> np.ndarray:
        """``L(p)``: (*batch,)."""
        return np.mean(self.loss.value(self.terms(p).output), axis=-1)

    def log_gap(self, p) -> np.ndarray:
        """``log(L − L*)``, accurate where the gap underflows: (*batch,)."""
        return self.log_gap_from(self.terms(p))

    def log_gap_from(self, terms: Terms) -> np.ndarray:
        """``log(L − L*)`` (*batch,) from the :class:`attnlib.Terms` of a batch."""
        g_opt = self.gamma[np.arange(self.n), self.opt]
        return logsumexp(self.loss.log_excess(g_opt, terms.log_delta), axis=-1, precise=True) - np.log(self.n)

    def scaled_grad(self, p) -> tuple[np.ndarray, np.ndarray]:
        """``∇L = exp(m) g``: ``(m (*batch,), g (*batch, k))``.

        ``∇L = (1/n) Σ_i ℓ'(u_i) y_i Σ_t σ_it ⟨∇h(x̄_i), x_it − x̄_i⟩ k_it``, with
        ``x_it − x̄_i`` measured from the most-attended token (no cancellation at saturation).
        """
        return self.scaled_grad_from(self.terms(p))

    def scaled_grad_from(self, terms: Terms, batch=None) -> tuple[np.ndarray, np.ndarray]:
        """``(m (*batch,), g (*batch, k))`` with ``∇L = exp(m) g`` from the :class:`attnlib.Terms`
        of a batch (``batch``, accepted for the protocol, is read from the terms)."""
        log_sigma, out = terms.log_sigma, terms.output
        batch = log_sigma.shape[:-2]
        ref = np.argmax(log_sigma, axis=-1)  # (*batch, n)
        x_ref = np.take_along_axis(np.broadcast_to(self.X, batch + self.X.shape), ref[..., None, None], axis=-2)
        dx = self.X - x_ref  # (*batch, n, T, d)
        sig = np.exp(log_sigma)
        x_bar_minus_ref = np.einsum("...it,...itd->...id", sig, dx)
        x_bar = x_ref[..., 0, :] + x_bar_minus_ref
        grad_h = ((x_bar @ self.V.T) > 0) * self.u @ self.V  # ∇h(x̄): (*batch, n, d)
        c = (
            np.einsum("...id,...itd->...it", grad_h, dx)
            - np.einsum("...id,...id->...i", grad_h, x_bar_minus_ref)[..., None]
        )
        is_ref = np.arange(self.X.shape[1]) == ref[..., None]
        with np.errstate(divide="ignore"):
            log_abs = np.log(-self.loss.derivative(out))[..., None] + log_sigma + np.log(np.abs(c)) - np.log(self.n)
        log_abs = np.where(is_ref, -np.inf, log_abs)
        m = np.max(log_abs, axis=(-2, -1))
        finite_m = np.where(np.isfinite(m), m, 0.0)
        w = (self.y[:, None] * np.sign(c)) * np.exp(log_abs - finite_m[..., None, None])
        k_ref = np.take_along_axis(np.broadcast_to(self.keys, batch + self.keys.shape), ref[..., None, None], axis=-2)
        g = -np.einsum("...it,...itk->...k", w, self.keys - k_ref)
        return m, g

    def grad(self, p) -> np.ndarray:
        """``∇L(p)``: (*batch, k)."""
        m, g = self.scaled_grad(p)
        return np.exp(m)[..., None] * g


def nonlinear_head(X, V, u, W=None, y=None, loss: str | Loss = "logistic") -> NonlinearHeadAttention:
    """[MMTS] nonlinear-head model ``f(X) = uᵀ relu(V Xᵀ softmax(X Wᵀ p))`` (RECONSTRUCTED).

    Args:
        X: (n, T, d) tokens.  V: (h, d), u: (h,) with ``u ≥ 0``: the head ``h(x) = uᵀ relu(Vx)``.
        W: (k, d) key matrix (identity if None).  y: labels, all +1 (default).

    >>> import numpy as np, attnlib as al
    >>> rng = np.random.default_rng(0)
    >>> model = al.nonlinear_head(rng.normal(size=(3, 3, 6)), rng.normal(size=(8, 6)), rng.uniform(size=8))
    >>> model.shape, model.opt.shape
    ((6,), (3,))
    """
    X = np.asarray(X, float)
    if X.ndim != 3:
        raise ValueError(f"X must be (n, T, d), got shape {X.shape}")
    keys = X if W is None else X @ np.asarray(W, float).T
    y = np.ones(X.shape[0]) if y is None else y
    return NonlinearHeadAttention(X, keys, y, V, u, loss)


# ---------------------------------------------------------------------- the batched ball solver


def _project(x: np.ndarray, rho: float) -> np.ndarray:
    nrm = np.linalg.norm(x, axis=1, keepdims=True)
    return np.where(nrm > rho, x * (rho / np.where(nrm > 0, nrm, 1.0)), x)


def _ball_descent(
    fg: Callable,
    x0: np.ndarray,
    rho: float,
    max_iter: int,
    tol: float,
    project: Callable | None = None,
    indexed: bool = False,
):
    """Minimise ``f`` over ``‖x‖ ≤ rho`` from every row of ``x0`` (B, D) at once.

    Projected gradient with Barzilai–Borwein steps and Armijo backtracking along the projection
    arc. A row stops when its move is below ``tol·rho``, when on the sphere its gradient is
    parallel to ``−x`` up to ``tol`` (scale-free, so it means the same for the loss and the
    log-gap), or when the step has shrunk below float resolution.
    ``project(x, rho)`` replaces the projection on the ball (e.g. ball ∩ cone, see
    :func:`local_regularization_path`). With ``indexed``, ``fg(x, rows)`` also receives the indices
    of the rows of ``x0`` it evaluates (a per-row objective). Returns ``(x, f, iterations, converged)``.
    """
    if project is None:
        project = _project
    x = project(np.array(x0, float), rho)
    f, g = fg(x, np.arange(len(x))) if indexed else fg(x)
    gn = np.linalg.norm(g, axis=1)
    alpha = 0.05 * rho / np.where(gn > 0, gn, 1.0)
    done = ~np.isfinite(f) | (gn == 0)
    converged = gn == 0
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007 (the count is returned)
        act = np.flatnonzero(~done)
        if act.size == 0:
            it -= 1
            break
        xa, fa, ga = x[act], f[act], g[act]
        x_new = project(xa - alpha[act, None] * ga, rho)
        s = x_new - xa
        f_new, g_new = fg(x_new, act) if indexed else fg(x_new)
        ok = np.isfinite(f_new) & (f_new <= fa + 1e-4 * np.sum(ga * s, axis=1))
        # rejected rows: shrink the step; give up when it no longer moves x in floating point
        rej = act[~ok]
        alpha[rej] *= 0.25
        stuck = ~ok & (alpha[act] * np.linalg.norm(ga, axis=1) <= 1e-15 * rho)
        done[act[stuck]] = True
        # accepted rows: move, Barzilai–Borwein step for the next iteration
        acc = act[ok]
        if acc.size:
            s_ok, y_ok = s[ok], g_new[ok] - ga[ok]
            sy, ss = np.sum(s_ok * y_ok, axis=1), np.sum(s_ok * s_ok, axis=1)
            alpha[acc] = np.where(sy > 0, ss / np.where(sy > 0, sy, 1.0), 4.0 * alpha[acc])
            alpha[acc] = np.minimum(alpha[acc], 1e3 * rho / np.maximum(np.linalg.norm(g_new[ok], axis=1), 1e-300))
            x[acc], f[acc], g[acc] = x_new[ok], f_new[ok], g_new[ok]
            xn = np.linalg.norm(x[acc], axis=1)
            gn = np.linalg.norm(g[acc], axis=1)
            radial = np.sum(g[acc] * x[acc], axis=1) / np.maximum(xn, 1e-300)
            tangent = np.sqrt(np.maximum(gn**2 - radial**2, 0.0))
            on_sphere = (xn >= rho * (1 - 1e-12)) & (radial < 0)
            small_move = np.sqrt(ss) <= tol * rho
            stationary = (on_sphere & (tangent <= tol * gn)) | (gn == 0)
            finished = small_move | stationary
            done[acc[finished]] = True
            converged[acc[finished]] = True
    return x, f, it, converged


# ---------------------------------------------------------------------- the path


def check_radii(radii) -> np.ndarray:
    """``radii`` as a non-empty, positive, finite, strictly increasing (N,) float array, or a ValueError.

    Every path solver warm-starts each radius from the previous one, so the radii must increase.
    """
    r = np.asarray(radii, dtype=float)
    if r.ndim != 1 or r.size == 0:
        raise ValueError(f"radii must be a non-empty 1-D sequence of radii, got shape {r.shape}")
    if not np.all(np.isfinite(r)) or np.any(r <= 0):
        raise ValueError(f"radii must be positive and finite, got {r.tolist()}")
    if np.any(np.diff(r) <= 0):
        raise ValueError(f"radii must be strictly increasing (each radius warm-starts the next), got {r.tolist()}")
    return r


_check_radii = check_radii  # the name used before check_radii was public


def _check_count(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        kind = "non-negative" if minimum == 0 else "positive"
        raise ValueError(f"{name} must be a {kind} integer, got {value!r}")


class _DirectCoordinates:
    """The path's search space is θ itself: ``x = vec θ`` (dim = size), constrained ``‖x‖ ≤ R``."""

    def __init__(self, shape: tuple[int, ...]):
        self.shape = tuple(shape)
        self.dim = int(np.prod(self.shape))

    def to_theta(self, x: np.ndarray) -> np.ndarray:
        """(B, dim) coordinates to (B, *shape) parameters."""
        return x.reshape((-1,) + self.shape)

    def from_theta(self, theta: np.ndarray, R: float) -> np.ndarray:
        """A parameter rescaled onto the sphere of radius ``R``, as coordinates (dim,)."""
        return theta.ravel() * (R / np.linalg.norm(theta))

    def chain(self, x: np.ndarray, grad_theta: np.ndarray) -> np.ndarray:
        """The gradient in θ (B, *shape) as a gradient in the coordinates (B, dim)."""
        return grad_theta.reshape(len(x), -1)

    def radius(self, R: float) -> float:
        """The radius of the coordinates' ball for the path radius ``R``."""
        return R

    def constrained_norm(self, x: np.ndarray) -> np.ndarray:
        """The constrained norm ``‖θ‖_F`` of coordinates (B, dim): (B,)."""
        return np.linalg.norm(x, axis=1)

    def factors(self, x: np.ndarray):
        return None


class _FactorCoordinates:
    """The path's search space is ``(K, Q)`` with ``W = K Qᵀ``, constrained ``‖K‖² + ‖Q‖² ≤ 2R``.

    Coordinates ``x = (vec K, vec Q)`` (dim = (d + d_z)·m), ``K`` (d, m), ``Q`` (d_z, m).
    """

    def __init__(self, shape: tuple[int, ...], width):
        if len(shape) != 2:
            raise ValueError(f"parametrization='kq' needs a matrix parameter W, got parameter shape {shape}")
        d, dz = shape
        m = min(d, dz) if width is None else width
        if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
            raise ValueError(f"width must be a positive integer, got {width!r}")
        self.shape, self.d, self.dz, self.m = tuple(shape), d, dz, m
        self.dim = (d + dz) * m

    def unpack(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Coordinates (B, dim) to ``K`` (B, d, m) and ``Q`` (B, d_z, m)."""
        nK = self.d * self.m
        return x[:, :nK].reshape(-1, self.d, self.m), x[:, nK:].reshape(-1, self.dz, self.m)

    def to_theta(self, x: np.ndarray) -> np.ndarray:
        K, Q = self.unpack(x)
        return K @ np.swapaxes(Q, 1, 2)

    def from_theta(self, theta: np.ndarray, R: float) -> np.ndarray:
        """``θ`` rescaled to nuclear norm ``R`` and factorised ``K = U√s``, ``Q = V√s`` (SVD)."""
        U, sv, Vt = np.linalg.svd(theta * (R / np.sum(np.linalg.svd(theta, compute_uv=False))))
        root = np.sqrt(sv[: self.m])
        return np.concatenate([(U[:, : self.m] * root).ravel(), (Vt[: self.m].T * root).ravel()])

    def chain(self, x: np.ndarray, grad_theta: np.ndarray) -> np.ndarray:
        K, Q = self.unpack(x)
        gK, gQ = factor_grad(grad_theta, K, Q)
        return np.concatenate([gK.reshape(len(x), -1), gQ.reshape(len(x), -1)], axis=1)

    def radius(self, R: float) -> float:
        return np.sqrt(2.0 * R)

    def constrained_norm(self, x: np.ndarray) -> np.ndarray:
        """``(‖K‖² + ‖Q‖²)/2`` (≥ ‖K Qᵀ‖_*): (B,)."""
        return 0.5 * np.sum(x**2, axis=1)

    def factors(self, x: np.ndarray):
        return self.unpack(x)


def _path_coordinates(shape, parametrization: str, width):
    if parametrization == "kq":
        return _FactorCoordinates(shape, width)
    if width is not None:
        raise ValueError("width is only used with parametrization='kq'")
    return _DirectCoordinates(shape)


def _objective_and_grad(prob, coords, kind: str) -> Callable:
    """``fg(x) = (f (B,), ∇f (B, dim))`` of the loss (``kind="loss"``) or of ``log(L − L*)`` in ``coords``."""
    inner = _loss_grad if kind == "loss" else log_gap_grad

    def fg(x):
        f, grad_theta = inner(prob, coords.to_theta(x))
        return f, coords.chain(x, grad_theta)

    return fg


def _auto_objective(prob, theta0, objective: str, switch_gap: float) -> str:
    """``"loss"`` while ``(L − L*)/L ≥ switch_gap`` at every start ``theta0``, then ``"log_gap"``."""
    if objective != "auto":
        return objective
    value = prob.value(theta0)  # the most saturated start decides (the plain loss cannot rank it)
    rel = np.min(np.exp(prob.log_gap(theta0)) / np.where(value > 0, value, np.inf))
    return "loss" if rel >= switch_gap else "log_gap"


def _rescaled_branches(starts: np.ndarray, branches, rho: float) -> np.ndarray:
    """``starts`` (S, dim) with its first rows replaced by ``branches`` rescaled to norm ``rho``."""
    if branches is not None:
        starts[: len(branches)] = branches * (rho / np.maximum(np.linalg.norm(branches, axis=1, keepdims=True), 1e-300))
    return starts


class _PathRecord:
    """Per-radius records of a path solved from S starts at each of N radii."""

    def __init__(self, N: int, S: int, dim: int):
        self.x = np.empty((N, dim))
        self.kinds = np.empty(N, dtype=object)
        self.start_objective = np.empty((N, S))
        self.start_cosine = np.empty((N, S))
        self.iterations = np.empty(N, dtype=int)
        self.converged = np.empty(N, dtype=bool)

    def add(self, j: int, x, f, iterations: int, converged, unit, order, kind: str, keep: int) -> np.ndarray:
        """Record radius ``j`` (the winner ``order[0]``) and return the branches for the next radius:
        the ``keep`` best starts (in ``order``) with distinct directions ``unit`` (S, ·), finite ``f``."""
        best = int(order[0])
        self.start_cosine[j] = unit @ unit[best]
        self.x[j], self.kinds[j], self.start_objective[j] = x[best], kind, f
        self.iterations[j], self.converged[j] = iterations, converged[best]
        # carry the best distinct solutions forward: a branch that is second best now may win later
        picked: list[int] = []
        for b in order:
            if np.isfinite(f[b]) and all(unit[b] @ unit[c] < 1 - 1e-9 for c in picked):
                picked.append(int(b))
            if len(picked) == keep:
                break
        return x[picked]


def _unit_rows(v: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return v / np.linalg.norm(v, axis=1, keepdims=True)


def regularization_path(
    prob: TokenSelectionProblem,
    radii,
    n_starts: int = 8,
    seed=0,
    parametrization: str = "direct",
    width: int | None = None,
    objective: str = "auto",
    switch_gap: float = 1e-4,
    max_iter: int = 3000,
    tol: float = 1e-8,
    guide=None,
) -> RegularizationPath:
    """Regularization path ``θ̄(R) = argmin_{‖θ‖ ≤ R} L(θ)`` over ``radii`` ([MMTS], [TFSVM]).

    .. math::

        \\bar θ(R) = \\arg\\min_{‖θ‖_F ≤ R} L(θ) \\;\\text{(direct)}, \\qquad
        \\bar W(R) = \\bar K \\bar Q^⊤,\\; (\\bar K, \\bar Q) = \\arg\\min_{‖K‖_F^2 + ‖Q‖_F^2 ≤ 2R} L(K Q^⊤)
        \\;\\text{(kq)}.

    [MMTS] (regularization-path theorem, paraphrase): ``θ̄(R)/R → θ_mm*/‖θ_mm*‖`` for the prompt,
    without any condition on the non-optimal scores; [TFSVM]: the same for ``W`` with the
    Frobenius W-SVM, and ``K̄Q̄ᵀ/R → W*_mm/‖W*_mm‖_*`` (nuclear-norm SVM) for ``(K, Q)``.

    Each radius is solved as one batch from ``n_starts`` fresh random points on the sphere plus the
    ``n_starts + 1`` best distinct solutions of the previous radius, scaled ("branches": the
    landscape has local minima near locally-optimal selections, and the global one can overtake a
    branch that was best at a smaller radius). The start with the lowest objective wins.

    Args:
        prob: a :class:`TokenSelectionProblem` (features ``A`` (n, T, *shape)), or a
            :class:`NonlinearHeadAttention` (direct parametrization only).
        radii: (N,) positive, strictly increasing radii ``R``.
        n_starts: fresh random starts per radius (``>= 0``; ``2·n_starts + 1`` random starts at the
            first radius).
        seed: an int or a ``numpy.random.Generator`` for the random starts.
        parametrization: ``"direct"`` or ``"kq"`` (matrix parameters only; ``W = K Qᵀ``).
        width: inner dimension ``m`` of ``K`` (d, m) and ``Q`` (d_z, m); default ``min(d, d_z)``.
        objective: ``"auto"``, ``"loss"`` (the plain ``L``) or ``"log_gap"`` (``log(L − L*)``).
            Both have the same minimisers; ``"auto"`` uses ``L`` while the relative gap
            ``(L − L*)/L`` is at least ``switch_gap`` at every start, then ``log(L − L*)``.
        max_iter: iteration cap per radius.  tol: stopping tolerance (relative move, and tangential
            part of the gradient relative to its norm).
        guide: ``None``, or (N, *shape) parameters ``θ`` (e.g. another path's solutions) added as one
            more start at each radius, rescaled onto the sphere; for ``"kq"`` it is factorised as
            ``K = U√s``, ``Q = V√s`` (SVD ``θ = U diag(s) Vᵀ``), so ``‖KQᵀ‖_* = R``. Random starts at
            a large radius land where the softmax is saturated on arbitrary tokens, so the
            factorised landscape needs such a start to track the global branch; it is only a start
            (the lowest objective still wins).

    Returns:
        :class:`RegularizationPath` with ``theta`` (N, *shape).

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.single_input(local=True)
    >>> path = al.regularization_path(prob, [1.0, 10.0, 100.0], n_starts=4)
    >>> bool(np.allclose(path.norm, path.radii)), path.objective.tolist()
    (True, ['loss', 'log_gap', 'log_gap'])
    >>> err = al.one_minus_cosine(path.theta, al.max_margin(prob).theta)
    >>> bool(np.all(np.diff(err) < 0) and err[-1] < 1e-4)
    True
    """
    if not isinstance(prob, (TokenSelectionProblem, NonlinearHeadAttention)):
        raise ValueError(f"prob must be a TokenSelectionProblem or NonlinearHeadAttention, got {type(prob).__name__}")
    r = check_radii(radii)
    _check_count("n_starts", n_starts, 0)
    if parametrization not in PARAMETRIZATIONS:
        raise ValueError(f"parametrization must be one of {list(PARAMETRIZATIONS)}, got {parametrization!r}")
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {list(OBJECTIVES)}, got {objective!r}")
    if not (np.isfinite(switch_gap) and 0 < switch_gap < 1):
        raise ValueError(f"switch_gap must be in (0, 1), got {switch_gap!r}")
    _check_count("max_iter", max_iter, 1)
    if not (np.isfinite(tol) and 0 < tol < 1):
        raise ValueError(f"tol must be in (0, 1), got {tol!r}")
    if guide is not None:
        guide = np.asarray(guide, float)
        if guide.shape != (len(r),) + tuple(prob.shape) or not np.all(np.isfinite(guide)):
            raise ValueError(f"guide must be finite with shape {(len(r),) + tuple(prob.shape)}, got {guide.shape}")
    rng = np.random.default_rng(seed)
    coords = _path_coordinates(prob.shape, parametrization, width)
    keep = n_starts + 1  # branches carried from one radius to the next
    S = 2 * n_starts + 1 + (guide is not None)  # the branches, n_starts fresh random points, the guide
    record = _PathRecord(len(r), S, coords.dim)
    branches = None
    for j, R in enumerate(r):
        rho = coords.radius(R)
        starts = rng.standard_normal((S, coords.dim))
        starts *= rho / np.linalg.norm(starts, axis=1, keepdims=True)
        if guide is not None:
            starts[-1] = coords.from_theta(guide[j], R)
        starts = _rescaled_branches(starts, branches, rho)
        kind = _auto_objective(prob, coords.to_theta(starts), objective, switch_gap)
        x, f, it, ok = _ball_descent(_objective_and_grad(prob, coords, kind), starts, rho, max_iter, tol)
        f = np.where(np.isfinite(f), f, np.inf)
        order = np.argsort(f, kind="stable")
        unit = _unit_rows(coords.to_theta(x).reshape(S, -1))
        branches = record.add(j, x, f, it, ok, unit, order, kind, keep)
    theta = coords.to_theta(record.x)
    return RegularizationPath(
        radii=r,
        theta=theta,
        objective=record.kinds.astype(str),
        loss=prob.value(theta),
        log_gap=prob.log_gap(theta),
        norm=coords.constrained_norm(record.x),
        start_objective=record.start_objective,
        start_cosine=record.start_cosine,
        iterations=record.iterations,
        converged=record.converged,
        parametrization=parametrization,
        factors=coords.factors(record.x),
    )


# ---------------------------------------------------------------------- the comparison with the SVM ray

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
    >>> lo = al.ray_margin_bound(prob, al.max_margin(prob).theta, [10.0, 100.0, 1000.0])
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


def direction_bound(rho) -> np.ndarray:
    """``1 − cos(θ, θ_mm) ≤ 1/ρ² − 1`` for the Frobenius (Euclidean) SVM, given the margin ratio ``ρ > 0``.

    ``q = θ/m(θ)`` is SVM-feasible with ``‖q‖ = ‖θ_mm‖/ρ``; ``θ_mm`` is the projection of 0 on the
    feasible set, so ``‖q − θ_mm‖² ≤ ‖q‖² − ‖θ_mm‖²`` and ``1 − cos ≤ sin² ≤ ‖q − θ_mm‖²/‖θ_mm‖²``.
    ``inf`` where ``ρ ≤ 0``. Not valid for the nuclear norm (not strongly convex).

    >>> float(direction_bound(0.5))
    3.0
    """
    rho = np.asarray(rho, float)
    with np.errstate(divide="ignore"):
        return np.where(rho > 0, 1.0 / np.where(rho > 0, rho, 1.0) ** 2 - 1.0, np.inf)


def ray_gap_excess(prob, path: RegularizationPath, theta_mm, norm: str = "fro") -> np.ndarray:
    """How far the path's solutions beat the SVM ray: ``log(L(θ_R) − L*) − log(L(θ̄(R)) − L*)``, (N,).

    ``θ_R = R θ_mm/‖θ_mm‖`` (``norm``: ``"fro"`` for a direct path, ``"nuc"`` for a ``"kq"`` path,
    whose ball is ``‖W‖_* ≤ R``) lies in the ball, so the true minimiser has a value ``≥ 0``; a negative
    value means the search stopped at a worse point, and :func:`ray_margin_bound` does not apply to it.

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.single_input(local=True)
    >>> sol = al.max_margin(prob)
    >>> path = al.regularization_path(prob, [10.0, 100.0], n_starts=2)
    >>> bool(np.all(al.ray_gap_excess(prob, path, sol.theta) >= 0))
    True
    """
    theta_mm = np.asarray(theta_mm, float)
    unit = theta_mm / float(parameter_norm(theta_mm, norm, theta_mm.ndim))
    ray = path.radii.reshape((-1,) + (1,) * theta_mm.ndim) * unit
    return prob.log_gap(ray) - path.log_gap


# ---------------------------------------------------------------------- the local path: ball ∩ cone


def cone_project(x, direction, mu: float, rho: float | None = None) -> np.ndarray:
    """Euclidean projection on the cone ``{p : 1 − cos(p, u) ≤ μ}`` (then on the ball ``‖p‖ ≤ ρ``).

    The cone is the second-order cone of half-angle ``β = arccos(1 − μ)`` around ``u``. Writing
    ``x = a û + w`` (``w ⊥ û``): ``x`` is kept if ``‖w‖ ≤ a tan β``, sent to 0 if it lies in the polar
    cone (``‖w‖ tan β ≤ −a``), otherwise to ``⟨x, e⟩ e`` with ``e = cos β û + sin β ŵ`` (the nearest
    boundary ray). For a closed convex cone, projecting on cone ∩ ball is the cone projection
    followed by the radial scaling onto the ball.

    Args:
        x: (B, D).  direction: (D,) the axis ``u``.  mu: in (0, 2].  rho: the ball's radius, or None.

    Returns (B, D).

    >>> import numpy as np
    >>> x = np.array([[0.0, 1.0], [1.0, 0.1], [-1.0, 0.0]])
    >>> cone_project(x, np.array([1.0, 0.0]), 1 - np.cos(0.1)).round(3).tolist()
    [[0.099, 0.01], [1.0, 0.1], [0.0, 0.0]]
    """
    x = np.array(x, float, ndmin=2)
    u = np.asarray(direction, float).ravel()
    u = u / np.linalg.norm(u)
    if not (0 < mu <= 2):
        raise ValueError(f"mu must be in (0, 2], got {mu!r}")
    beta = np.arccos(1.0 - mu)
    a = x @ u
    w = x - a[:, None] * u
    r = np.linalg.norm(w, axis=1)
    if beta >= np.pi:  # μ = 2: the whole space
        out = x
    else:
        inside = r <= a * np.tan(beta) if beta < np.pi / 2 else (r * np.tan(np.pi - beta) <= -a) | (a >= 0)
        polar = (r * np.tan(beta) <= -a) if beta < np.pi / 2 else np.zeros(len(x), bool)
        w_hat = np.where(r[:, None] > 0, w / np.where(r > 0, r, 1.0)[:, None], 0.0)
        e = np.cos(beta) * u + np.sin(beta) * w_hat
        on_edge = np.sum(x * e, axis=1, keepdims=True) * e
        out = np.where(inside[:, None], x, np.where(polar[:, None], 0.0, on_edge))
    return out if rho is None else _project(out, rho)


def selection_log_gap(prob: TokenSelectionProblem, select, theta, with_grad: bool = False):
    """Signed excess over the floor of a selection: ``L(θ) − L_α``, ``L_α = (1/n) Σ_i ℓ(γ_iα_i)``.

    With ``δ_i = Σ_t σ_it (γ_iα_i − γ_it)`` (tokens scoring *above* ``α_i`` make it negative),
    ``L − L_α = (1/n) Σ_i [ℓ(γ_iα − δ_i) − ℓ(γ_iα)]``: every term is formed in log space with its
    sign (``≈ |ℓ'(γ_iα)| δ_i`` where ``|δ_i| < 1e-8``), so the value is accurate where it is far below
    the float resolution of ``L``. Near ``θ_mm(α)`` of a locally-optimal ``α`` at a large norm it is
    positive (its neighbours score lower); it is the local analogue of ``L − L*``.

    Args:
        prob: :class:`TokenSelectionProblem` (vector or matrix parameter).  select: (n,) the selection ``α``.
        theta: (*batch, *shape).  with_grad: also return ``∇ log(L − L_α) = ∇L/(L − L_α)``.

    Returns ``(log|L − L_α|, sign)`` each (*batch,), and, when ``with_grad``, ``∇L/|L − L_α|``
    (*batch, *shape): the gradient of ``log(L − L_α)`` where the excess is positive and of
    ``−log(L_α − L)`` where it is negative (zero where it is 0).

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.single_input(local=True)
    >>> lg, sign = selection_log_gap(prob, [1], np.array([[1000.0, 0.0, 0.0], [1.0, 5.0, 0.0]]))
    >>> bool(-1100 < lg[0] < -900), sign.tolist()
    (True, [1.0, -1.0])
    """
    sel = np.asarray(select, int)
    n = prob.n
    gamma = np.asarray(prob.gamma, float)
    g_sel = gamma[np.arange(n), sel]
    diff = g_sel[:, None] - gamma  # (n, T) signed, 0 at α
    log_sigma = prob.log_attention(theta)
    with np.errstate(divide="ignore"):
        log_abs = log_sigma + np.log(np.abs(diff))
    b = np.where(diff == 0, 1.0, np.sign(diff))
    log_delta, s_delta = logsumexp(np.where(diff == 0, -np.inf, log_abs), axis=-1, b=b, return_sign=True)
    slope = -prob.loss.derivative(g_sel)  # |ℓ'(γ_α)|
    delta = s_delta * np.exp(log_delta)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        exact = prob.loss.excess(g_sel, np.where(np.abs(delta) < 1e-8, 0.0, delta))
        log_e = np.where(np.abs(delta) < 1e-8, np.log(slope) + log_delta, np.log(np.abs(exact)))
        s_e = np.where(np.abs(delta) < 1e-8, s_delta, np.sign(exact))
    lg, sign = logsumexp(log_e, axis=-1, b=np.where(s_e == 0, 1.0, s_e) * (s_e != 0), return_sign=True)
    lg = lg - np.log(n)
    if not with_grad:
        return lg, sign
    flat, batch = prob.flatten(theta)
    m, g = prob.scaled_grad_from(prob.terms_from_flat(flat))
    pos = sign != 0
    scale = np.where(pos, np.exp(np.where(pos, m - lg, 0.0)), 0.0)
    grad = (scale[..., None] * g).reshape(tuple(batch) + prob.shape)
    return lg, sign, grad


def _ball_cone_projection(u: np.ndarray, mu: float, min_norm: float) -> Callable:
    """``project(x, rho)``: onto the ball ∩ cone (:func:`cone_project`), then radially onto ``‖θ‖ ≥ min_norm``."""

    def project(x, rho):
        x = cone_project(x, u, mu, rho)
        if min_norm > 0:  # radial push onto ‖θ‖ ≥ R0 (0 goes to the axis)
            nx = np.linalg.norm(x, axis=1, keepdims=True)
            x = np.where(nx >= min_norm, x, np.where(nx > 0, x * (min_norm / np.where(nx > 0, nx, 1.0)), min_norm * u))
        return x

    return project


def _random_cone_starts(rng, u: np.ndarray, mu: float, count: int, rho: float) -> np.ndarray:
    """``count`` random points of norm ``rho`` in the cone ``1 − cos(θ, u) ≤ μ`` (unit axis ``u``): (count, dim)."""
    beta = np.arccos(1.0 - mu)
    z = rng.standard_normal((count, u.size))
    z -= (z @ u)[:, None] * u
    z /= np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-300)
    ang = beta * rng.uniform(0.0, 1.0, size=(count, 1)) if beta < np.pi else np.pi * rng.uniform(size=(count, 1))
    return rho * (np.cos(ang) * u + np.sin(ang) * z)


def _signed_selection_objective(prob, sel, mode: np.ndarray) -> Callable:
    """Per-start objective ``fg(x, rows)``: ``log(L − L_α)`` where ``mode = +1``, ``−log(L_α − L)``
    where ``mode = −1`` (both increase with L); ``inf`` once a start's excess changes sign."""

    def fg(x, rows):
        lg, sign, g = selection_log_gap(prob, sel, x.reshape((-1,) + prob.shape), with_grad=True)
        return np.where(sign == mode[rows], mode[rows] * lg, np.inf), g.reshape(len(x), -1)

    return fg


def local_regularization_path(
    prob: TokenSelectionProblem,
    select,
    radii,
    mu: float,
    min_norm: float = 0.0,
    direction=None,
    n_starts: int = 4,
    seed=0,
    switch_gap: float = 1e-4,
    max_iter: int = 3000,
    tol: float = 1e-9,
) -> RegularizationPath:
    """Local regularization path: ``θ̄_α(R) = argmin L(θ)`` over ``R_0 ≤ ‖θ‖ ≤ R`` in the cone of ``θ_mm(α)``.

    The cone is ``1 − cos(θ, θ_mm(α)) ≤ μ``.

    The inner radius ``R_0`` (``min_norm``, see :func:`cone_min_norm`) keeps the search away from the
    cone's apex, where a mixture of tokens can beat selecting ``α`` (a poor local selection has
    ``L(0) < L_α``); the local theorems of [MMTS] and [TFSVM] also start their cones at a norm ``R_0``.

    [MMTS] (local regularization-path result, paraphrase): for a locally-optimal ``α`` and a small
    enough cone, ``θ̄_α(R)/R → θ_mm(α)/‖θ_mm(α)‖``. For an ``α`` that is not locally optimal the
    loss keeps pulling the minimiser towards higher-scoring SVM-neighbours: it sits on the cone's
    boundary.

    Solved like :func:`regularization_path` (batched projected descent, Barzilai–Borwein steps,
    Armijo test), with the projection on ball ∩ cone (:func:`cone_project`), starts drawn inside
    the cone (plus the previous radius's best solutions), and the objective ``L`` while the relative
    excess ``|L − L_α|/L`` is at least ``switch_gap`` at every start, then, per start,
    ``log(L − L_α)`` (a start above ``L_α``) or ``−log(L_α − L)`` (a start below: near an ``α`` whose
    neighbours score higher), see :func:`selection_log_gap`. Both increase with ``L`` (same
    minimisers in their region; a step that changes the sign is rejected) and stay well scaled
    when ``L − L_α`` is below the float resolution of ``L``; a start below ``L_α`` beats every start
    above it.

    Args:
        prob: :class:`TokenSelectionProblem`.  select: (n,) the selection ``α``.
        radii: (N,) increasing, above ``min_norm``.  mu: cone width in ``(0, 2]`` (2: no cone).
        min_norm: the inner radius ``R_0 ≥ 0``.
        direction: the cone's axis (default ``θ_mm(α)`` from :func:`attnlib.max_margin`).
        n_starts: random starts in the cone per radius (``2·n_starts + 1`` at the first radius).

    Returns :class:`RegularizationPath`; its ``log_gap`` is ``log(L − L_α)`` (NaN where the excess is
    not positive) and ``objective`` says which objective each radius used (``"loss"``, ``"log_gap"``,
    ``"neg_log_gap"``, or ``"mixed_log_gap"`` when the starts lie on both sides of ``L_α``).

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.single_input(local=True)
    >>> path = local_regularization_path(prob, [1], [5.0, 50.0, 500.0], mu=0.001)
    >>> err = al.one_minus_cosine(path.theta, [1.0, 0.0, 0.0])
    >>> bool(err[-1] < 1e-6 and np.allclose(path.norm, path.radii))
    True
    """
    from .svm import max_margin

    if not isinstance(prob, TokenSelectionProblem):
        raise ValueError(f"prob must be a TokenSelectionProblem, got {type(prob).__name__}")
    r = check_radii(radii)
    sel = np.asarray(select)
    if sel.shape != (prob.n,) or not np.issubdtype(sel.dtype, np.integer) or np.any((sel < 0) | (sel >= prob.T)):
        raise ValueError(f"select must be {prob.n} token indices in [0, {prob.T - 1}], got {select!r}")
    if not (np.isfinite(mu) and 0 < mu <= 2):
        raise ValueError(f"mu must be in (0, 2], got {mu!r}")
    if not (np.isfinite(min_norm) and 0 <= min_norm < r[0]):
        raise ValueError(f"min_norm must be in [0, radii[0]), got {min_norm!r}")
    _check_count("n_starts", n_starts, 0)
    u = (max_margin(prob, sel).theta if direction is None else np.asarray(direction, float)).ravel()
    u = u / np.linalg.norm(u)
    rng = np.random.default_rng(seed)
    coords = _DirectCoordinates(prob.shape)
    project = _ball_cone_projection(u, mu, min_norm)
    keep = n_starts + 1
    S = 2 * n_starts + 1
    record = _PathRecord(len(r), S, coords.dim)
    branches = None
    for j, R in enumerate(r):
        starts = _rescaled_branches(_random_cone_starts(rng, u, mu, S, R), branches, R)
        th0 = coords.to_theta(starts)
        lg, sign = selection_log_gap(prob, sel, th0)
        rel = np.exp(lg) / prob.value(th0)
        mode = np.where(sign < 0, -1.0, 1.0)  # each start keeps the sign of its excess
        if np.min(rel) >= switch_gap:
            kind = "loss"
        else:
            kind = "log_gap" if np.all(mode > 0) else ("neg_log_gap" if np.all(mode < 0) else "mixed_log_gap")
        if kind == "loss":
            fg = _objective_and_grad(prob, coords, "loss")
            x, f, it, ok = _ball_descent(fg, starts, R, max_iter, tol, project)
            mode = np.zeros(S)
        else:
            fg = _signed_selection_objective(prob, sel, mode)
            x, f, it, ok = _ball_descent(fg, starts, R, max_iter, tol, project, indexed=True)
        f = np.where(np.isfinite(f), f, np.inf)
        order = np.lexsort((f, mode))  # a start below L_α beats every start above it
        branches = record.add(j, x, f, it, ok, _unit_rows(x), order, kind, keep)
    theta = coords.to_theta(record.x)
    lg, sign = selection_log_gap(prob, sel, theta)
    return RegularizationPath(
        radii=r,
        theta=theta,
        objective=record.kinds.astype(str),
        loss=prob.value(theta),
        log_gap=np.where(sign > 0, lg, np.nan),
        norm=coords.constrained_norm(record.x),
        start_objective=record.start_objective,
        start_cosine=record.start_cosine,
        iterations=record.iterations,
        converged=record.converged,
        parametrization="direct",
    )


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
    g_sel = prob.gamma[np.arange(prob.n), sel][:, None]
    lo_ok = bool(np.all(~solution.neighbors | (g_sel > prob.gamma)))
    all_higher = bool(np.all(~solution.neighbors | (prob.gamma > g_sel)))
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


# ---------------------------------------------------------------------- many paths at once, against their SVM rays


def regularization_paths(
    problems,
    radii,
    n_starts: int = 8,
    seeds=None,
    objective: str = "auto",
    switch_gap: float = 1e-4,
    max_iter: int = 3000,
    tol: float = 1e-8,
) -> list[RegularizationPath]:
    """:func:`regularization_path` (direct parametrization) for several problems, solved as one batch.

    Every problem gets exactly the starts, objective and stopping rule that
    ``regularization_path(problems[k], radii, n_starts, seeds[k], ...)`` would give it, and
    :func:`_ball_descent` treats its rows independently, so the paths are those of the separate
    calls up to rounding, which the stopping test can turn into differences of order ``tol·R``; only
    ``iterations`` counts the steps until every start *of every problem* stopped. The batch is
    cheaper than the separate calls where the per-step Python overhead dominates, as for the prompt
    ``p`` in the key plane (about half the time for six problems).

    Args:
        problems: a non-empty sequence of :class:`TokenSelectionProblem` sharing ``n``, ``T``, the
            parameter shape and the loss (as :func:`attnlib.stack_problems`).
        radii: (N,) positive, strictly increasing.
        seeds: one int or ``numpy.random.Generator`` per problem (default ``0, 1, ...``).
        n_starts, objective, switch_gap, max_iter, tol: as :func:`regularization_path`.

    Returns one :class:`RegularizationPath` per problem.

    >>> import numpy as np, attnlib as al
    >>> probs = [al.datasets.multi_input(s, nonopt_scores=0.5) for s in (1, 2)]
    >>> both = al.regularization_paths(probs, [1.0, 10.0], n_starts=2, seeds=[1, 2])
    >>> alone = al.regularization_path(probs[1], [1.0, 10.0], n_starts=2, seed=2)
    >>> bool(np.allclose(both[1].theta, alone.theta, rtol=0, atol=1e-6))
    True
    """
    from .model import stack_problems

    problems = list(problems)
    stack = stack_problems(problems)
    P = stack.S
    seeds = list(range(P)) if seeds is None else list(seeds)
    if len(seeds) != P:
        raise ValueError(f"seeds must hold one seed per problem ({P}), got {len(seeds)}")
    r = _check_radii(radii)
    if isinstance(n_starts, bool) or not isinstance(n_starts, (int, np.integer)) or n_starts < 0:
        raise ValueError(f"n_starts must be a non-negative integer, got {n_starts!r}")
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {list(OBJECTIVES)}, got {objective!r}")
    if not (np.isfinite(switch_gap) and 0 < switch_gap < 1):
        raise ValueError(f"switch_gap must be in (0, 1), got {switch_gap!r}")
    if isinstance(max_iter, bool) or not isinstance(max_iter, (int, np.integer)) or max_iter < 1:
        raise ValueError(f"max_iter must be a positive integer, got {max_iter!r}")
    if not (np.isfinite(tol) and 0 < tol < 1):
        raise ValueError(f"tol must be in (0, 1), got {tol!r}")
    rngs = [np.random.default_rng(s) for s in seeds]
    shape, dim = stack.shape, stack.size
    N, keep, S = len(r), n_starts + 1, 2 * n_starts + 1
    use_log = np.zeros(P, dtype=bool)  # per problem, at the current radius

    def fg(x, rows):  # rows of the batch ordered (start, problem); _ball_descent passes the active ones
        full = np.zeros((S * P, dim))
        full[rows] = x
        terms = stack.terms(full.reshape((S, P) + shape))
        m, g = stack.scaled_grad_from(terms)  # (S, P), (S, P, dim)
        f_log = stack.log_gap_from(terms)
        f_loss = np.mean(stack.loss.value(terms.output), axis=-1)
        f = np.where(use_log, f_log, f_loss)
        with np.errstate(over="ignore"):
            scale = np.exp(np.where(use_log, m - f_log, m))
        return f.reshape(-1)[rows], (scale[..., None] * g).reshape(S * P, dim)[rows]

    xs = np.empty((P, N, dim))
    kinds = np.empty((P, N), dtype=object)
    start_obj, start_cos = np.empty((P, N, S)), np.empty((P, N, S))
    iters, conv = np.empty((P, N), dtype=int), np.empty((P, N), dtype=bool)
    branches = [None] * P
    for j, R in enumerate(r):
        starts = np.empty((S, P, dim))
        for k in range(P):
            s = rngs[k].standard_normal((S, dim))
            s *= R / np.linalg.norm(s, axis=1, keepdims=True)
            if branches[k] is not None:
                nb = len(branches[k])
                s[:nb] = branches[k] * (R / np.maximum(np.linalg.norm(branches[k], axis=1, keepdims=True), 1e-300))
            starts[:, k] = s
            kind = objective
            if kind == "auto":
                th0 = s.reshape((S,) + shape)
                value = problems[k].value(th0)
                rel = np.min(np.exp(problems[k].log_gap(th0)) / np.where(value > 0, value, np.inf))
                kind = "loss" if rel >= switch_gap else "log_gap"
            use_log[k] = kind == "log_gap"
            kinds[k, j] = kind
        x, f, it, ok = _ball_descent(fg, starts.reshape(S * P, dim), R, max_iter, tol, indexed=True)
        x, f, ok = x.reshape(S, P, dim), np.where(np.isfinite(f), f, np.inf).reshape(S, P), ok.reshape(S, P)
        for k in range(P):
            order = np.argsort(f[:, k], kind="stable")
            best = int(order[0])
            with np.errstate(invalid="ignore", divide="ignore"):
                unit = x[:, k] / np.linalg.norm(x[:, k], axis=1, keepdims=True)
            start_cos[k, j] = unit @ unit[best]
            xs[k, j], start_obj[k, j], iters[k, j], conv[k, j] = x[best, k], f[:, k], it, ok[best, k]
            picked: list[int] = []
            for b in order:
                if np.isfinite(f[b, k]) and all(unit[b] @ unit[c] < 1 - 1e-9 for c in picked):
                    picked.append(int(b))
                if len(picked) == keep:
                    break
            branches[k] = x[picked, k]
    out = []
    for k, prob in enumerate(problems):
        theta = xs[k].reshape((N,) + shape)
        out.append(
            RegularizationPath(
                radii=r,
                theta=theta,
                objective=kinds[k].astype(str),
                loss=prob.value(theta),
                log_gap=prob.log_gap(theta),
                norm=np.linalg.norm(xs[k], axis=1),
                start_objective=start_obj[k],
                start_cosine=start_cos[k],
                iterations=iters[k],
                converged=conv[k],
                parametrization="direct",
            )
        )
    return out


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
    >>> [c] = al.paths_against_svm([al.datasets.single_input(local=True)], [10.0, 100.0], n_starts=2)
    >>> c.certified, bool(c.error[-1] <= c.bound[-1])
    (True, True)
    """
    from .svm import max_margin

    problems = list(problems)
    seeds = list(range(len(problems))) if seeds is None else list(seeds)
    if len(seeds) != len(problems):
        raise ValueError(f"seeds must hold one seed per problem ({len(problems)}), got {len(seeds)}")
    r = _check_radii(radii)
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
    from .metrics import one_minus_cosine

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


@dataclass(frozen=True, eq=False)
class MatrixPaths:
    """The ``W`` path (Frobenius ball) and the ``(K, Q)`` path (nuclear ball) of one problem, against both SVMs.

    [TFSVM]: ``W̄(R)/R`` tends to the Frobenius W-SVM, ``K̄Q̄ᵀ/R`` to the nuclear-norm SVM. The two limits
    are told apart by margins: each path's margin ratio in its own norm is at least the bound ``ρ_lo(R)``
    (:func:`ray_margin_bound`) once its search is certified (:func:`ray_gap_excess` ``≥ −slack``), and the
    other SVM's direction has a margin ratio ``< 1`` in that norm.

    Attributes:
        fro, nuc: the solutions (``(d, d_z)`` arrays) of the Frobenius W-SVM (:func:`attnlib.max_margin`) and
            of the nuclear-norm SVM (:func:`attnlib.nuclear_svm` when the problem has ``factors``, else
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
    :func:`attnlib.nuclear_svm` (Clarabel on the reduced SDP, no cvxpy import) when ``prob.factors`` is
    set. An SVM solve that is not certified (status other than ``"optimal"``; relative duality gap or
    constraint violation above ``1e-8``) raises.

    Args: ``prob`` with a matrix parameter ``W`` (d, d_z); ``radii`` (N,); ``seed`` for both paths'
    random starts; ``solver``: ``max_iter``, ``tol``... as :func:`regularization_path`.

    >>> import attnlib as al
    >>> m = al.matrix_paths(al.datasets.random_tokens(3, 4, 4, seed=0), [1.0, 30.0], tol=1e-6, max_iter=300)
    >>> bool(m.nuc_in_fro < 1 and m.fro_in_nuc < 1), m.kq.parametrization
    (True, 'kq')
    """
    from .svm import max_margin

    r = _check_radii(radii)
    sol = max_margin(prob)
    if sol.status != "optimal":
        raise RuntimeError(f"the Frobenius SVM solve ended with status {sol.status!r}: no result is computed from it")
    fro = sol.theta
    if prob.factors is not None:
        from .factorization import nuclear_svm

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
