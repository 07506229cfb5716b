"""Fast rates of normalised GD and the Polyak step against GD [FAST]: fitting slow asymptotic shapes.

:func:`inverse_log_vs_power` and :func:`half_decade_slopes` test slow asymptotic shapes
(``1/log t``, ``log t``) against a power law.

The pieces a rate study is built from live with the objects they are, and are re-exported here
under their old names: :data:`attnlib.losses.CROSS_ENTROPY`; :func:`attnlib.model.logistic_regression`,
:class:`attnlib.model.Reduced` and :func:`attnlib.model.reduce_to_span` (the problem); the
recording grid :func:`attnlib.optim.log_steps` and :func:`attnlib.optim.train_many`
(:func:`attnlib.train` on :func:`attnlib.stack_problems`); the metric :func:`attnlib.metrics.curves`;
and the data :func:`attnlib.datasets.separable_data`.
"""

from __future__ import annotations

from collections.abc import Sequence  # noqa: F401  (kept in this namespace for the code that uses it from here)
from dataclasses import dataclass

import numpy as np

from .datasets import separable_data
from .losses import CROSS_ENTROPY
from .metrics import CURVES, curves, direction_error  # noqa: F401  (direction_error: kept in this namespace)
from .model import Reduced, TokenSelectionProblem, logistic_regression, reduce_to_span  # noqa: F401
from .optim import Trajectory, log_steps, train, train_many  # noqa: F401  (Trajectory, train: kept in this namespace)
from .svm import MaxMarginSolution  # noqa: F401  (kept in this namespace for the code that uses it from here)

__all__ = [
    "CROSS_ENTROPY",
    "logistic_regression",
    "separable_data",
    "Reduced",
    "reduce_to_span",
    "log_steps",
    "train_many",
    "curves",
    "ShapeFit",
    "inverse_log_vs_power",
    "half_decade_slopes",
    "solve_each",
    "Comparison",
    "compare_methods",
    "late_slopes",
    "late_decay",
    "running_half_decade_slopes",
    "ends_off_opt",
    "local_selection",
    "SelectionSweep",
    "selection_sweep",
    "reduced_tokens",
    "FITTED_RATES",
    "fitted_rates_table",
    "local_selection_table",
    "off_opt_runs",
    "feasibility_table",
    "svm_feasibility",
]


# ---------------------------------------------------------------------------------- slow shapes
@dataclass(frozen=True)
class ShapeFit:
    """Two two-parameter fits of a decaying error, residuals on the scale ``log err``.

    Attributes:
        rms_inverse_log: RMS residual of ``err ≈ 1/(a + b log t)``.
        rms_power: RMS residual of the best power law ``err ≈ c t^−p``.
        exponent: the fitted ``p``.
        residual_inverse_log, residual_power: (R,) the residuals ``log err − log fit``.
    """

    rms_inverse_log: float
    rms_power: float
    exponent: float
    residual_inverse_log: np.ndarray
    residual_power: np.ndarray

    @property
    def ratio(self) -> float:
        """``rms_power / rms_inverse_log``: above 1, the ``1/log t`` model fits better."""
        return self.rms_power / self.rms_inverse_log if self.rms_inverse_log > 0 else float("inf")


