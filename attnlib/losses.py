"""Decreasing losses ℓ of the token-selection objective, in forms that stay finite and accurate.

A loss enters the objective through the signed output ``u_i = y_i f(X_i) = Σ_t σ_it γ_it``:
``L(θ) = (1/n) Σ_i ℓ(u_i)``. Three pieces are needed:

- ``value(u)``: ``ℓ(u)``;
- ``derivative(u)``: ``ℓ'(u) < 0``;
- ``excess(gamma, delta)``: ``ℓ(γ − δ) − ℓ(γ)`` for ``δ ≥ 0`` without subtracting two nearly
  equal numbers, so that ``L − L*`` is accurate when the softmax is saturated.
- ``log_excess(gamma, log_delta)``: its logarithm, accurate even when ``δ`` underflows.

[MMTS] states its results for losses that are strictly decreasing with bounded, Lipschitz
derivative on bounded sets (paraphrase); all three here qualify on bounded sets.

>>> from attnlib.losses import get_loss
>>> round(float(get_loss("logistic").value(0.0)), 6)
0.693147
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = [
    "expit",
    "log_expit",
    "Loss",
    "LOSSES",
    "get_loss",
    "CROSS_ENTROPY",
]


def expit(x) -> np.ndarray:
    """The logistic sigmoid ``1/(1 + e^{−x})``, elementwise (0 where ``e^{−x}`` overflows).

    scipy.special's formula in numpy, so that ``import attnlib`` loads no scipy (its import is
    several times numpy's); equal to ``scipy.special.expit`` within two ulp (``tests/test_losses.py``).

    >>> expit(np.array([0.0, 800.0, -800.0])).tolist()
    [0.5, 1.0, 0.0]
    """
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-np.asarray(x, float)))


def log_expit(x) -> np.ndarray:
    """``log(1/(1 + e^{−x}))`` without overflow or cancellation: ``min(x, 0) − log1p(e^{−|x|})``.

    scipy.special's two branches (``x − log1p(eˣ)`` below 0, ``−log1p(e^{−x})`` above) as one
    expression; equal to ``scipy.special.log_expit`` within two ulp.

    >>> log_expit(np.array([0.0, -800.0])).tolist() == [-np.log(2.0), -800.0]
    True
    """
    x = np.asarray(x, float)
    return np.minimum(x, 0.0) - np.log1p(np.exp(-np.abs(x)))


@dataclass(frozen=True)
class Loss:
    """A decreasing loss ``ℓ`` with its derivative and a cancellation-free excess.

    Attributes are vectorised callables on float64 arrays.
    """

    name: str
    value: Callable[[np.ndarray], np.ndarray]
    derivative: Callable[[np.ndarray], np.ndarray]
    excess: Callable[[np.ndarray, np.ndarray], np.ndarray]
    log_excess: Callable[[np.ndarray, np.ndarray], np.ndarray]
    #: ``log(−ℓ'(u))`` in closed form, if the loss has one (else :meth:`log_slope` takes the log of
    #: ``−derivative``): what every gradient step reads, in one or two array operations.
    log_neg_derivative: Callable[[np.ndarray], np.ndarray] | None = None

    def __repr__(self) -> str:
        return f"Loss({self.name!r})"

    def log_slope(self, u) -> np.ndarray:
        """``log(−ℓ'(u))``, elementwise (−inf where ``ℓ'(u)`` is 0).

        >>> u = np.array([-3.0, 0.0, 40.0])
        >>> bool(np.allclose(get_loss("logistic").log_slope(u), np.log(expit(-u)), rtol=1e-15))
        True
        """
        if self.log_neg_derivative is not None:
            return self.log_neg_derivative(np.asarray(u, float))
        with np.errstate(divide="ignore"):
            return np.log(-self.derivative(u))


def _logistic_log_excess(gamma, log_delta):
    # ℓ(γ−δ) − ℓ(γ) = log1p(expm1(δ)·s) with s = sigmoid(−γ). For δ below ~1e-300 the product
    # underflows, so switch to the first-order form log δ + log s (relative error O(δ)).
    gamma, log_delta = np.broadcast_arrays(np.asarray(gamma, float), np.asarray(log_delta, float))
    log_s = log_expit(-gamma)
    out = log_delta + log_s
    big = log_delta > -30.0
    if np.any(big):
        delta = np.exp(log_delta[big])
        out = np.array(out, dtype=float)
        out[big] = np.log(np.log1p(np.expm1(delta) * np.exp(log_s[big])))
    return out


def _exponential_log_excess(gamma, log_delta):
    # e^{−γ}(e^{δ} − 1): log = −γ + log(expm1(δ)), with log expm1(δ) ≈ log δ for tiny δ.
    gamma, log_delta = np.broadcast_arrays(np.asarray(gamma, float), np.asarray(log_delta, float))
    delta = np.exp(np.minimum(log_delta, 700.0))
    with np.errstate(divide="ignore"):
        log_expm1 = np.where(log_delta > -30.0, np.log(np.expm1(delta)), log_delta)
    return -gamma + log_expm1


LOSSES: dict[str, Loss] = {
    "logistic": Loss(
        "logistic",
        value=lambda u: np.logaddexp(0.0, -np.asarray(u, float)),
        derivative=lambda u: -expit(-np.asarray(u, float)),
        excess=lambda g, d: np.log1p(np.expm1(d) * expit(-np.asarray(g, float))),
        log_excess=_logistic_log_excess,
        log_neg_derivative=lambda u: -np.logaddexp(0.0, u),  # log σ(−u) = −log(1 + eᵘ)
    ),
    "exponential": Loss(
        "exponential",
        value=lambda u: np.exp(-np.asarray(u, float)),
        derivative=lambda u: -np.exp(-np.asarray(u, float)),
        excess=lambda g, d: np.exp(-np.asarray(g, float)) * np.expm1(d),
        log_excess=_exponential_log_excess,
        log_neg_derivative=lambda u: -u,
    ),
    "linear": Loss(
        "linear",
        value=lambda u: -np.asarray(u, float),
        derivative=lambda u: -np.ones_like(np.asarray(u, float)),
        excess=lambda g, d: np.asarray(d, float) + 0.0 * np.asarray(g, float),
        log_excess=lambda g, ld: np.asarray(ld, float) + 0.0 * np.asarray(g, float),
        log_neg_derivative=np.zeros_like,
    ),
}


def get_loss(loss: str | Loss) -> Loss:
    """Return the :class:`Loss` named ``loss`` ("logistic", "exponential" or "linear")."""
    if isinstance(loss, Loss):
        return loss
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {sorted(LOSSES)}, got {loss!r}")
    return LOSSES[loss]


# ------------------------------------------------ cross-entropy on the selected mass
def _ce_log_excess(gamma, log_delta):
    # ℓ(γ − δ) − ℓ(γ) = −log1p(−δ/γ) for 0 ≤ δ < γ; its log is log(δ/γ) + O(δ) for tiny δ.
    gamma, log_delta = np.broadcast_arrays(np.asarray(gamma, float), np.asarray(log_delta, float))
    out = log_delta - np.log(gamma)
    big = out > -30.0
    if np.any(big):
        out = np.array(out, dtype=float)
        out[big] = np.log(-np.log1p(-np.exp(out[big])))
    return out


#: Cross-entropy on the selected mass, ``ℓ(u) = −log u`` for outputs ``u ∈ (0, 1]`` (scores in
#: [0, 1]): with two tokens of scores 1 and 0 it turns the softmax into logistic regression.
CROSS_ENTROPY = Loss(
    "cross-entropy",
    value=lambda u: -np.log(np.asarray(u, float)),
    derivative=lambda u: -1.0 / np.asarray(u, float),
    excess=lambda g, d: -np.log1p(-np.asarray(d, float) / np.asarray(g, float)),
    log_excess=_ce_log_excess,
    log_neg_derivative=lambda u: -np.log(u),
)
