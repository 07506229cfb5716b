"""GD, normalised GD and the Polyak step over a batch of initialisations ([MMTS], [FAST]).

.. math::

    \\text{GD: } θ ← θ − η∇L, \\qquad \\text{NGD: } θ ← θ − η\\frac{∇L}{‖∇L‖}, \\qquad
    \\text{Polyak: } θ ← θ − η\\frac{L − L^*}{‖∇L‖^2}∇L .

The theorems of [MMTS] are for GD with a small step; its figures use NGD (η = 0.1); [FAST]
studies NGD and Polyak. All B trajectories step together in one set of array operations.

No ``+eps`` in the NGD denominator: the gradient is carried as ``exp(log_scale) · g`` with ``g``
of order one, so its direction is exact at any ‖θ‖ and ‖θ‖ keeps growing. A
trajectory stops, with its step and reason recorded, when a value turns non-finite, the
gradient is exactly zero, or the Polyak step explodes because ``L*`` is out of reach (a run
heading to a local selection); the others go on.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import numpy as np

from .model import (
    AttentionProblem,
    JointAttention,
    JointProblem,
    ProblemStack,
    Terms,
    TokenSelectionProblem,
    stack_problems,
)

__all__ = [
    "Stop",
    "BatchRecord",
    "Trajectory",
    "JointTrajectory",
    "StepRule",
    "GradientDescent",
    "NormalizedGradientDescent",
    "PolyakStep",
    "step_rule",
    "train",
    "train_joint",
    "train_joint_problem",
    "METHODS",
    "log_steps",
    "train_many",
    "MirrorDescent",
    "SignDescent",
    "CoordinateDescent",
    "SpectralDescent",
    "Adam",
    "GEOMETRY_METHODS",
    "RuleBlocks",
    "mirror_map",
    "inverse_mirror_map",
    "dual_exponent",
]

METHODS = ("gd", "ngd", "polyak")


@dataclass(frozen=True)
class Stop:
    """Why and when a trajectory stopped moving."""

    step: int
    reason: str


@dataclass(frozen=True, eq=False, kw_only=True)
class BatchRecord:
    """What a trainer records of B trajectories at R steps, whatever the parameters are.

    Attributes (keyword-only):
        steps: (R,) recorded step numbers (0 first, the last step always).
        loss: (R, B) ``L``.
        log_gap: (R, B) ``log(L − L*)`` (accurate where the gap underflows).
        log_grad_norm: (R, B) ``log ‖∇L‖``.
        stopped: B entries, ``None`` or :class:`Stop` (a stopped trajectory keeps its last state).
        method, lr: the optimizer (``lr`` a number, or (B,) one step size per trajectory).

    Subclasses add the parameters, each an array (R, B, ...): :class:`Trajectory` (θ) and
    :class:`attnlib.FactorTrajectory` (K, Q).
    """

    steps: np.ndarray
    loss: np.ndarray
    log_gap: np.ndarray
    log_grad_norm: np.ndarray
    stopped: tuple
    method: str
    lr: float | np.ndarray

    @property
    def gap(self) -> np.ndarray:
        """``L − L*``: (R, B)."""
        return np.exp(self.log_gap)

    def select(self, members):
        """The trajectories ``members`` (an index, a slice or a list) as a record of their own.

        Every array field of shape (R, B, ...) is cut along its batch axis, and so are ``stopped``
        and a per-trajectory ``lr``.

        >>> import numpy as np, attnlib as al
        >>> traj = al.train(al.datasets.single_input(), np.zeros((4, 3)), steps=3)
        >>> traj.select([1, 3]).theta.shape, traj.select(2).theta.shape
        ((4, 2, 3), (4, 1, 3))
        """
        index = np.atleast_1d(np.arange(len(self.stopped))[members])
        cut = {
            f.name: getattr(self, f.name)[:, index]
            for f in fields(self)
            if isinstance(getattr(self, f.name), np.ndarray) and getattr(self, f.name).ndim >= 2
        }
        cut["stopped"] = tuple(self.stopped[b] for b in index)
        if np.ndim(self.lr):
            cut["lr"] = self.lr[index]
        return replace(self, **cut)


@dataclass(frozen=True, eq=False)
class Trajectory(BatchRecord):
    """Recorded states of B trajectories of θ (a :class:`BatchRecord`).

    Attributes:
        theta: (R, B, *shape) parameters at the recorded steps.
        seconds: (R,) wall-clock time since the start at each recorded step (shared by the batch).
        steps, loss, log_gap, log_grad_norm, stopped, method, lr: as in :class:`BatchRecord`.
    """

    theta: np.ndarray
    seconds: np.ndarray | None = None

    @property
    def final(self) -> np.ndarray:
        """Last recorded parameters: (B, *shape)."""
        return self.theta[-1]

    @property
    def norm(self) -> np.ndarray:
        """``‖θ‖`` (Frobenius): (R, B)."""
        R, B = self.theta.shape[:2]
        return np.linalg.norm(self.theta.reshape(R, B, -1), axis=-1)


# ---------------------------------------------------------------------- step-size and stop rules


def _joint_move(g, log_scale, g_norm, method, lr):
    """The move ``η g/‖g‖`` (NGD) or ``η∇`` (GD) for a gradient given as ``exp(log_scale)·g``."""
    safe = np.where(g_norm > 0, g_norm, 1.0)
    length = lr * (np.ones_like(g_norm) if method == "ngd" else np.exp(log_scale) * g_norm)
    return np.where(g_norm > 0, length, 0.0)[:, None] * g / safe[:, None]


class StepRule:
    """How a method sizes its step, and when it stops a trajectory for good.

    :func:`train` moves each active trajectory by :meth:`lengths` along ``−∇L/‖∇L‖`` and stops
    the ones :meth:`stops` names; :func:`train_joint_problem` asks :meth:`joint_moves` for the
    moves of ``(p, v)``. Both trainers also stop a trajectory on a non-finite value or an exactly
    zero gradient, whatever the rule. One rule per method: :class:`GradientDescent`,
    :class:`NormalizedGradientDescent`, :class:`PolyakStep`; :func:`step_rule` maps a method name
    to its rule.
    """

    #: the method's name (``Trajectory.method``).
    name = ""
    #: whether the rule computes the new parameters itself (:meth:`update`) instead of a length
    #: along ``−∇L/‖∇L‖``: the mirror, steepest-descent and Adam rules at the end of this module.
    moves_itself = False
    #: whether the rule needs the loss (``log(L − L*)`` for :meth:`lengths`, ``L`` for
    #: :meth:`joint_moves`) at every step, not only at the recorded ones.
    needs_loss = False

    def lengths(self, lrs: np.ndarray, log_grad_norm: np.ndarray, log_gap: np.ndarray | None = None) -> np.ndarray:
        """Step lengths (B,) from step sizes ``lrs`` (B,), ``log ‖∇L‖`` (B,) and, if
        :attr:`needs_loss`, ``log(L − L*)`` (B,)."""
        raise NotImplementedError

    def stops(self, prob: AttentionProblem, terms: Terms, flat, lengths, active) -> dict[int, str]:
        """Trajectories to stop before this step, ``{member: reason}`` (none by default).

        Args: ``flat`` (B, size) parameters, ``lengths`` (B,) from :meth:`lengths`, ``active`` (B,).
        """
        return {}

    def init_state(self, flat: np.ndarray, shape: tuple[int, ...]):
        """Per-trajectory state of a rule that :attr:`moves_itself` (e.g. Adam's moments); None by default."""
        return None

    def update(self, flat, log_scale, g, lrs, state, shape):
        """New parameters (B, size) from ``flat`` (B, size) and the gradient ``∇L = exp(log_scale)·g``
        (``log_scale`` (B,), ``g`` (B, size) of order one), step sizes ``lrs`` (B,) and ``state``
        (updated in place); ``shape`` is the parameter shape. Only for rules that :attr:`moves_itself`.
        """
        raise NotImplementedError

    def joint_moves(self, lr: float, loss, grad_p, grad_v, active):
        """Moves of a joint step and the trajectories to stop.

        Args: ``lr``; ``loss`` (B,) (``None`` unless :attr:`needs_loss`); ``grad_p`` and ``grad_v``
        each ``(m (B,), g (B, dim), ‖g‖ (B,))`` with ``∇ = exp(m) g``; ``active`` (B,).
        Returns ``(move_p (B, d_k), move_v (B, d), stops)`` with ``stops`` a list of
        ``(mask (B,), reason)`` applied in order (a later mask only matters on members still active).
        """
        (m_p, g_p, n_p), (m_v, g_v, n_v) = grad_p, grad_v
        return _joint_move(g_p, m_p, n_p, self.name, lr), _joint_move(g_v, m_v, n_v, self.name, lr), []


class GradientDescent(StepRule):
    """GD: ``θ ← θ − η∇L``, a step of length ``η‖∇L‖``; ``(p, v) ← (p, v) − η∇`` jointly."""

    name = "gd"

    def lengths(self, lrs, log_grad_norm, log_gap=None):
        return lrs * np.exp(log_grad_norm)


class NormalizedGradientDescent(StepRule):
    """NGD: ``θ ← θ − η ∇L/‖∇L‖``, a step of length ``η``.

    Jointly, each block is normalised by its own norm (two moves of length η per step), as the
    official code of [MMTS] does.
    """

    name = "ngd"

    def lengths(self, lrs, log_grad_norm, log_gap=None):
        return lrs


@dataclass(frozen=True)
class PolyakStep(StepRule):
    """The Polyak step ``θ ← θ − η (L − L*)/‖∇L‖² ∇L``, a step of length ``η (L − L*)/‖∇L‖``.

    Stop rule (:meth:`stops`): a trajectory whose step is longer than ``max_step · (1 + ‖θ‖)``
    *while* the attention of some sample is saturated (mass > 1/2) on a non-optimal token: then
    ``L − L*`` stays away from 0 while ``∇L → 0``, the floor ``L*`` is out of reach and the step
    would explode. A long step elsewhere (e.g. the first one, from θ = 0) is the Polyak step
    doing its job.

    Jointly (:meth:`joint_moves`), the floor is 0 (the infimum once the head is trained):
    ``(p, v) ← (p, v) − η L/‖∇L‖² ∇L`` with ``‖∇L‖² = ‖∇_p L‖² + ‖∇_v L‖²``; a trajectory stops
    when ``L`` underflows to 0 or the step is not finite.
    """

    max_step: float = 10.0
    name = "polyak"
    needs_loss = True

    def lengths(self, lrs, log_grad_norm, log_gap=None):
        return lrs * np.exp(log_gap - log_grad_norm)

    def stops(self, prob, terms, flat, lengths, active):
        too_long = active & (lengths > self.max_step * (1.0 + np.linalg.norm(flat, axis=-1)))
        if not np.any(too_long):
            return {}
        sel = np.argmax(terms.log_sigma, axis=-1)
        saturated_off = (sel != np.broadcast_to(prob.opt, sel.shape)) & (terms.log_sigma.max(axis=-1) > -np.log(2))
        return {
            int(b): (
                f"polyak step exploded: samples {np.flatnonzero(saturated_off[b]).tolist()} are saturated on a "
                "non-optimal token, so L − L* does not vanish and L* is out of reach"
            )
            for b in np.flatnonzero(too_long & saturated_off.any(axis=-1))
        }

    def joint_moves(self, lr, loss, grad_p, grad_v, active):
        (m_p, g_p, n_p), (m_v, g_v, n_v) = grad_p, grad_v
        under = active & (loss <= 0)
        active = active & ~under
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            # ∇ = (e^{m_p} g_p, e^{m_v} g_v); step η L/‖∇‖² ∇, computed relative to the larger scale.
            top = np.maximum(m_p, m_v)
            a_p, a_v = np.exp(m_p - top) * n_p, np.exp(m_v - top) * n_v
            coef = lr * loss * np.exp(-top) / (a_p**2 + a_v**2)
            move_p = (coef * np.exp(m_p - top))[:, None] * g_p
            move_v = (coef * np.exp(m_v - top))[:, None] * g_v
        ok = active & np.all(np.isfinite(move_p), -1) & np.all(np.isfinite(move_v), -1)
        return move_p, move_v, [(under, "loss underflowed to 0"), (active & ~ok, "non-finite Polyak step")]


def step_rule(method, polyak_max_step: float = 10.0) -> StepRule:
    """The :class:`StepRule` of a method name ("gd", "ngd", "polyak"), or ``method`` if it is one.

    >>> step_rule("polyak", polyak_max_step=5.0)
    PolyakStep(max_step=5.0)
    """
    if isinstance(method, StepRule):
        return method
    if method in GEOMETRY_METHODS:  # the optimizer-geometry rules, with their default parameters
        return GEOMETRY_METHODS[method]()
    if method not in METHODS:
        raise ValueError(f"method must be one of {list(METHODS) + list(GEOMETRY_METHODS)}, got {method!r}")
    if method == "polyak":
        return PolyakStep(polyak_max_step)
    return GradientDescent() if method == "gd" else NormalizedGradientDescent()


def check_schedule(steps, lr, record_every) -> None:
    """Raise a ValueError unless ``steps`` ≥ 0 and ``record_every`` ≥ 1 are integers and ``lr`` > 0 is finite."""
    if not isinstance(steps, (int, np.integer)) or steps < 0:
        raise ValueError(f"steps must be a non-negative integer, got {steps!r}")
    if not np.isscalar(lr) or not np.isfinite(lr) or lr <= 0:
        raise ValueError(f"lr must be a positive finite number, got {lr!r}")
    if not isinstance(record_every, (int, np.integer)) or record_every < 1:
        raise ValueError(f"record_every must be a positive integer, got {record_every!r}")


def _record_steps(steps: int, record_every: int) -> np.ndarray:
    rec = np.arange(0, steps + 1, record_every)
    return rec if rec[-1] == steps else np.append(rec, steps)


def record_schedule(steps: int, record_every: int = 1, record_steps=None) -> np.ndarray:
    """The steps a trainer records: every ``record_every`` (and the last), or ``record_steps``
    (increasing integers within ``[0, steps]``), validated. The trainers share it.

    >>> record_schedule(10, 4).tolist(), record_schedule(10, record_steps=[0, 3, 9]).tolist()
    ([0, 4, 8, 10], [0, 3, 9])
    """
    if record_steps is None:
        check_schedule(steps, 1.0, record_every)
        return _record_steps(steps, record_every)
    return _explicit_record(record_steps, steps)


def _step_sizes(lr, B: int) -> np.ndarray:
    """``lr`` as (B,) positive step sizes: one number for all, or one per trajectory."""
    try:
        lrs = np.broadcast_to(np.asarray(lr, float), (B,)).copy()
    except ValueError:
        lrs = None
    if lrs is None or not np.all(np.isfinite(lrs) & (lrs > 0)):
        raise ValueError(f"lr must be a positive finite number or {B} of them (one per trajectory), got {lr!r}")
    return lrs


def _explicit_record(record_steps, steps: int) -> np.ndarray:
    record = np.asarray(record_steps)
    if (
        record.ndim != 1
        or record.size == 0
        or not np.issubdtype(record.dtype, np.integer)
        or np.any(np.diff(record) <= 0)
        or record[0] < 0
        or record[-1] > steps
    ):
        raise ValueError(f"record_steps must be increasing integer steps within [0, {steps}], got {record_steps!r}")
    return record


def _progress(total: int, show: bool | None, work: float, desc: str):
    if show is None:
        show = work > 3e9  # a few seconds of numpy work
    if not show:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, leave=False)


