"""Tests for the figure helpers and the explorers (margin strips; static sliders, live explorers, animations)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

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


def test_sample_colors_match_tokens():
    prob = al.datasets.multi_input(0)
    fig, ax = plt.subplots()
    al.figures.common.tokens(ax, prob, annotate_scores=False)
    first_of_each = [ax.collections[i * prob.T].get_facecolor()[0] for i in range(prob.n)]
    for i, color in enumerate(first_of_each):
        np.testing.assert_allclose(color, matplotlib.colors.to_rgba(al.figures.common.SAMPLE_COLORS[i]))


def _small_figure():
    fig, ax = plt.subplots(figsize=(2, 2))
    (line,) = ax.plot([0, 1], [0, 0])
    return fig, ax, line


def _shown(slider_html: str) -> list[int]:
    """Indices of the pictures a StaticSlider's HTML shows (not ``hidden``)."""
    images = re.findall(r"<img [^>]*>", slider_html)
    return [k for k, tag in enumerate(images) if " hidden" not in tag]


def test_figure_slider_one_picture_per_value_and_static_html():
    fig, ax, line = _small_figure()
    calls = []

    def update(v):
        calls.append(v)
        line.set_ydata([0, v])

    slider = al.book.widgets.figure_slider(fig, update, [0.0, 0.5, 1.0], description="slope", start=1, dpi=30)
    assert calls == [0.0, 0.5, 1.0]
    assert isinstance(slider, al.book.widgets.StaticSlider) and len(slider) == 3 and slider.start == 1
    assert all(png.startswith(b"\x89PNG") for png in slider.pictures)
    assert len(set(slider.pictures)) == 3  # the pictures differ
    assert slider.labels == ["0.0", "0.5", "1.0"]
    page = slider._repr_html_()
    assert page.count("data:image/png;base64,") == 3 and _shown(page) == [1]  # one picture shown: the start
    assert 'type="range"' in page and 'min="0"' in page and 'max="2"' in page and 'value="1"' in page
    assert "<b>0.5</b>" in page and "slope" in page
    assert "jupyter-widget" not in page  # plain HTML: no widget manager needed
    assert not plt.fignum_exists(fig.number)  # closed


def test_image_slider_in_a_kernel_swaps_one_image_from_python():
    widgets = pytest.importorskip("ipywidgets")

    def draw(v):
        fig, ax = plt.subplots(figsize=(1, 1))
        ax.plot([0, 1], [0, v])
        return fig

    box = al.book.widgets.image_slider(
        [0, 1, 2], draw, "v", start=1, dpi=20, format_value=lambda v: f"v={v}", mode="live"
    )
    assert isinstance(box, widgets.VBox) and not any(isinstance(w, widgets.Stack) for w in box.children)
    pictures = []
    for k in (0, 2, 1):
        box.slider.value = k
        assert box.readout.value == f"<b>v={k}</b>"
        pictures.append(bytes(box.picture.value))
    assert len(set(pictures)) == 3


def test_static_slider_escapes_labels():
    slider = al.book.widgets.StaticSlider([b"\x89PNG a", b"\x89PNG b"], ["<b>x</b>", "</script>"], "a & b")
    page = slider._repr_html_()
    assert "a &amp; b" in page and "&lt;b&gt;x&lt;/b&gt;" in page
    assert page.count("</script>") == 1  # a label cannot close the script early
    with pytest.raises(ValueError, match="one label per picture"):
        al.book.widgets.StaticSlider([b"a"], [], "x")
    with pytest.raises(ValueError, match="start"):
        al.book.widgets.StaticSlider([b"a"], ["a"], "x", start=1)


def test_figure_slider_rejects_bad_positions():
    fig, ax, line = _small_figure()
    with pytest.raises(ValueError, match="at least one"):
        al.book.widgets.figure_slider(fig, lambda v: None, [], description="x")
    with pytest.raises(ValueError, match="start"):
        al.book.widgets.figure_slider(fig, lambda v: None, [1, 2], description="x", start=2)


