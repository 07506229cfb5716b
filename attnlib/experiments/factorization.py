"""Chapter 7, the factorisation ``W = K Qᵀ`` [TFSVM]: the rank-versus-d grid and local convergence.

The trainer (:func:`attnlib.optim.train_kq`) and the SVMs (:func:`attnlib.svm.nuclear_svm`,
:func:`attnlib.svm.svm_pair_batch`, ...) are in the core. This module holds the chapter's
experiments: the [TFSVM] rank-versus-d grid (:func:`svm_rank_grid`) with infeasible instances
counted apart, never as a rank, ``(K, Q)`` trained on every instance of such a grid
(:func:`train_kq_grid`), and the local-convergence experiment of both [TFSVM] halves
(:func:`local_convergence`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial

import numpy as np

from ..datasets import rank_instance
from ..metrics import numerical_rank, rotate_toward
from ..model import ProblemStack, self_attention
from ..optim import (
    check_schedule,
    default_processes,
    kq_init,
    ngd_cross_attention,
    record_schedule,
    run_independent,
    train,
    train_kq,
)
from ..svm import nuclear_svm, svm_constraints, svm_pair_batch

__all__ = [
    "OFFICIAL_RANK_GRID",
    "RankGrid",
    "svm_rank_grid",
    "train_kq_grid",
    "LocalConvergence",
    "local_convergence",
    "angles_degrees",
    "rotate_each",
    "per_seed_resolution",
    "feasibility_construction",
    "rescaled_norm",
    "independent_nuclear_norms",
    "PLANE_FAMILIES",
    "plane_instance",
    "PlanePaths",
    "plane_paths",
]


def angles_degrees(A, B) -> np.ndarray:
    """Angles (degrees) between matching matrices of two stacks (S, d, d') as flattened vectors: (S,).

    >>> import numpy as np
    >>> angles_degrees(np.eye(2)[None], np.array([[[1.0, 1.0], [-1.0, 1.0]]])).round(6).tolist()
    [45.0]
    """
    A, B = np.asarray(A, float), np.asarray(B, float)
    axes = tuple(range(1, A.ndim))
    cos = np.sum(A * B, axis=axes) / (np.linalg.norm(A, axis=axes) * np.linalg.norm(B, axis=axes))
    return np.degrees(np.arccos(np.clip(cos, -1.0, 1.0)))


def rotate_each(references, towards, degrees: float) -> np.ndarray:
    """Every reference of a stack (S, ...) rotated by ``degrees`` toward its own ``towards[s]``
    (:func:`attnlib.metrics.rotate_toward`, one plane per seed).

    >>> import numpy as np
    >>> rotate_each(np.eye(2)[None], np.array([[[0.0, 1.0], [1.0, 0.0]]]), 90.0).round(12).tolist()
    [[[0.0, 1.0], [1.0, 0.0]]]
    """
    return np.stack([rotate_toward(r, t, degrees) for r, t in zip(references, towards, strict=True)])


def per_seed_resolution(passes, references, towards, max_degrees: float = 90.0, tol_degrees: float = 1e-3) -> float:
    """The smallest angle φ (degrees) such that rotating *every* seed's reference by φ toward its own
    ``towards[s]`` (:func:`rotate_each`) makes ``passes(rotated_stack)`` false: the resolution of a
    direction check whose statistic pools seeds (a median). ``inf`` if no φ ≤ ``max_degrees`` is detected;
    raises if the unrotated stack fails. Bisection on φ (the statistic grows with φ for a median of angles).

    >>> import numpy as np
    >>> refs, tow = np.eye(2)[None], np.array([[[0.0, 1.0], [1.0, 0.0]]])
    >>> round(per_seed_resolution(lambda r: angles_degrees(r, refs)[0] <= 5.0, refs, tow), 2)
    5.0
    """
    if not passes(np.asarray(references, float)):
        raise ValueError("the unrotated references fail the check: no resolution to measure")
    if passes(rotate_each(references, towards, max_degrees)):
        return float("inf")
    lo, hi = 0.0, float(max_degrees)
    while hi - lo > tol_degrees:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if passes(rotate_each(references, towards, mid)) else (lo, mid)
    return hi


def feasibility_construction(X, Z, select) -> np.ndarray:
    """The feasible ``W`` of the page's proof that the W-SVM exists when ``d ≥ max(n, T − 1)``.

    Each input's ``T − 1`` key differences ``a_it = x_iα_i − x_it`` are independent, so
    ``b_i = A_i⁺ 1`` gives ``A_i b_i = 1``; the queries ``z_i`` are independent, so ``W = B (Z Zᵀ)⁻¹ Z``
    (``B`` the columns ``b_i``) has ``W z_i = b_i``. Every margin ``a_itᵀ W z_i`` is then exactly 1, and
    ``‖W_mm‖_F ≤ ‖W‖_F``: a certificate of feasibility with a bound on the SVM's norm [TFSVM].

    Args: ``X`` (n, T, d), ``Z`` (n, d_z), ``select`` (n,). Returns ``W`` (d, d_z). Raises when the
    data are not generic (dependent differences or queries: the proof does not apply).

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.random_tokens(3, 4, 5, seed=0, queries="cross")
    >>> X, Z = prob.factors
    >>> W = feasibility_construction(X, Z, prob.opt)
    >>> a, z = svm_constraints(X, Z, prob.opt)
    >>> bool(np.allclose(np.einsum("kd,de,ke->k", a, W, z), 1.0))
    True
    """
    X, Z = np.asarray(X, float), np.asarray(Z, float)
    n, T, _ = X.shape
    a, _ = svm_constraints(X, Z, select)
    A = a.reshape(n, T - 1, -1)
    if np.linalg.matrix_rank(Z) < n or min(np.linalg.matrix_rank(Ai) for Ai in A) < T - 1:
        raise ValueError("feasibility_construction needs independent queries and key differences (generic data)")
    B = np.stack([np.linalg.pinv(Ai) @ np.ones(T - 1) for Ai in A], axis=1)  # (d, n)
    return B @ np.linalg.solve(Z @ Z.T, Z)


def rescaled_norm(a, z, W, norm: str) -> np.ndarray:
    """``‖W‖ / min_k a_kᵀ W z_k``: the norm (``"fro"`` or ``"nuc"``) of ``W`` rescaled to be exactly
    feasible, an upper bound on the SVM's norm (inf when ``W`` separates nothing). Stacks: ``a`` (S, K, d),
    ``z`` (S, K, d_z), ``W`` (S, d, d_z) -> (S,).

    >>> import numpy as np
    >>> e1 = np.array([[[1.0, 0.0]]])
    >>> rescaled_norm(e1, e1, 0.5 * np.eye(2)[None], "nuc").tolist()  # margin 1/2, nuclear norm 1
    [2.0]
    """
    a, z, W = (np.asarray(v, float) for v in (a, z, W))
    v = np.einsum("skd,sde,ske->sk", a, W, z).min(axis=1)
    sv = np.linalg.svd(W, compute_uv=False)
    size = sv.sum(axis=1) if norm == "nuc" else np.sqrt(np.sum(sv**2, axis=1))
    with np.errstate(divide="ignore"):
        return np.where(v > 0, size / np.where(v > 0, v, 1.0), np.inf)


def independent_nuclear_norms(instances) -> tuple[np.ndarray, np.ndarray]:
    """The nuclear-SVM norms of ``instances`` (a list of ``(X, Z, select)``) by the independent solver
    :func:`attnlib.svm.nuclear_svm` (Clarabel on the reduced SDP, not the batched interior point),
    rescaled to exact feasibility, and their accuracy (relative gap plus violation): (S,), (S,).

    >>> import attnlib as al
    >>> prob = al.datasets.random_tokens(3, 4, 5, seed=0, queries="cross")
    >>> norms, accuracy = independent_nuclear_norms([(*prob.factors, prob.opt)])
    >>> bool(accuracy[0] < 1e-7)
    True
    """
    norms, accuracy = [], []
    for X, Z, select in instances:
        sol = nuclear_svm(X, Z, select)
        if not sol.feasible:
            raise ValueError(f"the independent nuclear SVM solve found the instance infeasible ({sol.status})")
        a, z = svm_constraints(X, Z, select)
        norms.append(rescaled_norm(a[None], z[None], sol.W[None], "nuc")[0])
        accuracy.append(sol.gap + sol.violation)
    return np.array(norms), np.array(accuracy)


# ---------------------------------------------------------------------------------------- rank grid
#: The official [TFSVM] rank-versus-d grid (``svm_rank``): (n, T) pairs, token dimensions, seeds.
OFFICIAL_RANK_GRID = dict(
    configs=((5, 5), (10, 5), (15, 5), (5, 10), (5, 15)), ds=(1, 2, 3, 4, 5, 10, 15, 20), seeds=100
)


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

    def trained_kq_spectra(
        self, steps: int, lr: float = 0.1, normalize: str = "separate", seed: int = 0, factorised=True, mask=None
    ):
        """Singular values of ``K Qᵀ`` trained on every feasible instance (:func:`train_kq_grid`), divided
        by the largest: (C, D, S, max d), NaN for instances not trained (infeasible, or outside ``mask``
        (C, D, S) bool). ``factorised=False``: the same for ``W`` trained directly (the control);
        ``"both"``: (2, C, D, S, max d), index 0 ``K Qᵀ`` and 1 ``W``, trained in one batch."""
        trained = self.feasible if mask is None else self.feasible & np.asarray(mask, bool)
        W = train_kq_grid(
            self.configs, self.ds, self.seeds, steps, lr, normalize, seed, mask=trained, factorised=factorised
        )
        sv = np.linalg.svd(np.nan_to_num(W), compute_uv=False)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(trained[..., None], sv / sv[..., :1], np.nan)

    def mean_rank(self, tol: float) -> np.ndarray:
        """(2, C, D) mean rank over the *feasible* instances only (NaN where none is feasible)."""
        r = self.ranks(tol).astype(float)
        r[r < 0] = np.nan
        count = np.sum(~np.isnan(r), axis=-1)
        return np.where(count > 0, np.nansum(r, axis=-1) / np.maximum(count, 1), np.nan)


def svm_rank_grid(configs=None, ds=None, seeds=None, processes: int | None = None) -> RankGrid:
    """The [TFSVM] rank-versus-d grid, infeasible instances counted apart (never as a rank).

    For every (n, T) in ``configs``, d in ``ds`` and seed: the data of :func:`rank_instance`, the
    global selection, ``W_mm`` (Frobenius, :func:`frobenius_svm_batch`) and ``W*_mm`` (nuclear,
    :func:`nuclear_svm_batch`), all seeds of a cell in one batch, each solution certified (exactly
    feasible, relative optimality gap in ``accuracy``), and their spectra. An instance without a
    feasible Frobenius solution is decided by an LP (HiGHS).
    Defaults: :data:`OFFICIAL_RANK_GRID` (5 × 8 × 100 instances, 2 SVMs each). The (n, T, d) cells
    run in up to ``processes`` processes (:func:`attnlib.optim.run_independent`, default
    :func:`attnlib.optim.default_processes`; the numbers do not depend on it).

    >>> import attnlib as al
    >>> grid = svm_rank_grid(configs=[(5, 5)], ds=[2, 6], seeds=range(3))
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
    largest_first = sorted(range(len(jobs)), key=lambda k: -jobs[k][0] * jobs[k][1] * jobs[k][2] ** 2)
    done = run_independent([partial(_rank_cell, jobs[k]) for k in largest_first], processes)
    cells = [None] * len(jobs)
    for k, cell in zip(largest_first, done):
        cells[k] = cell
    processes = min(default_processes() if processes is None else processes, len(jobs))
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
    configs,
    ds,
    seeds,
    steps: int,
    lr: float = 0.1,
    normalize: str = "separate",
    seed: int = 0,
    mask=None,
    factorised=True,
):
    """Train ``(K, Q)`` on every instance of a rank grid; the final products ``W = K Qᵀ`` (zero-padded).

    For each (n, T) in ``configs``, d in ``ds`` and data seed: the data of :func:`rank_instance`,
    NGD on ``(K, Q)`` (``m = d``) from :func:`kq_init` (``seed``) for ``steps`` steps.
    All d of one (n, T) train as one batch: tokens, decoder, queries and factors are padded with zeros
    to ``max(ds)``, which leaves the run unchanged up to rounding (the padded rows of ``K`` and ``Q`` get
    zero gradient and stay 0). ``normalize="separate"`` (each factor by its own gradient norm, the
    official code) runs :func:`attnlib.optim.ngd_cross_attention`; ``"joint"`` runs :func:`train_kq`.

    ``mask`` (C, D, S) bool, optional: train only these instances (e.g. ``RankGrid.feasible``).
    ``factorised=False`` trains ``W`` itself (NGD from 0, the same step and horizon) instead: the
    control of a rank check on the trained products (``W``'s limit is the Frobenius SVM).
    ``factorised="both"`` trains both on every instance, in one batch with ``"separate"``.

    Returns: (C, D, S, max d, max d) final products, zero outside the top-left d × d block; NaN for an
    instance left out by ``mask`` or with tied best tokens (no problem to train; only at d = 1).
    With ``factorised="both"``: (2, C, D, S, max d, max d), index 0 the products ``K Qᵀ``, 1 ``W``.

    >>> import numpy as np, attnlib as al
    >>> W = train_kq_grid([(4, 3)], [2, 3], range(2), steps=5)
    >>> W.shape, bool(np.all(W[0, 0, :, 2:, :] == 0))
    ((1, 2, 2, 3, 3), True)
    """
    if factorised not in (True, False, "both"):
        raise ValueError(f"factorised must be True, False or 'both', got {factorised!r}")
    kinds = (True, False) if factorised == "both" else (bool(factorised),)
    if normalize != "separate" and False in kinds:
        raise ValueError("W trained directly (factorised False or 'both') is compared with normalize='separate' only")
    configs = tuple(tuple(int(v) for v in c) for c in configs)
    ds, seeds = tuple(int(d) for d in ds), [int(s) for s in seeds]
    dmax, S = max(ds), len(seeds)
    out = np.full((len(kinds), len(configs), len(ds), S, dmax, dmax), np.nan)
    for c, (n, T) in enumerate(configs):
        data, index, K0, Q0 = [], [], [], []
        for k, d in enumerate(ds):
            K, Q = kq_init(S, d, d, seed=seed)
            for j, s in enumerate(seeds):
                if mask is not None and not mask[c][k][j]:
                    continue
                X, y, u, Z, opt = rank_instance(n, T, d, s)
                gamma = y[:, None] * (X @ u)
                if np.any(np.sum(gamma == gamma.max(axis=1, keepdims=True), axis=1) > 1):
                    continue  # tied best tokens (only at d = 1): no problem to train, left NaN
                pad = ((0, 0), (0, dmax - d))
                data.append((np.pad(X, ((0, 0),) + pad), y, np.pad(u, pad[1]), np.pad(Z, pad)))
                index.append((k, j))
                K0.append(np.pad(K[j], ((0, dmax - d), (0, dmax - d))))
                Q0.append(np.pad(Q[j], ((0, dmax - d), (0, dmax - d))))
        if not data:
            continue
        k, j = np.array(index).T
        if normalize == "separate":
            X, y, u, Z = (np.concatenate([np.stack([e[a] for e in data])] * len(kinds)) for a in range(4))
            flags = np.repeat(kinds, len(data))
            _, final = ngd_cross_attention(X, y, u, Z, steps, lr, np.concatenate([K0] * len(kinds)),
                                           np.concatenate([Q0] * len(kinds)), flags)  # fmt: skip
            out[:, c, k, j] = final[-1].reshape(len(kinds), len(data), dmax, dmax)
        else:
            stack = ProblemStack(tuple(self_attention(*e) for e in data))
            out[0, c, k, j] = train_kq(stack, np.array(K0), np.array(Q0), steps, "ngd", lr, normalize=normalize,
                                       record_steps=[steps]).final  # fmt: skip
    return out if factorised == "both" else out[0]