def inverse_log_vs_power(t, err) -> ShapeFit:
    """Fit ``err(t)`` by ``1/(a + b log t)`` and by a power law ``c t^−p``; compare their residuals.

    Both models have two parameters and both fits are linear least squares: ``1/err`` against
    ``log t`` for the first, ``log err`` against ``log t`` for the second. Their residuals are
    measured on the same scale, ``log err``. GD's direction error on separable problems behaves like
    ``c/log t`` (Soudry et al. 2018; ``θ_t = θ_mm log t + ρ_t`` with a bounded offset ``ρ_t``): on a
    window of several decades of ``t``, the straight line of a power law on log-log axes cannot
    follow the curvature ``1/log² t`` of ``log err``, and leaves clearly larger residuals.

    Args: ``t`` (R,) positive steps, ``err`` (R,) positive errors (e.g. log-spaced records).
    Returns a :class:`ShapeFit`. Where the fitted ``a + b log t`` is not positive on the window, the
    ``1/log t`` model does not apply and its residual is infinite.

    >>> import numpy as np, attnlib as al
    >>> t = np.logspace(2, 5, 40)
    >>> fit = al.inverse_log_vs_power(t, 2.0 / np.log(3.0 * t))
    >>> bool(fit.rms_inverse_log < 1e-12 < fit.rms_power), round(fit.exponent, 3)
    (True, 0.113)
    >>> fit = al.inverse_log_vs_power(t, 5.0 * t**-0.1)
    >>> bool(fit.rms_power < 1e-12 < fit.rms_inverse_log), fit.ratio < 1e-9
    (True, True)
    """
    t = np.asarray(t, float)
    err = np.asarray(err, float)
    if t.shape != err.shape or t.ndim != 1 or t.size < 3:
        raise ValueError(f"t and err must be 1-D of equal length >= 3, got {t.shape} and {err.shape}")
    if not (np.all(t > 0) and np.all(err > 0) and np.all(np.isfinite(err))):
        raise ValueError("t and err must be positive and finite")
    x, y = np.log(t), np.log(err)
    design = np.stack([np.ones_like(x), x], axis=1)
    power = np.linalg.lstsq(design, y, rcond=None)[0]
    res_pow = y - design @ power
    inv = design @ np.linalg.lstsq(design, 1.0 / err, rcond=None)[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        res_log = np.where(inv > 0, y + np.log(np.where(inv > 0, inv, 1.0)), np.inf)
    rms = [float(np.sqrt(np.mean(r**2))) for r in (res_log, res_pow)]
    return ShapeFit(rms[0], rms[1], float(-power[1]), res_log, res_pow)


def half_decade_slopes(t, y) -> tuple[float, float]:
    """Slopes of ``y`` against ``log t`` over the last two half-decades of ``t``.

    With ``t_end = t[-1]``, the last window is ``[t_end/√10, t_end]`` and the one before
    ``[t_end/10, t_end/√10]`` (both ends included). For ``y = ‖θ_t‖`` under GD the slope tends to
    ``‖θ_mm‖`` (``‖θ_t‖ = ‖θ_mm‖ log t + O(1)``); the change between the two windows measures how far
    the slope still drifts. Needs at least two records in each window (log-spaced records:
    :func:`log_steps`).

    Returns ``(slope_last, slope_previous)``.

    >>> import numpy as np, attnlib as al
    >>> t = al.log_steps(10_000)[1:]
    >>> [round(s, 6) for s in al.half_decade_slopes(t, 3.0 * np.log(t) + 1.0)]
    [3.0, 3.0]
    """
    t = np.asarray(t, float)
    y = np.asarray(y, float)
    if t.shape != y.shape or t.ndim != 1:
        raise ValueError(f"t and y must be 1-D of equal length, got {t.shape} and {y.shape}")
    end = t[-1]
    last = t >= end / np.sqrt(10.0) * (1 - 1e-12)
    prev = (t >= end / 10.0 * (1 - 1e-12)) & (t <= end / np.sqrt(10.0) * (1 + 1e-12))
    if last.sum() < 2 or prev.sum() < 2 or np.any(t[last | prev] <= 0):
        raise ValueError("need at least two positive steps in each of the last two half-decades of t")
    slope = [float(np.polyfit(np.log(t[w]), y[w], 1)[0]) for w in (last, prev)]
    return slope[0], slope[1]


# ------------------------------------------------------- comparing GD, NGD and Polyak on batches
def solve_each(problems: Sequence[TokenSelectionProblem], select=None) -> list[MaxMarginSolution | None]:
    """The W-SVM (:func:`attnlib.max_margin`) of each problem, ``None`` where it is infeasible.

    ``select``: one selection for every problem (default each problem's optimal tokens). An
    infeasible W-SVM (:class:`attnlib.InfeasibleError`) is reported as ``None``, never as a number.

    >>> import attnlib as al
    >>> sols = al.rates.solve_each([al.datasets.single_input(), al.datasets.single_input(local=True)])
    >>> [s is not None for s in sols]
    [True, True]
    """
    from .svm import InfeasibleError, max_margin

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
) -> Comparison:
    """Each method of ``lr`` run by :func:`train_many` on all the problems from 0, one batch per method.

    Args:
        problems, solutions: S problems and their W-SVMs (``None`` where infeasible; see :func:`curves`).
        steps: iterations, one number or ``{method: steps}``.
        lr: ``{method: step size}``, e.g. ``{"gd": 50.0, "ngd": 0.2, "polyak": 1.0}`` (Polyak's is a
            multiplier of its step ``(L − L*)/‖∇L‖²``). The keys are the methods run.
        polyak_max_step: the Polyak detector's threshold (:func:`attnlib.train`).

    The batches have the same problems, so their wall-clock ``seconds`` compare.

    >>> import attnlib as al
    >>> probs = [al.datasets.single_input(), al.datasets.single_input(third_score=0.5)]
    >>> cmp = al.compare_methods(probs, al.rates.solve_each(probs), 50, {"gd": 1.0, "ngd": 0.1})
    >>> sorted(cmp.runs), cmp.curves["ngd"]["direction_error"].shape[1]
    (['gd', 'ngd'], 2)
    """
    problems, solutions = list(problems), list(solutions)
    runs, measured = {}, {}
    for method, rate in lr.items():
        horizon = steps[method] if isinstance(steps, dict) else steps
        runs[method] = train_many(problems, horizon, method, rate, polyak_max_step=polyak_max_step)
        measured[method] = curves(problems, runs[method], solutions)
    return Comparison(runs, measured)


