"""The optimizer chooses the margin: drivers, tolerances and tables of the optimizer-geometry chapter.

Every optimizer (NGD, mirror descent with the ℓp potential, sign descent, ℓ1 steepest descent,
Adam, the spectral step) is run through :func:`attnlib.train` on the same instances, and its
final iterate is measured against the ATT-SVM / W-SVM of every norm
(:func:`attnlib.svm.max_margin_norms`).

Two statistics, both with a stated prediction and a control:

- :func:`offset_bound_ratio` (directions, for the strictly convex ℓp norms whose SVM is unique):
  the angle to the reference at the horizon over the angle that a bounded offset allows;
  ≤ 1 for the limit direction, about ``‖θ(T)‖/(√2 ‖θ(T/8)‖)`` for a fixed wrong direction.
- :func:`margin_gap_exponent` (margins, for every norm, also when the SVM is not unique): how
  the normalised-margin deficit ``1 − ρ_N(θ)`` falls with ``‖θ‖``; about −1 when θ/‖θ‖ tends to
  the SVM set with a bounded offset, about 0 when it tends to another direction.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

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
    log_steps,
    mirror_map,
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
    max_margin_norms,
    norm_value,
)

__all__ = [
    "GAP_FLOOR",
    "MIRROR_ADMIT_DEGREES",
    "STEEPEST_ADMIT_GAP",
    "Instance",
    "Runs",
    "instances",
    "optimizer_rules",
    "norm_label",
    "run_optimizers",
    "solve_svms",
    "margin_ratio",
    "margin_gap_ratio",
    "offset_bound_ratio",
    "angle_degrees",
    "correlation_table",
    "norm_selection_reports",
    "member_margin_ratios",
    "member_directions",
    "CheckValue",
    "mirror_check",
    "steepest_check",
    "record_with_control",
    "table_markdown",
    "mirror_basin_maps",
]

#: Margin deficits below this are taken as this (the SVMs' margins are accurate to ~1e-9
#: relative, :data:`attnlib.svm.CERTIFY_TOL` 1e-7 at worst): a deficit there is "converged".
GAP_FLOOR = 1e-7
#: A mirror check uses an (instance, p) only if the ℓp and ℓ2 SVMs are at least this many degrees
#: apart (fixed before any run: well above the ≈0.5° that the offset bound allows at the horizon).
MIRROR_ADMIT_DEGREES = 3.0
#: A steepest-descent check uses an instance only if the ℓ2 SVM falls short of the norm's
#: max margin by at least this fraction (else NGD, the control, would meet the prediction too).
STEEPEST_ADMIT_GAP = 0.01


@dataclass(frozen=True, eq=False)
class Instance:
    """A group of problems of one shape, trained together: ``problems`` (S), ``starts`` (B0, *shape)
    shared by every problem (the batch is S × B0), ``name`` and a ``description``."""

    name: str
    problems: tuple
    starts: np.ndarray
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
      ``n = w_n, T = w_T, d = w_d`` (seeds ``1000·seed + k``), started at W = 0.
    """
    single = _perturbed_single(seed, key_noise)
    multi = multi_input(seed=seed)
    randoms = tuple(random_tokens(w_n, w_T, w_d, seed=1000 * seed + k, family="global") for k in range(w_count))
    return {
        "single": Instance("single", (single,), SINGLE_INPUT_INITS.copy(), "[MMTS] Fig. 1(a), one input"),
        "multi": Instance("multi", (multi,), MULTI_INPUT_INITS.copy(), "[MMTS] multi-input, n = 3, T = 7"),
        "random": Instance(
            "random", randoms, np.zeros((1, w_d, w_d)), f"W, random equal-score family, n={w_n}, T={w_T}, d={w_d}"
        ),
    }


def optimizer_rules(p_values, lr: float = 0.1, adam_lr: float = 0.01, plain_lr: float = 1.0, matrix: bool = True):
    """``{label: (rule, step size)}``: NGD, normalised and plain mirror descent for each p, sign
    descent, ℓ1 steepest descent, Adam and (matrices) the spectral step."""
    rules = {"NGD": ("ngd", lr)}
    for p in p_values:
        rules[f"MD p={p:g}"] = (MirrorDescent(p=float(p), normalized=True), lr)
    for p in p_values:
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


def solve_svms(instance: Instance, norms) -> dict:
    """``{norm: [SVM of each problem's optimal tokens]}`` (one convex program per norm and instance)."""
    out = {}
    for norm in norms:
        norm = check_norm(norm)
        if norm in ("spectral", "nuc") and not instance.matrix:
            continue
        out[norm] = max_margin_norms(instance.problems, norm)
    return out