def test_path_animation_frames_and_html():
    pytest.importorskip("IPython")
    theta = np.cumsum(np.broadcast_to([[1.0, 0.5, 0.0], [0.5, -1.0, 0.0]], (21, 2, 3)), axis=0)
    titles = []

    def title(step):
        titles.append(step)
        return f"step {step}"

    html = al.book.widgets.path_animation(theta, frames=5, title=title, steps=np.arange(21) * 10, dpi=30)
    text = html.data
    assert text.count("data:image/png;base64") == 5
    assert titles == [0, 50, 100, 150, 200]
    assert "<script" in text and "anim" in text


def test_path_animation_rejects_bad_input():
    theta = np.zeros((10, 2, 3))
    with pytest.raises(ValueError, match="shape"):
        al.book.widgets.path_animation(np.zeros((10, 3)))
    with pytest.raises(ValueError, match="frames"):
        al.book.widgets.path_animation(theta, frames=11)
    with pytest.raises(ValueError, match="colors"):
        al.book.widgets.path_animation(theta, frames=2, colors=["r", "g", "b"])
    with pytest.raises(ValueError, match="steps"):
        al.book.widgets.path_animation(theta, frames=2, steps=np.arange(3))


# --- explorer(): static in the book, live in a kernel -----------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "explorer.ipynb"


def _line_draw(calls):
    def draw(slope, offset=0.0, start=(0.0, 0.0), seed=0):
        calls.append({"slope": slope, "offset": offset, "start": start, "seed": seed})
        fig, ax = plt.subplots(figsize=(2, 2))
        ax.plot([start[0], 1], [start[1], slope + offset + seed])
        return fig

    return draw


def test_explorer_mode_follows_argument_then_environment(monkeypatch):
    monkeypatch.delenv(al.book.widgets.EXPLORERS_ENV, raising=False)
    assert al.book.widgets.explorer_mode() == "static"  # no kernel here: nobody to call back
    monkeypatch.setenv(al.book.widgets.EXPLORERS_ENV, "live")
    assert al.book.widgets.explorer_mode() == "live"
    assert al.book.widgets.explorer_mode("static") == "static"  # the argument wins
    monkeypatch.setenv(al.book.widgets.EXPLORERS_ENV, "sometimes")
    with pytest.raises(ValueError, match="ATTNLIB_EXPLORERS"):
        al.book.widgets.explorer_mode()
    with pytest.raises(ValueError, match="mode"):
        al.book.widgets.explorer_mode("dynamic")


def test_static_explorers_sets_and_restores_the_environment(monkeypatch):
    monkeypatch.setenv(al.book.widgets.EXPLORERS_ENV, "live")
    with al.book.widgets.static_explorers():
        assert os.environ[al.book.widgets.EXPLORERS_ENV] == "static"
    assert os.environ[al.book.widgets.EXPLORERS_ENV] == "live"
    monkeypatch.delenv(al.book.widgets.EXPLORERS_ENV)
    with pytest.raises(RuntimeError), al.book.widgets.static_explorers():
        raise RuntimeError("the notebook failed")
    assert al.book.widgets.EXPLORERS_ENV not in os.environ  # restored even on error


def test_explorer_static_precomputes_every_position_with_live_defaults(monkeypatch):
    monkeypatch.setenv(al.book.widgets.EXPLORERS_ENV, "static")
    calls = []
    out = al.explorer(
        _line_draw(calls), "slope", [0.0, 1.0, 2.0], "slope", live={"offset": 0.5, "seed": 3}, start=2, dpi=30
    )
    assert isinstance(out, al.book.widgets.StaticSlider) and len(out) == 3 and out.start == 2
    assert [c["slope"] for c in calls] == [0.0, 1.0, 2.0]
    assert all(c["offset"] == 0.5 and c["seed"] == 3 for c in calls)
    assert len(set(out.pictures)) == 3
    assert plt.get_fignums() == []  # every figure closed


