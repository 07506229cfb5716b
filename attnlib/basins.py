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

__all__ = [
    "BasinMap",
    "basin_map",
    "classify_motion",
    "cone_starts",
    "selection_table",
    "key_plane_grid",
    "ngd_and_gd_basin_maps",
    "basin_table",
    "ConeRuns",
    "cone_runs",
    "SelectionAlignment",
    "selection_alignment",
    "ScoreBasinExplorer",
]

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


# --- Local convergence in practice: grids, batched maps, cone runs, the W version -------------------


def key_plane_grid(lo: float, hi: float, size: int, dim: int = 3) -> np.ndarray:
    """A ``size × size`` grid of initialisations in the key plane (the first two coordinates).

    Returns (size², dim), zero beyond the first two coordinates, ordered so that
    ``labels.reshape(size, size)[j, i]`` belongs to the start ``(x_i, y_j)`` (the layout that
    :func:`attnlib.plots.basin_image` draws), ``x = y = linspace(lo, hi, size)``.

    >>> import attnlib as al
    >>> al.key_plane_grid(0.0, 1.0, 2).tolist()
    [[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [1.0, 1.0, 0.0]]
    """
    if not (isinstance(size, (int, np.integer)) and size >= 2):
        raise ValueError(f"size must be an integer >= 2, got {size!r}")
    if not lo < hi:
        raise ValueError(f"lo must be below hi, got {lo} and {hi}")
    if dim < 2:
        raise ValueError(f"dim must be at least 2, got {dim}")
    axis = np.linspace(lo, hi, size)
    grid = np.zeros((size * size, dim))
    grid[:, 0], grid[:, 1] = (c.ravel() for c in np.meshgrid(axis, axis))
    return grid


def ngd_and_gd_basin_maps(
    prob: TokenSelectionProblem,
    theta0,
    candidates,
    tol: float,
    ngd_steps: int,
    ngd_lr: float,
    gd_steps: int,
    gd_lr: float,
    extend_steps: int = 0,
) -> dict:
    """The NGD basin map and the GD basin map (with an NGD read-out) of the same starts, in shared batches.

    Equal to ``basin_map(prob, theta0, ngd_steps, "ngd", ngd_lr, candidates, tol, extend_steps=...)``
    and ``basin_map(prob, theta0, gd_steps, "gd", gd_lr, candidates, tol, readout_steps=ngd_steps,
    readout_lr=ngd_lr, extend_steps=...)``, but the NGD map and the GD read-out are one NGD batch
    (2B trajectories), and the two extensions one more: two Python loops instead of four.

    Returns ``{"ngd": BasinMap, "gd": BasinMap}``.

    >>> import attnlib as al
    >>> prob = al.datasets.single_input(local=True)
    >>> maps = al.ngd_and_gd_basin_maps(prob, al.datasets.SINGLE_INPUT_INITS, al.locally_optimal_selections(prob),
    ...                                 1e-3, 400, 0.5, 60, 1.0)
    >>> maps["ngd"].kind().tolist(), maps["gd"].kind().tolist()
    ([0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 1, 1])
    """
    candidates = tuple(candidates)
    if not candidates or not all(isinstance(c, SelectionReport) and c.feasible for c in candidates):
        raise ValueError("candidates must be a non-empty list of feasible SelectionReports")
    check_schedule(ngd_steps, ngd_lr, 1)
    check_schedule(gd_steps, gd_lr, 1)
    theta0 = np.asarray(theta0, float)
    B = theta0.shape[0]
    after_gd = train(prob, theta0, gd_steps, "gd", gd_lr, record_every=max(gd_steps, 1)).final
    a, b = _two_states(prob, np.concatenate([theta0, after_gd]), ngd_steps, "ngd", ngd_lr)
    labels, mcos = classify_motion(prob, a, b, candidates, tol)
    extended = np.zeros(2 * B, bool)
    final = b.copy()
    undecided = np.flatnonzero(labels < 0)
    if extend_steps > 0 and undecided.size:
        a2, b2 = _two_states(prob, b[undecided], extend_steps, "ngd", ngd_lr)
        labels[undecided], mcos[undecided] = classify_motion(prob, a2, b2, candidates, tol)
        final[undecided] = b2
        extended[undecided] = True
    pcos = np.stack([cosine(final, c.solution.theta) for c in candidates], axis=-1)
    is_global = np.array([np.array_equal(c.select, prob.opt) for c in candidates])
    maps = {}
    for name, part, steps, readout in (
        ("ngd", slice(0, B), ngd_steps, 0),
        ("gd", slice(B, 2 * B), gd_steps, ngd_steps),
    ):
        maps[name] = BasinMap(
            labels=labels[part],
            candidates=candidates,
            is_global=is_global,
            final=final[part],
            motion_cosine=mcos[part],
            position_cosine=pcos[part],
            extended=extended[part],
            steps=int(steps),
            readout_steps=int(readout),
            extend_steps=int(extend_steps),
            tol=float(tol),
        )
    return maps


