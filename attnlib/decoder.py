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

from .joint import JointSVMs
from .model import JointAttention, finite_array, token_selection
from .svm import label_svm, max_margin

__all__ = ["DecoderAttention", "joint_self_attention", "PlantedTokens", "planted_tokens", "decoder_svms"]


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
        Z = self.X[:, 0, :] if self.Z is None else finite_array("Z", self.Z, ndim=2)
        if Z.shape[0] != self.X.shape[0]:
            raise ValueError(f"Z must have one query per sample, shape ({self.X.shape[0]}, d_z), got {Z.shape}")
        object.__setattr__(self, "Z", Z)

    @property
    def shape(self) -> tuple[int, int]:
        """Shape of ``W``: (d, d_z)."""
        return (self.X.shape[2], self.Z.shape[1])

    @cached_property
    def keys(self) -> np.ndarray:
        """``vec(x_it z_iᵀ)``: (n, T, d·d_z)."""
        n, T, d = self.X.shape
        return (self.X[:, :, :, None] * self.Z[:, None, None, :]).reshape(n, T, d * self.Z.shape[1])


def joint_self_attention(X, y, Z=None, loss="logistic") -> DecoderAttention:
    """[FAST] self-attention with a trainable decoder; ``Z=None`` uses ``z_i = x_i1``.

    Args: ``X`` (n, T, d) tokens, ``y`` (n,) labels ±1, ``Z`` (n, d_z) queries (cross-attention)
    or None, ``loss`` "logistic", "exponential" or "linear".
    """
    X = finite_array("X", X, ndim=3)
    return DecoderAttention(X, np.asarray(y, float), np.eye(X.shape[2]), loss, Z)


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
