"""The training step of the W and (K, Q) stacks, today's against the previous one, in one process.

    python benchmarks/step.py [--steps 400] [--rounds 3] [--out benchmarks/results/step.json]

[TFSVM]'s local-convergence setting (100 problems ``datasets.random_tokens(6, 8, 10, seed=s,
queries="cross")``, NGD with lr 0.1, (K, Q) normalised factor by factor): ``train`` on W from 0
and ``train_kq`` on (K, Q) from ``kq_init``, each run with today's step
(:func:`attnlib.model.terms_and_scaled_grad`) and with the previous one (main 3b4fcf4's fused
step, copied below as :func:`previous_step` and patched in for the baseline run), alternately,
``rounds`` times. The previous step computed the logits by S·n matrix-vector products,
``σ = exp(log σ)`` by a second exponential, the output from ``log δ`` and ``log δ`` at every
step; today's takes S BLAS products for the logits, reuses the softmax's exponentials, gets the
output from the weights' cancellation-free sum and ``log δ`` only at recorded steps. Times are
CPU seconds of this process (``time.process_time``), so the load of other processes on the
machine enters only through caches; the ratio is taken within a round. The two runs agree to
rounding, not bit for bit: the largest relative difference of the final W (over the members)
is reported; the W half must agree to 1e-12, the (K, Q) half to 1e-9 or better on all but
members whose NGD trajectory amplifies rounding (reported by count, not hidden).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import numpy as np
from machine_info import load, machine, utc_now

import attnlib as al
from attnlib import model, optim


def _token_sum(x: np.ndarray) -> np.ndarray:
    """main 3b4fcf4's ``attnlib.model._token_sum`` (the baseline's token sums), verbatim.

    ``x.sum(axis=0)`` over a leading token axis, adding the same numbers in the same order as
    :func:`attnlib.model._sum_keepdims` over a last one (numpy's pairwise order), so the two
    layouts agree bit for bit. With the tokens first, each addition is one vectorised call over
    every sample at once.

    >>> x = np.random.default_rng(0).normal(size=(11, 4, 3))
    >>> bool(np.array_equal(_token_sum(x), model._sum_keepdims(np.moveaxis(x, 0, -1).copy())[..., 0]))
    True
    """
    T = x.shape[0]
    if not 0 < T <= 128:
        return np.ascontiguousarray(np.moveaxis(x, 0, -1)).sum(axis=-1)
    if T < 8:
        total = x[0]
        for t in range(1, T):
            total = total + x[t]
        return total
    full = T - T % 8
    r = x[:8]
    for start in range(8, full, 8):
        r = r + x[start : start + 8]
    r = r[0::2] + r[1::2]
    r = r[0::2] + r[1::2]
    total = r[0] + r[1]
    for t in range(full, T):
        total = total + x[t]
    return total


def previous_fused_step(logits: np.ndarray, gamma: np.ndarray, log_score_gap: np.ndarray, gamma_opt: np.ndarray, loss):
    """main 3b4fcf4's ``attnlib.model._fused_step``, verbatim (the baseline): log-softmax, deficit terms and weights.

    The same formulas as :func:`log_softmax`, :func:`_deficit_terms` and :func:`_scaled_weights`,
    operation for operation (the same bits), on arrays laid out ``(T, B, n)`` instead of
    ``(B, n, T)``: a reduction over tokens is then ``T`` vectorised calls over all ``B·n``
    samples, and a per-sample quantity (B, n) broadcasts along whole rows, where over a short
    last axis numpy loops sample by sample. The reference token is addressed by index, not by
    masks, and the exponentials avoid numpy's slow underflow path (:func:`_exp`).

    Args: ``logits``, ``gamma``, ``log_score_gap`` (T, B, n) contiguous; ``gamma_opt`` (B, n).
    Returns ``log_sigma`` (T, B, n), ``log_delta`` and ``output`` (B, n), ``m`` (B,) and the
    weights ``w_scaled`` (T, B, n) with ``∇L = exp(m) Σ_it w_it (A_it − A_i,opt)``.
    """
    T, B, n = logits.shape
    shifted = logits - logits.max(axis=0)
    log_norm = np.log(_token_sum(model._exp(shifted)))
    log_sigma = shifted - log_norm
    # δ_i = Σ_t σ_it Δ_it in log space (logsumexp, max-subtracted)
    a = log_sigma + log_score_gap
    top = a.max(axis=0)
    top = np.where(np.isfinite(top), top, 0.0)
    log_delta = np.log(_token_sum(model._exp(a - top))) + top
    output = gamma_opt - np.exp(log_delta)
    # The reference token r_i, np.argmax's choice (the first maximum of log σ_i). max_t log σ_it is
    # exactly 0 − log Σ_t exp(shifted): the maximum of the shifted logits is 0.
    ref = np.flatnonzero(log_sigma == -log_norm)  # flat indices t·(B·n) + sample, one per sample unless tied
    if len(ref) != B * n or np.isnan(log_norm).any():  # a tie (e.g. at θ = 0) or a NaN
        ref = np.flatnonzero(np.arange(T)[:, None, None] == np.argmax(log_sigma, axis=0))
    sample = ref % (B * n)
    gamma_ref = np.empty(B * n)
    gamma_ref[sample] = gamma.reshape(-1)[ref]
    ref_gap = gamma_ref.reshape(B, n) - gamma  # γ_ir − γ_it
    # u_i − γ_it (= −(γ_it − u_i) exactly: IEEE subtraction is antisymmetric), cancellation-free
    neg_diff = ref_gap - _token_sum(model._exp(log_sigma) * ref_gap)
    log_abs = (np.log(-loss.derivative(output)) - np.log(n)) + log_sigma
    log_abs += np.log(np.abs(neg_diff))
    log_abs.reshape(-1)[ref] = -np.inf
    m = log_abs.max(axis=0).max(axis=-1)
    finite_m = np.where(np.isfinite(m), m, 0.0)
    log_abs -= np.repeat(finite_m, n).reshape(B, n)
    w_scaled = np.copysign(model._exp(log_abs), neg_diff)  # −sign(γ_it − u_i)·exp(…); exp(−inf) = 0 where it is 0
    w_scaled.reshape(-1)[ref] = -_token_sum(w_scaled).reshape(-1)[sample]
    return log_sigma, log_delta, output, m, w_scaled


def previous_step(prob, flat, log_delta=True):
    """main 3b4fcf4's ``_LinearLogits.step_from_flat`` (log δ at every step, whatever is asked)."""
    lead = flat.shape[:-1]
    B, n, T = math.prod(lead), prob.n, prob.T
    logits = np.ascontiguousarray(prob.logits_flat(flat).reshape(B, n, T).transpose(2, 0, 1))
    gamma, log_score_gap, gamma_opt = prob._token_major(B)
    with np.errstate(divide="ignore"):
        log_sigma, log_delta, output, m, w = previous_fused_step(logits, gamma, log_score_gap, gamma_opt, prob.loss)
    log_sigma = log_sigma.transpose(1, 2, 0).reshape(lead + (n, T))
    terms = model.Terms(log_sigma, log_delta.reshape(lead + (n,)), output.reshape(lead + (n,)))
    g = prob.adjoint_flat(np.ascontiguousarray(w.transpose(1, 2, 0)).reshape(lead + (n, T)))
    return terms, m.reshape(lead), g


def half(kind: str, stack, K0, Q0, steps: int) -> np.ndarray:
    """One half of the local-convergence experiment; returns the final W (S, d, d_z)."""
    if kind == "W":
        return optim.train(stack, np.zeros(stack.shape), steps, "ngd", 0.1, record_steps=[steps], progress=False).final
    return optim.train_kq(stack, K0, Q0, steps, "ngd", 0.1, normalize="separate", record_steps=[steps]).final


def timed(kind, step, stack, K0, Q0, steps):
    today = optim.terms_and_scaled_grad
    optim.terms_and_scaled_grad = step
    try:
        start = time.process_time()
        final = half(kind, stack, K0, Q0, steps)
        return time.process_time() - start, final
    finally:
        optim.terms_and_scaled_grad = today


def relative_gap(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Largest |a − b| of each member relative to its largest |b|: (S,)."""
    S = len(b)
    return np.abs(a - b).reshape(S, -1).max(axis=1) / np.abs(b).reshape(S, -1).max(axis=1)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None, help="write the result as JSON here")
    args = parser.parse_args(argv)
    probs = [al.datasets.random_tokens(6, 8, 10, seed=s, queries="cross") for s in range(100)]
    stack = al.stack_problems(probs)
    K0, Q0 = optim.kq_init(stack.S, *stack.shape, seed=0)
    rows = {kind: {"previous": [], "today": []} for kind in ("W", "KQ")}
    gaps = {}
    load_before = load()
    for _ in range(args.rounds):
        for kind in rows:
            t_old, W_old = timed(kind, previous_step, stack, K0, Q0, args.steps)
            t_new, W_new = timed(kind, optim.terms_and_scaled_grad, stack, K0, Q0, args.steps)
            gap = relative_gap(W_new, W_old)
            gaps[kind] = {"max": float(gap.max()), "median": float(np.median(gap))}
            gaps[kind]["above_1e-9"] = int((gap > 1e-9).sum())
            if kind == "W" and gap.max() > 1e-12:
                raise SystemExit(f"W: today's step moved the trajectory beyond rounding (max relative {gap.max():.2e})")
            rows[kind]["previous"].append(t_old)
            rows[kind]["today"].append(t_new)
    result = {
        "when": utc_now(),
        "machine": machine(),
        "load_before": load_before,
        "load_after": load(),
        "setting": dict(S=100, n=6, T=8, d=10, steps=args.steps, rounds=args.rounds, lr=0.1, method="ngd"),
        "cpu_seconds": rows,
        "ratio_per_round": {kind: [o / n for o, n in zip(r["previous"], r["today"])] for kind, r in rows.items()},
        "final_W_relative_gap": gaps,
    }
    result["median_ratio"] = {kind: statistics.median(v) for kind, v in result["ratio_per_round"].items()}
    result["us_per_step"] = {
        kind: {k: 1e6 * statistics.median(v) / args.steps for k, v in r.items()} for kind, r in rows.items()
    }
    keys = ("median_ratio", "us_per_step", "final_W_relative_gap", "load_before", "load_after")
    print(json.dumps({k: result[k] for k in keys}, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