# --------------------------------------------------------------------- the 2-D paths of W and (K, Q)
#: [TFSVM]'s two 2-D visualisations (``visualization1``/``visualization2``): T → (token scale, the
#: notebook). n = 2 inputs, d = 2, labels +1, a random unit decoder and unit queries.
PLANE_FAMILIES = {3: (0.3, "visualization1"), 5: (0.5, "visualization2")}


def plane_instance(T: int, seed: int):
    """One draw of a [TFSVM] 2-D visualisation family (n = 2, d = 2): ``X`` (2, T, 2), ``y``, ``u``, ``Z``, ``opt``.

    ``T = 3`` (``visualization1``): tokens ``0.3·N(0, I)`` around ``(−1, 0)`` for input 1 and
    ``(1, 0)`` for input 2. ``T = 5`` (``visualization2``): tokens ``0.5·N(0, I)``, the first token
    of input 1 set to ``(1, 0.5)`` and of input 2 to ``(1, −0.5)``, the others moved by ``(−1, 0)``.
    Both: labels +1, decoder ``u`` and queries ``z_i`` standard normal scaled to unit length,
    ``opt_i = argmax_t uᵀx_it``. The official notebooks draw with torch's generator (seeds 1 and 3),
    which numpy cannot replay: a draw here is numpy's (``default_rng([T, seed])``) of the same family.

    >>> X, y, u, Z, opt = plane_instance(5, 0)
    >>> X.shape, X[0, 0].tolist(), bool(np.allclose(np.linalg.norm(Z, axis=1), 1))
    ((2, 5, 2), [1.0, 0.5], True)
    """
    if T not in PLANE_FAMILIES:
        raise ValueError(f"T must be one of {sorted(PLANE_FAMILIES)} (the [TFSVM] visualisations), got {T!r}")
    rng = np.random.default_rng([T, int(seed)])
    u = rng.standard_normal(2)
    u /= np.linalg.norm(u)
    X = PLANE_FAMILIES[T][0] * rng.standard_normal((2, T, 2))
    if T == 3:
        X += np.array([[-1.0, 0.0], [1.0, 0.0]])[:, None, :]
    else:
        X[:, 1:] += np.array([-1.0, 0.0])
        X[:, 0] = [[1.0, 0.5], [1.0, -0.5]]
    Z = rng.standard_normal((2, 2))
    Z /= np.linalg.norm(Z, axis=1, keepdims=True)
    return X, np.ones(2), u, Z, np.argmax(X @ u, axis=1)