def train(
    prob: AttentionProblem,
    theta0,
    steps: int,
    method: str = "ngd",
    lr=0.1,
    record_every: int = 1,
    polyak_max_step: float = 10.0,
    progress: bool | None = None,
    record_steps=None,
) -> Trajectory:
    """Run ``steps`` iterations of GD, NGD or Polyak from every initialisation in ``theta0``.

    Args:
        prob: the problem (any :class:`attnlib.AttentionProblem`), or a :class:`ProblemStack` of
            S problems (one trajectory each).
        theta0: (*shape) for one trajectory or (B, *shape) for a batch; for a stack (S, *shape),
            or (*shape) to start every problem there.
        steps: number of iterations.
        method: "gd", "ngd" or "polyak" (``lr`` multiplies the Polyak step; 1 is the classical one),
            or a :class:`StepRule`.
        lr: step size η, or (B,) one per trajectory (a grid of step sizes is one batch too).
        record_every: record every this many steps (and the last step).
        polyak_max_step: the ``max_step`` of the Polyak rule's stop (:class:`PolyakStep`): stop a
            Polyak trajectory when its step is longer than ``polyak_max_step · (1 + ‖θ‖)`` *while*
            the attention of some sample is saturated (mass > 1/2) on a non-optimal token.
        progress: show a progress bar (``None``: only for long runs; pass False in a book page).
        record_steps: explicit increasing steps to record (e.g. log-spaced), instead of
            ``record_every``.

    >>> import numpy as np, attnlib as al
    >>> X = np.array([[[-0.1, 1.0, 1.0], [1.0, 0.0, 0.9], [0.0, 0.0, 0.9]]])
    >>> prob = al.prompt_attention(X, [1], v=[0, 0, 1], W=np.diag([1.0, 1.0, 0.0]))
    >>> traj = al.train(prob, np.zeros((4, 3)), steps=100, method="ngd", lr=0.1)
    >>> traj.theta.shape, bool(np.allclose(traj.norm[-1], 10.0, atol=0.5))
    ((101, 4, 3), True)
    """
    rule = step_rule(method, polyak_max_step)
    check_schedule(steps, 1.0, record_every)
    theta = np.array(theta0, dtype=float)
    stacked = isinstance(prob, ProblemStack)
    if theta.shape == prob.shape:  # one initialisation (shared by every problem of a stack)
        theta = np.repeat(theta[None], prob.S if stacked else 1, axis=0)
    expected = (
        f"(S={prob.S}, {', '.join(map(str, prob.shape))})" if stacked else f"(B, {', '.join(map(str, prob.shape))})"
    )
    if theta.ndim != len(prob.shape) + 1 or theta.shape[1:] != prob.shape or (stacked and len(theta) != prob.S):
        raise ValueError(f"theta0 must have shape {prob.shape} or {expected}, got {theta.shape}")
    if not np.all(np.isfinite(theta)):
        raise ValueError("theta0 must be finite")
    B, size = theta.shape[0], prob.size
    lrs = _step_sizes(lr, B)
    flat = theta.reshape(B, size).copy()
    record = record_schedule(steps, record_every, record_steps)
    R = len(record)
    out_seconds = np.empty(R)
    out_theta = np.empty((R, B, size))
    out_loss = np.empty((R, B))
    out_log_gap = np.empty((R, B))
    out_log_gn = np.empty((R, B))
    stop_step = np.full(B, -1)
    stop_reason = np.full(B, "", dtype=object)
    active = np.ones(B, bool)
    state = rule.init_state(flat, prob.shape) if rule.moves_itself else None
    bar = _progress(steps, progress, float(steps) * B * prob.n * prob.T * size * 4, f"{rule.name} B={B}")
    start = time.perf_counter()
    r = 0
    # Overflow and log(0) are detected below and stop the run (or are meant: −inf log-norms);
    # one errstate for the whole loop rather than several per step.
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for k in range(record[-1] + 1):
            terms = prob.terms_from_flat(flat)
            log_scale, g = prob.scaled_grad_from(terms)
            g_norm = np.sqrt((g * g).sum(axis=-1))  # = np.linalg.norm(g, axis=-1); g is of order one
            log_gn = log_scale + np.log(g_norm)
            if k == record[r]:
                out_theta[r] = flat
                out_loss[r] = np.mean(prob.loss.value(terms.output), axis=-1)
                out_log_gap[r] = prob.log_gap_from(terms)
                out_log_gn[r] = log_gn
                out_seconds[r] = time.perf_counter() - start
                r += 1
            if k == record[-1]:
                break
            bad = active & ~(np.isfinite(flat).all(axis=-1) & np.isfinite(g_norm) & ~np.isnan(log_scale))
            zero = active & ~bad & ((g_norm == 0) | (log_scale == -np.inf))
            if bad.any() or zero.any():
                for mask, why in ((bad, "non-finite value"), (zero, "gradient is exactly zero")):
                    stop_step[mask], stop_reason[mask] = k, why
                    active &= ~mask
            if rule.moves_itself:  # mirror / steepest / Adam steps (the last section of this module)
                moved = rule.update(flat, log_scale, g, lrs, state, prob.shape)
                flat[active] = moved[active]
                if bar is not None:
                    bar.update(1)
                continue
            unit = g / np.where(g_norm > 0, g_norm, 1.0)[:, None]
            length = rule.lengths(lrs, log_gn, prob.log_gap_from(terms) if rule.needs_loss else None)
            for b, why in rule.stops(prob, terms, flat, length, active).items():
                stop_step[b], stop_reason[b], active[b] = k, why, False
            if active.all():
                flat -= length[:, None] * unit
            else:
                flat[active] -= length[active, None] * unit[active]
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    stopped = tuple(None if s < 0 else Stop(int(s), str(w)) for s, w in zip(stop_step, stop_reason))
    return Trajectory(
        theta=out_theta.reshape((R, B) + prob.shape),
        steps=record,
        loss=out_loss,
        log_gap=out_log_gap,
        log_grad_norm=out_log_gn,
        stopped=stopped,
        method=rule.name,
        lr=float(lrs[0]) if np.ndim(lr) == 0 else lrs,
        seconds=out_seconds,
    )


