"""Basins of the locally-optimal directions, cone initialisations, selection tables.

Local convergence ([MMTS], [TFSVM]): GD started in a cone around a *locally optimal*
``θ_mm(α)`` converges in direction to it, so a dense grid of initialisations splits into basins,
one per locally-optimal selection. :func:`basin_map` trains a grid as one batch and attributes
each trajectory to the direction it is heading to, or to none ("undecided within the horizon").

How a trajectory is attributed. A trajectory converging to ``θ_mm(α)`` does so with a bounded
orthogonal offset: ``θ(t) = a(t) d̂ + r(t)`` with ``r(t)`` converging, so its
*motion* ``Δθ = θ(t_b) − θ(t_a)`` over the last half of the horizon points along ``d̂`` up to
``‖Δr‖/‖Δθ‖ → 0``, much sooner than its position does (``1 − cos θ ≈ ‖r‖²/2‖θ‖²``, slow when
``r`` is large, as it is after a long stay near a basin boundary). A trajectory is attributed to
``α`` when ``1 − cos(Δθ, θ_mm(α)) ≤ tol`` and it selects ``α``; otherwise it is *undecided*. A
trajectory that lingers near a basin boundary moves along a direction between the candidates
(for [MMTS] Fig. 1(b) the direction where two tokens' logits tie, at ``1 − cos ≈ 5·10⁻³``
from ``p_mm(α=2)``), so ``tol`` must sit below the gap between the candidates and such
directions, and above the decay of ``‖Δr‖/‖Δθ‖``. Undecided trajectories can be continued for
longer (``extend_steps``): a small second batch, not a loop.

GD's direction converges like ``1/log t``: within any affordable horizon it does not settle.
``readout_steps`` continues every trajectory with NGD (``readout_lr``) after the ``steps`` of
``method``; NGD follows the same gradient-flow paths at unit speed, so the read-out tells where
the first ``steps`` of GD have sent each initialisation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .metrics import cosine
from .model import TokenSelectionProblem
from .optim import check_schedule, step_rule, train
from .svm import SelectionReport, locally_optimal_selections

__all__ = ["BasinMap", "basin_map", "classify_motion", "cone_starts", "selection_table"]

#: Default attribution tolerance on ``1 − cos(Δθ, θ_mm(α))`` (see the module docstring).
MOTION_TOL = 1e-3


@dataclass(frozen=True, eq=False)
class BasinMap:
    """Where each trajectory of a batch is heading.

    Attributes:
        labels: (B,) index into ``candidates`` or ``-1`` (undecided within the horizon).
        candidates: the locally-optimal selections (:class:`~attnlib.svm.SelectionReport`).
        is_global: (K,) bool, candidate ``k`` is the optimal selection.
        final: (B, *shape) the last parameters.
        motion_cosine: (B, K) ``cos(Δθ, θ_mm(α_k))`` over the last half of the horizon.
        position_cosine: (B, K) ``cos(θ_final, θ_mm(α_k))``.
        extended: (B,) bool, the trajectory was undecided at the first horizon and continued.
        steps: the first horizon; ``readout_steps``, ``extend_steps`` as given.
        tol: the attribution tolerance.
    """

    labels: np.ndarray
    candidates: tuple
    is_global: np.ndarray
    final: np.ndarray
    motion_cosine: np.ndarray
    position_cosine: np.ndarray
    extended: np.ndarray
    steps: int
    readout_steps: int
    extend_steps: int
    tol: float

    def fractions(self) -> dict:
        """Fraction of the batch in each basin: ``{"global": …, "local": …, "undecided": …}``.

        Several local candidates are summed under "local"; the values sum to one.
        """
        glob = np.isin(self.labels, np.flatnonzero(self.is_global))
        undecided = self.labels < 0
        return {
            "global": float(np.mean(glob)),
            "local": float(np.mean(~glob & ~undecided)),
            "undecided": float(np.mean(undecided)),
        }

    def kind(self) -> np.ndarray:
        """(B,) ``0`` global, ``1`` local, ``-1`` undecided."""
        glob = np.isin(self.labels, np.flatnonzero(self.is_global))
        return np.where(self.labels < 0, -1, np.where(glob, 0, 1))


def classify_motion(
    prob: TokenSelectionProblem, theta_a, theta_b, candidates, tol: float = MOTION_TOL
) -> tuple[np.ndarray, np.ndarray]:
    """Attribute trajectories to candidates by their motion between two recorded states.

    Args:
        prob: the problem.  theta_a, theta_b: (B, *shape) earlier and later states.
        candidates: K :class:`~attnlib.svm.SelectionReport` (feasible) to attribute to.
        tol: trajectory ``b`` goes to ``k`` if ``1 − cos(θ_b − θ_a, θ_mm(α_k)) ≤ tol`` and
            ``prob.selection(θ_b) = α_k``.

    Returns ``labels`` (B,) (``-1``: none) and ``motion_cosine`` (B, K).
    """
    if not 0 < tol < 1:
        raise ValueError(f"tol must be in (0, 1), got {tol!r}")
    motion = np.asarray(theta_b, float) - np.asarray(theta_a, float)
    sel = prob.selection(theta_b)
    B = motion.shape[0]
    cos = np.empty((B, len(candidates)))
    hit = np.zeros((B, len(candidates)), bool)
    for k, cand in enumerate(candidates):  # K candidates (a handful), each over the whole batch
        with np.errstate(invalid="ignore"):
            cos[:, k] = cosine(motion, cand.solution.theta)
        hit[:, k] = (1.0 - cos[:, k] <= tol) & np.all(sel == np.asarray(cand.select), axis=-1)
    if np.any(hit.sum(axis=1) > 1):
        raise ValueError("tol is too loose: a trajectory matches two candidates")
    labels = np.where(hit.any(axis=1), np.argmax(hit, axis=1), -1)
    return labels, cos


def _two_states(prob, theta0, steps, method, lr):
    """Train ``steps`` and return the states at ``steps // 2`` and ``steps``."""
    half = max(steps // 2, 1)
    traj = train(prob, theta0, steps, method, lr, record_every=half)
    mid = int(np.flatnonzero(traj.steps == half)[0])
    return traj.theta[mid], traj.theta[-1]


def basin_map(
    prob: TokenSelectionProblem,
    theta0,
    steps: int,
    method: str = "ngd",
    lr: float = 0.1,
    candidates=None,
    tol: float = MOTION_TOL,
    readout_steps: int = 0,
    readout_lr: float = 0.5,
    extend_steps: int = 0,
) -> BasinMap:
    """Train every initialisation in ``theta0`` as one batch and map it to its basin.

    Args:
        prob: the problem.  theta0: (B, *shape) initialisations (e.g. a grid).
        steps, method, lr: the optimizer whose basins are mapped.
        candidates: locally-optimal selections (default: all, by enumeration).
        tol: attribution tolerance (:func:`classify_motion`).
        readout_steps: if > 0, continue every trajectory with NGD (``readout_lr``) for this many
            steps and attribute by the motion during the read-out (use it for GD).
        extend_steps: continue the undecided ones with NGD for this many more steps.

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.single_input(local=True)
    >>> m = al.basin_map(prob, al.datasets.SINGLE_INPUT_INITS, steps=400, lr=0.5)
    >>> m.kind().tolist()
    [0, 0, 0, 0, 1, 1]
    """
    step_rule(method)  # a ValueError for an unknown method
    check_schedule(steps, lr, 1)
    if candidates is None:
        candidates = locally_optimal_selections(prob)
    candidates = tuple(candidates)
    if not candidates or not all(isinstance(c, SelectionReport) and c.feasible for c in candidates):
        raise ValueError("candidates must be a non-empty list of feasible SelectionReports")
    theta0 = np.asarray(theta0, float)
    if readout_steps > 0:
        first = train(prob, theta0, steps, method, lr, record_every=max(steps, 1)).final
        a, b = _two_states(prob, first, readout_steps, "ngd", readout_lr)
    else:
        a, b = _two_states(prob, theta0, steps, method, lr)
    labels, mcos = classify_motion(prob, a, b, candidates, tol)
    extended = np.zeros(len(labels), bool)
    final = b.copy()
    undecided = np.flatnonzero(labels < 0)
    if extend_steps > 0 and undecided.size:
        ext_lr = lr if (readout_steps == 0 and method == "ngd") else readout_lr
        a2, b2 = _two_states(prob, b[undecided], extend_steps, "ngd", ext_lr)
        labels[undecided], mcos[undecided] = classify_motion(prob, a2, b2, candidates, tol)
        final[undecided] = b2
        extended[undecided] = True
    pcos = np.stack([cosine(final, c.solution.theta) for c in candidates], axis=-1)
    return BasinMap(
        labels=labels,
        candidates=candidates,
        is_global=np.array([np.array_equal(c.select, prob.opt) for c in candidates]),
        final=final,
        motion_cosine=mcos,
        position_cosine=pcos,
        extended=extended,
        steps=int(steps),
        readout_steps=int(readout_steps),
        extend_steps=int(extend_steps),
        tol=float(tol),
    )


def cone_starts(direction, count: int, *, mu: float, radius: float, rng=None, span=None, edge: bool = False):
    """Initialisations in the cone of the local theorem around ``θ_mm(α)`` ([MMTS], [TFSVM]).

    Every start ``θ`` has ``1 − cos(θ, d) ≤ mu`` and norm ``radius · ‖d‖``: for ``d = θ_mm(α)``
    every SVM-neighbour's logit gap on the cone's axis, ``⟨radius · d, A_iα_i − A_it⟩``, equals
    ``radius``, so ``radius`` is the norm in units of ``‖θ_mm(α)‖`` (the theorem's ``R`` is
    ``radius · ‖θ_mm(α)‖``). A start is ``cos φ · radius · d + sin φ · radius · ‖d‖ · u`` with a
    unit tilt ``u ⟂ d`` drawn uniformly in the subspace ``span`` and the angle ``φ`` uniform in
    ``[0, φ_μ]``, ``cos φ_μ = 1 − mu`` (``edge=False``), or ``φ = φ_μ`` (``edge=True``: the
    tilts then come in antipodal pairs, so a 2-D cone gets both of its edges).

    Args:
        direction: (*shape) ``θ_mm(α)`` (any non-zero parameter).
        count: number of starts.  mu: cone width in ``(0, 1)``.  radius: > 0.
        rng: a ``numpy.random.Generator`` or a seed.
        span: (k, size) rows spanning the subspace to tilt in (default: the whole space), e.g.
            the plane of the keys when other coordinates never change a logit.
        edge: put every start on the cone's edge.

    Returns (count, *shape).

    >>> import numpy as np, attnlib as al
    >>> s = al.cone_starts([1.0, 0.0, 0.0], 4, mu=1e-3, radius=20, rng=0, span=np.eye(3)[:2], edge=True)
    >>> np.round(al.one_minus_cosine(s, [1.0, 0.0, 0.0]), 12).tolist(), np.round(s[:2, 1], 3).tolist()
    ([0.001, 0.001, 0.001, 0.001], [-0.894, 0.894])
    """
    d = np.asarray(direction, float)
    d_norm = np.linalg.norm(d)
    if not (np.isfinite(d_norm) and d_norm > 0):
        raise ValueError("direction must be finite and non-zero")
    if not isinstance(count, (int, np.integer)) or count < 1:
        raise ValueError(f"count must be a positive integer, got {count!r}")
    if not 0 < mu < 1:
        raise ValueError(f"mu must be in (0, 1), got {mu!r}")
    if not radius > 0:
        raise ValueError(f"radius must be > 0, got {radius!r}")
    unit = d.ravel() / d_norm
    basis = np.eye(unit.size) if span is None else np.asarray(span, float).reshape(-1, unit.size)
    q, _ = np.linalg.qr(basis.T)  # (size, k) orthonormal basis of the span
    rng = np.random.default_rng(rng)
    tilt = rng.standard_normal((count, q.shape[1])) @ q.T
    tilt -= (tilt @ unit)[:, None] * unit
    if edge:
        tilt[1::2] = -tilt[0 : count - 1 : 2]
    norms = np.linalg.norm(tilt, axis=-1, keepdims=True)
    if np.any(norms <= 1e-12):
        raise ValueError("span must contain a direction orthogonal to `direction`")
    tilt /= norms
    phi_mu = np.arccos(1.0 - mu)
    phi = np.full(count, phi_mu) if edge else rng.uniform(0.0, phi_mu, count)
    starts = radius * d_norm * (np.cos(phi)[:, None] * unit + np.sin(phi)[:, None] * tilt)
    return starts.reshape((count,) + d.shape)


def selection_table(prob: TokenSelectionProblem, reports, dims: int = 2) -> str:
    """Markdown table of every selection of a one-input problem: its key, score, SVM and neighbours.

    One row per :class:`~attnlib.svm.SelectionReport` (e.g. from
    :func:`~attnlib.svm.enumerate_selections`): token (numbered from 1, as in [MMTS]), its feature
    ``A_1t`` (first ``dims`` coordinates: the key plane of the paper's figures), its score
    ``γ_1t``, the SVM ``θ_mm(α)`` (or "infeasible"), its SVM-neighbours with their scores, and
    whether the selection is locally optimal.

    >>> import attnlib as al
    >>> prob = al.datasets.single_input(local=True)
    >>> print(al.selection_table(prob, al.enumerate_selections(prob)).splitlines()[3])
    | 2 | (1, 0) | 0.9 | (1.000, 0.000) | 3 (0) | **yes** |
    """
    if prob.n != 1:
        raise ValueError(f"selection_table lists the selections of one input, got n = {prob.n}")
    A = np.asarray(prob.A).reshape(prob.n, prob.T, -1)
    rows = [
        "| α (token) | key | score | $\\pmm(\\alpha)$ | SVM-neighbours (score) | locally optimal |",
        "|---|---|---|---|---|---|",
    ]
    for r in reports:
        t = int(r.select[0])
        key = "(" + ", ".join(f"{x:g}" for x in A[0, t, :dims]) + ")"
        score = f"{prob.gamma[0, t]:g}"
        if not r.feasible:
            rows.append(f"| {t + 1} | {key} | {score} | infeasible | – | no |")
            continue
        theta = np.asarray(r.solution.theta).ravel()[:dims]
        nbs = ", ".join(f"{j + 1} ({prob.gamma[0, j]:g})" for j in np.flatnonzero(r.solution.neighbors[0]))
        svm = "(" + ", ".join(f"{x:.3f}" for x in theta) + ")"
        rows.append(f"| {t + 1} | {key} | {score} | {svm} | {nbs} | {'**yes**' if r.locally_optimal else 'no'} |")
    return "\n".join(rows)