@dataclass(frozen=True, eq=False)
class PlanePaths:
    """W and (K, Q) trained on draws of the [TFSVM] 2-D families (:func:`plane_paths`).

    Axes: F families (``Ts``), N draws, kind 0 = ``W`` (from 0), 1 = ``K Qᵀ``.

    Attributes:
        Ts: (F,) token counts.  draws: (N,) draw seeds.  steps: (R,) recorded steps.
        X: (F, N, 2, T_max, 2) tokens (zero-padded beyond ``Ts[f]``).  Z: (F, N, 2, 2) queries.
        W: (R, F, N, 2, 2, 2) the trained matrix of each kind.  select: (F, N, 2, 2) final selections.
        svms: (2, F, N, 2, 2, 2) the Frobenius (0) and nuclear (1) W-SVMs of each kind's own final
            selection (:func:`svm_pair_batch`); NaN where infeasible.  feasible: (F, N, 2) bool.
        opt: (F, N, 2) the optimal tokens.  seconds: wall-clock of the training and of the SVMs.
    """

    Ts: tuple
    draws: np.ndarray
    steps: np.ndarray
    X: np.ndarray
    Z: np.ndarray
    W: np.ndarray
    select: np.ndarray
    svms: np.ndarray
    feasible: np.ndarray
    opt: np.ndarray
    seconds: dict


