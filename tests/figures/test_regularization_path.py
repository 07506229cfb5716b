"""Chapter figures: attnlib.figures.regularization_path."""

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


def test_regularization_path_plots_draw_the_data_they_are_given():
    radii = np.array([1.0, 10.0, 100.0])
    fig, ax = plt.subplots()
    al.figures.regularization_path.path_directions(
        ax, [[1.0, 0.0, 0.0], [0.8, 0.6, 0.0], [0.6, 0.8, 0.0]], radii, length=2.0
    )
    assert len(ax.texts) == 3 and len(fig.axes) == 2  # one arrow per radius, and the colour bar
    assert ax.texts[2].xy == pytest.approx((1.2, 1.6))
    assert ax.texts[0].arrow_patch.get_edgecolor() != ax.texts[2].arrow_patch.get_edgecolor()  # coloured by R
    plt.close(fig)

    fig, ax = plt.subplots()
    al.figures.regularization_path.direction_error(
        ax, radii, [1e-2, 1e-4, 0.0], bound=[2.0, 0.5, 0.05], others=[[1e-2, 1e-3, 1e-4]]
    )
    others, error, bound = ax.get_lines()
    assert others.get_color() == "0.6" and error.get_ydata()[-1] == 1e-20  # an exact 0 drawn at the floor
    assert np.isnan(bound.get_ydata()[0]) and bound.get_ydata()[2] == 0.05  # the bound only where below 1
    al.figures.regularization_path.direction_error(ax, radii, [1e-2, 1e-4, 1e-6], scale=radii**2, color="tab:purple")
    assert ax.get_lines()[-1].get_ydata() == pytest.approx([1e-2, 1e-2, 1e-2])
    plt.close(fig)

    fig, ax = plt.subplots()
    al.figures.regularization_path.loss_gap_by_subtraction(
        ax, radii, np.log([1e-3, 1e-9, 1e-30]), [1e-3, 1e-9, 0.0], resolution=1e-16
    )
    logspace, subtracted, floor = ax.get_lines()
    assert logspace.get_ydata()[-1] == pytest.approx(1e-30) and np.isnan(subtracted.get_ydata()[-1])
    plt.close(fig)


def test_matrix_path_figure_keeps_one_colour_per_geometry_in_both_panels():
    fig, ax = plt.subplots()
    al.figures.regularization_path.margin_deficit(ax, [1.0, 10.0], [0.5, 0.9], [-0.2, 0.8], 0.7, "tab:blue", "W path")
    path_line, bound_line, other_line = ax.get_lines()
    assert path_line.get_ydata() == pytest.approx([0.5, 0.1]) and np.isnan(bound_line.get_ydata()[0])
    assert other_line.get_ydata()[0] == pytest.approx(0.3)
    assert {line.get_color() for line in ax.get_lines()} == {"tab:blue"}
    plt.close(fig)

    mat = al.experiments.regularization_path.matrix_paths(
        al.datasets.random_tokens(3, 4, 4, seed=0), [1.0, 30.0], tol=1e-6, max_iter=200
    )
    fig = al.figures.regularization_path.margin_deficits_and_spectra(mat)
    left, right = fig.axes
    fro, nuc = al.figures.regularization_path.NORM_COLORS["fro"], al.figures.regularization_path.NORM_COLORS["nuc"]
    assert [line.get_color() for line in left.get_lines()] == [fro] * 3 + [nuc] * 3
    spectra = right.get_lines()[:4]  # W-SVM, W path, nuclear SVM, (K, Q) path; then the threshold
    assert [line.get_color() for line in spectra] == [fro, fro, nuc, nuc]
    assert all(line.get_ydata()[0] == 1.0 for line in spectra)  # s_k / s_1
    plt.close(fig)


def test_attention_on_keys_rings_are_the_softmax_weights():
    prob = al.datasets.multi_input(0, nonopt_scores=0.5)
    theta = np.array([2.0, 0.5, 0.0])
    fig, ax = plt.subplots()
    al.figures.regularization_path.attention_on_keys(
        ax, prob, theta, theta_mm=al.max_margin(prob).theta, ring_area=100.0
    )
    rings = ax.collections[-1]
    assert rings.get_sizes() == pytest.approx(100.0 * prob.attention(theta).ravel())
    assert len(ax.collections) == 2 * prob.n + 1 and len(ax.texts) == 1 and len(ax.get_lines()) == 1
    plt.close(fig)
