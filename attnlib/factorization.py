"""Self-attention trained as the papers train it: the factorisation ``W = K Qᵀ`` [TFSVM].

Training the key and query matrices ``K`` (d, m) and ``Q`` (d_z, m) of
``f(X) = uᵀ Xᵀ softmax(X K Qᵀ z)`` minimises the same loss ``L(W)`` at ``W = K Qᵀ`` (the logits are
``⟨K Qᵀ, x_it z_iᵀ⟩``), with the chain rule

.. math::

    ∇_K L = ∇_W L\\, Q, \\qquad ∇_Q L = (∇_W L)^⊤ K .

[TFSVM] states (paraphrased) that its direction converges to the *nuclear-norm* SVM
``W*_mm(α) = argmin ‖W‖_* s.t. ⟨W, A_iα_i − A_it⟩ ≥ 1``, while training ``W`` itself converges to
the Frobenius one ``W_mm(α)``; a width ``m < d`` caps the rank of ``K Qᵀ`` at ``m``.

This module holds the trainer (:func:`train_kq`, GD / NGD / Polyak over a batch of
initialisations or a :class:`~attnlib.ProblemStack`), exact nuclear-norm SVMs for the
self-attention features (:func:`nuclear_svm`: the SDP reduced to the span of the constraints and
solved by Clarabel directly, one instance), batched certified solvers for many instances at once
(:func:`frobenius_svm_batch`, :func:`nuclear_svm_batch`, :func:`svm_pair_batch`), the [TFSVM]
rank-versus-d grid (:func:`svm_rank_grid`) with infeasible instances counted apart, never as a
rank, and (K, Q) trained on every instance of such a grid (:func:`train_kq_grid`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .model import ProblemStack, TokenSelectionProblem, self_attention
from .optim import BatchRecord, Stop, check_schedule, record_schedule, step_rule, train
from .paths import factor_grad

__all__ = [
    "FactorTrajectory",
    "train_kq",
    "kq_init",
    "NuclearSVM",
    "nuclear_svm",
    "svm_constraints",
    "rank_instance",
    "RankGrid",
    "svm_rank_grid",
    "numerical_rank",
    "OFFICIAL_RANK_GRID",
    "SVMBatch",
    "frobenius_svm_batch",
    "nuclear_svm_batch",
    "train_kq_grid",
    "svm_pair_batch",
    "LocalConvergence",
    "local_convergence",
]

NORMALIZATIONS = ("joint", "separate")


@dataclass(frozen=True, eq=False)
class FactorTrajectory(BatchRecord):
    """Recorded states of B trajectories of ``(K, Q)`` (a :class:`attnlib.optim.BatchRecord`).

    Attributes:
        K: (R, B, d, m) and Q: (R, B, d_z, m) at the recorded steps.
        normalize: how NGD normalised the factors.  seconds: (R,) wall-clock since the start.
        steps, loss, log_gap, log_grad_norm, stopped, method, lr: as in
        :class:`attnlib.optim.BatchRecord`, with ``log_grad_norm`` ``log ‖(∇_K L, ∇_Q L)‖`` and the
        loss at ``W = K Qᵀ``.
    """

    K: np.ndarray
    Q: np.ndarray
    normalize: str
    seconds: np.ndarray

    @property
    def W(self) -> np.ndarray:
        """The product ``W = K Qᵀ`` at every recorded step: (R, B, d, d_z)."""
        return self.K @ np.swapaxes(self.Q, -1, -2)

    @property
    def final(self) -> np.ndarray:
        """Last recorded product ``K Qᵀ``: (B, d, d_z)."""
        return self.K[-1] @ np.swapaxes(self.Q[-1], -1, -2)

    @property
    def norm(self) -> np.ndarray:
        """``‖K Qᵀ‖_F``: (R, B)."""
        return np.linalg.norm(self.W, axis=(-2, -1))


def kq_init(B: int, d: int, d_z: int, m: int | None = None, seed=0) -> tuple[np.ndarray, np.ndarray]:
    """Random factors as torch's ``nn.Linear`` draws them (the official [TFSVM] code's start).

    Entries uniform in ``±1/√d``. Returns ``K0`` (B, d, m) and ``Q0`` (B, d_z, m), ``m = d`` by default.

    >>> K0, Q0 = kq_init(3, 4, 4, m=2, seed=0)
    >>> K0.shape, Q0.shape, bool(np.abs(K0).max() <= 0.5)
    ((3, 4, 2), (3, 4, 2), True)
    """
    m = d if m is None else m
    if min(B, d, d_z, m) < 1:
        raise ValueError(f"B, d, d_z and m must be positive, got {(B, d, d_z, m)}")
    rng = np.random.default_rng(seed)
    bound = 1.0 / np.sqrt(d)
    return rng.uniform(-bound, bound, size=(B, d, m)), rng.uniform(-bound, bound, size=(B, d_z, m))


def _factor_batch(prob, K0, Q0):
    """Validate ``K0``, ``Q0`` against the problem; return (B, d, m), (B, d_z, m) copies."""
    if len(prob.shape) != 2:
        raise ValueError(f"train_kq needs a matrix parameter W (self-attention), got parameter shape {prob.shape}")
    d, d_z = prob.shape
    K, Q = np.array(K0, dtype=float), np.array(Q0, dtype=float)
    stacked = isinstance(prob, ProblemStack)
    if K.ndim == 2 and Q.ndim == 2:
        K, Q = K[None], Q[None]
        if stacked:
            K, Q = np.repeat(K, prob.S, 0), np.repeat(Q, prob.S, 0)
    if K.ndim != 3 or Q.ndim != 3 or K.shape[0] != Q.shape[0] or K.shape[1] != d or Q.shape[1] != d_z:
        raise ValueError(f"K0 must have shape ([B,] {d}, m) and Q0 ([B,] {d_z}, m), got {K.shape} and {Q.shape}")
    if K.shape[2] != Q.shape[2]:
        raise ValueError(f"K0 and Q0 must share the width m, got {K.shape[2]} and {Q.shape[2]}")
    if stacked and K.shape[0] != prob.S:
        raise ValueError(f"a stack of {prob.S} problems needs {prob.S} initialisations, got {K.shape[0]}")
    if not (np.all(np.isfinite(K)) and np.all(np.isfinite(Q))):
        raise ValueError("K0 and Q0 must be finite")
    return K, Q


def train_kq(
    prob: TokenSelectionProblem | ProblemStack,
    K0,
    Q0,
    steps: int,
    method: str = "ngd",
    lr: float = 0.1,
    normalize: str = "joint",
    record_every: int = 1,
    record_steps=None,
) -> FactorTrajectory:
    """GD, NGD or Polyak on the factors ``(K, Q)`` of ``W = K Qᵀ`` (self-attention, [TFSVM]).

    The gradient in ``W`` comes from the problem's public ``scaled_grad`` (``∇_W L = exp(s)·g``,
    exact at saturation) and goes through :func:`attnlib.factor_grad`. Moves:

    - ``"gd"``: ``(K, Q) ← (K, Q) − η (∇_K L, ∇_Q L)``;
    - ``"ngd"``: ``normalize="joint"`` divides by ``‖(∇_K L, ∇_Q L)‖``; ``"separate"`` normalises
      each factor by its own gradient norm, as the official [TFSVM] code does;
    - ``"polyak"``: ``η (L − L*)/‖∇_{K,Q} L‖²`` times the gradient (``L*`` the loss floor).

    A trajectory stops (reason recorded) when a value turns non-finite or the gradient is exactly 0.

    Args:
        prob: a self-attention problem (parameter (d, d_z)), or a stack of S of them (one trajectory each).
        K0: (d, m) or (B, d, m) (B = S for a stack).  Q0: (d_z, m) or (B, d_z, m).  ``m < d`` caps the rank.
        steps, lr, record_every, record_steps: as in :func:`attnlib.train`.

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.random_tokens(4, 5, 6, seed=0, queries="cross")
    >>> K0, Q0 = al.kq_init(2, 6, 6, m=3, seed=1)
    >>> traj = al.train_kq(prob, K0, Q0, steps=20)
    >>> traj.W.shape, int(np.linalg.matrix_rank(traj.final[0]))
    ((21, 2, 6, 6), 3)
    """
    rule = step_rule(method)
    if normalize not in NORMALIZATIONS:
        raise ValueError(f"normalize must be one of {list(NORMALIZATIONS)}, got {normalize!r}")
    check_schedule(steps, lr, 1)
    K, Q = _factor_batch(prob, K0, Q0)
    B = K.shape[0]
    record = record_schedule(steps, record_every, record_steps)
    R = len(record)
    out_K, out_Q = np.empty((R,) + K.shape), np.empty((R,) + Q.shape)
    out_loss, out_gap, out_gn, out_sec = np.empty((R, B)), np.empty((R, B)), np.empty((R, B)), np.empty(R)
    stop_step, stop_reason = np.full(B, -1), np.full(B, "", dtype=object)
    active = np.ones(B, bool)
    start, r = time.perf_counter(), 0
    safe = lambda x: np.where(x > 0, x, 1.0)[:, None, None]  # noqa: E731
    # Overflow and log(0) are detected below and stop the run; one errstate for the whole loop.
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for k in range(int(record[-1]) + 1):
            W = K @ np.swapaxes(Q, 1, 2)
            terms = prob.terms_from_flat(W.reshape(B, -1))  # the AttentionProblem protocol: W is valid here
            log_scale, gW = prob.scaled_grad_from(terms, batch=(B,))
            gK, gQ = factor_grad(gW, K, Q)  # ∇_{K,Q} L = exp(log_scale) · (gK, gQ)
            nK, nQ = np.sqrt((gK * gK).sum(axis=(1, 2))), np.sqrt((gQ * gQ).sum(axis=(1, 2)))
            g_norm = np.sqrt(nK**2 + nQ**2)
            log_gn = log_scale + np.log(g_norm)
            need_gap = k == record[r] or rule.needs_loss
            log_gap = prob.log_gap_from(terms) if need_gap else None
            if k == record[r]:
                out_K[r], out_Q[r], out_gap[r], out_gn[r] = K, Q, log_gap, log_gn
                out_loss[r] = np.mean(prob.loss.value(terms.output), axis=-1)
                out_sec[r] = time.perf_counter() - start
                r += 1
            if k == record[-1]:
                break
            finite = np.isfinite(K).all(axis=(1, 2)) & np.isfinite(Q).all(axis=(1, 2)) & np.isfinite(g_norm)
            bad = active & ~(finite & ~np.isnan(log_scale))
            zero = active & ~bad & ((g_norm == 0) | (log_scale == -np.inf))
            if bad.any() or zero.any():
                for mask, why in ((bad, "non-finite value"), (zero, "gradient is exactly zero")):
                    stop_step[mask], stop_reason[mask] = k, why
                    active &= ~mask
            if method == "ngd" and normalize == "separate":
                mK = np.where(nK > 0, lr, 0.0)[:, None, None] * gK / safe(nK)
                mQ = np.where(nQ > 0, lr, 0.0)[:, None, None] * gQ / safe(nQ)
            else:
                length = rule.lengths(np.full(B, float(lr)), log_gn, log_gap)
                unit = 1.0 / safe(g_norm)
                mK, mQ = length[:, None, None] * gK * unit, length[:, None, None] * gQ * unit
            if active.all():
                K -= mK
                Q -= mQ
            else:
                K[active] -= mK[active]
                Q[active] -= mQ[active]
    stopped = tuple(None if s < 0 else Stop(int(s), str(w)) for s, w in zip(stop_step, stop_reason))
    return FactorTrajectory(
        K=out_K,
        Q=out_Q,
        steps=record,
        loss=out_loss,
        log_gap=out_gap,
        log_grad_norm=out_gn,
        stopped=stopped,
        method=method,
        lr=float(lr),
        normalize=normalize,
        seconds=out_sec,
    )


# ---------------------------------------------------------------------------------------- SVMs
def svm_constraints(X, Z, select) -> tuple[np.ndarray, np.ndarray]:
    """Rank-one constraints of W-SVM for self-attention: ``a_kᵀ W z_k ≥ 1``.

    Args: ``X`` (n, T, d) tokens, ``Z`` (n, d_z) queries, ``select`` (n,) selected token per sample.
    Returns ``a`` (n·(T−1), d) key differences ``x_iα_i − x_it`` (t ≠ α_i) and ``z`` (n·(T−1), d_z).
    """
    X, Z = np.asarray(X, float), np.asarray(Z, float)
    n, T, _ = X.shape
    sel = np.asarray(select)
    rows = np.ones((n, T), bool)
    rows[np.arange(n), sel] = False
    a = (X[np.arange(n), sel][:, None, :] - X)[rows]
    z = np.broadcast_to(Z[:, None, :], (n, T, Z.shape[1]))[rows]
    return a, z


def _basis(M: np.ndarray) -> np.ndarray:
    """Orthonormal basis (columns) of the row span of ``M`` (k, d)."""
    _, s, vt = np.linalg.svd(M, full_matrices=False)
    keep = s > s.max(initial=0.0) * max(M.shape) * np.finfo(float).eps
    return vt[keep].T


_SVEC_CACHE: dict = {}


def _svec_index(N: int):
    """Rows, columns and scales of Clarabel's PSD-triangle vector (upper triangle, column by column,
    off-diagonal entries times √2)."""
    if N not in _SVEC_CACHE:
        rows = np.array([i for j in range(N) for i in range(j + 1)])
        cols = np.array([j for j in range(N) for i in range(j + 1)])
        scale = np.where(rows == cols, 1.0, np.sqrt(2.0))
        _SVEC_CACHE[N] = rows, cols, scale
    return _SVEC_CACHE[N]


@dataclass(frozen=True, eq=False)
class NuclearSVM:
    """Nuclear-norm W-SVM ``W*_mm(α) = argmin ‖W‖_* s.t. a_kᵀ W z_k ≥ 1`` [TFSVM].

    Attributes:
        W: (d, d_z) the solution (``None`` when infeasible).  status: Clarabel's status string.
        feasible: bool.  nuclear_norm: ``‖W‖_*``.  dual_value: the dual objective ``Σ λ_k``.
        violation: ``max_k max(0, 1 − a_kᵀ W z_k)`` (primal accuracy).
        gap: ``(‖W‖_* − Σλ)/‖W‖_*`` (relative duality gap, the optimality accuracy).
    """

    W: np.ndarray | None
    status: str
    feasible: bool
    nuclear_norm: float
    dual_value: float
    violation: float
    gap: float


def nuclear_svm(X, Z, select, tol: float = 1e-10) -> NuclearSVM:
    """Exact nuclear-norm W-SVM for self-attention features, fast (Clarabel on a reduced SDP).

    Reduction: the constraints see W only through ``P_U W P_V`` (U = span of the key differences
    ``a_k``, V = span of the queries), and projecting does not increase ``‖W‖_*``; so
    ``W = Q_U M Q_Vᵀ`` with ``M`` (p, r), p = dim U, r = dim V. The dual,

    .. math::

        \\max_{λ ≥ 0} \\sum_k λ_k \\quad \\text{s.t.} \\quad
        \\Big\\|\\sum_k λ_k ã_k z̃_k^⊤\\Big\\|_{op} ≤ 1
        \\iff \\begin{pmatrix} I_p & S(λ) \\\\ S(λ)^⊤ & I_r \\end{pmatrix} ⪰ 0,

    has one variable per constraint and a (p + r)-dimensional PSD cone; ``M = 2 Y_{12}`` from the
    cone's dual matrix ``Y``. Several times faster than the cvxpy problem (PSD cone of size 2d, rebuilt
    per instance); the time is Clarabel's factorisation of the dense cone block. The verdict
    "infeasible" is Clarabel's (dual unbounded).

    Args: ``X`` (n, T, d), ``Z`` (n, d_z), ``select`` (n,) as in :func:`svm_constraints`;
    ``tol``: Clarabel's gap and feasibility tolerances.

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.random_tokens(4, 5, 6, seed=0, queries="cross")
    >>> X, Z = prob.factors
    >>> sol = al.nuclear_svm(X, Z, prob.opt)
    >>> ref = al.max_margin(prob, norm="nuc")
    >>> sol.feasible, bool(np.isclose(sol.nuclear_norm, 1 / ref.margin, rtol=1e-8)), sol.violation < 1e-8
    (True, True, True)
    """
    return _nuclear_clarabel(*svm_constraints(X, Z, select), tol)


def _nuclear_clarabel(a: np.ndarray, z: np.ndarray, tol: float = 1e-10) -> NuclearSVM:
    """:func:`nuclear_svm` from the constraint vectors ``a`` (k, d), ``z`` (k, d_z)."""
    import clarabel
    from scipy import sparse

    k = len(a)
    zero = np.all(a == 0, axis=1)
    if zero.any():  # a selected token equal to another one of its sample: 0 ≥ 1
        return NuclearSVM(None, "infeasible (a constraint row is zero)", False, np.nan, np.nan, np.nan, np.nan)
    QU, QV = _basis(a), _basis(z)
    at, zt = a @ QU, z @ QV  # (k, p), (k, r)
    p, r = at.shape[1], zt.shape[1]
    N = p + r
    rows, cols, scale = _svec_index(N)
    # column k of the cone matrix: svec of [[0, ã z̃ᵀ], [z̃ ãᵀ, 0]] (only the upper block is in the triangle)
    upper = (rows < p) & (cols >= p)
    E = np.zeros((len(rows), k))
    E[upper] = (at[:, rows[upper]] * zt[:, cols[upper] - p]).T * scale[upper, None]
    A = sparse.csc_matrix(np.vstack([-np.eye(k), E]))
    b = np.concatenate([np.zeros(k), np.where(rows == cols, 1.0, 0.0)])
    settings = clarabel.DefaultSettings()
    settings.verbose = False
    settings.tol_gap_abs = settings.tol_gap_rel = settings.tol_feas = tol
    settings.tol_ktratio = 1e-8
    settings.direct_solve_method = "faer"  # dense-friendly factorisation: ~2× qdldl on these KKT systems
    settings.max_threads = 1
    cones = [clarabel.NonnegativeConeT(k), clarabel.PSDTriangleConeT(N)]
    solver = clarabel.DefaultSolver(sparse.csc_matrix((k, k)), -np.ones(k), A, b, cones, settings)
    sol = solver.solve()
    status = str(sol.status)
    if "Infeasible" in status:  # the dual is unbounded: no W meets the constraints
        return NuclearSVM(None, status, False, np.nan, np.nan, np.nan, np.nan)
    if "Solved" not in status:
        raise RuntimeError(f"nuclear-norm SVM: Clarabel returned {status}")
    y = np.asarray(sol.z)[k:] / scale
    Y = np.zeros((N, N))
    Y[rows, cols] = y
    M = 2.0 * Y[:p, p:]
    W = QU @ M @ QV.T
    values = np.einsum("kd,de,ke->k", a, W, z)
    nuc = float(np.linalg.svd(W, compute_uv=False).sum())
    lam = float(np.sum(sol.x))
    return NuclearSVM(W, status, True, nuc, lam, float(max(0.0, 1.0 - values.min())), (nuc - lam) / nuc)


# ---------------------------------------------------------------------------------------- batched SVMs
def _sym(B: np.ndarray) -> np.ndarray:
    return 0.5 * (B + np.swapaxes(B, -1, -2))


def _inverse_cholesky(X: np.ndarray, done: np.ndarray) -> np.ndarray:
    """``L⁻¹`` with ``X = L Lᵀ`` for the S matrices (S, N, N); an instance whose ``X`` is no longer
    numerically positive definite is marked ``done`` (in place) and gets the identity."""
    X = np.where(done[:, None, None], np.eye(X.shape[-1]), X)
    try:
        L = np.linalg.cholesky(X)
    except np.linalg.LinAlgError:
        ev = np.linalg.eigvalsh(X)
        bad = ev[:, 0] <= 1e-13 * ev[:, -1]
        done |= bad
        L = np.linalg.cholesky(np.where(bad[:, None, None], np.eye(X.shape[-1]), X))
    return _triangular_inverse(L)


def _psd_step(Linv: np.ndarray, dX: np.ndarray, skip: np.ndarray, exact: bool = True) -> np.ndarray:
    """Largest α ≤ 1 with ``X + α dX ⪰ 0``, ``X = L Lᵀ``: (S,); 0 where ``skip``.

    ``exact=False``: a cheap lower bound from ``λ_min(B) ≥ m − s√(N−1)`` (``B = L⁻¹dXL⁻ᵀ``, ``m`` and ``s²``
    the mean and variance of its eigenvalues, from its trace and Frobenius norm; Wolkowicz–Styan)."""
    B = Linv @ dX @ np.swapaxes(Linv, -1, -2)
    if exact:
        low = np.linalg.eigvalsh(_sym(B))[:, 0]
    else:
        N = B.shape[-1]
        m = np.trace(B, axis1=1, axis2=2) / N
        low = m - np.sqrt(np.maximum(np.sum(B * B, (1, 2)) / N - m * m, 0.0) * (N - 1))
    return np.where(skip, 0.0, np.where(low < 0, np.minimum(1.0, -1.0 / np.where(low < 0, low, -1.0)), 1.0))


def _triangular_inverse(L: np.ndarray) -> np.ndarray:
    """``L⁻¹`` of the S lower-triangular matrices (S, N, N) (LAPACK ``dtrtri`` per matrix: a third
    of the work of numpy's batched LU inverse, and faster still on these small sizes)."""
    from scipy.linalg import lapack

    out = np.empty_like(L)
    for j in range(len(L)):
        out[j], info = lapack.dtrtri(L[j], lower=1)
        if info != 0:
            raise np.linalg.LinAlgError(f"singular triangular factor (dtrtri info {info})")
    return out


def _cholesky_or_stop(M: np.ndarray, done: np.ndarray) -> np.ndarray:
    """Cholesky factors of the S matrices (S, K, K); an instance whose ``M`` is not numerically positive
    definite is marked ``done`` (in place) and gets the identity."""
    try:
        return np.linalg.cholesky(M)
    except np.linalg.LinAlgError:
        out = np.repeat(np.eye(M.shape[-1])[None], len(M), 0)
        for j in range(len(M)):
            try:
                out[j] = np.linalg.cholesky(M[j])
            except np.linalg.LinAlgError:
                done[j] = True
        return out


def _solve_or_stop(H: np.ndarray, rhs: np.ndarray, done: np.ndarray) -> np.ndarray:
    """``H⁻¹ rhs`` for the S systems (S, K, K), (S, K); an instance whose ``H`` is numerically singular
    is marked ``done`` (in place) and gets 0."""
    try:
        return np.linalg.solve(H, rhs[..., None])[..., 0]
    except np.linalg.LinAlgError:
        out = np.zeros_like(rhs)
        for j in range(len(H)):
            try:
                out[j] = np.linalg.solve(H[j], rhs[j])
            except np.linalg.LinAlgError:
                done[j] = True
        return out


def _max_step_pos(x: np.ndarray, dx: np.ndarray) -> np.ndarray:
    """Largest α ≤ 1 with ``x + α dx ≥ 0`` for positive ``x``: (S, K) → (S,)."""
    ratio = np.where(dx < 0, -x / np.where(dx < 0, dx, -1.0), np.inf)
    return np.minimum(1.0, ratio.min(axis=-1, initial=np.inf))


@dataclass(frozen=True, eq=False)
class SVMBatch:
    """Max-margin W-SVMs of a batch of S instances, each with a certificate of optimality.

    Attributes:
        W: (S, d, d_z) the solutions, rescaled to be exactly feasible (``min_k a_kᵀ W z_k = 1``); NaN
            where ``certified`` is False.
        norm: (S,) ``‖W‖`` (Frobenius or nuclear), an upper bound on the optimal norm.
        lower: (S,) a lower bound on the optimal norm, from a dual-feasible point.
        gap: (S,) ``(norm − lower)/norm``, the certified relative optimality gap.
        certified: (S,) bool: a feasible ``W`` with ``gap ≤`` the requested accuracy.
        iterations: interior-point iterations used (the batch's largest).
    """

    W: np.ndarray
    norm: np.ndarray
    lower: np.ndarray
    gap: np.ndarray
    certified: np.ndarray
    iterations: int


def _span_bases(M: np.ndarray):
    """Orthonormal bases (columns) of the row spans of the S matrices ``M`` (S, K, d), padded with zero
    columns to the largest dimension of the batch: (S, d, p)."""
    _, s, vt = np.linalg.svd(M, full_matrices=False)
    keep = s > s[:, :1] * max(M.shape[1:]) * np.finfo(float).eps
    width = max(int(keep.sum(axis=1).max(initial=0)), 1)
    return np.swapaxes(vt * keep[:, :, None], -1, -2)[:, :, :width]


def _certify(a, z, W, lower_fn, norm: str, gap_tol: float):
    """Rescale ``W`` (S, d, d_z) to be exactly feasible; upper bound, lower bound, gap, certified."""
    v = np.einsum("skd,sde,ske->sk", a, W, z).min(axis=1)
    ok = np.isfinite(v) & (v > 0)
    W = np.where(ok[:, None, None], W / np.where(ok, v, 1.0)[:, None, None], np.nan)
    with np.errstate(invalid="ignore"):
        sv = np.linalg.svd(np.nan_to_num(W), compute_uv=False)
    upper = np.where(ok, sv.sum(1) if norm == "nuc" else np.sqrt((sv**2).sum(1)), np.nan)
    lower = lower_fn()
    gap = (upper - lower) / upper
    certified = ok & (gap <= gap_tol)
    W[~certified] = np.nan
    return W, upper, lower, gap, certified


def _apply_inverse(Li: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``(L Lᵀ)⁻¹ v`` from ``Li = L⁻¹`` (S, K, K), ``v`` (S, K, c): two products, never ``(LLᵀ)⁻¹`` itself."""
    return np.swapaxes(Li, -1, -2) @ (Li @ v)


def frobenius_svm_batch(a, z, tol: float = 1e-13, max_iter: int = 60) -> SVMBatch:
    """Frobenius-norm W-SVMs ``W_mm = argmin ‖W‖_F s.t. a_kᵀ W z_k ≥ 1`` of S instances at once.

    ``W_mm = p/‖p‖²`` with ``p`` the point of the convex hull of the ``D_k = a_k z_kᵀ`` nearest to 0
    (hard-margin SVM through the origin); the hull contains 0 exactly when the SVM is infeasible. A
    primal–dual interior-point method (Mehrotra) solves ``min ½ λᵀGλ`` over the simplex
    (``G_kl = (a_k·a_l)(z_k·z_l)``, K×K per instance, all instances in one batch, finished ones
    dropped from it). An active-set polish then solves ``G_AA μ_A = 1`` on the support and keeps it
    when the KKT conditions hold, so the zeros of ``W = Σ μ_k D_k`` are exact to rounding.

    Certificate: ``W`` rescaled to be exactly feasible is an upper bound on ``‖W_mm‖_F``; any ``λ ≥ 0``
    gives the lower bound ``1ᵀλ/‖Σλ_k D_k‖_F`` (weak duality, best scaling). ``certified`` when the
    relative gap is at most ``100·tol`` (or 1e-10). An instance without a feasible ``W`` (0 in the hull,
    up to rounding) comes back uncertified: decide it with an LP.

    Args: ``a`` (S, K, d), ``z`` (S, K, d_z) as in :func:`svm_constraints`.

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.random_tokens(4, 5, 6, seed=0, queries="cross")
    >>> a, z = al.svm_constraints(*prob.factors, prob.opt)
    >>> sol = al.frobenius_svm_batch(a[None], z[None])
    >>> bool(sol.certified[0]), bool(np.allclose(sol.W[0], al.max_margin(prob).theta, atol=1e-10))
    (True, True)
    """
    a, z = np.asarray(a, float), np.asarray(z, float)
    S, K, _ = a.shape
    G = (a @ np.swapaxes(a, 1, 2)) * (z @ np.swapaxes(z, 1, 2))
    scale = np.maximum(np.einsum("skk->s", G) / K, 1e-300)
    Gs = G / scale[:, None, None]  # unit mean diagonal
    lam, s, nu = np.full((S, K), 1.0 / K), np.ones((S, K)), np.zeros(S)
    done = np.zeros(S, bool)
    it = 0
    while it < max_iter and not done.all():
        it += 1
        act = np.nonzero(~done)[0]
        Ga, la, sa, na = Gs[act], lam[act], s[act], nu[act]
        rd = np.einsum("skl,sl->sk", Ga, la) - na[:, None] - sa
        re = 1.0 - la.sum(1)
        mu = np.sum(la * sa, 1) / K
        value = np.einsum("sk,skl,sl->s", la, Ga, la)
        # converged (relative to the squared distance), or the distance is 0 to rounding (infeasible)
        stop = (mu <= tol * value) & (np.abs(rd).max(1) <= 100 * tol) & (np.abs(re) <= 100 * tol)
        stop |= (value <= 1e-14) & (mu <= 1e-15)
        fail = np.zeros(act.size, bool)
        Li = _triangular_inverse(_cholesky_or_stop(Ga + (sa / la)[:, :, None] * np.eye(K), fail))
        done[act[stop | fail]] = True
        one = _apply_inverse(Li, np.ones((act.size, K, 1)))[..., 0]

        def direction(comp, Li=Li, rd=rd, re=re, la=la, sa=sa, one=one):
            # G Δλ − Δν 1 − Δs = −r_d, 1ᵀΔλ = r_e, s∘Δλ + λ∘Δs = comp
            h = _apply_inverse(Li, (-rd + comp / la)[..., None])[..., 0]
            dn = (re - h.sum(1)) / one.sum(1)
            dl = h + dn[:, None] * one
            return dl, dn, (comp - sa * dl) / la

        dl, dn, ds = direction(-la * sa)
        al_ = np.minimum(_max_step_pos(la, dl), _max_step_pos(sa, ds))
        mu_aff = np.sum((la + al_[:, None] * dl) * (sa + al_[:, None] * ds), 1) / K
        sigma = np.clip(mu_aff / np.maximum(mu, 1e-300), 0, 1) ** 3
        dl, dn, ds = direction((sigma * mu)[:, None] - la * sa - dl * ds)
        step = np.minimum(1.0, 0.99 * np.minimum(_max_step_pos(la, dl), _max_step_pos(sa, ds)))
        step = np.where(stop | fail, 0.0, step)
        lam[act], s[act], nu[act] = la + step[:, None] * dl, sa + step[:, None] * ds, na + step * dn
    # active-set polish: G_AA μ_A = 1 on the support, kept where μ_A > 0 and (Gμ)_k ≥ 1 off it
    eye = np.eye(K)
    active = lam > s
    Hp = np.where(active[:, :, None] & active[:, None, :], Gs, 0.0) + (~active)[:, :, None] * eye
    with np.errstate(all="ignore"):
        try:
            mp = np.linalg.solve(Hp, active.astype(float)[..., None])[..., 0]
        except np.linalg.LinAlgError:
            mp = np.full_like(lam, np.nan)
        vals = np.einsum("skl,sl->sk", Gs, mp)
        good = np.all(np.where(active, mp > 0, vals >= 1 - 1e-9), axis=1) & np.all(np.isfinite(mp), axis=1)
        lam = np.where(good[:, None], mp, lam) / scale[:, None]
    W = np.einsum("skd,sk,ske->sde", a, lam, z)

    def lower():
        with np.errstate(divide="ignore", invalid="ignore"):
            return lam.sum(1) / np.linalg.norm(W, axis=(1, 2))

    W, upper, low, gap, cert = _certify(a, z, W, lower, "fro", max(100 * tol, 1e-10))
    return SVMBatch(W, upper, low, gap, cert, it)


def nuclear_svm_batch(a, z, tol: float = 1e-10, max_iter: int = 80) -> SVMBatch:
    """Nuclear-norm W-SVMs ``W*_mm = argmin ‖W‖_* s.t. a_kᵀ W z_k ≥ 1`` of S instances at once [TFSVM].

    A primal–dual interior-point method (HKM direction, Mehrotra predictor–corrector) on the SDP pair

    .. math::

        \\max_{λ ≥ 0} \\sum_k λ_k \\ \\text{s.t.}\\ \\begin{pmatrix} I_p & S(λ) \\\\ S(λ)^⊤ & I_r \\end{pmatrix} ⪰ 0,
        \\quad S(λ) = \\sum_k λ_k ã_k z̃_k^⊤;
        \\qquad \\min \\operatorname{tr} Y \\ \\text{s.t.}\\ 2ã_k^⊤ Y_{12} z̃_k ≥ 1,\\ Y ⪰ 0,

    in the span of the constraints (``ã_k``, ``z̃_k``: coordinates in orthonormal bases of the spans of
    the ``a_k`` and of the ``z_k``; ``W = 2 Q_U Y_{12} Q_Vᵀ``). Every constraint matrix has rank two,
    ``u_k w_kᵀ + w_k u_kᵀ`` with ``u_k = (ã_k, 0)``, ``w_k = (0, z̃_k)``, so the Newton (Schur complement)
    matrix ``M_kl = tr(A_k Y A_l F⁻¹)`` is a sum of four Hadamard products of K×K matrices
    (``(w_kᵀYu_l)(w_lᵀF⁻¹u_k) + …``): each step costs a few K×K and (p+r)² operations per instance,
    never the dense ((p+r)(p+r+1)/2)² cone block that a generic conic solver factorises.

    Certificate per instance: ``W`` rescaled to be exactly feasible gives the upper bound ``‖W‖_*``;
    ``λ/max(1, ‖S(λ)‖_op)`` is dual feasible, so its sum is a lower bound; ``certified`` when their
    relative gap is at most ``100·tol``. Every instance must be feasible (decide it first, e.g. with
    :func:`frobenius_svm_batch` and an LP).

    Args: ``a`` (S, K, d), ``z`` (S, K, d_z) as in :func:`svm_constraints`.

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.random_tokens(4, 5, 6, seed=0, queries="cross")
    >>> a, z = al.svm_constraints(*prob.factors, prob.opt)
    >>> sol = al.nuclear_svm_batch(a[None], z[None])
    >>> ref = al.max_margin(prob, norm="nuc")
    >>> bool(sol.certified[0]), bool(np.isclose(sol.norm[0], 1 / ref.margin, rtol=1e-7))
    (True, True)
    """
    a, z = np.asarray(a, float), np.asarray(z, float)
    S, K, _ = a.shape
    QU, QV = _span_bases(a), _span_bases(z)
    at, zt = a @ QU, z @ QV  # (S, K, p), (S, K, r)
    p, r = at.shape[2], zt.shape[2]
    N = p + r

    def T(B):
        return np.swapaxes(B, -1, -2)

    def S_of(lam, at=at, zt=zt):  # S(λ) = Σ_k λ_k ã_k z̃_kᵀ: (S, p, r)
        return T(at * lam[:, :, None]) @ zt

    def off(Sl):  # [[0, Sl], [Slᵀ, 0]]
        B = np.zeros((len(Sl), N, N))
        B[:, :p, p:], B[:, p:, :p] = Sl, T(Sl)
        return B

    def A_of(B, b_nn, at, zt):  # A_k(B) = 2 ã_kᵀ B12 z̃_k − b_k (B symmetric)
        return 2.0 * np.sum((at @ B[:, :p, p:]) * zt, axis=2) - b_nn

    eye_K, eye_N = np.eye(K), np.eye(N)
    s1 = np.linalg.norm(S_of(np.ones((S, K))), ord=2, axis=(1, 2))
    lam = np.repeat((0.5 / np.maximum(s1, 1e-300))[:, None], K, 1)
    Y, x = np.repeat(eye_N[None], S, 0), np.ones((S, K))
    Z = eye_N - off(S_of(lam))
    done = np.zeros(S, bool)
    it = 0
    while it < max_iter and not done.all():
        it += 1
        act = np.nonzero(~done)[0]  # finished instances leave the batch
        a_, z_, Ya, xa, Za, la = at[act], zt[act], Y[act], x[act], Z[act], lam[act]
        rp = 1.0 - A_of(Ya, xa, a_, z_)
        mu = (np.einsum("sij,sij->s", Ya, Za) + np.sum(xa * la, 1)) / (N + K)
        primal, dual = np.trace(Ya, axis1=1, axis2=2), la.sum(1)
        # converged, or stalled at rounding (the certificate below judges the result either way)
        stop = (np.abs(primal - dual) <= tol * (1 + dual)) & (np.abs(rp).max(1) <= 10 * tol)
        stop |= mu <= 1e-14 * (1 + dual)
        LY, LZ = _inverse_cholesky(Ya, stop), _inverse_cholesky(Za, stop)
        P = T(LZ) @ LZ  # Z⁻¹
        XUU, XWW, XWU = a_ @ Ya[:, :p, :p] @ T(a_), z_ @ Ya[:, p:, p:] @ T(z_), z_ @ Ya[:, p:, :p] @ T(a_)
        PUU, PWW, PWU = a_ @ P[:, :p, :p] @ T(a_), z_ @ P[:, p:, p:] @ T(z_), z_ @ P[:, p:, :p] @ T(a_)
        M = XWU * T(PWU) + XWW * PUU + XUU * PWW + T(XWU) * PWU + (xa / la)[:, :, None] * eye_K
        M[stop] = eye_K
        # M grows like 1/μ: apply L⁻¹ and L⁻ᵀ in turn, never an explicit M⁻¹
        Li = _triangular_inverse(_cholesky_or_stop(M, stop))
        done[act[stop]] = True

        def direction(R, R_nn, stop=stop, rp=rp, a_=a_, z_=z_, Li=Li, Ya=Ya, P=P, xa=xa, la=la):
            # ΔX + sym(X ΔZ P) = R, A(ΔX) = r_p, ΔZ = −Aᵀ Δλ
            rhs = np.where(stop[:, None], 0.0, rp - A_of(R, R_nn, a_, z_))
            dl = _apply_inverse(Li, rhs[..., None])[..., 0]
            dZ = -off(S_of(dl, a_, z_))
            return R - _sym(Ya @ dZ @ P), R_nn - xa * dl / la, dZ, dl

        # predictor: step lengths from a cheap eigenvalue bound (they only set the centring σ)
        dY, dx, dZ, dl = direction(-Ya, -xa)
        ap = np.minimum(_psd_step(LY, dY, stop, exact=False), _max_step_pos(xa, dx))
        ad = np.minimum(_psd_step(LZ, dZ, stop, exact=False), _max_step_pos(la, dl))
        mu_aff = (
            np.einsum("sij,sij->s", Ya + ap[:, None, None] * dY, Za + ad[:, None, None] * dZ)
            + np.sum((xa + ap[:, None] * dx) * (la + ad[:, None] * dl), 1)
        ) / (N + K)
        sm = (np.clip(mu_aff / np.maximum(mu, 1e-300), 0, 1) ** 3 * mu)[:, None]
        R = sm[:, :, None] * P - Ya - _sym(dY @ dZ @ P)
        dY, dx, dZ, dl = direction(R, sm / la - xa - dx * dl / la)
        ap = np.minimum(1.0, 0.98 * np.minimum(_psd_step(LY, dY, stop), _max_step_pos(xa, dx)))
        ad = np.minimum(1.0, 0.98 * np.minimum(_psd_step(LZ, dZ, stop), _max_step_pos(la, dl)))
        ap, ad = np.where(stop, 0.0, ap), np.where(stop, 0.0, ad)
        Y[act], x[act] = Ya + ap[:, None, None] * dY, xa + ap[:, None] * dx
        Z[act], lam[act] = Za + ad[:, None, None] * dZ, la + ad[:, None] * dl
    W = 2.0 * QU @ Y[:, :p, p:] @ T(QV)

    def lower():
        return lam.sum(1) / np.maximum(1.0, np.linalg.norm(S_of(lam), ord=2, axis=(1, 2)))

    W, upper, low, gap, cert = _certify(a, z, W, lower, "nuc", 100 * tol)
    return SVMBatch(W, upper, low, gap, cert, it)


# ---------------------------------------------------------------------------------------- rank grid
#: The official [TFSVM] rank-versus-d grid (``svm_rank``): (n, T) pairs, token dimensions, seeds.
OFFICIAL_RANK_GRID = dict(
    configs=((5, 5), (10, 5), (15, 5), (5, 10), (5, 15)), ds=(1, 2, 3, 4, 5, 10, 15, 20), seeds=100
)


def rank_instance(n: int, T: int, d: int, seed: int):
    """The rank grid's data: unit tokens, unit decoder ``u``, labels ±1, unit cross-attention queries.

    The same draws as ``datasets.random_tokens(n, T, d, seed, queries="cross")`` (which needs
    ``d ≥ 2``), also at ``d = 1``. Returns ``X`` (n, T, d), ``y`` (n,), ``u`` (d,), ``Z`` (n, d) and
    ``opt`` (n,) ``argmax_t y_i uᵀx_it`` (the first one on ties, as the official code; ties happen
    only at d = 1, where tied tokens are equal and the SVM is infeasible).
    """
    rng = np.random.default_rng(seed)
    unit = lambda v: v / np.linalg.norm(v, axis=-1, keepdims=True)  # noqa: E731
    X = unit(rng.standard_normal((n, T, d)))
    u = unit(rng.standard_normal(d))
    y = rng.choice([-1.0, 1.0], size=n)
    Z = unit(rng.standard_normal((n, d)))
    return X, y, u, Z, np.argmax(y[:, None] * (X @ u), axis=1)


def numerical_rank(singular_values, tol: float) -> np.ndarray:
    """Number of singular values above ``tol`` times the largest: (*batch,); ``-1`` where NaN (infeasible).

    Args: ``singular_values`` (*batch, k), sorted decreasingly (NaN rows for infeasible instances).
    """
    s = np.asarray(singular_values, float)
    rank = np.sum(s > tol * s[..., :1], axis=-1)
    return np.where(np.isnan(s[..., 0]), -1, rank)


def _feasible(a: np.ndarray, z: np.ndarray) -> bool:
    """Is ``{W : a_kᵀ W z_k ≥ 1 ∀k}`` non-empty? An LP (HiGHS), certified either way."""
    from scipy.optimize import linprog

    G = (a[:, :, None] * z[:, None, :]).reshape(len(a), -1)
    res = linprog(np.zeros(G.shape[1]), A_ub=-G, b_ub=-np.ones(len(G)), bounds=(None, None), method="highs")
    if res.status not in (0, 2):
        raise RuntimeError(f"feasibility LP failed: {res.message}")
    return res.status == 0


def _frobenius_clarabel(a: np.ndarray, z: np.ndarray) -> np.ndarray | None:
    """``W_mm`` of one instance by Clarabel (QP ``min ½‖W‖² s.t. a_kᵀ W z_k ≥ 1``); None if infeasible."""
    import clarabel
    from scipy import sparse

    G = (a[:, :, None] * z[:, None, :]).reshape(len(a), -1)
    settings = clarabel.DefaultSettings()
    settings.verbose = False
    settings.tol_gap_abs = settings.tol_gap_rel = settings.tol_feas = 1e-12
    solver = clarabel.DefaultSolver(
        sparse.identity(G.shape[1], format="csc"),
        np.zeros(G.shape[1]),
        sparse.csc_matrix(-G),
        -np.ones(len(G)),
        [clarabel.NonnegativeConeT(len(G))],
        settings,
    )
    sol = solver.solve()
    if "Infeasible" in str(sol.status):
        return None
    if "Solved" not in str(sol.status):
        raise RuntimeError(f"Frobenius SVM: Clarabel returned {sol.status}")
    return np.asarray(sol.x).reshape(a.shape[1], z.shape[1])


def svm_pair_batch(a, z):
    """Frobenius and nuclear W-SVMs of S instances, certified, infeasible ones decided by an LP.

    :func:`frobenius_svm_batch` first: a certified solution proves feasibility. An instance without
    one is decided by the LP (HiGHS); the rare one the LP calls feasible but a batched solve did not
    certify is solved by Clarabel per instance (QP, or the SDP of :func:`nuclear_svm`) and counted in
    ``fallbacks``. :func:`nuclear_svm_batch` solves the feasible ones.

    Args: ``a`` (S, K, d), ``z`` (S, K, d_z) as in :func:`svm_constraints`.
    Returns: ``W`` (2, S, d, d_z) Frobenius and nuclear solutions (NaN if infeasible), ``gaps`` (2, S)
    certified relative optimality gaps, ``feasible`` (S,) bool, ``fallbacks`` int.

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.random_tokens(4, 5, 6, seed=0, queries="cross")
    >>> a, z = al.svm_constraints(*prob.factors, prob.opt)
    >>> W, gaps, feasible, fallbacks = al.svm_pair_batch(a[None], z[None])
    >>> W.shape, bool(feasible[0]), bool(gaps.max() < 1e-8), fallbacks
    ((2, 1, 6, 6), True, True, 0)
    """
    a, z = np.asarray(a, float), np.asarray(z, float)
    S = len(a)
    W = np.full((2, S, a.shape[2], z.shape[2]), np.nan)
    gaps = np.full((2, S), np.nan)
    fro = frobenius_svm_batch(a, z)
    feasible = fro.certified.copy()
    for j in np.nonzero(~fro.certified)[0]:
        feasible[j] = not np.any(np.all(a[j] == 0, axis=1)) and _feasible(a[j], z[j])
    W[0], gaps[0] = fro.W, fro.gap
    idx = np.nonzero(fro.certified)[0]
    if idx.size:
        nuc = nuclear_svm_batch(a[idx], z[idx])
        W[1, idx], gaps[1, idx] = nuc.W, nuc.gap
    fallbacks = 0
    for j in np.nonzero(feasible & ~(np.isfinite(W[0, :, 0, 0]) & np.isfinite(W[1, :, 0, 0])))[0]:
        fallbacks += 1
        f, ref = _frobenius_clarabel(a[j], z[j]), _nuclear_clarabel(a[j], z[j])
        if f is None or not ref.feasible:
            raise RuntimeError(f"the LP and Clarabel disagree on the feasibility of instance {j}")
        W[0, j], W[1, j], gaps[:, j] = f, ref.W, (np.nan, max(ref.gap, ref.violation))
    W[:, ~feasible] = np.nan
    return W, gaps, feasible, fallbacks


def _rank_cell(args):
    """Every seed of one (n, T, d) cell: both SVMs (:func:`svm_pair_batch`), their spectra."""
    n, T, d, seeds = args
    cpu = time.process_time()
    cons = [svm_constraints(X, Z, opt) for X, _, _, Z, opt in (rank_instance(n, T, d, s) for s in seeds)]
    W, gaps, feasible, fallbacks = svm_pair_batch(np.stack([c[0] for c in cons]), np.stack([c[1] for c in cons]))
    sv = np.full((2, len(seeds), d), np.nan)
    sv[:, feasible] = np.linalg.svd(W[:, feasible], compute_uv=False)
    return sv, gaps, fallbacks, W, time.process_time() - cpu


@dataclass(frozen=True, eq=False)
class RankGrid:
    """Ranks of the Frobenius and nuclear W-SVMs over (n, T) × d × seeds [TFSVM ``svm_rank``].

    Attributes:
        configs: the (n, T) pairs.  ds: token dimensions.  seeds: (S,) seeds.
        singular_values: (2, C, D, S, max d) of ``W_mm`` (index 0, Frobenius) and ``W*_mm`` (1, nuclear),
            divided by the largest; NaN for infeasible instances.
        feasible: (C, D, S) bool: a certified feasible ``W`` (the batched Frobenius solve), else the LP's verdict.
        accuracy: (2, C, D, S) certified relative optimality gaps ``(‖W‖ − lower)/‖W‖`` of the Frobenius
            and the nuclear solutions (both exactly feasible); NaN for infeasible instances.
        fallbacks: feasible instances a batched solver did not certify, solved per instance instead.
        seconds: wall-clock of the whole grid.  processes: worker processes used.
        solutions: (2, C, D, S, max d, max d) ``W_mm`` and ``W*_mm`` (zero-padded; NaN if infeasible).
        cpu_seconds: CPU time of the cells, summed over the worker processes (wall-clock on a loaded
            machine overstates the work; this does not).
    """

    configs: tuple
    ds: tuple
    seeds: np.ndarray
    singular_values: np.ndarray
    feasible: np.ndarray
    accuracy: np.ndarray
    fallbacks: int
    seconds: float
    processes: int
    solutions: np.ndarray
    cpu_seconds: float

    def ranks(self, tol: float) -> np.ndarray:
        """(2, C, D, S) numerical ranks at relative threshold ``tol``; ``-1`` for infeasible instances."""
        return numerical_rank(self.singular_values, tol)

    def trained_kq_spectra(self, steps: int, lr: float = 0.1, normalize: str = "separate", seed: int = 0):
        """Singular values of ``K Qᵀ`` trained on every feasible instance (:func:`train_kq_grid`), divided
        by the largest: (C, D, S, max d), NaN for infeasible instances (not trained)."""
        W = train_kq_grid(self.configs, self.ds, self.seeds, steps, lr, normalize, seed, mask=self.feasible)
        sv = np.linalg.svd(np.nan_to_num(W), compute_uv=False)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.feasible[..., None], sv / sv[..., :1], np.nan)

    def mean_rank(self, tol: float) -> np.ndarray:
        """(2, C, D) mean rank over the *feasible* instances only (NaN where none is feasible)."""
        r = self.ranks(tol).astype(float)
        r[r < 0] = np.nan
        count = np.sum(~np.isnan(r), axis=-1)
        return np.where(count > 0, np.nansum(r, axis=-1) / np.maximum(count, 1), np.nan)


def svm_rank_grid(configs=None, ds=None, seeds=None, processes: int = 1) -> RankGrid:
    """The [TFSVM] rank-versus-d grid, infeasible instances counted apart (never as a rank).

    For every (n, T) in ``configs``, d in ``ds`` and seed: the data of :func:`rank_instance`, the
    global selection, ``W_mm`` (Frobenius, :func:`frobenius_svm_batch`) and ``W*_mm`` (nuclear,
    :func:`nuclear_svm_batch`), all seeds of a cell in one batch, each solution certified (exactly
    feasible, relative optimality gap in ``accuracy``), and their spectra. An instance without a
    feasible Frobenius solution is decided by an LP (HiGHS).
    Defaults: :data:`OFFICIAL_RANK_GRID` (5 × 8 × 100 instances, 2 SVMs each). ``processes > 1``
    spreads the (n, T, d) cells over a process pool.

    >>> import attnlib as al
    >>> grid = al.svm_rank_grid(configs=[(5, 5)], ds=[2, 6], seeds=range(3))
    >>> grid.feasible.shape, grid.ranks(1e-6).shape
    ((1, 2, 3), (2, 1, 2, 3))
    """
    g = OFFICIAL_RANK_GRID
    configs = tuple(tuple(int(v) for v in c) for c in (g["configs"] if configs is None else configs))
    ds = tuple(int(d) for d in (g["ds"] if ds is None else ds))
    seeds = np.arange(g["seeds"]) if seeds is None else np.asarray(list(seeds), int)
    if not configs or not ds or seeds.size == 0 or min(ds) < 1 or min(min(c) for c in configs) < 1:
        raise ValueError(f"configs, ds and seeds must be non-empty with positive sizes, got {configs}, {ds}, {seeds}")
    start = time.perf_counter()
    jobs = [(n, T, d, seeds.tolist()) for n, T in configs for d in ds]
    if processes > 1:
        import multiprocessing as mp

        with mp.get_context("fork").Pool(processes) as pool:
            cells = pool.map(_rank_cell, sorted(jobs, key=lambda j: -j[0] * j[1] * j[2] ** 2), chunksize=1)
        order = {tuple(j[:3]): c for j, c in zip(sorted(jobs, key=lambda j: -j[0] * j[1] * j[2] ** 2), cells)}
        cells = [order[tuple(j[:3])] for j in jobs]
    else:
        cells = [_rank_cell(j) for j in jobs]
    C, D, S, dmax = len(configs), len(ds), len(seeds), max(ds)
    sv = np.full((2, C, D, S, dmax), np.nan)
    acc = np.full((2, C, D, S), np.nan)
    sol = np.zeros((2, C, D, S, dmax, dmax))
    for idx, (s, a, _, W, _) in enumerate(cells):
        c, k = divmod(idx, D)
        sv[:, c, k, :, : s.shape[-1]] = s
        acc[:, c, k] = a
        sol[:, c, k, :, : W.shape[-2], : W.shape[-1]] = W
    feasible = ~np.isnan(sv[0, ..., 0])
    sv = sv / sv[..., :1]
    fallbacks = int(sum(c[2] for c in cells))
    cpu = float(sum(c[4] for c in cells))
    return RankGrid(configs, ds, seeds, sv, feasible, acc, fallbacks, time.perf_counter() - start, processes, sol, cpu)


def train_kq_grid(
    configs, ds, seeds, steps: int, lr: float = 0.1, normalize: str = "separate", seed: int = 0, mask=None
):
    """Train ``(K, Q)`` on every instance of a rank grid; the final products ``W = K Qᵀ`` (zero-padded).

    For each (n, T) in ``configs``, d in ``ds`` and data seed: the data of :func:`rank_instance`,
    NGD on ``(K, Q)`` (:func:`train_kq`, ``m = d``) from :func:`kq_init` (``seed``) for ``steps`` steps.
    All d of one (n, T) train as one batch: tokens, decoder, queries and factors are padded with zeros
    to ``max(ds)``, which leaves the run unchanged up to rounding (the padded rows of ``K`` and ``Q`` get
    zero gradient and stay 0).

    ``mask`` (C, D, S) bool, optional: train only these instances (e.g. ``RankGrid.feasible``).

    Returns: (C, D, S, max d, max d) final products, zero outside the top-left d × d block; NaN for an
    instance left out by ``mask`` or with tied best tokens (no problem to train; only at d = 1).

    >>> import numpy as np, attnlib as al
    >>> W = al.train_kq_grid([(4, 3)], [2, 3], range(2), steps=5)
    >>> W.shape, bool(np.all(W[0, 0, :, 2:, :] == 0))
    ((1, 2, 2, 3, 3), True)
    """
    configs = tuple(tuple(int(v) for v in c) for c in configs)
    ds, seeds = tuple(int(d) for d in ds), [int(s) for s in seeds]
    dmax, S = max(ds), len(seeds)
    out = np.full((len(configs), len(ds), S, dmax, dmax), np.nan)
    for c, (n, T) in enumerate(configs):
        probs, index, K0, Q0 = [], [], [], []
        for k, d in enumerate(ds):
            K, Q = kq_init(S, d, d, seed=seed)
            for j, s in enumerate(seeds):
                if mask is not None and not mask[c][k][j]:
                    continue
                X, y, u, Z, _ = rank_instance(n, T, d, s)
                pad = ((0, 0), (0, dmax - d))
                try:
                    probs.append(self_attention(np.pad(X, ((0, 0),) + pad), y, np.pad(u, pad[1]), np.pad(Z, pad)))
                except ValueError:  # tied best tokens (only at d = 1): no problem to train, left NaN
                    continue
                index.append((k, j))
                K0.append(np.pad(K[j], ((0, dmax - d), (0, dmax - d))))
                Q0.append(np.pad(Q[j], ((0, dmax - d), (0, dmax - d))))
        if not probs:
            continue
        traj = train_kq(ProblemStack(tuple(probs)), np.array(K0), np.array(Q0), steps, "ngd", lr,
                        normalize=normalize, record_steps=[steps])  # fmt: skip
        k, j = np.array(index).T
        out[c, k, j] = traj.final
    return out


# ------------------------------------------------------------------- the local-convergence experiment
@dataclass(frozen=True, eq=False)
class LocalConvergence:
    """[TFSVM]'s local-convergence experiment: ``W`` and ``(K, Q)`` trained on the same S problems.

    Keys ``"W"`` (W trained directly, from 0) and ``"KQ"`` (the product ``K Qᵀ``).

    Attributes:
        steps: (R,) recorded steps.
        W: ``{kind: (R, S, d, d_z)}`` the trained matrix at the recorded steps.
        select: ``{kind: (S, n)}`` the final selection ``α̂`` of every problem.
        svms: ``{kind: (2, S, d, d_z)}`` the Frobenius (0) and nuclear (1) W-SVMs of ``α̂``
            (:func:`svm_pair_batch`); NaN where infeasible.
        feasible: ``{kind: (S,)}`` bool.
        seconds: wall-clock of ``train_W``, ``svm_W``, ``train_KQ``, ``svm_KQ`` (each inside its
            process) and ``total``.
        processes: 1, or 2 when the two halves ran in two processes at once.
    """

    steps: np.ndarray
    W: dict
    select: dict
    svms: dict
    feasible: dict
    seconds: dict
    processes: int


def _local_half(kind, stack, steps, lr, record, K0, Q0, normalize):
    """One half of :func:`local_convergence`: train, select, both SVMs; picklable for a worker."""
    t0 = time.perf_counter()
    if kind == "W":
        W = train(stack, np.zeros(stack.shape), steps, "ngd", lr, record_steps=record, progress=False).theta
    else:
        W = train_kq(stack, K0, Q0, steps, "ngd", lr, normalize=normalize, record_steps=record).W
    t1 = time.perf_counter()
    select = stack.selection(W[-1])  # (S, n), every problem at once
    cons = [svm_constraints(*p.factors, a) for p, a in zip(stack.problems, select)]
    svms, _, feasible, _ = svm_pair_batch(np.stack([c[0] for c in cons]), np.stack([c[1] for c in cons]))
    return W, select, svms, feasible, t1 - t0, time.perf_counter() - t1


_FORKED_HALVES: dict = {}


def _forked_half(kind):
    return _local_half(*_FORKED_HALVES[kind])


def local_convergence(
    problems,
    steps: int,
    lr: float = 0.1,
    kq_normalize: str = "separate",
    kq_seed=0,
    record_steps=None,
    processes: int = 1,
) -> LocalConvergence:
    """[TFSVM]'s local-convergence experiment: NGD on ``W`` (from 0) and on ``(K, Q)`` (from
    :func:`kq_init`, ``m = d``), then the final selections and their two W-SVMs.

    Args:
        problems: S self-attention problems of one size (e.g. ``datasets.random_tokens(…, queries="cross")``),
            or their :class:`~attnlib.ProblemStack`.
        steps, lr: NGD iterations and step size (both halves).  kq_normalize: "separate" (each factor
            by its own gradient norm, as the official code) or "joint" (:func:`train_kq`).
        kq_seed: seed of the (K, Q) initialisation.  record_steps: steps to record (default: the last).
        processes: 1, or 2 to run the (K, Q) half in a second process while this one runs the W half
            (the two halves are independent; the results are the same).

    >>> import attnlib as al
    >>> probs = [al.datasets.random_tokens(4, 5, 6, seed=s, queries="cross") for s in range(3)]
    >>> run = al.local_convergence(probs, steps=20)
    >>> run.W["KQ"].shape, run.svms["W"].shape
    ((1, 3, 6, 6), (2, 3, 6, 6))
    """
    if processes not in (1, 2):
        raise ValueError(f"processes must be 1 or 2 (one per half), got {processes!r}")
    start = time.perf_counter()
    stack = problems if isinstance(problems, ProblemStack) else ProblemStack(tuple(problems))
    if stack.factors is None or len(stack.shape) != 2:
        raise ValueError(
            "problems must be self-attention problems (rank-one features x_it z_iᵀ, e.g. from self_attention)"
        )
    check_schedule(steps, lr, 1)
    record = record_schedule(steps, record_steps=[steps] if record_steps is None else record_steps)
    K0, Q0 = kq_init(stack.S, *stack.shape, seed=kq_seed)
    args = {kind: (kind, stack, steps, lr, record, K0, Q0, kq_normalize) for kind in ("W", "KQ")}
    if processes == 2:
        import multiprocessing as mp

        # The worker is forked after the arguments are in place, so they need no pickling (a
        # problem's loss holds lambdas); only the results travel back.
        _FORKED_HALVES.update(args)
        try:
            with mp.get_context("fork").Pool(1) as pool:
                pending = pool.apply_async(_forked_half, ("KQ",))
                halves = {"W": _local_half(*args["W"]), "KQ": pending.get()}
        finally:
            _FORKED_HALVES.clear()
    else:
        halves = {kind: _local_half(*args[kind]) for kind in ("W", "KQ")}
    seconds = {f"{what}_{kind}": halves[kind][k] for kind in halves for k, what in ((4, "train"), (5, "svm"))}
    seconds["total"] = time.perf_counter() - start
    return LocalConvergence(
        steps=record,
        W={k: h[0] for k, h in halves.items()},
        select={k: h[1] for k, h in halves.items()},
        svms={k: h[2] for k, h in halves.items()},
        feasible={k: h[3] for k, h in halves.items()},
        seconds=seconds,
        processes=processes,
    )