def run_optimizers(instance: Instance, rules: dict, steps: int, norms, per_decade: int = 12) -> Runs:
    """Train every rule on every problem × start of ``instance`` (one :func:`train` call per rule)
    for ``steps`` steps recorded on a log grid, and solve the SVMs of ``norms``."""
    S, B0, K = len(instance.problems), len(instance.starts), len(rules)
    # one batch: optimizer-major blocks, each problem × start inside (problem-major)
    stack = stack_problems([p for _ in range(K) for p in instance.problems for _ in range(B0)])
    theta0 = np.tile(instance.starts, (K * S,) + (1,) * (instance.starts.ndim - 1))
    lrs = np.repeat([lr for _, lr in rules.values()], S * B0).astype(float)
    blocks = RuleBlocks(tuple(step_rule(rule) for rule, _ in rules.values()), (S * B0,) * K)
    t0 = time.perf_counter()
    traj = train(stack, theta0, steps, blocks, lrs, record_steps=log_steps(steps, per_decade), progress=False)
    seconds = time.perf_counter() - t0
    trajectories = {label: traj.select(slice(k * S * B0, (k + 1) * S * B0)) for k, label in enumerate(rules)}
    return Runs(instance, trajectories, solve_svms(instance, norms), np.repeat(np.arange(S), B0), seconds)


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


def _windows(steps, early=(1 / 16, 1 / 8), late=(1 / 2, 1)):
    steps = np.asarray(steps, float)
    T = steps[-1]
    first = (steps >= early[0] * T) & (steps <= early[1] * T)
    last = (steps >= late[0] * T) & (steps <= late[1] * T)
    if first.sum() < 1 or last.sum() < 1:
        raise ValueError("the records must hold steps in [T/16, T/8] and in [T/2, T] (use log_steps)")
    return first, last


def margin_gap_ratio(steps, ratio, norm_of_theta) -> np.ndarray:
    """The margin deficit ``1 − ρ_N`` late in the run against a deficit falling like ``‖θ‖^{−1/2}``: (B,).

    .. math::

        r = \frac{\\max_{[T/2, T]} (1 − ρ_N)}{\\max(\\max_{[T/16, T/8]} (1 − ρ_N),\\ \text{floor})}
            \\Big(\frac{‖θ(T/2)‖}{‖θ(T/16)‖}\\Big)^{1/2}

    (window maxima, because sign-type steps oscillate; norms at the windows' first records; the
    early deficit floored at :data:`GAP_FLOOR`, the SVMs' accuracy). If θ/‖θ‖ tends to the norm's
    SVM set with a bounded offset, ``1 − ρ_N ∝ 1/‖θ‖`` and ``r ≈ (‖θ(T/2)‖/‖θ(T/16)‖)^{−1/2} < 1``;
    tending to another direction, the deficit tends to a positive constant and ``r ≈`` the square
    root of the growth, above 1. ``ratio``, ``norm_of_theta``: (R, B).

    >>> steps = np.array([0, 1, 2, 4, 8, 16, 32, 64, 128])
    >>> norms = np.repeat(1.0 + steps[:, None], 2, axis=1)
    >>> ratio = np.column_stack([1 - 1 / (1 + steps), 0.9 + 0 * steps])
    >>> np.round(margin_gap_ratio(steps, ratio, norms), 2).tolist()
    [0.37, 2.69]
    """
    first, last = _windows(steps)
    gap = 1.0 - np.asarray(ratio, float)
    norm_of_theta = np.asarray(norm_of_theta, float)
    i0, i1 = np.flatnonzero(first)[0], np.flatnonzero(last)[0]
    growth = norm_of_theta[i1] / norm_of_theta[i0]
    return gap[last].max(axis=0) / np.maximum(gap[first].max(axis=0), GAP_FLOOR) * np.sqrt(growth)


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


