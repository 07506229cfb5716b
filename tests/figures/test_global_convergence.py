"""Chapter figures: attnlib.figures.global_convergence."""

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


def _strip_lines(ax):
    """The (solid, dashed) level lines that margin_strips drew, as (point, direction) pairs."""
    return [line for line in ax.get_lines() if line.get_linestyle() in ("-", "--")]


def _ngd_gd_runs(steps=30):
    prob = al.datasets.multi_input(1)
    starts = al.datasets.MULTI_INPUT_INITS[:3]
    ngd = al.train(prob, starts, steps=steps, method="ngd", lr=0.1)
    gd = al.train(prob, starts, steps=steps, method="gd", lr=1.0)
    return prob, al.max_margin(prob), starts, ngd, gd


def test_margin_strips_lines_are_levels_one_margin_apart():
    prob = al.datasets.multi_input(0)
    sol = al.max_margin(prob)
    fig, ax = plt.subplots()
    al.figures.global_convergence.margin_strips(ax, prob, sol.theta)
    lines = _strip_lines(ax)
    assert len(lines) == 2 * prob.n  # one solid and one dashed line per input
    w = sol.theta[:2]
    unit = w / np.linalg.norm(w)
    keys = prob.A[..., :2]
    for i in range(prob.n):
        solid, dashed = lines[2 * i], lines[2 * i + 1]
        assert solid.get_linestyle() == "-" and dashed.get_linestyle() == "--"
        # Every point of a line has the same projection on the SVM direction: a level line.
        levels_solid = np.c_[solid.get_xdata(), solid.get_ydata()] @ unit
        levels_dashed = np.c_[dashed.get_xdata(), dashed.get_ydata()] @ unit
        np.testing.assert_allclose(levels_solid, unit @ keys[i, prob.opt[i]], atol=1e-12)
        np.testing.assert_allclose(levels_solid - levels_dashed, sol.margin, atol=1e-12)
        # No other token of input i lies strictly between its two lines (the SVM constraints).
        others = np.delete(keys[i], prob.opt[i], axis=0) @ unit
        assert np.all(others <= levels_dashed[0] + 1e-9)


def test_margin_strips_rings_exactly_the_svm_neighbours():
    prob = al.datasets.multi_input(1)
    sol = al.max_margin(prob)
    fig, ax = plt.subplots()
    al.figures.global_convergence.margin_strips(ax, prob, sol.theta)
    rings = [c for c in ax.collections if len(c.get_offsets()) == 1 and np.all(c.get_facecolor()[:, 3] == 0)]
    ringed = {tuple(np.round(c.get_offsets()[0], 9)) for c in rings}
    expected = {tuple(np.round(prob.A[i, t, :2], 9)) for i, t in np.argwhere(sol.neighbors)}
    assert ringed == expected and len(expected) >= 1


def test_margin_strips_shading_and_labels():
    prob = al.datasets.single_input()
    sol = al.max_margin(prob)
    fig, ax = plt.subplots()
    al.figures.global_convergence.margin_strips(ax, prob, sol.theta, alpha=0.2)
    assert len(ax.patches) == 1  # one shaded strip for the one input
    labels = [h.get_label() for h in ax.get_legend_handles_labels()[0]]
    assert any("margin strip" in label for label in labels)
    assert any("SVM-neighbour" in label for label in labels)
    fig, ax = plt.subplots()
    al.figures.global_convergence.margin_strips(ax, prob, sol.theta, label=False)
    assert ax.get_legend_handles_labels()[0] == []
    assert len(ax.patches) == 0  # alpha=0 (default): lines only


