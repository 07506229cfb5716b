"""Fast rates of normalised GD and the Polyak step against GD [FAST]: fitting slow asymptotic shapes.

:func:`inverse_log_vs_power` and :func:`half_decade_slopes` test slow asymptotic shapes
(``1/log t``, ``log t``) against a power law.

The pieces a rate study is built from live with the objects they are, and are re-exported here
under their old names: :data:`attnlib.losses.CROSS_ENTROPY`; :func:`attnlib.model.logistic_regression`,
:class:`attnlib.model.Reduced` and :func:`attnlib.model.reduce_to_span` (the problem); the
recording grid :func:`attnlib.optim.log_steps` and :func:`attnlib.optim.train_many`
(:func:`attnlib.train` on :func:`attnlib.stack_problems`); the metric :func:`attnlib.metrics.curves`;
and the data :func:`attnlib.datasets.separable_data`.
"""

from __future__ import annotations

from collections.abc import Sequence  # noqa: F401  (kept in this namespace for the code that uses it from here)
from dataclasses import dataclass

import numpy as np

from .datasets import separable_data
from .losses import CROSS_ENTROPY
from .metrics import CURVES, curves, direction_error  # noqa: F401  (direction_error: kept in this namespace)
from .model import Reduced, TokenSelectionProblem, logistic_regression, reduce_to_span  # noqa: F401
from .optim import Trajectory, log_steps, train, train_many  # noqa: F401  (Trajectory, train: kept in this namespace)
from .svm import MaxMarginSolution  # noqa: F401  (kept in this namespace for the code that uses it from here)

__all__ = [
    "CROSS_ENTROPY",
    "logistic_regression",
    "separable_data",
    "Reduced",
    "reduce_to_span",
    "log_steps",
    "train_many",
    "curves",
    "ShapeFit",
    "inverse_log_vs_power",
    "half_decade_slopes",
]


# ---------------------------------------------------------------------------------- slow shapes
@dataclass(frozen=True)
class ShapeFit:
    """Two two-parameter fits of a decaying error, residuals on the scale ``log err``.

    Attributes:
        rms_inverse_log: RMS residual of ``err ≈ 1/(a + b log t)``.
        rms_power: RMS residual of the best power law ``err ≈ c t^−p``.
        exponent: the fitted ``p``.
        residual_inverse_log, residual_power: (R,) the residuals ``log err − log fit``.
    """

    rms_inverse_log: float
    rms_power: float
    exponent: float
    residual_inverse_log: np.ndarray
    residual_power: np.ndarray

    @property
    def ratio(self) -> float:
        """``rms_power / rms_inverse_log``: above 1, the ``1/log t`` model fits better."""
        return self.rms_power / self.rms_inverse_log if self.rms_inverse_log > 0 else float("inf")


def inverse_log_vs_power(t, err) -> ShapeFit:
    """Fit ``err(t)`` by ``1/(a + b log t)`` and by a power law ``c t^−p``; compare their residuals.

    Both models have two parameters and both fits are linear least squares: ``1/err`` against
    ``log t`` for the first, ``log err`` against ``log t`` for the second. Their residuals are
    measured on the same scale, ``log err``. GD's direction error on separable problems behaves like
    ``c/log t`` (Soudry et al. 2018; ``θ_t = θ_mm log t + ρ_t`` with a bounded offset ``ρ_t``): on a
    window of several decades of ``t``, the straight line of a power law on log-log axes cannot
    follow the curvature ``1/log² t`` of ``log err``, and leaves clearly larger residuals.

    Args: ``t`` (R,) positive steps, ``err`` (R,) positive errors (e.g. log-spaced records).
    Returns a :class:`ShapeFit`. Where the fitted ``a + b log t`` is not positive on the window, the
    ``1/log t`` model does not apply and its residual is infinite.

    >>> import numpy as np, attnlib as al
    >>> t = np.logspace(2, 5, 40)
    >>> fit = al.inverse_log_vs_power(t, 2.0 / np.log(3.0 * t))
    >>> bool(fit.rms_inverse_log < 1e-12 < fit.rms_power), round(fit.exponent, 3)
    (True, 0.113)
    >>> fit = al.inverse_log_vs_power(t, 5.0 * t**-0.1)
    >>> bool(fit.rms_power < 1e-12 < fit.rms_inverse_log), fit.ratio < 1e-9
    (True, True)
    """
    t = np.asarray(t, float)
    err = np.asarray(err, float)
    if t.shape != err.shape or t.ndim != 1 or t.size < 3:
        raise ValueError(f"t and err must be 1-D of equal length >= 3, got {t.shape} and {err.shape}")
    if not (np.all(t > 0) and np.all(err > 0) and np.all(np.isfinite(err))):
        raise ValueError("t and err must be positive and finite")
    x, y = np.log(t), np.log(err)
    design = np.stack([np.ones_like(x), x], axis=1)
    power = np.linalg.lstsq(design, y, rcond=None)[0]
    res_pow = y - design @ power
    inv = design @ np.linalg.lstsq(design, 1.0 / err, rcond=None)[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        res_log = np.where(inv > 0, y + np.log(np.where(inv > 0, inv, 1.0)), np.inf)
    rms = [float(np.sqrt(np.mean(r**2))) for r in (res_log, res_pow)]
    return ShapeFit(rms[0], rms[1], float(-power[1]), res_log, res_pow)


def half_decade_slopes(t, y) -> tuple[float, float]:
    """Slopes of ``y`` against ``log t`` over the last two half-decades of ``t``.

    With ``t_end = t[-1]``, the last window is ``[t_end/√10, t_end]`` and the one before
    ``[t_end/10, t_end/√10]`` (both ends included). For ``y = ‖θ_t‖`` under GD the slope tends to
    ``‖θ_mm‖`` (``‖θ_t‖ = ‖θ_mm‖ log t + O(1)``); the change between the two windows measures how far
    the slope still drifts. Needs at least two records in each window (log-spaced records:
    :func:`log_steps`).

    Returns ``(slope_last, slope_previous)``.

    >>> import numpy as np, attnlib as al
    >>> t = al.log_steps(10_000)[1:]
    >>> [round(s, 6) for s in al.half_decade_slopes(t, 3.0 * np.log(t) + 1.0)]
    [3.0, 3.0]
    """
    t = np.asarray(t, float)
    y = np.asarray(y, float)
    if t.shape != y.shape or t.ndim != 1:
        raise ValueError(f"t and y must be 1-D of equal length, got {t.shape} and {y.shape}")
    end = t[-1]
    last = t >= end / np.sqrt(10.0) * (1 - 1e-12)
    prev = (t >= end / 10.0 * (1 - 1e-12)) & (t <= end / np.sqrt(10.0) * (1 + 1e-12))
    if last.sum() < 2 or prev.sum() < 2 or np.any(t[last | prev] <= 0):
        raise ValueError("need at least two positive steps in each of the last two half-decades of t")
    slope = [float(np.polyfit(np.log(t[w]), y[w], 1)[0]) for w in (last, prev)]
    return slope[0], slope[1]
