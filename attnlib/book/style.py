"""The book's one figure style: every chapter calls :func:`use` in its import cell.

The site shows figures in a content column :data:`COLUMN_PX` CSS pixels wide (the theme's main
column at 1280 px). A figure ``W`` inches wide is shown at ``min(W * figure.dpi, COLUMN_PX)`` CSS
pixels, so a font of ``s`` points appears ``s * min(figure.dpi, COLUMN_PX / W) / 72`` CSS pixels
tall. The style is chosen so that:

- **Resolution**: the inline backend draws PNGs at twice ``figure.dpi`` and declares half their
  size (``retina``): every picture has at least two image pixels per CSS pixel it is shown on.
- **Scale**: ``figure.dpi`` is :data:`COLUMN_PX` / :data:`COLUMN_INCHES`, so every figure up to
  :data:`COLUMN_INCHES` wide is shown at the same scale, and a figure exactly that wide fills the column.
- **Text**: the smallest font (:data:`SMALLEST_FONT_PT`, ticks and legends) is at least
  :data:`MIN_TEXT_PX` CSS pixels on screen for any figure up to :data:`COLUMN_INCHES` wide
  (:func:`text_px`). Wider figures are scaled down with their text: keep figures within
  :data:`COLUMN_INCHES`.
- **Legends** have an opaque-enough frame (``framealpha``) so that where they sit over data the
  lines beneath do not run through their text; lines share one width.
- **Speed**: every Agg renderer shares one mathtext parser (:func:`share_mathtext_parses`), so a
  tick label such as ``$10^{-2}$`` is parsed once per page, not once per figure; same pixels. An
  inline figure is drawn once, not twice, and a renderer reads a font's line height once, not on
  every text layout (:func:`tight_png`, :func:`share_font_heights`); the same PNG bytes.

>>> import matplotlib
>>> with matplotlib.rc_context():  # a doctest leaves the test process's style alone
...     use()["figure.dpi"] == matplotlib.rcParams["figure.dpi"] == FIGURE_DPI
True
>>> text_px(SMALLEST_FONT_PT, COLUMN_INCHES) >= MIN_TEXT_PX
True
"""

from __future__ import annotations

import functools
import io
from binascii import b2a_base64

import matplotlib
from matplotlib import cbook
from matplotlib.backends import backend_agg
from matplotlib.backends.backend_agg import RendererAgg
from matplotlib.figure import Figure
from matplotlib.font_manager import fontManager, get_font
from matplotlib.layout_engine import ConstrainedLayoutEngine, PlaceHolderLayoutEngine, TightLayoutEngine
from matplotlib.mathtext import MathTextParser

__all__ = [
    "COLUMN_PX",
    "COLUMN_INCHES",
    "FIGURE_DPI",
    "MIN_TEXT_PX",
    "SMALLEST_FONT_PT",
    "RC_PARAMS",
    "text_px",
    "explorer_dpi",
    "share_mathtext_parses",
    "tight_png",
    "one_pass",
    "retina_png",
    "install_inline",
    "share_font_heights",
    "use",
]

INLINE_BACKENDS = ("inline", "module://matplotlib_inline.backend_inline")
COLUMN_PX = 672  # CSS px: the book theme's content column at a 1280 px window
COLUMN_INCHES = 11.0  # the widest figure shown at full scale (the chapters' figures are 9-11 in wide)
FIGURE_DPI = COLUMN_PX / COLUMN_INCHES  # CSS px per figure inch (about 61)
MIN_TEXT_PX = 9.0  # the smallest text a reader should have to read, in CSS px
SMALLEST_FONT_PT = 11.0  # ticks and legends: 11 pt * 61/72 = 9.3 CSS px

RC_PARAMS = {
    "figure.dpi": FIGURE_DPI,
    "savefig.dpi": 2 * FIGURE_DPI,  # a figure saved by hand has the inline backend's resolution too
    "font.size": 12.0,
    "axes.titlesize": 12.0,
    "axes.labelsize": 12.0,
    "figure.titlesize": 13.0,
    "xtick.labelsize": SMALLEST_FONT_PT,
    "ytick.labelsize": SMALLEST_FONT_PT,
    "legend.fontsize": SMALLEST_FONT_PT,
    "legend.title_fontsize": SMALLEST_FONT_PT,
    "legend.framealpha": 0.85,  # a legend over data hides the lines beneath its text
    "legend.edgecolor": "0.8",
    "lines.linewidth": 1.6,
    "lines.markersize": 5.0,
    "axes.linewidth": 0.8,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.6,
}


def text_px(size_pt: float, figure_inches: float) -> float:
    """CSS pixels on screen of a ``size_pt`` font in a figure ``figure_inches`` wide, in the column.

    >>> round(text_px(11.0, 5.0), 2)   # shown at full scale: 61.1 px per inch
    9.33
    >>> round(text_px(11.0, 16.0), 2)  # 977 px scaled into 672: the text shrinks with it
    6.42
    """
    px_per_inch = min(FIGURE_DPI, COLUMN_PX / figure_inches)
    return size_pt * px_per_inch / 72.0