def test_explorer_may_redraw_one_figure():
    fig, ax, line = _small_figure()

    def draw(slope, seed):
        line.set_ydata([0, slope + seed])
        return fig

    static = al.explorer(draw, "slope", [0.0, 0.5, 1.0], "slope", live={"seed": 0}, dpi=20, mode="static")
    assert len(set(static.pictures)) == 3
    live = al.explorer(draw, "slope", [0.0, 0.5, 1.0], "slope", live={"seed": 0}, dpi=20, mode="live")
    first = bytes(live.picture.value)
    live.controls["seed"].value = 2
    assert bytes(live.picture.value) != first


def test_explorer_live_redraws_on_every_control():
    widgets = pytest.importorskip("ipywidgets")
    calls = []
    box = al.explorer(
        _line_draw(calls),
        "slope",
        [0.0, 1.0, 2.0],
        "slope",
        live={"offset": 0.5, "seed": 3, "start": (0.1, -0.2)},
        dpi=30,
        mode="live",
    )
    assert isinstance(box, widgets.VBox)
    assert calls == [{"slope": 0.0, "offset": 0.5, "start": (0.1, -0.2), "seed": 3}]  # drawn once at start
    first = bytes(box.picture.value)
    assert first.startswith(b"\x89PNG") and "computed live" in box.status.value
    box.controls["slope"].value = 1.75  # a value between the slider's positions, typed
    assert calls[-1]["slope"] == 1.75 and bytes(box.picture.value) != first
    box.slider.value = 2  # the slider's third position
    assert calls[-1]["slope"] == 2.0 and box.controls["slope"].value == 2.0
    n = len(calls)
    box.slider.value = 0
    assert len(calls) == n + 1  # one redraw per move, not two
    box.controls["seed"].value = 7
    assert calls[-1]["seed"] == 7
    start_x, start_y = box.controls["start"].children[1:]
    start_y.value = 4.0
    assert calls[-1]["start"] == (0.1, 4.0)
    box.controls["offset"].value = 1.5
    assert calls[-1] == {"slope": 0.0, "offset": 1.5, "start": (0.1, 4.0), "seed": 7}


def test_explorer_live_shows_errors_instead_of_raising():
    pytest.importorskip("ipywidgets")

    def draw(n):
        if n < 0:
            raise ValueError("n must be >= 0")
        fig, ax = plt.subplots(figsize=(1, 1))
        ax.plot([0, n])
        return fig

    box = al.explorer(draw, "n", [0, 1], "n", mode="live", dpi=20)
    picture = bytes(box.picture.value)
    box.controls["n"].value = -1
    assert "ValueError: n must be &gt;= 0" in box.status.value
    assert bytes(box.picture.value) == picture  # the last good picture stays


def test_explorer_live_controls_of_every_kind():
    widgets = pytest.importorskip("ipywidgets")
    calls = []
    dropdown = widgets.Dropdown(options=["logistic", "exponential"], value="logistic")

    def draw(which, flag, name, loss):
        calls.append((which, flag, name, loss))
        return plt.figure(figsize=(1, 1))

    box = al.explorer(
        draw, "which", ["a", "b"], "which", live={"flag": True, "name": "x", "loss": dropdown}, mode="live", dpi=10
    )
    assert "which" not in box.controls  # labels: no typed box, the slider picks them
    assert isinstance(box.controls["flag"], widgets.Checkbox) and isinstance(box.controls["name"], widgets.Text)
    assert box.controls["loss"] is dropdown
    dropdown.value = "exponential"
    box.slider.value = 1
    assert calls[-1] == ("b", True, "x", "exponential")


def test_explorer_rejects_bad_arguments():
    draw = _line_draw([])
    with pytest.raises(ValueError, match="at least one"):
        al.explorer(draw, "slope", [], "s")
    with pytest.raises(ValueError, match="start"):
        al.explorer(draw, "slope", [1.0], "s", start=1)
    with pytest.raises(ValueError, match="slider's parameter"):
        al.explorer(draw, "slope", [1.0], "s", live={"slope": 2.0})
    with pytest.raises(TypeError, match="live control 'seed'"):
        al.explorer(draw, "slope", [1.0], "s", live={"seed": object()}, mode="live")
    with pytest.raises(ValueError, match="mode"):
        al.explorer(draw, "slope", [1.0], "s", mode="dynamic")


