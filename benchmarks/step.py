"""The training step of the (W and (K, Q)) stacks, fused against unfused, in one process.

    python benchmarks/step.py [--steps 400] [--rounds 3] [--out benchmarks/results/step.json]

[TFSVM]'s local-convergence setting (100 problems ``datasets.random_tokens(6, 8, 10, seed=s,
queries="cross")``, NGD with lr 0.1, (K, Q) normalised factor by factor): ``train`` on W from 0
and ``train_kq`` on (K, Q) from ``kq_init``, each run with the fused step
(:func:`attnlib.model.terms_and_scaled_grad`, today's code) and with the unfused one it replaces
(``terms_from_flat`` then ``scaled_grad_from``, patched in for the baseline run), alternately,
``rounds`` times. Times are CPU seconds of this process (``time.process_time``), so the load of
other processes on the machine enters only through caches; the ratio is taken within a round.
The two runs must give the same trajectories bit for bit (checked; the run fails otherwise).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
from machine_info import load, machine, utc_now

import attnlib as al
from attnlib import optim


def unfused(prob, flat):
    """The step as it was: the two calls of the :class:`attnlib.AttentionProblem` protocol."""
    terms = prob.terms_from_flat(flat)
    return (terms, *prob.scaled_grad_from(terms))


def half(kind: str, stack, K0, Q0, steps: int) -> np.ndarray:
    """One half of the local-convergence experiment; returns the final W (S, d, d_z)."""
    if kind == "W":
        return optim.train(stack, np.zeros(stack.shape), steps, "ngd", 0.1, record_steps=[steps], progress=False).final
    return optim.train_kq(stack, K0, Q0, steps, "ngd", 0.1, normalize="separate", record_steps=[steps]).final


def timed(kind, step, stack, K0, Q0, steps):
    fused = optim.terms_and_scaled_grad
    optim.terms_and_scaled_grad = step
    try:
        start = time.process_time()
        final = half(kind, stack, K0, Q0, steps)
        return time.process_time() - start, final
    finally:
        optim.terms_and_scaled_grad = fused


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None, help="write the result as JSON here")
    args = parser.parse_args(argv)
    probs = [al.datasets.random_tokens(6, 8, 10, seed=s, queries="cross") for s in range(100)]
    stack = al.stack_problems(probs)
    K0, Q0 = optim.kq_init(stack.S, *stack.shape, seed=0)
    rows = {kind: {"unfused": [], "fused": []} for kind in ("W", "KQ")}
    load_before = load()
    for _ in range(args.rounds):
        for kind in rows:
            t_old, W_old = timed(kind, unfused, stack, K0, Q0, args.steps)
            t_new, W_new = timed(kind, optim.terms_and_scaled_grad, stack, K0, Q0, args.steps)
            if not np.array_equal(W_old, W_new):
                gap = np.abs(W_old - W_new).max()
                raise SystemExit(f"{kind}: the fused step changed the trajectory (max |Δ| {gap})")
            rows[kind]["unfused"].append(t_old)
            rows[kind]["fused"].append(t_new)
    result = {
        "when": utc_now(),
        "machine": machine(),
        "load_before": load_before,
        "load_after": load(),
        "setting": dict(S=100, n=6, T=8, d=10, steps=args.steps, rounds=args.rounds, lr=0.1, method="ngd"),
        "cpu_seconds": rows,
        "ratio_per_round": {kind: [o / n for o, n in zip(r["unfused"], r["fused"])] for kind, r in rows.items()},
    }
    result["median_ratio"] = {kind: statistics.median(v) for kind, v in result["ratio_per_round"].items()}
    result["us_per_step"] = {
        kind: {k: 1e6 * statistics.median(v) / args.steps for k, v in r.items()} for kind, r in rows.items()
    }
    print(json.dumps({k: result[k] for k in ("median_ratio", "us_per_step", "load_before", "load_after")}, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
