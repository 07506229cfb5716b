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

Every trainer is here: :func:`train` (p or W, a batch of starts or a stack of problems),
:func:`train_joint` / :func:`train_joint_problem` / :func:`train_joint_stack` (the attention with
its head or its decoder, one problem or a stack), :func:`train_kq` (the
factorisation ``W = K Qᵀ``), :func:`train_many` and the batching planner :func:`train_problems`.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace

import numpy as np

from .model import (
    AttentionProblem,
    DecoderAttention,
    JointAttention,
    JointProblem,
    ProblemStack,
    StackedDecoderAttention,
    StackedJointAttention,
    Terms,
    TokenSelectionProblem,
    factor_grad,
    reduce_to_span,
    stack_problems,
    terms_and_scaled_grad,
    token_selection,
)

__all__ = [
    "METHODS",
    "Stop",
    "BatchRecord",
    "Trajectory",
    "StepRule",
    "GradientDescent",
    "NormalizedGradientDescent",
    "PolyakStep",
    "GDOrNGD",
    "step_rule",
    "check_schedule",
    "record_schedule",
    "train",
    "train_together",
    "JointTrajectory",
    "train_joint",
    "train_joint_problem",
    "log_steps",
    "train_many",
    "train_joint_stack",
    "minibatch_weights",
    "train_joint_methods",
    "truncate_joint",
    "NORMALIZATIONS",
    "FactorTrajectory",
    "kq_init",
    "train_kq",
    "ngd_cross_attention",
    "train_problems",
    "MirrorDescent",
    "SignDescent",
    "CoordinateDescent",
    "SpectralDescent",
    "Adam",
    "RuleBlocks",
    "GEOMETRY_METHODS",
    "mirror_map",
    "inverse_mirror_map",
    "dual_exponent",
    "PROCESSES_ENV",
    "default_processes",
    "run_independent",
]


METHODS = ("gd", "ngd", "polyak")

#: The environment variable that sets how many processes :func:`run_independent` may use by default
#: (the book's runner sets it to the cores per notebook it runs at once; unset: 1, everything serial).
PROCESSES_ENV = "ATTNLIB_PROCESSES"


def default_processes() -> int:
    """The processes :func:`run_independent` uses when not told: ``ATTNLIB_PROCESSES``, else 1.

    >>> import os
    >>> os.environ.pop("ATTNLIB_PROCESSES", None) and None
    >>> default_processes()
    1
    """
    raw = os.environ.get(PROCESSES_ENV, "").strip()
    if not raw:
        return 1
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"environment variable {PROCESSES_ENV} must be a positive integer, got {raw!r}")
    return int(raw)


_TASKS: Sequence[Callable] = ()  # what the forked workers of run_independent call, by index


def _call_task(index: int):
    return _TASKS[index]()


def run_independent(tasks: Sequence[Callable[[], object]], processes: int | None = None) -> list:
    """Call every task (no arguments) and return their results in order, in up to ``processes`` forked processes.

    For independent pieces of one experiment (one batch per method, per cell of a grid): a task
    computes exactly what it computes in this process, so the results are identical whatever
    ``processes`` is (single-threaded BLAS, as the book runs). Tasks may be closures: the workers
    are forked after the tasks are set, so only results are pickled. Put the longest task first.
    ``processes`` defaults to :func:`default_processes`; with 1, or one task, nothing is forked.

    >>> run_independent([lambda: 1 + 1, lambda: "two"], processes=2)
    [2, 'two']
    """
    global _TASKS
    processes = default_processes() if processes is None else int(processes)
    if processes < 1:
        raise ValueError(f"processes must be at least 1, got {processes}")
    if processes == 1 or len(tasks) < 2:
        return [task() for task in tasks]
    _TASKS = tuple(tasks)
    try:
        with multiprocessing.get_context("fork").Pool(min(processes, len(tasks))) as pool:
            return pool.map(_call_task, range(len(tasks)), chunksize=1)
    finally:
        _TASKS = ()


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
    :class:`attnlib.optim.FactorTrajectory` (K, Q).
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

    def records(self, steps):
        """The records at ``steps`` (increasing, each a recorded step) as a record of their own.

        Every array field of shape (R, ...) is cut along its record axis; a stop after the last of
        ``steps`` is not reported (the shorter record ends before it).

        >>> import numpy as np, attnlib as al
        >>> traj = al.train(al.datasets.single_input(), np.zeros((2, 3)), steps=10)
        >>> traj.records([0, 4, 8]).theta.shape, traj.records([0, 4, 8]).steps.tolist()
        ((3, 2, 3), [0, 4, 8])
        """
        steps = np.asarray(steps)
        rows = np.searchsorted(self.steps, steps)
        if steps.ndim != 1 or not steps.size or rows[-1] >= len(self.steps) or np.any(self.steps[rows] != steps):
            raise ValueError(f"steps must be recorded steps of this record (within {self.steps.tolist()[:3]}...)")
        names = [f.name for f in fields(self) if f.name != "lr" and isinstance(getattr(self, f.name), np.ndarray)]
        cut = {name: getattr(self, name)[rows] for name in names}
        cut["stopped"] = tuple(None if s is None or s.step > steps[-1] else s for s in self.stopped)
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


def _joint_move(g, log_scale, g_norm, method, lr):
    """The move ``η g/‖g‖`` (NGD) or ``η∇`` (GD) for a gradient given as ``exp(log_scale)·g``."""
    safe = np.where(g_norm > 0, g_norm, 1.0)
    length = lr * (np.ones_like(g_norm) if method == "ngd" else np.exp(log_scale) * g_norm)
    return np.where(g_norm > 0, length, 0.0)[:, None] * g / safe[:, None]


class StepRule:
    """How a method sizes its step, and when it stops a trajectory for good.

    :func:`train` moves each active trajectory by :meth:`move` (by default :meth:`lengths` along
    ``−∇L/‖∇L‖``) and stops the ones :meth:`stops` names; :func:`train_joint_problem` asks :meth:`joint_moves` for the
    moves of ``(p, v)``. Both trainers also stop a trajectory on a non-finite value or an exactly
    zero gradient, whatever the rule. One rule per method: :class:`GradientDescent`,
    :class:`NormalizedGradientDescent`, :class:`PolyakStep`; :func:`step_rule` maps a method name
    to its rule.
    """

    #: the method's name (``Trajectory.method``).
    name = ""
    #: whether the rule computes the new parameters itself (:meth:`update`, from θ, the gradient
    #: and per-trajectory state) instead of a :meth:`move`: the mirror, steepest-descent and Adam
    #: rules at the end of this module.
    moves_itself = False
    #: whether the rule needs the loss (``log(L − L*)`` for :meth:`lengths`, ``L`` for
    #: :meth:`joint_moves`) at every step, not only at the recorded ones.
    needs_loss = False

    def lengths(self, lrs: np.ndarray, log_grad_norm: np.ndarray, log_gap: np.ndarray | None = None) -> np.ndarray:
        """Step lengths (B,) from step sizes ``lrs`` (B,), ``log ‖∇L‖`` (B,) and, if
        :attr:`needs_loss`, ``log(L − L*)`` (B,)."""
        raise NotImplementedError

    def move(self, lrs: np.ndarray, log_grad_norm: np.ndarray, log_gap, g: np.ndarray, g_norm: np.ndarray):
        """The update of :func:`train`: ``(move (B, size), lengths (B,))``, ``θ ← θ − move``.

        The default moves :meth:`lengths` along the unit gradient ``g/‖g‖`` (``∇L = exp(m)·g``).
        A rule that chooses its own direction (a mirror map, the sign of the gradient, a
        preconditioner) overrides this and returns its full update with the length it reports
        to :meth:`stops`.
        """
        length = self.lengths(lrs, log_grad_norm, log_gap)
        # length · g/‖g‖ as g · (length/‖g‖): one pass over g instead of two (equal up to rounding)
        return g * (length / np.where(g_norm > 0, g_norm, 1.0))[:, None], length

    def init_state(self, flat: np.ndarray, shape: tuple[int, ...]):
        """Per-trajectory state of a rule that :attr:`moves_itself` (e.g. Adam's moments); None by default."""
        return None

    def update(self, flat, log_scale, g, lrs, state, shape):
        """New parameters (B, size) from ``flat`` (B, size) and the gradient ``∇L = exp(log_scale)·g``
        (``log_scale`` (B,), ``g`` (B, size) of order one), step sizes ``lrs`` (B,) and ``state``
        (updated in place); ``shape`` is the parameter shape. Only for rules that :attr:`moves_itself`.
        """
        raise NotImplementedError

    def stops(self, prob: AttentionProblem, terms: Terms, flat, lengths, active) -> dict[int, str]:
        """Trajectories to stop before this step, ``{member: reason}`` (none by default).

        Args: ``flat`` (B, size) parameters, ``lengths`` (B,) from :meth:`lengths`, ``active`` (B,).
        """
        return {}

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