def late_slopes(x, y, start: float, log_x: bool = False, log_y: bool = False) -> np.ndarray:
    """Per-column least-squares slope of ``y`` against ``x`` over the records with ``x_steps ≥ start``.

    ``x``: (R,) steps, or (R, S) one abscissa per column (e.g. ``‖W_t‖``); ``y``: (R, S). The window
    is chosen on the steps: pass ``x`` as ``(steps, abscissa)`` to fit against another abscissa.
    Returns (S,) slopes (:func:`attnlib.fit_slope`, with its ``log_x``/``log_y``).

    >>> import numpy as np, attnlib as al
    >>> t = np.arange(1.0, 101.0)
    >>> al.rates.late_slopes(t, np.stack([2 * t, -t], axis=1), start=50).round(9).tolist()
    [2.0, -1.0]
    """
    from .metrics import fit_slope

    steps, abscissa = x if isinstance(x, tuple) else (x, x)
    steps = np.asarray(steps, float)
    y = np.asarray(y, float)
    abscissa = np.broadcast_to(np.asarray(abscissa, float).reshape(len(steps), -1), y.shape)
    window = steps >= start
    if window.sum() < 2:
        raise ValueError(f"need at least two records with step >= {start}")
    return np.array(
        [fit_slope(abscissa[window, s], y[window, s], log_x=log_x, log_y=log_y)[0] for s in range(y.shape[1])]
    )


def late_decay(steps, abscissa, log_y, start: float) -> np.ndarray:
    """End-to-end decay rate ``Δ(−log y)/Δx`` from the first record with step ``≥ start`` to the last.

    ``steps`` (R,); ``abscissa`` (R,) or (R, S) (the steps, or ``‖W_t‖``); ``log_y`` (R, S). Unlike a
    least-squares fit, the end-to-end difference is what the identity
    ``−log max_i(1 − σ_i,opt) = ‖W‖γ(W) + b(W)``, ``b ∈ [−log 2, log(T−1)]``, bounds: it equals
    ``Δ(‖W‖γ)/Δx`` up to ``log(2(T−1))/Δx``. Returns (S,).

    >>> import numpy as np, attnlib as al
    >>> t = np.arange(0.0, 11.0)
    >>> al.rates.late_decay(t, t, np.stack([-0.5 * t, -2 * t], axis=1), start=2).tolist()
    [0.5, 2.0]
    """
    steps = np.asarray(steps, float)
    log_y = np.asarray(log_y, float)
    abscissa = np.broadcast_to(np.asarray(abscissa, float).reshape(len(steps), -1), log_y.shape)
    first = int(np.flatnonzero(steps >= start)[0])
    if first >= len(steps) - 1:
        raise ValueError(f"need a record with step >= {start} before the last one")
    return (log_y[first] - log_y[-1]) / (abscissa[-1] - abscissa[first])


