"""Chapter 5, fast rates of normalised GD and the Polyak step against GD [FAST].

The chapter's drivers: one run of every method on a stack of problems (:func:`compare_methods`),
the selections of many random problems (:func:`selection_sweep`), the runs that end off the
optimal tokens and their local selections (:func:`off_opt_runs`), and the chapter's tables. The
fits they are judged with are :mod:`attnlib.fits`; the problems :func:`attnlib.model.logistic_regression`
and :func:`attnlib.model.reduce_to_span`; the data :mod:`attnlib.datasets`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
from scipy.special import expit

from .. import datasets
from ..metrics import curves, direction_error, log_one_minus_mass, normalized_margin
from ..model import Reduced, TokenSelectionProblem, logistic_regression, reduce_to_span, stack_problems
from ..optim import Trajectory, log_steps, record_schedule, run_independent, train_many
from ..svm import InfeasibleError, MaxMarginSolution, is_locally_optimal, max_margin, svm_feasibility

__all__ = [
    "solve_each",
    "Comparison",
    "compare_methods",
    "logistic_descent",
    "compare_logistic",
    "ends_off_opt",
    "local_selection",
    "SelectionSweep",
    "selection_sweep",
    "reduced_tokens",
    "FITTED_RATES",
    "fitted_rates_table",
    "local_selection_table",
    "off_opt_runs",
    "one_token_off",
    "margins",
    "sequence_margins",
    "sequence_sparsity_rates",
    "sparsity_deviation",
    "sparsity_statistic",
    "budget_gain",
    "feasibility_table",
]


# ------------------------------------------------------- comparing GD, NGD and Polyak on batches
def solve_each(problems: Sequence[TokenSelectionProblem], select=None) -> list[MaxMarginSolution | None]:
    """The W-SVM (:func:`attnlib.max_margin`) of each problem, ``None`` where it is infeasible.

    ``select``: one selection for every problem (default each problem's optimal tokens). An
    infeasible W-SVM (:class:`attnlib.InfeasibleError`) is reported as ``None``, never as a number.

    >>> import attnlib as al
    >>> sols = solve_each([al.datasets.single_input(), al.datasets.single_input(local=True)])
    >>> [s is not None for s in sols]
    [True, True]
    """

    out = []
    for prob in problems:
        try:
            out.append(max_margin(prob, select=select))
        except InfeasibleError:
            out.append(None)
    return out


@dataclass(frozen=True)
class Comparison:
    """Trajectories of several methods on the same S problems, and their :func:`curves`.

    Attributes:
        runs: ``{method: Trajectory}``, each with ``theta`` (R_m, S, *shape) (its own record grid).
        curves: ``{method: {key: (R_m, S)}}`` as :func:`curves` returns them.
    """

    runs: dict
    curves: dict

    def select(self, members) -> Comparison:
        """The problems ``members`` (an index array or a boolean mask over the S problems)."""
        members = np.asarray(members)
        if members.dtype == bool:
            members = np.flatnonzero(members)
        return Comparison(
            {m: run.select(members) for m, run in self.runs.items()},
            {m: {k: v[:, members] for k, v in c.items()} for m, c in self.curves.items()},
        )

    def __or__(self, other: Comparison) -> Comparison:
        """The methods of both (on the same problems); ``other`` wins where both have one."""
        return Comparison({**self.runs, **other.runs}, {**self.curves, **other.curves})


def compare_methods(
    problems: Sequence[TokenSelectionProblem],
    solutions: Sequence[MaxMarginSolution | None],
    steps,
    lr: dict,
    polyak_max_step: float = 10.0,
    processes: int | None = None,
) -> Comparison:
    """Each method of ``lr`` run by :func:`train_many` on all the problems from 0, one batch per method.

    Args:
        problems, solutions: S problems and their W-SVMs (``None`` where infeasible; see :func:`curves`).
        steps: iterations, one number or ``{method: steps}``.
        lr: ``{method: step size}``, e.g. ``{"gd": 50.0, "ngd": 0.2, "polyak": 1.0}`` (Polyak's is a
            multiplier of its step ``(L − L*)/‖∇L‖²``). The keys are the methods run.
        polyak_max_step: the Polyak detector's threshold (:func:`attnlib.train`).

    The batches have the same problems, so their wall-clock ``seconds`` compare. They run in up to
    ``processes`` processes (:func:`attnlib.optim.run_independent`), each on its own core.

    >>> import attnlib as al
    >>> probs = [al.datasets.single_input(), al.datasets.single_input(third_score=0.5)]
    >>> cmp = compare_methods(probs, solve_each(probs), 50, {"gd": 1.0, "ngd": 0.1})
    >>> sorted(cmp.runs), cmp.curves["ngd"]["direction_error"].shape[1]
    (['gd', 'ngd'], 2)
    """
    problems, solutions = list(problems), list(solutions)

    def run_and_measure(method):  # the methods are independent batches (run_independent: the same numbers)
        horizon = steps[method] if isinstance(steps, dict) else steps
        run = train_many(problems, horizon, method, lr[method], polyak_max_step=polyak_max_step)
        return run, curves(problems, run, solutions)

    done = dict(zip(lr, run_independent([partial(run_and_measure, m) for m in lr], processes)))
    return Comparison({m: r for m, (r, _) in done.items()}, {m: c for m, (_, c) in done.items()})


def logistic_descent(data: Sequence[tuple], steps: int, method: str, lr: float, record=None) -> Trajectory:
    """GD or NGD from ``w = 0`` on linear logistic regression, every data set in one batch.

    ``L(w) = (1/n) Σ_i log(1 + exp(−y_i wᵀx_i))``, ``−n∇L = Σ_i sigmoid(−y_i wᵀx_i) y_i x_i =: g``;
    GD: ``w ← w + (η/n) g``, NGD: ``w ← w + η g/‖g‖``. These are the iterations :func:`attnlib.train`
    runs on :func:`attnlib.model.logistic_regression` ``(X, y)`` (the same numbers within rounding),
    written for this problem alone: two batched matrix products a step instead of the general
    trainer's log-space gradient and stopping rules, about twenty times faster. The loss, its gap
    and the gradient norm are computed at the recorded steps only, by the problem itself. For
    separable data the margins grow like ``log t``: the sigmoid stays far from underflow.

    Args: ``data`` S pairs ``(X (n, d), y (n,))`` of equal shapes; ``steps``; ``method`` "gd" or
    "ngd"; ``lr`` the step η; ``record`` the steps recorded (default :func:`attnlib.log_steps`).
    Returns a :class:`attnlib.Trajectory` with ``theta`` (R, S, d), as :func:`attnlib.train_many`'s.

    >>> import numpy as np, attnlib as al
    >>> X, y = al.datasets.separable_data(10, 2, 0)
    >>> fast = logistic_descent([(X, y)], 200, "ngd", 0.5)
    >>> run = al.train_many([al.model.logistic_regression(X, y)], 200, "ngd", 0.5)
    >>> bool(np.allclose(fast.theta, run.theta, rtol=1e-12)), bool(np.allclose(fast.loss, run.loss, rtol=1e-12))
    (True, True)
    """
    if method not in ("gd", "ngd"):
        raise ValueError(f"method must be 'gd' or 'ngd', got {method!r}")
    if not (np.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a positive finite step size, got {lr!r}")
    record = log_steps(steps) if record is None else record_schedule(steps, 1, record)
    problems = stack_problems([logistic_regression(X, y) for X, y in data])
    signed = np.stack([np.asarray(y, float)[:, None] * np.asarray(X, float) for X, y in data])  # (S, n, d)
    signed_t = np.ascontiguousarray(signed.transpose(0, 2, 1))
    w = np.zeros(signed.shape[::2] + (1,))  # (S, d, 1): one batched matrix product per data set and step
    theta, seconds = np.empty((len(record),) + w.shape[:2]), np.empty(len(record))
    start, r = time.perf_counter(), 0
    for k in range(int(record[-1]) + 1):
        if k == record[r]:
            theta[r], seconds[r] = w[..., 0], time.perf_counter() - start
            r += 1
            if k == record[-1]:
                break
        g = signed_t @ expit(-(signed @ w))  # −n ∇L
        w += (lr / signed.shape[1]) * g if method == "gd" else lr * g / np.linalg.norm(g, axis=1, keepdims=True)
    if not np.all(np.isfinite(theta)):
        raise ValueError(f"{method} diverged: lr = {lr} is too large for these data")
    log_scale, g = problems.scaled_grad(theta)
    return Trajectory(
        theta=theta,
        steps=record,
        loss=problems.value(theta),
        log_gap=problems.log_gap(theta),
        log_grad_norm=log_scale + np.log(np.linalg.norm(g, axis=-1)),
        stopped=(None,) * problems.S,
        method=method,
        lr=float(lr),
        seconds=seconds,
    )


def compare_logistic(data: Sequence[tuple], solutions: Sequence[MaxMarginSolution], steps: int, lr: dict) -> Comparison:
    """:func:`compare_methods` for linear logistic regression (GD and NGD), by :func:`logistic_descent`.

    ``data``: S pairs ``(X, y)``; ``solutions``: their hard-margin SVMs (:func:`solve_each` of
    :func:`attnlib.model.logistic_regression`); ``lr``: ``{"gd": η, "ngd": η}`` (the methods run).

    >>> import attnlib as al
    >>> data = [al.datasets.separable_data(10, 2, s) for s in range(3)]
    >>> sols = solve_each([al.model.logistic_regression(X, y) for X, y in data])
    >>> cmp = compare_logistic(data, sols, 100, {"gd": 2.0, "ngd": 0.2})
    >>> cmp.curves["gd"]["direction_error"].shape[1], bool(cmp.curves["ngd"]["direction_error"][-1].max() < 0.5)
    (3, True)
    """
    problems = [logistic_regression(X, y) for X, y in data]
    runs = {m: logistic_descent(data, steps, m, rate) for m, rate in lr.items()}
    return Comparison(runs, {m: curves(problems, run, solutions) for m, run in runs.items()})


def ends_off_opt(problems: Sequence[TokenSelectionProblem], traj: Trajectory, unstopped: bool = False) -> np.ndarray:
    """Indices of the trajectories whose last parameters do not select every optimal token.

    ``unstopped=True`` keeps only those the optimizer did not stop: a silent failure of the Polyak
    step (its detector, :func:`attnlib.train`, stops a run saturated on a non-optimal token).
    """
    return np.array(
        [
            k
            for k, prob in enumerate(problems)
            if np.any(prob.selection(traj.final[k]) != prob.opt) and not (unstopped and traj.stopped[k] is not None)
        ],
        dtype=int,
    )


def local_selection(prob: TokenSelectionProblem, theta, sol_opt: MaxMarginSolution | None) -> dict:
    """Where a run that ends at a selection ``α = prob.selection(theta) ≠ opt`` is heading.

    Returns a dict: ``alpha`` (n,), ``off`` (the samples with ``α_i ≠ opt_i``), ``locally_optimal``
    (:func:`attnlib.svm.is_locally_optimal`), ``neighbour`` (True if some such sample's optimal token is
    an SVM-neighbour of ``α``), ``to_local`` and ``to_opt``: the direction errors of ``theta`` to
    ``W_mm(α)`` and to ``W_mm(opt)`` (NaN if ``sol_opt`` is None).
    """

    alpha = prob.selection(theta)
    sol = max_margin(prob, select=alpha)
    off = np.flatnonzero(alpha != prob.opt)
    return {
        "alpha": alpha,
        "off": off,
        "locally_optimal": bool(is_locally_optimal(prob, alpha)),
        "neighbour": bool(np.any(sol.neighbors[off, prob.opt[off]])),
        "to_local": float(direction_error(theta, sol.theta)),
        "to_opt": float(direction_error(theta, sol_opt.theta)) if sol_opt is not None else float("nan"),
        "solution": sol,
    }


@dataclass(frozen=True)
class SelectionSweep:
    """NGD from 0 on many problems: which end at the optimal tokens, and which W-SVMs are feasible.

    Attributes:
        run: the NGD :class:`attnlib.Trajectory` (R, S, *shape).
        selects_opt: (S,) bool, the final selection is ``opt`` in every sample.
        status: (S,) ``"certified"`` (a run selecting opt certifies that the W-SVM of opt is
            feasible: ``W_t`` divided by its smallest logit gap satisfies every constraint),
            ``"solver"`` (feasible by :func:`attnlib.max_margin`) or ``"infeasible"``.
    """

    run: Trajectory
    selects_opt: np.ndarray
    status: np.ndarray

    @property
    def feasible(self) -> np.ndarray:
        """(S,) bool: the W-SVM of opt is feasible."""
        return self.status != "infeasible"

    def table(self, groups, name: str = "d") -> tuple[dict, str]:
        """Per group (e.g. the dimension ``d`` of each problem): the fraction of feasible problems
        that end at opt (NaN if none is feasible), and a Markdown table of the counts."""
        groups = np.asarray(groups)
        fraction = {}
        rows = [
            f"| {name} | infeasible | feasible | global: selects opt | fraction global (feasible only) |",
            "|---|---|---|---|---|",
        ]
        for g in dict.fromkeys(groups.tolist()):
            at = groups == g
            feas = at & self.feasible
            fraction[g] = float(self.selects_opt[feas].mean()) if feas.any() else float("nan")
            shown = f"{fraction[g]:.2f}" if feas.any() else "– (none feasible)"
            counts = f"{np.sum(at & ~self.feasible)} | {feas.sum()} | {np.sum(self.selects_opt[feas])}"
            rows.append(f"| {g} | {counts} | {shown} |")
        return fraction, "\n".join(rows)


def selection_sweep(problems: Sequence[TokenSelectionProblem], steps: int, lr: float) -> SelectionSweep:
    """NGD for ``steps`` from 0 on every problem (one batch), then the feasibility of each W-SVM of opt.

    A run that ends selecting opt certifies feasibility; for the others :func:`svm_feasibility`
    decides with a certificate, or else :func:`attnlib.max_margin` (:class:`SelectionSweep`).

    >>> import attnlib as al
    >>> sw = selection_sweep([al.datasets.single_input(), al.datasets.single_input(local=True)], 100, 0.5)
    >>> sw.status.tolist()
    ['certified', 'certified']
    """
    problems = list(problems)
    run = train_many(problems, steps, "ngd", lr)
    selects = np.array([np.all(p.selection(run.final[k]) == p.opt) for k, p in enumerate(problems)])
    status = np.where(selects, "certified", "solver").astype(object)
    for k in np.flatnonzero(~selects):
        verdict = svm_feasibility(problems[k])  # a certificate either way, without cvxpy
        if verdict is False or (verdict is None and solve_each([problems[k]])[0] is None):
            status[k] = "infeasible"
    return SelectionSweep(run, selects, status.astype(str))


def reduced_tokens(n: int, T: int, d: int, seeds, size: int | None = None, **family) -> list[Reduced]:
    """One :func:`attnlib.datasets.random_tokens` problem per seed, each :func:`reduce_to_span`.

    ``family`` goes to ``random_tokens`` (``family``, ``queries``, ``loss``...); ``size`` is the
    common reduced dimension (``n(T − 1)`` makes problems of every ``d`` stackable).

    >>> import attnlib as al
    >>> batch = reduced_tokens(3, 4, 16, [0, 1], size=9, family="global")
    >>> [r.problem.shape for r in batch], batch[0].source.shape
    ([(9,), (9,)], (16, 16))
    """

    return [reduce_to_span(datasets.random_tokens(n, T, d, s, **family), size=size) for s in seeds]


#: The rows of :func:`fitted_rates_table`: quantity, then (shape, measured-as) for GD, NGD and Polyak.
FITTED_RATES = (
    ("‖W_t‖", ("‖W_mm‖ log t + O(1)", "slope vs log t / ‖W_mm‖", "gd_norm_logt"),
     ("η t", "slope / η", "ngd_norm_t"), ("linear", "per step", "polyak_norm_t")),
    ("direction error", ("1/log t", "apparent exponent of t", "gd_dist_exponent"),
     ("polynomial", "exponent of t", "ngd_dist_exponent"), ("polynomial", "exponent of t", "polyak_dist_exponent")),
    ("1 − σ_opt", ("1/t", "exponent of t", "gd_mass_exponent"),
     ("exp(−η t/‖W_mm‖)", "rate / (η/‖W_mm‖)", "ngd_mass_rate"),
     ("exp(−‖W_t‖/‖W_mm‖)", "rate per unit norm × ‖W_mm‖", "polyak_mass_rate")),
    ("L − L*", ("1/t", "exponent of t", "gd_gap_exponent"), ("exp(−Θ(t))", "rate / (η/‖W_mm‖)", "ngd_gap_rate"),
     ("exponential", "rate per unit norm × ‖W_mm‖", "polyak_gap_rate")),
)  # fmt: skip


def fitted_rates_table(rates: dict, digits: int = 3) -> str:
    """A Markdown table of fitted rates next to the expected shapes, for GD, NGD and Polyak.

    ``rates``: the measured values under the keys of :data:`FITTED_RATES` (e.g. ``"ngd_mass_rate"``).

    >>> import attnlib as al
    >>> keys = [cell[2] for row in FITTED_RATES for cell in row[1:]]
    >>> table = fitted_rates_table(dict.fromkeys(keys, 1.0))
    >>> table.count("\\n"), "rate / (η/‖W_mm‖) = 1.000" in table
    (5, True)
    """
    lines = [
        "| quantity | GD: shape | GD: measured | NGD: shape | NGD: measured | Polyak: shape | Polyak: measured |",
        "|---" * 7 + "|",
    ]
    for quantity, *cells in FITTED_RATES:
        row = [f"{shape} | {label} = {rates[key]:.{digits}f}" for shape, label, key in cells]
        lines.append(f"| {quantity} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def local_selection_table(entries) -> str:
    """A Markdown table of runs that end at a selection ``α ≠ opt``: ``entries`` of
    ``(d, data seed, local_selection(...) dict)`` (:func:`local_selection`)."""
    lines = [
        "| d | data seed | sequences off opt | α locally optimal | opt token an SVM-neighbour of α "
        "| distance to W_mm(α) | distance to W_mm |",
        "|---|---|---|---|---|---|---|",
    ]
    for dd, s, w in entries:
        lines.append(
            f"| {dd} | {s} | {w['off'].tolist()} | {w['locally_optimal']} | {'yes' if w['neighbour'] else 'no'} "
            f"| {w['to_local']:.3f} | {w['to_opt']:.3f} |"
        )
    return "\n".join(lines)


def off_opt_runs(problems: Sequence[TokenSelectionProblem], comparison: Comparison, solutions) -> dict:
    """The runs of a GD/NGD :class:`Comparison` that end off an optimal token, among problems whose
    W-SVM of opt is feasible (``solutions[k]`` not None).

    Returns ``{"gd_slow": [k...], "gd_local": [k...], "ngd_local": [(k, local_selection(...))...]}``:
    GD runs off opt where NGD reached opt on the same problem (slow, not trapped), GD runs off opt
    where NGD is too, and each NGD run off opt with where it heads (:func:`local_selection`).
    """
    feasible = [s is not None for s in solutions]
    ngd_off = [int(k) for k in ends_off_opt(problems, comparison.runs["ngd"]) if feasible[k]]
    gd_off = [int(k) for k in ends_off_opt(problems, comparison.runs["gd"]) if feasible[k]]
    final = comparison.runs["ngd"].final
    return {
        "gd_slow": [k for k in gd_off if k not in ngd_off],
        "gd_local": [k for k in gd_off if k in ngd_off],
        "ngd_local": [(k, local_selection(problems[k], final[k], solutions[k])) for k in ngd_off],
    }


def feasibility_table(groups, solutions, name: str = "d") -> str:
    """A Markdown table, per group (e.g. the dimension ``d`` of each problem): problems, feasible
    W-SVMs (``solutions[k]`` not None) and their median ``‖W_mm‖ = 1/margin``."""
    groups = np.asarray(groups)
    norms = np.array([1 / s.margin if s is not None else np.nan for s in solutions])
    lines = [f"| {name} | problems | W-SVM feasible | median ‖W_mm‖ |", "|---|---|---|---|"]
    for g in dict.fromkeys(groups.tolist()):
        sel = (groups == g) & np.isfinite(norms)
        median = f"{np.median(norms[sel]):.3f}" if sel.any() else "–"
        lines.append(f"| {g} | {np.sum(groups == g)} | {sel.sum()} | {median} |")
    return "\n".join(lines)


# ------------------------------------------------------- the checks' references and controls
def one_token_off(prob: TokenSelectionProblem) -> np.ndarray:
    """The selection one token off: ``opt`` with sequence 0's token replaced by its second-best token.

    The nearest wrong selection a check on ``opt`` must tell apart (a control). Returns (n,).

    >>> import attnlib as al
    >>> prob = al.datasets.single_input()
    >>> bool(one_token_off(prob)[0] != prob.opt[0])
    True
    """
    alpha = prob.opt.copy()
    order = np.argsort(-prob.gamma[0], kind="stable")
    alpha[0] = order[1] if order[0] == prob.opt[0] else order[0]
    return alpha


def margins(problems: Sequence[TokenSelectionProblem], thetas) -> np.ndarray:
    """The normalised margin ``γ(θ_k)`` of ``opt`` (:func:`attnlib.metrics.normalized_margin`) of each problem
    for the k-th row of ``thetas`` (K, size), reshaped to the problem's parameter shape. ``γ(θ_mm) = 1/‖θ_mm‖``.

    >>> import attnlib as al
    >>> prob = al.datasets.single_input()
    >>> sol = al.max_margin(prob)
    >>> bool(abs(margins([prob], [sol.theta.ravel()])[0] - sol.margin) < 1e-9)
    True
    """
    return np.array([float(normalized_margin(p, np.reshape(th, p.shape))) for p, th in zip(problems, thetas)])


def sequence_margins(problems: Sequence[TokenSelectionProblem], thetas) -> np.ndarray:
    """Each sequence's normalised margin of ``opt`` along a reference.

    ``γ_i(θ) = min_{t≠opt_i} ⟨θ, A_i,opt − A_it⟩/‖θ‖``.
    ``thetas`` (K, size): one reference per problem (reshaped to the problem's parameter shape).
    Returns (K, n). The minimum over ``i`` is :func:`margins`; along the W-SVM every sequence has
    ``γ_i(θ_mm) ≥ 1/‖θ_mm‖``, with equality on its support sequences, and along the W-SVM of a
    selection ``α`` the sequences with ``α_i ≠ opt_i`` have ``γ_i ≤ −1/‖θ_mm(α)‖ < 0``.

    >>> import attnlib as al
    >>> prob = al.datasets.single_input()
    >>> sol = al.max_margin(prob)
    >>> bool(abs(sequence_margins([prob], [sol.theta.ravel()])[0, 0] - sol.margin) < 1e-9)
    True
    """
    rows = []
    for p, th in zip(problems, thetas):
        theta = np.reshape(th, p.shape)
        logits = p.logits(theta)
        gap = logits[np.arange(p.n), p.opt][:, None] - logits
        gap[np.arange(p.n), p.opt] = np.inf
        rows.append(gap.min(axis=-1) / np.linalg.norm(theta))
    return np.array(rows)


def sequence_sparsity_rates(problems: Sequence[TokenSelectionProblem], steps, theta, abscissa, start: float):
    """Each sequence's end-to-end sparsification rate ``Δ(−log(1 − σ_i,opt))/Δx`` over a run's late window.

    From the first record with step ``≥ start`` to the last, problem by problem: ``steps`` (R,) and
    ``theta`` (R, S, size) are a run's records (column ``k``: problem ``k``), ``abscissa`` (R,) or
    (R, S) is ``x`` at the records (``η·t`` for NGD, ``‖W_t‖`` for Polyak). Returns
    ``(rates (S, n), dx (S,))``.

    **The bound** (fixed before the data; chapter 5's identity, sequence by sequence). With
    ``g_i(W) = min_{t≠opt_i} ⟨W, A_i,opt − A_it⟩`` the smallest logit gap of sequence ``i``, and
    ``opt_i`` on top (``g_i ≥ 0``), ``(T − 1)e^{−g_i} ≥ 1 − σ_i,opt ≥ e^{−g_i}/2``, so
    ``−log(1 − σ_i,opt) = g_i + b_i`` with ``b_i ∈ [−log(T − 1), log 2]``. Along a run that has
    converged in direction, ``W_t = x_t Ŵ + (a bounded offset that no longer moves)``, so
    ``Δg_i/Δx = γ_i(Ŵ)`` (:func:`sequence_margins`) and every sequence's rate is within
    ``log(2(T − 1))/Δx`` of ``γ_i(Ŵ)``: :func:`sparsity_deviation` is at most 1.

    >>> import attnlib as al
    >>> probs = [r.problem for r in reduced_tokens(3, 4, 8, [0, 1], size=9, family="global")]
    >>> run = al.train_many(probs, 400, "ngd", 0.5)
    >>> rates, dx = sequence_sparsity_rates(probs, run.steps, run.theta, 0.5 * run.steps, 80)
    >>> rates.shape, bool(np.all(rates > 0)), bool(np.all((dx > 0) & (dx <= 0.5 * (400 - 80))))
    ((2, 3), True, True)
    """
    steps = np.asarray(steps, float)
    first = int(np.flatnonzero(steps >= start)[0])
    if first >= len(steps) - 1:
        raise ValueError(f"need a record with step >= {start} before the last one")
    x = np.broadcast_to(np.asarray(abscissa, float).reshape(len(steps), -1), (len(steps), len(problems)))
    rates, dx = [], []
    for k, p in enumerate(problems):
        ends = np.stack([theta[first, k], theta[-1, k]]).reshape((2,) + p.shape)
        log_mass = log_one_minus_mass(p, ends)  # (2, n), exact in log space
        dx.append(x[-1, k] - x[first, k])
        rates.append((log_mass[0] - log_mass[1]) / dx[-1])
    return np.array(rates), np.array(dx)


def sparsity_deviation(rates, reference_margins, dx, T: int) -> np.ndarray:
    """Each problem's largest ``|rate_i − γ_i(Ŵ)|`` over its sequences, in units of the bound ``log(2(T − 1))/Δx``.

    ``rates`` and ``reference_margins`` (S, n) (:func:`sequence_sparsity_rates`,
    :func:`sequence_margins`), ``dx`` (S,). At most 1 where the run sparsifies as the reference
    predicts (the bound of :func:`sequence_sparsity_rates`). Against the W-SVM of a selection one token
    off, ``γ_j ≤ −1/‖W_mm(α)‖`` in the changed sequence ``j`` while its rate is near
    ``γ_j(Ŵ_mm) ≥ 1/‖W_mm‖``: the deviation exceeds ``Δx/(‖W_mm‖ log(2(T − 1))) − 1`` by construction.
    Returns (S,).

    >>> sparsity_deviation([[0.5, 0.7]], [[0.5, 0.69]], [100.0], T=3).round(3).tolist()  # 0.01 / (log 4 / 100)
    [0.721]
    """
    band = np.log(2 * (T - 1)) / np.asarray(dx, float)
    return np.max(np.abs(np.asarray(rates) - np.asarray(reference_margins)), axis=-1) / band


def sparsity_statistic(problems: Sequence[TokenSelectionProblem], rates, refs, dx, T: int) -> float:
    """Chapter 5's sparsification check: the median over problems of :func:`sparsity_deviation` against ``refs``.

    ``rates`` (S, n) and ``dx`` (S,) from :func:`sequence_sparsity_rates`, ``refs`` (S, size) one
    reference per problem; a row of NaN (no reference, e.g. an infeasible W-SVM) leaves its problem
    out. At most 1 where the runs sparsify as the references predict.

    >>> import attnlib as al
    >>> probs = [r.problem for r in reduced_tokens(3, 4, 8, [0, 1], size=9, family="global")]
    >>> run = al.train_many(probs, 400, "ngd", 0.5)
    >>> rates, dx = sequence_sparsity_rates(probs, run.steps, run.theta, 0.5 * run.steps, 80)
    >>> refs = np.stack([s.theta.ravel() for s in solve_each(probs)])
    >>> sparsity_statistic(probs, rates, refs, dx, T=4) <= 1
    True
    """
    refs = np.asarray(refs, float)
    keep = np.all(np.isfinite(refs), axis=1)
    kept = [p for p, k in zip(problems, keep) if k]
    deviation = sparsity_deviation(np.asarray(rates)[keep], sequence_margins(kept, refs[keep]), np.asarray(dx)[keep], T)
    return float(np.median(deviation))


def budget_gain(clock: float, factor: float) -> float:
    """How much a direction error ``∝ 1/log(clock)`` falls when the budget grows ``factor``-fold:
    ``log(factor · clock) / log(clock)`` (GD's rate, :cite:`soudry2018implicit`; ``clock = η t > 1``).

    >>> round(budget_gain(100.0, 10.0), 3)
    1.5
    """
    if clock <= 1 or factor < 1:
        raise ValueError(f"clock must be > 1 and factor >= 1, got clock={clock}, factor={factor}")
    return float(np.log(factor * clock) / np.log(clock))