@dataclass(frozen=True, eq=False)
class GDOrNGD(StepRule):
    """Plain GD on the trajectories ``gd`` marks ((B,) bool), NGD on the others: one batch of :func:`train`.

    Each trajectory takes the very step its own method takes (:meth:`GradientDescent.lengths` or
    :meth:`NormalizedGradientDescent.lengths` along the same unit gradient, picked elementwise), so
    its numbers are those of a run of that method alone (up to the last bit: numpy's vectorised
    exp, log and products can round differently with the batch size), and both methods share one loop.
    :func:`train_together` builds it.

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.single_input()
    >>> both = train(prob, np.zeros((2, 3)), 20, method=GDOrNGD(np.array([True, False])), lr=0.1)
    >>> alone = [train(prob, np.zeros(3), 20, method=m, lr=0.1).final[0] for m in ("gd", "ngd")]
    >>> bool(np.array_equal(both.final, np.stack(alone)))
    True
    """

    gd: np.ndarray
    name = "gd|ngd"

    def lengths(self, lrs, log_grad_norm, log_gap=None):
        if np.shape(self.gd) != np.shape(lrs):
            raise ValueError(f"gd must mark each of the {len(lrs)} trajectories, got shape {np.shape(self.gd)}")
        # Through the two rules' own methods (not their formulas inlined): a change to either rule,
        # such as a planted mutant of attnlib.book.mutants, reaches the batched runs too.
        gd = GradientDescent.lengths(self, lrs, log_grad_norm, log_gap)
        ngd = NormalizedGradientDescent.lengths(self, lrs, log_grad_norm, log_gap)
        return np.where(self.gd, gd, ngd)


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


class _Loop:
    """The bookkeeping every trainer shares: which trajectories are still active, when and why the
    others stopped. :func:`_descend` runs the loop around it."""

    def __init__(self, B: int):
        self.k = 0
        self.active = np.ones(B, bool)
        self._step = np.full(B, -1)
        self._reason = np.full(B, "", dtype=object)

    def stop(self, members, reason: str) -> None:
        """Stop the active ``members`` (a (B,) mask or one index) at the current step."""
        if np.ndim(members) == 0:
            index, members = members, np.zeros(len(self.active), bool)
            members[index] = True
        members = self.active & members
        if members.any():
            self._step[members], self._reason[members] = self.k, reason
            self.active &= ~members

    def stop_unusable(self, finite: np.ndarray, g_norm: np.ndarray, log_scale: np.ndarray) -> None:
        """Stop where a value is not finite, then where the gradient ``exp(log_scale)·g`` is exactly 0."""
        # The common case, every member usable, in one pass (this runs at every step of every trainer);
        # ``log_scale > -inf`` is False on NaN and on -inf, as the two tests below require.
        if (finite & np.isfinite(g_norm) & (g_norm != 0) & (log_scale > -np.inf)).all():
            return
        bad = self.active & ~(finite & np.isfinite(g_norm) & ~np.isnan(log_scale))
        zero = self.active & ~bad & ((g_norm == 0) | (log_scale == -np.inf))
        self.stop(bad, "non-finite value")
        self.stop(zero, "gradient is exactly zero")

    def stopped(self) -> tuple:
        return tuple(None if s < 0 else Stop(int(s), str(w)) for s, w in zip(self._step, self._reason))


def _all_finite(x: np.ndarray) -> bool:
    """``np.isfinite(x).all()``, in one pass and without a temporary where it holds: a finite sum
    means finite entries (an inf or NaN entry makes the sum inf or NaN); a sum that is not finite
    (also an overflow of finite entries) falls back to the entrywise test.

    >>> _all_finite(np.array([1e308, 1e308])), _all_finite(np.array([1.0, np.nan]))
    (True, False)
    """
    return bool(np.isfinite(x.sum())) or bool(np.isfinite(x).all())


def _descend(params, record: np.ndarray, observe, write, move, bar=None) -> tuple:
    """The one training loop behind :func:`train`, :func:`train_joint_problem` and :func:`train_kq`.

    At every step ``k ≤ record[-1]``: ``observe(recording)`` measures the current parameters;
    at a recorded step ``write(r, seen)`` stores the ``r``-th record; before the last step
    ``move(seen, loop)`` stops members through ``loop`` (a :class:`_Loop`) and returns one move per
    array of ``params``, which the active trajectories subtract (in place). Returns the
    trajectories' :class:`Stop` entries.
    """
    loop = _Loop(len(params[0]))
    r = 0
    for k in range(int(record[-1]) + 1):
        loop.k = k
        recording = k == record[r]
        seen = observe(recording)
        if recording:
            write(r, seen)
            r += 1
        if k == record[-1]:
            break
        moves = move(seen, loop)
        if loop.active.all():
            for x, m in zip(params, moves):
                x -= m
        else:
            active = loop.active
            for x, m in zip(params, moves):
                x[active] -= m[active]
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return loop.stopped()


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
    state = rule.init_state(flat, prob.shape) if rule.moves_itself else None
    bar = _progress(steps, progress, float(steps) * B * prob.n * prob.T * size * 4, f"{rule.name} B={B}")
    start = time.perf_counter()

    def observe(recording):
        # log δ (for log(L − L*)) only where it is read: the recorded steps and rules that need the loss
        terms, log_scale, g = terms_and_scaled_grad(prob, flat, log_delta=recording or rule.needs_loss)
        g_norm = np.sqrt((g * g).sum(axis=-1))  # = np.linalg.norm(g, axis=-1); g is of order one
        return terms, log_scale, g, g_norm, log_scale + np.log(g_norm)

    def write(r, seen):
        terms, _, _, _, log_gn = seen
        out_theta[r] = flat
        out_loss[r] = np.mean(prob.loss.value(terms.output), axis=-1)
        out_log_gap[r] = prob.log_gap_from(terms)
        out_log_gn[r] = log_gn
        out_seconds[r] = time.perf_counter() - start

    def move(seen, loop):
        terms, log_scale, g, g_norm, log_gn = seen
        # A finite log-norm means a finite log-scale and a finite, non-zero ‖g‖: with finite
        # parameters nothing is unusable, and the per-member tests (a dozen small calls) are skipped.
        if not (np.isfinite(log_gn).all() and _all_finite(flat)):
            loop.stop_unusable(np.isfinite(flat).all(axis=-1), g_norm, log_scale)
        if rule.moves_itself:  # mirror / steepest / Adam rules (the last section of this module)
            return (flat - rule.update(flat, log_scale, g, lrs, state, prob.shape),)
        step, length = rule.move(lrs, log_gn, prob.log_gap_from(terms) if rule.needs_loss else None, g, g_norm)
        for b, why in rule.stops(prob, terms, flat, length, loop.active).items():
            loop.stop(b, why)
        return (step,)

    # Overflow and log(0) are detected in move() and stop the run (or are meant: −inf log-norms);
    # one errstate for the whole loop rather than several per step.
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        stopped = _descend([flat], record, observe, write, move, bar)
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


