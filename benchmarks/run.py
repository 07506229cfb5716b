"""Speed and scale of attnlib, measured against baselines run in the same process.

    python benchmarks/run.py [--quick] [--only SECTION ...] [--out benchmarks/results/core.json]

Sections (each a key of the JSON file; ``--only`` runs some of them and keeps the others' last
results in the file):

- ``batching``: NGD cost per trajectory-step against the batch size B, for the generic feature
  path (``A`` of shape (n, T, d·d)) and the rank-one self-attention path (``factors``), against a
  Python loop over the same trajectories, and the fraction of the flop limit reached: the time of
  the two matrix products that carry the floating-point work (≈ 4·n·T·size flops per
  trajectory-step; logits ``(B, size) @ (size, n·T)`` and the adjoint ``(B, n·T) @ (n·T, size)``)
  timed on arrays of the same shapes (the faster of the default BLAS threading and one thread),
  divided by the time of a whole step. Steps are timed with both BLAS settings.
- ``scaling``: cost per trajectory-step against n, T, d (at a fixed B) and total time against the
  number of steps, with the fitted growth exponents (slopes on log axes, ``al.fit_slope``).
- ``svm``: time per max-margin solve against n·T and d (cvxpy CLARABEL Frobenius; nuclear with
  CLARABEL and SCS), and many solves (one per seed): rebuilding the cvxpy problem each time
  (``al.max_margin``), a DPP-parameterised problem built once, and an exact least-distance solve
  by NNLS (Lawson–Hanson) for the Frobenius norm, checked against cvxpy.
- ``memory``: peak RSS of a batched run (fresh process) against ``record_every``.
- ``local_converge``: the [TFSVM] local-convergence experiment (n=6, T=8, d=10, 100 seeds ×
  2000 NGD steps for W and for (K, Q), each in one batch, W-SVM Frobenius and nuclear at each final
  selection), end to end with ``al.experiments.factorization.local_convergence``, in one process and in two.
- ``rank_grid``: the [TFSVM] rank-versus-d grid (5 (n, T) × 8 d × 100 seeds × 2 SVMs,
  ``al.experiments.factorization.svm_rank_grid``: batched interior-point solves with a certified gap
  per instance; infeasible instances decided by an LP and counted apart), on a pool of 2 processes.

Nothing here asserts a speed; the numbers are printed as tables and written as JSON, which the
book's Performance page reads. The machine is described in the file (CPU, load average).
Nothing here divides by another run's time: the official notebooks' times of another day are
stored beside attnlib's with their date and machine (``OFFICIAL_REFERENCE``), and the ratio
against the official code comes only from ``benchmarks/side_by_side.py``, which times both in one
session.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import machine_info
import numpy as np

import attnlib as al
from attnlib.book.timing import blas_threads, timed
from attnlib.model import TokenSelectionProblem

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("batching", "scaling", "svm", "memory", "local_converge", "rank_grid")
#: The official [TFSVM] notebooks' times as measured once, on another day, by the project's
#: perf-anchor note: stored beside attnlib's times with their date and machine, never divided by
#: (a machine's speed drifts by 1.7× between days). The ratio against the official code comes from
#: ``side_by_side.py``, which runs both in one session (``benchmarks/results/side_by_side.json``).
OFFICIAL_REFERENCE = {
    "local_converge": dict(
        seconds=435.2,
        measured_utc="2026-11-29",
        machine="2 vCPU AMD EPYC (shared VM), torch 2.13.0+cpu, 2 intra-op threads (189% CPU)",
        setting="TF-as-SVM local_converge.ipynb, RUN=100, ITN=2000, median of 3",
    ),
    "svm_rank": dict(
        seconds=628.1,
        measured_utc="2026-11-29",
        machine="2 vCPU AMD EPYC (shared VM), cvxpy 1.9.3",
        setting="TF-as-SVM svm_rank.ipynb, RUN=100 (the full grid), median of 3",
    ),
}


# ---------------------------------------------------------------------------------------- helpers
def generic(prob: TokenSelectionProblem) -> TokenSelectionProblem:
    """The same problem without its rank-one factors: the generic feature path."""
    return TokenSelectionProblem(prob.A, prob.gamma, prob.loss)


def slope(x, y) -> float:
    return al.fit_slope(np.asarray(x, float), np.asarray(y, float))[0]


def machine() -> dict:
    blas = ""
    try:
        cfg = np.show_config(mode="dicts")
        blas = f"{cfg['Build Dependencies']['blas']['name']} {cfg['Build Dependencies']['blas']['version']}"
    except Exception:  # noqa: BLE001 (numpy's config layout varies)
        pass
    return dict(machine_info.machine(), numpy=np.__version__, blas=blas)


# ---------------------------------------------------------------------------------------- batching
def flop_reference(B: int, size: int, nT: int, repeat: int) -> float:
    """Time of the two products that carry a generic step's flops, on arrays of the same shapes.

    The faster of the default BLAS threading and one thread: on a loaded machine, multi-threaded
    BLAS can make these small products many times slower, which would flatter the fraction.
    """
    rng = np.random.default_rng(0)
    flat, F = rng.normal(size=(B, size)), rng.normal(size=(size, nT))
    w, G = rng.normal(size=(B, nT)), rng.normal(size=(nT, size))
    best = np.inf
    for threads in (None, 1):
        with blas_threads(threads):
            best = min(best, timed(lambda: (flat @ F, w @ G), repeat, min_time=0.05)["median"])
    return best


def bench_batching(quick: bool) -> dict:
    n, T, d = 6, 8, 10
    prob = al.datasets.random_tokens(n, T, d, seed=0)
    paths = {"rank-one (self_attention)": prob, "generic (A: n×T×d²)": generic(prob)}
    sizes = [1, 16, 256, 1024] if quick else [1, 4, 16, 64, 256, 1024, 4096, 16384]
    work = 2e3 if quick else 1e5  # trajectory-steps per timing
    repeat = 1 if quick else 3
    rng = np.random.default_rng(0)
    rows = []
    for threads in (None, 1):
        label = "default" if threads is None else str(threads)
        with blas_threads(threads):
            for name, p in paths.items():
                # the naive baseline: one train() call per trajectory, in a Python loop
                loop_B = 4 if quick else 16
                loop_steps = 20 if quick else 200
                loop_inits = rng.normal(size=(loop_B, d, d))

                def loop(p=p, inits=loop_inits, steps=loop_steps):
                    for theta0 in inits:
                        al.train(p, theta0, steps, record_every=steps, progress=False)

                loop_cost = timed(loop, repeat)["median"] / (loop_B * loop_steps)
                for B in sizes:
                    steps = int(max(5, min(2000, work // B)))
                    inits = rng.normal(size=(B, d, d))
                    t = timed(
                        lambda p=p, inits=inits, steps=steps: al.train(
                            p, inits, steps, record_every=steps, progress=False
                        ),
                        repeat,
                    )
                    per_step = t["median"] / steps
                    mm = flop_reference(B, d * d, n * T, repeat)
                    flops = 4 * n * T * d * d * B
                    rows.append(
                        dict(
                            path=name,
                            blas_threads=label,
                            B=B,
                            steps=steps,
                            us_per_trajectory_step=per_step / B * 1e6,
                            us_per_batched_step=per_step * 1e6,
                            matmul_us=mm * 1e6,
                            matmul_gflops=flops / mm / 1e9,
                            step_gflops=flops / per_step / 1e9,
                            flop_fraction=mm / per_step,
                            loop_us_per_trajectory_step=loop_cost * 1e6,
                            speedup_vs_loop=loop_cost / (per_step / B),
                        )
                    )
    # the machine's matmul peak on a large square product, for scale
    a = np.random.default_rng(1).normal(size=(1000, 1000))
    peak = 2e9 / timed(lambda: a @ a, 3)["median"] / 1e9
    fits, best = {}, {}
    for name in paths:
        for label in ("default", "1"):
            sub = [r for r in rows if r["path"] == name and r["blas_threads"] == label]
            key = f"{name}, BLAS threads {label}"
            fits[key] = slope(
                [r["B"] for r in sub if r["B"] >= 64], [r["us_per_batched_step"] for r in sub if r["B"] >= 64]
            )
            big = [r for r in sub if r["B"] >= 1024]
            best[key] = dict(
                flop_fraction=max(r["flop_fraction"] for r in big),
                B=max(big, key=lambda r: r["flop_fraction"])["B"],
                us_per_trajectory_step=min(r["us_per_trajectory_step"] for r in sub),
                speedup_vs_loop=max(r["speedup_vs_loop"] for r in sub),
            )
    return dict(
        problem=dict(n=n, T=T, d=d, method="ngd"),
        rows=rows,
        square_matmul_gflops=peak,
        batched_step_exponent_B_ge_64=fits,
        best=best,
    )


# ---------------------------------------------------------------------------------------- scaling
def bench_scaling(quick: bool) -> dict:
    B = 16 if quick else 256
    steps = 5 if quick else 30
    repeat = 1 if quick else 3
    base = dict(n=6, T=8, d=10)
    grids = {
        "n": [2, 8, 32] if quick else [2, 4, 8, 16, 32, 64],
        "T": [2, 8, 32] if quick else [2, 4, 8, 16, 32, 64],
        "d": [4, 8, 16] if quick else [4, 8, 16, 32, 64],
    }
    rng = np.random.default_rng(0)
    out = {}
    for var, values in grids.items():
        rows = []
        for value in values:
            size = dict(base, **{var: value})
            prob = al.datasets.random_tokens(size["n"], size["T"], size["d"], seed=0)
            inits = rng.normal(size=(B, size["d"], size["d"]))
            paths = {"rank-one": prob}
            if size["n"] * size["T"] * size["d"] ** 2 * B <= 3e8:
                paths["generic"] = generic(prob)
            for name, p in paths.items():
                t = timed(
                    lambda p=p, inits=inits: al.train(p, inits, steps, record_every=steps, progress=False), repeat
                )
                rows.append(dict(path=name, value=value, us_per_trajectory_step=t["median"] / (steps * B) * 1e6))
        fit = {}
        for name in ("rank-one", "generic"):
            sub = [r for r in rows if r["path"] == name]
            if len(sub) >= 2:
                fit[name] = slope([r["value"] for r in sub], [r["us_per_trajectory_step"] for r in sub])
        out[var] = dict(rows=rows, exponent=fit)
    # total time against the number of steps
    prob = al.datasets.random_tokens(6, 8, 10, seed=0)
    inits = rng.normal(size=(B, 10, 10))
    step_values = [10, 30, 100] if quick else [10, 30, 100, 300, 1000]
    rows = []
    for s in step_values:
        t = timed(lambda s=s: al.train(prob, inits, s, record_every=s, progress=False), repeat)
        rows.append(dict(value=s, seconds=t["median"]))
    out["steps"] = dict(rows=rows, exponent=slope(step_values, [r["seconds"] for r in rows]))
    return dict(B=B, steps_per_timing=steps, base=base, **out)


# ---------------------------------------------------------------------------------------- SVMs
def ldp_min_norm(G: np.ndarray, h: np.ndarray):
    """``min ‖x‖₂ s.t. G x ≥ h`` by the library's NNLS least-distance step (``al.svm.least_distance_nnls``),
    without its certificate checks: the raw solve the benchmark times. Returns ``x`` or ``None``."""
    solved = al.svm.least_distance_nnls(G, h)
    if solved is None or abs(solved[1][-1]) < 1e-12:
        return None
    r = solved[1]
    return -r[:-1] / r[-1]


def _constraints(prob: TokenSelectionProblem, select=None):
    n, T = prob.n, prob.T
    sel = prob.opt if select is None else np.asarray(select)
    A = prob.A.reshape(n, T, prob.size)
    rows = np.ones((n, T), bool)
    rows[np.arange(n), sel] = False
    return (A[np.arange(n), sel][:, None, :] - A)[rows], np.ones(n * (T - 1))


class DPPSolver:
    """One cvxpy problem with the constraint matrix as a Parameter (DPP): built once, solved often."""

    def __init__(self, m: int, size: int, norm: str = "fro", shape=None):
        import cvxpy as cp

        self.G = cp.Parameter((m, size))
        if norm == "fro":
            self.x = cp.Variable(size)
            objective, flat = cp.sum_squares(self.x), self.x
        else:
            self.x = cp.Variable(shape)
            objective, flat = cp.normNuc(self.x), cp.vec(self.x, order="C")
        self.problem = cp.Problem(cp.Minimize(objective), [self.G @ flat >= 1])
        self.cp = cp

    def solve(self, G: np.ndarray, solver: str = "CLARABEL"):
        self.G.value = G
        opts = al.svm._CLARABEL_OPTS if solver == "CLARABEL" else dict(eps=1e-9, max_iters=200_000)
        self.problem.solve(solver=solver, **opts)
        if self.problem.status not in ("optimal", "optimal_inaccurate"):
            return None
        return np.asarray(self.x.value, float).ravel()


def _relerr(a, b) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def bench_svm(quick: bool) -> dict:
    import cvxpy as cp  # noqa: F401  (import cost kept out of the timings)

    repeat = 1 if quick else 5
    al.max_margin(al.datasets.random_tokens(3, 4, 6, seed=0))  # warm-up
    # time per solve against n·T (d = 12 keeps the W-SVM feasible) and against d (n=6, T=8)
    nt_grid = [(2, 4), (6, 8)] if quick else [(2, 4), (3, 6), (4, 8), (6, 8), (8, 10), (10, 12)]
    d_grid = [8] if quick else [6, 8, 10, 16, 24, 32]
    cases = [("nT", n, T, 12) for n, T in nt_grid] + [("d", 6, 8, d) for d in d_grid]
    rows = []
    for axis, n, T, d in cases:
        prob = al.datasets.random_tokens(n, T, d, seed=0)
        row = dict(axis=axis, n=n, T=T, d=d, nT=n * T)
        try:
            sol = al.max_margin(prob, solver="cvxpy")
        except al.InfeasibleError:
            rows.append(dict(row, status="infeasible"))
            continue
        row["status"] = "optimal"
        row["cvxpy_fro_ms"] = timed(lambda prob=prob: al.max_margin(prob, solver="cvxpy"), repeat)["median"] * 1e3
        row["max_margin_fro_ms"] = timed(lambda prob=prob: al.max_margin(prob), repeat)["median"] * 1e3
        G, h = _constraints(prob)
        row["nnls_fro_ms"] = timed(lambda G=G, h=h: ldp_min_norm(G, h), repeat)["median"] * 1e3
        row["nnls_vs_cvxpy_relerr"] = _relerr(ldp_min_norm(G, h), sol.theta.ravel())
        if not quick or d <= 12:
            nuc_repeat = 1 if d > 16 else repeat
            row["cvxpy_nuc_clarabel_ms"] = (
                timed(lambda prob=prob: al.max_margin(prob, norm="nuc"), nuc_repeat)["median"] * 1e3
            )
            dpp = DPPSolver(len(G), prob.size, "nuc", prob.shape)
            dpp.solve(G, "SCS")
            row["nuc_scs_ms"] = timed(lambda G=G, dpp=dpp: dpp.solve(G, "SCS"), nuc_repeat)["median"] * 1e3
            ref = al.max_margin(prob, norm="nuc").theta.ravel()
            row["nuc_scs_vs_clarabel_relerr"] = _relerr(dpp.solve(G, "SCS"), ref)
        rows.append(row)
    fits = {}
    for axis, key in (("nT", "nT"), ("d", "d")):
        for col in ("cvxpy_fro_ms", "nnls_fro_ms", "max_margin_fro_ms", "cvxpy_nuc_clarabel_ms", "nuc_scs_ms"):
            sub = [r for r in rows if r["axis"] == axis and col in r]
            if len(sub) >= 2:
                fits[f"{col} vs {key}"] = slope([r[key] for r in sub], [r[col] for r in sub])
    # many SVMs: one per seed (n=6, T=8, d=10), three ways
    seeds = 4 if quick else 100
    probs = [al.datasets.random_tokens(6, 8, 10, seed=s, queries="cross") for s in range(seeds)]
    Gs = [_constraints(p)[0] for p in probs]
    t0 = time.perf_counter()
    ref = []
    for p in probs:
        try:
            ref.append(al.max_margin(p, solver="cvxpy").theta.ravel())
        except al.InfeasibleError:
            ref.append(None)
    rebuild = time.perf_counter() - t0
    t0 = time.perf_counter()
    lib = []
    for p in probs:
        try:
            lib.append(al.max_margin(p).theta.ravel())
        except al.InfeasibleError:
            lib.append(None)
    lib_t = time.perf_counter() - t0
    dpp = DPPSolver(Gs[0].shape[0], probs[0].size)
    dpp.solve(Gs[0])  # first solve compiles the parameterised problem
    t0 = time.perf_counter()
    dpp_sol = [dpp.solve(G) for G in Gs]
    dpp_t = time.perf_counter() - t0
    t0 = time.perf_counter()
    nnls_sol = [ldp_min_norm(G, np.ones(len(G))) for G in Gs]
    nnls_t = time.perf_counter() - t0
    ok = [i for i, r in enumerate(ref) if r is not None]
    many = dict(
        seeds=seeds,
        feasible=len(ok),
        rebuild_ms_per_solve=rebuild / seeds * 1e3,
        dpp_ms_per_solve=dpp_t / seeds * 1e3,
        nnls_ms_per_solve=nnls_t / seeds * 1e3,
        max_margin_ms_per_solve=lib_t / seeds * 1e3,
        max_margin_max_relerr=max((_relerr(lib[i], ref[i]) for i in ok), default=float("nan")),
        dpp_max_relerr=max((_relerr(dpp_sol[i], ref[i]) for i in ok), default=float("nan")),
        nnls_max_relerr=max((_relerr(nnls_sol[i], ref[i]) for i in ok), default=float("nan")),
        infeasible_agree=all((ref[i] is None) == (nnls_sol[i] is None) for i in range(seeds)),
    )
    return dict(rows=rows, exponents=fits, many=many)


# ---------------------------------------------------------------------------------------- memory
# Peak RSS from /proc/self/status VmHWM (the high-water mark of this process's memory): unlike
# getrusage's ru_maxrss, Linux does not carry it over from the parent through fork and exec.
_MEMORY_CHILD = """
import sys, time, numpy as np, attnlib as al
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
S, steps, every = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
stack = al.stack_problems([al.datasets.random_tokens(6, 8, 10, seed=s) for s in range(S)])
base = hwm()
t = time.perf_counter()
traj = al.train(stack, np.zeros((10, 10)), steps, "ngd", 0.1, record_every=every, progress=False)
t = time.perf_counter() - t
print(base, hwm(), traj.theta.nbytes / 2**20, t)
"""


def bench_memory(quick: bool) -> dict:
    S, steps = (10, 50) if quick else (100, 2000)
    everies = [1] if quick else [1, 10, 100, steps]
    rows = []
    for every in everies:
        out = subprocess.run(
            [sys.executable, "-c", _MEMORY_CHILD, str(S), str(steps), str(every)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        base, peak, stored, seconds = map(float, out)
        rows.append(
            dict(
                record_every=every,
                recorded=len(range(0, steps + 1, every)) + (steps % every != 0),
                peak_rss_mib=peak,
                rss_before_train_mib=base,
                stored_theta_mib=stored,
                seconds=seconds,
            )
        )
    return dict(S=S, steps=steps, problem="stack of random_tokens(6, 8, 10), NGD", rows=rows)


# ---------------------------------------------------------------------------------------- [TFSVM]
def _median_corr(finals, svms, feasible) -> float:
    corr = [al.cosine(W, S)[()] for W, S, ok in zip(finals, svms, feasible) if ok]
    return float(np.median(corr)) if corr else float("nan")


def _local_results(run: al.experiments.factorization.LocalConvergence, probs) -> dict:
    out, opt = {}, np.array([p.opt for p in probs])
    for kind in ("W", "KQ"):
        final, (fro, nuc), ok = run.W[kind][-1], run.svms[kind], run.feasible[kind]
        out[kind] = dict(
            not_opt=int(np.any(run.select[kind] != opt, axis=1).sum()),
            infeasible=int((~ok).sum()),
            median_corr_fro=_median_corr(final, fro, ok),
            median_corr_nuc=_median_corr(final, nuc, ok),
        )
    return out


def bench_local_converge(quick: bool) -> dict:
    """The [TFSVM] local-convergence experiment end to end (``al.experiments.factorization.local_convergence``), in one
    process and with its two halves in two processes; and the batched nuclear SVMs against
    CLARABEL through cvxpy (``al.max_margin(…, norm="nuc")``) and the reduced SDP (``al.svm.nuclear_svm``)."""
    seeds, steps = (4, 50) if quick else (100, 2000)
    probs = [al.datasets.random_tokens(6, 8, 10, seed=s, queries="cross") for s in range(seeds)]
    runs = {}
    for processes in (1, 2):
        t0 = time.perf_counter()
        run = al.experiments.factorization.local_convergence(
            probs, steps, lr=0.1, kq_normalize="separate", processes=processes
        )
        runs[processes] = (run, time.perf_counter() - t0)
    run = runs[1][0]
    check = range(min(seeds, 10))  # the independent solvers are slow: the first 10 seeds
    cvx, reduced = [], []
    for s in check:
        if not run.feasible["W"][s]:
            continue
        p, a = probs[s], run.select["W"][s]
        cvx.append(_relerr(run.svms["W"][1, s].ravel(), al.max_margin(p, a, norm="nuc").theta.ravel()))
        reduced.append(_relerr(run.svms["W"][1, s].ravel(), al.svm.nuclear_svm(*p.factors, a).W.ravel()))
    best = min(t for _, t in runs.values())
    return dict(
        setting=dict(seeds=seeds, steps=steps, n=6, T=8, d=10, lr=0.1, method="ngd", kq_normalize="separate"),
        one_process=dict(seconds=runs[1][1], stages=run.seconds),
        two_processes=dict(seconds=runs[2][1], stages=runs[2][0].seconds),
        identical_results=all(
            np.array_equal(runs[1][0].W[k], runs[2][0].W[k])
            and np.array_equal(runs[1][0].svms[k], runs[2][0].svms[k], equal_nan=True)
            for k in ("W", "KQ")
        ),
        results=_local_results(run, probs),
        nuclear_batched_vs_clarabel_max_relerr=max(cvx, default=float("nan")),
        nuclear_batched_vs_reduced_max_relerr=max(reduced, default=float("nan")),
        best_seconds=best,
        official_reference=OFFICIAL_REFERENCE["local_converge"],
    )


def bench_rank_grid(quick: bool) -> dict:
    """The official rank grid rebuilt (chapter 7's ``svm_rank_grid``); the official notebook's time of
    another day is stored beside it (:data:`OFFICIAL_REFERENCE`), not divided by."""
    processes = 2
    with blas_threads(1):  # small matrices: BLAS threads only fight the two worker processes
        return _bench_rank_grid(quick, processes)


def _bench_rank_grid(quick: bool, processes: int) -> dict:
    if quick:
        grid = al.experiments.factorization.svm_rank_grid(
            configs=[(5, 5), (10, 5)], ds=[1, 3, 6], seeds=range(3), processes=processes
        )
    else:
        grid = al.experiments.factorization.svm_rank_grid(processes=processes)
    tol = 1e-6
    ranks = grid.ranks(tol)
    sv = grid.singular_values[:, grid.feasible]
    official_style = np.where(ranks < 0, 1, ranks).mean(axis=-1)
    return dict(
        setting=dict(configs=grid.configs, ds=grid.ds, seeds=len(grid.seeds), rank_tol=tol),
        seconds=grid.seconds,
        cpu_seconds=grid.cpu_seconds,
        processes=processes,
        instances=int(grid.feasible.size),
        infeasible=int((~grid.feasible).sum()),
        fallbacks=grid.fallbacks,
        max_solver_inaccuracy=float(np.nanmax(grid.accuracy)),
        max_relative_gap=dict(frobenius=float(np.nanmax(grid.accuracy[0])), nuclear=float(np.nanmax(grid.accuracy[1]))),
        largest_zero_singular_value=float(sv[sv <= tol].max(initial=0.0)),
        smallest_kept_singular_value=float(sv[sv > tol].min(initial=1.0)),
        nuclear_rank_above_frobenius=int(np.sum(ranks[1][grid.feasible] > ranks[0][grid.feasible])),
        mean_rank=grid.mean_rank(tol).tolist(),
        mean_rank_official_style=official_style.tolist(),
        feasible_fraction=grid.feasible.mean(axis=-1).tolist(),
        official_reference=OFFICIAL_REFERENCE["svm_rank"],
    )


# ---------------------------------------------------------------------------------------- report
def table(rows: list[dict], columns: list[str]) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.3g}"
        return "–" if v is None else str(v)

    lines = [" | ".join(columns), " | ".join("---" for _ in columns)]
    lines += [" | ".join(fmt(r.get(c)) for c in columns) for r in rows]
    return "\n".join(lines)


def report(result: dict) -> str:
    out = [
        f"machine: {result['machine']['cpu']} ×{result['machine']['cpus']}, load {result['machine']['load_average']}"
    ]
    if "batching" in result:
        b = result["batching"]
        out += ["", "NGD cost per trajectory-step against B (n=6, T=8, d=10)"]
        cols = ["path", "blas_threads", "B", "us_per_trajectory_step", "speedup_vs_loop", "step_gflops"]
        out += [table(b["rows"], cols + ["matmul_gflops", "flop_fraction"])]
        out += [f"square 1000² matmul: {b['square_matmul_gflops']:.1f} GFLOP/s; best (flop fraction at B ≥ 1024):"]
        out += [
            f"  {k}: flop fraction {v['flop_fraction']:.2f} (B={v['B']}), best {v['us_per_trajectory_step']:.2g} µs, "
            f"{v['speedup_vs_loop']:.0f}× the loop"
            for k, v in b["best"].items()
        ]
    if "scaling" in result:
        s = result["scaling"]
        out += ["", f"cost per trajectory-step against n, T, d (B={s['B']}); exponents:"]
        for var in ("n", "T", "d"):
            out += [f"  {var}: " + ", ".join(f"{k} {v:.2f}" for k, v in s[var]["exponent"].items())]
        out += [f"  total time vs steps: exponent {s['steps']['exponent']:.2f}"]
    if "svm" in result:
        v = result["svm"]
        out += ["", "SVM solve times (ms)"]
        cols = ["axis", "n", "T", "d", "status", "cvxpy_fro_ms", "nnls_fro_ms", "max_margin_fro_ms"]
        cols += ["cvxpy_nuc_clarabel_ms", "nuc_scs_ms"]
        out += [table(v["rows"], cols)]
        out += ["exponents: " + ", ".join(f"{k} {x:.2f}" for k, x in v["exponents"].items())]
        m = v["many"]
        out += [
            f"{m['seeds']} W-SVMs (one per seed): rebuild {m['rebuild_ms_per_solve']:.1f} ms/solve, DPP "
            f"{m['dpp_ms_per_solve']:.1f} (max rel. err {m['dpp_max_relerr']:.1e}), NNLS "
            f"{m['nnls_ms_per_solve']:.2f} (max rel. err {m['nnls_max_relerr']:.1e}); al.max_margin "
            f"{m['max_margin_ms_per_solve']:.2f} (max rel. err {m['max_margin_max_relerr']:.1e})"
        ]
    if "memory" in result:
        out += ["", "peak RSS of a batched run against record_every"]
        out += [table(result["memory"]["rows"], ["record_every", "recorded", "peak_rss_mib", "stored_theta_mib"])]
    if "local_converge" in result:
        lc = result["local_converge"]
        out += ["", "[TFSVM] local convergence rebuilt (al.experiments.factorization.local_convergence; seconds)"]
        for key in ("one_process", "two_processes"):
            r = lc[key]
            parts = ", ".join(f"{k} {x:.2f}" for k, x in r["stages"].items())
            out += [f"  {key}: {r['seconds']:.2f} s ({parts})"]
        for kind, r in lc["results"].items():
            out += [f"  {kind}: " + ", ".join(f"{k} {v:.4g}" for k, v in r.items())]
        ref = lc["official_reference"]
        out += [
            f"  official: {ref['seconds']} s on {ref['measured_utc']} ({ref['machine']}): another day, no ratio; "
            "benchmarks/side_by_side.py times both together"
        ]
    if "rank_grid" in result:
        rg = result["rank_grid"]
        out += [
            "",
            f"[TFSVM] rank grid rebuilt: {rg['instances']} instances ({rg['infeasible']} infeasible, counted apart) in "
            f"{rg['seconds']:.1f} s on {rg['processes']} processes ({rg.get('cpu_seconds', float('nan')):.1f} s CPU "
            "summed over them); certified relative gap ≤ "
            f"{rg['max_solver_inaccuracy']:.1e} ({rg.get('fallbacks', 0)} per-instance fallbacks), "
            f"zeros ≤ {rg['largest_zero_singular_value']:.1e} < threshold {rg['setting']['rank_tol']:g} < kept ≥ "
            f"{rg['smallest_kept_singular_value']:.1e}",
        ]
        ref = rg["official_reference"]
        out += [
            f"  official svm_rank: {ref['seconds']} s on {ref['measured_utc']} ({ref['machine']}): "
            "another day, no ratio"
        ]
    return "\n".join(out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes and few repeats (smoke run)")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, help="run only these sections")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/core.json")
    args = parser.parse_args(argv)
    sections = args.only or list(SECTIONS)
    result = {}
    if args.only and args.out.exists():
        result = json.loads(args.out.read_text())
    started = time.time()
    result.update(
        machine=machine(),
        measured_utc=time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)),
        quick=args.quick,
    )
    runners = dict(
        batching=bench_batching,
        scaling=bench_scaling,
        svm=bench_svm,
        memory=bench_memory,
        local_converge=bench_local_converge,
        rank_grid=bench_rank_grid,
    )
    durations = result.setdefault("section_seconds", {})
    for name in sections:
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        stamp = dict(utc=time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), load_before=list(os.getloadavg()))
        result[name] = runners[name](args.quick)
        durations[name] = time.perf_counter() - t0
        result[name]["measured"] = dict(stamp, load_after=list(os.getloadavg()), seconds=durations[name])
    result["machine"]["load_average_after"] = list(os.getloadavg())
    print(report(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(args.out)
    print(f"\nwritten {args.out}")


if __name__ == "__main__":
    main()
