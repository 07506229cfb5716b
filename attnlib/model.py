"""The token-selection problem: logits linear in θ, fixed token scores ([MMTS], [FAST]; the book's notation page).

Sample ``i`` has ``T`` tokens; a parameter ``θ`` (a vector ``p`` or a matrix ``W``) gives
logits linear in θ and each token carries a fixed score ``γ_it``:

.. math::

    s_{it}(θ) = ⟨θ, A_{it}⟩, \\quad σ_i(θ) = \\mathrm{softmax}(s_i(θ)), \\quad
    L(θ) = \\frac1n \\sum_i ℓ\\Big(\\sum_t σ_{it} γ_{it}\\Big).

The prompt-attention model of [MMTS] and the self-attention model of [FAST]/[TFSVM] are two
constructors of this one problem (:func:`prompt_attention`, :func:`self_attention`).

Numerics. Every quantity is computed from the log-softmax and from the
non-negative *deficit* ``δ_i = Σ_t σ_it (γ_i,opt − γ_it)``, never as a difference of nearly equal
numbers: the output is ``γ_opt − δ``, the loss gap ``L − L*`` is ``ℓ(γ_opt − δ) − ℓ(γ_opt)`` in
its cancellation-free form, and the gradient

.. math::

    ∇L(θ) = \\frac1n \\sum_i ℓ'(u_i) \\sum_{t} σ_{it} (γ_{it} − u_i)(A_{it} − A_{i,\\mathrm{opt}_i})

computes ``γ_it − u_i = (γ_it − γ_ir) + Σ_τ σ_iτ (γ_ir − γ_iτ)`` from the token ``r_i`` that
currently holds the attention (the optimal token on a global run, another one on a run caught by
a local direction), so it stays exact once ``1 − σ_r`` is far below machine epsilon. The
gradient is also available as ``(log scale, scaled vector)`` so that its *direction* is exact
even where its size underflows (``‖θ‖·margin`` beyond about 700).

Every problem of the book lives here: the fixed-score problem and its stacks
(:class:`TokenSelectionProblem`, :class:`ProblemStack`), joint training of the attention and the
head (:class:`JointAttention`, :class:`StackedJointAttention`), self-attention with a trainable
decoder (:class:`DecoderAttention`, :func:`joint_self_attention`: the same joint problem with
``p = vec W`` and keys ``vec(x_it z_iᵀ)``), a nonlinear head (:class:`NonlinearHeadAttention`),
logistic regression and the span reduction (:func:`logistic_regression`, :func:`reduce_to_span`),
and the chain rule of the factorisation ``W = K Qᵀ`` (:func:`factor_grad`).

>>> import numpy as np, attnlib as al
>>> X = np.random.default_rng(0).normal(size=(3, 4, 5))
>>> al.model.joint_self_attention(X, [1, -1, 1]).keys.shape     # (n, T, d·d_z)
(3, 4, 25)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol, runtime_checkable

import numpy as np

from .losses import CROSS_ENTROPY, Loss, get_loss

__all__ = [
    "finite_array",
    "log_softmax",
    "logsumexp",
    "check_labels",
    "Terms",
    "terms_and_scaled_grad",
    "AttentionProblem",
    "TokenSelectionProblem",
    "token_selection",
    "prompt_attention",
    "self_attention",
    "ProblemStack",
    "stack_problems",
    "JointProblem",
    "JointAttention",
    "logistic_regression",
    "Reduced",
    "reduce_to_span",
    "factor_grad",
    "NonlinearHeadAttention",
    "nonlinear_head",
    "StackedJointAttention",
    "DecoderAttention",
    "joint_self_attention",
    "StackedDecoderAttention",
    "ReluHeadTerms",
    "ReluHeadStack",
    "relu_head_stack",
    "check_integer",
]


def finite_array(name: str, value, ndim: int | None = None) -> np.ndarray:
    """``value`` as a float array with ``ndim`` axes (if given) and finite entries, or a ValueError naming ``name``."""
    arr = np.asarray(value, dtype=float)
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must be a {ndim}-D array, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite (no NaN or inf)")
    return arr


def _max_keepdims(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """``x.max(axis, keepdims=True)``, several times faster over a short last axis (tokens).

    numpy reduces a short contiguous axis one output at a time (≈45 µs for (100, 6, 8)); an
    elementwise maximum of neighbouring pairs of tokens, halving the axis each time, is
    ``⌈log₂ T⌉`` vectorised calls (3 for T = 8) and gives the same numbers: max is exact, and
    each pair keeps its left member on a tie, so the first of equal maxima (``−0.0`` before
    ``0.0``, the first NaN) wins, as in the token-by-token fold.
    """
    if x.ndim == 0 or axis not in (-1, x.ndim - 1) or not 0 < x.shape[-1] <= 16:
        return x.max(axis=axis, keepdims=True)
    top, width = x, x.shape[-1]
    while width > 1:
        half = width // 2
        pairs = np.maximum(top[..., 0 : 2 * half : 2], top[..., 1 : 2 * half : 2])
        if width % 2:  # the last token joins the last pair, after it
            pairs[..., -1:] = np.maximum(pairs[..., -1:], top[..., width - 1 :])
        top, width = pairs, half
    return top if top is not x else x[..., :1]


def _sum_keepdims(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """``x.sum(axis, keepdims=True)`` with the same bits, about twice as fast over a short last axis.

    numpy sums a contiguous last axis by pairwise summation (``pairwise_sum`` in its sources): for
    ``8 ≤ T ≤ 128``, eight running sums over blocks of 8, added as ``((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7))``,
    then the ``T mod 8`` last entries one by one; below 8, one by one. This adds the same numbers
    in the same order on slices of all samples at once (a handful of vectorised calls instead of
    one short reduction per sample). Other axes, layouts and lengths go to ``x.sum``.

    >>> x = np.random.default_rng(0).normal(size=(5, 3, 11))
    >>> bool(np.array_equal(_sum_keepdims(x), x.sum(axis=-1, keepdims=True)))
    True
    """
    T = x.shape[-1] if x.ndim else 0
    if axis not in (-1, x.ndim - 1) or not 0 < T <= 128 or not x.flags.c_contiguous:
        return x.sum(axis=axis, keepdims=True)
    if T < 8:
        total = x[..., :1]
        for t in range(1, T):
            total = total + x[..., t : t + 1]
        return total
    full = T - T % 8
    r = x[..., :8]
    for start in range(8, full, 8):
        r = r + x[..., start : start + 8]
    r = r[..., 0::2] + r[..., 1::2]
    r = r[..., 0::2] + r[..., 1::2]
    total = r[..., :1] + r[..., 1:]
    for t in range(full, T):
        total = total + x[..., t : t + 1]
    return total


def log_softmax(z: np.ndarray, axis: int = -1) -> np.ndarray:
    """Stable log-softmax (max-subtracted); plain numpy, ~5× faster than scipy's on small arrays."""
    # The token reductions are vectorised over samples (_max_keepdims, _sum_keepdims: the same
    # numbers as ndarray.max/sum), which matters when a step of a small batch is a hundred small
    # numpy calls.
    shifted = z - _max_keepdims(z, axis)
    return shifted - np.log(_sum_keepdims(np.exp(shifted), axis))


def logsumexp(x: np.ndarray, axis=-1, b=None, return_sign: bool = False, precise: bool = False):
    """``log Σ exp(x)`` over ``axis``; ``-inf`` where every entry is ``-inf``. The library's one logsumexp.

    By default it is the max-subtracted sum ``log Σ exp(x − max) + max`` (the trainers' hot path).
    With weights ``b`` (broadcastable to ``x``; entries with weight 0 are ignored) it computes
    ``log |Σ b exp(x)|``, and with ``return_sign=True`` it returns ``(log |Σ b exp(x)|, sign)``
    (sign 0 and value ``-inf`` for a zero sum). These forms, and ``precise=True``, add the largest
    terms apart and take ``log1p`` of the rest, exactly as ``scipy.special.logsumexp`` (1.15+)
    does, so a signed sum that nearly cancels keeps its relative accuracy.

    >>> import numpy as np
    >>> float(logsumexp(np.log([1.0, 2.0, 3.0])))  # log 6
    1.791759469228055
    >>> value, sign = logsumexp(np.log([1.0, 3.0]), b=[1.0, -1.0], return_sign=True)
    >>> round(float(np.exp(value)), 12), float(sign)
    (2.0, -1.0)
    """
    x = np.asarray(x)
    if b is None and not return_sign and not precise:
        top = _max_keepdims(x, axis)
        top = np.where(np.isfinite(top), top, 0.0)
        with np.errstate(divide="ignore"):
            return (np.log(_sum_keepdims(np.exp(x - top), axis)) + top).squeeze(axis=axis)
    x, b = np.broadcast_arrays(np.asarray(x, dtype=float), np.asarray(1.0 if b is None else b, dtype=float))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        total = (b * np.exp(x)).sum(axis=axis, keepdims=True)  # direct sum: used where the shifted one is not finite
        direct, direct_sign = np.log(np.abs(total)), np.sign(total)
        a = np.where(b == 0, -np.inf, x)
        top = a.max(axis=axis, keepdims=True)
        at_top = a == top
        m = (b * at_top).sum(axis=axis, keepdims=True)  # the largest terms, summed apart
        rest = (b * np.exp(np.where(at_top, -np.inf, a) - top)).sum(axis=axis, keepdims=True)
        rest = np.where(rest == 0, rest, rest / m)
        sign = np.sign(rest + 1) * np.sign(m)
        rest = np.where(rest < -1, -rest - 2, rest)
        out = np.log1p(rest) + np.log(np.abs(m)) + top
    if not return_sign:
        out = np.where(sign < 0, np.nan, out)
    finite = np.isfinite(out)
    out = np.where(finite, out, direct).squeeze(axis=axis)
    sign = np.where(finite, sign, direct_sign).squeeze(axis=axis)
    return (out, sign) if return_sign else out


def check_labels(y, shape, name: str = "y") -> np.ndarray:
    """Labels ``y`` as a float array of the given ``shape`` with entries ±1, or a ValueError.

    The library's one label check: ``shape`` is ``(n,)`` for one data set (an int ``n`` is
    accepted), ``(S, n)`` for a stack of data sets.

    >>> check_labels([1, -1, 1], 3).tolist()
    [1.0, -1.0, 1.0]
    """
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    y = finite_array(name, y, ndim=len(shape))
    if y.shape != shape:
        what = "one label per sample" if len(shape) == 1 else "one label per sample of each data set"
        raise ValueError(f"{name} must have shape {shape} ({what}), got {y.shape}")
    if not np.all(np.isin(y, (-1.0, 1.0))):
        raise ValueError(f"{name} must contain only labels -1 and +1, got values {np.unique(y)}")
    return y


@dataclass(frozen=True, eq=False)
class Terms:
    """Per-sample quantities shared by the loss, the gap and the gradient at one θ batch.

    Attributes:
        log_sigma: (*batch, n, T) ``log σ_it``.
        log_delta: (*batch, n) ``log δ_i``, the log of the deficit ``δ_i ≥ 0`` (``u_i = γ_i,opt − δ_i``);
            None from a trainer's step that was asked not to compute it (:func:`terms_and_scaled_grad`).
        output: (*batch, n) the signed outputs ``u_i``.
    """

    log_sigma: np.ndarray  # (..., n, T)
    log_delta: np.ndarray  # (..., n)   log of the deficit δ_i ≥ 0
    output: np.ndarray  # (..., n)   u_i = γ_opt − δ_i


