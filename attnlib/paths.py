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

import numpy as np
from scipy.optimize import minimize

from .losses import Loss, get_loss
from .model import NonlinearHeadAttention, TokenSelectionProblem, factor_grad, log_softmax, logsumexp, stack_problems
from .svm import max_margin

__all__ = [
    "OBJECTIVES",
    "PARAMETRIZATIONS",
    "RegularizationPath",
    "log_gap_grad",
    "ball_stationarity_gap",
    "check_radii",
    "regularization_path",
    "direction_bound",
    "cone_project",
    "selection_log_gap",
    "local_regularization_path",
    "regularization_paths",
    "joint_log_gap",
    "joint_log_loss",
    "JointPath",
    "joint_regularization_path",
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
    >>> f, g = log_gap_grad(prob, np.array([-100.0, 1000.0, 0.0]))
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


def _project(x: np.ndarray, rho: float) -> np.ndarray:
    nrm = np.linalg.norm(x, axis=1, keepdims=True)
    return np.where(nrm > rho, x * (rho / np.where(nrm > 0, nrm, 1.0)), x)


def ball_stationarity_gap(prob, theta, radius, norm: str = "fro") -> np.ndarray:
    """Relative Frank–Wolfe gap of ``θ`` on the ball ``‖θ‖ ≤ R`` (Frobenius or nuclear): (N,).

    .. math::

        \\mathrm{gap}(θ) = \\frac{\\max_{‖S‖ \\le R} ⟨∇f(θ), θ − S⟩}{R\\,‖∇f(θ)‖_{\\circ}}
        = 1 + \\frac{⟨∇f(θ), θ⟩}{R\\,‖∇f(θ)‖_{\\circ}},

    with ``‖·‖_∘`` the dual norm (Frobenius for ``"fro"``, spectral for ``"nuc"``) and ``f = log(L − L*)``
    (any positive multiple of the gradient, e.g. ``∇L``, gives the same value). It lies in ``[0, 2]`` for
    ``‖θ‖ ≤ R`` and is ``0`` exactly at a first-order stationary point of ``f`` on the ball (also where
    ``∇f = 0``). The problem is not convex, so it certifies stationarity, not a global minimum.

    Args: ``prob`` an :class:`attnlib.AttentionProblem`; ``theta`` (N, *shape) (matrices (N, d, d_z) for
    ``"nuc"``); ``radius`` (N,) the radii ``R``; ``norm`` ``"fro"`` or ``"nuc"``.

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.random_tokens(3, 4, 4, seed=0)
    >>> W = np.random.default_rng(0).normal(size=(1, 4, 4))
    >>> R = np.linalg.norm(W, axis=(1, 2))
    >>> g = ball_stationarity_gap(prob, W, R)
    >>> bool(0 < g[0] <= 2), ball_stationarity_gap(prob, W * 0, [1.0]).tolist()
    (True, [1.0])
    """
    if norm not in ("fro", "nuc"):
        raise ValueError(f"norm must be one of ['fro', 'nuc'], got {norm!r}")
    theta = np.asarray(theta, float)
    R = np.broadcast_to(np.asarray(radius, float), (len(theta),))
    _, g = log_gap_grad(prob, theta)
    flat_g, flat_t = g.reshape(len(theta), -1), theta.reshape(len(theta), -1)
    if norm == "nuc":
        dual = np.linalg.norm(g, 2, axis=(-2, -1))
    else:
        dual = np.linalg.norm(flat_g, axis=1)
    scale = R * dual
    with np.errstate(invalid="ignore", divide="ignore"):
        gap = 1.0 + np.sum(flat_g * flat_t, axis=1) / scale
    return np.where(scale > 0, gap, 0.0)


def _sphere_polish(fg: Callable, x0: np.ndarray, rho: float, tol: float, max_iter: int):
    """BFGS on the sphere ``‖x‖ = rho`` from ``x0`` (D,): ``(x, f, iterations)``.

    Projected gradient descent with Barzilai–Borwein steps stalls on the flat directions of ``log(L − L*)``
    at large radii (for ``(K, Q)``: balancing the singular values of ``KQᵀ``, a relative Frank–Wolfe gap of
    about ``4e-4`` at ``R = 1000`` after any number of steps). With the scale-free parametrization
    ``x = rho·y/‖y‖`` the problem is unconstrained in ``y``, and BFGS's curvature model resolves those
    directions in a few dozen iterations. It stops when the gradient in ``y`` is below ``tol²`` of its
    starting size, or when the line search can no longer decrease ``f`` in floating point. Only for a
    start whose constraint is active (the descent direction points out of the ball).
    """

    def on_sphere(y):
        n = np.linalg.norm(y)
        x = rho * y / n
        f, g = fg(x[None])
        g = g[0]
        return float(f[0]), (rho / n) * (g - (g @ x) * x / rho**2)

    f0, g0 = on_sphere(x0)
    gtol = tol**2 * max(float(np.max(np.abs(g0))), 1e-300)
    res = minimize(on_sphere, x0, jac=True, method="BFGS", options={"gtol": gtol, "maxiter": max_iter})
    if not (np.isfinite(res.fun) and res.fun <= f0):
        return x0, f0, int(res.nit)
    return rho * res.x / np.linalg.norm(res.x), float(res.fun), int(res.nit)


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


def _polished_winner(
    log_fg: Callable, fg: Callable, x: np.ndarray, f: np.ndarray, best: int, rho: float, tol: float, max_iter: int
):
    """``x``, ``f`` with row ``best`` refined by :func:`_sphere_polish` of ``log_fg`` (``log(L − L*)``) if its
    constraint is active; ``f`` stays the radius's own objective ``fg``, evaluated at the refined point."""
    xb = x[best]
    _, g = log_fg(xb[None])
    if np.linalg.norm(xb) >= rho * (1 - 1e-12) and float(g[0] @ xb) < 0:
        x, f = x.copy(), f.copy()
        x[best] = _sphere_polish(log_fg, xb, rho, tol, max_iter)[0]
        f[best] = fg(x[best][None])[0][0]
    return x, f


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
    polish: bool = False,
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
        polish: refine each radius's winner by BFGS on the sphere (at most ``max_iter`` iterations),
            where its constraint is active. Projected descent stalls on the flat directions of
            ``log(L − L*)`` at large radii; the polish brings the relative Frank–Wolfe gap
            (:func:`ball_stationarity_gap`) down to rounding. Only decreases the objective.

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
        fg = _objective_and_grad(prob, coords, kind)
        x, f, it, ok = _ball_descent(fg, starts, rho, max_iter, tol)
        f = np.where(np.isfinite(f), f, np.inf)
        order = np.argsort(f, kind="stable")
        if polish and np.isfinite(f[order[0]]):
            # polished on log(L − L*) whatever the radius's objective: same minimisers, no cancellation in L
            log_fg = fg if kind == "log_gap" else _objective_and_grad(prob, coords, "log_gap")
            x, f = _polished_winner(log_fg, fg, x, f, int(order[0]), rho, tol, max_iter)
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
    >>> both = regularization_paths(probs, [1.0, 10.0], n_starts=2, seeds=[1, 2])
    >>> alone = al.regularization_path(probs[1], [1.0, 10.0], n_starts=2, seed=2)
    >>> bool(np.allclose(both[1].theta, alone.theta, rtol=0, atol=1e-6))
    True
    """

    problems = list(problems)
    stack = stack_problems(problems)
    P = stack.S
    seeds = list(range(P)) if seeds is None else list(seeds)
    if len(seeds) != P:
        raise ValueError(f"seeds must hold one seed per problem ({P}), got {len(seeds)}")
    r = check_radii(radii)
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


def _log_loss(loss: Loss, u) -> np.ndarray:
    """``log ℓ(u)`` without underflow, for the logistic and the exponential loss."""
    u = np.asarray(u, float)
    if loss.name == "exponential":
        return -u
    if loss.name != "logistic":
        raise ValueError(f"the joint path needs the logistic or the exponential loss, got {loss.name!r}")
    with np.errstate(over="ignore", divide="ignore"):
        small = np.log(np.logaddexp(0.0, -np.minimum(u, 30.0)))
        large = -u + np.log1p(-0.5 * np.exp(-np.maximum(u, 30.0)))
    return np.where(u > 30.0, large, small)


def _log_abs_excess(loss: Loss, gamma, delta) -> tuple[np.ndarray, np.ndarray]:
    """``log|ℓ(γ − δ) − ℓ(γ)|`` and its sign (that of ``δ``), for any sign and size of ``δ`` and ``γ``.

    ``|δ| < 1e-8``: first order, ``log|ℓ'(γ)| + log|δ|``. ``γ > 30`` (logistic) or exponential:
    ``ℓ(u) = e^{−u}`` to relative ``e^{−γ}``, so the excess is ``e^{−γ} expm1(δ)``. Otherwise the
    direct difference (no cancellation for ``|δ| ≥ 1e-8`` and ``γ ≤ 30``).
    """
    gamma, delta = np.broadcast_arrays(np.asarray(gamma, float), np.asarray(delta, float))
    sign = np.sign(delta)
    ad = np.abs(delta)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        log_slope = loss.log_slope(gamma)
        first = log_slope + np.log(ad)
        # log|expm1(δ)| for any δ: δ + log1p(−e^{−δ}) for large δ
        log_em1 = np.where(
            delta > 30.0,
            delta + np.log1p(-np.exp(-np.minimum(delta, 700.0))),
            np.log(np.abs(np.expm1(np.minimum(delta, 30.0)))),
        )
        tail = -gamma + log_em1
        direct = np.log(np.abs(loss.value(gamma - delta) - loss.value(gamma)))
    exp_like = (loss.name == "exponential") | (gamma > 30.0)
    out = np.where(ad < 1e-8, first, np.where(exp_like, tail, direct))
    return out, sign


def joint_log_gap(X, y, keys, select, p, v, loss) -> tuple[np.ndarray, np.ndarray]:
    """Signed excess of the joint loss over the floor of its selection at ``v``: ``L(p, v) − L_α(v)``.

    ``L_α(v) = (1/n) Σ_i ℓ(γ_iα_i)`` with ``γ_it = y_i vᵀ x_it``: the loss when every input attends
    to its selected token only. As in :func:`selection_log_gap`, with ``δ_i = Σ_t σ_it (γ_iα − γ_it)``
    in signed log space; accurate where the excess is far below the float resolution of ``L``.

    Args: ``X`` (*data, n, T, d), ``y`` (*data, n), ``keys`` (*data, n, T, d_k), ``select`` (*data, n),
    ``p`` (*batch, d_k), ``v`` (*batch, d), with ``data`` broadcastable against ``batch`` (one data
    set per batch member, or one for all).  Returns ``(log|L − L_α|, sign)``, each (*batch,).
    """
    loss = get_loss(loss)
    n = X.shape[-3]
    sel = np.asarray(select)
    gamma = np.asarray(y)[..., None] * np.einsum("...d,...itd->...it", np.asarray(v, float), X)
    g_sel = np.take_along_axis(gamma, np.broadcast_to(sel, gamma.shape[:-1])[..., None], axis=-1)[..., 0]
    diff = g_sel[..., None] - gamma
    log_sigma = log_softmax(np.einsum("...k,...itk->...it", np.asarray(p, float), keys), axis=-1)
    with np.errstate(divide="ignore"):
        terms = np.where(diff == 0, -np.inf, log_sigma + np.log(np.abs(diff)))
    log_delta, s_delta = logsumexp(terms, axis=-1, b=np.where(diff == 0, 1.0, np.sign(diff)), return_sign=True)
    log_e, s_e = _log_abs_excess(loss, g_sel, s_delta * np.exp(np.minimum(log_delta, 700.0)))
    # |δ| may underflow in exp(log_delta): the first-order branch then needs log_delta itself
    with np.errstate(divide="ignore"):
        log_slope = loss.log_slope(g_sel)
    tiny = log_delta < np.log(1e-8)
    log_e = np.where(tiny, log_slope + log_delta, log_e)
    s_e = np.where(tiny, s_delta, s_e)
    lg, sign = logsumexp(log_e, axis=-1, b=np.where(s_e == 0, 0.0, s_e), return_sign=True)
    return lg - np.log(n), sign


def joint_log_loss(X, y, keys, p, v, loss) -> np.ndarray:
    """``log L(p, v)``, accurate where ``L`` underflows: (*batch,) (shapes as :func:`joint_log_gap`)."""
    loss = get_loss(loss)
    log_sigma = log_softmax(np.einsum("...k,...itk->...it", np.asarray(p, float), keys), axis=-1)
    pooled = np.einsum("...it,...itd->...id", np.exp(log_sigma), X)
    u = np.asarray(y) * np.einsum("...d,...id->...i", np.asarray(v, float), pooled)
    return logsumexp(_log_loss(loss, u), axis=-1, precise=True) - np.log(X.shape[-3])


def _angle_search(objective, N: int, grid: int, zoom: int, levels: int) -> np.ndarray:
    """Global minimiser over the circle for each of ``N`` rows: ``objective(angles (N, M)) → (sign, key)``.

    Lower sign first, then lower key (the sign is that of an excess whose log is ``|key|``: ordering
    by ``(sign, sign·log|E|)`` orders by ``E``). A grid of ``grid`` angles, then ``levels`` zooms of
    ``zoom`` points over ± one spacing around the best.
    """
    angles = np.broadcast_to(np.linspace(0.0, 2 * np.pi, grid, endpoint=False), (N, grid))
    width = 2 * np.pi / grid
    best = None
    for level in range(levels + 1):
        sign, key = objective(angles)
        smin = np.min(sign, axis=1, keepdims=True)
        k = np.where(sign == smin, key, np.inf)
        idx = np.argmin(k, axis=1)
        best = angles[np.arange(N), idx]
        if level < levels:
            angles = best[:, None] + np.linspace(-width, width, zoom)[None, :]
            width = 2 * width / (zoom - 1)
    return best


@dataclass(frozen=True, eq=False)
class JointPath:
    """The joint regularization path ``(p̄, v̄)(R_p, R_v)`` of :func:`joint_regularization_path`.

    Attributes: ``radii_p`` (N,), ``radii_v`` (N,), ``p`` (*S, N, 2), ``v`` (*S, N, 2) the minimisers
    on the spheres (``S``: data sets of a stack), ``rounds`` (*S, N) alternations used,
    ``log_loss`` ``log L(p̄, v̄)``, ``log_gap`` / ``gap_sign`` the excess over the selection's floor
    at ``v̄``, ``select``, ``unsettled``: some row still moved at the last alternation.
    """

    radii_p: np.ndarray
    radii_v: np.ndarray
    p: np.ndarray
    v: np.ndarray
    rounds: np.ndarray
    log_loss: np.ndarray
    log_gap: np.ndarray
    gap_sign: np.ndarray
    select: np.ndarray
    unsettled: bool


def joint_regularization_path(
    X,
    y,
    select,
    radii_p,
    radii_v,
    W=None,
    loss: str = "logistic",
    grid: int = 360,
    zoom: int = 21,
    levels: int = 10,
    max_rounds: int = 8,
    tol: float = 1e-10,
) -> JointPath:
    """Joint regularization path of [MMTS]: ``(p̄, v̄) = argmin L(p, v)`` over ``‖p‖ = R_p``, ``‖v‖ = R_v``.

    For 2-D ``p`` and 2-D ``v`` (the paper's joint-training data): each parameter is an angle on its
    circle, and the path alternates exact block minimisations, each a global search over its circle
    (a grid of ``grid`` angles refined ``levels`` times), until neither angle moves by more than
    ``tol`` rad (at most ``max_rounds`` alternations, recorded in ``rounds``):

    - ``v`` at fixed ``p``: minimise ``log L(p, v)`` (:func:`joint_log_loss`); the samples' losses
      ``≈ e^{−R_v m_i}`` are large numbers in log space, no difference is formed;
    - ``p`` at fixed ``v``: minimise ``L(p, v) − L_α(v)`` in signed log space
      (:func:`joint_log_gap`): the part of the loss ``p`` can still change is far below the float
      resolution of ``L`` once ``R_v`` is large (sample ``i`` weighs ``|ℓ'(γ_iα)| ≈ e^{−R_v m_i}``).

    The search is on the spheres: at the radii used the loss decreases outwards in both blocks
    (the selected tokens win and are correctly classified), so the ball constraints are active.
    Every radius, and every data set of a stack, is one row of a single batched search.

    Args:
        X: (n, T, 2) tokens, or (S, n, T, 2) a stack of data sets (same ``n``, ``T``).
        y: (n,) or (S, n) labels.  select: (n,) or (S, n) the selected tokens ``α``.
        radii_p, radii_v: (N,) the two radii (e.g. ``R_v = R_p^κ``).  W: (2, 2) keys ``k = W x``.

    Returns :class:`JointPath` with ``p``, ``v`` of shape (N, 2), or (S, N, 2) for a stack.
    """
    X = np.asarray(X, float)
    stacked = X.ndim == 4
    Xs = X if stacked else X[None]
    S, n, T, d = Xs.shape
    ys = np.broadcast_to(np.asarray(y, float), (S, n))
    sels = np.broadcast_to(np.asarray(select), (S, n))
    W = np.eye(d) if W is None else np.asarray(W, float)
    keys = Xs @ W.T
    if d != 2 or keys.shape[-1] != 2:
        raise ValueError(f"the joint path searches circles: p and v must be 2-D, got d = {d}, d_k = {keys.shape[-1]}")
    rp, rv = check_radii(radii_p), np.asarray(radii_v, float)
    if rv.shape != rp.shape or np.any(rv <= 0):
        raise ValueError(f"radii_v must be positive with the shape of radii_p {rp.shape}, got {rv.shape}")
    N = len(rp)
    # rows: data set s, radius j  ->  row s * N + j; data carry a grid axis of length 1
    Xr, Kr = np.repeat(Xs, N, axis=0)[:, None], np.repeat(keys, N, axis=0)[:, None]
    yr, sr = np.repeat(ys, N, axis=0)[:, None], np.repeat(sels, N, axis=0)[:, None]
    Rp, Rv = np.tile(rp, S), np.tile(rv, S)
    rows = S * N

    def circle(angles, radius):
        return radius[:, None, None] * np.stack([np.cos(angles), np.sin(angles)], axis=-1)

    def f_v(angles, idx):
        lv = joint_log_loss(Xr[idx], yr[idx], Kr[idx], p[idx, None, :], circle(angles, Rv[idx]), loss)
        return np.zeros_like(lv), lv

    def f_p(angles, idx):
        lg, sign = joint_log_gap(Xr[idx], yr[idx], Kr[idx], sr[idx], circle(angles, Rp[idx]), v[idx, None, :], loss)
        return sign, sign * lg

    def turned(a, b):
        return np.abs(np.angle(np.exp(1j * (a - b)))) > tol

    p, v = np.zeros((rows, 2)), np.zeros((rows, 2))
    a_p, a_v = np.full(rows, np.nan), np.full(rows, np.nan)
    rounds = np.zeros(rows, int)
    active = np.ones(rows, bool)
    for it in range(max_rounds):
        idx = np.flatnonzero(active)
        new_v = _angle_search(lambda a, idx=idx: f_v(a, idx), len(idx), grid, zoom, levels)
        v[idx] = circle(new_v[:, None], Rv[idx])[:, 0]
        new_p = _angle_search(lambda a, idx=idx: f_p(a, idx), len(idx), grid, zoom, levels)
        moved = turned(new_p, a_p[idx]) | turned(new_v, a_v[idx]) | np.isnan(a_p[idx])
        rounds[idx] = it + 1
        a_p[idx], a_v[idx] = new_p, new_v
        p[idx] = circle(new_p[:, None], Rp[idx])[:, 0]
        active[idx] = moved
        if not active.any():
            break
    lg, sign = joint_log_gap(Xr[:, 0], yr[:, 0], Kr[:, 0], sr[:, 0], p, v, loss)
    ll = joint_log_loss(Xr[:, 0], yr[:, 0], Kr[:, 0], p, v, loss)
    shape = (S, N) if stacked else (N,)
    return JointPath(
        rp,
        rv,
        p.reshape(shape + (2,)),
        v.reshape(shape + (2,)),
        rounds.reshape(shape),
        ll.reshape(shape),
        lg.reshape(shape),
        sign.reshape(shape),
        np.asarray(select),
        bool(active.any()),
    )