def basin_table(maps: dict) -> str:
    """Markdown table of basin maps ``{name: BasinMap}``: fractions and undecided counts per map.

    Columns: the fraction of starts heading to the global and to the local direction(s), the
    number undecided at the first horizon (then extended) and after the extension.

    >>> import attnlib as al
    >>> prob = al.datasets.single_input(local=True)
    >>> m = al.basin_map(prob, al.datasets.SINGLE_INPUT_INITS, steps=400, lr=0.5)
    >>> al.basin_table({"ngd": m}).splitlines()[2]
    '| NGD | 0.6667 | 0.3333 | 0 | 0 |'
    """
    lines = [
        "| optimizer | global | local | undecided at the first horizon | undecided after extension |",
        "|---|---|---|---|---|",
    ]
    for name, m in maps.items():
        f = m.fractions()
        first, after = int(m.extended.sum()), int((m.labels < 0).sum())
        lines.append(f"| {name.upper()} | {f['global']:.4f} | {f['local']:.4f} | {first} | {after} |")
    return "\n".join(lines)


@dataclass(frozen=True, eq=False)
class ConeRuns:
    """Trajectories started in the cones of the local theorem, one cone per selection, NGD and GD.

    Attributes:
        owner: (B,) the key of the cone each start is in (as in ``directions``).
        directions: ``{key: θ_mm(α)}`` the cones' axes.
        steps: (R,) recorded steps (log-spaced, with the half-way step ``half``).
        ngd, gd: the two :class:`~attnlib.optim.Trajectory` (same starts).
        omc: (R, B) NGD ``1 − cos(θ(t), θ_mm(α))`` against the run's own cone axis.
        offset: (R, B) NGD distance from the line of its cone's axis (:func:`~attnlib.metrics.orthogonal_offset`).
        start_offset: (B,) the cone's own offset at the start, ``‖θ(0)‖ sin φ_μ`` (``cos φ_μ = 1 − μ``).
        half: index into ``steps`` of the half-way step.
        mu, radius: the cone's width and norm (in units of ``‖θ_mm(α)‖``).
    """

    owner: np.ndarray
    directions: dict
    steps: np.ndarray
    ngd: object
    gd: object
    omc: np.ndarray
    offset: np.ndarray
    start_offset: np.ndarray
    half: int
    mu: float
    radius: float


def cone_runs(
    prob: TokenSelectionProblem,
    directions: dict,
    count: int,
    *,
    mu: float,
    radius: float,
    steps: int,
    ngd_lr: float,
    gd_lr: float,
    rng=None,
    span=None,
    records: int = 60,
) -> ConeRuns:
    """Train ``count`` starts per cone (:func:`cone_starts`, two on the edges) with NGD and with GD.

    Args:
        directions: ``{key: θ_mm(α)}``, one cone per entry (e.g. by token).
        count: starts per cone (≥ 3): two on its edges, the others inside.
        mu, radius, rng, span: as in :func:`cone_starts`.  steps: horizon of both optimizers.
        ngd_lr, gd_lr: their step sizes.  records: about this many log-spaced recorded steps.

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.single_input(local=True)
    >>> r = {x.select[0] + 1: x.solution.theta for x in al.enumerate_selections(prob) if x.locally_optimal}
    >>> runs = al.cone_runs(prob, r, 3, mu=1e-3, radius=20, steps=100, ngd_lr=0.1, gd_lr=1.0, rng=0,
    ...                     span=np.eye(3)[:2])
    >>> runs.omc.shape, bool(runs.omc.max() <= 1e-3 + 1e-12)
    ((41, 6), True)
    """
    from .metrics import one_minus_cosine, orthogonal_offset

    if count < 3:
        raise ValueError(f"count must be at least 3 (two edge starts and one inside), got {count}")
    rng = np.random.default_rng(rng)
    kw = dict(mu=mu, radius=radius, rng=rng, span=span)
    starts = []
    for d in directions.values():
        starts += [cone_starts(d, 2, edge=True, **kw), cone_starts(d, count - 2, **kw)]
    keys = list(directions)
    owner = np.repeat(keys, count)
    half = steps // 2
    record = np.unique(np.r_[0, np.geomspace(1, steps, records).astype(int), half])
    theta0 = np.concatenate(starts)
    ngd = train(prob, theta0, steps, "ngd", ngd_lr, record_steps=record)
    gd = train(prob, theta0, steps, "gd", gd_lr, record_steps=record)
    R, B = ngd.theta.shape[:2]
    omc, offset = np.empty((R, B)), np.empty((R, B))
    for key in keys:
        mine = owner == key
        omc[:, mine] = one_minus_cosine(ngd.theta[:, mine], directions[key])
        offset[:, mine] = orthogonal_offset(ngd.theta[:, mine], directions[key])
    start_offset = np.linalg.norm(theta0.reshape(B, -1), axis=-1) * np.sin(np.arccos(1 - mu))
    return ConeRuns(
        owner=owner,
        directions=dict(directions),
        steps=record,
        ngd=ngd,
        gd=gd,
        omc=omc,
        offset=offset,
        start_offset=start_offset,
        half=int(np.flatnonzero(record == half)[0]),
        mu=float(mu),
        radius=float(radius),
    )