def train_together(prob: AttentionProblem, runs: Sequence[tuple], progress: bool | None = False) -> list[Trajectory]:
    """Several GD and NGD runs on one problem as one batch of :func:`train`: one :class:`Trajectory` per run.

    ``runs``: ``(method, theta0, lr, record_steps)`` each, ``method`` "gd" or "ngd", ``theta0``
    (*shape) or (B_k, *shape), ``lr`` a step size or (B_k,), ``record_steps`` the increasing steps
    to record (the last is the run's horizon). The batch steps to the largest horizon and records
    the union of the steps; each run gets its own records back, with its own ``method`` and ``lr``,
    and its numbers are those of its own :func:`train` call up to rounding (:class:`GDOrNGD`): what is shared is
    the per-step cost of the loop, which dominates for small batches. A stop after a run's horizon
    is not reported for it (:meth:`BatchRecord.records`). Not for a :class:`ProblemStack` (one trajectory per problem).

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.single_input()
    >>> gd, ngd = train_together(prob, [("gd", np.zeros(3), 1.0, [0, 5, 10]), ("ngd", np.ones((2, 3)), 0.1, [0, 20])])
    >>> gd.theta.shape, ngd.theta.shape, ngd.method, float(gd.lr)
    ((3, 1, 3), (2, 2, 3), 'ngd', 1.0)
    >>> bool(np.array_equal(gd.final, train(prob, np.zeros(3), 10, method="gd", lr=1.0).final))
    True
    """
    if isinstance(prob, ProblemStack):
        raise ValueError("train_together trains one problem; for a stack of problems call train")
    if not runs:
        raise ValueError("runs must hold at least one (method, theta0, lr, record_steps)")
    starts, lrs, marks, records, sizes = [], [], [], [], []
    for method, theta0, lr, record_steps in runs:
        if method not in ("gd", "ngd"):
            raise ValueError(f"method must be 'gd' or 'ngd' in train_together, got {method!r}")
        theta = np.array(theta0, dtype=float)
        theta = theta[None] if theta.shape == tuple(prob.shape) else theta
        record = np.asarray(record_steps)
        records.append(_explicit_record(record, int(record[-1]) if record.size else 0))
        sizes.append(len(theta))
        starts.append(theta)
        lrs.append(_step_sizes(lr, len(theta)))
        marks.append(np.full(len(theta), method == "gd"))
    union = np.unique(np.concatenate(records))
    both = train(
        prob,
        np.concatenate(starts),
        int(union[-1]),
        method=GDOrNGD(np.concatenate(marks)),
        lr=np.concatenate(lrs),
        progress=progress,
        record_steps=union,
    )
    out, first = [], 0
    for (method, _, lr, _), record, size in zip(runs, records, sizes):
        run = both.select(slice(first, first + size)).records(record)
        out.append(replace(run, method=method, lr=run.lr if np.ndim(lr) else float(lr)))
        first += size
    return out


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
    :class:`attnlib.model.DecoderAttention` (self-attention with a trainable decoder, ``p = vec W``)
    is trained the same way. "ngd" normalises each block's gradient by its own norm (two moves of
    length η per step), "gd" takes ``η∇``, "polyak" takes the Polyak step on the joint gradient
    with the floor 0 (the infimum of the loss once the head is trained):
    ``(p, v) ← (p, v) − η L/‖∇L‖² ∇L``, ``‖∇L‖² = ‖∇_p L‖² + ‖∇_v L‖²``. A Polyak run stops,
    with its reason recorded, when ``L`` underflows to 0.

    Args:
        joint: the problem (any :class:`attnlib.model.JointProblem`).  p0: (d_k,) or (B, d_k).
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
    # work per step: B trajectories × (n, T, d_k) keys each (a stack's keys hold one set per row)
    work = float(steps) * B * math.prod(joint.keys.shape[-3:]) * 8
    bar = _progress(steps, progress, work, f"joint {rule.name} B={B}")

    def observe(recording):
        return joint.value(p, v) if (rule.needs_loss or recording) else None

    def write(r, loss):
        out_p[r], out_v[r], out_loss[r] = p, v, loss

    def move(loss, loop):
        with np.errstate(over="ignore", invalid="ignore"):
            (m_p, g_p), (m_v, g_v) = joint.scaled_grad(p, v)
        n_p, n_v = np.linalg.norm(g_p, axis=-1), np.linalg.norm(g_v, axis=-1)
        loop.stop(
            ~(np.isfinite(n_p) & np.isfinite(n_v) & np.all(np.isfinite(p), -1) & np.all(np.isfinite(v), -1)),
            "non-finite value",
        )
        move_p, move_v, stops = rule.joint_moves(lr, loss, (m_p, g_p, n_p), (m_v, g_v, n_v), loop.active)
        for mask, why in stops:
            loop.stop(mask, why)
        return move_p, move_v

    stopped = _descend([p, v], record, observe, write, move, bar)
    return JointTrajectory(out_p, out_v, record, out_loss, stopped, rule.name, float(lr), joint)


