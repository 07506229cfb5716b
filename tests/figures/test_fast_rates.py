"""Chapter figures: attnlib.figures.fast_rates."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pytest

import attnlib as al


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


# ------------------------------------------------------- GD, NGD and Polyak compared (fast rates)
def _tiny_comparison(methods=("gd", "ngd", "polyak")):
    probs = [r.problem for r in al.experiments.fast_rates.reduced_tokens(3, 4, 8, [0, 1, 2], size=9, family="global")]
    sols = al.experiments.fast_rates.solve_each(probs)
    lrs = {"gd": 5.0, "ngd": 0.3, "polyak": 1.0}
    return al.experiments.fast_rates.compare_methods(probs, sols, 50, {m: lrs[m] for m in methods}, 100.0), sols


def test_method_bands_draws_one_median_per_method_in_its_colour():
    cmp, _ = _tiny_comparison()
    fig, ax = plt.subplots()
    errors = {m: c["direction_error"] for m, c in cmp.curves.items()}
    al.figures.fast_rates.method_bands(
        ax, cmp.runs, errors, {"gd": "GD", "ngd": "NGD", "polyak": "P"}, members=[0, 2], upto=20
    )
    lines = ax.get_lines()
    assert [ln.get_label() for ln in lines] == ["GD", "NGD", "P"] and ax.get_xscale() == "log"
    assert [ln.get_color() for ln in lines] == [al.figures.fast_rates.METHOD_COLORS[m] for m in ("gd", "ngd", "polyak")]
    x, y = lines[1].get_data()
    keep = (cmp.runs["ngd"].steps > 0) & (cmp.runs["ngd"].steps <= 20)
    np.testing.assert_array_equal(x, cmp.runs["ngd"].steps[keep])
    np.testing.assert_allclose(y, np.median(errors["ngd"][keep][:, [0, 2]], axis=1))
    fig, ax = plt.subplots()
    al.figures.fast_rates.method_bands(ax, cmp.runs, errors, members=[0], clock=True)
    np.testing.assert_array_equal(ax.get_lines()[0].get_xdata(), cmp.runs["gd"].seconds[1:])


def test_rate_panels_and_rates_overview():
    cmp, sols = _tiny_comparison()
    wmm = np.array([1 / s.margin for s in sols])
    fig = al.figures.fast_rates.rate_panels(cmp, np.array([True, True, False]), {"gd": "GD", "ngd": "NGD"}, wmm, 0.3)
    assert len(fig.axes) == 6 and fig.axes[0].get_title() == "(a) direction error"
    assert len(fig.axes[5].get_lines()) == 3 + 2  # three medians, log t + c and eta t
    np.testing.assert_allclose(fig.axes[5].get_lines()[-1].get_ydata(), 0.3 * cmp.runs["ngd"].steps[1:])
    only_gd = al.experiments.fast_rates.Comparison({"gd": cmp.runs["gd"]}, {"gd": cmp.curves["gd"]})
    fig = al.figures.fast_rates.rates_overview(only_gd, slice(None), {"gd": "GD"}, 0.3, float(np.median(wmm)), upto=30)
    assert [len(ax.get_lines()) for ax in fig.axes] == [1, 1]  # no NGD line without NGD
    fig = al.figures.fast_rates.rates_overview(cmp, slice(None), None, 0.3, 2.0, upto=30)
    t, y = fig.axes[1].get_lines()[-1].get_data()
    assert t[-1] <= 30 and np.allclose(y, 0.3 * t / 2.0 / np.log(10))


def test_separators_fit_residuals_running_slope_and_selection_fractions():
    fig, axes = plt.subplots(2, 2)
    X, y = np.array([[0.5, 0.5], [-0.5, -0.2]]), np.array([1, -1])
    al.figures.fast_rates.separators(axes[0, 0], X, y, [[1.0, 0.0], [0.0, 2.0]], [1.0, 1.0], ["a", "b"])
    lines = axes[0, 0].get_lines()
    assert [ln.get_label() for ln in lines] == ["a", "b", "max-margin separator"]
    np.testing.assert_allclose(lines[1].get_xydata(), [[-1.3, 0.0], [1.3, 0.0]], atol=1e-12)  # orthogonal to w
    t = np.logspace(1, 3, 20)
    fits = [al.fits.inverse_log_vs_power(t, 1 / np.log(t)), al.fits.inverse_log_vs_power(t, t**-0.2)]
    al.figures.fast_rates.fit_residuals(axes[0, 1], t, fits)
    assert len(axes[0, 1].get_lines()) == 2 * 2 + 2 + 1
    al.figures.fast_rates.running_slope(axes[1, 0], t, np.ones((20, 3)), 0.1, label="s")
    assert len(axes[1, 0].patches) == 1 and axes[1, 0].get_lines()[0].get_label() == "s"
    al.figures.fast_rates.selection_fractions(axes[1, 1], [2, 4, 8], [0.2, 0.5, 1.0], [np.nan, 0.5, 0.9], threshold=7)
    assert [list(ln.get_ydata()) for ln in axes[1, 1].get_lines()[:2]][0] == [0.2, 0.5, 1.0]
    assert [tick.get_text() for tick in axes[1, 1].get_xticklabels()] == ["2", "4", "8"]
    assert al.figures.fast_rates.finish(fig) is fig


def test_polyak_failure_marks_the_stop_and_the_local_floor():
    prob = al.experiments.fast_rates.reduced_tokens(6, 8, 16, [16], size=42, family="random")[0].problem
    polyak = al.train_many([prob], 300, "polyak", 1.0, polyak_max_step=100.0)
    ngd = al.train_many([prob], 300, "ngd", 1.0)
    stop = polyak.stopped[0]
    assert stop is not None
    fig, axes = plt.subplots(1, 2)
    al.figures.fast_rates.polyak_failure(axes, polyak, ngd, stop.step, 1e-3, {"polyak": "P", "ngd": "N"}, refused=1e9)
    assert axes[0].get_lines()[0].get_xdata().max() <= stop.step  # Polyak drawn up to its stop
    assert axes[1].get_lines()[-1].get_ydata()[0] == pytest.approx(-3.0)  # log10 of the floor gap
    assert len(axes[0].texts) == 1 and "1e+09" in axes[0].texts[0].get_text()


def test_rates_overview_redraws_the_figure_it_is_given():
    cmp, sols = _tiny_comparison()
    fig = al.figures.fast_rates.rates_overview(cmp, slice(None), None, 0.3, 2.0)
    fig.subplots_adjust(left=0.2)
    only = al.experiments.fast_rates.Comparison({"ngd": cmp.runs["ngd"]}, {"ngd": cmp.curves["ngd"]})
    again = al.figures.fast_rates.rates_overview(only, slice(None), {"ngd": "NGD"}, 0.3, 2.0, upto=20, fig=fig)
    assert again is fig and len(fig.axes) == 2 and fig.subplotpars.left == 0.2
    assert [len(ax.get_lines()) for ax in fig.axes] == [1, 2]  # NGD's median, and its predicted line
    assert fig.axes[0].get_yscale() == "log" and fig.axes[0].get_xlabel() == "iteration $t$"