def offset_bound_ratio(steps, theta, directions) -> np.ndarray:
    """Angle to ``directions`` at the horizon over the angle a bounded offset allows: (B,).

    With ``q(t)`` the offset of θ(t) from the line of the direction and ``M`` its largest value
    on the records in ``[T/16, T/8]``: ``angle(θ(T)) / arcsin(min(1, √2 M / ‖θ(T)‖))``. Directional
    convergence with a bounded offset (an offset that grows at most by √2 after T/8) gives ≤ 1;
    a fixed other direction, at angle Δ, gives about ``Δ/arcsin(√2 sinΔ ‖θ(T/8)‖/‖θ(T)‖)``, above 1
    once ‖θ‖ grows by more than √2 after T/8.
    ``theta`` (R, B, *shape), ``directions`` (B, *shape).
    """
    steps = np.asarray(steps)
    flat = _flat(theta)
    unit = _flat(np.asarray(directions, float)[None])[0]
    unit = unit / np.linalg.norm(unit, axis=-1, keepdims=True)
    along = np.sum(flat * unit[None], axis=-1)
    offset = np.linalg.norm(flat - along[..., None] * unit[None], axis=-1)
    first, _ = _windows(steps)
    M = offset[first].max(axis=0)
    final_norm = np.linalg.norm(flat[-1], axis=-1)
    allowed = np.degrees(np.arcsin(np.minimum(1.0, np.sqrt(2.0) * M / final_norm)))
    final_angle = np.degrees(np.arctan2(offset[-1], along[-1]))
    with np.errstate(divide="ignore", invalid="ignore"):
        return final_angle / allowed


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

    ``value``: the largest statistic (the prediction: ≤ 1); ``control``: the smallest value of the
    same statistic against the ℓ2 SVM (the planted wrong answer: > 1 expected); ``admitted`` and
    ``members``: how many trajectories the admission rule kept, of how many.
    """

    value: float
    control: float
    admitted: int
    members: int


def _problem_of_members(runs: Runs, per_problem) -> np.ndarray:
    return np.asarray(per_problem)[runs.member_problem]


def mirror_check(runs_list, p: float) -> CheckValue:
    """The mirror-descent check for exponent ``p``: :func:`offset_bound_ratio` of the dual iterates
    ``z(t) = ∇ψ(θ(t))`` of normalised mirror descent against ``∇ψ(θ_mm,p)``; control: against
    ``∇ψ(θ_mm,2)``. Members whose problem's ℓp and ℓ2 SVMs are less than
    :data:`MIRROR_ADMIT_DEGREES` apart are left out (decided from the SVMs, before the runs)."""
    values, controls, admitted, members = [], [], 0, 0
    label = f"MD p={p:g}"
    for runs in runs_list:
        traj = runs.trajectories[label]
        sols_p, sols_2 = runs.svms[check_norm(p)], runs.svms["l2"]
        apart = np.array([angle_degrees(a.theta[None], b.theta)[0] for a, b in zip(sols_p, sols_2)])
        keep = _problem_of_members(runs, apart >= MIRROR_ADMIT_DEGREES)
        members += keep.size
        if not keep.any():
            continue
        admitted += int(keep.sum())
        z = mirror_map(traj.theta[:, keep], p)
        ref_p = mirror_map(member_directions(runs, p)[keep], p)
        ref_2 = mirror_map(member_directions(runs, "l2")[keep], p)
        values.append(offset_bound_ratio(traj.steps, z, ref_p).max())
        controls.append(offset_bound_ratio(traj.steps, z, ref_2).min())
    if not values:
        return CheckValue(np.nan, np.nan, 0, members)
    return CheckValue(float(max(values)), float(min(controls)), admitted, members)


def steepest_check(runs_list, label: str, norm) -> CheckValue:
    """A steepest-descent (or Adam) check: :func:`margin_gap_ratio` of run ``label`` in ``norm``;
    control: the same run's ratio in the ℓ2 norm (the ℓ2 SVM as the limit). Members whose problem's
    ``norm``-SVM falls short of the ℓ2 max margin by less than :data:`STEEPEST_ADMIT_GAP` are left
    out (decided from the SVMs, before the runs)."""
    norm = check_norm(norm)
    values, controls, admitted, members = [], [], 0, 0
    for runs in runs_list:
        if label not in runs.trajectories or norm not in runs.svms:
            continue
        traj = runs.trajectories[label]
        deficit = [
            1.0 - float(margin_ratio(prob, sol.theta, sol2, "l2"))
            for prob, sol, sol2 in zip(runs.instance.problems, runs.svms[norm], runs.svms["l2"])
        ]
        keep = _problem_of_members(runs, np.asarray(deficit) >= STEEPEST_ADMIT_GAP)
        members += keep.size
        if not keep.any():
            continue
        admitted += int(keep.sum())
        values.append(margin_gap_ratio(traj.steps, member_margin_ratios(runs, label, norm), traj.norm)[keep].max())
        controls.append(margin_gap_ratio(traj.steps, member_margin_ratios(runs, label, "l2"), traj.norm)[keep].min())
    if not values:
        return CheckValue(np.nan, np.nan, 0, members)
    return CheckValue(float(max(values)), float(min(controls)), admitted, members)


def record_with_control(checks, name: str, result: CheckValue, *, why: str, planted: str, not_applicable=None):
    """Record ``name`` (``result.value ≤ 1``) and its control ``name_control``: the same statistic on
    the planted wrong answer, which must land beyond the bound (recorded as passing when it does).
    With no admitted member both are not applicable."""
    reason = not_applicable or (None if result.admitted else "no instance passes the admission rule")
    main = checks.at_most(name, result.value, 1.0, why=why, not_applicable=reason)
    control = checks.at_least(
        f"{name}_control",
        result.control,
        1.0,
        why=f"control for {name} (planted: {planted}): the same statistic must exceed the bound",
        not_applicable=reason,
    )
    return main, control


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