# ---------------------------------------------------------------------- mini-batches, mixed methods
def minibatch_weights(n: int, steps: int, batch_size: int | None, seed=0) -> np.ndarray:
    """The sample weights of ``steps`` mini-batch steps: (steps, n), ``1/b`` on the batch of each step.

    The samples are drawn without replacement within an epoch: each epoch is a fresh permutation of
    the ``n`` samples cut into consecutive batches of ``b`` (a batch that would straddle two epochs
    takes the rest of one and the start of the next), so every sample is used once per ``n/b`` steps.
    ``batch_size=None`` (or ``n``) gives the full batch, ``1/n`` everywhere: the loss ``L`` itself.

    >>> w = minibatch_weights(4, 3, 2, seed=0)
    >>> w.shape, w.sum(axis=1).tolist(), sorted(np.flatnonzero(w[0] + w[1]).tolist())
    ((3, 4), [1.0, 1.0, 1.0], [0, 1, 2, 3])
    """
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    check_schedule(steps, 1.0, 1)
    if batch_size is None:
        batch_size = n
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or not 1 <= batch_size <= n:
        raise ValueError(f"batch_size must be None or an integer in [1, {n}], got {batch_size!r}")
    weights = np.zeros((steps, n))
    if batch_size == n:
        weights[:] = 1.0 / n
        return weights
    rng = np.random.default_rng(seed)
    epochs = -(-steps * batch_size // n)
    stream = np.concatenate([rng.permutation(n) for _ in range(epochs)])[: steps * batch_size]
    weights[np.repeat(np.arange(steps), batch_size), stream] = 1.0 / batch_size
    return weights


def train_joint_methods(
    joint: JointProblem, p0, v0, steps: int, methods, lr, weights=None, record_steps=None
) -> JointTrajectory:
    """B joint ``(p, v)`` trajectories, each with its own method, step size and mini-batches, in one loop.

    Trajectory ``b`` takes the step of ``methods[b]`` ("gd", "ngd" or "polyak", as in
    :func:`train_joint_problem`: NGD normalises each block, Polyak uses the floor 0) on the loss
    of its batch at that step, ``L_k(p, v) = Σ_i c_{k,i} ℓ(u_i)`` with ``c = weights[k, b]``. With
    mini-batch weights (:func:`minibatch_weights`) these are [FAST]'s SGD, SNGD and SPS (the
    stochastic Polyak step with the floor 0 of each batch's loss); with full-batch weights
    ``1/n`` GD, NGD and Polyak. Every trajectory costs one gradient of all ``n`` samples per step
    (the batch only weights them), so methods compare at equal work per step; the recorded
    ``loss`` is the full training loss ``L``.

    Args:
        joint: the problem (any :class:`attnlib.model.JointProblem`, e.g. a stack of data sets).
        p0, v0: (B, d_k), (B, d) starts (or one start of each, shared).
        steps: iterations.  methods: B names.  lr: a step size or (B,) one per trajectory.
        weights: (steps, B, n) sample weights (``None``: full batch ``1/n``).
        record_steps: increasing steps to record (default every step).

    Returns a :class:`JointTrajectory` whose ``method`` joins the names with "|" and ``lr`` is (B,).

    >>> import numpy as np, attnlib as al
    >>> X = np.array([[[0, 0], [1, 1]], [[0, 0], [1, -1]], [[0, 0], [0.5, 1]]], float)
    >>> joint = al.JointAttention(X, np.array([1.0, -1, 1]), np.eye(2), "logistic")
    >>> both = train_joint_methods(joint, np.zeros((2, 2)), np.zeros((2, 2)), 20, ["ngd", "gd"], 0.1)
    >>> alone = train_joint_problem(joint, np.zeros(2), np.zeros(2), 20, method="gd", lr=0.1)
    >>> bool(np.allclose(both.p[-1, 1], alone.p[-1, 0]) and np.allclose(both.v[-1, 1], alone.v[-1, 0]))
    True
    """
    p = _batch("p0", p0, joint.keys.shape[-1]).copy()
    v = _batch("v0", v0, joint.X.shape[-1]).copy()
    if p.shape[0] != v.shape[0]:
        raise ValueError(f"p0 and v0 must hold the same number of starts, got {p.shape[0]} and {v.shape[0]}")
    B, n = p.shape[0], joint.X.shape[-3]
    methods = tuple(methods)
    if len(methods) != B or any(m not in METHODS for m in methods):
        raise ValueError(f"methods must name one of {list(METHODS)} for each of the {B} trajectories, got {methods!r}")
    lrs = _step_sizes(lr, B)
    check_schedule(steps, 1.0, 1)
    if weights is not None:
        weights = np.asarray(weights, float)
        if weights.shape != (steps, B, n) or not np.all(np.isfinite(weights) & (weights >= 0)):
            raise ValueError(f"weights must be non-negative, of shape ({steps}, {B}, {n}), got {np.shape(weights)}")
    record = record_schedule(steps, 1, record_steps)
    R = len(record)
    out_p, out_v, out_loss = np.empty((R, B, p.shape[1])), np.empty((R, B, v.shape[1])), np.empty((R, B))
    rules = {m: step_rule(m) for m in sorted(set(methods))}
    rows = {m: np.array([x == m for x in methods]) for m in rules}
    full = np.full((B, n), 1.0 / n)

    def observe(recording):
        return None

    def write(r, seen):
        out_p[r], out_v[r] = p, v
        out_loss[r] = np.mean(joint.loss.value(joint.output(p, v)), axis=-1)

    def move(seen, loop):
        c = full if weights is None else weights[loop.k]
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            ((m_p, g_p), (m_v, g_v)), u = joint.weighted_scaled_grad(p, v, None if weights is None else c)
        n_p, n_v = np.linalg.norm(g_p, axis=-1), np.linalg.norm(g_v, axis=-1)
        loop.stop(
            ~(np.isfinite(n_p) & np.isfinite(n_v) & np.all(np.isfinite(p), -1) & np.all(np.isfinite(v), -1)),
            "non-finite value",
        )
        batch_loss = np.sum(c * joint.loss.value(u), axis=-1)  # only the Polyak step reads it
        move_p, move_v = np.zeros_like(p), np.zeros_like(v)
        for name, rule in rules.items():
            mp, mv, stops = rule.joint_moves(
                lrs, batch_loss, (m_p, g_p, n_p), (m_v, g_v, n_v), loop.active & rows[name]
            )
            move_p[rows[name]], move_v[rows[name]] = mp[rows[name]], mv[rows[name]]
            for mask, why in stops:
                loop.stop(mask & rows[name], why)
        return move_p, move_v

    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        stopped = _descend([p, v], record, observe, write, move)
    return JointTrajectory(out_p, out_v, record, out_loss, stopped, "|".join(methods), lrs, joint)


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


def train_joint_stack(problems, p0, v0, steps: int, **options) -> list:
    """:func:`train_joint_problem` on several joint problems as one batch, one trajectory each.

    Args:
        problems: a non-empty sequence of S :class:`JointAttention` of one kind: prompt attention
            (one ``X.shape`` (n, T, d), one ``W``, one loss; e.g. ``JointAttention(X, y, W, loss)``
            per data set) or :class:`DecoderAttention` (self-attention with a trainable decoder: one
            ``X.shape``, one ``Z.shape``, one loss; :func:`attnlib.model.joint_self_attention`).
        p0: (d_k,), (B, d_k) (the same starts for every problem) or (S, B, d_k) (one batch per
            problem); ``v0`` likewise with ``d``.
        options: ``method``, ``lr``, ``record_every``, ``record_steps``, ``progress`` of
            :func:`train_joint_problem`, which takes the one batched step (on a
            :class:`StackedJointAttention` or a :class:`StackedDecoderAttention`).

    Returns a list of :class:`JointTrajectory`, one per problem (``p`` (R, B, d_k), ``v`` (R, B, d),
    ``problem`` the problem passed): the same as S separate :func:`train_joint_problem` calls, with
    one Python loop over the iterations.

    >>> import numpy as np, attnlib as al
    >>> sets = [al.datasets.joint_tokens(relaxed=r) for r in (False, True)]
    >>> problems = [al.JointAttention(X, y, np.eye(2), "logistic") for X, y in sets]
    >>> trajs = train_joint_stack(problems, al.datasets.JOINT_P0, al.datasets.JOINT_V0, steps=50)
    >>> one = al.train_joint(*sets[1], al.datasets.JOINT_P0, al.datasets.JOINT_V0, steps=50)
    >>> len(trajs), bool(np.allclose(trajs[1].p, one.p, rtol=1e-12, atol=1e-12))
    (2, True)
    >>> Js = [al.model.joint_self_attention(D.X, D.y) for D in (al.datasets.planted_tokens(4, 5, 6, s) for s in (0, 1))]
    >>> trajs = train_joint_stack(Js, np.zeros(36), np.zeros(6), 50, method="ngd", lr=0.1)
    >>> one = train_joint_problem(Js[1], np.zeros(36), np.zeros(6), 50, method="ngd", lr=0.1)
    >>> trajs[1].problem is Js[1], bool(np.allclose(trajs[1].p, one.p, rtol=1e-12, atol=1e-12))
    (True, True)
    """
    problems = list(problems)
    if not problems or not all(isinstance(J, JointAttention) for J in problems):
        raise ValueError("problems must be a non-empty sequence of JointAttention (or DecoderAttention) problems")
    decoders = [isinstance(J, DecoderAttention) for J in problems]
    if any(decoders) and not all(decoders):
        raise ValueError("problems must be all prompt-attention JointAttention or all DecoderAttention, not a mix")
    first = problems[0]
    for s, J in enumerate(problems):
        if J.X.ndim != 3 or J.X.shape != first.X.shape:
            raise ValueError(
                f"problems must share X.shape (n, T, d): problem 0 has {first.X.shape}, problem {s} has {J.X.shape}"
            )
        if J.loss.name != first.loss.name:
            raise ValueError(
                f"problems must share one loss: problem 0 has {first.loss.name!r}, problem {s} has {J.loss.name!r}"
            )
        if decoders[0] and J.Z.shape != first.Z.shape:
            raise ValueError(
                f"problems must share Z.shape (n, d_z): problem 0 has {first.Z.shape}, problem {s} has {J.Z.shape}"
            )
        if not decoders[0] and not np.array_equal(J.W, first.W):
            raise ValueError(f"problems must share the key matrix W: problem {s} has another one than problem 0")
    X, y = np.stack([J.X for J in problems]), np.stack([J.y for J in problems])
    d = X.shape[-1]
    if decoders[0]:
        Z = np.stack([J.Z for J in problems])

        def stack(B):
            rep = [np.repeat(a, B, axis=0) for a in (X, y, Z)]
            return StackedDecoderAttention(rep[0], rep[1], np.eye(d), first.loss, rep[2])

        dims = (d * Z.shape[-1], d)
    else:

        def stack(B):
            return StackedJointAttention(np.repeat(X, B, axis=0), np.repeat(y, B, axis=0), first.W, first.loss)

        dims = (first.W.shape[0], d)
    return _train_joint_rows(len(problems), stack, dims, p0, v0, steps, lambda s, _: problems[s], **options)


def _train_joint_rows(S: int, stack, dims, p0, v0, steps: int, problem, **options) -> list:
    """Train ``S`` data sets as one batch and split the run into one trajectory per data set.

    ``stack(B)``: the stacked problem (a :class:`StackedJointAttention`) holding data set ``s`` in
    rows ``s·B … s·B + B − 1``; ``dims``: ``(d_k, d)`` of ``p`` and ``v``; ``p0``, ``v0`` as in
    :func:`train_joint_stack`;
    ``problem(s, rows)``: the unstacked problem of data set ``s``, recorded in its trajectory.
    """

    def per_set(name, value, dim):
        arr = np.asarray(value, float)
        arr = arr[None] if arr.ndim == 1 else arr
        arr = np.broadcast_to(arr, (S,) + arr.shape) if arr.ndim == 2 else arr
        if arr.ndim != 3 or arr.shape[0] != S or arr.shape[2] != dim:
            raise ValueError(f"{name} must have shape ({dim},), (B, {dim}) or ({S}, B, {dim}), got {np.shape(value)}")
        return arr

    P, V = per_set("p0", p0, dims[0]), per_set("v0", v0, dims[1])
    if P.shape[:2] != V.shape[:2]:
        raise ValueError(f"p0 and v0 must hold the same number of starts, got {P.shape[:2]} and {V.shape[:2]}")
    B = P.shape[1]
    rows = stack(B)
    traj = train_joint_problem(rows, P.reshape(S * B, -1), V.reshape(S * B, -1), steps, **options)
    out = []
    for s in range(S):
        cut = slice(s * B, (s + 1) * B)
        out.append(
            JointTrajectory(
                traj.p[:, cut],
                traj.v[:, cut],
                traj.steps,
                traj.loss[:, cut],
                traj.stopped[cut],
                traj.method,
                traj.lr,
                problem(s, rows),
            )
        )
    return out


def truncate_joint(traj, steps: int):
    """The records of a :class:`attnlib.optim.JointTrajectory` up to iteration ``steps`` (a view)."""
    keep = np.asarray(traj.steps) <= steps
    return replace(traj, p=traj.p[keep], v=traj.v[keep], steps=traj.steps[keep], loss=traj.loss[keep])


NORMALIZATIONS = ("joint", "separate")


@dataclass(frozen=True, eq=False)
class FactorTrajectory(BatchRecord):
    """Recorded states of B trajectories of ``(K, Q)`` (a :class:`attnlib.optim.BatchRecord`).

    Attributes:
        K: (R, B, d, m) and Q: (R, B, d_z, m) at the recorded steps.
        normalize: how NGD normalised the factors.  seconds: (R,) wall-clock since the start.
        steps, loss, log_gap, log_grad_norm, stopped, method, lr: as in
        :class:`attnlib.optim.BatchRecord`, with ``log_grad_norm`` ``log ‖(∇_K L, ∇_Q L)‖`` and the
        loss at ``W = K Qᵀ``.
    """

    K: np.ndarray
    Q: np.ndarray
    normalize: str
    seconds: np.ndarray

    @property
    def W(self) -> np.ndarray:
        """The product ``W = K Qᵀ`` at every recorded step: (R, B, d, d_z)."""
        return self.K @ np.swapaxes(self.Q, -1, -2)

    @property
    def final(self) -> np.ndarray:
        """Last recorded product ``K Qᵀ``: (B, d, d_z)."""
        return self.K[-1] @ np.swapaxes(self.Q[-1], -1, -2)

    @property
    def norm(self) -> np.ndarray:
        """``‖K Qᵀ‖_F``: (R, B)."""
        return np.linalg.norm(self.W, axis=(-2, -1))


def kq_init(B: int, d: int, d_z: int, m: int | None = None, seed=0) -> tuple[np.ndarray, np.ndarray]:
    """Random factors as torch's ``nn.Linear`` draws them (the official [TFSVM] code's start).

    Entries uniform in ``±1/√d``. Returns ``K0`` (B, d, m) and ``Q0`` (B, d_z, m), ``m = d`` by default.

    >>> K0, Q0 = kq_init(3, 4, 4, m=2, seed=0)
    >>> K0.shape, Q0.shape, bool(np.abs(K0).max() <= 0.5)
    ((3, 4, 2), (3, 4, 2), True)
    """
    m = d if m is None else m
    if min(B, d, d_z, m) < 1:
        raise ValueError(f"B, d, d_z and m must be positive, got {(B, d, d_z, m)}")
    rng = np.random.default_rng(seed)
    bound = 1.0 / np.sqrt(d)
    return rng.uniform(-bound, bound, size=(B, d, m)), rng.uniform(-bound, bound, size=(B, d_z, m))


def _factor_batch(prob, K0, Q0):
    """Validate ``K0``, ``Q0`` against the problem; return (B, d, m), (B, d_z, m) copies."""
    if len(prob.shape) != 2:
        raise ValueError(f"train_kq needs a matrix parameter W (self-attention), got parameter shape {prob.shape}")
    d, d_z = prob.shape
    K, Q = np.array(K0, dtype=float), np.array(Q0, dtype=float)
    stacked = isinstance(prob, ProblemStack)
    if K.ndim == 2 and Q.ndim == 2:
        K, Q = K[None], Q[None]
        if stacked:
            K, Q = np.repeat(K, prob.S, 0), np.repeat(Q, prob.S, 0)
    if K.ndim != 3 or Q.ndim != 3 or K.shape[0] != Q.shape[0] or K.shape[1] != d or Q.shape[1] != d_z:
        raise ValueError(f"K0 must have shape ([B,] {d}, m) and Q0 ([B,] {d_z}, m), got {K.shape} and {Q.shape}")
    if K.shape[2] != Q.shape[2]:
        raise ValueError(f"K0 and Q0 must share the width m, got {K.shape[2]} and {Q.shape[2]}")
    if stacked and K.shape[0] != prob.S:
        raise ValueError(f"a stack of {prob.S} problems needs {prob.S} initialisations, got {K.shape[0]}")
    if not (np.all(np.isfinite(K)) and np.all(np.isfinite(Q))):
        raise ValueError("K0 and Q0 must be finite")
    return K, Q


def train_kq(
    prob: TokenSelectionProblem | ProblemStack,
    K0,
    Q0,
    steps: int,
    method: str = "ngd",
    lr: float = 0.1,
    normalize: str = "joint",
    record_every: int = 1,
    record_steps=None,
) -> FactorTrajectory:
    """GD, NGD or Polyak on the factors ``(K, Q)`` of ``W = K Qᵀ`` (self-attention, [TFSVM]).

    The gradient in ``W`` comes from the problem's public ``scaled_grad`` (``∇_W L = exp(s)·g``,
    exact at saturation) and goes through :func:`attnlib.model.factor_grad`. Moves:

    - ``"gd"``: ``(K, Q) ← (K, Q) − η (∇_K L, ∇_Q L)``;
    - ``"ngd"``: ``normalize="joint"`` divides by ``‖(∇_K L, ∇_Q L)‖``; ``"separate"`` normalises
      each factor by its own gradient norm, as the official [TFSVM] code does;
    - ``"polyak"``: ``η (L − L*)/‖∇_{K,Q} L‖²`` times the gradient (``L*`` the loss floor).

    A trajectory stops (reason recorded) when a value turns non-finite or the gradient is exactly 0.

    Args:
        prob: a self-attention problem (parameter (d, d_z)), or a stack of S of them (one trajectory each).
        K0: (d, m) or (B, d, m) (B = S for a stack).  Q0: (d_z, m) or (B, d_z, m).  ``m < d`` caps the rank.
        steps, lr, record_every, record_steps: as in :func:`attnlib.train`.

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.random_tokens(4, 5, 6, seed=0, queries="cross")
    >>> K0, Q0 = kq_init(2, 6, 6, m=3, seed=1)
    >>> traj = train_kq(prob, K0, Q0, steps=20)
    >>> traj.W.shape, int(np.linalg.matrix_rank(traj.final[0]))
    ((21, 2, 6, 6), 3)
    """
    rule = step_rule(method)
    if normalize not in NORMALIZATIONS:
        raise ValueError(f"normalize must be one of {list(NORMALIZATIONS)}, got {normalize!r}")
    check_schedule(steps, lr, 1)
    K, Q = _factor_batch(prob, K0, Q0)
    B = K.shape[0]
    record = record_schedule(steps, record_every, record_steps)
    R = len(record)
    out_K, out_Q = np.empty((R,) + K.shape), np.empty((R,) + Q.shape)
    out_loss, out_gap, out_gn, out_sec = np.empty((R, B)), np.empty((R, B)), np.empty((R, B)), np.empty(R)
    start = time.perf_counter()

    def step_per_norm(lr, norm):  # lr/‖g‖ (0 where g = 0) as a (B, 1, 1) factor
        if (norm > 0).all():  # the common case (False on NaN): the same numbers in one call
            return (lr / norm)[:, None, None]
        return np.where(norm > 0, lr / np.where(norm > 0, norm, 1.0), 0.0)[:, None, None]

    def observe(recording):
        W = K @ np.ascontiguousarray(np.swapaxes(Q, 1, 2))  # a contiguous Qᵀ: BLAS, the same product
        need_gap = recording or rule.needs_loss  # log δ only where log(L − L*) is read
        terms, log_scale, gW = terms_and_scaled_grad(prob, W.reshape(B, -1), log_delta=need_gap)
        gW = gW.reshape((B,) + prob.shape)
        gK, gQ = factor_grad(gW, K, Q)  # ∇_{K,Q} L = exp(log_scale) · (gK, gQ)
        nK, nQ = np.sqrt((gK * gK).sum(axis=(1, 2))), np.sqrt((gQ * gQ).sum(axis=(1, 2)))
        g_norm = np.sqrt(nK**2 + nQ**2)
        log_gap = prob.log_gap_from(terms) if need_gap else None
        return terms, log_scale, gK, gQ, nK, nQ, g_norm, log_scale + np.log(g_norm), log_gap

    def write(r, seen):
        terms, log_gn, log_gap = seen[0], seen[7], seen[8]
        out_K[r], out_Q[r], out_gap[r], out_gn[r] = K, Q, log_gap, log_gn
        out_loss[r] = np.mean(prob.loss.value(terms.output), axis=-1)
        out_sec[r] = time.perf_counter() - start

    def move(seen, loop):
        _, log_scale, gK, gQ, nK, nQ, g_norm, log_gn, log_gap = seen
        # As in train(): with a finite log-norm and finite factors nothing is unusable, and the
        # per-member tests (reductions over two axes of K and Q) are skipped.
        if not (np.isfinite(log_gn).all() and _all_finite(K) and _all_finite(Q)):
            loop.stop_unusable(np.isfinite(K).all(axis=(1, 2)) & np.isfinite(Q).all(axis=(1, 2)), g_norm, log_scale)
        # Each move as g · (length/‖g‖), a factor per trajectory: one pass over each factor's gradient
        if method == "ngd" and normalize == "separate":  # in place: this step's gradients are not read again
            return np.multiply(gK, step_per_norm(lr, nK), out=gK), np.multiply(gQ, step_per_norm(lr, nQ), out=gQ)
        length = rule.lengths(np.full(B, float(lr)), log_gn, log_gap)
        coef = (length / np.where(g_norm > 0, g_norm, 1.0))[:, None, None]
        return gK * coef, gQ * coef

    # Overflow and log(0) are detected in move() and stop the run; one errstate for the whole loop.
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        stopped = _descend([K, Q], record, observe, write, move)
    return FactorTrajectory(
        K=out_K,
        Q=out_Q,
        steps=record,
        loss=out_loss,
        log_gap=out_gap,
        log_grad_norm=out_gn,
        stopped=stopped,
        method=method,
        lr=float(lr),
        normalize=normalize,
        seconds=out_sec,
    )


def _cross_attention_descent(X, gamma, Z, W, absent=None):
    """Steepest-descent direction of the logistic loss of cross-attention, up to a positive factor per run.

    ``X`` (B, n, T, d), ``gamma`` (B, n, T) token scores ``y_i uᵀx_it``, ``Z`` (B, n, d_z), ``W`` (B, d, d_z).
    ``−∇L = (1/n) Σ_i σ(−m_i) Σ_t p_it (γ_it − m_i) x_it z_iᵀ`` with ``m_i = Σ_t p_it γ_it``, written
    cancellation-free as ``γ_it − m_i = Σ_s p_is (γ_it − γ_is)`` and in log space: every weight
    ``σ(−m_i) p_it p_is`` is ``exp`` of a sum of logs, shifted by its largest value per run, so the
    direction is exact at any ``‖W‖`` (softmax saturated to far below the smallest float).
    ``absent`` (B, n, T) bool, optional: padding tokens, left out of the softmax (each input keeps one).
    Returns ``G`` (B, d, d_z) and ``log_scale`` (B,) with ``−∇L = exp(log_scale) · G / n``.
    """
    logits = ((X @ W[:, None]) @ Z[..., None])[..., 0]  # (B, n, T, d_z) @ (B, n, d_z, 1)
    if absent is not None:  # padding tokens: logit −∞, softmax weight exactly 0
        logits = np.where(absent, -np.inf, logits)
    top = logits.max(axis=-1, keepdims=True)
    log_p = logits - top - np.log(np.exp(logits - top).sum(axis=-1, keepdims=True))
    margin = np.sum(np.exp(log_p) * gamma, axis=-1)  # (B, n), bounded by max |γ|
    log_weight = -np.logaddexp(0.0, margin)[..., None, None] + log_p[..., :, None] + log_p[..., None, :]
    # the pairs t = s carry γ_it − γ_it = 0: left out of the shift, which they would set at saturation
    # (their weight ~ 1 against the e^(−gap) of the pairs that matter, which would underflow to 0)
    T = logits.shape[-1]
    log_weight[..., np.arange(T), np.arange(T)] = -np.inf
    log_scale = log_weight.max(axis=(1, 2, 3))
    weight = np.exp(log_weight - log_scale[:, None, None, None])  # (B, n, T, T)
    coef = np.sum(weight * (gamma[..., :, None] - gamma[..., None, :]), axis=-1)  # (B, n, T)
    keys = (coef[:, :, None, :] @ X)[:, :, 0]  # (B, n, d): Σ_t coef_it x_it
    return np.swapaxes(keys, 1, 2) @ Z, log_scale


def ngd_cross_attention(
    X, y, u, Z, steps: int, lr: float = 0.1, K0=None, Q0=None, factorised=None, record_steps=None, tokens=None
):
    """Normalised GD on many small cross-attention problems at once, ``W`` runs and ``(K, Q)`` runs in one loop.

    The model of :func:`attnlib.model.self_attention` with queries ``Z`` and the logistic loss: logits
    ``x_itᵀ W z_i``, scores ``γ_it = y_i uᵀ x_it``. A ``W`` run moves ``W ← W − η ∇L/‖∇L‖`` from 0 (as
    :func:`train` with ``"ngd"``); a factorised run moves ``K`` and ``Q`` of ``W = K Qᵀ`` each by
    ``η`` along its own normalised gradient (``∇_K L = ∇_W L Q``, ``∇_Q L = (∇_W L)ᵀ K``; as
    :func:`train_kq` with ``normalize="separate"``, the official [TFSVM] code), a factor with an exactly
    zero gradient staying put. The same trajectories as those trainers, to rounding; this one has no
    per-problem machinery, which makes it about ten times faster on problems with a few tokens (where
    the generic trainers' per-step overhead dominates). The direction comes from
    :func:`_cross_attention_descent` (log space, cancellation-free).

    Args:
        X: (B, n, T, d) tokens.  y: (B, n) labels ±1.  u: (B, d) decoders.  Z: (B, n, d_z) queries.
        steps, lr: NGD iterations and step.  K0, Q0: (B, d, m), (B, d_z, m) starting factors (used
            by the factorised runs; default: no factorised run).  factorised: (B,) bool, which runs
            train ``(K, Q)`` (default: all if ``K0`` is given, else none).  record_steps: as in :func:`train`.
        tokens: (B,) number of real tokens of each run's inputs (default: all ``T``); the others are
            padding, outside the softmax, so problems with different ``T`` share one loop.

    Returns: ``(steps, W)``: the recorded steps (R,) and the matrices ``W`` (or ``K Qᵀ``) there, (R, B, d, d_z).

    >>> import numpy as np, attnlib as al
    >>> X, y, u, Z, _ = al.datasets.rank_instance(3, 4, 2, seed=0)
    >>> rec, W = ngd_cross_attention(X[None], y[None], u[None], Z[None], steps=50)
    >>> p = al.self_attention(X, y, u, Z)
    >>> ref = train(p, np.zeros((1, 2, 2)), 50, "ngd", 0.1, progress=False).final[0]
    >>> rec.tolist(), bool(np.allclose(W[-1, 0], ref, atol=1e-10))
    ([50], True)
    """
    X, y, u, Z = (np.asarray(a, float) for a in (X, y, u, Z))
    if X.ndim != 4 or y.shape != X.shape[:2] or u.shape != (X.shape[0], X.shape[3]) or Z.shape[:2] != X.shape[:2]:
        raise ValueError(
            "X must be (B, n, T, d), y (B, n), u (B, d) and Z (B, n, d_z), "
            f"got {X.shape}, {y.shape}, {u.shape}, {Z.shape}"
        )
    gamma = y[..., None] * (X @ u[:, None, :, None])[..., 0]
    return _ngd_cross(X, gamma, Z, steps, lr, K0, Q0, factorised, record_steps, tokens)


def _ngd_cross(X, gamma, Z, steps, lr, K0, Q0, factorised, record_steps, tokens=None):
    """:func:`ngd_cross_attention` from the token scores ``gamma`` (B, n, T) (validated shapes)."""
    check_schedule(steps, lr, 1)
    B, d, d_z = X.shape[0], X.shape[3], Z.shape[2]
    record = record_schedule(steps, record_steps=[steps] if record_steps is None else record_steps)
    if K0 is None:
        K, Q = np.zeros((B, d, 1)), np.zeros((B, d_z, 1))
        kq = np.zeros(B, bool) if factorised is None else np.asarray(factorised, bool)
        if kq.any():
            raise ValueError("factorised runs need K0 and Q0")
    else:
        K, Q = np.array(K0, float), np.array(Q0, float)
        kq = np.ones(B, bool) if factorised is None else np.asarray(factorised, bool)
        if K.shape[:2] != (B, d) or Q.shape[:2] != (B, d_z) or K.shape[2] != Q.shape[2]:
            raise ValueError(f"K0 must be ({B}, {d}, m) and Q0 ({B}, {d_z}, m), got {K.shape} and {Q.shape}")
    if kq.shape != (B,):
        raise ValueError(f"factorised must be {B} booleans, got shape {kq.shape}")
    absent = None
    if tokens is not None:
        tokens = np.asarray(tokens)
        if tokens.shape != (B,) or np.any(tokens < 1) or np.any(tokens > X.shape[2]):
            raise ValueError(f"tokens must be {B} integers in [1, {X.shape[2]}], got {tokens!r}")
        absent = np.broadcast_to(np.arange(X.shape[2]) >= tokens[:, None, None], X.shape[:3])
        gamma = np.where(absent, 0.0, gamma)
    W = np.where(kq[:, None, None], K @ np.swapaxes(Q, 1, 2), 0.0)
    out, r = np.empty((len(record), B, d, d_z)), 0
    unit = lambda G: G / np.where((n := np.linalg.norm(G, axis=(1, 2))) > 0, n, 1.0)[:, None, None]  # noqa: E731
    for step in range(steps + 1):
        if r < len(record) and record[r] == step:
            out[r], r = W, r + 1
        if step == steps:
            break
        G, _ = _cross_attention_descent(X, gamma, Z, W, absent)
        descent_K, descent_Q = factor_grad(G, K, Q)  # the chain rule is linear: descent directions of K, Q
        K, Q = K + lr * unit(descent_K), Q + lr * unit(descent_Q)
        W = np.where(kq[:, None, None], K @ np.swapaxes(Q, 1, 2), W + lr * unit(G))
    return record, out


def train_problems(
    problems,
    theta0,
    steps: int,
    method: str = "ngd",
    lr=0.1,
    record_steps=None,
    reduce: bool | None = None,
    max_tile: int = 4,
) -> list:
    """One trajectory per ``(problem, start)`` pair, in as few batched calls of :func:`attnlib.train` as allowed.

    Problems with the same ``T`` and loss, whose sample counts all divide the largest one ``N``, are
    trained as ONE :class:`attnlib.ProblemStack`: each is tiled ``N/n`` times, which leaves its loss
    ``(1/n)Σ_i ℓ_i`` and gradient unchanged (up to rounding). With ``reduce`` (default: when the
    parameter shapes differ or some problem has self-attention's rank-one features, which a stack
    would expand to ``d²`` dense ones) each problem is first rewritten in an orthonormal basis of the
    span of its feature differences (:func:`attnlib.model.reduce_to_span`, padded to the largest rank):
    every gradient lies in that span, and the part of a start outside it shifts all logits of a
    sample equally, so it is carried unchanged and added back. Other problems are trained one by
    one, every start of a problem in one batch. Tiling costs compute, so problems are grouped by
    sample count, each group's largest ``n`` at most ``max_tile`` times its smallest, one stack per group.

    Args: ``problems`` a list of problems, ``theta0`` a matching list of starts (``prob.shape``),
    ``steps``, ``method``, ``lr`` as in :func:`attnlib.train`; ``record_steps`` (default: the last).
    Returns a list of (R, *shape) recorded parameters, one per pair.

    >>> import numpy as np, attnlib as al
    >>> data = al.datasets.digit_patches(n=8, seed=0)
    >>> v = al.experiments.real_tokens.fit_patch_head(data.X, data.y)
    >>> a, b = (al.prompt_attention(data.X[:n], data.y[:n], v) for n in (2, 8))
    >>> out = train_problems([a, b], [np.zeros(a.shape)] * 2, 50, record_steps=[0, 50])
    >>> [o.shape for o in out]
    [(2, 20), (2, 20)]
    """

    problems, theta0 = list(problems), [np.asarray(t, float) for t in theta0]
    if len(problems) != len(theta0) or not problems:
        raise ValueError(f"give one start per problem, got {len(problems)} problems and {len(theta0)} starts")
    for p, t in zip(problems, theta0):
        if t.shape != p.shape:
            raise ValueError(f"a start must have its problem's shape {p.shape}, got {t.shape}")
    record = [steps] if record_steps is None else record_steps
    if reduce is None:
        reduce = any(p.factors is not None or p.shape != problems[0].shape for p in problems)
    groups = []  # sample counts, ascending; a group's counts divide its largest, within max_tile of its smallest
    for n in sorted({p.n for p in problems}):
        if groups and n <= max_tile * groups[-1][0] and all(n % m == 0 for m in groups[-1]):
            groups[-1].append(n)
        else:
            groups.append([n])
    if len(groups) > 1:
        out = [None] * len(problems)
        for group in groups:
            members = [j for j, p in enumerate(problems) if p.n in group]
            parts = train_problems(
                [problems[j] for j in members],
                [theta0[j] for j in members],
                steps,
                method,
                lr,
                record,
                reduce,
                max_tile,
            )
            for j, theta in zip(members, parts):
                out[j] = theta
        return out
    N, first = max(p.n for p in problems), problems[0]
    unique = {id(p): p for p in problems}
    same = all(p.factors is None and p.shape == first.shape for p in problems)
    stackable = all((p.T, p.loss.name) == (first.T, first.loss.name) and N % p.n == 0 for p in problems)
    if stackable and len(problems) > 1 and (reduce or same):
        reduced = {key: reduce_to_span(p) for key, p in unique.items()} if reduce else {}
        size = max((r.rank for r in reduced.values()), default=0)
        tiled, starts, outside = {}, [], []
        for key, p in unique.items():
            A = np.asarray(reduced[key].problem.A if reduce else p.A)
            if reduce:  # pad to the largest rank with zero features
                A = np.concatenate([A, np.zeros(A.shape[:2] + (size - A.shape[2],))], axis=-1)
            k = N // p.n
            tiled[key] = token_selection(np.tile(A, (k,) + (1,) * (A.ndim - 1)), np.tile(p.gamma, (k, 1)), p.loss)
        for p, t in zip(problems, theta0):
            if not reduce:
                starts.append(t)
                continue
            red = reduced[id(p)]
            logits = p.logits(t)
            c = red.coef.T @ (logits - logits[np.arange(p.n), p.opt][:, None]).ravel()  # ⟨b_r, θ0⟩
            starts.append(np.concatenate([c, np.zeros(size - red.rank)]))
            outside.append(t - red.lift(c))
        stack = ProblemStack(tuple(tiled[id(p)] for p in problems))
        run = train(stack, np.stack(starts), steps, method=method, lr=lr, record_steps=record, progress=False)
        if not reduce:
            return [run.theta[:, s] for s in range(len(problems))]
        return [outside[s] + reduced[id(p)].lift(run.theta[:, s]) for s, p in enumerate(problems)]
    out = [None] * len(problems)
    groups = {}
    for j, p in enumerate(problems):
        groups.setdefault(id(p), []).append(j)
    for members in groups.values():
        p = problems[members[0]]
        run = train(
            p, np.stack([theta0[j] for j in members]), steps, method=method, lr=lr, record_steps=record, progress=False
        )
        for b, j in enumerate(members):
            out[j] = run.theta[:, b]
    return out


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
        # np.minimum/np.maximum: np.clip's numbers (NaN and ±inf alike) at a fraction of its call cost
        shift = (
            np.zeros_like(log_scale) if first else np.exp(np.minimum(np.maximum(state["scale"] - log_scale, -700), 700))
        )
        state["m"] = self.beta1 * shift[:, None] * state["m"] + (1 - self.beta1) * g
        state["v"] = self.beta2 * (shift**2)[:, None] * state["v"] + (1 - self.beta2) * g * g
        state["scale"] = np.where(np.isfinite(log_scale), log_scale, state["scale"])
        m_hat = state["m"] / (1 - self.beta1**t)
        v_hat = state["v"] / (1 - self.beta2**t)
        eps = self.eps * np.exp(-np.minimum(np.maximum(log_scale, -700), 700))[:, None]
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
        # The blocks' slices, computed once: update() runs at every step of the loop.
        ends = np.cumsum(self.sizes)
        object.__setattr__(self, "_block_slices", [slice(int(e - n), int(e)) for e, n in zip(ends, self.sizes)])

    def _slices(self, B: int):
        total = self._block_slices[-1].stop
        if total != B:
            raise ValueError(f"the blocks hold {total} trajectories, the batch {B}")
        return self._block_slices

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
}  # Adam is passed as an object (``Adam(...)``): "adam" stays an unknown method name elsewhere
