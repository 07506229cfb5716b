"""Figures rendered to PNG with one draw instead of two: the same bytes as matplotlib's tight crop.

IPython's inline backend shows a figure as ``fig.canvas.print_figure(..., bbox_inches="tight")``.
To measure that crop, matplotlib first draws the whole figure without rendering it (a layout pass
that walks every artist), measures the box, and only then draws it for real into the cropped canvas
(``FigureCanvasBase.print_figure``). The layout pass has two effects on what is drawn: it runs the
figure's layout engine (constrained layout moves the axes), and it computes what the box measures.
:func:`tight_png` does the first itself (``layout_engine.execute`` at the saving dpi, which is what
the layout pass's ``Figure.draw`` does first), measures the same box with
``Figure.get_tightbbox`` (which lays out what it measures: ticks, labels, legends), and saves with
that box and the layout engine off, as matplotlib's real draw does. One draw fewer, the same PNG,
byte for byte (``tests/book/test_render.py`` compares the bytes for every kind of figure the book
draws: legends outside the axes, colorbars, suptitles, constrained layout, ``tight_layout``, none;
``benchmarks/figure_render.py`` compares every figure of a chapter and times both).

A figure it is not sure about (subfigures, a layout engine it does not know, a canvas with a fixed
dpi) goes through matplotlib's own tight path.

:func:`install_inline` makes it the inline backend's PNG (``retina``) formatter for every
:class:`~matplotlib.figure.Figure` (IPython's display formatter, the hook ``select_figure_formats``
itself uses); :func:`attnlib.book.style.use` calls it.

>>> fig = Figure(figsize=(2, 1))
>>> _ = fig.subplots().plot([0, 1], [1, 0])
>>> tight_png(fig, dpi=50).startswith(b"\\x89PNG")
True
"""

from __future__ import annotations

import functools
import io
from binascii import b2a_base64

import matplotlib
from matplotlib import cbook
from matplotlib.backends.backend_agg import RendererAgg
from matplotlib.figure import Figure
from matplotlib.font_manager import fontManager, get_font
from matplotlib.layout_engine import ConstrainedLayoutEngine, PlaceHolderLayoutEngine, TightLayoutEngine

__all__ = ["tight_png", "one_pass", "retina_png", "install_inline", "share_font_heights"]

# Engines whose ``execute`` is all that the layout pass does to the figure before it is measured.
_KNOWN_ENGINES = (type(None), PlaceHolderLayoutEngine, TightLayoutEngine, ConstrainedLayoutEngine)


def one_pass(fig) -> bool:
    """Whether :func:`tight_png` may crop ``fig`` itself (else it uses matplotlib's tight path).

    >>> plain, parted = Figure(), Figure()
    >>> _ = parted.subfigures(1, 2)
    >>> one_pass(plain), one_pass(parted)
    (True, False)
    """
    return (
        isinstance(fig.get_layout_engine(), _KNOWN_ENGINES)
        # set_layout_engine(None) gives the figure no engine only without these defaults
        and not matplotlib.rcParams["figure.autolayout"]
        and not matplotlib.rcParams["figure.constrained_layout.use"]
        and not fig.subfigs  # a subfigure's own bbox and patch follow the crop differently
        and getattr(fig.canvas, "fixed_dpi", None) is None  # a vector canvas: not a PNG
    )


def tight_png(fig, dpi: float, pad_inches: float | None = None, **print_kwargs) -> bytes:
    """``fig`` as PNG bytes at ``dpi``, cropped to its drawing plus ``pad_inches`` (default
    ``savefig.pad_inches``): ``fig.canvas.print_figure(buf, format="png", dpi=dpi,
    bbox_inches="tight", ...)`` byte for byte, with one draw instead of two.

    ``print_kwargs`` (``facecolor``, ``edgecolor``, ``metadata``, ``pil_kwargs``...) go to
    ``print_figure``. The figure is left as matplotlib's tight path leaves it (its layout engine has
    run at ``dpi``).
    """
    if pad_inches is None:
        pad_inches = matplotlib.rcParams["savefig.pad_inches"]
    buffer = io.BytesIO()
    if not one_pass(fig):
        fig.canvas.print_figure(
            buffer, format="png", dpi=dpi, bbox_inches="tight", pad_inches=pad_inches, **print_kwargs
        )
        return buffer.getvalue()
    engine = fig.get_layout_engine()
    # As print_figure does around its layout pass: the saving dpi, no GUI window to resize, and the
    # canvas saying it saves (artists may ask).
    with (
        cbook._setattr_cm(fig.canvas, manager=None, _is_saving=True),
        cbook._setattr_cm(fig, dpi=dpi),
    ):
        if engine is not None and fig.axes:
            try:
                engine.execute(fig)
            except ValueError:
                pass  # what Figure.draw does: a layout that cannot be solved is skipped
        crop = fig.get_tightbbox().padded(pad_inches)
        # The layout has run. print_figure makes a layout pass for a figure with any layout engine
        # (even the inert placeholder that ``tight_layout()`` leaves), and draws it with the engine
        # inert: without one, the same draw and no layout pass.
        fig.set_layout_engine(None)
        try:
            fig.canvas.print_figure(buffer, format="png", dpi=dpi, bbox_inches=crop, **print_kwargs)
        finally:
            fig.set_layout_engine(engine)
    return buffer.getvalue()


