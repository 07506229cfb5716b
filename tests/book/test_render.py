"""attnlib.book.style (rendering): inline figures drawn once, with the bytes of matplotlib's tight crop."""

import importlib.util
import io
from pathlib import Path
from types import SimpleNamespace

import matplotlib
import matplotlib.font_manager

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pytest
from IPython.core import pylabtools
from IPython.core.formatters import DisplayFormatter
from matplotlib.figure import Figure
from matplotlib_inline.config import InlineBackend

from attnlib.book import style

DPI = 2 * style.FIGURE_DPI  # the inline backend's retina resolution


@pytest.fixture(autouse=True)
def _book_style():
    with matplotlib.rc_context(style.RC_PARAMS):
        yield
    plt.close("all")


def _curves(ax):
    t = np.arange(1, 200)
    ax.loglog(t, 1 / t, label="GD")
    ax.loglog(t, np.exp(-t / 50), label="NGD")
    ax.set(xlabel="iteration $t$", ylabel=r"$\|W_t\| / \log t$", title="d = 10")


def legend_outside():
    fig, ax = plt.subplots(figsize=(6, 3))
    _curves(ax)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return fig


def colorbar():
    fig, ax = plt.subplots(figsize=(5, 4))
    image = ax.imshow(np.arange(48.0).reshape(6, 8), cmap="viridis")
    fig.colorbar(image, ax=ax, label=r"$\log_{10}$ loss")
    return fig


def suptitle_tight_layout():
    fig, axes = plt.subplots(1, 2, figsize=(8, 3))
    _curves(axes[0])
    axes[1].scatter(np.linspace(0, 1, 30), np.sin(np.arange(30)), s=12)
    fig.suptitle("two panels, one title")
    fig.tight_layout()
    return fig


def constrained():
    fig, axes = plt.subplots(2, 2, figsize=(7, 5), layout="constrained")
    for ax in axes.flat:
        _curves(ax)
    axes[0, 0].legend()
    fig.colorbar(axes[1, 1].pcolormesh(np.eye(4)), ax=axes[:, 1])
    fig.suptitle("constrained layout")
    return fig


def compressed():
    fig, axes = plt.subplots(1, 2, figsize=(6, 3), layout="compressed")
    for ax in axes:
        ax.imshow(np.eye(5))
    return fig


def no_layout_figure_legend():
    fig, ax = plt.subplots(figsize=(5, 3))
    _curves(ax)
    fig.legend(loc="outside right upper")  # a figure legend: placed from the figure's box
    return fig


def text_beyond_the_figure():
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 1], [1, 0])
    ax.annotate("a note past the right edge", (1, 0.5), xytext=(1.3, 0.5), arrowprops={"arrowstyle": "->"})
    return fig


def bare_figure():
    fig = Figure(figsize=(4, 2))  # no pyplot canvas: print_figure switches canvas itself
    _curves(fig.subplots())
    return fig


def subfigures():
    fig = plt.figure(figsize=(6, 3))
    for sub in fig.subfigures(1, 2):
        _curves(sub.subplots())
        sub.suptitle("a subfigure")
    return fig


KINDS = [
    legend_outside,
    colorbar,
    suptitle_tight_layout,
    constrained,
    compressed,
    no_layout_figure_legend,
    text_beyond_the_figure,
    bare_figure,
    subfigures,
]


def matplotlib_tight(fig, dpi=DPI) -> bytes:
    """What IPython's inline backend calls (``pylabtools.print_figure``)."""
    buffer = io.BytesIO()
    fig.canvas.print_figure(buffer, format="png", dpi=dpi, bbox_inches="tight")
    return buffer.getvalue()


@pytest.mark.parametrize("draw", KINDS, ids=lambda draw: draw.__name__)
def test_tight_png_is_matplotlibs_tight_crop_byte_for_byte(draw):
    """Each path renders its own fresh figure: the state the inline backend renders."""
    assert style.tight_png(draw(), DPI) == matplotlib_tight(draw())


