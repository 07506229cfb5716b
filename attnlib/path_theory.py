"""Chapter 2's checks that can fail (issue 22): the exact minimiser on the key plane, the rate the
theory gives, and matrix paths whose searches start from the SVM rays.

The regularization path ``p̄(R) = argmin_{‖p‖ ≤ R} L(p)`` is a non-convex search. On the page's
prompt instances the keys span a plane, so the minimiser lies on a circle, where an exact search
(:func:`exact_circle_path`) certifies it; the rate of ``1 − cos(p̄(R), p_mm*)`` is predicted by the
first-order theory of [MMTS]'s proof (:func:`path_rate`), before the path is solved. The matrix
paths cannot be searched exactly; :func:`matrix_paths_from_rays` starts each from its own SVM ray,
so the premise of the page's bound (a point no worse than the ray) holds by construction.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize_scalar

from .factorization import nuclear_svm
from .metrics import one_minus_cosine
from .model import log_softmax
from .paths import (
    CERTIFICATE_SLACK,
    MatrixPaths,
    margin_ratio,
    parameter_norm,
    ray_gap_excess,
    ray_margin_bound,
    regularization_path,
)
from .svm import max_margin

__all__ = [
    "CERTIFICATE_SLACK",
    "ExactCirclePath",
    "PathRate",
    "circle_max_margin_direction",
    "exact_circle_path",
    "key_plane_basis",
    "linearized_log_gap",
    "matrix_paths_from_rays",
    "path_rate",
]


def key_plane_basis(prob) -> np.ndarray:
    """An orthonormal basis (r, d) of the span of the key differences ``A_iopt − A_it``.

    The loss depends on ``p`` only through these differences (a logit shift common to an input's
    tokens cancels in its softmax), so a component of ``p`` outside their span spends norm for
    nothing: the minimiser on the ball lies in the span.
    """
    D = (prob.A[np.arange(prob.n), prob.opt][:, None] - prob.A).reshape(-1, prob.A.shape[-1])
    _, s, Vt = np.linalg.svd(D, full_matrices=False)
    return Vt[: int(np.sum(s > 1e-12 * s[0]))]


def _circle_minima(objective, basis, R: float, grid: int, slope_bound: float):
    """Every local minimum of ``objective`` on the circle of radius ``R`` in ``basis`` (2, d) that can be
    the global one, refined to 1e-13 rad: ``[(value, angle)]``, best first; and the excess of the best
    grid minimum of any *other* basin (another branch; ``inf`` if there is none).

    A grid minimum is refined when it lies within ``slope_bound · h`` of the best grid value (``h``
    the grid step): a basin whose grid values are all higher cannot hold a lower minimum, since the
    objective changes by at most ``slope_bound`` per radian.
    """
    phi = np.linspace(0.0, 2 * np.pi, grid, endpoint=False)
    h = 2 * np.pi / grid

    def at(a):
        a = np.atleast_1d(a)
        return objective(R * (np.cos(a)[:, None] * basis[0] + np.sin(a)[:, None] * basis[1]))

    f = at(phi)
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
    rows = []
    for R in np.asarray(radii, float):
        minima, other = _circle_minima(objective, basis, float(R), grid, 2 * R * reach)
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
        z = log_c[None, :] - np.asarray(points, float) @ D.T
        top = z.max(axis=1, keepdims=True)
        return top[:, 0] + np.log(np.exp(z - top).sum(axis=1))

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