def _png_size(data: bytes) -> tuple[int, int]:
    """Width and height of a PNG from its IHDR chunk (IPython's ``_pngxy``)."""
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def retina_png(fig, base64: bool = False, **print_kwargs):
    """IPython's ``retina_figure`` through :func:`tight_png`: a PNG at twice ``fig.dpi``, with the
    metadata declaring half its size; ``None`` for an empty figure, as IPython returns.

    ``print_kwargs`` are the inline backend's ``print_figure_kwargs``; any besides
    ``bbox_inches="tight"`` (the default) send the figure through IPython's own function.
    """
    from IPython.core import pylabtools  # lazy: attnlib imports without IPython

    options = dict(print_kwargs)
    if options.pop("bbox_inches", "tight") != "tight" or set(options) - {"pad_inches", "pil_kwargs", "metadata"}:
        return pylabtools.retina_figure(fig, base64=base64, **print_kwargs)
    if not fig.axes and not fig.lines:
        return None
    data = tight_png(fig, 2 * fig.dpi, facecolor=fig.get_facecolor(), edgecolor=fig.get_edgecolor(), **options)
    width, height = _png_size(data)
    metadata = {"width": width // 2, "height": height // 2}
    if base64:
        data = b2a_base64(data, newline=False).decode("ascii")
    return data, metadata


def install_inline(shell=None) -> bool:
    """Make :func:`retina_png` the PNG formatter of figures in ``shell`` (default: the running
    IPython) when the inline backend shows retina PNGs; return whether it did.

    Called after ``InlineBackend.figure_formats = {"retina"}`` (which registers IPython's
    formatter): it replaces that one registration, with the backend's ``print_figure_kwargs``.
    """
    try:  # lazy: attnlib imports without Jupyter
        from IPython import get_ipython
        from matplotlib_inline.config import InlineBackend
    except ImportError:
        return False
    shell = shell if shell is not None else get_ipython()
    if shell is None:
        return False
    backend = InlineBackend.instance()
    if not backend.figure_formats & {"retina", "png2x"} or backend.figure_formats - {"retina", "png2x"}:
        return False
    formatter = shell.display_formatter.formatters["image/png"]
    formatter.for_type(Figure, functools.partial(retina_png, base64=True, **backend.print_figure_kwargs))
    return True


# The tables Text._get_layout reads a font's line height from, in its order (matplotlib 3.11).
_HEIGHT_TABLES = (
    ("OS/2", "sTypoLineGap", "sTypoAscender", "sTypoDescender"),
    ("hhea", "lineGap", "ascent", "descent"),
)


def _font_height_metrics(renderer, fontprops):
    """``(ascent, descent, line gap)`` in pixels of ``fontprops``' font at the renderer's dpi, as
    ``Text._get_layout`` computes them from the font's tables, kept per renderer and font.

    ``Text._get_layout`` asks a renderer for these (the hook the PDF and PS backends use for AFM
    fonts) before computing them itself: a font lookup and two table copies on every call, and a
    tick label's layout is computed several times per draw (its box, the axis label's position, the
    crop). A renderer lives for one draw at one dpi, so the values are the same: the same pixels.
    """
    cache = renderer.__dict__.setdefault("_font_heights", {})
    key = hash(fontprops)  # FontProperties compare equal by this hash (matplotlib's own caches)
    if key not in cache:
        font = get_font(fontManager._find_fonts_by_props(fontprops))
        cache[key] = (None, None, None)  # no table: _get_layout measures "lp" instead
        for table_name, gap_key, ascent_key, descent_key in _HEIGHT_TABLES:
            table = font.get_sfnt_table(table_name)
            if table is None:
                continue
            # _get_layout's expression, with the figure's dpi: the renderer's, which it was made at
            scale = 1 / font.get_sfnt_table("head")["unitsPerEm"] * fontprops.get_size_in_points() * renderer.dpi / 72
            cache[key] = (table[ascent_key] * scale, -table[descent_key] * scale, table[gap_key] * scale)
            break
    return cache[key]


def share_font_heights() -> bool:
    """Give Agg renderers :func:`_font_height_metrics` (idempotent); ``False`` where matplotlib's
    renderer already has such a method (a matplotlib other than the one this copies).

    >>> share_font_heights() in (True, False)
    True
    """
    existing = getattr(RendererAgg, "_get_font_height_metrics", None)
    if existing is None:
        RendererAgg._get_font_height_metrics = _font_height_metrics
        return True
    return existing is _font_height_metrics