@pytest.mark.parametrize("draw", [legend_outside, suptitle_tight_layout, constrained], ids=lambda d: d.__name__)
def test_font_heights_kept_per_renderer_give_the_same_bytes(draw, monkeypatch):
    """share_font_heights gives RendererAgg the hook Text._get_layout asks first: the same PNG with
    and without it (a renderer other than Agg, or a matplotlib whose Agg has the hook, keeps its own)."""
    assert style.share_font_heights()
    with_hook = matplotlib_tight(draw())
    monkeypatch.delattr(style.RendererAgg, "_get_font_height_metrics")
    assert with_hook == matplotlib_tight(draw())
    # The control: the hook is what the layout reads (taller lines move the text).
    monkeypatch.setattr(
        style.RendererAgg,
        "_get_font_height_metrics",
        lambda renderer, fontprops: tuple(1.5 * v for v in style._font_height_metrics(renderer, fontprops)),
        raising=False,
    )
    assert matplotlib_tight(draw()) != with_hook
    renderer = style.RendererAgg(10, 10, DPI)
    ascent, descent, gap = style._font_height_metrics(renderer, matplotlib.font_manager.FontProperties(size=11))
    assert ascent > descent > 0 and gap >= 0
    assert renderer._font_heights  # kept on the renderer


def test_tight_png_controls_another_crop_and_the_box_measured_before_the_layout():
    """The comparison above can fail: another pad, and what measuring the box before running the
    layout engine (the shortcut ``widgets.figure_png`` used to skip for a layout engine) gives."""
    assert style.tight_png(constrained(), DPI, pad_inches=0.2) != matplotlib_tight(constrained())
    fig = constrained()
    early = io.BytesIO()
    box = fig.get_tightbbox().padded(matplotlib.rcParams["savefig.pad_inches"])
    fig.savefig(early, format="png", dpi=DPI, bbox_inches=box)
    assert early.getvalue() != matplotlib_tight(constrained())


def test_tight_png_draws_once_and_leaves_the_layout_engine():
    fig = constrained()
    engine = fig.get_layout_engine()
    draws = []
    original = Figure.draw

    def counting(self, renderer):
        draws.append(renderer)
        return original(self, renderer)

    Figure.draw = counting
    try:
        style.tight_png(fig, DPI)
        assert len(draws) == 1
        draws.clear()
        matplotlib_tight(constrained())
        assert len(draws) == 2  # matplotlib's: a layout pass, then the real draw
    finally:
        Figure.draw = original
    assert fig.get_layout_engine() is engine and fig.dpi == style.FIGURE_DPI


def test_one_pass_refuses_what_it_does_not_know():
    assert style.one_pass(legend_outside()) and style.one_pass(constrained())
    assert not style.one_pass(subfigures())
    with matplotlib.rc_context({"figure.autolayout": True}):
        assert not style.one_pass(plt.figure())


def test_retina_png_is_ipythons_retina_figure():
    """The same base64 PNG and the same metadata (width and height declared at half size)."""
    ours = style.retina_png(suptitle_tight_layout(), base64=True, bbox_inches="tight")
    theirs = pylabtools.retina_figure(suptitle_tight_layout(), base64=True, bbox_inches="tight")
    assert ours == theirs
    width, height = style._png_size(io.BytesIO(matplotlib_tight(suptitle_tight_layout())).getvalue())
    assert ours[1] == {"width": width // 2, "height": height // 2}
    assert style.retina_png(plt.figure()) is None  # an empty figure shows nothing, as in IPython


def test_retina_png_other_options_go_through_ipython():
    fig = legend_outside()
    ours = style.retina_png(fig, bbox_inches=None)
    assert ours == pylabtools.retina_figure(legend_outside(), bbox_inches=None)


def test_install_inline_replaces_the_retina_formatter_only():
    shell = SimpleNamespace(display_formatter=DisplayFormatter())
    backend = InlineBackend.instance()
    saved = set(backend.figure_formats)
    try:
        backend.figure_formats = {"png"}
        assert not style.install_inline(shell)  # a plain PNG: IPython's own
        backend.figure_formats = {"retina"}
        assert style.install_inline(shell)
        printer = shell.display_formatter.formatters["image/png"].lookup_by_type(Figure)
        assert printer.func is style.retina_png and printer.keywords["base64"] is True
        data, metadata = shell.display_formatter.formatters["image/png"](legend_outside())
        assert data == pylabtools.retina_figure(legend_outside(), base64=True)[0]
    finally:
        backend.figure_formats = saved


def test_figure_render_benchmark_compares_bytes_and_times_both_paths():
    """benchmarks/figure_render.py on one figure (a smoke test: no time is asserted)."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "figure_render.py"
    spec = importlib.util.spec_from_file_location("figure_render", path)
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    row = benchmark.compare(constrained(), repeats=1)
    assert row["same_bytes"] and row["max_pixel_difference"] == 0 and row["size"] == row["size_matplotlib"]
    assert row["one_draw_cpu_s"] > 0 and row["matplotlib_cpu_s"] > 0 and row["ratio"] > 0