@dataclass(frozen=True, eq=False)
class SelectionAlignment:
    """How ``θ(t)`` of a batch of problems lines up with the SVM of the tokens it selects ([TFSVM]).

    Attributes (S problems, R recorded steps):
        alpha_hat: (S, n) the final selection (argmax of each input's attention).
        is_opt: (S,) ``α̂`` is the optimal selection.
        corr: ``{"alpha_hat": (R, S), "opt": (R, S)}`` ``cos(θ(t), θ_mm(·))``; NaN where that SVM is
            infeasible.
        mass: (R, S) mean attention on ``α̂`` over the inputs.
        svm_norm: (S,) ``‖θ_mm(α̂)‖`` (NaN if infeasible).
        offset: (S,) final distance from the line of ``θ_mm(α̂)``, in units of ``‖θ_mm(α̂)‖``.
    """

    alpha_hat: np.ndarray
    is_opt: np.ndarray
    corr: dict
    mass: np.ndarray
    svm_norm: np.ndarray
    offset: np.ndarray

    def infeasible(self) -> int:
        """Number of infeasible SVMs met (of ``α̂`` and of the optimal selection, over problems)."""
        return int(np.isnan(self.corr["opt"][-1]).sum() + np.isnan(self.corr["alpha_hat"][-1]).sum())


def selection_alignment(problems, traj) -> SelectionAlignment:
    """Compare each problem's trajectory with the SVM of its final selection and of the optimal one.

    Args:
        problems: S :class:`~attnlib.model.TokenSelectionProblem` (e.g. one per seed).
        traj: a :class:`~attnlib.optim.Trajectory` of ``train(stack_problems(problems), ...)``, theta
            (R, S, *shape).

    One SVM per distinct selection (``α̂ = opt`` solves once); an infeasible SVM gives NaN.

    >>> import numpy as np, attnlib as al
    >>> probs = [al.datasets.random_tokens(3, 4, 5, seed=s, queries="cross") for s in range(2)]
    >>> traj = al.train(al.stack_problems(probs), np.zeros((5, 5)), 300, "ngd", 0.1, record_every=100)
    >>> al.selection_alignment(probs, traj).corr["alpha_hat"].shape
    (4, 2)
    """
    from .metrics import orthogonal_offset, selection_mass
    from .svm import InfeasibleError, max_margin

    R, S = traj.theta.shape[:2]
    if len(problems) != S:
        raise ValueError(f"got {len(problems)} problems for a trajectory of {S}")
    alpha_hat = np.array([p.selection(w) for p, w in zip(problems, traj.final)])
    is_opt = np.array([np.array_equal(a, p.opt) for a, p in zip(alpha_hat, problems)])
    corr = {key: np.full((R, S), np.nan) for key in ("opt", "alpha_hat")}
    mass = np.empty((R, S))
    svm_norm, offset = np.full(S, np.nan), np.full(S, np.nan)
    for j, (p, a) in enumerate(zip(problems, alpha_hat)):
        mass[:, j] = selection_mass(p, traj.theta[:, j], a).mean(axis=-1)
        svm = {}
        for key, sel in (("opt", p.opt), ("alpha_hat", a)):
            if tuple(sel) not in svm:
                try:
                    svm[tuple(sel)] = max_margin(p, sel).theta
                except InfeasibleError:
                    svm[tuple(sel)] = None
            if svm[tuple(sel)] is not None:
                corr[key][:, j] = cosine(traj.theta[:, j], svm[tuple(sel)])
        if svm[tuple(a)] is not None:
            svm_norm[j] = np.linalg.norm(svm[tuple(a)])
            offset[j] = orthogonal_offset(traj.final[j], svm[tuple(a)]) / svm_norm[j]
    return SelectionAlignment(alpha_hat, is_opt, corr, mass, svm_norm, offset)


