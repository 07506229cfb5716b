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

import numpy as np

from ..datasets import rank_instance
from ..metrics import numerical_rank
from ..model import ProblemStack, self_attention
from ..optim import check_schedule, kq_init, record_schedule, train, train_kq
from ..svm import svm_constraints, svm_pair_batch

__all__ = [
    "OFFICIAL_RANK_GRID",
    "RankGrid",
    "svm_rank_grid",
    "train_kq_grid",
    "LocalConvergence",
    "local_convergence",
]


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
    >>> W = train_kq_grid([(4, 3)], [2, 3], range(2), steps=5)
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
    >>> run = local_convergence(probs, steps=20)
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
