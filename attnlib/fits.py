"""Curve fits every chapter uses: slopes, exponential rates, ``1/log t`` against power laws.

All take the abscissa (R,) and values (R,) or (R, S) (one column per run) and fit per column.
:func:`fit_slope` is a least-squares slope, :func:`exponential_rate` the rate of a log-linear
decay, :func:`late_slopes` / :func:`late_decay` the slope and end-to-end rate over a late window,
:func:`half_decade_slopes` / :func:`running_half_decade_slopes` slopes over half-decades of
``log t``, and :func:`inverse_log_vs_power` tests the slow shape ``1/log t`` against a power law
([FAST]); :func:`loss_shapes` fits a decaying loss by stretched exponentials ``exp(−c t^a)`` and by
a power law.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "fit_slope",
    "exponential_rate",
    "ShapeFit",
    "inverse_log_vs_power",
    "LossShapes",
    "loss_shapes",
    "half_decade_slopes",
    "late_slopes",
    "late_decay",
    "running_half_decade_slopes",
]


def fit_slope(x, y, log_x: bool = True, log_y: bool = True) -> tuple[float, float]:
    """Least-squares line through ``(x, y)`` on the chosen axes: returns ``(slope, intercept)``.

    Use it for measured rates: ``fit_slope(t, err)`` is the exponent of a power law,
    ``fit_slope(t, log_err, log_y=False)`` an exponential rate, ``fit_slope(t, norm, log_y=False)``
    the coefficient of ``log t`` growth.

    >>> import numpy as np, attnlib as al
    >>> t = np.arange(1.0, 100.0)
    >>> [round(v, 6) for v in al.fit_slope(t, 3 * t**-0.5)]
    [-0.5, 1.098612]
    """
    x = np.asarray(x, float)
    y = np.asarray(y, float)
    if x.shape != y.shape or x.ndim != 1 or x.size < 2:
        raise ValueError(f"x and y must be 1-D of equal length >= 2, got {x.shape} and {y.shape}")
    xs = np.log(x) if log_x else x
    ys = np.log(y) if log_y else y
    ok = np.isfinite(xs) & np.isfinite(ys)
    if ok.sum() < 2:
        raise ValueError("fit_slope needs at least two finite points on the chosen axes")
    slope, intercept = np.polyfit(xs[ok], ys[ok], 1)
    return float(slope), float(intercept)


def exponential_rate(t, log_y, start: float = 0.5) -> np.ndarray:
    """Fitted decay rate ``−d log y / dt`` over ``[start·T, T]`` (``T = t[-1]``), per column: (B,).

    ``t`` (R,) steps; ``log_y`` (R,) or (R, B) logarithms of a decaying quantity (a loss gap from
    ``prob.log_gap``, the attention left off the optimal tokens...). Under normalised GD with step
    ``η`` both decay like ``e^{−ηt/M}``, ``M = ‖p_mm*‖``: the rate times ``M/η`` tends to 1.

    >>> import numpy as np, attnlib as al
    >>> t = np.arange(0.0, 101.0)
    >>> exponential_rate(t, -0.3 * t + 2.0).round(6).tolist()
    [0.3]
    """
    t = np.asarray(t, float)
    log_y = np.asarray(log_y, float)
    log_y = log_y[:, None] if log_y.ndim == 1 else log_y
    if log_y.ndim != 2 or log_y.shape[0] != t.shape[0]:
        raise ValueError(f"log_y must have shape (R,) or (R, B) with R = {t.shape[0]}, got {log_y.shape}")
    first = int(np.searchsorted(t, start * t[-1]))
    return np.array(
        [-fit_slope(t[first:], log_y[first:, b], log_x=False, log_y=False)[0] for b in range(log_y.shape[1])]
    )


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
    >>> fit = inverse_log_vs_power(t, 2.0 / np.log(3.0 * t))
    >>> bool(fit.rms_inverse_log < 1e-12 < fit.rms_power), round(fit.exponent, 3)
    (True, 0.113)
    >>> fit = inverse_log_vs_power(t, 5.0 * t**-0.1)
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


@dataclass(frozen=True)
class LossShapes:
    """Fits of a decaying loss by ``exp(b − c t^a)`` (a fixed or fitted) and by ``e^b t^−p``.

    Attributes:
        exponent: the fitted ``a`` of the stretched exponential (the best on a grid of ``a``).
        rms: shape name -> RMS residual in ``log L`` (``"a = 1/3"``, ``"a = 1/2"``, ``"a = 1"``,
            ``"power law"``, ``"fitted a"``).
        power: the fitted power-law exponent ``p``.
    """

    exponent: float
    rms: dict
    power: float


#: The stretched exponentials named by :func:`loss_shapes`: exp(−c t^a) for these a.
LOSS_SHAPE_EXPONENTS = {"a = 1/3": 1 / 3, "a = 1/2": 0.5, "a = 1": 1.0}


def _shape_fit(feature, log_loss):
    design = np.stack([np.ones_like(feature), feature], axis=1)
    coef = np.linalg.lstsq(design, log_loss, rcond=None)[0]
    return float(np.sqrt(np.mean((log_loss - design @ coef) ** 2))), coef


#: The default grid of exponents ``a`` that :func:`loss_shapes` searches before refining its best.
LOSS_SHAPE_GRID = np.linspace(0.02, 2.0, 34)


def loss_shapes(t, log_loss, exponents=LOSS_SHAPE_GRID) -> LossShapes:
    """Fit ``log L(t)`` by ``b − c t^a`` and by ``b − p log t``; residuals on one scale, ``log L``.

    Every model has two linear parameters, fitted by least squares: ``log L`` against ``t^a``
    (the stretched exponential ``exp(−c t^a)``, for each ``a`` of :data:`LOSS_SHAPE_EXPONENTS` and for
    the best ``a``: the best of the grid ``exponents``, refined by a golden-section search between its
    neighbours) and against ``log t`` (a power law). A loss
    falling like ``exp(−ct)`` gives ``a = 1``; a power law ``t^−p`` drives the fitted ``a`` to the
    smallest of ``exponents`` (``(t^a − 1)/a → log t`` as ``a → 0``).

    Args: ``t`` (R,) positive increasing steps; ``log_loss`` (R,) finite ``log L``.

    >>> import numpy as np
    >>> t = np.logspace(1, 3, 30)
    >>> fit = loss_shapes(t, 2.0 - 0.5 * t ** (1 / 3))
    >>> round(fit.exponent, 4), fit.rms["a = 1/3"] < 1e-9 < fit.rms["a = 1"]
    (0.3333, True)
    >>> round(loss_shapes(t, 1.0 - 1.5 * np.log(t)).power, 6)
    1.5
    """
    t = np.asarray(t, float)
    log_loss = np.asarray(log_loss, float)
    if t.shape != log_loss.shape or t.ndim != 1 or t.size < 4:
        raise ValueError(f"t and log_loss must be 1-D of equal length >= 4, got {t.shape} and {log_loss.shape}")
    if not (np.all(t > 0) and np.all(np.diff(t) > 0) and np.all(np.isfinite(log_loss))):
        raise ValueError("t must be positive and increasing, log_loss finite")
    scale = t[-1]  # t/t_end keeps t^a well scaled for every a
    rms = {name: _shape_fit((t / scale) ** a, log_loss)[0] for name, a in LOSS_SHAPE_EXPONENTS.items()}
    rms_power, coef = _shape_fit(np.log(t), log_loss)
    rms["power law"] = rms_power
    grid = np.asarray(exponents, float)

    def residual(a):
        return _shape_fit((t / scale) ** a, log_loss)[0]

    best = int(np.argmin([residual(a) for a in grid]))
    low, high = grid[max(best - 1, 0)], grid[min(best + 1, grid.size - 1)]
    golden = (np.sqrt(5.0) - 1) / 2
    for _ in range(40):  # golden-section search: the bracket shrinks by 0.618 per step, to 1e-8 of the grid's step
        a1, a2 = high - golden * (high - low), low + golden * (high - low)
        low, high = (low, a2) if residual(a1) <= residual(a2) else (a1, high)
    exponent = float((low + high) / 2)
    rms["fitted a"] = residual(exponent)
    return LossShapes(exponent, rms, float(-coef[1]))


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
    >>> [round(s, 6) for s in half_decade_slopes(t, 3.0 * np.log(t) + 1.0)]
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


def late_slopes(x, y, start: float, log_x: bool = False, log_y: bool = False) -> np.ndarray:
    """Per-column least-squares slope of ``y`` against ``x`` over the records with ``x_steps ≥ start``.

    ``x``: (R,) steps, or (R, S) one abscissa per column (e.g. ``‖W_t‖``); ``y``: (R, S). The window
    is chosen on the steps: pass ``x`` as ``(steps, abscissa)`` to fit against another abscissa.
    Returns (S,) slopes (:func:`attnlib.fit_slope`, with its ``log_x``/``log_y``).

    >>> import numpy as np, attnlib as al
    >>> t = np.arange(1.0, 101.0)
    >>> late_slopes(t, np.stack([2 * t, -t], axis=1), start=50).round(9).tolist()
    [2.0, -1.0]
    """

    steps, abscissa = x if isinstance(x, tuple) else (x, x)
    steps = np.asarray(steps, float)
    y = np.asarray(y, float)
    abscissa = np.broadcast_to(np.asarray(abscissa, float).reshape(len(steps), -1), y.shape)
    window = steps >= start
    if window.sum() < 2:
        raise ValueError(f"need at least two records with step >= {start}")
    return np.array(
        [fit_slope(abscissa[window, s], y[window, s], log_x=log_x, log_y=log_y)[0] for s in range(y.shape[1])]
    )


def late_decay(steps, abscissa, log_y, start: float) -> np.ndarray:
    """End-to-end decay rate ``Δ(−log y)/Δx`` from the first record with step ``≥ start`` to the last.

    ``steps`` (R,); ``abscissa`` (R,) or (R, S) (the steps, or ``‖W_t‖``); ``log_y`` (R, S). Unlike a
    least-squares fit, the end-to-end difference is what the identity
    ``−log max_i(1 − σ_i,opt) = ‖W‖γ(W) + b(W)``, ``b ∈ [−log(T−1), log 2]``, bounds: it equals
    ``Δ(‖W‖γ)/Δx`` up to ``log(2(T−1))/Δx``. Returns (S,).

    >>> import numpy as np, attnlib as al
    >>> t = np.arange(0.0, 11.0)
    >>> late_decay(t, t, np.stack([-0.5 * t, -2 * t], axis=1), start=2).tolist()
    [0.5, 2.0]
    """
    steps = np.asarray(steps, float)
    log_y = np.asarray(log_y, float)
    abscissa = np.broadcast_to(np.asarray(abscissa, float).reshape(len(steps), -1), log_y.shape)
    first = int(np.flatnonzero(steps >= start)[0])
    if first >= len(steps) - 1:
        raise ValueError(f"need a record with step >= {start} before the last one")
    return (log_y[first] - log_y[-1]) / (abscissa[-1] - abscissa[first])


def running_half_decade_slopes(t, y, from_step: float) -> np.ndarray:
    """:func:`half_decade_slopes` of ``y`` against ``log t`` over the half-decade ending at each record.

    ``t`` (R,) positive log-spaced steps, ``y`` (R, S). Returns ``(ends, slopes)``: the records
    ``t ≥ from_step`` at which a half-decade ends, and (len(ends), S) the slope over it.

    >>> import numpy as np, attnlib as al
    >>> t = al.log_steps(10_000)[1:]
    >>> ends, s = running_half_decade_slopes(t, np.log(t)[:, None] * [1.0, 3.0], 100)
    >>> bool(ends[0] >= 100), np.allclose(s, [1.0, 3.0])
    (True, True)
    """
    t = np.asarray(t, float)
    y = np.asarray(y, float)
    ends = np.flatnonzero(t >= from_step)
    slopes = np.array([[half_decade_slopes(t[: j + 1], y[: j + 1, s])[0] for s in range(y.shape[1])] for j in ends])
    return t[ends], slopes
