"""The optimizer chooses the margin: drivers, tolerances and tables of the optimizer-geometry chapter.

Every optimizer (NGD, mirror descent with the ℓp potential, sign descent, ℓ1 steepest descent,
Adam, the spectral step) is run through :func:`attnlib.train` on the same instances, and its
final iterate is measured against the ATT-SVM / W-SVM of every norm
(:func:`attnlib.svm.max_margin_norms`).

One statistic for every check (:func:`margin_check`): the normalised margin ``ρ_N`` of the
optimizer's own norm (1 exactly on that norm's max-margin set, also when the set is not one point)
of the run's mean direction over the last half of the horizon (:func:`window_steps`), in units of
how far the planted wrong limit, the ℓ2 SVM, falls short of it; the control is the same statistic
on the NGD run of the same starts (GD's ℓ2 bias). Both are judged against :data:`MIDPOINT`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np

from ..basins import BasinMap, classify_motion
from ..datasets import MULTI_INPUT_INITS, SINGLE_INPUT_INITS, multi_input, random_tokens, single_input
from ..metrics import cosine
from ..model import TokenSelectionProblem, prompt_attention, stack_problems
from ..optim import (
    Adam,
    CoordinateDescent,
    MirrorDescent,
    RuleBlocks,
    SignDescent,
    SpectralDescent,
    Stop,
    log_steps,
    step_rule,
    train,
)
from ..svm import (
    InfeasibleError,
    MaxMarginSolution,
    SelectionReport,
    _constraint_rows,
    _locally_optimal,
    check_norm,
    face_min_l2,
    max_margin_norms,
    norm_value,
)

__all__ = [
    "ADMIT_GAP",
    "MIDPOINT",
    "SIGN_STEP_FACTOR",
    "WINDOW_POINTS",
    "CONTROL_RUN",
    "window_steps",
    "window_margin_ratios",
    "Instance",
    "Runs",
    "instances",
    "optimizer_rules",
    "norm_label",
    "run_optimizers",
    "problem_starts",
    "add_runs",
    "solve_svms",
    "margin_ratio",
    "angle_degrees",
    "correlation_table",
    "norm_selection_reports",
    "member_margin_ratios",
    "member_directions",
    "CheckValue",
    "limit_deficits",
    "admitted_problems",
    "margin_check",
    "PlainHorizon",
    "plain_horizon",
    "record_with_control",
    "table_markdown",
    "mirror_basin_maps",
]

#: A check uses a problem only if each candidate limit (the norm's SVM set, the ℓ2 SVM) falls short
#: of the other's margin by at least this fraction (fixed before any run: below it the two limits
#: are too close for a finite horizon to tell apart; the page lists the angles between them).
ADMIT_GAP = 0.01
#: Sign descent with a constant step η stalls short of the ℓ∞ margin by an amount that shrinks with
#: η (the move of every coordinate by η does not settle on the ℓ∞ face). Measured on seed 2004's W
#: problems with the check's former design (the statistic at the step T, and as control the same
#: run's ℓ2 deficit over the smallest one on the ℓ∞ optimal set), statistic and control at the same
#: length ηt = 300 were 0.086 and 0.43 at η = 0.1 (the control short of the midpoint), 0.040 and
#: 0.66 at η = 0.05, and 0.016 and 0.99 at η = 0.025. H1 is about that small-step limit, so its check
#: runs sign descent at η / SIGN_STEP_FACTOR for SIGN_STEP_FACTOR times the steps (the same length
#: ηt). Factor 2 rather than 4 bounds the cost (this run is the page's longest): at η/2 that control
#: already cleared the midpoint on that seed, with less room than at η/4 (0.66, not 0.99).
SIGN_STEP_FACTOR = 2
#: The bound of every check: half-way between the predicted limit (statistic 0) and the planted
#: wrong one (statistic 1), so that a run is attributed to the nearer of the two.
MIDPOINT = 0.5
#: Steps of the window over which a check averages the direction (:func:`window_steps`): equally
#: spaced over the last half of the horizon. A constant normalised step zigzags around its
#: direction; the value at the one step T depends on the zigzag's phase there, which rounding
#: moves (normalised mirror descent on seed 1049's first W problem: step-to-step values between
#: 0.1 and 1.0 over its last 100 steps, and starts moved by 1e-15 give other values after about 400
#: steps). The mean over 151 steps of the last half does not depend on the phase at T.
WINDOW_POINTS = 151
#: The run every check's control measures: NGD from the same starts over the same horizon, the
#: planted wrong answer "the optimizer has GD's ℓ2 bias" (its limit, the ℓ2 SVM, scores 1).
CONTROL_RUN = "NGD"


@dataclass(frozen=True, eq=False)
class Instance:
    """A group of problems of one shape, trained together: ``problems`` (S), ``starts`` (B0, *shape)
    shared by every problem (the batch is S × B0), ``name`` and a ``description``. ``starts=None``
    starts every problem at its own ℓ2 SVM (B0 = 1; :func:`problem_starts`)."""

    name: str
    problems: tuple
    starts: np.ndarray | None
    description: str

    @property
    def matrix(self) -> bool:
        """Whether the parameter is a matrix (W): the spectral and nuclear norms apply."""
        return len(self.problems[0].shape) == 2


def _perturbed_single(seed: int, scale: float) -> TokenSelectionProblem:
    """[MMTS] Fig. 1(a) (scores 1, 0.9, 0.9: the global regime); for ``seed > 0`` every key moved by
    ``scale·N(0, I)`` (the scores, hence the tie of the non-optimal ones, unchanged)."""
    base = single_input()
    if seed == 0:
        return base
    X = np.array([[[-0.1, 1.0, 1.0], [1.0, 0.0, 0.9], [0.0, 0.0, 0.9]]])
    X[0, :, :2] += scale * np.random.default_rng(seed).standard_normal((3, 2))
    return prompt_attention(X, [1.0], np.array([0.0, 0.0, 1.0]), np.diag([1.0, 1.0, 0.0]), base.loss.name)


def instances(seed: int = 0, w_count: int = 4, w_n: int = 4, w_T: int = 5, w_d: int = 5, key_noise: float = 0.05):
    """The chapter's instances: ``{"single", "multi", "random"}`` (:class:`Instance` each).

    - "single": [MMTS] Fig. 1(a) (one input, non-optimal scores tie), its six official starts;
      seed 0 exactly, other seeds move every key by ``key_noise·N(0, I)``.
    - "multi": the multi-input instance of [MMTS] (chapter 1; noise drawn with ``seed``), its six starts.
    - "random": ``w_count`` self-attention W problems of [FAST]'s equal-score ("global") family,
      ``n = w_n, T = w_T, d = w_d`` (seeds ``1000·seed + k``), each started at its own ℓ2 W-SVM
      (``starts=None``): inside the cone of the optimal selection (every optimal token ahead by
      one logit), at the planted wrong answer of every check. From W = 0 the equal scores do not
      make convergence global: on seed 2011 every optimizer, NGD included, ends one of the four
      problems on a non-optimal selection, outside every theorem's hypotheses.
    """
    single = _perturbed_single(seed, key_noise)
    multi = multi_input(seed=seed)
    randoms = tuple(random_tokens(w_n, w_T, w_d, seed=1000 * seed + k, family="global") for k in range(w_count))
    return {
        "single": Instance("single", (single,), SINGLE_INPUT_INITS.copy(), "[MMTS] Fig. 1(a), one input"),
        "multi": Instance("multi", (multi,), MULTI_INPUT_INITS.copy(), "[MMTS] multi-input, n = 3, T = 7"),
        "random": Instance("random", randoms, None, f"W, random equal-score family, n={w_n}, T={w_T}, d={w_d}"),
    }


def optimizer_rules(
    p_values, lr: float = 0.1, adam_lr: float = 0.01, plain_lr: float = 1.0, matrix: bool = True, plain: bool = True
):
    """``{label: (rule, step size)}``: NGD, normalised and (``plain``) plain mirror descent for each p,
    sign descent, ℓ1 steepest descent, Adam and (``matrix``) the spectral step."""
    rules = {"NGD": ("ngd", lr)}
    for p in p_values:
        rules[f"MD p={p:g}"] = (MirrorDescent(p=float(p), normalized=True), lr)
    for p in p_values if plain else ():
        rules[f"plain MD p={p:g}"] = (MirrorDescent(p=float(p)), plain_lr)
    rules["sign"] = (SignDescent(), lr)
    rules["l1 steepest"] = (CoordinateDescent(), lr)
    rules["Adam"] = (Adam(beta1=0.9, beta2=0.999), adam_lr)
    if matrix:
        rules["spectral"] = (SpectralDescent(), lr)
    return rules


def norm_label(norm) -> str:
    """How a norm is written in tables: ``ℓ1.5``, ``ℓ2``, ``ℓ∞``, ``spectral``, ``nuclear``."""
    norm = check_norm(norm)
    if not isinstance(norm, str):
        return f"ℓ{norm:g}"
    return {"l1": "ℓ1", "l2": "ℓ2", "linf": "ℓ∞", "spectral": "spectral", "nuc": "nuclear"}[norm]


@dataclass(frozen=True, eq=False)
class Runs:
    """Every optimizer on one :class:`Instance`: ``trajectories`` ``{label: Trajectory}`` (batch S × B0,
    problem-major), ``svms`` ``{norm: [MaxMarginSolution per problem]}``, ``member_problem`` (B,)."""

    instance: Instance
    trajectories: dict
    svms: dict
    member_problem: np.ndarray
    seconds: float = 0.0
    #: per-norm results computed from the SVMs alone (:func:`limit_deficits`), filled on first use
    deficits: dict = field(default_factory=dict)


def solve_svms(instance: Instance, norms) -> dict:
    """``{norm: [SVM of each problem's optimal tokens]}`` (one convex program per norm and instance)."""
    out = {}
    for norm in norms:
        norm = check_norm(norm)
        if norm in ("spectral", "nuc") and not instance.matrix:
            continue
        out[norm] = max_margin_norms(instance.problems, norm)
    return out


def problem_starts(instance: Instance, svms: dict) -> np.ndarray:
    """The starts of every problem of ``instance``: (S, B0, *shape): its ``starts`` for every
    problem, or (``starts=None``) each problem's ℓ2 SVM ``svms["l2"][s].theta`` (B0 = 1)."""
    if instance.starts is not None:
        return np.repeat(np.asarray(instance.starts, float)[None], len(instance.problems), axis=0)
    return np.stack([sol.theta[None] for sol in svms["l2"]])


def _chapter_records(steps: int, per_decade: int) -> np.ndarray:
    """The recorded steps of a run of ``steps`` steps: the log grid and the checks' window."""
    return np.union1d(log_steps(steps, per_decade), window_steps(steps))


def run_optimizers(
    instance: Instance, rules: dict, steps: int, norms, per_decade: int = 12, svms=None, longer=None, needed_by=None
) -> Runs:
    """Train every rule on every problem × start of ``instance`` (all in one :func:`train` call,
    :class:`attnlib.optim.RuleBlocks`) for ``steps`` steps recorded on a log grid and on the
    checks' window (:func:`window_steps`); ``svms`` the instance's SVMs of ``norms``
    (:func:`solve_svms`, solved here if None; they give the starts of an instance with ``starts=None``).

    ``longer``: ``{label: (rule, lr, steps)}``, rules with a longer horizon of their own (e.g. a
    smaller step over more steps, :data:`SIGN_STEP_FACTOR`). They share the batch up to ``steps``;
    then they alone go on from there (the loop's cost is per step, so a small batch costs little
    less than a large one). A rule that carries a state from step to step (Adam) cannot be resumed
    and is run on its own. A trajectory's numbers do not depend on the other members of its batch.
    With ``needed_by`` (a norm) the longer rules serve only that norm's check and are run only if it
    admits some problem of the instance (:func:`admitted_problems`, decided from the SVMs alone).
    """
    svms = solve_svms(instance, norms) if svms is None else svms
    starts = problem_starts(instance, svms)
    S, B0 = len(instance.problems), starts.shape[1]
    runs = Runs(instance, {}, svms, np.repeat(np.arange(S), B0))
    longer = dict(longer or {})
    if longer and needed_by is not None and not admitted_problems(runs, needed_by).any():
        longer = {}
    resumable = {label: v for label, v in longer.items() if int(v[2]) >= steps and _stateless(v[0], starts)}
    for label, (rule, lr, horizon) in longer.items():  # the others: from the start, on their own
        if label not in resumable:
            runs.trajectories[label] = _train_rules(instance, starts, {label: (rule, lr)}, int(horizon), per_decade)[0][
                label
            ]
    together = dict(rules) | {label: v[:2] for label, v in resumable.items()}
    horizons = {label: int(steps) for label in rules} | {label: int(v[2]) for label, v in resumable.items()}
    shared, seconds = _train_rules(instance, starts, together, int(steps), per_decade, horizons)
    for label, (rule, lr, horizon) in resumable.items():
        own = _chapter_records(int(horizon), per_decade)
        first = shared[label]
        rest = train(
            stack_problems([p for p in instance.problems for _ in range(B0)]),
            first.theta[-1],
            int(horizon) - int(steps),
            step_rule(rule),
            np.full(S * B0, float(lr)),
            record_steps=np.union1d([0], own[own > steps] - steps),
            progress=False,
        )
        shared[label] = _joined(first, rest, int(steps)).records(own)
    runs.trajectories.update({label: shared[label] for label in together})
    runs.trajectories.update({label: runs.trajectories.pop(label) for label in longer if label not in resumable})
    return replace(runs, trajectories={label: runs.trajectories[label] for label in (*rules, *longer)}, seconds=seconds)


def _chapter_records(steps: int, per_decade: int) -> np.ndarray:
    """The recorded steps of a run of ``steps`` steps: the log grid and the checks' window."""
    return np.union1d(log_steps(steps, per_decade), window_steps(steps))


def _stateless(rule, starts) -> bool:
    """Whether ``rule`` carries nothing from one step to the next (so a run can be resumed from its parameters)."""
    stepper = step_rule(rule)
    flat = starts.reshape(-1, starts[0, 0].size)
    return not stepper.moves_itself or stepper.init_state(flat, starts.shape[2:]) is None


def _train_rules(instance: Instance, starts, rules: dict, steps: int, per_decade: int, horizons=None):
    """One :func:`train` call of every rule on every problem × start, ``steps`` steps; each rule's
    records are those of its horizon (``horizons[label]``, default ``steps``) up to ``steps``.
    Returns ``({label: Trajectory}, seconds)``."""
    S, B0, K = len(instance.problems), starts.shape[1], len(rules)
    # one batch: optimizer-major blocks, each problem × start inside (problem-major)
    stack = stack_problems([p for _ in range(K) for p in instance.problems for _ in range(B0)])
    theta0 = np.tile(starts.reshape((S * B0,) + starts.shape[2:]), (K,) + (1,) * (starts.ndim - 2))
    lrs = np.repeat([lr for _, lr in rules.values()], S * B0).astype(float)
    steppers = tuple(step_rule(rule) for rule, _ in rules.values())
    # one rule: stepped directly (the same numbers as a block of one, without the blocks' bookkeeping)
    blocks = steppers[0] if K == 1 else RuleBlocks(steppers, (S * B0,) * K)
    own = {}
    for label in rules:
        records = _chapter_records((horizons or {}).get(label, steps), per_decade)
        own[label] = np.union1d(records[records <= steps], [steps])
    record = np.unique(np.concatenate(list(own.values())))
    t0 = time.perf_counter()
    traj = train(stack, theta0, steps, blocks, lrs, record_steps=record, progress=False)
    seconds = time.perf_counter() - t0
    out = {}
    for k, label in enumerate(rules):
        part = traj.select(slice(k * S * B0, (k + 1) * S * B0))
        out[label] = part if len(own[label]) == len(record) else part.records(own[label])
    return out, seconds


def _joined(first, rest, offset: int):
    """A trajectory resumed at step ``offset`` of ``first`` (``rest`` starts from ``first``'s last state)."""
    stopped = tuple(
        a if a is not None else (None if b is None else Stop(b.step + offset, b.reason))
        for a, b in zip(first.stopped, rest.stopped)
    )
    parts = {
        name: np.concatenate([getattr(first, name), getattr(rest, name)[1:]])
        for name in ("theta", "loss", "log_gap", "log_grad_norm")
    }
    return replace(
        first,
        **parts,
        steps=np.concatenate([first.steps, rest.steps[1:] + offset]),
        seconds=np.concatenate([first.seconds, rest.seconds[1:] + first.seconds[-1]]),
        stopped=stopped,
    )


def add_runs(runs: Runs, rules: dict, steps: int, per_decade: int = 12, needed_by=None) -> Runs:
    """``runs`` with the trajectories of more ``rules`` added (same instance, starts and SVMs; their
    own horizon ``steps``), e.g. a rule at a smaller step over a longer horizon (:data:`SIGN_STEP_FACTOR`).

    ``needed_by``: the rules serve only the check of this norm, so they are run only if that
    check admits some problem of the instance (:func:`admitted_problems`, decided from the SVMs
    alone); otherwise ``runs`` is returned unchanged (the check would leave every run out).
    """
    if needed_by is not None and not admitted_problems(runs, needed_by).any():
        return runs
    extra = run_optimizers(runs.instance, rules, steps, list(runs.svms), per_decade, svms=runs.svms)
    runs.trajectories.update(extra.trajectories)
    return runs


def _flat(theta) -> np.ndarray:
    theta = np.asarray(theta, float)
    return theta.reshape(theta.shape[:2] + (-1,)) if theta.ndim >= 3 else theta


def margin_ratio(prob: TokenSelectionProblem, theta, sol: MaxMarginSolution, norm) -> np.ndarray:
    """Normalised margin in ``norm`` over the SVM's: ``ρ_N(θ) = min_k ⟨θ, G_k⟩ ‖θ_mm‖_N / ‖θ‖_N``: (*batch,).

    ``G_k = A_{iα_i} − A_{it}`` are the SVM's constraint rows (selection ``sol.select``), ``θ``
    (*batch, *shape). ``ρ_N ≤ 1``, with equality exactly when θ/‖θ‖_N is a max-margin direction of
    the norm (a unique one for ℓp, p in (1, ∞); possibly a face for ℓ1, ℓ∞ and spectral).

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.single_input()
    >>> sol = al.svm.max_margin_norm(prob, "linf")
    >>> float(np.round(margin_ratio(prob, sol.theta, sol, "linf"), 6))
    1.0
    """
    G, h, _ = _constraint_rows(prob, sol.select)
    theta = np.asarray(theta, float)
    batch = theta.shape[: theta.ndim - len(prob.shape)]
    flat = theta.reshape(batch + (prob.size,))
    size = norm_value(flat.reshape(batch + prob.shape), norm, prob.shape)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (flat @ G.T).min(axis=-1) / size / sol.margin


def member_margin_ratios(runs: Runs, label: str, norm) -> np.ndarray:
    """``ρ_N`` of every recorded state of trajectory ``label`` against its problem's SVM of ``norm``: (R, B)."""
    traj = runs.trajectories[label]
    norm = check_norm(norm)
    out = np.empty(traj.theta.shape[:2])
    for s, (prob, sol) in enumerate(zip(runs.instance.problems, runs.svms[norm])):
        members = runs.member_problem == s
        out[:, members] = margin_ratio(prob, traj.theta[:, members], sol, norm)
    return out


def window_steps(steps: int, points: int = WINDOW_POINTS) -> np.ndarray:
    """The checks' window of a run of ``steps`` steps: ``points`` equally spaced steps of ``[T/2, T]``, rounded.

    >>> window_steps(3000, 4).tolist()
    [1500, 2000, 2500, 3000]
    """
    return np.unique(np.rint(np.linspace(steps / 2.0, steps, points)).astype(int))


def window_margin_ratios(runs: Runs, label: str, norm) -> np.ndarray:
    """``ρ_N(ū)`` (B,) of each member's mean direction ``ū = mean_t θ(t)/‖θ(t)‖_N`` over the window
    (:func:`window_steps` of the trajectory's horizon) against its problem's SVM of ``norm``.

    The margin ``min_k ⟨θ, G_k⟩`` is concave and ``‖ū‖_N ≤ 1``, so ``ρ_N(ū) ≥ mean_t ρ_N(θ(t))``
    when the mean margin is positive: the window's deficit is at most the time average of the
    pointwise ones, and both have the limit of ``θ(t)/‖θ(t)‖_N`` when that converges.
    """
    traj = runs.trajectories[label]
    norm = check_norm(norm)
    window = np.isin(traj.steps, window_steps(int(traj.steps[-1])))
    if window.sum() != len(window_steps(int(traj.steps[-1]))):
        raise ValueError(f"run {label!r} was not recorded on its window (record it with run_optimizers)")
    out = np.empty(traj.theta.shape[1])
    for s, (prob, sol) in enumerate(zip(runs.instance.problems, runs.svms[norm])):
        members = runs.member_problem == s
        theta = traj.theta[window][:, members]  # (W, b, *shape)
        sizes = norm_value(theta, norm, prob.shape)  # (W, b)
        mean = (theta / sizes.reshape(sizes.shape + (1,) * len(prob.shape))).mean(axis=0)
        out[members] = margin_ratio(prob, mean, sol, norm)
    return out


def angle_degrees(theta, direction) -> np.ndarray:
    """Angle in degrees between each ``theta`` (B, *shape) and ``direction`` ((*shape) or (B, *shape)): (B,).

    >>> angle_degrees(np.array([[1.0, 0.0], [1.0, 1.0]]), np.array([1.0, 0.0])).round(6).tolist()
    [0.0, 45.0]
    """
    theta = np.asarray(theta, float)
    t = theta.reshape(len(theta), -1)
    d = np.broadcast_to(
        np.asarray(direction, float).reshape(
            -1 if np.ndim(direction) < theta.ndim else len(t), *(() if np.ndim(direction) < theta.ndim else (-1,))
        ),
        t.shape,
    )
    cos = np.sum(t * d, -1) / (np.linalg.norm(t, axis=-1) * np.linalg.norm(d, axis=-1))
    return np.degrees(np.arccos(np.clip(cos, -1.0, 1.0)))


def member_directions(runs: Runs, norm) -> np.ndarray:
    """Each member's SVM of ``norm`` (its problem's): (B, *shape)."""
    sols = runs.svms[check_norm(norm)]
    return np.stack([sols[s].theta for s in runs.member_problem])


def correlation_table(runs: Runs, labels=None, statistic: str = "margin") -> tuple[list, list, np.ndarray]:
    """Rows (optimizer labels), columns (norms) and the (rows, cols) table of the median over the batch
    of ``ρ_N`` at the horizon (``statistic="margin"``) or of ``cos(θ(T), θ_mm,N)`` ("cosine")."""
    labels = list(runs.trajectories) if labels is None else list(labels)
    norms = list(runs.svms)
    table = np.empty((len(labels), len(norms)))
    for i, label in enumerate(labels):
        final = runs.trajectories[label].theta[-1]
        for j, norm in enumerate(norms):
            if statistic == "margin":
                table[i, j] = np.median(member_margin_ratios(runs, label, norm)[-1])
            else:
                ref = member_directions(runs, norm)
                f, r = final.reshape(len(final), -1), ref.reshape(len(ref), -1)
                cos = np.sum(f * r, -1) / (np.linalg.norm(f, axis=-1) * np.linalg.norm(r, axis=-1))
                table[i, j] = np.median(cos)
    return labels, norms, table


def norm_selection_reports(prob: TokenSelectionProblem, norm) -> list[SelectionReport]:
    """Every selection's SVM under ``norm`` with its local optimality (the ℓp analogue of
    :func:`attnlib.enumerate_selections`: neighbours are the active constraints of the ℓp SVM)."""
    out = []
    for sel in np.ndindex(*([prob.T] * prob.n)):
        try:
            sol = max_margin_norms([prob], norm, [np.array(sel)])[0]
        except InfeasibleError:
            out.append(SelectionReport(tuple(sel), False, False, None))
            continue
        out.append(SelectionReport(tuple(sel), True, _locally_optimal(prob, sol), sol))
    return out


@dataclass(frozen=True)
class CheckValue:
    """A check's statistic over the admitted members of every instance, and its control.

    ``value``: the largest statistic (the prediction: ≤ :data:`MIDPOINT`); ``control``: the
    smallest value of the control statistic (the planted wrong answer: > :data:`MIDPOINT`
    expected); ``admitted`` and ``members``: how many trajectories the admission rule kept, of how many.
    """

    value: float
    control: float
    admitted: int
    members: int


def _problem_of_members(runs: Runs, per_problem) -> np.ndarray:
    return np.asarray(per_problem)[runs.member_problem]


def limit_deficits(prob: TokenSelectionProblem, sol_norm: MaxMarginSolution, sol_l2: MaxMarginSolution, norm):
    """``(δ_N, δ_2)``: how far each candidate limit falls short of the other's margin.

    ``δ_N = 1 − ρ_N(θ_mm,2)``: the ℓ2 SVM's deficit in the ``norm`` margin; ``δ_2 = 1 −
    ‖θ_mm,2‖/min_face ‖θ‖_2``: the smallest ℓ2 deficit of any point of the ``norm`` SVM's optimal
    set (:func:`attnlib.svm.face_min_l2`; for ℓp the SVM itself).
    """
    delta_norm = 1.0 - float(margin_ratio(prob, sol_l2.theta, sol_norm, norm))
    delta_l2 = 1.0 - float(np.linalg.norm(sol_l2.theta)) / face_min_l2(prob, sol_norm, norm)
    return delta_norm, delta_l2


def admitted_problems(runs: Runs, norm) -> np.ndarray:
    """(S,) which problems of ``runs`` the ``norm`` check uses: both :func:`limit_deficits` at least
    :data:`ADMIT_GAP`. Decided from the SVMs alone (one face solve per problem and norm, kept in
    ``runs.deficits`` and shared by the checks), so it can decide which runs are needed at all."""
    norm = check_norm(norm)
    if norm not in runs.deficits:
        runs.deficits[norm] = np.array(
            [
                limit_deficits(prob, sol, sol2, norm)
                for prob, sol, sol2 in zip(runs.instance.problems, runs.svms[norm], runs.svms["l2"])
            ]
        )
    return runs.deficits[norm].min(axis=1) >= ADMIT_GAP


def margin_check(runs_list, label: str, norm, control: str = CONTROL_RUN) -> CheckValue:
    """Does run ``label`` end at the ``norm`` margin (not at the ℓ2 one)?

    Statistic, per trajectory: ``(1 − ρ_N(ū))/δ_N``, the ``norm``-margin deficit of its mean
    direction over the window (the last half of its horizon, :func:`window_margin_ratios`) in units
    of the deficit of the wrong limit (the ℓ2 SVM): 0 on the predicted set, 1 at the ℓ2 SVM, by the
    definition of ``δ_N``. Control: the same statistic, on the same members and window, of run
    ``control`` (NGD from the same starts: the planted wrong answer "the optimizer has GD's ℓ2
    bias", whose limit scores 1). Claim and control are one function whose two limits lie on either
    side of :data:`MIDPOINT`, half-way. Trajectories whose problem has ``δ_N`` or ``δ_2`` below
    :data:`ADMIT_GAP` are left out (decided from the SVMs, before the runs).
    """
    norm = check_norm(norm)
    values, controls, admitted, members = [], [], 0, 0
    for runs in runs_list:
        if norm not in runs.svms:
            continue
        keep = _problem_of_members(runs, admitted_problems(runs, norm))
        if label not in runs.trajectories:
            if keep.any():
                raise ValueError(f"run {label!r} is missing on {runs.instance.name!r}, which the {norm!r} check admits")
            members += keep.size  # left out by the admission rule, as if it had run
            continue
        members += keep.size
        if not keep.any():
            continue
        admitted += int(keep.sum())
        d_norm = _problem_of_members(runs, runs.deficits[norm][:, 0])[keep]
        values.append(((1.0 - window_margin_ratios(runs, label, norm)[keep]) / d_norm).max())
        controls.append(((1.0 - window_margin_ratios(runs, control, norm)[keep]) / d_norm).min())
    if not values:
        return CheckValue(np.nan, np.nan, 0, members)
    return CheckValue(float(max(values)), float(min(controls)), admitted, members)


@dataclass(frozen=True)
class PlainHorizon:
    """How far plain mirror descent (the theorem's own algorithm) got, and how long it would need.

    ``value``: the largest statistic ``(1 − ρ_N(θ(T)))/δ_N`` at the horizon (the worst start);
    ``product_early``, ``product_late``: that start's statistic times ``‖θ‖_2`` at ``T/10`` and at
    ``T`` (equal if the deficit falls like ``1/‖θ‖``); ``norm``: its ``‖θ(T)‖_2``; ``growth``: its
    increase of ``‖θ‖_2`` per e-fold of ``t`` over the last decade; ``log10_steps``: the horizon at
    which, continuing both trends, the statistic would reach :data:`MIDPOINT`.
    """

    value: float
    product_early: float
    product_late: float
    norm: float
    growth: float
    log10_steps: float


def plain_horizon(runs: Runs, label: str, norm) -> PlainHorizon:
    """Extrapolate run ``label`` (plain mirror descent) to the horizon at which it would decide.

    With a bounded offset the margin deficit falls like ``1/‖θ‖``, and the plain step makes ``‖θ‖``
    grow only like ``log t`` (the gradient shrinks like ``exp(−margin)``), so the horizon needed is
    ``T · exp((‖θ‖_needed − ‖θ(T)‖)/growth)`` with ``‖θ‖_needed = ‖θ(T)‖ · value / MIDPOINT``. Every
    problem of the instance is used (no admission: this is a measurement, not a check).
    """
    norm = check_norm(norm)
    traj = runs.trajectories[label]
    d_norm = np.array(
        [
            1.0 - float(margin_ratio(p, s2.theta, s, norm))
            for p, s, s2 in zip(runs.instance.problems, runs.svms[norm], runs.svms["l2"])
        ]
    )[runs.member_problem]
    stat = (1.0 - member_margin_ratios(runs, label, norm)) / d_norm  # (R, B)
    worst = int(np.nanargmax(stat[-1]))
    sizes = np.linalg.norm(traj.theta[:, worst].reshape(len(traj.steps), -1), axis=-1)
    early = int(np.argmin(np.abs(traj.steps - traj.steps[-1] / 10.0)))
    growth = (sizes[-1] - sizes[early]) / np.log(traj.steps[-1] / traj.steps[early])
    needed = sizes[-1] * stat[-1, worst] / MIDPOINT
    log10_steps = np.log10(traj.steps[-1]) + (needed - sizes[-1]) / growth / np.log(10.0)
    return PlainHorizon(
        float(stat[-1, worst]),
        float(stat[early, worst] * sizes[early]),
        float(stat[-1, worst] * sizes[-1]),
        float(sizes[-1]),
        float(growth),
        float(log10_steps),
    )


def record_with_control(checks, name: str, result: CheckValue, *, why: str, planted: str, not_applicable=None):
    """Record ``name``: ``result.value ≤`` :data:`MIDPOINT`, with the control ``{planted: result.control}`` (the same
    statistic on the planted wrong answer, which must land beyond the bound). With no admitted
    member the check is not applicable."""
    reason = not_applicable or (None if result.admitted else "no instance passes the admission rule")
    return checks.at_most(
        name, result.value, MIDPOINT, why=why, controls={planted: result.control}, not_applicable=reason
    )


def table_markdown(labels, norms, table, diagonal: dict, digits: int = 4) -> str:
    """A markdown table "optimizer × SVM norm"; cells named in ``diagonal`` ``{label: norm}`` in bold."""
    head = "| optimizer | " + " | ".join(norm_label(n) for n in norms) + " |"
    rows = [head, "|---|" + "---|" * len(norms)]
    for label, row in zip(labels, table):
        cells = [
            f"**{x:.{digits}f}**" if diagonal.get(label) == norm else f"{x:.{digits}f}" for norm, x in zip(norms, row)
        ]
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def mirror_basin_maps(prob: TokenSelectionProblem, grid, steps: int, lr: float, p: float, tol: float) -> dict:
    """Chapter 3's basin map (Fig. 1(b)) under NGD and under normalised mirror descent, one batch.

    Every start of ``grid`` (G², *shape) is trained by both rules (:class:`attnlib.optim.RuleBlocks`);
    a trajectory belongs to a locally-optimal selection when its motion over the second half heads
    for that selection's SVM of the optimizer's own norm (ℓ2 for NGD, ℓp for mirror descent) within
    ``tol`` (:func:`attnlib.classify_motion`). Returns ``{"ngd": BasinMap, "md ℓp": BasinMap}``.
    """
    grid = np.asarray(grid, float)
    G = len(grid)
    blocks = RuleBlocks((step_rule("ngd"), MirrorDescent(p=float(p), normalized=True)), (G, G))
    half = max(steps // 2, 1)
    traj = train(prob, np.concatenate([grid, grid]), steps, blocks, lr, record_steps=[0, half, steps], progress=False)
    out = {}
    for k, (key, norm) in enumerate((("ngd", "l2"), (f"md ℓ{p:g}", float(p)))):
        reports = [r for r in norm_selection_reports(prob, norm) if r.locally_optimal]
        part = slice(k * G, (k + 1) * G)
        a, b = traj.theta[1, part], traj.theta[2, part]
        labels, motion = classify_motion(prob, a, b, reports, tol)
        out[key] = BasinMap(
            labels=labels,
            candidates=tuple(reports),
            is_global=np.array([np.array_equal(r.select, prob.opt) for r in reports]),
            final=b,
            motion_cosine=motion,
            position_cosine=np.stack([cosine(b, r.solution.theta) for r in reports], axis=-1),
            extended=np.zeros(G, bool),
            steps=int(steps),
            readout_steps=0,
            extend_steps=0,
            tol=float(tol),
        )
    return out