class ScoreBasinExplorer:
    """The explorer of [MMTS] Fig. 1's basins as the third token's score varies, with one NGD path.

    ``draw(score, start, lr, steps)`` returns a figure (for :func:`attnlib.book.widgets.explorer`):
    the basin map of ``datasets.single_input(third_score=score)`` over a ``size × size`` key-plane
    grid (:func:`basin_map`, NGD, ``map_steps`` at ``map_lr``, tolerance ``tol``), and the NGD path
    from ``start`` (``steps`` at ``lr``). Maps and paths are cached; :meth:`precompute` computes the
    maps of several scores and their paths from one start in few batches (the static book's slider).

    Args:
        lo, hi, size: the grid (:func:`key_plane_grid`).  map_steps, map_lr, tol: the maps' optimizer.
        shared: ``{score: BasinMap}`` already computed (NGD, the same ``map_steps``, ``map_lr``,
            ``tol``) on a finer grid of the same ``lo, hi``. When its size ``G`` has
            ``(G − 1) % (size − 1) == 0`` the sub-grid is used (labels before any extension: what
            :func:`basin_map` gives without one) instead of computing again; otherwise it is ignored.

    >>> import attnlib as al
    >>> ex = al.ScoreBasinExplorer(-4.0, 8.0, 5, map_steps=40, map_lr=0.5)
    >>> ex.precompute([0.9, 0.0], (6.0, -3.0), 0.1, 50)
    >>> sorted(ex.maps), ex.paths[(0.0, (6.0, -3.0), 0.1, 50)].shape
    ([0.0, 0.9], (51, 2))
    """

    def __init__(self, lo, hi, size, map_steps, map_lr, tol=MOTION_TOL, shared=None):
        self.lo, self.hi, self.size = float(lo), float(hi), int(size)
        self.map_steps, self.map_lr, self.tol = int(map_steps), float(map_lr), float(tol)
        self.grid = key_plane_grid(lo, hi, size)
        self.maps = {}  # score -> (size, size) kind
        self.fractions = {}  # score -> fraction of starts in the local basin(s)
        self.paths = {}  # (score, start, lr, steps) -> (steps + 1, 2)
        self._fig = None
        for score, m in (shared or {}).items():
            G = int(round(np.sqrt(m.labels.size)))
            if G * G != m.labels.size or (G - 1) % (self.size - 1):
                continue  # no sub-grid of this size: computed when needed
            k = (G - 1) // (self.size - 1)
            kind = np.where(m.extended, -1, m.kind()).reshape(G, G)[::k, ::k]  # before the extension
            self.maps[float(score)] = kind
            self.fractions[float(score)] = float(np.mean(kind == 1))

    @staticmethod
    def problem(score):
        from .datasets import single_input

        return single_input(third_score=float(score))

    def _map(self, score):
        s = float(score)
        if s not in self.maps:
            m = basin_map(self.problem(s), self.grid, self.map_steps, "ngd", self.map_lr, tol=self.tol)
            self.maps[s] = m.kind().reshape(self.size, self.size)
            self.fractions[s] = m.fractions()["local"]
        return self.maps[s]

    def precompute(self, scores, start, lr, steps):
        """Compute the maps of ``scores`` and their paths from ``start``: all paths as one stacked batch."""
        from .model import stack_problems

        scores, start = [float(s) for s in scores], tuple(float(x) for x in start)
        for s in scores:
            self._map(s)
        todo = [s for s in scores if (s, start, float(lr), int(steps)) not in self.paths]
        if todo:
            theta0 = np.array([start[0], start[1], 0.0])
            traj = train(stack_problems([self.problem(s) for s in todo]), theta0, int(steps), "ngd", lr)
            for j, s in enumerate(todo):
                self.paths[(s, start, float(lr), int(steps))] = traj.theta[:, j, :2]

    def draw(self, score, start=(6.0, -3.0), lr=0.1, steps=1000):
        """One explorer picture (the figure is reused from call to call)."""
        import matplotlib.pyplot as plt

        from .plots import basin_explorer_frame

        s, start = float(score), tuple(float(x) for x in start)
        kind = self._map(s)
        key = (s, start, float(lr), int(steps))
        if key not in self.paths:
            self.precompute([s], start, lr, steps)
        if self._fig is None:
            self._fig = plt.figure(figsize=(4.6, 4.2))
            self._fig.add_subplot()
        ax = self._fig.axes[0]
        for artist in [*ax.images, *ax.collections, *ax.lines, *ax.texts]:
            artist.remove()  # keep the axes and their ticks: clearing them costs more than the picture
        if ax.get_legend() is not None:
            ax.get_legend().remove()
        title = f"score of (0,0): {s:.2f}  local {self.fractions[s]:.2f}"
        basin_explorer_frame(ax, kind, (self.lo, self.hi), self.problem(s), self.paths[key], title)
        return self._fig