@dataclass(frozen=True, eq=False)
class JointTrajectory:
    """Recorded states of B joint (p, v) trajectories.

    Attributes: ``p`` (R, B, d_k), ``v`` (R, B, d), ``steps`` (R,), ``loss`` (R, B),
    ``stopped`` (B entries, ``None`` or :class:`Stop`), ``method``, ``lr``, ``problem`` (the
    :class:`JointAttention` trained).
    """

    p: np.ndarray
    v: np.ndarray
    steps: np.ndarray
    loss: np.ndarray
    stopped: tuple
    method: str
    lr: float
    problem: JointAttention


def _batch(name: str, value, dim: int) -> np.ndarray:
    arr = np.array(value, dtype=float)
    if arr.shape == (dim,):
        arr = arr[None]
    if arr.ndim != 2 or arr.shape[1] != dim:
        raise ValueError(f"{name} must have shape ({dim},) or (B, {dim}), got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite")
    return arr


def train_joint(
    X,
    y,
    p0,
    v0,
    steps: int,
    W=None,
    loss: str = "logistic",
    method: str = "ngd",
    lr: float = 0.1,
    record_every: int = 1,
    progress: bool | None = None,
) -> JointTrajectory:
    """Train the attention ``p`` and the head ``v`` together ([MMTS]).

    NGD normalises each gradient by its own norm (two unit-length moves per step), as the
    official code does; "gd" takes plain steps ``η∇``.

    Args:
        X: (n, T, d) tokens.  y: (n,) labels ±1.  p0: (d_k,) or (B, d_k).  v0: (d,) or (B, d).
        steps, lr, record_every, progress: as in :func:`train`.  W: (d_k, d) keys (identity).
        loss: "logistic" (the paper's), "exponential" or "linear".  method: "gd" or "ngd".

    >>> import numpy as np, attnlib as al
    >>> X = np.array([[[0, 0], [1, 1]], [[0, 0], [1, -1]], [[0, 0], [0.5, 1]]], float)
    >>> traj = al.train_joint(X, [1, -1, 1], p0=[0, -1], v0=[-1, 0], steps=50)
    >>> traj.p.shape, traj.v.shape
    ((51, 1, 2), (51, 1, 2))
    """
    if method not in ("gd", "ngd"):
        raise ValueError(f"method must be 'gd' or 'ngd' for joint training, got {method!r}")
    check_schedule(steps, lr, record_every)
    X = np.asarray(X, float)
    if X.ndim != 3:
        raise ValueError(f"X must be a 3-D array (n, T, d), got shape {X.shape}")
    joint = JointAttention(X, np.asarray(y, float), np.eye(X.shape[2]) if W is None else W, loss)
    p = _batch("p0", p0, joint.W.shape[0])
    v = _batch("v0", v0, X.shape[2])
    if p.shape[0] != v.shape[0]:
        raise ValueError(f"p0 and v0 must hold the same number of initialisations, got {p.shape[0]} and {v.shape[0]}")
    return train_joint_problem(joint, p, v, steps, method=method, lr=lr, record_every=record_every, progress=progress)


