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
initialisations or a :class:`~attnlib.ProblemStack`), a fast exact nuclear-norm SVM for the
self-attention features (:func:`nuclear_svm`: the SDP reduced to the span of the constraints and
solved by Clarabel directly), and the [TFSVM] rank-versus-d grid (:func:`svm_rank_grid`) with
infeasible instances counted apart, never as a rank.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .model import ProblemStack, TokenSelectionProblem, self_attention
from .optim import BatchRecord, Stop, check_schedule, record_schedule, step_rule
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
    for k in range(int(record[-1]) + 1):
        W = K @ np.swapaxes(Q, 1, 2)
        with np.errstate(over="ignore", invalid="ignore"):
            log_scale, gW = prob.scaled_grad(W)
            gK, gQ = factor_grad(gW, K, Q)  # ∇_{K,Q} L = exp(log_scale) · (gK, gQ)
        nK, nQ = np.sqrt((gK * gK).sum(axis=(1, 2))), np.sqrt((gQ * gQ).sum(axis=(1, 2)))
        g_norm = np.sqrt(nK**2 + nQ**2)
        with np.errstate(divide="ignore", invalid="ignore"):
            log_gn = log_scale + np.log(g_norm)
        need_gap = k == record[r] or rule.needs_loss
        log_gap = prob.log_gap(W) if need_gap else None
        if k == record[r]:
            out_K[r], out_Q[r], out_gap[r], out_gn[r] = K, Q, log_gap, log_gn
            out_loss[r] = prob.value(W)
            out_sec[r] = time.perf_counter() - start
            r += 1
        if k == record[-1]:
            break
        finite = np.isfinite(K).all(axis=(1, 2)) & np.isfinite(Q).all(axis=(1, 2)) & np.isfinite(g_norm)
        bad = active & ~(finite & ~np.isnan(log_scale))
        zero = active & ~bad & ((g_norm == 0) | np.isneginf(log_scale))
        for mask, why in ((bad, "non-finite value"), (zero, "gradient is exactly zero")):
            stop_step[mask], stop_reason[mask] = k, why
            active &= ~mask
        safe = lambda x: np.where(x > 0, x, 1.0)[:, None, None]  # noqa: E731
        if method == "ngd" and normalize == "separate":
            mK = np.where(nK > 0, lr, 0.0)[:, None, None] * gK / safe(nK)
            mQ = np.where(nQ > 0, lr, 0.0)[:, None, None] * gQ / safe(nQ)
        else:
            length = rule.lengths(np.full(B, float(lr)), log_gn, log_gap)
            unit = 1.0 / safe(g_norm)
            mK, mQ = length[:, None, None] * gK * unit, length[:, None, None] * gQ * unit
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
    import clarabel
    from scipy import sparse

    a, z = svm_constraints(X, Z, select)
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


def _rank_cell(args):
    """Every seed of one (n, T, d) cell: feasibility, Frobenius and nuclear SVMs, their spectra."""
    from .svm import max_margin

    n, T, d, seeds = args
    S = len(seeds)
    sv = np.full((2, S, d), np.nan)
    acc = np.full((3, S), np.nan)  # Frobenius violation, nuclear violation, nuclear relative gap
    disagree = 0
    for j, seed in enumerate(seeds):
        X, y, u, Z, opt = rank_instance(n, T, d, seed)
        a, z = svm_constraints(X, Z, opt)
        if np.any(np.all(a == 0, axis=1)) or not _feasible(a, z):
            disagree += nuclear_svm(X, Z, opt).feasible
            continue
        fro = max_margin(self_attention(X, y, u, Z), opt).theta
        nuc = nuclear_svm(X, Z, opt)
        if not nuc.feasible:
            disagree += 1
            continue
        for row, W in ((0, fro), (1, nuc.W)):
            sv[row, j] = np.linalg.svd(W, compute_uv=False)
        acc[:, j] = max(0.0, 1 - np.einsum("kd,de,ke->k", a, fro, z).min()), nuc.violation, nuc.gap
    return sv, acc, disagree


@dataclass(frozen=True, eq=False)
class RankGrid:
    """Ranks of the Frobenius and nuclear W-SVMs over (n, T) × d × seeds [TFSVM ``svm_rank``].

    Attributes:
        configs: the (n, T) pairs.  ds: token dimensions.  seeds: (S,) seeds.
        singular_values: (2, C, D, S, max d) of ``W_mm`` (index 0, Frobenius) and ``W*_mm`` (1, nuclear),
            divided by the largest; NaN for infeasible instances.
        feasible: (C, D, S) bool (LP verdict).  accuracy: (3, C, D, S) Frobenius constraint violation,
            nuclear constraint violation, nuclear relative duality gap.
        disagreements: instances where the LP and the SDP disagree on feasibility (should be 0).
        seconds: wall-clock of the whole grid.  processes: worker processes used.
    """

    configs: tuple
    ds: tuple
    seeds: np.ndarray
    singular_values: np.ndarray
    feasible: np.ndarray
    accuracy: np.ndarray
    disagreements: int
    seconds: float
    processes: int

    def ranks(self, tol: float) -> np.ndarray:
        """(2, C, D, S) numerical ranks at relative threshold ``tol``; ``-1`` for infeasible instances."""
        return numerical_rank(self.singular_values, tol)

    def mean_rank(self, tol: float) -> np.ndarray:
        """(2, C, D) mean rank over the *feasible* instances only (NaN where none is feasible)."""
        r = self.ranks(tol).astype(float)
        r[r < 0] = np.nan
        count = np.sum(~np.isnan(r), axis=-1)
        return np.where(count > 0, np.nansum(r, axis=-1) / np.maximum(count, 1), np.nan)


def svm_rank_grid(configs=None, ds=None, seeds=None, processes: int = 1) -> RankGrid:
    """The [TFSVM] rank-versus-d grid, infeasible instances counted apart (never as a rank).

    For every (n, T) in ``configs``, d in ``ds`` and seed: the data of :func:`rank_instance`, the
    global selection, feasibility by an LP, ``W_mm`` (Frobenius, exact NNLS through
    :func:`attnlib.max_margin`) and ``W*_mm`` (nuclear, :func:`nuclear_svm`), and their spectra.
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
    acc = np.full((3, C, D, S), np.nan)
    for idx, (s, a, _) in enumerate(cells):
        c, k = divmod(idx, D)
        sv[:, c, k, :, : s.shape[-1]] = s
        acc[:, c, k] = a
    feasible = ~np.isnan(sv[0, ..., 0])
    sv = sv / sv[..., :1]
    return RankGrid(
        configs, ds, seeds, sv, feasible, acc, int(sum(c[2] for c in cells)), time.perf_counter() - start, processes
    )