@pytest.mark.notebook
def test_a_run_builds_static_explorers_and_prints_no_transport_warning(tmp_path):
    """``python -m attnlib run``: the kernel gets ATTNLIB_EXPLORERS=static and encrypted transport."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    env.pop(al.book.widgets.EXPLORERS_ENV, None)
    out = tmp_path / "explorer.ipynb"
    result = subprocess.run(
        [sys.executable, "-m", "attnlib", "run", str(FIXTURE), "-p", "steps", "40", "-o", str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "without encryption" not in result.stderr and "WARNING" not in result.stderr, result.stderr
    outputs = [o for cell in json.loads(out.read_text())["cells"] for o in cell.get("outputs", [])]
    pages = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert len(pages) == 1 and 'class="attnlib-slider"' in "".join(pages[0])
    assert not any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs)


@pytest.mark.notebook
def test_the_live_explorer_redraws_in_a_kernel():
    """The fixture run in a real kernel (nbclient), live: typing a start recomputes the trajectory.

    The same as the JupyterLab test of tests/test_browser.py, without a browser.
    """
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(FIXTURE, as_version=4)
    notebook.cells.append(
        nbformat.v4.new_code_cell(
            "box = _\n"  # the explorer: the previous cell's result
            "before = bytes(box.picture.value)\n"
            "x, y = box.controls['start'].children[1:]\n"
            "x.value = -2.0\n"
            "after = bytes(box.picture.value)\n"
            "print(type(box).__name__, before != after, after.startswith(b'\\x89PNG'), box.status.value)"
        )
    )
    previous = os.environ.get(al.book.widgets.EXPLORERS_ENV)
    os.environ.pop(al.book.widgets.EXPLORERS_ENV, None)  # the default in a kernel: live
    try:
        NotebookClient(notebook, timeout=300, resources={"metadata": {"path": str(FIXTURE.parent)}}).execute()
    finally:
        if previous is not None:
            os.environ[al.book.widgets.EXPLORERS_ENV] = previous
    outputs = notebook.cells[-2].outputs
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs)  # a live widget
    printed = "".join(o.get("text", "") for o in notebook.cells[-1].outputs)
    assert printed.startswith("VBox True True") and "start = (-2.0, -0.5)" in printed, printed


PROBE_FIND_EXPLORER = "box = [v for v in Out.values() if hasattr(v, 'controls')][-1]\n"


def run_chapter_live(tmp_path, monkeypatch, notebook_name, probe, **small):
    """Run a chapter at ``small`` sizes in a real kernel with live explorers, ``probe`` (code that
    finds the explorer as ``box``, changes its controls and prints) inserted after the explorer's
    cell. Returns what the probe printed, and the error values of any cell (the chapter's own checks
    may fail at small sizes: the probe has run before them)."""
    import nbformat
    import papermill

    root = Path(__file__).resolve().parents[1]
    notebook = nbformat.read(root / "notebooks" / notebook_name, as_version=4)
    at = next(i for i, cell in enumerate(notebook.cells) if "al.explorer(" in cell.source) + 1
    notebook.cells.insert(at, nbformat.v4.new_code_cell(PROBE_FIND_EXPLORER + probe))
    source, executed = tmp_path / notebook_name, tmp_path / "out.ipynb"
    nbformat.write(notebook, source)
    monkeypatch.setenv(al.book.widgets.EXPLORERS_ENV, "live")
    try:
        papermill.execute_notebook(
            str(source), str(executed), parameters=small, cwd=str(root / "notebooks"), progress_bar=False
        )
    except papermill.PapermillExecutionError:
        pass  # the chapter's own checks need its full sizes; the probe ran before them
    result = nbformat.read(executed, as_version=4)
    # Found by its source, not its index: papermill inserts cells (parameters, and an error banner).
    probe_cell = next(cell for cell in result.cells if cell.source.startswith(PROBE_FIND_EXPLORER))
    printed = "".join(o.get("text", "") for o in probe_cell.outputs)
    errors = [o.get("evalue") for cell in result.cells for o in cell.get("outputs", []) if o.get("evalue")]
    return printed, errors


def test_chapter_3_explorer_computes_a_readers_own_start_live(tmp_path, monkeypatch):
    """What `make lab` gives a reader of chapter 3: the basin-map explorer is live, and a start typed
    into it is trained and drawn on demand (chapter run with small sizes in a real kernel)."""
    printed, errors = run_chapter_live(
        tmp_path,
        monkeypatch,
        "03_local_convergence.ipynb",
        "before = bytes(box.picture.value)\n"
        "x, y = box.controls['start'].children[1:]\n"
        "x.value, y.value = -1.0, 2.5\n"
        "after = bytes(box.picture.value)\n"
        "print('LIVE', type(box).__name__, before != after, after.startswith(b'\\x89PNG'), box.status.value)",
        grid_size=16,
        explorer_size=12,
        explorer_positions=2,
        n_seeds=4,
        w_steps=200,
        map_extend_steps=50,
    )
    assert printed.startswith("LIVE VBox True True") and "(-1.0, 2.5)" in printed, printed


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


def test_chapter_4_explorer_trains_a_readers_own_step_size_ratio_live(tmp_path, monkeypatch):
    """What `make lab` gives a reader of chapter 4: the explorer is live; a ratio rho of the step sizes
    typed into it trains a new joint run and redraws (chapter run with small sizes in a real kernel)."""
    printed, errors = run_chapter_live(
        tmp_path,
        monkeypatch,
        "04_joint_training.ipynb",
        "before = bytes(box.picture.value)\n"
        "runs_before = len(explorer_runs)\n"
        "box.controls['rho'].value = 3.0\n"
        "after = bytes(box.picture.value)\n"
        "print('LIVE', type(box).__name__, before != after, after.startswith(b'\\x89PNG'),"
        " len(explorer_runs) - runs_before, box.status.value)",
        steps=400,
        n_random=2,
        random_inits=1,
        explorer_positions=2,
        explorer_steps=100,
        path_points=2,
    )
    assert printed.startswith("LIVE VBox True True 1") and "rho = 3.0" in printed, printed


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


def test_chapter_2_explorer_solves_a_readers_seed_and_radius_live(tmp_path, monkeypatch):
    """What `make lab` gives a reader of chapter 2: the path explorer is live; a seed and a radius typed
    into it are solved and drawn on demand (chapter run with small sizes in a real kernel)."""
    printed, errors = run_chapter_live(
        tmp_path,
        monkeypatch,
        "02_regularization_path.ipynb",
        "before = bytes(box.picture.value)\n"
        "box.controls['seed'].value = 7\n"
        "after_seed = bytes(box.picture.value)\n"
        "box.controls['R'].value = 3.0\n"
        "after_radius = bytes(box.picture.value)\n"
        "print('LIVE', type(box).__name__, before != after_seed, after_seed != after_radius,"
        " after_radius.startswith(b'\\x89PNG'), box.status.value)",
        n_radii=4,
        r_max=20.0,
        n_starts=1,
        n_seeds=1,
        n_radii_matrix=3,
        r_max_matrix=20.0,
        head_starts=1,
    )
    assert printed.startswith("LIVE VBox True True True"), printed
    assert "R = 3.0" in printed and "seed = 7" in printed, printed


def test_chapter_1_explorer_recomputes_a_readers_method_and_start_live(tmp_path, monkeypatch):
    """`make lab` for chapter 1: the path explorer is live; switching to plain GD, typing a step size
    and a start's norm retrains and redraws (chapter run with small sizes in a real kernel)."""
    printed, errors = run_chapter_live(
        tmp_path,
        monkeypatch,
        "01_global_convergence.ipynb",
        "before = bytes(box.picture.value)\n"
        "box.controls['method'].value = 'gd'\n"
        "box.controls['lr'].value = 1.0\n"
        "box.controls['norm'].value = 5.0\n"
        "after = bytes(box.picture.value)\n"
        "print('LIVE', type(box).__name__, before != after, after.startswith(b'\\x89PNG'), box.status.value)",
        steps=100,
        check_steps=100,
        steps_gd=200,
        gd_check_steps=1000,
        plot_steps=50,
        n_random_inits=20,
        adversarial_norm=2.0,
        loss_scores=[1.0, 2.0],
        explorer_positions=2,
    )
    assert printed.startswith("LIVE VBox True True"), (printed, errors)
    assert "method = &#x27;gd&#x27;" in printed and "lr = 1.0" in printed and "norm = 5.0" in printed, printed


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