def train_joint_problem(
    joint: JointProblem,
    p0,
    v0,
    steps: int,
    method: str = "ngd",
    lr: float = 0.1,
    record_every: int = 1,
    progress: bool | None = None,
    record_steps=None,
) -> JointTrajectory:
    """Train the logit parameter ``p`` and the head ``v`` of any :class:`JointAttention` together.

    :func:`train_joint` builds the prompt-attention problem and calls this; a
    :class:`attnlib.DecoderAttention` (self-attention with a trainable decoder, ``p = vec W``)
    is trained the same way. "ngd" normalises each block's gradient by its own norm (two moves of
    length η per step), "gd" takes ``η∇``, "polyak" takes the Polyak step on the joint gradient
    with the floor 0 (the infimum of the loss once the head is trained):
    ``(p, v) ← (p, v) − η L/‖∇L‖² ∇L``, ``‖∇L‖² = ‖∇_p L‖² + ‖∇_v L‖²``. A Polyak run stops,
    with its reason recorded, when ``L`` underflows to 0.

    Args:
        joint: the problem (any :class:`attnlib.JointProblem`).  p0: (d_k,) or (B, d_k).
            v0: (d,) or (B, d).
        method: "gd", "ngd", "polyak" or a :class:`StepRule` (its :meth:`StepRule.joint_moves`).
        steps, lr, record_every, progress: as in :func:`train`; ``record_steps`` explicit
            increasing steps to record (e.g. log-spaced), instead of ``record_every``.
    """
    rule = step_rule(method)
    check_schedule(steps, lr, record_every)
    p = _batch("p0", p0, joint.keys.shape[-1])
    v = _batch("v0", v0, joint.X.shape[-1])
    if p.shape[0] != v.shape[0]:
        raise ValueError(f"p0 and v0 must hold the same number of initialisations, got {p.shape[0]} and {v.shape[0]}")
    B = p.shape[0]
    record = record_schedule(steps, record_every, record_steps)
    R = len(record)
    out_p, out_v, out_loss = np.empty((R, B, p.shape[1])), np.empty((R, B, v.shape[1])), np.empty((R, B))
    stop_step = np.full(B, -1)
    stop_reason = np.full(B, "", dtype=object)
    active = np.ones(B, bool)
    # work per step: B trajectories × (n, T, d_k) keys each (a stack's keys hold one set per row)
    work = float(steps) * B * math.prod(joint.keys.shape[-3:]) * 8
    bar = _progress(steps, progress, work, f"joint {rule.name} B={B}")
    r = 0
    for k in range(record[-1] + 1):
        loss = joint.value(p, v) if (rule.needs_loss or k == record[r]) else None
        if k == record[r]:
            out_p[r], out_v[r], out_loss[r] = p, v, loss
            r += 1
        if k == record[-1]:
            break
        with np.errstate(over="ignore", invalid="ignore"):
            (m_p, g_p), (m_v, g_v) = joint.scaled_grad(p, v)
        n_p, n_v = np.linalg.norm(g_p, axis=-1), np.linalg.norm(g_v, axis=-1)
        finite = np.isfinite(n_p) & np.isfinite(n_v) & np.all(np.isfinite(p), -1) & np.all(np.isfinite(v), -1)
        bad = active & ~finite
        if bad.any():
            stop_step[bad], stop_reason[bad] = k, "non-finite value"
            active &= ~bad
        move_p, move_v, stops = rule.joint_moves(lr, loss, (m_p, g_p, n_p), (m_v, g_v, n_v), active)
        for mask, why in stops:
            mask = active & mask
            if mask.any():
                stop_step[mask], stop_reason[mask] = k, why
                active &= ~mask
        if active.all():
            p -= move_p
            v -= move_v
        else:
            p[active] -= move_p[active]
            v[active] -= move_v[active]
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    stopped = tuple(None if s < 0 else Stop(int(s), str(w)) for s, w in zip(stop_step, stop_reason))
    return JointTrajectory(out_p, out_v, record, out_loss, stopped, rule.name, float(lr), joint)


