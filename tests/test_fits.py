"""The core: attnlib.fits."""

import numpy as np
import pytest

import attnlib as al


def test_exponential_rate_per_column_and_window():
    t = np.arange(0.0, 201.0)
    log_y = np.column_stack([-0.2 * t, -0.5 * t + np.where(t < 100, 3 * np.sin(t), 0.0)])
    assert al.fits.exponential_rate(t, log_y) == pytest.approx([0.2, 0.5])
    with pytest.raises(ValueError):
        al.fits.exponential_rate(t, log_y[:-1])


def test_ngd_gap_decays_at_the_margin_rate():
    prob = al.datasets.loss_study(3.0)  # M = 1
    run = al.train(prob, np.zeros(3), steps=400, method="ngd", lr=0.1)
    rate = al.fits.exponential_rate(run.steps, prob.log_gap(run.theta))[0]
    assert rate / 0.1 == pytest.approx(1.0, abs=0.02)


# ---------------------------------------------------------------------------------- slow shapes
def test_inverse_log_vs_power_tells_the_two_shapes_apart():
    t = al.log_steps(100_000)[1:].astype(float)
    window = t >= 1000
    inverse_log = al.fits.inverse_log_vs_power(t[window], 1.5 / (2.0 + 0.8 * np.log(t[window])))
    assert inverse_log.rms_inverse_log < 1e-12 and inverse_log.ratio > 1e6
    assert inverse_log.residual_power.shape == (window.sum(),)
    power = al.fits.inverse_log_vs_power(t[window], 4.0 * t[window] ** -0.07)
    assert power.rms_power < 1e-12 and power.ratio < 1e-6 and power.exponent == pytest.approx(0.07)
    # A 1/log t curve with a slowly drifting numerator (a bounded offset still moving) still fits
    # the 1/log t model far better than any power law over two decades.
    drift = (1.0 + 0.1 * np.log(np.log(t[window]))) / np.log(t[window])
    assert al.fits.inverse_log_vs_power(t[window], drift).ratio > 2


def test_inverse_log_vs_power_rejects_bad_input_and_flags_a_negative_denominator():
    with pytest.raises(ValueError, match="positive"):
        al.fits.inverse_log_vs_power([1.0, 2.0, 3.0], [1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="length"):
        al.fits.inverse_log_vs_power([1.0, 2.0], [1.0, 0.5])
    t = np.logspace(0, 2, 10)
    rising = np.exp(np.log(t) ** 2)  # 1/err falls faster than any line in log t: the fit turns negative
    assert al.fits.inverse_log_vs_power(t, rising).rms_inverse_log == np.inf


def test_half_decade_slopes():
    t = al.log_steps(10_000)[2:].astype(float)
    last, prev = al.fits.half_decade_slopes(t, 2.5 * np.log(t) - 1.0)
    assert last == pytest.approx(2.5) and prev == pytest.approx(2.5)
    # y = log t + 3 log log t: the slope 1 + 3/log t drifts down from one half-decade to the next.
    last, prev = al.fits.half_decade_slopes(t, np.log(t) + 3 * np.log(np.log(t)))
    assert 1 < last < prev
    assert last == pytest.approx(1 + 3 / np.log(10_000 / 10**0.25), rel=0.02)
    with pytest.raises(ValueError, match="half-decades"):
        al.fits.half_decade_slopes(np.array([1.0, 10.0, 100.0]), np.zeros(3))


def test_late_slopes_and_late_decay():
    t = np.arange(0.0, 101.0)
    y = np.stack([3 * t + 1, -0.5 * t], axis=1)
    np.testing.assert_allclose(al.fits.late_slopes(t, y, start=40), [3.0, -0.5])
    norm = np.stack([2 * t, 4 * t], axis=1)
    np.testing.assert_allclose(al.fits.late_slopes((t, norm), y, start=40), [1.5, -0.125])
    np.testing.assert_allclose(al.fits.late_slopes(t[1:], np.exp(y[1:, :1]), start=10, log_y=True), [3.0])
    # the end-to-end difference, not a fit: a kink before the window does not count
    log_y = np.where(t < 20, -5 * t, -100 - 0.5 * (t - 20))[:, None]
    np.testing.assert_allclose(al.fits.late_decay(t, t, log_y, start=20), [0.5])
    np.testing.assert_allclose(al.fits.late_decay(t, 2 * t, log_y, start=20), [0.25])
    with pytest.raises(ValueError):
        al.fits.late_decay(t, t, log_y, start=100)
    with pytest.raises(ValueError):
        al.fits.late_slopes(t, y, start=100)


def test_running_half_decade_slopes_follow_a_changing_slope():
    t = al.log_steps(10_000)[1:]
    y = np.where(t < 300, 2 * np.log(t), 2 * np.log(300) + np.log(t / 300))[:, None]
    ends, s = al.fits.running_half_decade_slopes(t, y, 30)
    assert ends[0] >= 30 and s.shape == (len(ends), 1)
    np.testing.assert_allclose(s[ends <= 300 / 10**0.5 * 0.99, 0], 2.0)
    np.testing.assert_allclose(s[ends >= 300 * 10**0.5 * 1.01, 0], 1.0)


# ---------------------------------------------------------------------------------- loss shapes
@pytest.mark.parametrize("a", [1 / 3, 0.5, 1.0, 0.8])
def test_loss_shapes_recover_a_stretched_exponential(a):
    t = al.log_steps(2_000)[1:].astype(float)
    window = t >= 100
    fit = al.fits.loss_shapes(t[window], 3.0 - 0.4 * t[window] ** a)
    assert fit.exponent == pytest.approx(a, abs=1e-6)
    assert fit.rms["fitted a"] < 1e-6 < fit.rms["power law"]
    others = [name for name, b in al.fits.LOSS_SHAPE_EXPONENTS.items() if abs(b - a) > 0.1]
    assert all(fit.rms[name] > 1e-3 for name in others)


def test_loss_shapes_send_a_power_law_to_the_grid_floor():
    t = np.logspace(1, 4, 40)
    fit = al.fits.loss_shapes(t, 2.0 - 1.2 * np.log(t))
    assert fit.power == pytest.approx(1.2) and fit.rms["power law"] < 1e-12
    assert fit.exponent == pytest.approx(al.fits.LOSS_SHAPE_GRID[0], abs=1e-6)
    assert fit.rms["a = 1/3"] > fit.rms["fitted a"] > fit.rms["power law"]


def test_loss_shapes_reject_bad_input():
    t = np.logspace(1, 3, 10)
    with pytest.raises(ValueError, match="equal length"):
        al.fits.loss_shapes(t, np.ones(9))
    with pytest.raises(ValueError, match="increasing"):
        al.fits.loss_shapes(t[::-1], -t)
    with pytest.raises(ValueError, match="finite"):
        al.fits.loss_shapes(t, np.full(10, -np.inf))