@runtime_checkable
class AttentionProblem(Protocol):
    """What a trainer needs from a problem: the flat-parameter protocol of the library.

    A problem has a parameter θ of shape ``shape`` (``size`` entries), a loss ``loss`` with floor
    ``loss_floor`` (``L*``), and evaluates a batch of parameters in one set of array operations:

    - :meth:`flatten` validates ``theta`` (*batch, *shape) and returns ``(flat (*batch, size), batch)``;
    - :meth:`terms_from_flat` computes the shared per-sample :class:`Terms` at ``flat``;
    - :meth:`log_gap_from` gives ``log(L − L*)`` (*batch,) from those terms;
    - :meth:`scaled_grad_from` gives ``∇L = exp(m)·g`` as ``(m (*batch,), g (*batch, size))``,
      ``g`` of order one, so the direction is exact where ``‖∇L‖`` underflows.

    The loss itself is ``mean(loss.value(terms.output), axis=-1)``.
    :class:`TokenSelectionProblem`, :class:`ProblemStack` and
    :class:`attnlib.model.NonlinearHeadAttention` implement it; :func:`attnlib.train`,
    :func:`attnlib.paths.log_gap_grad` and the regularization paths use only these names.
    """

    shape: tuple[int, ...]
    loss: Loss

    def flatten(self, theta) -> tuple[np.ndarray, tuple[int, ...]]: ...

    def terms_from_flat(self, flat: np.ndarray) -> Terms: ...

    def log_gap_from(self, terms: Terms) -> np.ndarray: ...

    def scaled_grad_from(self, terms: Terms) -> tuple[np.ndarray, np.ndarray]: ...


def _deficit_terms(log_sigma: np.ndarray, log_score_gap: np.ndarray, gamma_ref: np.ndarray) -> Terms:
    """``δ_i = Σ_t σ_it Δ_it`` in log space, from ``log Δ`` (Δ = score gap to the reference token,
    ≥ 0; ``log Δ = −inf`` at the reference)."""
    log_delta = logsumexp(log_sigma + log_score_gap, axis=-1)
    output = gamma_ref - np.exp(log_delta)
    return Terms(log_sigma, log_delta, output)


def _scaled_weights(
    log_sigma: np.ndarray, gamma: np.ndarray, output: np.ndarray, loss: Loss, sample_weight=None
) -> tuple[np.ndarray, np.ndarray]:
    """Gradient weights ``w_it = ℓ'(u_i) σ_it (γ_it − u_i) / n`` as ``exp(m) · w_scaled``.

    ``γ_it − u_i`` is computed from the token ``r_i`` that currently holds most of the attention
    (not from the optimal one): ``γ_it − u_i = (γ_it − γ_ir) + Σ_τ σ_iτ (γ_ir − γ_iτ)``, where
    the sum is tiny once the softmax saturates on ``r_i`` whichever token that is. A fixed
    reference would cancel catastrophically on runs that converge to a *local* selection.
    The reference's own weight is set to ``−Σ_{t≠r} w_it`` (the weights of a sample sum to zero),
    so features may be measured from any base token.

    Args: ``log_sigma`` (..., n, T); ``gamma`` broadcastable to it; ``output`` ``u`` (..., n);
    ``sample_weight`` (..., n) non-negative weights ``c_i`` of the samples in place of ``1/n`` (the
    gradient of ``Σ_i c_i ℓ(u_i)``, e.g. a mini-batch's ``1/b`` on its samples and 0 elsewhere).
    Returns ``m`` (...) (``-inf`` when every weight is zero) and ``w_scaled`` (..., n, T), largest
    magnitude 1.
    """
    n, T = log_sigma.shape[-2:]
    is_ref = np.arange(T) == np.argmax(log_sigma, axis=-1)[..., None]
    # γ_ir as the max over one entry: the same number as indexing, without take_along_axis's cost
    # (this runs at every step of every trainer).
    gamma_ref = _max_keepdims(np.where(is_ref, gamma, -np.inf))
    ref_gap = gamma_ref - gamma  # γ_ir − γ_it
    ref_minus_output = _sum_keepdims(np.exp(log_sigma) * ref_gap)
    # γ_it − u_i = (γ_it − γ_ir) + Σ_τ σ_iτ (γ_ir − γ_iτ); γ_it − γ_ir is −ref_gap exactly (IEEE
    # subtraction is antisymmetric), so one subtraction gives the sum without a second pass.
    diff = ref_minus_output - ref_gap
    with np.errstate(divide="ignore"):
        log_neg_dloss = loss.log_slope(output)
        log_weight = -np.log(n) if sample_weight is None else np.log(sample_weight)[..., None]
        log_abs = log_neg_dloss[..., None] + log_weight + log_sigma + np.log(np.abs(diff))
    log_abs = np.where(is_ref, -np.inf, log_abs)
    m = log_abs.max(axis=(-2, -1))
    finite_m = np.where(np.isfinite(m), m, 0.0)
    w_scaled = -np.sign(diff) * np.exp(log_abs - finite_m[..., None, None])
    w_scaled = np.where(is_ref, -_sum_keepdims(w_scaled), w_scaled)
    return m, w_scaled


#: ``exp(x)`` of float64 is 0 below about −745.13 and subnormal below about −708.4.
_EXP_NORMAL, _EXP_ZERO = -700.0, -746.0


def _exp(x: np.ndarray) -> np.ndarray:
    """``np.exp(x)`` with the same bits, several times faster where many entries underflow.

    numpy's vectorised exp recomputes a whole SIMD vector on its slow path when one lane
    underflows, the common case here (the softmax of a saturated run); the other lanes' values
    do not depend on it. So exp is taken of ``max(x, −700)`` and the entries below −700 are
    set afterwards: 0 below −746 (where exp(x) < 2⁻¹⁰⁷⁵ rounds to 0), np.exp itself in between.

    >>> x = np.array([0.0, -1.0, -720.0, -745.5, -800.0, -np.inf, np.nan])
    >>> bool(np.array_equal(_exp(x), np.exp(x), equal_nan=True))
    True
    """
    low = x < _EXP_NORMAL
    if not low.any():
        return np.exp(x)
    out = np.exp(np.maximum(x, _EXP_NORMAL))
    out *= ~low  # exact: finite values times 1, or 0
    band = low & (x > _EXP_ZERO)
    if band.any():
        out[band] = np.exp(x[band])
    return out


def _exp_flushed(x: np.ndarray) -> np.ndarray:
    """``np.exp(x)`` with every result below ``e^−700`` (≈ 1e−304) set to 0: several times faster
    than :func:`_exp` where many entries underflow, equal to ``np.exp`` up to 1e−304 absolute.

    For exponentials of numbers ``≤ 0`` that are then summed with or scaled by the largest of
    them, which is 1 (the softmax's ``exp(s − max s)``, the step's weights ``exp(log|w| − m)``):
    a term below 1e−304 of the largest changes no result beyond rounding. NaN and ±inf are kept.

    >>> x = np.array([0.0, -1.0, -720.0, -800.0, -np.inf, np.nan])
    >>> _exp_flushed(x).tolist()[:2] == np.exp(x[:2]).tolist(), _exp_flushed(x).tolist()[2:5]
    (True, [0.0, 0.0, 0.0])
    """
    out = np.exp(np.maximum(x, _EXP_NORMAL))
    np.putmask(out, x < _EXP_NORMAL, 0.0)  # NaN < anything is False: NaN stays NaN
    return out


def _fused_step(
    logits: np.ndarray,
    gamma: np.ndarray,
    log_score_gap: np.ndarray,
    gamma_opt: np.ndarray,
    loss: Loss,
    log_delta: bool = True,
):
    """Log-softmax, outputs and gradient weights in one pass, tokens first: the training step's core.

    The formulas of :func:`log_softmax`, :func:`_deficit_terms` and :func:`_scaled_weights` on
    arrays laid out ``(T, B, n)`` instead of ``(B, n, T)``: a reduction over tokens is then one
    vectorised pass over all ``B·n`` samples per token, and a per-sample quantity (B, n)
    broadcasts along whole rows, where over a short last axis numpy loops sample by sample. The reference token
    ``r_i`` is addressed by index, not by masks, and the exponentials avoid numpy's slow
    underflow path (:func:`_exp`). Four shortcuts, equal to the separate formulas up to rounding
    (``tests/test_model.py`` compares them to 1e-12 relative):

    - the softmax's and the weights' exponentials flush results below 1e−304 of their largest
      (which is 1) to 0 (:func:`_exp_flushed`), and the sums over tokens add them one token
      after the other (``ndarray.sum`` over the leading axis, one call), not pairwise;
    - ``σ = exp(shifted) / Σ_t exp(shifted)`` reuses the softmax's exponentials (one exp pass less);
    - the output comes from the cancellation-free sum the weights need anyway,
      ``u_i = γ_ir − Σ_τ σ_iτ (γ_ir − γ_iτ)``, instead of ``γ_i,opt − δ_i``;
    - ``log δ_i`` (a logsumexp, only read by ``log(L − L*)``) is computed only if ``log_delta``,
      else returned as None: a trainer asks for it at its recorded steps and for the rules that
      need the loss.

    Args: ``logits``, ``gamma``, ``log_score_gap`` (T, B, n) contiguous; ``gamma_opt`` (B, n).
    Returns ``log_sigma`` (T, B, n), ``log_delta`` (B, n) or None, ``output`` (B, n), ``m`` (B,)
    and the weights ``w_scaled`` (T, B, n) with ``∇L = exp(m) Σ_it w_it (A_it − A_i,opt)``.
    """
    T, B, n = logits.shape
    shifted = logits - logits.max(axis=0)
    # no entry below e^−700 (most steps of a small problem): the flush would change nothing
    exp_shifted = np.exp(shifted) if shifted.min() >= _EXP_NORMAL else _exp_flushed(shifted)
    norm = exp_shifted.sum(axis=0)
    log_norm = np.log(norm)
    log_sigma = shifted - log_norm
    log_delta_i = None
    if log_delta:  # δ_i = Σ_t σ_it Δ_it in log space (logsumexp, max-subtracted)
        a = log_sigma + log_score_gap
        top = a.max(axis=0)
        top = np.where(np.isfinite(top), top, 0.0)
        log_delta_i = np.log(_exp(a - top).sum(axis=0)) + top
    # The reference token r_i, np.argmax's choice (the first maximum of log σ_i). max_t log σ_it is
    # exactly 0 − log Σ_t exp(shifted): the maximum of the shifted logits is 0.
    ref = np.flatnonzero(log_sigma == -log_norm)  # flat indices t·(B·n) + sample, one per sample unless tied
    if len(ref) != B * n or np.isnan(log_norm).any():  # a tie (e.g. at θ = 0) or a NaN
        ref = np.flatnonzero(np.arange(T)[:, None, None] == np.argmax(log_sigma, axis=0))
    sample = ref % (B * n)
    gamma_ref = np.empty(B * n)
    gamma_ref[sample] = gamma.reshape(-1)[ref]
    gamma_ref = gamma_ref.reshape(B, n)
    ref_gap = gamma_ref - gamma  # γ_ir − γ_it
    ref_minus_output = (exp_shifted * ref_gap).sum(axis=0) / norm  # γ_ir − u_i = Σ_τ σ_iτ (γ_ir − γ_iτ)
    output = gamma_ref - ref_minus_output
    # u_i − γ_it (= −(γ_it − u_i) exactly: IEEE subtraction is antisymmetric), cancellation-free
    neg_diff = ref_gap - ref_minus_output
    log_abs = np.log(np.abs(neg_diff))  # log |w_it| = log|u_i − γ_it| + log(−ℓ'(u_i)/n) + log σ_it
    log_abs += loss.log_slope(output) - np.log(n)
    log_abs += log_sigma
    log_abs.reshape(-1)[ref] = -np.inf
    # the largest per member, over tokens then samples (a max over the short last axis of (B, n) is
    # several times slower than over the leading axis of its transposed copy; the same maxima)
    m = np.ascontiguousarray(log_abs.max(axis=0).T).max(axis=0)
    finite_m = np.where(np.isfinite(m), m, 0.0)
    log_abs -= np.repeat(finite_m, n).reshape(B, n)  # along every token: a (B, n) row, not a (B, 1) column
    w_scaled = np.copysign(_exp_flushed(log_abs), neg_diff)  # −sign(γ_it − u_i)·exp(…); 0 where exp(…) < 1e−304
    w_scaled.reshape(-1)[ref] = -w_scaled.sum(axis=0).reshape(-1)[sample]
    return log_sigma, log_delta_i, output, m, w_scaled