# ------------------------------------------------------------------ chapter 6's figures and explorer


def _tiny_results(n_values, T=4):
    results, feasible = {}, {}
    for k, n in enumerate(n_values):
        feasible["p", n] = k == 0
        for method, start in (("ngd", "zero"), ("gd", "zero"), ("ngd", "cone")):
            if start == "cone" and not feasible["p", n]:
                continue
            rank = np.arange(n) % T
            results["p", n, method, start] = dict(
                agree=float(np.mean(rank == 0)), omc_sel=1e-3, omc_opt=1e-2 if feasible["p", n] else np.nan, rank=rank
            )
    return results, feasible


def test_selection_panels_draw_agreement_alignment_and_ranks():
    results, feasible = _tiny_results([2, 4])
    fig = al.figures.real_tokens.selection_panels(results, feasible, [2, 4], "p", T=4)
    agree, align, ranks = fig.axes
    assert len(agree.get_lines()) == 3 and len(agree.patches) == 1  # three runs, the infeasible band
    assert agree.get_lines()[2].get_xdata().tolist() == [2]  # NGD from the cone where feasible only (n=2)
    assert agree.get_lines()[0].get_ydata().tolist() == [0.5, 0.25]  # rank 0 in 1 of 2, then 1 of 4 samples
    assert len(align.get_lines()) == 4  # own SVM for each run, and NGD from zero against the optimal SVM
    assert len(ranks.patches) == 2 * 4  # ranks 0..3 present, one bar per n each
    plt.close(fig)