# ---------------------------------------------------------------------- many problems
def log_steps(steps: int, per_decade: int = 16) -> np.ndarray:
    """Recording steps ``0, 1, 2, …, steps``, about ``per_decade`` per decade (log axes)."""
    if not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    if not isinstance(per_decade, (int, np.integer)) or per_decade < 1:
        raise ValueError(f"per_decade must be a positive integer, got {per_decade!r}")
    grid = np.unique(np.round(np.logspace(0, np.log10(steps), int(per_decade * np.log10(steps)) + 2)))
    return np.unique(np.concatenate([[0], grid.astype(int), [steps]]))


def train_many(
    problems: Sequence[TokenSelectionProblem],
    steps: int,
    method: str = "ngd",
    lr=0.1,
    record=None,
    theta0=None,
    polyak_max_step: float = 10.0,
) -> Trajectory:
    """One trajectory of GD, NGD or Polyak on each of S problems, all stepped together.

    :func:`attnlib.train` on :func:`attnlib.stack_problems` ``(problems)``, with these
    defaults: every problem starts at zero and the steps are recorded on a log grid.

    Args:
        problems: S problems of equal ``n``, ``T``, parameter shape and loss (e.g. one per seed;
            :func:`reduce_to_span` with a common ``size`` makes problems of any ``d`` stackable).
        steps: iterations.  method: "gd", "ngd" or "polyak".
        lr: a step size, or (S,) one per problem (a grid of step sizes is one batch too).
        record: the steps to record (increasing, within ``[0, steps]``); default :func:`log_steps`.
        theta0: (S, *shape) initialisations; default zeros.

    Returns a :class:`attnlib.Trajectory` with ``theta`` (R, S, *shape) and wall-clock ``seconds``.

    >>> import numpy as np, attnlib as al
    >>> probs = [al.datasets.single_input(), al.datasets.single_input(local=True)]
    >>> traj = al.train_many(probs, steps=100, method="ngd", lr=0.1)
    >>> traj.theta.shape[1:], bool(np.allclose(traj.norm[-1], 10.0, atol=0.5))
    ((2, 3), True)
    """
    stack = stack_problems(problems)
    if record is None:
        record = log_steps(steps) if isinstance(steps, (int, np.integer)) and steps >= 1 else np.array([0])
    return train(
        stack,
        np.zeros(stack.shape) if theta0 is None else theta0,
        steps,
        method,
        lr,
        polyak_max_step=polyak_max_step,
        progress=False,
        record_steps=record,
    )