class _LinearLogits:
    """Evaluation shared by a problem and a stack of problems (the :class:`AttentionProblem` protocol).

    Subclasses provide ``n, T, shape, size, gamma, gamma_opt, score_gap, loss`` and the three
    array methods :meth:`flatten` (validate θ and flatten it), :meth:`logits_flat` and
    :meth:`adjoint_flat`.
    """

    def logits(self, theta) -> np.ndarray:
        """``s_it = ⟨θ, A_it⟩``: (*batch, n, T)."""
        return self.logits_flat(self.flatten(theta)[0])

    def log_attention(self, theta) -> np.ndarray:
        """``log σ_it`` (stable log-softmax over tokens): (*batch, n, T)."""
        return log_softmax(self.logits(theta), axis=-1)

    def attention(self, theta) -> np.ndarray:
        """``σ_it``: (*batch, n, T)."""
        return np.exp(self.log_attention(theta))

    def terms(self, theta) -> Terms:
        """The per-sample :class:`Terms` at ``theta`` (*batch, *shape)."""
        return self.terms_from_flat(self.flatten(theta)[0])

    def terms_from_flat(self, flat: np.ndarray) -> Terms:
        """The per-sample :class:`Terms` at parameters given flat, ``(*batch, size)``."""
        return _deficit_terms(log_softmax(self.logits_flat(flat)), self.log_score_gap, self.gamma_opt)

    @cached_property
    def log_score_gap(self) -> np.ndarray:
        """``log(γ_i,opt − γ_it)`` (``−inf`` at the optimal tokens): (*stack, n, T), computed once."""
        with np.errstate(divide="ignore"):
            return np.log(self.score_gap)

    def output(self, theta) -> np.ndarray:
        """Signed outputs ``u_i = y_i f(X_i) = Σ_t σ_it γ_it``: (*batch, n)."""
        return self.terms(theta).output

    def value(self, theta) -> np.ndarray:
        """``L(θ)``: (*batch,)."""
        return np.mean(self.loss.value(self.output(theta)), axis=-1)

    def log_gap_from(self, terms: Terms) -> np.ndarray:
        """``log(L − L*)`` (*batch,) from the :class:`Terms` of a batch."""
        per_sample = self.loss.log_excess(self.gamma_opt, terms.log_delta)
        return logsumexp(per_sample, axis=-1) - np.log(self.n)

    def log_gap(self, theta) -> np.ndarray:
        """``log(L − L*)``, accurate where ``L − L*`` itself underflows: (*batch,)."""
        return self.log_gap_from(self.terms(theta))

    def gap(self, theta) -> np.ndarray:
        """``L − L* ≥ 0`` computed without subtracting L*: (*batch,)."""
        return np.mean(self.loss.excess(self.gamma_opt, np.exp(self.terms(theta).log_delta)), axis=-1)

    def scaled_grad_from(self, terms: Terms, batch=None) -> tuple[np.ndarray, np.ndarray]:
        """``(log_scale (*batch,), g)`` with ∇L = exp(log_scale)·g from the :class:`Terms` of a batch;
        ``g`` is flat, ``(*batch, size)``, unless ``batch`` is given, then ``(*batch, *shape)``."""
        m, w = _scaled_weights(terms.log_sigma, self.gamma, terms.output, self.loss)
        g = self.adjoint_flat(w)
        return m, g if batch is None else g.reshape(tuple(batch) + self.shape)

    def _token_major(self, B: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``γ`` and ``log Δ`` laid out (T, B, n) and ``γ_opt`` (B, n) for a batch of ``B`` members, cached.

        ``B`` is a multiple of the stack size (1 for one problem): the problem's arrays are tiled.
        """
        cache = self.__dict__.setdefault("_token_major_cache", {})
        if B not in cache:
            n, T = self.n, self.T
            P = self.gamma.size // (n * T)  # problems in the stack (1 for one problem)
            tiled = [np.broadcast_to(a.reshape(P, n, T), (B // P, P, n, T)) for a in (self.gamma, self.log_score_gap)]
            per_token = tuple(np.ascontiguousarray(a.reshape(B, n, T).transpose(2, 0, 1)) for a in tiled)
            gamma_opt = np.broadcast_to(self.gamma_opt.reshape(P, n), (B // P, P, n)).reshape(B, n)
            cache[B] = per_token + (np.ascontiguousarray(gamma_opt),)
        return cache[B]

    def _logits_token_major(self, flat: np.ndarray, B: int) -> np.ndarray:
        """The logits of flat parameters (*batch, size) laid out (T, B, n), contiguous, for :meth:`step_from_flat`."""
        return np.ascontiguousarray(self.logits_flat(flat).reshape(B, self.n, self.T).transpose(2, 0, 1))

    def step_from_flat(self, flat: np.ndarray, log_delta: bool = True) -> tuple[Terms, np.ndarray, np.ndarray]:
        """:meth:`terms_from_flat` and :meth:`scaled_grad_from` in one pass: ``(terms, m (*batch,), g (*batch, size))``.

        The trainers' step: the same numbers as the two calls up to rounding (:func:`_fused_step`
        computes them on a tokens-first layout, several times faster on the book's small stacks);
        ``terms.log_sigma`` is a view of that layout. ``log_delta=False`` leaves
        ``terms.log_delta`` None (not computed): for steps that read neither the loss gap nor
        anything derived from it.
        """
        lead = flat.shape[:-1]
        B, n, T = math.prod(lead), self.n, self.T
        logits = self._logits_token_major(flat, B)
        gamma, log_score_gap, gamma_opt = self._token_major(B)
        with np.errstate(divide="ignore"):
            log_sigma, log_d, output, m, w = _fused_step(logits, gamma, log_score_gap, gamma_opt, self.loss, log_delta)
        log_sigma = log_sigma.transpose(1, 2, 0).reshape(lead + (n, T))
        log_d = None if log_d is None else log_d.reshape(lead + (n,))
        terms = Terms(log_sigma, log_d, output.reshape(lead + (n,)))
        g = self.adjoint_flat(np.ascontiguousarray(w.transpose(1, 2, 0)).reshape(lead + (n, T)))
        return terms, m.reshape(lead), g

    def scaled_grad(self, theta) -> tuple[np.ndarray, np.ndarray]:
        """``∇L = exp(log_scale) · g`` with ``g`` of order one: ``(log_scale (*batch,), g (*batch, *shape))``.

        The direction ``g/‖g‖`` is exact even when ``‖∇L‖`` is below the smallest float.
        """
        flat, batch = self.flatten(theta)
        m, g = self.scaled_grad_from(self.terms_from_flat(flat))
        return m, g.reshape(batch + self.shape)

    def grad(self, theta) -> np.ndarray:
        """``∇L(θ)``: (*batch, *shape) (cancellation-free form)."""
        m, g = self.scaled_grad(theta)
        scale = np.exp(m).reshape(m.shape + (1,) * len(self.shape))
        return scale * g

    def selection(self, theta) -> np.ndarray:
        """The token each sample attends to most, ``argmax_t σ_it``: (*batch, n)."""
        return np.argmax(self.logits(theta), axis=-1)


def terms_and_scaled_grad(
    prob: AttentionProblem, flat: np.ndarray, log_delta: bool = True
) -> tuple[Terms, np.ndarray, np.ndarray]:
    """``(terms, log_scale, g)`` at flat parameters ``(*batch, size)``: the trainers' step.

    ``prob.terms_from_flat`` then ``prob.scaled_grad_from`` (``g`` flat), fused for the problems
    with logits linear in θ (:meth:`_LinearLogits.step_from_flat`, the same numbers up to
    rounding). ``log_delta=False`` lets a fused step skip ``terms.log_delta`` (then None), which
    only ``log_gap_from`` reads; other problems compute it anyway.
    """
    if isinstance(prob, _LinearLogits):
        return prob.step_from_flat(flat, log_delta)
    terms = prob.terms_from_flat(flat)
    return (terms, *prob.scaled_grad_from(terms))


@dataclass(frozen=True, eq=False)
class TokenSelectionProblem(_LinearLogits):
    """Logit features ``A`` (n, T, *shape), scores ``gamma`` (n, T) and a loss.

    Every method accepts ``theta`` of shape ``(*batch, *shape)`` and returns arrays with the
    leading ``batch`` axes: a batch of initialisations is evaluated in one set of array operations.

    >>> import numpy as np, attnlib as al
    >>> X = np.array([[[-0.1, 1.0, 1.0], [1.0, 0.0, 0.9], [0.0, 0.0, 0.9]]])
    >>> prob = al.prompt_attention(X, [1], v=[0, 0, 1], W=np.diag([1.0, 1.0, 0.0]))
    >>> prob.n, prob.T, prob.shape, prob.opt.tolist()
    (1, 3, (3,), [0])
    >>> bool(prob.gap(np.zeros(3)) > 0)
    True
    """

    A: np.ndarray
    gamma: np.ndarray
    loss: Loss
    #: Optional rank-one structure ``A_it = x_it z_iᵀ`` as ``(X (n, T, d), Z (n, d_z))``: the
    #: self-attention constructor sets it so that logits and gradients cost O(n·T·d + n·d·d_z)
    #: per trajectory instead of O(n·T·d·d_z). Results are identical.
    factors: tuple | None = None

    def __post_init__(self):
        A = finite_array("A", self.A)
        gamma = finite_array("gamma", self.gamma, ndim=2)
        if A.ndim < 3 or A.shape[:2] != gamma.shape:
            raise ValueError(
                f"A must have shape (n, T, *param_shape) matching gamma's (n, T) = {gamma.shape}, got {A.shape}"
            )
        if gamma.shape[1] < 2:
            raise ValueError(f"each sample needs at least T=2 tokens, got T={gamma.shape[1]}")
        top2 = np.sort(gamma, axis=1)[:, -2:]
        ties = np.flatnonzero(top2[:, 1] == top2[:, 0])
        if ties.size:
            raise ValueError(
                f"the optimal token must be unique in every sample; samples {ties.tolist()} "
                "have two tokens sharing the highest score"
            )
        A.flags.writeable = False
        gamma.flags.writeable = False
        object.__setattr__(self, "A", A)
        object.__setattr__(self, "gamma", gamma)
        object.__setattr__(self, "loss", get_loss(self.loss))
        if self.factors is not None:
            X, Z = (np.asarray(f, float) for f in self.factors)
            if A.ndim != 4 or not np.allclose(X[:, :, :, None] * Z[:, None, None, :], A, rtol=0, atol=1e-12):
                raise ValueError("factors (X, Z) must satisfy A_it = x_it z_iᵀ")
            object.__setattr__(self, "factors", (X, Z))

    # ------------------------------------------------------------------ sizes and constants
    @property
    def n(self) -> int:
        return self.gamma.shape[0]

    @property
    def T(self) -> int:
        return self.gamma.shape[1]

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the parameter θ: ``(d,)`` for p, ``(d, d)`` for W."""
        return self.A.shape[2:]

    @property
    def size(self) -> int:
        return math.prod(self.shape)  # an int product without a numpy reduction (read at every step)

    @cached_property
    def opt(self) -> np.ndarray:
        """``opt_i = argmax_t γ_it``, shape (n,)."""
        return np.argmax(self.gamma, axis=1)

    @cached_property
    def gamma_opt(self) -> np.ndarray:
        return self.gamma[np.arange(self.n), self.opt]

    @cached_property
    def score_gap(self) -> np.ndarray:
        """``γ_i,opt − γ_it ≥ 0``, shape (n, T), zero exactly at the optimal tokens."""
        return self.gamma_opt[:, None] - self.gamma

    @cached_property
    def loss_floor(self) -> float:
        """``L* = (1/n) Σ_i ℓ(γ_i,opt)``: the infimum of L, approached only as ‖θ‖ → ∞."""
        return float(np.mean(self.loss.value(self.gamma_opt)))

    @cached_property
    def features_from_opt(self) -> np.ndarray:
        """``A_it − A_i,opt`` flattened to (n·T, size): the directions every gradient combines."""
        A = self.A.reshape(self.n, self.T, self.size)
        return (A - A[np.arange(self.n), self.opt][:, None, :]).reshape(self.n * self.T, self.size)

    @cached_property
    def _keys_from_opt(self) -> np.ndarray:
        """For rank-one features: ``x_it − x_i,opt``, (n, T, d)."""
        X = self.factors[0]
        return X - X[np.arange(self.n), self.opt][:, None, :]

    def logits_flat(self, flat: np.ndarray) -> np.ndarray:
        """``s_it = ⟨θ, A_it⟩`` for flat parameters ``(*batch, size)``: (*batch, n, T)."""
        lead = flat.shape[:-1]
        if self.factors is None:
            return (flat @ self._features_flat).reshape(lead + (self.n, self.T))
        X, Z = self.factors
        B = math.prod(lead)
        # Batched BLAS products: (W z_i) for all i, then x_itᵀ (W z_i) sample by sample.
        Wz = flat.reshape((B,) + self.shape) @ Z.T  # (B, d, n)
        logits = X @ np.transpose(Wz, (2, 1, 0))  # (n, T, d) @ (n, d, B) -> (n, T, B)
        return logits.transpose(2, 0, 1).reshape(lead + (self.n, self.T))

    def adjoint_flat(self, w: np.ndarray) -> np.ndarray:
        """``Σ_it w_it (A_it − A_i,opt)`` for weights ``(*batch, n, T)``: (*batch, size)."""
        lead = w.shape[:-2]
        if self.factors is None:
            return w.reshape(lead + (self.n * self.T,)) @ self.features_from_opt
        B = math.prod(lead)
        mixed = w.reshape(B, self.n, self.T).transpose(1, 0, 2) @ self._keys_from_opt  # (n, B, d)
        d = mixed.shape[-1]
        g = mixed.transpose(1, 2, 0).reshape(B * d, self.n) @ self.factors[1]  # (B·d, d_z)
        return g.reshape(lead + (self.size,))

    @cached_property
    def _features_flat(self) -> np.ndarray:
        return np.ascontiguousarray(self.A.reshape(self.n * self.T, self.size).T)

    def flatten(self, theta) -> tuple[np.ndarray, tuple[int, ...]]:
        """Validate ``theta`` (*batch, *shape): ``(flat (*batch, size), batch)``."""
        theta = np.asarray(theta, dtype=float)
        k = len(self.shape)
        if theta.ndim < k or theta.shape[theta.ndim - k :] != self.shape:
            raise ValueError(f"theta must have shape (*batch, {', '.join(map(str, self.shape))}), got {theta.shape}")
        batch = theta.shape[: theta.ndim - k]
        return theta.reshape(batch + (self.size,)), batch


def token_selection(A, gamma, loss: str | Loss = "logistic") -> TokenSelectionProblem:
    """A problem from its logit features ``A`` (n, T, *shape) and scores ``gamma`` (n, T)."""
    return TokenSelectionProblem(A, gamma, loss)


def prompt_attention(X, y, v, W=None, loss: str | Loss = "logistic") -> TokenSelectionProblem:
    """[MMTS] prompt attention ``f(X) = vᵀ Xᵀ softmax(X Wᵀ p)`` with ``v`` and ``W`` fixed.

    Logit features are the keys ``k_it = W x_it`` and scores are ``γ_it = y_i vᵀ x_it``.

    Args:
        X: (n, T, d) tokens.  y: (n,) labels ±1.  v: (d,) linear head.
        W: (d_k, d) key matrix (identity if None); the parameter ``p`` has shape (d_k,).
        loss: "logistic", "exponential" or "linear".

    >>> import numpy as np, attnlib as al
    >>> X = np.array([[[0.0, 0.0], [1.0, 1.0]]])
    >>> al.prompt_attention(X, [1], v=[0.0, 1.0]).gamma.tolist()
    [[0.0, 1.0]]
    """
    X = finite_array("X", X, ndim=3)
    n, T, d = X.shape
    y = check_labels(y, n)
    v = finite_array("v", v, ndim=1)
    if v.shape != (d,):
        raise ValueError(f"v must have shape ({d},) to match the token dimension d={d}, got {v.shape}")
    W = np.eye(d) if W is None else finite_array("W", W, ndim=2)
    if W.shape[1] != d:
        raise ValueError(f"W must have shape (d_k, {d}), got {W.shape}")
    keys = X @ W.T
    return TokenSelectionProblem(keys, y[:, None] * (X @ v), loss)


def self_attention(X, y, u, Z=None, loss: str | Loss = "logistic") -> TokenSelectionProblem:
    """[FAST]/[TFSVM] self-attention ``f(X) = uᵀ Xᵀ softmax(X W z)`` with a fixed decoder ``u``.

    Logits ``s_it = x_itᵀ W z_i = ⟨W, x_it z_iᵀ⟩_F``: the features are ``A_it = x_it z_iᵀ``
    (this book's one convention for W). Scores ``γ_it = y_i uᵀ x_it``.

    Args:
        X: (n, T, d) tokens.  y: (n,) labels ±1.  u: (d,) decoder.
        Z: (n, d_z) queries; ``None`` uses the first token ``z_i = x_i1`` (self-attention); pass a
            separate array for cross-attention. W has shape (d, d_z).

    >>> import numpy as np, attnlib as al
    >>> X = np.random.default_rng(0).normal(size=(4, 5, 3))
    >>> al.self_attention(X, [1, -1, 1, -1], u=[1.0, 0, 0]).shape
    (3, 3)
    """
    X = finite_array("X", X, ndim=3)
    n, T, d = X.shape
    y = check_labels(y, n)
    u = finite_array("u", u, ndim=1)
    if u.shape != (d,):
        raise ValueError(f"u must have shape ({d},) to match the token dimension d={d}, got {u.shape}")
    Z = X[:, 0, :] if Z is None else finite_array("Z", Z, ndim=2)
    if Z.shape[0] != n:
        raise ValueError(f"Z must have one query per sample, shape ({n}, d_z), got {Z.shape}")
    prob = TokenSelectionProblem(X[:, :, :, None] * Z[:, None, None, :], y[:, None] * (X @ u), loss)
    # A is the product of the factors by construction: attach them without the elementwise check
    # that __post_init__ makes for factors given from outside (a third of building the problem).
    object.__setattr__(prob, "factors", (X, Z))
    return prob


@dataclass(frozen=True, eq=False)
class ProblemStack(_LinearLogits):
    """S problems of equal ``n``, ``T``, parameter shape and loss, evaluated member by member.

    Parameters carry the problem axis just before the parameter axes, ``theta`` (*batch, S, *shape),
    and every method returns arrays with those leading axes: ``value`` is (*batch, S), ``logits``
    (*batch, S, n, T). :func:`attnlib.train` steps one trajectory per problem in one set of array
    operations, so a sweep over seeds (different data) is a batch like a sweep over initialisations.

    >>> import numpy as np, attnlib as al
    >>> stack = al.stack_problems([al.datasets.random_tokens(6, 8, 10, seed=s) for s in range(3)])
    >>> stack.S, stack.value(np.zeros((3, 10, 10))).shape
    (3, (3,))
    """

    problems: tuple

    def __post_init__(self):
        problems = tuple(self.problems)
        if not problems or not all(isinstance(p, TokenSelectionProblem) for p in problems):
            raise ValueError("problems must be a non-empty sequence of TokenSelectionProblem")
        first = problems[0]
        for k, p in enumerate(problems):
            if (p.n, p.T, p.shape, p.loss.name) != (first.n, first.T, first.shape, first.loss.name):
                raise ValueError(
                    f"problems must share n, T, parameter shape and loss; problem {k} has "
                    f"(n={p.n}, T={p.T}, shape={p.shape}, loss={p.loss.name!r}), problem 0 has "
                    f"(n={first.n}, T={first.T}, shape={first.shape}, loss={first.loss.name!r})"
                )
        object.__setattr__(self, "problems", problems)

    S = property(lambda self: len(self.problems), doc="Number of problems.")
    n = property(lambda self: self.problems[0].n)
    T = property(lambda self: self.problems[0].T)
    shape = property(lambda self: self.problems[0].shape)
    size = property(lambda self: self.problems[0].size)
    loss = property(lambda self: self.problems[0].loss)

    @cached_property
    def gamma(self) -> np.ndarray:
        """(S, n, T)."""
        return np.stack([p.gamma for p in self.problems])

    @cached_property
    def opt(self) -> np.ndarray:
        """(S, n)."""
        return np.stack([p.opt for p in self.problems])

    @cached_property
    def gamma_opt(self) -> np.ndarray:
        return np.stack([p.gamma_opt for p in self.problems])

    @cached_property
    def score_gap(self) -> np.ndarray:
        return np.stack([p.score_gap for p in self.problems])

    @cached_property
    def loss_floor(self) -> np.ndarray:
        """(S,)."""
        return np.array([p.loss_floor for p in self.problems])

    @cached_property
    def _features_flat(self) -> np.ndarray:
        return np.stack([p._features_flat for p in self.problems])  # (S, size, n·T)

    @cached_property
    def features_from_opt(self) -> np.ndarray:
        """``A_it − A_i,opt`` of every problem: (S, n·T, size)."""
        return np.stack([p.features_from_opt for p in self.problems])  # (S, n·T, size)

    def flatten(self, theta) -> tuple[np.ndarray, tuple[int, ...]]:
        """Validate ``theta`` (*batch, S, *shape): ``(flat (*batch, S, size), (*batch, S))``."""
        theta = np.asarray(theta, dtype=float)
        k = len(self.shape) + 1
        if theta.ndim < k or theta.shape[theta.ndim - k :] != (self.S,) + self.shape:
            raise ValueError(
                f"theta must have shape (*batch, S={self.S}, {', '.join(map(str, self.shape))}), got {theta.shape}"
            )
        batch = theta.shape[: theta.ndim - k + 1]
        return theta.reshape(batch + (self.size,)), batch

    @cached_property
    def factors(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Stacked rank-one factors ``(X (S, n, T, d), Zᵀ (S, d_z, n))`` when every problem has them, else None."""
        if any(p.factors is None for p in self.problems):
            return None
        X = np.stack([p.factors[0] for p in self.problems])
        Zt = np.ascontiguousarray(np.stack([p.factors[1] for p in self.problems]).transpose(0, 2, 1))
        return X, Zt

    @cached_property
    def _keys_from_opt(self) -> np.ndarray:
        """For rank-one features: ``x_it − x_i,opt`` of every problem, (S, n, T, d)."""
        return np.stack([p._keys_from_opt for p in self.problems])

    def logits_flat(self, flat: np.ndarray) -> np.ndarray:
        """Logits of every problem for flat parameters (*batch, S, size): (*batch, S, n, T)."""
        if self.factors is None:
            logits = (flat[..., None, :] @ self._features_flat)[..., 0, :]  # batched over problems
            return logits.reshape(flat.shape[:-1] + (self.n, self.T))
        # Rank-one features x_it z_iᵀ: W z_i for every sample, then x_itᵀ (W z_i), in
        # O(d·d_z·n + n·T·d) per problem instead of O(n·T·d·d_z).
        X, Zt = self.factors
        Wz = flat.reshape(flat.shape[:-1] + self.shape) @ Zt  # (*batch, S, d, n)
        return (X @ np.swapaxes(Wz, -1, -2)[..., None])[..., 0]

    def _logits_token_major(self, flat: np.ndarray, B: int) -> np.ndarray:
        """:meth:`logits_flat` laid out (T, B, n) for the fused step; flat (*batch, S, size), B = prod(batch)·S."""
        if self.factors is None:
            return super()._logits_token_major(flat, B)
        # Rank-one features: x_itᵀ (W z_j) for every pair of samples i, j of a problem in one
        # batched product (S BLAS calls of (n·T, d) by (d, n)) and keep the diagonal i = j: n
        # times the arithmetic of the sample-by-sample products of logits_flat, but S calls
        # instead of S·n, which is what costs at these sizes. Equal to logits_flat up to rounding.
        X, Zt = self.factors
        S, n, T = self.S, self.n, self.T
        Wz = flat.reshape((B // S, S) + self.shape) @ Zt  # (B/S, S, d, n)
        pairs = (X.reshape(S, n * T, X.shape[-1]) @ Wz).reshape(B, n, T, n)  # x_itᵀ W z_j
        return np.ascontiguousarray(np.diagonal(pairs, axis1=1, axis2=3).transpose(1, 0, 2))

    def adjoint_flat(self, w: np.ndarray) -> np.ndarray:
        """``Σ_it w_it (A_it − A_i,opt)`` problem by problem, weights (*batch, S, n, T): (*batch, S, size)."""
        lead = w.shape[:-2]
        if self.factors is None:
            return (w.reshape(lead + (1, self.n * self.T)) @ self.features_from_opt)[..., 0, :]
        # Σ_i (Σ_t w_it (x_it − x_i,opt)) z_iᵀ
        mixed = (w[..., None, :] @ self._keys_from_opt)[..., 0, :]  # (*batch, S, n, d)
        return (np.swapaxes(mixed, -1, -2) @ np.swapaxes(self.factors[1], -1, -2)).reshape(lead + (self.size,))


def stack_problems(problems) -> ProblemStack:
    """Stack problems of equal sizes (e.g. one per seed) to train them as one batch."""
    return ProblemStack(tuple(problems))


@runtime_checkable
class JointProblem(Protocol):
    """What :func:`attnlib.optim.train_joint_problem` needs from a problem with a trainable head.

    A logit parameter ``p`` (*batch, d_k) (``d_k = keys.shape[-1]``) and a head ``v`` (*batch, d)
    (``d = X.shape[-1]``) with the same batch axes:

    - :meth:`value` ``L(p, v)``: (*batch,);
    - :meth:`scaled_grad` ``((m_p, g_p), (m_v, g_v))`` with ``∇_p L = exp(m_p) g_p`` (*batch, d_k)
      and ``∇_v L = exp(m_v) g_v`` (*batch, d), each ``g`` of order one.

    :class:`JointAttention`, :class:`attnlib.model.StackedJointAttention` and
    :class:`attnlib.model.DecoderAttention` implement it.
    """

    X: np.ndarray
    keys: np.ndarray

    def value(self, p, v) -> np.ndarray: ...

    def scaled_grad(self, p, v) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]: ...


@dataclass(frozen=True, eq=False)
class JointAttention:
    """[MMTS] prompt attention with a *trainable* head: ``L(p, v) = (1/n) Σ_i ℓ(y_i vᵀ X_iᵀ σ_i(p))``.

    The scores ``γ_it = y_i vᵀ x_it`` move with ``v``, so the reference token of the
    cancellation-free gradient is the current best-scoring one, per sample and per batch member.

    Attributes: ``X`` (n, T, d), ``y`` (n,), ``W`` (d_k, d) keys ``k_it = W x_it``, ``loss``.
    Methods take ``p`` (*batch, d_k) and ``v`` (*batch, d) with the same batch axes.

    >>> import numpy as np, attnlib as al
    >>> X = np.array([[[0, 0], [1, 1]], [[0, 0], [1, -1]], [[0, 0], [0.5, 1]]], float)
    >>> joint = al.JointAttention(X, np.array([1.0, -1, 1]), np.eye(2), al.get_loss("logistic"))
    >>> gp, gv = joint.grad(np.array([0.0, -1]), np.array([-1.0, 0]))
    >>> gp.shape, gv.shape
    ((2,), (2,))
    """

    X: np.ndarray
    y: np.ndarray
    W: np.ndarray
    loss: Loss

    #: einsum subscript of the data axes in front of ``(n, T, ·)`` of ``X`` and ``keys``: none for
    #: one data set, ``"..."`` for one data set per batch row (:class:`attnlib.model.StackedJointAttention`).
    _data_axes = ""

    def __post_init__(self):
        X = finite_array("X", self.X, ndim=3)
        y = check_labels(self.y, X.shape[0])
        W = finite_array("W", self.W, ndim=2)
        if W.shape[1] != X.shape[2]:
            raise ValueError(f"W must have shape (d_k, {X.shape[2]}), got {W.shape}")
        object.__setattr__(self, "X", X)
        object.__setattr__(self, "y", y)
        object.__setattr__(self, "W", W)
        object.__setattr__(self, "loss", get_loss(self.loss))

    @cached_property
    def keys(self) -> np.ndarray:
        """``k_it = W x_it``: (n, T, d_k)."""
        return self.X @ self.W.T

    @cached_property
    def _keys_from_first(self) -> np.ndarray:
        """``k_it − k_i1`` (the weights of a sample sum to zero, so any base token will do), kept."""
        return self.keys - self.keys[..., :1, :]

    def scores(self, v) -> np.ndarray:
        """``γ_it = y_i vᵀ x_it``: (*batch, n, T)."""
        v = np.asarray(v, float)
        return self.y[..., None] * np.einsum(f"...d,{self._data_axes}itd->...it", v, self.X)

    def log_attention(self, p) -> np.ndarray:
        """``log σ_it(p)``: (*batch, n, T)."""
        logits = np.einsum(f"...k,{self._data_axes}itk->...it", np.asarray(p, float), self.keys)
        return log_softmax(logits, axis=-1)

    def _terms(self, p, v):
        gamma = self.scores(v)
        ref = np.argmax(gamma, axis=-1)
        gamma_ref = np.take_along_axis(gamma, ref[..., None], axis=-1)[..., 0]
        with np.errstate(divide="ignore"):
            log_score_gap = np.log(gamma_ref[..., None] - gamma)
        return _deficit_terms(self.log_attention(p), log_score_gap, gamma_ref), gamma

    def output(self, p, v) -> np.ndarray:
        """``u_i = y_i f(X_i)``: (*batch, n)."""
        return self._terms(p, v)[0].output

    def value(self, p, v) -> np.ndarray:
        """``L(p, v)``: (*batch,)."""
        return np.mean(self.loss.value(self.output(p, v)), axis=-1)

    def scaled_grad(self, p, v):
        """``((log_scale_p, g_p), (log_scale_v, g_v))`` with ``∇ = exp(log_scale)·g``."""
        return self.weighted_scaled_grad(p, v)[0]

    def _keys_adjoint(self, w: np.ndarray) -> np.ndarray:
        """``Σ_it w_it (k_it − k_i1)`` for weights (*batch, n, T): (*batch, d_k)."""
        return np.einsum(f"...it,{self._data_axes}itk->...k", w, self._keys_from_first)

    def weighted_scaled_grad(self, p, v, sample_weight=None):
        """The gradient of ``Σ_i c_i ℓ(u_i)`` and the outputs, from one evaluation of the attention.

        ``sample_weight`` (*batch, n): the weights ``c_i ≥ 0`` (``None``: ``1/n``, the loss ``L``;
        a mini-batch's ``1/b`` on its ``b`` samples and 0 elsewhere: its loss, [FAST]'s SGD/SNGD/SPS).
        Returns ``(((log_scale_p, g_p), (log_scale_v, g_v)), u)``, ``∇ = exp(log_scale)·g`` and ``u``
        (*batch, n) the signed outputs (so the weighted loss is ``Σ_i c_i ℓ(u_i)`` at no extra cost).

        >>> import numpy as np, attnlib as al
        >>> X = np.array([[[0, 0], [1, 1]], [[0, 0], [1, -1]], [[0, 0], [0.5, 1]]], float)
        >>> joint = al.JointAttention(X, np.array([1.0, -1, 1]), np.eye(2), "logistic")
        >>> p, v = np.array([0.2, -1]), np.array([-1.0, 0.5])
        >>> (mp, gp), (mv, gv) = joint.weighted_scaled_grad(p, v, np.array([0.5, 0.5, 0.0]))[0]
        >>> sub = al.JointAttention(X[:2], np.array([1.0, -1]), np.eye(2), "logistic")
        >>> bool(np.allclose(np.exp(mp) * gp, sub.grad(p, v)[0]) and np.allclose(np.exp(mv) * gv, sub.grad(p, v)[1]))
        True
        """
        terms, gamma = self._terms(p, v)
        m_p, w = _scaled_weights(terms.log_sigma, gamma, terms.output, self.loss, sample_weight)
        g_p = self._keys_adjoint(w)
        with np.errstate(divide="ignore"):
            log_neg_dloss = self.loss.log_slope(terms.output)  # (*batch, n)
            if sample_weight is not None:  # weights 0 give -inf: those samples drop out
                log_neg_dloss = log_neg_dloss + np.log(sample_weight)
        m_v = np.max(log_neg_dloss, axis=-1)
        if sample_weight is None:
            coef = -self.y * np.exp(log_neg_dloss - m_v[..., None]) / self.X.shape[-3]
        else:  # a batch whose every weight or loss derivative is 0 has the gradient 0, not NaN
            coef = -self.y * np.exp(log_neg_dloss - np.where(np.isfinite(m_v), m_v, 0.0)[..., None])
        g_v = np.einsum("...i,...id->...d", coef, self._mean_tokens(np.exp(terms.log_sigma)))
        return ((m_p, g_p), (m_v, g_v)), terms.output

    def _mean_tokens(self, sigma: np.ndarray) -> np.ndarray:
        """``Σ_t σ_it x_it`` for attention (*batch, n, T): (*batch, n, d)."""
        return np.einsum(f"...it,{self._data_axes}itd->...id", sigma, self.X)

    def grad(self, p, v) -> tuple[np.ndarray, np.ndarray]:
        """``(∇_p L, ∇_v L)``: shapes (*batch, d_k) and (*batch, d)."""
        (m_p, g_p), (m_v, g_v) = self.scaled_grad(p, v)
        return np.exp(m_p)[..., None] * g_p, np.exp(m_v)[..., None] * g_v


# ---------------------------------------------------------------------- logistic regression, reduction
def logistic_regression(X, y) -> TokenSelectionProblem:
    """Linear logistic regression ``L(w) = (1/n) Σ_i log(1 + e^{−y_i wᵀx_i})`` as token selection.

    Sample ``i`` gets two tokens with features ``y_i x_i`` and ``0`` and scores 1 and 0, and the
    loss is :data:`CROSS_ENTROPY`; ``σ_i1 = sigmoid(y_i wᵀx_i)``. The loss floor is ``L* = 0`` and
    :func:`attnlib.max_margin` returns the hard-margin SVM ``min ‖w‖ s.t. y_i wᵀx_i ≥ 1``
    (no bias), the limit direction of GD (Soudry et al. 2018).

    Args: ``X`` (n, d) points, ``y`` (n,) labels ±1.

    >>> import numpy as np, attnlib as al
    >>> X, y, w = np.array([[1.0, 0.0], [0.0, -2.0]]), np.array([1.0, -1.0]), np.array([0.3, -0.2])
    >>> prob = logistic_regression(X, y)
    >>> bool(np.isclose(prob.value(w), np.mean(np.logaddexp(0, -y * (X @ w)))))
    True
    """
    X = np.asarray(X, float)
    y = np.asarray(y, float)
    if X.ndim != 2:
        raise ValueError(f"X must be (n, d), got {X.shape}")
    y = check_labels(y, X.shape[0])
    A = np.stack([y[:, None] * X, np.zeros_like(X)], axis=1)  # (n, 2, d)
    gamma = np.tile([1.0, 0.0], (X.shape[0], 1))
    return token_selection(A, gamma, CROSS_ENTROPY)


@dataclass(frozen=True, eq=False)
class Reduced:
    """A problem rewritten in an orthonormal basis of the span of its feature differences.

    Attributes:
        problem: the reduced problem; its parameter is a vector ``c`` of length ``size``.
        source: the original problem.
        coef: (n·T, r) the basis as combinations of the differences ``A_it − A_i,opt``:
            ``b_r = Σ_it coef[(i, t), r] (A_it − A_i,opt)``, orthonormal.
    ``θ = Σ_r c_r b_r`` has the same logit differences, loss, gradient direction, norm and
    ATT-SVM as ``c``; :meth:`lift` computes it.
    """

    problem: TokenSelectionProblem
    source: TokenSelectionProblem
    coef: np.ndarray

    @property
    def rank(self) -> int:
        return self.coef.shape[1]

    def lift(self, c) -> np.ndarray:
        """``c`` (*batch, size) to ``θ`` (*batch, *shape) of the original problem."""
        c = np.asarray(c, float)
        src = self.source
        weights = (c[..., : self.rank] @ self.coef.T).reshape(c.shape[:-1] + (src.n, src.T))
        return src.adjoint_flat(weights).reshape(c.shape[:-1] + tuple(src.shape))


def reduce_to_span(prob: TokenSelectionProblem, size: int | None = None, rtol: float = 1e-6) -> Reduced:
    """Restrict ``prob`` to ``span{A_it − A_is}``: exact for trajectories from ``θ_0 = 0``.

    Every gradient is ``Σ_it w_it (A_it − A_i,opt)`` and the softmax sees only logit differences,
    so from ``θ_0 = 0`` the iterates of GD, NGD and Polyak stay in the span, and the ATT-SVM
    solution of any selection lies in it (its constraints are differences). In an orthonormal
    basis ``b_1..b_r`` of the span, ``θ = Σ_r c_r b_r`` is an isometry: norms, cosines, margins
    and softmax masses are unchanged. The reduced features are ``⟨A_it − A_i,opt, b_r⟩`` (each
    sample's logits shift by a constant, which the softmax ignores).

    Everything is computed from the (n·T)×(n·T) Gram matrix of the differences, obtained through
    the problem's own logits (the rank-one path for self-attention), so the cost does not grow
    with ``d²``. ``size`` pads the reduced parameter with zero features (to stack problems of
    different ranks); directions with singular value below ``rtol`` times the largest are dropped.

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.random_tokens(n=3, T=4, d=8, seed=0)
    >>> red = reduce_to_span(prob)
    >>> red.rank, red.problem.shape        # 3·(4 − 1) = 9 instead of 8·8 = 64
    (9, (9,))
    >>> c = np.arange(9.0)
    >>> bool(np.allclose(red.problem.log_attention(c), prob.log_attention(red.lift(c))))
    True
    """
    n, T = prob.n, prob.T
    rows = np.arange(n)
    logits = prob.logits_flat(prob.features_from_opt)  # (n·T, n, T): ⟨A_k − A_k,opt, A_js⟩
    gram = (logits - logits[:, rows, prob.opt][..., None]).reshape(n * T, n * T)
    gram = 0.5 * (gram + gram.T)
    lam, U = np.linalg.eigh(gram)
    keep = lam > rtol**2 * lam[-1] if lam[-1] > 0 else np.zeros_like(lam, bool)
    r = int(keep.sum())
    if r == 0:
        raise ValueError("all tokens of every sample have the same features: the logits cannot separate them")
    coef = U[:, keep] / np.sqrt(lam[keep])
    mu, V = np.linalg.eigh(coef.T @ gram @ coef)  # one refinement pass: coefᵀ G coef = I to rounding
    coef = coef @ ((V / np.sqrt(mu)) @ V.T)
    size = r if size is None else size
    if not isinstance(size, (int, np.integer)) or size < r:
        raise ValueError(f"size must be an integer >= the rank {r}, got {size!r}")
    A = (gram @ coef).reshape(n, T, r)
    A[rows, prob.opt] = 0.0
    if size > r:
        A = np.concatenate([A, np.zeros((n, T, size - r))], axis=-1)
    return Reduced(TokenSelectionProblem(A, prob.gamma, prob.loss), prob, coef)


def factor_grad(grad_W, K, Q) -> tuple[np.ndarray, np.ndarray]:
    """Chain rule through ``W = K Qᵀ``: ``∇_K = ∇_W Q`` and ``∇_Q = ∇_Wᵀ K``.

    Args:
        grad_W: (*batch, d, d_z).  K: (*batch, d, m).  Q: (*batch, d_z, m).

    >>> import numpy as np
    >>> gK, gQ = factor_grad(np.ones((2, 3)), np.ones((2, 1)), np.ones((3, 1)))
    >>> gK.ravel().tolist(), gQ.ravel().tolist()
    ([3.0, 3.0], [2.0, 2.0, 2.0])
    """
    grad_W, K, Q = (np.asarray(a, float) for a in (grad_W, K, Q))
    return grad_W @ Q, np.swapaxes(grad_W, -1, -2) @ K


@dataclass(frozen=True, eq=False)
class NonlinearHeadAttention:
    """Prompt attention with a nonlinear head after pooling: ``f(X) = h(Xᵀ σ(K p))`` (RECONSTRUCTED).

    .. math::

        h(x) = u^⊤ \\mathrm{relu}(V x), \\qquad \\bar x_i(p) = \\sum_t σ_{it}(p)\\, x_{it}, \\qquad
        L(p) = \\frac1n \\sum_i ℓ\\big(y_i\\, h(\\bar x_i(p))\\big).

    [MMTS] extends its regularization-path theorem to nonlinear heads; the exact statement could
    not be checked, so this is a reconstruction: the optimal token of sample ``i`` is the one with
    the best single-token score ``γ_it = y_i h(x_it)``, and the path should turn towards
    ``p_mm`` of these tokens (:attr:`token_problem` gives that SVM). The floor
    ``L* = (1/n) Σ_i ℓ(γ_i,opt)`` is the infimum only when no *mixture* of tokens beats the best
    single one; with ``y_i = +1`` and ``u ≥ 0`` the head is convex, which guarantees it
    (``h(x̄) ≤ Σ_t σ_t h(x_t) ≤ h(x_opt)``). The constructor checks that condition.

    Attributes: ``X`` (n, T, d) tokens (the head's inputs), ``keys`` (n, T, k) logit features
    (``K_i = X_i Wᵀ``), ``y`` (n,), ``V`` (h, d), ``u`` (h,), ``loss``. Parameter ``p``: (*batch, k).
    It implements the :class:`attnlib.AttentionProblem` protocol, so :func:`attnlib.train` and
    :func:`log_gap_grad` take it like a :class:`TokenSelectionProblem`.
    """

    X: np.ndarray
    keys: np.ndarray
    y: np.ndarray
    V: np.ndarray
    u: np.ndarray
    loss: Loss

    def __post_init__(self):
        X = np.asarray(self.X, float)
        keys = np.asarray(self.keys, float)
        if X.ndim != 3 or keys.ndim != 3 or keys.shape[:2] != X.shape[:2]:
            raise ValueError(f"X must be (n, T, d) and keys (n, T, k) with the same n, T; got {X.shape}, {keys.shape}")
        V = np.asarray(self.V, float)
        u = np.asarray(self.u, float)
        if V.ndim != 2 or V.shape[1] != X.shape[2] or u.shape != (V.shape[0],):
            raise ValueError(f"V must be (h, {X.shape[2]}) and u (h,), got {V.shape} and {u.shape}")
        y = np.asarray(self.y, float)
        if y.shape != (X.shape[0],) or not np.all(y == 1.0) or np.any(u < 0):
            raise ValueError(
                "this reconstruction needs labels y = +1 and a head u >= 0 (a convex head, so that no "
                "mixture of tokens beats the best single token and L* is the infimum)"
            )
        for name, val in (("X", X), ("keys", keys), ("y", y), ("V", V), ("u", u)):
            object.__setattr__(self, name, val)
        object.__setattr__(self, "loss", get_loss(self.loss))
        gamma = self.head(X) * y[:, None]
        top2 = np.sort(gamma, axis=1)[:, -2:]
        if np.any(top2[:, 1] == top2[:, 0]):
            raise ValueError("the best single token must be unique in every sample")

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.keys.shape[2],)

    @property
    def n(self) -> int:
        return self.X.shape[0]

    def head(self, x) -> np.ndarray:
        """``h(x) = uᵀ relu(V x)`` over the last axis of ``x``."""
        return np.maximum(np.asarray(x, float) @ self.V.T, 0.0) @ self.u

    @cached_property
    def gamma(self) -> np.ndarray:
        """Single-token scores ``γ_it = y_i h(x_it)``: (n, T)."""
        return self.y[:, None] * self.head(self.X)

    @cached_property
    def opt(self) -> np.ndarray:
        """The induced optimal tokens ``argmax_t y_i h(x_it)``: (n,)."""
        return np.argmax(self.gamma, axis=1)

    @cached_property
    def token_problem(self) -> TokenSelectionProblem:
        """Same keys and single-token scores as a fixed-score problem: its ``max_margin`` is ``p_mm(opt)``."""
        return TokenSelectionProblem(self.keys, self.gamma, self.loss)

    @cached_property
    def loss_floor(self) -> float:
        return float(np.mean(self.loss.value(self.gamma[np.arange(self.n), self.opt])))

    @property
    def size(self) -> int:
        return self.shape[0]

    def flatten(self, p) -> tuple[np.ndarray, tuple[int, ...]]:
        """Validate ``p`` (*batch, k): ``(p, batch)`` (the parameter is already a vector)."""
        p = np.asarray(p, float)
        if p.ndim < 1 or p.shape[-1] != self.shape[0]:
            raise ValueError(f"p must have shape (*batch, {self.shape[0]}), got {p.shape}")
        return p, p.shape[:-1]

    def terms(self, p) -> Terms:
        """The per-sample :class:`attnlib.model.Terms` at ``p`` (*batch, k)."""
        return self.terms_from_flat(self.flatten(p)[0])

    def terms_from_flat(self, p) -> Terms:
        """``log σ`` (*batch, n, T), ``log δ_i`` and the outputs ``u_i`` (*batch, n) at ``p`` (*batch, k)."""
        p, batch = self.flatten(p)
        log_sigma = log_softmax(np.einsum("...k,itk->...it", p, self.keys), axis=-1)
        idx = np.arange(self.n)
        x_opt = self.X[idx, self.opt]  # (n, d)
        # δ_i = x̄_i − x_opt = Σ_{t≠opt} σ_it (x_it − x_opt), carried as exp(M_i) · δ_scaled
        others = np.where(np.arange(self.X.shape[1]) == self.opt[:, None], -np.inf, log_sigma)
        M = np.max(others, axis=-1)  # (*batch, n)
        w = np.exp(others - M[..., None])
        dx = self.X - x_opt[:, None, :]
        delta_s = np.einsum("...it,itd->...id", w, dx)
        a = x_opt @ self.V.T  # (n, h) pre-activations at the optimal token
        b_s = delta_s @ self.V.T  # (*batch, n, h)
        scale = np.exp(M)[..., None]
        # Δ_i = y_i (h(x_opt) − h(x̄_i)) ≥ 0. Where the move cannot flip a unit (saturated), the
        # ReLU is linear and Δ = −e^M y uᵀ(D b_s), exact at any scale; else evaluate directly.
        linear = np.all(scale * np.abs(b_s) < 1e-3 * np.abs(a), axis=-1)  # (*batch, n)
        lin = -(self.y[:, None] * ((a > 0) * b_s)) @ self.u
        with np.errstate(divide="ignore", invalid="ignore"):
            log_lin = M + np.log(lin)
            x_bar = x_opt + scale * delta_s
            direct = self.y * (self.head(x_opt) - self.head(x_bar))
            log_delta = np.where(linear, log_lin, np.log(direct))
        out = self.gamma[idx, self.opt] - np.exp(log_delta)
        return Terms(log_sigma, log_delta, out)

    def value(self, p) -> np.ndarray:
        """``L(p)``: (*batch,)."""
        return np.mean(self.loss.value(self.terms(p).output), axis=-1)

    def log_gap(self, p) -> np.ndarray:
        """``log(L − L*)``, accurate where the gap underflows: (*batch,)."""
        return self.log_gap_from(self.terms(p))

    def log_gap_from(self, terms: Terms) -> np.ndarray:
        """``log(L − L*)`` (*batch,) from the :class:`attnlib.model.Terms` of a batch."""
        g_opt = self.gamma[np.arange(self.n), self.opt]
        return logsumexp(self.loss.log_excess(g_opt, terms.log_delta), axis=-1, precise=True) - np.log(self.n)

    def scaled_grad(self, p) -> tuple[np.ndarray, np.ndarray]:
        """``∇L = exp(m) g``: ``(m (*batch,), g (*batch, k))``.

        ``∇L = (1/n) Σ_i ℓ'(u_i) y_i Σ_t σ_it ⟨∇h(x̄_i), x_it − x̄_i⟩ k_it``, with
        ``x_it − x̄_i`` measured from the most-attended token (no cancellation at saturation).
        """
        return self.scaled_grad_from(self.terms(p))

    def scaled_grad_from(self, terms: Terms, batch=None) -> tuple[np.ndarray, np.ndarray]:
        """``(m (*batch,), g (*batch, k))`` with ``∇L = exp(m) g`` from the :class:`attnlib.model.Terms`
        of a batch (``batch``, accepted for the protocol, is read from the terms)."""
        log_sigma, out = terms.log_sigma, terms.output
        batch = log_sigma.shape[:-2]
        ref = np.argmax(log_sigma, axis=-1)  # (*batch, n)
        x_ref = np.take_along_axis(np.broadcast_to(self.X, batch + self.X.shape), ref[..., None, None], axis=-2)
        dx = self.X - x_ref  # (*batch, n, T, d)
        sig = np.exp(log_sigma)
        x_bar_minus_ref = np.einsum("...it,...itd->...id", sig, dx)
        x_bar = x_ref[..., 0, :] + x_bar_minus_ref
        grad_h = ((x_bar @ self.V.T) > 0) * self.u @ self.V  # ∇h(x̄): (*batch, n, d)
        c = (
            np.einsum("...id,...itd->...it", grad_h, dx)
            - np.einsum("...id,...id->...i", grad_h, x_bar_minus_ref)[..., None]
        )
        is_ref = np.arange(self.X.shape[1]) == ref[..., None]
        with np.errstate(divide="ignore"):
            log_abs = self.loss.log_slope(out)[..., None] + log_sigma + np.log(np.abs(c)) - np.log(self.n)
        log_abs = np.where(is_ref, -np.inf, log_abs)
        m = np.max(log_abs, axis=(-2, -1))
        finite_m = np.where(np.isfinite(m), m, 0.0)
        w = (self.y[:, None] * np.sign(c)) * np.exp(log_abs - finite_m[..., None, None])
        k_ref = np.take_along_axis(np.broadcast_to(self.keys, batch + self.keys.shape), ref[..., None, None], axis=-2)
        g = -np.einsum("...it,...itk->...k", w, self.keys - k_ref)
        return m, g

    def grad(self, p) -> np.ndarray:
        """``∇L(p)``: (*batch, k)."""
        m, g = self.scaled_grad(p)
        return np.exp(m)[..., None] * g


def nonlinear_head(X, V, u, W=None, y=None, loss: str | Loss = "logistic") -> NonlinearHeadAttention:
    """[MMTS] nonlinear-head model ``f(X) = uᵀ relu(V Xᵀ softmax(X Wᵀ p))`` (RECONSTRUCTED).

    Args:
        X: (n, T, d) tokens.  V: (h, d), u: (h,) with ``u ≥ 0``: the head ``h(x) = uᵀ relu(Vx)``.
        W: (k, d) key matrix (identity if None).  y: labels, all +1 (default).

    >>> import numpy as np, attnlib as al
    >>> rng = np.random.default_rng(0)
    >>> model = nonlinear_head(rng.normal(size=(3, 3, 6)), rng.normal(size=(8, 6)), rng.uniform(size=8))
    >>> model.shape, model.opt.shape
    ((6,), (3,))
    """
    X = np.asarray(X, float)
    if X.ndim != 3:
        raise ValueError(f"X must be (n, T, d), got shape {X.shape}")
    keys = X if W is None else X @ np.asarray(W, float).T
    y = np.ones(X.shape[0]) if y is None else y
    return NonlinearHeadAttention(X, keys, y, V, u, loss)


@dataclass(frozen=True, eq=False)
class ReluHeadTerms(Terms):
    """:class:`Terms` of a :class:`ReluHeadStack`, with the head's pre-activations ``pre`` (S, n, h)."""

    pre: np.ndarray | None = None


@dataclass(frozen=True, eq=False)
class ReluHeadStack:
    """S independent cross-attention problems with a ReLU head and labels ±1 ([TFSVM] ``multi_token_converge``).

    .. math::

        s_{it} = ⟨A_{it}, θ⟩, \\quad σ_i = \\mathrm{softmax}(s_i), \\quad
        f_i = 1^⊤ \\mathrm{relu}\\Big(\\sum_t σ_{it} U_{it}\\Big), \\quad
        L(θ) = \\frac1n \\sum_i ℓ(y_i f_i).

    With ``A_it`` the coordinates of ``x_it z_iᵀ`` in an orthonormal basis of the span of the
    differences ``(x_it − x_i1) z_iᵀ`` and ``U_it = Vᵀ x_it``, this is [TFSVM]'s model
    ``f = 1ᵀ relu(Vᵀ Xᵀ softmax(X W z))`` with ``θ`` the coordinates of ``W`` (see
    :func:`relu_head_stack`). Unlike :class:`NonlinearHeadAttention`, labels may be −1: the head is
    then concave in ``σ`` for that sample (``−f`` is minimised), so a *mixture* of tokens can beat
    every single one, and no loss floor ``L*`` is known (``log_gap_from`` returns NaN).

    Attributes: ``A`` (S, n, T, k), ``U`` (S, n, T, h) (zero columns of ``U`` are inert, which
    lets problems of different widths share one stack), ``y`` (S, n), ``loss``. Parameter ``θ``:
    (S, k), one row per problem. It implements the :class:`attnlib.AttentionProblem` protocol, so
    :func:`attnlib.train` trains all S problems as one batch.
    """

    A: np.ndarray
    U: np.ndarray
    y: np.ndarray
    loss: Loss

    def __post_init__(self):
        A, U, y = (np.asarray(v, float) for v in (self.A, self.U, self.y))
        if A.ndim != 4 or U.ndim != 4 or U.shape[:3] != A.shape[:3] or y.shape != A.shape[:2]:
            raise ValueError(
                f"A must be (S, n, T, k), U (S, n, T, h) and y (S, n); got {A.shape}, {U.shape}, {y.shape}"
            )
        check_labels(y, y.shape)
        for name, val in (("A", A), ("U", U), ("y", y)):
            object.__setattr__(self, name, val)
        object.__setattr__(self, "loss", get_loss(self.loss))

    S = property(lambda self: self.A.shape[0], doc="Number of problems.")
    n = property(lambda self: self.A.shape[1])
    T = property(lambda self: self.A.shape[2])
    shape = property(lambda self: (self.A.shape[3],))
    size = property(lambda self: self.A.shape[3])

    def flatten(self, theta) -> tuple[np.ndarray, tuple[int, ...]]:
        """Validate ``theta`` (S, k): ``(theta, (S,))``."""
        theta = np.asarray(theta, float)
        if theta.shape != (self.S, self.size):
            raise ValueError(f"theta must have shape (S={self.S}, {self.size}), got {theta.shape}")
        return theta, (self.S,)

    def terms_from_flat(self, theta) -> ReluHeadTerms:
        """``log σ`` (S, n, T), outputs ``y_i f_i`` (S, n), pre-activations (S, n, h); ``log_delta`` is NaN."""
        S, n, T, k = self.A.shape
        # batched matmul / einsum: several times faster than broadcast-and-sum at these tiny sizes
        logits = (self.A.reshape(S, n * T, k) @ theta[:, :, None]).reshape(S, n, T)
        log_sigma = log_softmax(logits, axis=-1)
        pre = np.einsum("snt,snth->snh", np.exp(log_sigma), self.U)
        out = self.y * np.maximum(pre, 0.0).sum(-1)
        return ReluHeadTerms(log_sigma, np.full(out.shape, np.nan), out, pre)

    def value(self, theta) -> np.ndarray:
        """``L(θ)``: (S,)."""
        return np.mean(self.loss.value(self.terms_from_flat(self.flatten(theta)[0]).output), axis=-1)

    def log_gap_from(self, terms: Terms) -> np.ndarray:
        """NaN (S,): the infimum over mixtures of tokens is not computed here."""
        return np.full(terms.output.shape[:-1], np.nan)

    def scaled_grad_from(self, terms: ReluHeadTerms, batch=None) -> tuple[np.ndarray, np.ndarray]:
        """``∇L = exp(m)·g`` as ``(m (S,), g (S, k))``.

        ``∂f_i/∂s_it = σ_it ⟨∇relu, U_it − Ū_i⟩`` with ``U_it − Ū_i`` measured from the most-attended
        token ``r`` (``(U_it − U_ir) − Σ_τ σ_iτ (U_iτ − U_ir)``, no cancellation at saturation), the
        weights combined in log space so that the direction stays exact where ``‖∇L‖`` underflows.
        """
        log_sigma, pre = terms.log_sigma, terms.pre
        S, n, T, k = self.A.shape
        ref = np.argmax(log_sigma, axis=-1)
        is_ref = np.arange(T) == ref[..., None]
        score = np.einsum("snth,snh->snt", self.U, (pre > 0).astype(float))  # ⟨∇relu, U_it⟩
        c = score - (score * is_ref).sum(-1, keepdims=True)  # ⟨∇relu, U_it − U_ir⟩, exactly 0 at r
        c = c - (np.exp(log_sigma) * c).sum(-1, keepdims=True)
        with np.errstate(divide="ignore"):
            log_abs = self.loss.log_slope(terms.output)[..., None] + log_sigma + np.log(np.abs(c))
        log_abs = np.where(is_ref, -np.inf, log_abs - np.log(n))
        m = log_abs.reshape(S, n * T).max(axis=-1)
        finite_m = np.where(np.isfinite(m), m, 0.0)
        w = -(self.y[..., None] * np.sign(c)) * np.exp(log_abs - finite_m[:, None, None])
        w = np.where(is_ref, -w.sum(-1, keepdims=True), w)  # a sample's weights sum to zero
        return m, (w.reshape(S, 1, n * T) @ self.A.reshape(S, n * T, k))[:, 0]

    def grad(self, theta) -> np.ndarray:
        """``∇L(θ)``: (S, k)."""
        m, g = self.scaled_grad_from(self.terms_from_flat(self.flatten(theta)[0]))
        return np.exp(m)[:, None] * g


def relu_head_stack(X, Z, V, y, loss: str | Loss = "logistic") -> tuple[ReluHeadStack, np.ndarray]:
    """[TFSVM]'s ReLU-head cross-attention ``f_i = 1ᵀ relu(Vᵀ X_iᵀ softmax(X_i W z_i))`` for S problems.

    ``W`` enters only through the logits ``x_itᵀ W z_i``, and only their differences within a sample
    move the softmax, so ``W`` is trained in an orthonormal basis ``B`` (S, d·d, k) of the span of
    ``(x_it − x_i1) z_iᵀ`` (``k = n(T−1)`` generically): ``W = W₀ + unvec(B (θ − θ₀))`` with
    ``θ₀ = Bᵀ vec W₀``. Every gradient lies in that span and ``B`` is orthonormal, so GD and NGD on
    ``θ`` are GD and NGD on ``W``.

    Args: ``X`` (S, n, T, d) tokens, ``Z`` (S, n, d) queries, ``V`` (S, d, h) head, ``y`` (S, n) ±1.
    Returns ``(stack, B)``.

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> X, Z, V = rng.normal(size=(2, 3, 4, 5)), rng.normal(size=(2, 3, 5)), rng.normal(size=(2, 5, 5))
    >>> stack, B = relu_head_stack(X, Z, V, np.array([[1, -1, 1], [-1, 1, 1]]))
    >>> stack.shape, B.shape
    ((9,), (2, 25, 9))
    """
    X, Z, V = (np.asarray(v, float) for v in (X, Z, V))
    if X.ndim != 4 or Z.shape != X.shape[:2] + X.shape[3:] or V.ndim != 3 or V.shape[:2] != (X.shape[0], X.shape[3]):
        raise ValueError(f"X must be (S, n, T, d), Z (S, n, d) and V (S, d, h); got {X.shape}, {Z.shape}, {V.shape}")
    S, n, T, d = X.shape
    features = (X[..., :, None] * Z[:, :, None, None, :]).reshape(S, n, T, d * d)  # vec(x_it z_iᵀ)
    diffs = (features[:, :, 1:] - features[:, :, :1]).reshape(S, n * (T - 1), d * d)
    B = np.linalg.qr(np.swapaxes(diffs, 1, 2))[0]  # (S, d·d, k)
    return ReluHeadStack(features @ B[:, None], X @ V[:, None], y, loss), B


@dataclass(frozen=True, eq=False)
class StackedJointAttention(JointAttention):
    """:class:`JointAttention` with one data set per batch row: ``X`` (R, n, T, d), ``y`` (R, n).

    Methods take ``p`` (*batch, R, d_k) and ``v`` (*batch, R, d): row ``r`` of the parameters is
    trained on data set ``r``, so trajectories on different data sets (same ``n``, ``T``, ``d``) step
    together as one batch (:func:`attnlib.optim.train_joint_stack`), as :func:`attnlib.stack_problems` does for
    fixed-head problems.
    """

    #: the data axes lead ``X`` and ``keys``: the inherited methods contract row by row.
    _data_axes = "..."

    def __post_init__(self):
        X = np.asarray(self.X, float)
        if X.ndim != 4:
            raise ValueError(f"X must be a 4-D array (R, n, T, d), got shape {X.shape}")
        y = check_labels(self.y, X.shape[:2])
        W = np.asarray(self.W, float)
        if W.ndim != 2 or W.shape[1] != X.shape[3]:
            raise ValueError(f"W must have shape (d_k, {X.shape[3]}), got {W.shape}")
        object.__setattr__(self, "X", X)
        object.__setattr__(self, "y", y)
        object.__setattr__(self, "W", W)
        object.__setattr__(self, "loss", get_loss(self.loss))


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
    (:class:`attnlib.model.StackedJointAttention`'s data axes), so the (W, u) runs on R data sets
    step together as one batch (:func:`attnlib.optim.train_joint_stack`). ``Z=None`` uses ``z_i = x_i1`` per row.
    """


@dataclass(frozen=True, eq=False)
class FactoredDecoderAttention(StackedDecoderAttention):
    """:class:`StackedDecoderAttention` evaluated through its factors: ``s_it = x_itᵀ (W z_i)``.

    The same loss and gradient, without contracting the (R, n, T, d·d_z) keys: the logits cost
    O(d·d_z·n + n·T·d) per row instead of O(n·T·d·d_z), and the gradient in ``W`` is
    ``Σ_i (Σ_t w_it (x_it − x_i1)) z_iᵀ``. For long sequences of wide tokens (chapter 6's
    16 patches of dimension 20) this is what makes a stack of runs affordable.

    >>> import numpy as np, attnlib as al
    >>> rng = np.random.default_rng(0)
    >>> X, y, Z = rng.normal(size=(2, 3, 4, 2)), np.array([[1.0, -1, 1], [-1, 1, 1]]), rng.normal(size=(2, 3, 2))
    >>> args = (X, y, np.eye(2), "logistic", Z)
    >>> p, v = rng.normal(size=(2, 4)), rng.normal(size=(2, 2))
    >>> slow, fast = StackedDecoderAttention(*args), FactoredDecoderAttention(*args)
    >>> all(np.allclose(a, b) for a, b in zip(slow.grad(p, v), fast.grad(p, v)))
    True
    """

    def log_attention(self, p) -> np.ndarray:
        """``log σ_it``: (*batch, R, n, T) from ``p`` (*batch, R, d·d_z)."""
        p = np.asarray(p, float)
        W = p.reshape(p.shape[:-1] + self.shape)  # (*batch, R, d, d_z)
        Wz = np.swapaxes(W @ np.swapaxes(self.Z, -1, -2), -1, -2)  # (*batch, R, n, d): W z_i
        return log_softmax((self.X @ Wz[..., None])[..., 0], axis=-1)

    def scores(self, v) -> np.ndarray:
        """``γ_it = y_i uᵀ x_it``: (*batch, R, n, T), one matrix product per row."""
        v = np.asarray(v, float)
        return self.y[..., None] * (self.X @ v[..., :, None, :, None])[..., 0]

    def _mean_tokens(self, sigma: np.ndarray) -> np.ndarray:
        return (sigma[..., None, :] @ self.X)[..., 0, :]

    @cached_property
    def _tokens_from_first(self) -> np.ndarray:
        """``x_it − x_i1``: (R, n, T, d), kept."""
        return self.X - self.X[..., :1, :]

    def _keys_adjoint(self, w: np.ndarray) -> np.ndarray:
        mixed = (w[..., None, :] @ self._tokens_from_first)[..., 0, :]  # (*batch, R, n, d)
        return (np.swapaxes(mixed, -1, -2) @ self.Z).reshape(w.shape[:-2] + (self.shape[0] * self.shape[1],))


def check_integer(name: str, value, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    return int(value)
