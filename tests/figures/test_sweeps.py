"""Chapter figures: attnlib.figures.sweeps."""

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


def test_check_values_by_seed_draws_one_panel_per_numeric_check_coloured_by_verdict():
    rows = [
        {"seed": 1, "check": "a", "value": "0.5", "status": "passed"},
        {"seed": 2, "check": "a", "value": 1.5, "status": "failed"},
        {"seed": 1, "check": "b", "value": "n/a", "status": "not applicable"},  # not a number: skipped
        {"seed": 1, "check": "c", "value": 2.0, "status": "not applicable"},
    ]
    fig = al.figures.sweeps.check_values_by_seed(rows, columns=2, log=("c",))
    a, c = fig.axes[:2]
    assert a.get_title() == "a" and c.get_title() == "c" and c.get_yscale() == "log"
    np.testing.assert_allclose(a.collections[0].get_offsets(), [[1, 0.5], [2, 1.5]])
    colors = a.collections[0].get_facecolors()
    np.testing.assert_allclose(colors[0][:3], matplotlib.colors.to_rgb(al.figures.sweeps.VERDICT_COLORS["passed"]))
    np.testing.assert_allclose(colors[1][:3], matplotlib.colors.to_rgb(al.figures.sweeps.VERDICT_COLORS["failed"]))
    assert [ax.axison for ax in fig.axes] == [True, True]  # two panels: "b" had no numeric value
