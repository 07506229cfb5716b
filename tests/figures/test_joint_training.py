"""Chapter figures: attnlib.figures.joint_training."""

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


def _joint_run(h=1.5, steps=60):
    X, y = al.datasets.joint_tokens(third=(0.5, h))
    svms = al.joint_svms(X, y, select=1)
    return al.train_joint(X, y, al.datasets.JOINT_P0, al.datasets.JOINT_V0, steps=steps), svms


def test_joint_paths_draws_both_paths_the_three_svms_and_the_keys():
    traj, svms = _joint_run()
    fig, ax = plt.subplots()
    al.figures.joint_training.joint_paths(ax, traj, svms, upto=30, predicted=[1.0, 0.1])
    labels = [line.get_label() for line in ax.get_lines()]
    for label in ("attention $p(t)$", "head $v(t)$", "relaxed p-SVM", r"first-order $\hat p(\rho)$"):
        assert label in labels
    p_line = ax.get_lines()[labels.index("attention $p(t)$")]
    assert len(p_line.get_xdata()) == 31  # iterations 0..30 only
    assert p_line.get_color() == al.figures.common.COLORS["p"]
    chosen, others = ax.collections[:2]
    assert len(chosen.get_offsets()) == 3 and len(others.get_offsets()) == 3
    np.testing.assert_allclose(chosen.get_facecolors()[2][:3], 1.0)  # sample 3 is not a support vector: open
    fig2, ax2 = plt.subplots()
    al.figures.joint_training.joint_paths(ax2, *_joint_run(h=1.0))
    assert "full = relaxed p-SVM" in [line.get_label() for line in ax2.get_lines()]  # one SVM when they coincide


def test_joint_angles_probabilities_and_losses_draw_one_curve_per_quantity():
    traj, svms = _joint_run()
    fig, ax = plt.subplots()
    al.figures.joint_training.joint_angles(ax, traj.steps, traj.p[:, 0], svms, v=traj.v[:, 0], predicted=[1.0, 0.0])
    lines = ax.get_lines()
    assert len(lines) == 4 and ax.get_yscale() == "log"
    np.testing.assert_allclose(lines[0].get_ydata(), al.angle_degrees(traj.p[:, 0], svms.relaxed.theta))
    assert lines[-1].get_color() == al.figures.common.COLORS["v"]
    fig, ax = plt.subplots()
    mass = al.experiments.joint_training.selected_mass(traj)[:, 0]
    al.figures.joint_training.selection_probabilities(
        ax, traj.steps, mass, al.experiments.joint_training.classifier_confidence(traj)[:, 0]
    )
    np.testing.assert_allclose(ax.get_lines()[0].get_ydata(), mass.mean(-1))
    fig, axes = plt.subplots(1, 2)
    al.figures.joint_training.loss_angles(axes, {"logistic": traj, "linear": traj}, svms, np.array([1.0, 1.0]))
    assert len(axes[0].get_lines()) == 2 * 2 + 2  # two curves per loss, two legend keys
    assert axes[0].get_lines()[0].get_color() == "tab:red" and axes[0].get_lines()[2].get_color() == "tab:purple"


def test_arc_positions_and_radius_angles_draw_what_they_are_given():
    fig, ax = plt.subplots()
    al.figures.joint_training.arc_positions(ax, [([np.array([0.0, 0.1]), np.array([0.9])], "final", dict(color="r"))])
    assert [len(c.get_offsets()) for c in ax.collections[-2:]] == [2, 1]
    np.testing.assert_allclose(ax.collections[-1].get_offsets(), [[1.0, 0.9]])
    assert len(ax.patches) == 2  # the two quarter-separation bands
    _, svms = _joint_run()
    fig, ax = plt.subplots()
    p = np.array([[1.0, 0.1], [1.0, 0.01]])
    al.figures.joint_training.radius_angles(ax, [10.0, 100.0], p, svms, "relaxed, κ=2", ls=":")
    assert [line.get_color() for line in ax.get_lines()] == [al.figures.common.COLORS["p"], "0.5"]
    assert ax.get_xscale() == ax.get_yscale() == "log"


def test_joint_run_figure_has_the_paths_and_the_angles():
    traj, svms = _joint_run()
    fig = al.figures.joint_training.joint_run_figure(traj, svms, al.svm.balanced_direction(svms), "h = 1.5")
    left, right = fig.axes
    assert left.get_title() == "h = 1.5" and right.get_ylabel() == "angle of p (degrees)"
    assert len(right.get_lines()) == 3  # to the relaxed, the full p-SVM and the prediction
    assert al.book.widgets.figure_png(fig).startswith(b"\x89PNG")
