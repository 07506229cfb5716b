"""Tests for the figure helpers and explorers added for chapter 1 (margin strips, slider, animation)."""

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


def test_margin_strips_lines_are_levels_one_margin_apart():
    prob = al.datasets.multi_input(0)
    sol = al.max_margin(prob)
    fig, ax = plt.subplots()
    al.plots.margin_strips(ax, prob, sol.theta)
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
    al.plots.margin_strips(ax, prob, sol.theta)
    rings = [c for c in ax.collections if len(c.get_offsets()) == 1 and np.all(c.get_facecolor()[:, 3] == 0)]
    ringed = {tuple(np.round(c.get_offsets()[0], 9)) for c in rings}
    expected = {tuple(np.round(prob.A[i, t, :2], 9)) for i, t in np.argwhere(sol.neighbors)}
    assert ringed == expected and len(expected) >= 1


def test_margin_strips_shading_and_labels():
    prob = al.datasets.single_input()
    sol = al.max_margin(prob)
    fig, ax = plt.subplots()
    al.plots.margin_strips(ax, prob, sol.theta, alpha=0.2)
    assert len(ax.patches) == 1  # one shaded strip for the one input
    labels = [h.get_label() for h in ax.get_legend_handles_labels()[0]]
    assert any("margin strip" in label for label in labels)
    assert any("SVM-neighbour" in label for label in labels)
    fig, ax = plt.subplots()
    al.plots.margin_strips(ax, prob, sol.theta, label=False)
    assert ax.get_legend_handles_labels()[0] == []
    assert len(ax.patches) == 0  # alpha=0 (default): lines only


def test_margin_strips_rejects_features_outside_the_key_plane():
    prob = al.token_selection(np.array([[[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]]), [[1.0, 0.0]])
    fig, ax = plt.subplots()
    with pytest.raises(ValueError, match="key plane"):
        al.plots.margin_strips(ax, prob, np.ones(3))
    prob2 = al.datasets.single_input()
    with pytest.raises(ValueError, match="entries"):
        al.plots.margin_strips(ax, prob2, np.ones(2))


def test_sample_colors_match_tokens():
    prob = al.datasets.multi_input(0)
    fig, ax = plt.subplots()
    al.plots.tokens(ax, prob, annotate_scores=False)
    first_of_each = [ax.collections[i * prob.T].get_facecolor()[0] for i in range(prob.n)]
    for i, color in enumerate(first_of_each):
        np.testing.assert_allclose(color, matplotlib.colors.to_rgba(al.plots.SAMPLE_COLORS[i]))


def _small_figure():
    fig, ax = plt.subplots(figsize=(2, 2))
    (line,) = ax.plot([0, 1], [0, 0])
    return fig, ax, line


def test_figure_slider_one_picture_per_value_and_linked():
    ipywidgets = pytest.importorskip("ipywidgets")
    fig, ax, line = _small_figure()
    calls = []

    def update(v):
        calls.append(v)
        line.set_ydata([0, v])

    box = al.widgets.figure_slider(fig, update, [0.0, 0.5, 1.0], description="slope", start=1, dpi=30)
    assert calls == [0.0, 0.5, 1.0]
    header, stack = box.children
    slider, readout = header.children
    assert isinstance(slider, ipywidgets.IntSlider) and (slider.min, slider.max, slider.value) == (0, 2, 1)
    images = stack.children
    assert len(images) == 3 and all(bytes(im.value).startswith(b"\x89PNG") for im in images)
    assert len({bytes(im.value) for im in images}) == 3  # the pictures differ
    assert stack.selected_index == 1 and readout.selected_index == 1
    assert not plt.fignum_exists(fig.number)  # closed


def test_figure_slider_rejects_bad_positions():
    pytest.importorskip("ipywidgets")
    fig, ax, line = _small_figure()
    with pytest.raises(ValueError, match="at least one"):
        al.widgets.figure_slider(fig, lambda v: None, [], description="x")
    with pytest.raises(ValueError, match="start"):
        al.widgets.figure_slider(fig, lambda v: None, [1, 2], description="x", start=2)


def test_path_animation_frames_and_html():
    pytest.importorskip("IPython")
    theta = np.cumsum(np.broadcast_to([[1.0, 0.5, 0.0], [0.5, -1.0, 0.0]], (21, 2, 3)), axis=0)
    titles = []

    def title(step):
        titles.append(step)
        return f"step {step}"

    html = al.widgets.path_animation(theta, frames=5, title=title, steps=np.arange(21) * 10, dpi=30)
    text = html.data
    assert text.count("data:image/png;base64") == 5
    assert titles == [0, 50, 100, 150, 200]
    assert "<script" in text and "anim" in text


def test_path_animation_rejects_bad_input():
    theta = np.zeros((10, 2, 3))
    with pytest.raises(ValueError, match="shape"):
        al.widgets.path_animation(np.zeros((10, 3)))
    with pytest.raises(ValueError, match="frames"):
        al.widgets.path_animation(theta, frames=11)
    with pytest.raises(ValueError, match="colors"):
        al.widgets.path_animation(theta, frames=2, colors=["r", "g", "b"])
    with pytest.raises(ValueError, match="steps"):
        al.widgets.path_animation(theta, frames=2, steps=np.arange(3))