# ---------------------------------------------------------------------- optimizer geometry
# Step rules that compute the new parameters themselves (``StepRule.moves_itself``): mirror
# descent with the ℓp potential, normalised steepest descent for the ℓ∞, ℓ1 and spectral norms,
# and Adam. They run through :func:`train` like GD/NGD/Polyak (same gradient, stops and records).


def dual_exponent(p: float) -> float:
    """``q = p/(p − 1)``, the exponent of the dual norm of ℓp.

    >>> dual_exponent(3.0), dual_exponent(1.5)
    (1.5, 3.0)
    """
    return p / (p - 1.0)


def mirror_map(theta, p: float) -> np.ndarray:
    """``∇ψ(θ) = sign(θ)|θ|^{p−1}`` for the potential ``ψ(θ) = ‖θ‖_p^p / p`` (entrywise).

    >>> mirror_map(np.array([2.0, -3.0]), 3.0).tolist()
    [4.0, -9.0]
    """
    theta = np.asarray(theta, float)
    return np.sign(theta) * np.abs(theta) ** (p - 1.0)


def inverse_mirror_map(z, p: float) -> np.ndarray:
    """``(∇ψ)^{-1}(z) = sign(z)|z|^{1/(p−1)}``, the inverse of :func:`mirror_map`.

    >>> inverse_mirror_map(mirror_map(np.array([2.0, -3.0]), 3.0), 3.0).tolist()
    [2.0, -3.0]
    """
    z = np.asarray(z, float)
    return np.sign(z) * np.abs(z) ** (1.0 / (p - 1.0))