def test_svm_margins_and_token_matrix():
    fig, (ax, bx) = plt.subplots(1, 2)
    al.figures.real_tokens.svm_margins(ax, [2, 4, 8], {"p": [0.5, 0.2, None], "W": [0.6, 0.3, 0.1]})
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"p-SVM margin", "p-SVM infeasible", "W-SVM margin"}
    assert lines["p-SVM infeasible"].get_xdata().tolist() == [8] and lines["p-SVM margin"].get_color() == "tab:red"
    al.figures.real_tokens.token_matrix(bx, np.eye(4, 6), pixels=2)
    assert bx.images[0].get_array().shape == (4, 6) and bx.get_lines()[0].get_xdata()[0] == 1.5
    with pytest.raises(ValueError, match="pixels"):
        al.figures.real_tokens.token_matrix(bx, np.eye(4, 6), pixels=6)
    plt.close(fig)


def test_offset_growth_attention_maps_and_joint_curves():
    fig, axes = plt.subplots(2, 2)
    growth = np.geomspace(1, 4, 5)
    curves = [dict(kind="p", n=4, norm=growth, offset=np.ones(5), wrong=growth, growth=4.0, wrong_exponent=1.0)]
    al.figures.real_tokens.offset_growth(axes[0, 0], curves, [4, 8], "p")
    labels = [line.get_label() for line in axes[0, 0].get_lines()]
    assert labels[:2] == ["n=4, own SVM", "n=4, vs optimal SVM"] and len(labels) == 5  # and three reference powers
    assert axes[0, 0].get_lines()[-1].get_xdata()[-1] == pytest.approx(4.0)
    images = np.random.default_rng(0).random((2, 8, 8))
    al.figures.real_tokens.attention_maps(axes[0, 1], images, 4, np.full((2, 4), 0.25), select=[0, 1], opt=[0, 2])
    styles = [(p.get_edgecolor()[:3], p.get_linestyle()) for p in axes[0, 1].patches]
    assert len(styles) == 3 and styles[2][1] == "--"  # a hit (red), a miss (blue, with the optimal dashed red)
    steps = np.arange(5)
    al.figures.real_tokens.joint_curves(
        axes[1], steps, np.linspace(0, 0.9, 5), np.ones(5), np.full(5, 30.0), np.full(5, 10.0)
    )
    assert len(axes[1, 1].get_lines()) == 2 and axes[1, 0].get_yscale() == "log"
    plt.close(fig)


