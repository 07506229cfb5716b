"""Chapter figures: attnlib.figures.common."""

import matplotlib
import numpy as np
import pytest

import attnlib as al

matplotlib.use("Agg")
import matplotlib.pyplot as plt


@pytest.fixture(scope="module")
def fig1b():
    prob = al.datasets.single_input(local=True)
    return prob, al.svm.locally_optimal_selections(prob)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_selection_table(fig1b):
    prob, _ = fig1b
    lines = al.figures.common.selection_table(prob, al.enumerate_selections(prob)).splitlines()
    assert len(lines) == 2 + prob.T
    assert lines[2].startswith("| 1 | (-0.1, 1) | 1 | (-0.099, 0.990) | 3 (0) | **yes** |")
    assert lines[4] == "| 3 | (0, 0) | 0 | (-1.000, -1.100) | 1 (1), 2 (0.9) | no |"
    infeasible = al.svm.SelectionReport((1,), False, False, None)
    assert (
        al.figures.common.selection_table(prob, [infeasible]).splitlines()[2]
        == "| 2 | (1, 0) | 0.9 | infeasible | – | no |"
    )
    two = al.datasets.multi_input()
    with pytest.raises(ValueError, match="one input"):
        al.figures.common.selection_table(two, [])


def test_sample_colors_match_tokens():
    prob = al.datasets.multi_input(0)
    fig, ax = plt.subplots()
    al.figures.common.tokens(ax, prob, annotate_scores=False)
    keys = prob.A.reshape(prob.n, prob.T, -1)[..., :2]
    drawn = 0
    for points in ax.collections:  # one scatter per marker: each point's colour is its sample's
        for xy, color in zip(points.get_offsets(), points.get_facecolors()):
            i, _ = np.argwhere(np.all(np.isclose(keys, xy), axis=-1))[0]
            np.testing.assert_allclose(color, matplotlib.colors.to_rgba(al.figures.common.SAMPLE_COLORS[i]))
            drawn += 1
    assert drawn == prob.n * prob.T