def _check_exponent(p) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)) or not 1.0 < p < np.inf:
        raise ValueError(f"p must be a real number in (1, inf), got {p!r}")
    return float(p)


def _scaled_norm(g: np.ndarray, q: float) -> np.ndarray:
    """``‖g‖_q`` (B,) of rows of order one (no overflow: ``g`` is the order-one part of ∇L)."""
    return np.sum(np.abs(g) ** q, axis=-1) ** (1.0 / q)


@dataclass(frozen=True)
class MirrorDescent(StepRule):
    """Mirror descent with the ℓp potential ``ψ(θ) = ‖θ‖_p^p / p`` ([MD-ATT] ℓp-AttGD):

    .. math::

        ∇ψ(θ^+) = ∇ψ(θ) − η ∇L(θ), \\qquad ∇ψ(θ) = \\operatorname{sign}(θ)|θ|^{p−1}.

    ``p = 2`` is GD. With ``normalized=True`` the dual step is ``η ∇L/‖∇L‖_q`` (``q = p/(p−1)``,
    the dual norm), the ℓp analogue of NGD (``p = 2``: NGD); the dual variable then grows like
    ``ηt``. The plain step uses the gradient's true scale ``exp(log_scale)·g`` (it underflows
    late, as it does for GD).

    >>> import numpy as np, attnlib as al
    >>> traj = train(al.datasets.single_input(), np.zeros(3), 50, method=MirrorDescent(p=3.0), lr=0.5)
    >>> traj.method, traj.theta.shape
    ('mirror', (51, 1, 3))
    """

    p: float = 3.0
    normalized: bool = False
    name = "mirror"
    moves_itself = True

    def __post_init__(self):
        _check_exponent(self.p)

    def update(self, flat, log_scale, g, lrs, state, shape):
        dual = mirror_map(flat, self.p)
        if self.normalized:
            size = _scaled_norm(g, dual_exponent(self.p))
            step = (lrs / np.where(size > 0, size, 1.0))[:, None] * g
        else:
            step = (lrs * np.exp(log_scale))[:, None] * g
        return inverse_mirror_map(dual - step, self.p)


class SignDescent(StepRule):
    """Normalised steepest descent for the ℓ∞ norm: ``θ ← θ − η sign(∇L)`` (sign descent).

    The move ``argmin_{‖Δ‖∞ ≤ η} ⟨∇L, Δ⟩``; scale-free, so the order-one ``g`` suffices.
    """

    name = "sign"
    moves_itself = True

    def update(self, flat, log_scale, g, lrs, state, shape):
        return flat - lrs[:, None] * np.sign(g)


class CoordinateDescent(StepRule):
    """Normalised steepest descent for the ℓ1 norm: ``θ ← θ − η sign(∂_j L) e_j``, ``j = argmax_j |∂_j L|``.

    The move ``argmin_{‖Δ‖₁ ≤ η} ⟨∇L, Δ⟩`` (greedy coordinate descent; ties go to the first coordinate).
    """

    name = "l1"
    moves_itself = True

    def update(self, flat, log_scale, g, lrs, state, shape):
        j = np.argmax(np.abs(g), axis=-1)
        rows = np.arange(len(flat))
        moved = flat.copy()
        moved[rows, j] -= lrs * np.sign(g[rows, j])
        return moved


@dataclass(frozen=True)
class SpectralDescent(StepRule):
    """Normalised steepest descent for the spectral norm on matrices: ``W ← W − η U Vᵀ``.

    ``∇L = U S Vᵀ`` (thin SVD); ``U Vᵀ`` (over the singular values above ``rank_tol · s_max``) is the
    polar factor, the move ``argmin_{‖Δ‖₂ ≤ η} ⟨∇L, Δ⟩`` of least Frobenius norm. Matrix parameters only.
    """

    rank_tol: float = 1e-10
    name = "spectral"
    moves_itself = True

    def init_state(self, flat, shape):
        if len(shape) != 2:
            raise ValueError(f"the spectral step needs a matrix parameter, got parameter shape {shape}")
        return None

    def update(self, flat, log_scale, g, lrs, state, shape):
        U, S, Vt = np.linalg.svd(g.reshape((len(g),) + tuple(shape)), full_matrices=False)
        keep = S > self.rank_tol * S[:, :1]
        polar = np.einsum("bik,bk,bkj->bij", U, keep.astype(float), Vt)
        return flat - lrs[:, None] * polar.reshape(len(g), -1)


