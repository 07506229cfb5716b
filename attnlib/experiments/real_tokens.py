"""Chapter 6, real tokens: attention trained on image patches of handwritten digits.

The data are :func:`attnlib.datasets.digit_patches` (each 8×8 digit cut into patches, with a
positional code). :func:`fit_patch_head` fits a fixed linear head on patches, which gives every
patch a score ``γ_it = y_i vᵀ x_it`` ([MMTS] prompt attention); :func:`attention_run` trains the
attention on them, :func:`selection_study` follows the selection of many heads at once, and
:func:`nested_svms` compares the SVMs of nested selections.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial

import numpy as np

from ..datasets import DigitPatches, cone_starts
from ..metrics import cosine, log_one_minus_mass, offset_exponent, one_minus_cosine, orthogonal_offset
from ..model import FactoredDecoderAttention, check_integer, check_labels, prompt_attention, self_attention
from ..optim import log_steps, minibatch_weights, run_independent, train, train_joint_methods, train_problems
from ..svm import InfeasibleError, is_locally_optimal, max_margin

__all__ = [
    "fit_patch_head",
    "follow_selection",
    "score_spread",
    "nested_svms",
    "gap_cone_start",
    "SelectionStudy",
    "selection_study",
    "attention_run",
    "RACE_METHODS",
    "RACE_RECORDS_PER_DECADE",
    "pooled_queries",
    "OptimizerRace",
    "optimizer_race",
    "selection_svm_correlations",
    "unit_norm_top_mass",
]


def fit_patch_head(X, y, ridge: float = 1.0) -> np.ndarray:
    """A fixed linear head fit on patches: every patch of image ``i`` is asked to predict ``y_i``.

    .. math::

        v = \\arg\\min_v \\sum_{i,t} (vᵀx_{it} − y_i)^2 + λ‖v‖^2
          = \\Big(\\sum_{i,t} x_{it}x_{it}ᵀ + λI\\Big)^{-1} \\sum_{i,t} y_i x_{it}.

    Least squares rather than the label SVM: on digits the patches of the two classes are not
    linearly separable, so the label SVM over *all* patches is infeasible (:func:`attnlib.label_svm` reports it),
    while the attention theory takes any fixed ``v``. The score ``y_i vᵀ x_it`` then says how much
    patch ``t`` alone speaks for the label of its image.

    Args: ``X`` (n, T, d) tokens, ``y`` (n,) labels ±1, ``ridge`` λ > 0. Returns ``v`` (d,).

    >>> import numpy as np, attnlib as al
    >>> X = np.array([[[1.0, 0.0], [0.0, 0.0]], [[0.0, 1.0], [0.0, 0.0]]])
    >>> np.round(fit_patch_head(X, [1, -1], ridge=1.0), 3).tolist()
    [0.5, -0.5]
    """

    X = np.asarray(X, float)
    if X.ndim != 3:
        raise ValueError(f"X must be (n, T, d), got {X.shape}")
    y = check_labels(y, X.shape[0])
    if isinstance(ridge, bool) or not np.isfinite(ridge) or ridge <= 0:
        raise ValueError(f"ridge must be a positive finite number, got {ridge!r}")
    F = X.reshape(-1, X.shape[2])
    target = np.repeat(y, X.shape[1])
    return np.linalg.solve(F.T @ F + ridge * np.eye(F.shape[1]), F.T @ target)


def follow_selection(
    prob, theta, saturation: float = 0.99, window: int | None = None, cache: dict | None = None
) -> dict:
    """What one recorded trajectory did, measured against the SVM of the selection it made.

    The local theorem of [MMTS] ([TFSVM] for ``W``) says every limit of GD is the ATT-SVM direction
    ``θ_mm(α)`` of a *locally optimal* selection ``α``; on real tokens the selection a run makes need
    not be ``opt``. So the run is judged against its own final selection ``α̂_i = argmax_t σ_it(θ(T))``.

    Args:
        prob: a :class:`attnlib.TokenSelectionProblem` (n samples, T tokens).
        theta: (R, *shape) recorded parameters, the last one final.
        saturation: a sample is saturated when ``σ_iα̂_i ≥ saturation``.
        window: a record index ``w``; if given, also report over the records ``[w, R)``.
        cache: a dict reused across calls on the same ``prob``: selection → (solution, locally optimal).

    Returns a dict: ``select`` (n,) final selection; ``solution`` its ATT-SVM (``None`` if infeasible);
    ``local`` locally optimal (:func:`attnlib.svm.is_locally_optimal`); ``feasible_sel``; ``agree`` the
    fraction of samples with ``α̂_i = opt_i`` and ``agree_min`` its minimum over the records;
    ``saturated`` the fraction saturated at the end; ``rank`` (n,) how many tokens of the sample score
    higher than the selected one (0: optimal); ``omc_sel`` ``1 − cos(θ(T), θ_mm(α̂))``. With ``window``:
    ``settled`` (one selection over the window and every sample saturated at its start), ``growth``
    ``‖θ(T)‖/‖θ(w)‖`` and ``exponent`` :func:`attnlib.metrics.offset_exponent` from ``θ(w)`` to ``θ(T)``
    against ``θ_mm(α̂)`` (NaN where the selection is infeasible).

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.single_input()
    >>> run = al.train(prob, np.zeros(3), 1000, lr=0.1, record_steps=[0, 250, 1000])
    >>> r = follow_selection(prob, run.theta[:, 0], window=1)
    >>> r["select"].tolist(), r["local"], r["settled"], bool(r["exponent"] < 0.5)
    ([0], True, True, True)
    """

    theta = np.asarray(theta, float)
    if theta.ndim != len(prob.shape) + 1 or theta.shape[1:] != prob.shape or len(theta) < 1:
        raise ValueError(f"theta must be (R, {', '.join(map(str, prob.shape))}) recorded parameters, got {theta.shape}")
    if not 0 < saturation < 1:
        raise ValueError(f"saturation must be in (0, 1), got {saturation!r}")
    cache = {} if cache is None else cache
    picks = prob.selection(theta)  # (R, n)
    final = picks[-1]
    key = tuple(final.tolist())
    if key not in cache:
        try:
            cache[key] = (max_margin(prob, final), is_locally_optimal(prob, final))
        except InfeasibleError:
            cache[key] = (None, False)
    sol, local = cache[key]
    saturated = log_one_minus_mass(prob, theta, final) <= np.log1p(-saturation)  # (R, n)
    chosen = prob.gamma[np.arange(prob.n), final]
    out = dict(select=final, solution=sol, local=local, feasible_sel=sol is not None)
    out["agree"] = float(np.mean(final == prob.opt))
    out["agree_min"] = float(np.mean(picks == prob.opt, axis=1).min())
    out["saturated"] = float(saturated[-1].mean())
    out["rank"] = (prob.gamma > chosen[:, None]).sum(1)
    out["omc_sel"] = float(one_minus_cosine(theta[-1], sol.theta)) if sol is not None else np.nan
    if window is not None:
        if not 0 <= window < len(theta):
            raise ValueError(f"window must be a record index in [0, {len(theta) - 1}], got {window!r}")
        out["settled"] = bool(np.all(picks[window:] == final) and saturated[window].all())
        out["growth"] = float(np.linalg.norm(theta[-1]) / np.linalg.norm(theta[window]))
        out["exponent"] = float(offset_exponent(theta[window], theta[-1], sol.theta)) if sol is not None else np.nan
    return out


def score_spread(gamma) -> float:
    """Median over samples of the spread of the non-optimal scores, relative to the score range.

    ``median_i (max_{t≠opt} γ_it − min_t γ_it) / (max_t γ_it − min_t γ_it)``, in [0, 1]: 0 when every
    non-optimal token of every sample scores the same (the equal-score assumption of [MMTS]'s global
    theorem). ``gamma`` (n, T) with T ≥ 3.

    >>> score_spread([[3.0, 1.0, 1.0], [0.0, 2.0, 0.0]]), score_spread([[3.0, 2.0, 1.0]])
    (0.0, 0.5)
    """
    gamma = np.asarray(gamma, float)
    if gamma.ndim != 2 or gamma.shape[1] < 3:
        raise ValueError(f"gamma must be (n, T) with T >= 3, got shape {gamma.shape}")
    others = np.sort(gamma, axis=1)[:, :-1]
    return float(np.median((others[:, -1] - others[:, 0]) / (gamma.max(1) - gamma.min(1))))


def nested_svms(data: DigitPatches, v, n_values) -> tuple[dict, dict]:
    """Prompt- and self-attention problems on the first ``n`` images, and their optimal-patch SVMs.

    Returns ``(problems, solutions)``, both keyed by ``(kind, n)`` with ``kind`` ``"p"``
    (:func:`attnlib.prompt_attention`, keys ``x_it``) or ``"W"`` (:func:`attnlib.self_attention`,
    query ``z_i = x_i1``); a solution is the :class:`attnlib.MaxMarginSolution` of ``opt``, or
    ``None`` when that SVM is infeasible (an answer, never a result).

    >>> import attnlib as al
    >>> data = al.datasets.digit_patches(n=40, seed=0)
    >>> v = fit_patch_head(data.X[:30], data.y[:30])
    >>> problems, solutions = nested_svms(data.subset(slice(30, 40)), v, [2, 4])
    >>> sorted(problems), solutions["p", 2] is not None
    ([('W', 2), ('W', 4), ('p', 2), ('p', 4)], True)
    """

    problems, solutions = {}, {}
    for n in n_values:
        sub = data.subset(slice(0, int(n)))
        for kind, build in (("p", prompt_attention), ("W", self_attention)):
            problems[kind, n] = build(sub.X, sub.y, v)
            try:
                solutions[kind, n] = max_margin(problems[kind, n])
            except InfeasibleError:
                solutions[kind, n] = None
    return problems, solutions


def gap_cone_start(prob, direction, scale: float, rng=None) -> np.ndarray:
    """A start of norm ``scale·‖θ_mm‖`` in a narrow cone around the SVM direction ``θ_mm``.

    On the axis every logit gap of the SVM's selection is at least ``scale``; the start is tilted
    in a random perpendicular direction by the angle φ with ``sin φ · scale·‖θ_mm‖ · w = scale/2``,
    ``w`` the widest feature difference ``‖A_iα_i − A_it‖`` of the problem, so every gap stays at
    least about ``scale/2`` (:func:`attnlib.datasets.cone_starts` with ``edge=True``). Shape ``prob.shape``.
    ``direction`` is ``θ_mm`` (an array) or its :class:`attnlib.MaxMarginSolution`.
    """

    theta = np.asarray(getattr(direction, "theta", direction), float)
    select = getattr(direction, "select", prob.opt)
    A = prob.A.reshape(prob.n, prob.T, -1)
    widest = np.linalg.norm(A[np.arange(prob.n), select][:, None] - A, axis=-1).max()
    sin_phi = min(0.5 / (widest * np.linalg.norm(theta)), 1.0)  # <= 1/2 for an SVM: ‖θ_mm‖·widest >= 1
    rng = np.random.default_rng(rng)
    return cone_starts(theta, 1, mu=1 - np.sqrt(1 - sin_phi**2), radius=scale, rng=rng, edge=True)[0]


@dataclass(frozen=True, eq=False)
class SelectionStudy:
    """NGD (from zero and from the cone) and GD (from zero) on every problem, and what each run did.

    Attributes:
        problems, solutions: as :func:`nested_svms`, keyed ``(kind, n)``.
        record: (R,) the NGD record steps (log-spaced, with ``steps // 4`` and ``min(gd_steps, steps)``).
        window: index of ``steps // 4`` in ``record``, the start of the direction check's window.
        ngd: ``(kind, n, start) → (R, *shape)`` with ``start`` ``"zero"`` or ``"cone"`` (feasible only),
            and the ``extra`` runs by name.
        gd: ``(kind, n) → (2, *shape)``, the GD start and end.
        results: ``(kind, n, method, start) →`` :func:`follow_selection` dict, plus ``omc_opt``
            (``1 − cos`` with ``θ_mm(opt)``, NaN if infeasible) and, for NGD, ``saturated_at_gd`` (the
            fraction saturated after ``min(gd_steps, steps)`` steps).
        judged: the NGD runs from zero the direction check judges: settled over the window, on a
            locally optimal selection, with the norm at least doubled over the window.
        steps, gd_steps, lr, cone_scale, saturation: the settings.
    """

    problems: dict
    solutions: dict
    record: np.ndarray
    window: int
    ngd: dict
    gd: dict
    results: dict
    judged: dict
    steps: int
    gd_steps: int
    lr: float
    cone_scale: float
    saturation: float

    @property
    def feasible(self) -> dict:
        """``(kind, n) →`` whether the SVM of the optimal patches is feasible."""
        return {key: sol is not None for key, sol in self.solutions.items()}

    def offset_exponent(self, key, reference) -> float:
        """:func:`attnlib.metrics.offset_exponent` of the NGD run ``key`` (a key of :attr:`judged`,
        ``(kind, n, "ngd", start)``) over the direction check's window ``[T/4, T]``, against ``reference``
        (any parameter of the run's shape: its own SVM, a rotated copy, ``θ_mm(opt)``).

        >>> import attnlib as al
        >>> data = al.datasets.digit_patches(n=40, seed=0)
        >>> v = fit_patch_head(data.X[:30], data.y[:30])
        >>> problems, solutions = nested_svms(data.subset(slice(30, 40)), v, [2, 4])
        >>> study = selection_study(problems, solutions, 400, 0.1, 50, 40.0, 10.0, rng=0)
        >>> key = ("p", 2, "ngd", "zero")
        >>> own = study.results[key]["solution"].theta
        >>> tilted = al.metrics.rotate_toward(own, np.eye(len(own))[0], 30.0)  # a fixed wrong direction
        >>> bool(study.offset_exponent(key, own) < 0.5 < study.offset_exponent(key, tilted))
        True
        """

        kind, n, _, start = key
        theta = self.ngd[kind, n, start]
        return float(offset_exponent(theta[self.window], theta[-1], np.asarray(reference, float)))

    def offset_curves(self) -> list:
        """For every judged run: its offset from the line of its own SVM against its norm over the
        window, both relative to the window's start (:func:`attnlib.orthogonal_offset`), and, when it
        settled off the feasible optimal selection, the same against ``θ_mm(opt)`` (a wrong reference).

        Returns a list of dicts ``kind, n, norm, offset, wrong`` (arrays; ``wrong`` may be ``None``),
        ``growth`` and ``wrong_exponent`` (:func:`attnlib.metrics.offset_exponent` against ``θ_mm(opt)``, or NaN).
        """

        curves = []
        for (kind, n, _, start), r in self.judged.items():
            theta = self.ngd[kind, n, start][self.window :]
            norm = np.linalg.norm(theta.reshape(len(theta), -1), axis=1)
            off = orthogonal_offset(theta, r["solution"].theta)
            wrong, wrong_e = None, np.nan
            sol = self.solutions[kind, n]
            if r["agree"] < 1 and sol is not None:
                wrong = orthogonal_offset(theta, sol.theta)
                wrong, wrong_e = wrong / wrong[0], float(offset_exponent(theta[0], theta[-1], sol.theta))
            curves.append(
                dict(kind=kind, n=n, norm=norm / norm[0], offset=off / off[0], wrong=wrong, growth=r["growth"])
                | dict(wrong_exponent=wrong_e)
            )
        return curves

    def table(self) -> str:
        """One line per run: model, n, method, start, agreement with ``opt``, saturated fraction, locally
        optimal, ``1 − cos`` with the own selection's SVM and, for NGD, settled, norm growth, exponent."""
        lines = ["model  n  method start  agree  saturated  locally-opt  1-cos(own SVM)  settled  growth  exponent"]
        for (kind, n, method, start), r in self.results.items():
            line = f"{kind:>4} {n:3d}  {method:>4}  {start:>4}  {r['agree']:5.2f}  {r['saturated']:9.2f}"
            line += f"  {r['local']!s:>11}  {r['omc_sel']:14.2e}"
            if method == "ngd":
                line += f"  {r['settled']!s:>7}  {r['growth']:6.2f}  {r['exponent']:8.3f}"
            lines.append(line)
        return "\n".join(lines)

    def summary(self) -> dict:
        """The page's measured numbers, by glue name: agreement with ``opt`` from zero where it is
        feasible and where not, saturation of GD and of NGD after as many steps, median ``1 − cos`` with
        the own selection's SVM, the judged runs and their norm growth, and the settled runs."""
        feasible, res = self.feasible, self.results
        zero = {key: res[key + ("ngd", "zero")] for key in self.problems}
        agree_in = [r["agree"] for key, r in zero.items() if feasible[key]]
        agree_out = [r["agree"] for key, r in zero.items() if not feasible[key]]
        growth = [r["growth"] for r in self.judged.values()]
        wrong = [c["wrong_exponent"] for c in self.offset_curves() if c["wrong"] is not None]
        settled = [r for r in zero.values() if r["settled"]]
        nan = float("nan")
        return dict(
            infeasible_max_agreement=max((r["agree"] for k, r in res.items() if not feasible[k[:2]]), default=nan),
            gd_steps_glued=min(self.gd_steps, self.steps),
            gd_saturated_mean=float(np.mean([res[key + ("gd", "zero")]["saturated"] for key in self.problems])),
            ngd_saturated_at_gd_steps=float(np.mean([r["saturated_at_gd"] for r in zero.values()])),
            zero_feasible_agree_mean=float(np.mean(agree_in)) if agree_in else nan,
            zero_miss_fraction=1 - float(np.mean(agree_in)) if agree_in else nan,
            zero_feasible_all_opt=int(sum(a == 1.0 for a in agree_in)),
            zero_feasible_count=len(agree_in),
            zero_infeasible_agree_mean=float(np.mean(agree_out)) if agree_out else nan,
            gd_omc_median=float(np.nanmedian([res[key + ("gd", "zero")]["omc_sel"] for key in self.problems])),
            ngd_omc_median=float(np.nanmedian([r["omc_sel"] for r in zero.values()])),
            judged_runs=len(self.judged),
            ngd_runs=len(zero),
            judged_growth_min=min(growth, default=nan),
            judged_growth_max=max(growth, default=nan),
            wrong_reference_exponent_min=min(wrong, default=nan),
            wrong_reference_exponent_max=max(wrong, default=nan),
            settled_nonlocal=sum(not r["local"] for r in settled),
            settled_zero_runs=len(settled),
        )


def selection_study(
    problems: dict,
    solutions: dict,
    steps: int,
    lr: float,
    gd_steps: int,
    gd_lr: float,
    cone_scale: float,
    saturation: float = 0.99,
    rng=None,
    extra: dict | None = None,
) -> SelectionStudy:
    """Train every problem with NGD from zero and from the cone, and GD from zero; follow every run.

    NGD (step ``lr``, ``steps`` iterations, log-spaced records) starts at ``θ = 0`` and, where the
    optimal-patch SVM is feasible, at :func:`gap_cone_start` with ``cone_scale``; GD (step ``gd_lr``,
    ``gd_steps`` iterations) starts at zero. Each run is measured by :func:`follow_selection` against
    the SVM of its own final selection (one SVM cache per problem). Batched by :func:`train_problems`.
    ``problems`` and ``solutions`` as returned by :func:`nested_svms`. ``extra``: more NGD runs to
    train in the same batches, ``{name: (problem, start)}``; their trajectories are ``ngd[name]``.

    >>> import attnlib as al
    >>> data = al.datasets.digit_patches(n=40, seed=0)
    >>> v = fit_patch_head(data.X[:30], data.y[:30])
    >>> problems, solutions = nested_svms(data.subset(slice(30, 40)), v, [2, 4])
    >>> study = selection_study(problems, solutions, 200, 0.1, 50, 40.0, 10.0, rng=0)
    >>> study.results["p", 2, "ngd", "cone"]["agree_min"]
    1.0
    """

    rng = np.random.default_rng(rng)
    at_gd = min(gd_steps, steps)
    record = np.union1d(log_steps(steps), [steps // 4, at_gd])
    window = int(np.searchsorted(record, steps // 4))
    # Every problem, both models, in one batch per group of sizes (attnlib.optim.train_problems).
    keys = list(problems)
    pairs = [(key, "zero", np.zeros(problems[key].shape)) for key in keys]
    pairs += [
        (key, "cone", gap_cone_start(problems[key], solutions[key], cone_scale, rng))
        for key in keys
        if solutions[key] is not None
    ]
    named = [(key + (start,), problems[key], t) for key, start, t in pairs]
    named += [(name, prob, np.asarray(t, float)) for name, (prob, t) in (extra or {}).items()]
    zeros = [np.zeros(problems[k].shape) for k in keys]
    # NGD's batches and GD's are independent (run_independent: the same numbers in one process or two)
    out, gd_out = run_independent(
        [
            partial(train_problems, [p for _, p, _ in named], [t for _, _, t in named], steps, "ngd", lr, record),
            partial(train_problems, [problems[k] for k in keys], zeros, gd_steps, "gd", gd_lr, [0, gd_steps]),
        ]
    )
    ngd = {name: theta for (name, _, _), theta in zip(named, out)}
    gd = dict(zip(keys, gd_out))
    results = {}
    for key, prob in problems.items():
        cache = {}
        for start in ("zero", "cone"):
            if key + (start,) in ngd:
                theta = ngd[key + (start,)]
                r = results[key + ("ngd", start)] = follow_selection(prob, theta, saturation, window, cache)
                mass = log_one_minus_mass(prob, theta[int(np.searchsorted(record, at_gd))], r["select"])
                r["saturated_at_gd"] = float(np.mean(mass <= np.log1p(-saturation)))
        results[key + ("gd", "zero")] = follow_selection(prob, gd[key], saturation, cache=cache)
    for (kind, n, method, start), r in results.items():
        final = (ngd[kind, n, start] if method == "ngd" else gd[kind, n])[-1]
        sol = solutions[kind, n]
        r["omc_opt"] = float(one_minus_cosine(final, sol.theta)) if sol is not None else np.nan
    judged = {
        k: r
        for k, r in results.items()
        if k[2:] == ("ngd", "zero") and r["settled"] and r["local"] and r["growth"] >= 2
    }
    return SelectionStudy(
        problems, solutions, record, window, ngd, gd, results, judged, steps, gd_steps, lr, cone_scale, saturation
    )


def attention_run(
    data: DigitPatches, v, n: int, kind: str, start: str, steps: int, lr: float, cone_scale: float, rng=None
):
    """NGD on the first ``n`` images of ``data`` from ``start`` (``"zero"`` or ``"cone"``): ``(problem, θ(steps))``.

    What an explorer recomputes for a reader's own ``n``, step size, number of steps or start. The
    cone start (:func:`gap_cone_start`) needs the optimal-patch SVM: ``attnlib.InfeasibleError`` if
    it is infeasible. ``kind`` ``"p"`` or ``"W"`` as in :func:`nested_svms`.
    """

    if kind not in ("p", "W") or start not in ("zero", "cone"):
        raise ValueError(f"kind must be 'p' or 'W' and start 'zero' or 'cone', got {kind!r}, {start!r}")
    n = check_integer("n", n, 2, data.n)
    sub = data.subset(slice(0, n))
    prob = (prompt_attention if kind == "p" else self_attention)(sub.X, sub.y, v)
    theta0 = np.zeros(prob.shape) if start == "zero" else gap_cone_start(prob, max_margin(prob), cone_scale, rng)
    return prob, train(prob, theta0, int(steps), method="ngd", lr=lr, record_steps=[int(steps)], progress=False).final[
        0
    ]


# ---------------------------------------------------------------------- [FAST]'s real-data experiment
#: The optimizers of :func:`optimizer_race`: (label, method, mini-batch?), [FAST]'s six.
RACE_METHODS = (
    ("GD", "gd", False),
    ("NGD", "ngd", False),
    ("Polyak", "polyak", False),
    ("SGD", "gd", True),
    ("SNGD", "ngd", True),
    ("SPS", "polyak", True),
)


#: Records per decade of :func:`optimizer_race` (log-spaced): a speed-up below ``10**(1/12)`` is
#: within one record of the grid, too small to tell from none.
RACE_RECORDS_PER_DECADE = 12


def pooled_queries(X) -> np.ndarray:
    """The query of each image, the mean of its tokens ``z_i = (1/T) Σ_t x_it``: (n, d) from X (n, T, d).

    A pooled, [CLS]-like query: with 2×2 patches the first patch is mostly blank, and ``z_i = x_i1``
    would reduce ``W`` to one column (prompt attention).

    >>> pooled_queries(np.arange(12.0).reshape(1, 3, 4)).tolist()
    [[4.0, 5.0, 6.0, 7.0]]
    """
    X = np.asarray(X, float)
    if X.ndim != 3:
        raise ValueError(f"X must be (n, T, d), got shape {X.shape}")
    return X.mean(axis=1)


@dataclass(frozen=True, eq=False)
class OptimizerRace:
    """The six optimizers of [FAST] on S data sets of digit tokens, trained in one stack.

    Attributes:
        labels: the M optimizer labels, rows ``s·M + m`` of the stack (plus the control rows).
        steps: (R,) recorded steps.  loss: (R, S, M) full training loss.
        top_mass: (R, S, M) mean over the training images of the attention's largest entry.
        test_accuracy: (R, S, M) accuracy on the held-out images (a zero output counts half).
        W: (R, S, M, d, d) the attention matrices.  u: (R, S, M, d) the decoders.
        train: the S training sets, test: the S held-out sets (:class:`DigitPatches`).
        problem: the stacked :class:`attnlib.model.FactoredDecoderAttention`.
        seconds: wall-clock seconds of the one training call.
    """

    labels: tuple
    steps: np.ndarray
    loss: np.ndarray
    top_mass: np.ndarray
    test_accuracy: np.ndarray
    W: np.ndarray
    u: np.ndarray
    train: tuple
    test: tuple
    problem: object
    seconds: float

    def steps_to(self, target: float) -> np.ndarray:
        """First recorded step with training loss ≤ ``target``: (S, M) (``inf`` if never reached)."""
        reached = self.loss <= target
        first = np.where(reached.any(axis=0), self.steps[np.argmax(reached, axis=0)], np.inf)
        return first.astype(float)

    def grid(self, label: str) -> list[int]:
        """The columns of optimizer ``label`` (e.g. "NGD"), one per step of its grid."""
        return [m for m, name in enumerate(self.labels) if name.rsplit(" ", 1)[0] == label]

    def best(self, label: str, target: float) -> tuple[np.ndarray, np.ndarray]:
        """Optimizer ``label`` at the best step of its grid on each set: ``(first steps (S,), columns (S,))``.

        The first recorded step with training loss ≤ ``target`` (one step after the end where it is
        never reached), the smallest over the grid, and the column that reaches it (ties: the first).
        """
        columns = self.grid(label)
        if not columns:
            known = sorted({name.rsplit(" ", 1)[0] for name in self.labels})
            raise ValueError(f"label must be one of the optimizers {known}, got {label!r}")
        first = self.steps_to(target)[:, columns]
        first = np.where(np.isfinite(first), first, self.steps[-1] + 1)
        pick = np.argmin(first, axis=1)
        return first[np.arange(len(first)), pick], np.asarray(columns)[pick]

    def selections(self, record: int = -1) -> np.ndarray:
        """The most-attended patch of every training image at a record: (S, M, n)."""
        S, M = self.loss.shape[1:]
        log_att = self.problem.log_attention(self.W[record].reshape(S * M, -1))
        return log_att.argmax(-1).reshape(S, M, -1)


def optimizer_race(
    datasets, n_train: int, steps: int, lrs: dict, batch_size: int, seed: int = 0, extra=()
) -> OptimizerRace:
    """Train self-attention with a linear decoder, ``f(X) = uᵀ Xᵀ softmax(X W z)``, by [FAST]'s six optimizers.

    Every data set (a :class:`attnlib.datasets.DigitPatches`) gives its first ``n_train`` images as the
    training set and the rest as held-out images; the queries are :func:`pooled_queries`. Each
    optimizer of :data:`RACE_METHODS` (and each ``(label, method, minibatch, lr)`` of ``extra``, e.g.
    a control) runs from ``W = 0, u = 0`` on every data set, all S·M runs stepped together by
    :func:`attnlib.optim.train_joint_methods` with the logistic loss; mini-batches of ``batch_size``
    come from :func:`attnlib.optim.minibatch_weights` (one stream per data set and optimizer).

    Args:
        datasets: S data sets of equal token shape.  n_train: training images per set.
        steps: iterations.  lrs: per method name ("gd", "ngd", "polyak") a step size or a grid of them;
            each optimizer runs at every step of its grid, labelled e.g. "NGD 1" (see :meth:`OptimizerRace.best`).
        batch_size: images per mini-batch.  seed: seeds the mini-batch streams.

    >>> import attnlib as al
    >>> sets = [al.datasets.digit_patches(patch=4, n=30, seed=s) for s in (0, 1)]
    >>> race = optimizer_race(sets, 12, 20, {"gd": 1.0, "ngd": 0.1, "polyak": 0.5}, 4)
    >>> race.loss.shape[1:], race.labels[:3]
    ((2, 6), ('GD 1', 'NGD 0.1', 'Polyak 0.5'))
    """
    datasets = list(datasets)
    n_train = check_integer("n_train", n_train, 2, min(D.n for D in datasets) - 1)
    grid = {method: np.atleast_1d(np.asarray(lrs[method], float)) for _, method, _ in RACE_METHODS}
    runs = [
        (f"{label} {lr:g}", method, mini, float(lr)) for label, method, mini in RACE_METHODS for lr in grid[method]
    ] + list(extra)
    S, M = len(datasets), len(runs)
    train_sets = tuple(D.subset(slice(0, n_train)) for D in datasets)
    test_sets = tuple(D.subset(slice(n_train, None)) for D in datasets)
    X = np.repeat(np.stack([D.X for D in train_sets]), M, axis=0)
    y = np.repeat(np.stack([D.y for D in train_sets]), M, axis=0)
    Z = np.repeat(np.stack([pooled_queries(D.X) for D in train_sets]), M, axis=0)
    d = X.shape[-1]
    problem = FactoredDecoderAttention(X, y, np.eye(d), "logistic", Z)
    weights = np.stack(
        [
            minibatch_weights(n_train, steps, batch_size if mini else None, seed=[seed, s, m])
            for s in range(S)
            for m, (_, _, mini, _) in enumerate(runs)
        ],
        axis=1,
    )
    record = log_steps(steps, per_decade=RACE_RECORDS_PER_DECADE)
    start = time.perf_counter()
    traj = train_joint_methods(
        problem,
        np.zeros((S * M, d * d)),
        np.zeros((S * M, d)),
        steps,
        [r[1] for r in runs] * S,
        [r[3] for r in runs] * S,
        weights,
        record_steps=record,
    )
    seconds = time.perf_counter() - start
    R = len(record)
    top = np.exp(problem.log_attention(traj.p).max(-1)).mean(-1)  # (R, S·M)
    accuracy = np.empty((R, S * M))
    for s, D in enumerate(test_sets):
        test_problem = FactoredDecoderAttention(D.X[None], D.y[None], np.eye(d), "logistic", pooled_queries(D.X)[None])
        rows = slice(s * M, (s + 1) * M)
        signed = test_problem.output(traj.p[:, rows, None], traj.v[:, rows, None])[..., 0, :]
        # a zero output (u = 0 at the start) is a tie: counted half right, the accuracy of a coin
        accuracy[:, rows] = np.mean((signed > 0) + 0.5 * (signed == 0), -1)
    shape = (R, S, M)
    return OptimizerRace(
        tuple(r[0] for r in runs),
        record,
        traj.loss.reshape(shape),
        top.reshape(shape),
        accuracy.reshape(shape),
        traj.p.reshape(shape + (d, d)),
        traj.v.reshape(shape + (d,)),
        train_sets,
        test_sets,
        problem,
        seconds,
    )


def selection_svm_correlations(race: OptimizerRace, members, shift: int = 1, seed: int = 0) -> dict:
    """W's correlation with the W-SVM of its own final selection, over training, and two controls.

    For each ``(s, m)`` of ``members``: the final selection ``α̂`` (most-attended patch of every
    training image), its W-SVM ``W_mm(α̂)`` ([TFSVM], :func:`attnlib.max_margin` on the features
    ``x_it z_iᵀ``), and ``corr(W_t, W_mm(α̂))`` at every record; the controls are the final W's
    correlation with the W-SVM of the selection moved ``shift`` patches on (``α̂_i + shift`` mod T,
    a wrong selection next door) and a random Gaussian matrix's correlation with ``W_mm(α̂)``.
    An infeasible SVM is recorded as ``None`` (no limit to compare with).

    Returns ``{(s, m): {"curve": (R,), "shifted": float, "random": float} or None}``.
    """
    selections = race.selections()
    rng = np.random.default_rng(seed)
    out = {}
    for s, m in members:
        D = race.train[s]
        prob = self_attention(D.X, D.y, race.u[-1, s, m], Z=pooled_queries(D.X))
        own = selections[s, m]
        try:
            W_own = max_margin(prob, select=own).theta
            W_shift = max_margin(prob, select=(own + shift) % prob.T).theta
        except InfeasibleError:
            out[s, m] = None
            continue
        out[s, m] = {
            "curve": cosine(race.W[:, s, m], W_own),
            "shifted": float(cosine(race.W[-1, s, m], W_shift)),
            "random": float(cosine(rng.standard_normal(W_own.shape), W_own)),
        }
    return out


def unit_norm_top_mass(race: OptimizerRace) -> np.ndarray:
    """The final attention's mean top mass with every W rescaled to unit Frobenius norm: (S, M).

    The direction without the growth of the norm: what the sparsity would be if training only turned W.
    """
    W = race.W[-1]
    unit = W / np.linalg.norm(W, axis=(-2, -1), keepdims=True)
    S, M = W.shape[:2]
    log_att = race.problem.log_attention(unit.reshape(S * M, -1))
    return np.exp(log_att.max(-1)).mean(-1).reshape(S, M)