def explorer_dpi(figure_inches: float) -> float:
    """The dpi at which an explorer picture ``figure_inches`` wide, shown at the column's full
    width, has two image pixels per CSS pixel: ``2 * COLUMN_PX / figure_inches``.

    >>> explorer_dpi(6.72)
    200.0
    """
    if not figure_inches > 0:
        raise ValueError(f"figure_inches must be > 0, got {figure_inches!r}")
    return 2.0 * COLUMN_PX / figure_inches


def _retina_inline_figures() -> None:
    """In an IPython kernel with the inline backend: PNGs at twice the dpi, declared at half size,
    each drawn once (:func:`install_inline`: the same bytes as IPython's tight
    crop, one layout pass fewer)."""
    try:
        from IPython import get_ipython
    except ImportError:  # attnlib works without Jupyter
        return
    if get_ipython() is None:
        return
    try:
        from matplotlib_inline.config import InlineBackend
    except ImportError:
        return
    if matplotlib.get_backend(auto_select=False) in INLINE_BACKENDS:
        # Activate the inline backend now (importing it does, as a kernel's first figure would): its
        # activation selects IPython's own figure formatters, which would replace the one installed
        # below if it came later.
        import matplotlib_inline.backend_inline  # noqa: F401
    InlineBackend.instance().figure_formats = {"retina"}
    install_inline()


class _SharedMathtextParser:
    """A class attribute of ``RendererAgg`` that every renderer reads as one shared parser.

    ``RendererAgg.__init__`` assigns ``self.mathtext_parser = MathTextParser("path")``; as a data
    descriptor this attribute takes that assignment and keeps the shared parser instead.
    """

    def __init__(self):
        self.parser = MathTextParser("path")

    def __get__(self, renderer, owner=None):
        return self.parser

    def __set__(self, renderer, parser):
        pass  # the renderer's own new parser: the shared one serves instead


#: Parsed expressions kept (matplotlib keeps 50, fewer than one page's tick labels at their sizes).
MATHTEXT_CACHE_SIZE = 1024


def share_mathtext_parses() -> None:
    """Make every Agg renderer use one mathtext parser with a larger cache: the same pixels, faster.

    matplotlib caches a parsed mathtext expression (``MathTextParser._parse_cached``, keyed by the
    parser, the text, the dpi and the font), but each new renderer (each figure, each dpi) makes its
    own parser, so every figure parses its tick labels (``$10^{-2}$``: pyparsing, ~10 ms each) again;
    on a page of log-axis figures that is a fifth of the drawing time. One shared parser lets later
    figures reuse the parses, which depend only on that key, so the pictures are byte-identical.
    Idempotent.
    """
    if not isinstance(backend_agg.RendererAgg.__dict__.get("mathtext_parser"), _SharedMathtextParser):
        backend_agg.RendererAgg.mathtext_parser = _SharedMathtextParser()
    cached = MathTextParser._parse_cached
    if getattr(cached, "cache_info", None) and cached.cache_info().maxsize < MATHTEXT_CACHE_SIZE:
        MathTextParser._parse_cached = functools.lru_cache(MATHTEXT_CACHE_SIZE)(cached.__wrapped__)


# ------------------------------------------------------------------------------------------
# Inline figures drawn once.
#
# Figures rendered to PNG with one draw instead of two: the same bytes as matplotlib's tight crop.
#
# IPython's inline backend shows a figure as ``fig.canvas.print_figure(..., bbox_inches="tight")``.
# To measure that crop, matplotlib first draws the whole figure without rendering it (a layout pass
# that walks every artist), measures the box, and only then draws it for real into the cropped canvas
# (``FigureCanvasBase.print_figure``). The layout pass has two effects on what is drawn: it runs the
# figure's layout engine (constrained layout moves the axes), and it computes what the box measures.
# :func:`tight_png` does the first itself (``layout_engine.execute`` at the saving dpi, which is what
# the layout pass's ``Figure.draw`` does first), measures the same box with
# ``Figure.get_tightbbox`` (which lays out what it measures: ticks, labels, legends), and saves with
# that box and the layout engine off, as matplotlib's real draw does. One draw fewer, the same PNG,
# byte for byte (``tests/book/test_render.py`` compares the bytes for every kind of figure the book
# draws: legends outside the axes, colorbars, suptitles, constrained layout, ``tight_layout``, none;
# ``benchmarks/figure_render.py`` compares every figure of a chapter and times both).
#
# A figure it is not sure about (subfigures, a layout engine it does not know, a canvas with a fixed
# dpi) goes through matplotlib's own tight path.
#
# :func:`install_inline` makes it the inline backend's PNG (``retina``) formatter for every
# :class:`~matplotlib.figure.Figure` (IPython's display formatter, the hook ``select_figure_formats``
# itself uses); :func:`attnlib.book.style.use` calls it.
#

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


def use() -> dict:
    """Apply the book's style (:data:`RC_PARAMS`, retina inline figures drawn once, one mathtext parser
    for every figure: :func:`share_mathtext_parses`, font heights kept per renderer:
    :func:`share_font_heights`); return the rcParams set.

    Call it in a chapter's import cell, after ``import matplotlib.pyplot``: ``al.book.style.use()``.
    """
    matplotlib.rcParams.update(RC_PARAMS)
    _retina_inline_figures()
    share_mathtext_parses()
    share_font_heights()
    return dict(RC_PARAMS)