def running_half_decade_slopes(t, y, from_step: float) -> np.ndarray:
    """:func:`half_decade_slopes` of ``y`` against ``log t`` over the half-decade ending at each record.

    ``t`` (R,) positive log-spaced steps, ``y`` (R, S). Returns ``(ends, slopes)``: the records
    ``t ≥ from_step`` at which a half-decade ends, and (len(ends), S) the slope over it.

    >>> import numpy as np, attnlib as al
    >>> t = al.log_steps(10_000)[1:]
    >>> ends, s = al.rates.running_half_decade_slopes(t, np.log(t)[:, None] * [1.0, 3.0], 100)
    >>> bool(ends[0] >= 100), np.allclose(s, [1.0, 3.0])
    (True, True)
    """
    t = np.asarray(t, float)
    y = np.asarray(y, float)
    ends = np.flatnonzero(t >= from_step)
    slopes = np.array([[half_decade_slopes(t[: j + 1], y[: j + 1, s])[0] for s in range(y.shape[1])] for j in ends])
    return t[ends], slopes


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
    (:func:`attnlib.is_locally_optimal`), ``neighbour`` (True if some such sample's optimal token is
    an SVM-neighbour of ``α``), ``to_local`` and ``to_opt``: the direction errors of ``theta`` to
    ``W_mm(α)`` and to ``W_mm(opt)`` (NaN if ``sol_opt`` is None).
    """
    from .svm import is_locally_optimal, max_margin

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
    >>> sw = al.selection_sweep([al.datasets.single_input(), al.datasets.single_input(local=True)], 100, 0.5)
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
    >>> batch = al.rates.reduced_tokens(3, 4, 16, [0, 1], size=9, family="global")
    >>> [r.problem.shape for r in batch], batch[0].source.shape
    ([(9,), (9,)], (16, 16))
    """
    from . import datasets

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
    >>> keys = [cell[2] for row in al.rates.FITTED_RATES for cell in row[1:]]
    >>> table = al.rates.fitted_rates_table(dict.fromkeys(keys, 1.0))
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


def svm_feasibility(prob: TokenSelectionProblem, select=None, tol: float = 1e-7) -> bool | None:
    """Is the W-SVM of ``select`` (default opt) feasible? ``True``/``False`` with a certificate, else ``None``.

    With ``G`` the rows ``A_iα_i − A_it`` (``t ≠ α_i``) and ``h = 1``, Lawson–Hanson's reduction of
    ``min ‖θ‖ s.t. Gθ ≥ h`` to NNLS (as :func:`attnlib.max_margin` does) gives ``u ≥ 0`` and the residual
    ``r = [Gᵀu; hᵀu] − e_last``. Either ``θ = −r[:-1]/r[-1]`` satisfies ``Gθ ≥ h`` (checked: feasible),
    or ``Gᵀu ≈ 0`` with ``hᵀu ≈ 1``, a Farkas certificate: every feasible ``θ`` would have
    ``‖θ‖ ≥ hᵀu/‖Gᵀu‖``, so the margin is at most ``‖Gᵀu‖/hᵀu``; below ``tol`` the selection is reported
    infeasible (``False``). Neither: ``None`` (let :func:`attnlib.max_margin` decide). No cvxpy.

    >>> import attnlib as al
    >>> al.rates.svm_feasibility(al.datasets.single_input())
    True
    """
    from .svm import farkas_margin_bound, least_distance_nnls

    n, T = prob.n, prob.T
    sel = prob.opt if select is None else np.asarray(select)
    A = prob.A.reshape(n, T, prob.size)
    rows = np.ones((n, T), bool)
    rows[np.arange(n), sel] = False
    G = (A[np.arange(n), sel][:, None, :] - A)[rows]
    solved = least_distance_nnls(G, np.ones(G.shape[0]))
    if solved is None:
        return None
    u, r = solved
    if np.isfinite(r).all() and -r[-1] > 1e-12:
        theta = -r[:-1] / r[-1]
        if np.all(G @ theta >= 1 - 1e-9):
            return True
    if farkas_margin_bound(G, np.ones(G.shape[0]), u) <= tol:
        return False
    return None
