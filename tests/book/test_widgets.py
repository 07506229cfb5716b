"""The book machinery: attnlib.book.widgets (static and live explorers, sliders, animations)."""

import io
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
from attnlib.book.run import execute_notebook


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _small_figure():
    fig, ax = plt.subplots(figsize=(2, 2))
    (line,) = ax.plot([0, 1], [0, 0])
    return fig, ax, line


def _shown(slider_html: str) -> list[int]:
    """Indices of the pictures a StaticSlider's HTML shows (not ``hidden``)."""
    images = re.findall(r"<img [^>]*>", slider_html)
    return [k for k, tag in enumerate(images) if " hidden" not in tag]


ROOT = Path(__file__).resolve().parents[2]


FIXTURE = ROOT / "tests" / "fixtures" / "explorer.ipynb"


def _line_draw(calls):
    def draw(slope, offset=0.0, start=(0.0, 0.0), seed=0):
        calls.append({"slope": slope, "offset": offset, "start": start, "seed": seed})
        fig, ax = plt.subplots(figsize=(2, 2))
        ax.plot([start[0], 1], [start[1], slope + offset + seed])
        return fig

    return draw


PROBE_FIND_EXPLORER = "box = [v for v in Out.values() if hasattr(v, 'controls')][-1]\n"


def run_chapter_live(tmp_path, monkeypatch, notebook_name, probe, **small):
    """Run a chapter at ``small`` sizes in a real kernel with live explorers, ``probe`` (code that
    finds the explorer as ``box``, changes its controls and prints) inserted after the explorer's
    cell. Returns what the probe printed, and the error values of any cell (the chapter's own checks
    may fail at small sizes: the probe has run before them)."""
    import nbformat
    import papermill

    root = Path(__file__).resolve().parents[2]
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


@pytest.mark.parametrize("layout", [None, "constrained"])
def test_figure_png_is_savefig_with_a_tight_crop_byte_for_byte(layout):
    """figure_png measures the crop itself (one layout pass fewer than bbox_inches="tight",
    attnlib.book.style): the same PNG as savefig's tight crop at the explorer dpi, for a tight-layout
    figure with mathtext, a legend and a title, and for a constrained-layout one (its layout run
    before the crop is measured)."""

    def draw():
        fig, axes = plt.subplots(1, 2, figsize=(5, 2), layout=layout)
        axes[0].loglog([1, 10, 1000], [1e-3, 1e-2, 1.0], label="GD")
        axes[0].set(xlabel="iteration $t$", ylabel=r"$\|W_t\| / \log t$")
        axes[0].legend(loc="lower left")
        axes[1].plot([0, 1], [1, 0])
        fig.suptitle("d = 10, data seed 0")
        if layout is None:
            fig.tight_layout()
        return fig

    fig = draw()
    pad = plt.rcParams["savefig.pad_inches"]
    dpi = 1.02 * al.book.style.explorer_dpi(fig.get_tightbbox().width + 2 * pad)
    tight = io.BytesIO()
    fig.savefig(tight, format="png", dpi=dpi, bbox_inches="tight")
    assert al.book.widgets.figure_png(draw()) == tight.getvalue()
    assert al.book.widgets.figure_png(draw(), dpi=dpi / 2) != tight.getvalue()  # the control: another crop


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
    # nbclient, like papermill, has no frontend and gets static explorers by default: ask for live.
    os.environ[al.book.widgets.EXPLORERS_ENV] = "live"
    try:
        NotebookClient(notebook, timeout=300, resources={"metadata": {"path": str(FIXTURE.parent)}}).execute()
    finally:
        if previous is not None:
            os.environ[al.book.widgets.EXPLORERS_ENV] = previous
        else:
            os.environ.pop(al.book.widgets.EXPLORERS_ENV, None)
    outputs = notebook.cells[-2].outputs
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs)  # a live widget
    printed = "".join(o.get("text", "") for o in notebook.cells[-1].outputs)
    assert printed.startswith("VBox True True") and "start = (-2.0, -0.5)" in printed, printed


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
        gd_steps=200,
        gd_check_steps=1000,
        plot_steps=50,
        n_random_inits=20,
        adversarial_norm=2.0,
        loss_scores=[1.0, 2.0],
        explorer_positions=2,
    )
    assert printed.startswith("LIVE VBox True True"), (printed, errors)
    assert "method = &#x27;gd&#x27;" in printed and "lr = 1.0" in printed and "norm = 5.0" in printed, printed


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
        head_n=60,
    )
    assert printed.startswith("LIVE VBox True True"), printed
    assert "cone = True" in printed and "lr = 0.5" in printed, printed


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
        gd_steps=2000,
        steps=500,
        proto_steps=500,
        sweep_steps=100,
        d_max=16,
        proto_n=10,
    )
    assert printed.startswith("LIVE VBox True True [(10, 7, 'logistic', 500, 50.0, 0.2)]"), printed
    assert "seed = 7" in printed and "method = 'ngd'" in html.unescape(printed), printed


def test_skip_mode_draws_no_position(monkeypatch):
    """A checks-only run (ATTNLIB_EXPLORERS=skip): the explorer says so and never calls ``draw``."""
    monkeypatch.setenv(al.book.widgets.EXPLORERS_ENV, "skip")
    calls = []
    out = al.explorer(_line_draw(calls), "slope", [0.0, 1.0, 2.0], "slope", live={"offset": 0.5})
    assert isinstance(out, al.book.widgets.SkippedExplorer) and out.positions == 3 and calls == []
    assert "not drawn" in out._repr_html_()
    fig, _, line = _small_figure()
    skipped = al.book.widgets.figure_slider(fig, lambda v: line.set_ydata([v, v]), [0.0, 1.0], "level")
    assert isinstance(skipped, al.book.widgets.SkippedExplorer) and plt.get_fignums() == []


def test_static_explorers_skip_mode_and_refuses_others(monkeypatch):
    monkeypatch.delenv(al.book.widgets.EXPLORERS_ENV, raising=False)
    with al.book.widgets.static_explorers("skip"):
        assert al.book.widgets.explorer_mode() == "skip"
    with pytest.raises(ValueError, match="'static' or 'skip'"), al.book.widgets.static_explorers("live"):
        pass
    assert al.book.widgets.EXPLORERS_ENV not in os.environ


@pytest.mark.notebook
def test_a_checks_only_run_draws_nothing_and_says_so(tmp_path):
    """``execute_notebook(checks_only=True)``: Agg in the kernel (no figure embedded), no explorer
    position drawn, and the summary records the kind of run."""
    out = tmp_path / "explorer.ipynb"
    summary = execute_notebook(FIXTURE, out, {"steps": 40}, checks_only=True)
    assert summary["status"] == "ok" and summary["checks_only"] is True
    outputs = [o for cell in json.loads(out.read_text())["cells"] for o in cell.get("outputs", [])]
    assert not any("image/png" in o.get("data", {}) for o in outputs)
    pages = "".join("".join(o["data"]["text/html"]) for o in outputs if "text/html" in o.get("data", {}))
    assert "not drawn" in pages and 'class="attnlib-slider"' not in pages