def plane_paths(Ts=(3, 5), draws=range(8), steps: int = 2000, lr: float = 0.1, k_scale: float = 0.1, seed: int = 0,
                record_steps=None) -> PlanePaths:  # fmt: skip
    """[TFSVM]'s 2-D visualisation runs on draws of both families, every run in one batch.

    On every draw (:func:`plane_instance`): NGD on ``W`` from 0, and on ``(K, Q)`` from the official
    start (``Q = 0``, ``K`` with entries ``k_scale·N(0, 1)``, seeded by ``seed``), each factor by its
    own normalised gradient (:func:`attnlib.optim.ngd_cross_attention`, all families and both kinds in
    one loop). Then each run's final selection and the two W-SVMs of that selection. The official
    loss adds ``eps·(‖K‖² + ‖Q‖²)`` with ``eps`` the float64 machine epsilon, which moves no step
    here by more than rounding, and is left out.

    >>> run = plane_paths(draws=range(2), steps=30)
    >>> run.W.shape, run.svms.shape, run.feasible.shape
    ((1, 2, 2, 2, 2, 2), (2, 2, 2, 2, 2, 2), (2, 2, 2))
    """
    Ts = tuple(int(T) for T in Ts)
    draws = np.asarray(list(draws), int)
    if not Ts or draws.size == 0:
        raise ValueError(f"Ts and draws must be non-empty, got {Ts} and {draws.tolist()}")
    F, N, T_max = len(Ts), draws.size, max(Ts)
    start = time.perf_counter()
    X = np.zeros((F, N, 2, T_max, 2))
    Z, u, opt = np.zeros((F, N, 2, 2)), np.zeros((F, N, 2)), np.zeros((F, N, 2), int)
    for f, T in enumerate(Ts):
        for j, s in enumerate(draws):
            X[f, j, :, :T], _, u[f, j], Z[f, j], opt[f, j] = plane_instance(T, s)
    rng = np.random.default_rng(seed)
    K0 = np.stack([np.zeros((F, N, 2, 2)), k_scale * rng.standard_normal((F, N, 2, 2))], axis=2)  # kind axis 2
    both = lambda a: np.repeat(a[:, :, None], 2, axis=2).reshape(F * N * 2, *a.shape[2:])  # noqa: E731
    record, W = ngd_cross_attention(
        both(X), np.ones((F * N * 2, 2)), both(u), both(Z), steps, lr, K0.reshape(-1, 2, 2),
        np.zeros((F * N * 2, 2, 2)), np.tile([False, True], F * N), record_steps,
        tokens=np.repeat(Ts, N * 2),
    )  # fmt: skip
    W = W.reshape(len(record), F, N, 2, 2, 2)
    trained = time.perf_counter()
    select = np.zeros((F, N, 2, 2), int)
    svms, feasible = np.full((2, F, N, 2, 2, 2), np.nan), np.zeros((F, N, 2), bool)
    for f, T in enumerate(Ts):
        logits = np.einsum("jitd,jkde,jie->jkit", X[f, :, :, :T], W[-1, f], Z[f])  # (N, kind, 2, T)
        select[f] = np.argmax(logits, axis=-1)
        cons = [svm_constraints(X[f, j, :, :T], Z[f, j], select[f, j, k]) for j in range(N) for k in range(2)]
        sol, _, ok, _ = svm_pair_batch(np.stack([c[0] for c in cons]), np.stack([c[1] for c in cons]))
        svms[:, f], feasible[f] = sol.reshape(2, N, 2, 2, 2), ok.reshape(N, 2)
    seconds = {"train": trained - start, "svm": time.perf_counter() - trained}
    return PlanePaths(Ts, draws, record, X, Z, W, select, svms, feasible, opt, seconds)


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
        seconds: wall-clock of ``train_W`` and ``train_KQ`` (each inside its process), of ``svm`` (the
            SVM pairs of both halves, each distinct pair once: W's after its training, in its process,
            then (K, Q)'s where they differ) and ``total``.
        processes: 1, or 2 when the two halves ran in two processes at once.
    """

    steps: np.ndarray
    W: dict
    select: dict
    svms: dict
    feasible: dict
    seconds: dict
    processes: int


def _train_half(kind, stack, steps, lr, record, K0, Q0, normalize):
    """One half of :func:`local_convergence`: NGD on ``W`` or on ``(K, Q)``, then the final selection."""
    t0 = time.perf_counter()
    if kind == "W":
        W = train(stack, np.zeros(stack.shape), steps, "ngd", lr, record_steps=record, progress=False).theta
    else:
        W = train_kq(stack, K0, Q0, steps, "ngd", lr, normalize=normalize, record_steps=record).W
    return W, stack.selection(W[-1]), time.perf_counter() - t0  # selection: (S, n), every problem at once


def _selection_svms(stack, rows, selections) -> tuple[np.ndarray, np.ndarray]:
    """Both W-SVMs of the selections ``selections`` (J, n) of the problems ``rows`` (J,), in one batch
    (:func:`svm_pair_batch`; an instance's solution does not depend on the rest of its batch).

    Returns ``(W (2, J, d, d_z), feasible (J,))``: Frobenius (0) and nuclear (1), NaN where infeasible.
    """
    cons = [svm_constraints(*stack.problems[s].factors, select) for s, select in zip(rows, selections)]
    W, _, feasible, _ = svm_pair_batch(np.stack([c[0] for c in cons]), np.stack([c[1] for c in cons]))
    return W, feasible


def _w_half_and_its_svms(stack, steps, lr, record):
    """The ``W`` half of :func:`local_convergence` and the SVM pairs of its final selection.

    In two processes they run while ``(K, Q)``, the longer half, trains; :func:`_kq_svms` then solves
    only the pairs where ``(K, Q)`` selects other tokens.
    """
    W, select, train_seconds = _train_half("W", stack, steps, lr, record, None, None, None)
    t0 = time.perf_counter()
    svms, feasible = _selection_svms(stack, range(stack.S), select)
    return W, select, train_seconds, svms, feasible, time.perf_counter() - t0


def _kq_svms(stack, select_kq, select_w, svms_w, feasible_w) -> tuple[np.ndarray, np.ndarray]:
    """The SVM pairs of ``(K, Q)``'s final selection: ``W``'s where both halves select the same tokens
    (most problems), solved only where they differ. Returns ``(svms (2, S, d, d_z), feasible (S,))``."""
    svms, feasible = svms_w.copy(), feasible_w.copy()
    differ = np.nonzero(np.any(select_kq != select_w, axis=1))[0]
    if differ.size:
        svms[:, differ], feasible[differ] = _selection_svms(stack, differ, select_kq[differ])
    return svms, feasible


def local_convergence(
    problems,
    steps: int,
    lr: float = 0.1,
    kq_normalize: str = "separate",
    kq_seed=0,
    record_steps=None,
    processes: int | None = None,
) -> LocalConvergence:
    """[TFSVM]'s local-convergence experiment: NGD on ``W`` (from 0) and on ``(K, Q)`` (from
    :func:`kq_init`, ``m = d``), then the final selections and their two W-SVMs.

    Args:
        problems: S self-attention problems of one size (e.g. ``datasets.random_tokens(…, queries="cross")``),
            or their :class:`~attnlib.ProblemStack`.
        steps, lr: NGD iterations and step size (both halves).  kq_normalize: "separate" (each factor
            by its own gradient norm, as the official code) or "joint" (:func:`train_kq`).
        kq_seed: seed of the (K, Q) initialisation.  record_steps: steps to record (default: the last).
        processes: 1, or 2 to run the two halves, which are independent, in two processes at once
            (:func:`attnlib.optim.run_independent`; the results are the same): the W half solves the
            SVM pairs of its selection while (K, Q), the longer half, still trains, and only the pairs
            where (K, Q) selects other tokens are left for after. Default: 2 if
            :func:`attnlib.optim.default_processes` allows it.

    >>> import attnlib as al
    >>> probs = [al.datasets.random_tokens(4, 5, 6, seed=s, queries="cross") for s in range(3)]
    >>> run = local_convergence(probs, steps=20)
    >>> run.W["KQ"].shape, run.svms["W"].shape
    ((1, 3, 6, 6), (2, 3, 6, 6))
    """
    processes = min(2, default_processes()) if processes is None else processes
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
    # The (K, Q) half, the longer, first; the W half solves its SVM pairs after training, while (K, Q)
    # still trains in the other process. The workers are forked after the arguments are in place, so
    # they need no pickling (a problem's loss holds lambdas): only the results travel back.
    kq, w = run_independent(
        [
            partial(_train_half, "KQ", stack, steps, lr, record, K0, Q0, kq_normalize),
            partial(_w_half_and_its_svms, stack, steps, lr, record),
        ],
        processes,
    )
    W, select, train_w, svms_w, feasible_w, svm_w = w
    trained = time.perf_counter()
    svms_kq, feasible_kq = _kq_svms(stack, kq[1], select, svms_w, feasible_w)
    seconds = {"train_W": train_w, "train_KQ": kq[2], "svm": svm_w + time.perf_counter() - trained}
    seconds["total"] = time.perf_counter() - start
    return LocalConvergence(
        steps=record,
        W={"W": W, "KQ": kq[0]},
        select={"W": select, "KQ": kq[1]},
        svms={"W": svms_w, "KQ": svms_kq},
        feasible={"W": feasible_w, "KQ": feasible_kq},
        seconds=seconds,
        processes=processes,
    )