def test_margin_strips_rejects_features_outside_the_key_plane():
    prob = al.token_selection(np.array([[[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]]), [[1.0, 0.0]])
    fig, ax = plt.subplots()
    with pytest.raises(ValueError, match="key plane"):
        al.figures.global_convergence.margin_strips(ax, prob, np.ones(3))
    prob2 = al.datasets.single_input()
    with pytest.raises(ValueError, match="entries"):
        al.figures.global_convergence.margin_strips(ax, prob2, np.ones(2))


def test_gradient_cosine_map_draws_the_grid_and_the_zero_level():
    grid = np.linspace(-1, 1, 5)
    cos = np.add.outer(grid, 0 * grid).ravel()  # cos = p_1: negative on the left, zero in the middle column
    fig, ax = plt.subplots()
    image = al.figures.global_convergence.gradient_cosine_map(ax, grid, cos)
    assert image.get_array().size == 25 and image.get_clim() == (-1, 1)
    assert len(ax.collections) == 2  # the mesh and the zero contour
    np.testing.assert_allclose(image.get_array().reshape(5, 5)[0], grid)  # row b (p_2) runs along p_1
    fig2, ax2 = plt.subplots()
    al.figures.global_convergence.gradient_cosine_map(ax2, grid, -np.ones(25))
    assert len(ax2.collections) == 1  # no sign change, no zero level


def test_path_with_direction_error_draws_the_path_and_its_error():
    prob = al.datasets.multi_input(0)
    sol = al.max_margin(prob)
    run = al.train(prob, np.array([-2.0, 1.0, 0.0]), steps=50, method="ngd", lr=0.1)
    fig = al.figures.global_convergence.path_with_direction_error(
        prob, sol.theta, run.steps, run.theta[:, 0], title="t"
    )
    left, right = fig.axes
    path = next(line for line in left.get_lines() if line.get_label().startswith("path"))
    np.testing.assert_allclose(path.get_xydata(), run.theta[:, 0, :2])
    error = right.get_lines()[0].get_ydata()
    np.testing.assert_allclose(error, al.one_minus_cosine(run.theta[1:, 0], sol.theta))
    assert right.get_xscale() == "log" and fig._suptitle.get_text() == "t"
    with pytest.raises(ValueError):
        al.figures.global_convergence.path_with_direction_error(prob, sol.theta, run.steps[:-1], run.theta[:, 0])


def test_start_paths_and_direction_error_curves_draw_every_run():
    prob, sol, starts, ngd, _ = _ngd_gd_runs()
    fig, axes = plt.subplots(1, 2)
    al.figures.global_convergence.start_paths(axes[0], prob, ngd.theta[:11], sol.theta, ["r", "g", "b"], "t")
    drawn = [line.get_xydata() for line in axes[0].get_lines() if len(line.get_xydata()) == 11]
    assert len(drawn) == 3 and np.allclose(drawn[1], ngd.theta[:11, 1, :2])
    al.figures.global_convergence.direction_error_curves(
        axes[1], ngd.steps, ngd.theta, sol.theta, ["r", "g", "b"], list("abc"), slope=-2
    )
    lines = axes[1].get_lines()
    assert len(lines) == 4 and lines[3].get_linestyle() == "--"
    np.testing.assert_allclose(lines[2].get_ydata(), al.one_minus_cosine(ngd.theta[1:, 2], sol.theta))


def test_ngd_and_gd_overview_and_gd_against_ngd_panels():
    prob, sol, starts, ngd, gd = _ngd_gd_runs()
    fig = al.figures.global_convergence.ngd_and_gd_overview(prob, sol.theta, ngd, gd, starts, 20, 0.1, 1.0)
    assert len(fig.axes) == 3
    mass = fig.axes[1].get_lines()[0].get_ydata()  # NGD from p(0) = 0 (row 2 of the starts)
    np.testing.assert_allclose(mass, al.metrics.selection_mass(prob, ngd.theta[:21, 2]).mean(-1))
    fig2, slope = al.figures.global_convergence.gd_against_ngd(prob, sol.theta, gd, ngd, 2, slice(3, 31))
    assert slope == pytest.approx(al.fit_slope(gd.steps[3:], gd.norm[3:, 2], log_y=False)[0])
    assert [ax.get_xscale() for ax in fig2.axes] == ["log"] * 3


def test_input_gaps_by_angle_finds_the_svm_direction():
    prob = al.datasets.multi_input(0)
    sol = al.max_margin(prob)
    fig, ax = plt.subplots()
    best = al.figures.global_convergence.input_gaps_by_angle(ax, prob, sol.theta, step_degrees=0.5)
    assert abs(best - np.degrees(np.arctan2(sol.theta[1], sol.theta[0]))) <= 0.5
    assert len(ax.get_lines()) == prob.n + 3  # one gap per input, the minimum, the two references


def test_offset_study_and_random_start_runs_draw_their_runs():
    runs = {
        (loss, C): al.train(al.datasets.loss_study(C, loss), np.zeros(3), steps=20, method="ngd", lr=0.1)
        for loss in ("linear", "logistic")
        for C in (1.0, 3.0)
    }
    fig = al.figures.global_convergence.offset_study(
        runs, lambda C, loss: 0 * np.asarray(C), 10, {"linear": "a", "logistic": "b"}, {"linear": "r", "logistic": "b"}
    )
    final = fig.axes[2].get_lines()[1].get_ydata()  # the linear loss's measured final offsets
    np.testing.assert_allclose(final, [runs["linear", C].theta[-1, 0, 1] for C in (1.0, 3.0)])
    prob, sol, starts, ngd, _ = _ngd_gd_runs()
    fig2 = al.figures.global_convergence.random_start_runs(
        ngd.theta, 30, ngd.steps, ngd.theta, sol.theta, [False, True, False], 5.0
    )
    orange = [line for line in fig2.axes[0].get_lines() if line.get_color() == "tab:orange"]
    assert len(orange) == 2  # the adversarial path and its legend entry


def test_gap_descent_and_w_panels_and_norm_and_offset_settling():
    fig, axes = plt.subplots(1, 3)
    t = np.array([1.0, 10.0, 100.0])
    grid = np.linspace(-2, 2, 5)
    w_steps = np.arange(4.0)
    errors = [(np.full((4, 2), 0.1), "r", "a"), (np.full((4, 2), 0.2), "0.5", "b")]
    al.figures.global_convergence.gap_descent_and_w_panels(
        axes, [(t, 1 - 1 / t, "x")], grid, -np.ones(25), [1.0, 0.0], w_steps, errors
    )
    np.testing.assert_allclose(axes[0].get_lines()[0].get_ydata(), 1 - 1 / t)
    assert len(fig.axes) == 4  # the three panels and the colour bar
    assert len([line for line in axes[2].get_lines() if len(line.get_xdata()) == 3]) == 4  # 2 runs x 2 references
    fig2, axes2 = plt.subplots(1, 2)
    al.figures.global_convergence.norm_and_offset_settling(axes2, t, 2 * np.log(t) + 1, 2.0, 1 / t, 1.0)
    guide = axes2[0].get_lines()[1].get_ydata()
    np.testing.assert_allclose(guide, 2 * np.log(t) + 1)  # slope M through the last point: the run itself
    np.testing.assert_allclose(axes2[1].get_lines()[1].get_ydata(), 1 / t)