@dataclass(frozen=True)
class Adam(StepRule):
    """Adam (Kingma & Ba) with bias correction: ``θ ← θ − η m̂/(√v̂ + ε)``.

    ``m ← β₁m + (1−β₁)∇L``, ``v ← β₂v + (1−β₂)∇L²``. The moments are stored relative to the current
    gradient scale ``exp(log_scale)`` (rescaled each step), so they neither underflow nor overflow
    when ``∇L`` does; ``eps`` is compared in the same units. ``eps = 0`` (the default) is the
    regime of the ℓ∞ implicit-bias results for Adam; a positive ``eps`` makes Adam GD-like once
    ``|∇L| ≪ eps``.
    """

    beta1: float = 0.9
    beta2: float = 0.99
    eps: float = 0.0
    name = "adam"
    moves_itself = True

    def init_state(self, flat, shape):
        B = len(flat)
        return {"m": np.zeros_like(flat), "v": np.zeros_like(flat), "scale": np.zeros(B), "t": 0}

    def update(self, flat, log_scale, g, lrs, state, shape):
        state["t"] += 1
        t = state["t"]
        first = t == 1
        # Moments in units of exp(log_scale): rescale the old ones to the new unit.
        shift = np.zeros_like(log_scale) if first else np.exp(np.clip(state["scale"] - log_scale, -700, 700))
        state["m"] = self.beta1 * shift[:, None] * state["m"] + (1 - self.beta1) * g
        state["v"] = self.beta2 * (shift**2)[:, None] * state["v"] + (1 - self.beta2) * g * g
        state["scale"] = np.where(np.isfinite(log_scale), log_scale, state["scale"])
        m_hat = state["m"] / (1 - self.beta1**t)
        v_hat = state["v"] / (1 - self.beta2**t)
        eps = self.eps * np.exp(-np.clip(log_scale, -700, 700))[:, None]
        with np.errstate(invalid="ignore", divide="ignore"):
            step = np.where(m_hat != 0, m_hat / (np.sqrt(v_hat) + eps), 0.0)
        return flat - lrs[:, None] * step


@dataclass(frozen=True)
class RuleBlocks(StepRule):
    """Several rules in one batch: trajectories ``[offset_k, offset_k + sizes[k])`` step by ``rules[k]``.

    One :func:`train` call then runs every optimizer together (the per-step cost of the gradient
    is shared). Each block is a rule that :attr:`~StepRule.moves_itself`, or GD/NGD (moved by their
    :meth:`~StepRule.lengths` along ``−∇L/‖∇L‖``); the Polyak step is not supported.

    >>> import numpy as np, attnlib as al
    >>> rule = RuleBlocks((step_rule("ngd"), SignDescent()), (2, 2))
    >>> traj = train(al.datasets.single_input(), np.zeros((4, 3)), 10, method=rule, lr=0.1)
    >>> bool(np.allclose(traj.theta[-1, 2:, :2], [[-1.0, 1.0], [-1.0, 1.0]]))
    True
    """

    rules: tuple
    sizes: tuple
    name = "blocks"
    moves_itself = True

    def __post_init__(self):
        if len(self.rules) != len(self.sizes) or not all(isinstance(r, StepRule) for r in self.rules):
            raise ValueError("rules must be StepRules, one per entry of sizes")
        if any(r.needs_loss for r in self.rules):
            raise ValueError("RuleBlocks does not support rules that need the loss (the Polyak step)")

    def _slices(self, B: int):
        ends = np.cumsum(self.sizes)
        if ends[-1] != B:
            raise ValueError(f"the blocks hold {int(ends[-1])} trajectories, the batch {B}")
        return [slice(int(e - n), int(e)) for e, n in zip(ends, self.sizes)]

    def init_state(self, flat, shape):
        return [
            r.init_state(flat[sl], shape) if r.moves_itself else None
            for r, sl in zip(self.rules, self._slices(len(flat)))
        ]

    def update(self, flat, log_scale, g, lrs, state, shape):
        moved = np.empty_like(flat)
        for rule, sl, sub in zip(self.rules, self._slices(len(flat)), state):
            if rule.moves_itself:
                moved[sl] = rule.update(flat[sl], log_scale[sl], g[sl], lrs[sl], sub, shape)
            else:
                g_norm = np.sqrt((g[sl] * g[sl]).sum(axis=-1))
                length = rule.lengths(lrs[sl], log_scale[sl] + np.log(g_norm))
                moved[sl] = flat[sl] - (length / np.where(g_norm > 0, g_norm, 1.0))[:, None] * g[sl]
        return moved


#: The optimizer-geometry rules by name, each with its default parameters (``step_rule`` maps them).
GEOMETRY_METHODS = {
    "mirror": MirrorDescent,
    "sign": SignDescent,
    "l1": CoordinateDescent,
    "spectral": SpectralDescent,
    "adam": Adam,
}
