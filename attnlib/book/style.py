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
  every text layout (:mod:`attnlib.book.render`); the same PNG bytes.

>>> import matplotlib
>>> with matplotlib.rc_context():  # a doctest leaves the test process's style alone
...     use()["figure.dpi"] == matplotlib.rcParams["figure.dpi"] == FIGURE_DPI
True
>>> text_px(SMALLEST_FONT_PT, COLUMN_INCHES) >= MIN_TEXT_PX
True
"""

from __future__ import annotations

import functools

import matplotlib
from matplotlib.backends import backend_agg
from matplotlib.mathtext import MathTextParser

from .render import install_inline, share_font_heights

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
    each drawn once (:func:`attnlib.book.render.install_inline`: the same bytes as IPython's tight
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


def use() -> dict:
    """Apply the book's style (:data:`RC_PARAMS`, retina inline figures drawn once, one mathtext parser
    for every figure: :func:`share_mathtext_parses`, font heights kept per renderer:
    :func:`attnlib.book.render.share_font_heights`); return the rcParams set.

    Call it in a chapter's import cell, after ``import matplotlib.pyplot``: ``al.book.style.use()``.
    """
    matplotlib.rcParams.update(RC_PARAMS)
    _retina_inline_figures()
    share_mathtext_parses()
    share_font_heights()
    return dict(RC_PARAMS)
