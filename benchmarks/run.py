"""Speed measurements of attnlib, reported as ratios against baselines run in the same process.

    python benchmarks/run.py [--quick] [--out benchmarks/results/core.json]

Per trajectory-step cost of NGD for a batch of B initialisations stepped together, against the
naive baseline: a Python loop over the same B trajectories, one ``train`` call each. SVM solve
times for the sizes the chapters use. Nothing here asserts a speed; the numbers are printed as a
table and written as JSON for the book's performance page.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np

import attnlib as al


def best_time(fn, repeat: int) -> float:
    """Best of ``repeat`` wall-clock timings (the least disturbed by other processes)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def problems():
    return {
        "fig1 (n=1,T=3,d=3)": al.datasets.single_input(),
        "self-attention (n=6,T=8,d=10)": al.datasets.random_tokens(n=6, T=8, d=10, seed=0),
    }


def bench_batching(quick: bool) -> list[dict]:
    rows = []
    steps = 50 if quick else 200
    loop_size = 20 if quick else 50  # the loop baseline is timed on fewer trajectories, per-trajectory cost
    for name, prob in problems().items():
        rng = np.random.default_rng(0)
        loop_inits = rng.normal(size=(loop_size,) + prob.shape)

        def loop(prob=prob, loop_inits=loop_inits):
            for theta0 in loop_inits:
                al.train(prob, theta0, steps=steps, record_every=steps)

        loop_cost = best_time(loop, 2 if quick else 3) / (loop_size * steps)
        for B in (1, 100, 1000):
            inits = rng.normal(size=(B,) + prob.shape)

            def batch(prob=prob, inits=inits):
                al.train(prob, inits, steps=steps, record_every=steps)

            cost = best_time(batch, 2 if quick else 3)
            per = cost / (B * steps)
            rows.append(
                dict(
                    problem=name,
                    B=B,
                    steps=steps,
                    us_per_trajectory_step=per * 1e6,
                    loop_us_per_trajectory_step=loop_cost * 1e6,
                    speedup_vs_loop=loop_cost / per,
                )
            )
    return rows


def bench_svms(quick: bool) -> list[dict]:
    rng = np.random.default_rng(0)
    n, T, d = 20, 10, 10
    X = rng.normal(size=(n, T, d))
    p_true = rng.normal(size=d)
    v = rng.normal(size=d)
    # Make the SVM feasible: put the highest-scoring token where p_true's logit is largest.
    best = np.argmax(X @ p_true, axis=1)
    y = np.ones(n)
    scores = X @ v
    for i in range(n):
        j = np.argmax(scores[i])
        X[i, [best[i], j]] = X[i, [j, best[i]]]
    cases = {
        "p-SVM (n=20,T=10,d=10)": (al.prompt_attention(X, y, v), "fro"),
        "W-SVM fro (n=6,T=8,d=10)": (al.datasets.random_tokens(6, 8, 10, seed=0), "fro"),
        "W-SVM nuc (n=6,T=8,d=10)": (al.datasets.random_tokens(6, 8, 10, seed=0), "nuc"),
    }
    rows = []
    al.max_margin(cases["p-SVM (n=20,T=10,d=10)"][0])  # warm up cvxpy's import and caches
    for name, (prob, norm) in cases.items():
        try:
            cost = best_time(lambda prob=prob, norm=norm: al.max_margin(prob, norm=norm), 2 if quick else 5)
            status = "optimal"
        except al.InfeasibleError:
            cost, status = float("nan"), "infeasible"
        rows.append(dict(problem=name, norm=norm, ms_per_solve=cost * 1e3, status=status))
    return rows


def table(rows: list[dict], columns: list[str]) -> str:
    def fmt(v):
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    lines = [" | ".join(columns), " | ".join("---" for _ in columns)]
    lines += [" | ".join(fmt(r[c]) for c in columns) for r in rows]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps and repeats (smoke run)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/core.json"))
    args = parser.parse_args(argv)
    batching = bench_batching(args.quick)
    svms = bench_svms(args.quick)
    print("NGD cost per trajectory-step (batch of B vs a Python loop over trajectories)")
    print(table(batching, ["problem", "B", "us_per_trajectory_step", "loop_us_per_trajectory_step", "speedup_vs_loop"]))
    print("\nSVM solves (cvxpy, CLARABEL)")
    print(table(svms, ["problem", "norm", "ms_per_solve", "status"]))
    result = dict(
        machine=dict(python=platform.python_version(), processor=platform.machine(), numpy=np.__version__),
        quick=args.quick,
        batching=batching,
        svms=svms,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(args.out)
    print(f"\nwritten {args.out}")


if __name__ == "__main__":
    main()
