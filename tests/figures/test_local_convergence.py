"""Chapter figures: attnlib.figures.local_convergence."""

import matplotlib
import numpy as np
import pytest

import attnlib as al

matplotlib.use("Agg")
import matplotlib.pyplot as plt


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_basin_image_draws():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    kind = np.zeros((5, 5), int)
    kind[:2] = 1
    kind[2, 2] = -1
    al.figures.local_convergence.basin_image(ax, kind, (-1, 1, -1, 1))
    assert len(ax.collections) == 1  # the undecided dot
    plt.close(fig)
    with pytest.raises(ValueError):
        al.figures.local_convergence.basin_image(ax, np.zeros(3), (0, 1, 0, 1))


def test_local_convergence_figures_draw_what_they_say():
    prob = al.datasets.single_input(local=True)
    reports = al.enumerate_selections(prob)
    p_mm = {r.select[0] + 1: r.solution.theta for r in reports}
    fig, ax = plt.subplots()
    theta = al.train(prob, al.datasets.SINGLE_INPUT_INITS[:2], 20, "ngd", 0.1).theta
    al.figures.local_convergence.paths_to_two_directions(ax, prob, theta, p_mm[1], p_mm[2], "local", ":")
    rays = [line for line in ax.get_lines() if line.get_label() in ("global p_mm*", "local")]
    assert [r.get_linestyle() for r in rays] == ["--", ":"] and ax.get_xlim() == (-4, 12)
    assert rays[0].get_color() == al.figures.common.COLORS["global"]

    runs = al.experiments.local_convergence.cone_runs(
        prob, p_mm, 3, mu=1e-3, radius=20.0, steps=20, ngd_lr=0.1, gd_lr=1.0, rng=0
    )
    fig, axes = plt.subplots(1, 2)
    al.figures.local_convergence.cone_run_curves(axes, runs, {1: "r", 2: "b", 3: "g"})
    assert len(axes[0].get_lines()) == 9 + 1  # one curve per run, and the cone's edge
    assert len(axes[1].get_lines()) == 2 * 9 + 1  # NGD and GD per run, and the legend's GD entry

    maps = {
        "ngd": al.experiments.local_convergence.basin_map(
            prob, al.experiments.local_convergence.key_plane_grid(-4.0, 8.0, 4), 40, "ngd", 0.5
        )
    }
    fig, axes = plt.subplots(1, 1, squeeze=False)
    al.figures.local_convergence.basin_maps_panels(
        axes[0], maps, -4.0, 8.0, prob, al.datasets.SINGLE_INPUT_INITS, [1.0, 0.1, 0.0]
    )
    assert axes[0, 0].images[0].get_array().shape == (4, 4) and axes[0, 0].get_title().startswith("NGD: global")

    fig, ax = plt.subplots()
    al.figures.local_convergence.basin_explorer_frame(
        ax, np.zeros((3, 3), int), (-4.0, 8.0), prob, [[6.0, -3.0], [7.0, -2.0]], "t"
    )
    assert ax.lines[0].get_xydata().tolist() == [[6.0, -3.0], [7.0, -2.0]] and ax.get_title() == "t"


def test_selection_alignment_and_local_path_curves():
    probs = [al.datasets.random_tokens(3, 4, 5, seed=s, queries="cross") for s in range(2)]
    traj = al.train(al.stack_problems(probs), np.zeros((5, 5)), 100, "ngd", 0.1, record_every=50)
    align = al.experiments.local_convergence.selection_alignment(probs, traj)
    fig, axes = plt.subplots(1, 2)
    al.figures.local_convergence.selection_alignment_curves(axes, traj.steps, align)
    assert axes[0].get_lines()[0].get_xdata().tolist() == [50, 100]  # step 0 (W = 0) skipped
    assert [line.get_label() for line in axes[1].get_lines()] == ["corr(W(t), W_mm(α̂))", "corr(W(t), W_mm(opt))"]

    prob = al.datasets.single_input(local=True)
    cases = [
        ("Fig. 1(b)", al.experiments.local_convergence.local_path_case(prob, r.solution, per_decade=1, n_starts=1))
        for r in al.enumerate_selections(prob)
        if r.feasible
    ]
    fig, axes = plt.subplots(1, 2)
    al.figures.local_convergence.local_path_curves(axes, cases)
    n_local = sum(c.locally_optimal for _, c in cases)
    assert len(axes[0].get_lines()) == 3 * n_local  # path, bound and μ per locally-optimal selection
    assert len(axes[1].get_lines()) == 2 * (len(cases) - n_local)
    table = al.experiments.local_convergence.local_path_table(cases)
    assert table.count("\n") == len(cases) + 1 and "| Fig. 1(b) | (3,) | no | all above |" in table


def test_svm_equivalence_panels_draw_three_references_and_the_scatter():
    ex = al.experiments.local_convergence
    runs = ex.svm_equivalence_runs(d_values=(4,), candidates=20, steps=1000, seed=0)
    fig, axes = plt.subplots(1, 3)
    example = (np.array([1.0, 0.2, 0.6]), 0.5, "a mixture")
    al.figures.local_convergence.svm_equivalence_panels(axes, runs, ex.SVMEQ_WELL_MASKED, example)
    assert len(axes[0].lines) >= 3  # W^SVMeq, W_mm and the one-token SVM for d = 4
    assert axes[1].collections and axes[1].get_xscale() == "log"
    assert axes[2].lines and "mixture" in axes[2].get_title()


def test_step_size_panels_draw_one_loss_curve_per_step_and_one_row_per_method():
    prob = al.datasets.single_input(local=True)
    r = al.experiments.local_convergence.step_size_basins(
        prob, al.datasets.SINGLE_INPUT_INITS, [0.1, 100.0], 50, 0.5, 20
    )
    fig, axes = plt.subplots(1, 2)
    al.figures.local_convergence.step_size_panels(axes, r, [str(k) for k in range(6)], global_select=0)
    assert len(axes[0].lines) == 2
    assert [t.get_text() for t in axes[1].get_yticklabels()] == ["gradient flow", "GD, ηL = 0.1", "GD, ηL = 100", "NGD"]
    assert len(axes[1].texts) == 4 * 6 and all(t.get_fontsize() >= 11 for t in axes[1].texts)
