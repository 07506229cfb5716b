"""Self-attention with a trainable linear decoder: joint training of ``(W, u)`` ([FAST], v2).

The model of [FAST] is ``f(X) = uᵀ Xᵀ softmax(X W z)``. With the decoder ``u`` trained together
with ``W``, the scores ``γ_it = y_i uᵀ x_it`` move, exactly as the head ``v`` does in the joint
prompt-attention problem of [MMTS]. The logit ``x_itᵀ W z_i = ⟨vec W, vec(x_it z_iᵀ)⟩`` is linear
in ``vec W`` with the key ``vec(x_it z_iᵀ)``, so this *is* :class:`attnlib.JointAttention` with
the parameter ``p = vec W`` (row-major, shape ``d·d_z``) and those keys: loss, output and the
cancellation-free gradient are inherited, and :func:`attnlib.train_joint_problem` trains it.

>>> import numpy as np, attnlib as al
>>> X = np.random.default_rng(0).normal(size=(3, 4, 5))
>>> joint = al.joint_self_attention(X, [1, -1, 1])
>>> joint.keys.shape                       # (n, T, d·d_z)
(3, 4, 25)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .joint import JointSVMs, StackedJointAttention, _train_joint_rows
from .model import JointAttention, finite_array, token_selection
from .svm import label_svm, max_margin

__all__ = [
    "DecoderAttention",
    "joint_self_attention",
    "StackedDecoderAttention",
    "train_decoder_stack",
    "PlantedTokens",
    "planted_tokens",
    "decoder_svms",
]


@dataclass(frozen=True, eq=False)
class DecoderAttention(JointAttention):
    """``L(W, u) = (1/n) Σ_i ℓ(y_i uᵀ X_iᵀ softmax(X_i W z_i))`` with ``W`` flattened to ``p``.

    Attributes: ``X`` (n, T, d) tokens, ``y`` (n,) labels, ``Z`` (n, d_z) queries, ``loss``;
    ``W`` is the identity (d, d) of the parent class and is not used: the keys are
    ``vec(x_it z_iᵀ)``, (n, T, d·d_z). Methods take ``p`` (*batch, d·d_z) (``W.reshape(..., -1)``)
    and ``v`` = ``u`` (*batch, d).
    """

    Z: np.ndarray | None = None

    def __post_init__(self):
        super().__post_init__()
        lead = self.X.shape[:-2]  # (n,), or (R, n) for a stack
        Z = self.X[..., 0, :] if self.Z is None else finite_array("Z", self.Z, ndim=len(lead) + 1)
        if Z.shape[:-1] != lead:
            raise ValueError(f"Z must have one query per sample, shape {lead + ('d_z',)}, got {Z.shape}")
        object.__setattr__(self, "Z", Z)

    @property
    def shape(self) -> tuple[int, int]:
        """Shape of ``W``: (d, d_z)."""
        return (self.X.shape[-1], self.Z.shape[-1])

    @cached_property
    def keys(self) -> np.ndarray:
        """``vec(x_it z_iᵀ)``: (n, T, d·d_z) (leading data axes of a stack first)."""
        d, dz = self.shape
        return (self.X[..., :, None] * self.Z[..., None, None, :]).reshape(self.X.shape[:-1] + (d * dz,))


def joint_self_attention(X, y, Z=None, loss="logistic") -> DecoderAttention:
    """[FAST] self-attention with a trainable decoder; ``Z=None`` uses ``z_i = x_i1``.

    Args: ``X`` (n, T, d) tokens, ``y`` (n,) labels ±1, ``Z`` (n, d_z) queries (cross-attention)
    or None, ``loss`` "logistic", "exponential" or "linear".
    """
    X = finite_array("X", X, ndim=3)
    return DecoderAttention(X, np.asarray(y, float), np.eye(X.shape[2]), loss, Z)


@dataclass(frozen=True, eq=False)
class StackedDecoderAttention(DecoderAttention, StackedJointAttention):
    """:class:`DecoderAttention` with one data set per batch row: ``X`` (R, n, T, d), ``y`` (R, n), ``Z`` (R, n, d_z).

    The keys ``vec(x_it z_iᵀ)`` are (R, n, T, d·d_z); methods take ``p`` (*batch, R, d·d_z) and
    ``v`` (*batch, R, d), and row ``r`` of the parameters sees data set ``r`` only
    (:class:`attnlib.joint.StackedJointAttention`'s data axes), so the (W, u) runs on R data sets
    step together as one batch (:func:`train_decoder_stack`). ``Z=None`` uses ``z_i = x_i1`` per row.
    """


def train_decoder_stack(problems, p0, v0, steps: int, **options) -> list:
    """:func:`attnlib.train_joint_problem` on several :class:`DecoderAttention` problems as one batch.

    Args:
        problems: sequence of S :class:`DecoderAttention` with one ``X.shape`` (n, T, d), one
            ``Z.shape`` (n, d_z) and one loss.
        p0: ``vec W`` starts, (d·d_z,), (B, d·d_z) (the same for every problem) or (S, B, d·d_z);
            ``v0`` (the decoder ``u``) likewise with ``d``.
        steps, options: ``method``, ``lr``, ``record_every``, ``record_steps``, ``progress`` of
            :func:`attnlib.train_joint_problem`, which takes the one batched step
            (a :class:`StackedDecoderAttention`).

    Returns one :class:`attnlib.optim.JointTrajectory` per problem (``p`` (R, B, d·d_z), ``v``
    (R, B, d), ``problem`` the problem passed): the same as S separate
    :func:`attnlib.train_joint_problem` calls, with one Python loop over the iterations.

    >>> import numpy as np, attnlib as al
    >>> Js = [al.joint_self_attention(D.X, D.y) for D in (al.planted_tokens(4, 5, 6, s) for s in (0, 1))]
    >>> trajs = al.train_decoder_stack(Js, np.zeros(36), np.zeros(6), 50, method="ngd", lr=0.1)
    >>> one = al.train_joint_problem(Js[1], np.zeros(36), np.zeros(6), 50, method="ngd", lr=0.1)
    >>> len(trajs), trajs[1].problem is Js[1], bool(np.allclose(trajs[1].p, one.p, rtol=1e-12, atol=1e-12))
    (2, True, True)
    """
    problems = list(problems)
    if not problems or not all(isinstance(J, DecoderAttention) for J in problems):
        raise ValueError("problems must be a non-empty sequence of DecoderAttention (attnlib.joint_self_attention)")
    first = problems[0]
    for s, J in enumerate(problems):
        if J.X.ndim != 3 or J.X.shape != first.X.shape or J.Z.shape != first.Z.shape:
            raise ValueError(
                f"problems must share X.shape (n, T, d) and Z.shape (n, d_z): problem 0 has {first.X.shape} "
                f"and {first.Z.shape}, problem {s} has {J.X.shape} and {J.Z.shape}"
            )
        if J.loss.name != first.loss.name:
            raise ValueError(
                f"problems must share one loss: problem 0 has {first.loss.name!r}, problem {s} has {J.loss.name!r}"
            )
    X, y, Z = (np.stack([getattr(J, a) for J in problems]) for a in ("X", "y", "Z"))
    d = X.shape[-1]

    def stack(B):
        rep = [np.repeat(a, B, axis=0) for a in (X, y, Z)]
        return StackedDecoderAttention(rep[0], rep[1], np.eye(d), first.loss, rep[2])

    return _train_joint_rows(
        len(problems), stack, (d * Z.shape[-1], d), p0, v0, steps, lambda s, _: problems[s], **options
    )


@dataclass(frozen=True, eq=False)
class PlantedTokens:
    """Data of :func:`planted_tokens`: ``X`` (n, T, d), ``y`` (n,), ``Z`` (n, d_z) or None (self-attention),
    ``signal`` (n,) the planted token of each sequence, ``u_star`` (d,) the planted unit direction."""

    X: np.ndarray
    y: np.ndarray
    Z: np.ndarray | None
    signal: np.ndarray
    u_star: np.ndarray


def planted_tokens(n: int, T: int, d: int, seed=0, c: float = 1.0, queries: str = "self") -> PlantedTokens:
    """The "global" family of :func:`attnlib.datasets.random_tokens`, returned with its ingredients.

    Unit tokens orthogonal to a unit direction ``u*``, except one token per sequence (``signal``)
    given the component ``y_i c u*`` and renormalised; labels ±1. For a *fixed* decoder ``u*``,
    every non-planted token scores 0 and the planted one scores ``y_i·(its u* component) > 0``. The
    draw is the same as ``random_tokens(n, T, d, seed, family="global", queries=queries, c=c)``.
    """
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, T, d))
    X /= np.linalg.norm(X, axis=-1, keepdims=True)
    u = rng.standard_normal(d)
    u /= np.linalg.norm(u)
    y = rng.choice([-1.0, 1.0], size=n)
    X = X - (X @ u)[..., None] * u
    X /= np.linalg.norm(X, axis=-1, keepdims=True)
    best = rng.integers(0, T, size=n)
    planted = X[np.arange(n), best] + (y * c)[:, None] * u
    X[np.arange(n), best] = planted / np.linalg.norm(planted, axis=-1, keepdims=True)
    Z = None
    if queries == "cross":
        Z = rng.standard_normal((n, d))
        Z /= np.linalg.norm(Z, axis=-1, keepdims=True)
    return PlantedTokens(X, y, Z, best, u)


def decoder_svms(joint: DecoderAttention, select) -> JointSVMs:
    """Label SVM of the selected tokens and the full and relaxed W-SVMs, for ``(W, u)`` training.

    :func:`attnlib.joint_svms` for the keys ``vec(x_it z_iᵀ)`` of a :class:`DecoderAttention`:
    ``label`` is ``u_mm(α) = argmin ‖u‖ s.t. y_i uᵀx_iα_i ≥ 1``, ``full`` and ``relaxed`` hold
    ``vec W`` (reshape to ``joint.shape``). Pass the result to :func:`attnlib.balanced_direction`
    for the direction of ``vec W`` predicted when ``‖u‖/‖W‖ → ρ``.

    Args: ``joint`` the problem, ``select`` (n,) the selected token of each sequence.

    >>> import numpy as np, attnlib as al
    >>> D = al.planted_tokens(3, 4, 5, seed=0)
    >>> svms = al.decoder_svms(al.joint_self_attention(D.X, D.y), D.signal)
    >>> svms.full.theta.shape, bool(np.all(svms.label_margins > 0))
    ((25,), True)
    """
    n, T, _ = joint.X.shape
    sel = np.asarray(select)
    if sel.shape != (n,) or not np.issubdtype(sel.dtype, np.integer) or np.any((sel < 0) | (sel >= T)):
        raise ValueError(f"select must hold {n} token indices in [0, {T - 1}], got {select!r}")
    rows = np.arange(n)
    chosen = joint.X[rows, sel]
    label = label_svm(chosen, joint.y)
    onehot = np.zeros((n, T))
    onehot[rows, sel] = 1.0
    prob = token_selection(joint.keys, onehot)  # the SVM depends only on the keys and the selection
    full = max_margin(prob, sel)
    relaxed = max_margin(prob, sel, relax=~label.support)
    margins = joint.y * (chosen @ label.v) / np.linalg.norm(label.v)
    return JointSVMs(label, label.support.copy(), full, relaxed, sel, joint.keys, margins)