def test_chapter_6_explorer_retrains_with_a_readers_settings_live(tmp_path, monkeypatch):
    """What `make lab` gives a reader of chapter 6: the attention explorer is live, and a start in the
    cone or a step size typed into it is trained and drawn on demand (chapter at small sizes in a real kernel)."""
    printed, errors = run_chapter_live(
        tmp_path,
        monkeypatch,
        "06_real_tokens.ipynb",
        "before = bytes(box.picture.value)\n"
        "box.controls['cone'].value = True\n"
        "cone = bytes(box.picture.value)\n"
        "box.controls['lr'].value = 0.5\n"
        "after = bytes(box.picture.value)\n"
        "changed = before != cone != after\n"
        "print('LIVE', type(box).__name__, changed, after.startswith(b'\\x89PNG'), box.status.value)",
        n_values=[4, 8],
        steps=200,
        gd_steps=50,
        joint_n=8,
        joint_steps=50,
        n_head=60,
    )
    assert printed.startswith("LIVE VBox True True"), printed
    assert "cone = True" in printed and "lr = 0.5" in printed, printed


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


def test_chapter_5_explorer_recomputes_for_a_readers_seed_and_method_live(tmp_path, monkeypatch):
    """What `make lab` gives a reader of chapter 5: the rates explorer is live; a method and a data
    seed typed into it are computed and drawn on demand (chapter run with small sizes in a real kernel)."""
    import html

    printed, errors = run_chapter_live(
        tmp_path,
        monkeypatch,
        "05_fast_rates.ipynb",
        "pictures = [bytes(box.picture.value)]\n"
        "box.controls['method'].value = 'ngd'\n"
        "pictures.append(bytes(box.picture.value))\n"
        "box.controls['seed'].value = 7\n"
        "pictures.append(bytes(box.picture.value))\n"
        "fresh = sorted(k for k in explored if k[1] == 7)\n"
        "print('LIVE', type(box).__name__, len(set(pictures)) == 3, pictures[-1].startswith(b'\\x89PNG'), "
        "fresh, box.status.value)",
        n_seeds=5,
        steps_gd=2000,
        steps=500,
        steps_proto=500,
        steps_sweep=100,
        d_max=16,
        n_proto=10,
    )
    assert printed.startswith("LIVE VBox True True [(10, 7, 'logistic', 500, 50.0, 0.2)]"), printed
    assert "seed = 7" in printed and "method = 'ngd'" in html.unescape(printed), printed


def _ngd_gd_runs(steps=30):
    prob = al.datasets.multi_input(1)
    starts = al.datasets.MULTI_INPUT_INITS[:3]
    ngd = al.train(prob, starts, steps=steps, method="ngd", lr=0.1)
    gd = al.train(prob, starts, steps=steps, method="gd", lr=1.0)
    return prob, al.max_margin(prob), starts, ngd, gd


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


def test_rates_overview_redraws_the_figure_it_is_given():
    cmp, sols = _tiny_comparison()
    fig = al.figures.fast_rates.rates_overview(cmp, slice(None), None, 0.3, 2.0)
    fig.subplots_adjust(left=0.2)
    only = al.experiments.fast_rates.Comparison({"ngd": cmp.runs["ngd"]}, {"ngd": cmp.curves["ngd"]})
    again = al.figures.fast_rates.rates_overview(only, slice(None), {"ngd": "NGD"}, 0.3, 2.0, upto=20, fig=fig)
    assert again is fig and len(fig.axes) == 2 and fig.subplotpars.left == 0.2
    assert [len(ax.get_lines()) for ax in fig.axes] == [1, 2]  # NGD's median, and its predicted line
    assert fig.axes[0].get_yscale() == "log" and fig.axes[0].get_xlabel() == "iteration $t$"


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
