"""Explorers: live where a kernel runs, precomputed (and still interactive) in the static book.

A Python callback needs a kernel, which the published book does not have. So:

- :func:`explorer` builds one explorer with one call. In a **live** kernel (JupyterLab, ``make lab``)
  it recomputes on demand: the slider's parameter takes any typed value, extra live-only controls
  (a seed, a step size, a start typed as two numbers...) change the picture, and ``draw`` runs again.
  In a **static** run (the book, ``python -m attnlib run``, sweeps: :func:`static_explorers`, i.e.
  ``ATTNLIB_EXPLORERS=static``) it is the precomputed slider of :func:`image_slider`.
- :func:`image_slider`, :func:`figure_slider`: a slider over pictures computed once per position.
  Static: self-contained HTML and a few lines of JavaScript (an ``<input type="range">`` showing one
  of the ``<img>``), needing neither a kernel nor the widget manager. Live: an ipywidgets slider
  whose Python callback shows the chosen picture.
- :func:`animation`, :func:`path_animation`: a matplotlib animation rendered with ``to_jshtml``.

Why not ipywidgets for the static slider: an ``IntSlider`` ``jslink``-ed to a ``widgets.Stack``
threw "Cannot read properties of null (reading 'processLuminoMessage')" in about 1 page load in 5
when the slider moved several steps quickly. ``StackView`` re-creates its one visible child on every
change and, once the asynchronous view creation resolves, posts a Lumino resize message to it; when a
second change arrives before the first view is ready, that view is removed (its Lumino widget
disposed, its view set to null) *before* the message is posted, and the message is then delivered to
the disposed widget (@jupyter-widgets/controls 5.0 ``StackView.update_children``, base 6.0
``ViewList.update``, ``JupyterLuminoWidget.processMessage``). Plain HTML has no such queue.

ipywidgets and IPython are imported lazily so that attnlib imports without Jupyter.
"""

from __future__ import annotations

import base64
import contextlib
import html
import io
import json
import os
import re
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence

from .style import COLUMN_PX, explorer_dpi, tight_png

__all__ = [
    "figure_png",
    "picture_dpi",
    "image_slider",
    "animation",
    "path_animation",
    "figure_slider",
    "EXPLORERS_ENV",
    "SkippedExplorer",
    "StaticSlider",
    "explorer",
    "explorer_mode",
    "static_explorers",
]

EXPLORERS_ENV = "ATTNLIB_EXPLORERS"
MODES = ("static", "live", "skip")
# "skip": a checks-only run (robustness sweeps: :func:`attnlib.book.run.execute_notebook` with
# ``checks_only=True``) reads the notebook's checks and nothing else, so no position is drawn.


def picture_dpi(fig) -> float:
    """The explorer resolution of ``fig``: two image pixels per CSS pixel when its picture, cropped
    to its drawing, fills the book's column (:func:`attnlib.book.style.explorer_dpi`). Measuring the
    crop draws the figure once; an explorer whose frames all have one size can measure it once and
    pass the result as ``dpi`` (:func:`explorer`).
    """
    import matplotlib.pyplot as plt

    pad = plt.rcParams["savefig.pad_inches"]
    # Any canvas, pyplot's or a bare Figure's; 2% to spare: the crop is measured again when saving.
    return 1.02 * explorer_dpi(fig.get_tightbbox().width + 2 * pad)


def figure_png(fig, dpi: float | None = None) -> bytes:
    """Render a matplotlib figure to PNG bytes (cropped to its drawing) and close it.

    ``dpi=None``: the explorer resolution, two image pixels per CSS pixel when the picture fills the
    book's column (:func:`attnlib.book.style.explorer_dpi` of the cropped width).
    """
    import matplotlib.pyplot as plt

    if dpi is None:
        dpi = picture_dpi(fig)
    # savefig(bbox_inches="tight")'s bytes with one draw: the layout engine run and the crop measured
    # at the picture's dpi, then drawn once (attnlib.book.style.tight_png).
    png = tight_png(fig, dpi)
    plt.close(fig)
    return png


def image_slider(
    values: Sequence,
    draw: Callable,
    description: str,
    start: int = 0,
    dpi: float | None = None,
    format_value: Callable = str,
    mode: str | None = None,
):
    """A slider over ``values`` that swaps pictures computed here and now, once per value.

    Args:
        values: the slider's positions (numbers or labels).
        draw: ``draw(value) -> matplotlib Figure``, called once per value, here and now.
        description: the slider's label (say what it moves).
        start: index of the initial position.
        dpi: resolution of the pictures (default: two image pixels per CSS pixel at the column's width).
        format_value: how a value is shown next to the slider.
        mode: ``"static"`` or ``"live"`` (default: :func:`explorer_mode`).

    Returns, static (the book, every attnlib run): a :class:`StaticSlider` (HTML; no kernel needed);
    live (a reader's kernel): an ipywidgets slider whose Python callback shows the chosen picture.
    Make it the cell's last expression.
    """
    values = list(values)
    if not values:
        raise ValueError("values must hold at least one slider position")
    if not 0 <= start < len(values):
        raise ValueError(f"start must be an index in [0, {len(values) - 1}], got {start}")
    if explorer_mode(mode) == "skip":
        return SkippedExplorer(description, len(values))
    pngs = [figure_png(draw(v), dpi=dpi) for v in values]
    return _png_slider(pngs, [format_value(v) for v in values], description, start, mode)


def animation(fig, update: Callable[[int], object], frames: int, interval: int = 80, embed_limit_mb: float = 30.0):
    """A matplotlib animation as self-contained HTML (the ``to_jshtml`` player): plays without a kernel.

    Args:
        fig: the figure to animate; ``update(frame)`` redraws it for frame ``frame``.
        frames: number of frames (each is embedded as an image: keep it modest, about 40–80).
        interval: milliseconds between frames.

    Returns an ``IPython.display.HTML`` object.

    Drives matplotlib's ``HTMLWriter`` directly: ``FuncAnimation.to_jshtml`` writes the same HTML
    but draws every frame twice on a non-interactive canvas.
    """
    import tempfile
    from pathlib import Path

    import matplotlib.pyplot as plt
    from IPython.display import HTML
    from matplotlib.animation import HTMLWriter

    writer = HTMLWriter(fps=1000.0 / interval, embed_frames=True, default_mode="once", embed_limit=embed_limit_mb)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "animation.html"
        with writer.saving(fig, out, dpi=fig.dpi):
            for k in range(frames):
                update(k)
                writer.grab_frame()
        html = out.read_text()
    plt.close(fig)
    # The player links a Font Awesome stylesheet on a CDN; the book's theme already ships the
    # icons, and offline the request fails with a console error.
    html = re.sub(r'<link rel="stylesheet"\s+href="https?://[^>]*>', "", html)
    return HTML(html)


def path_animation(
    theta,
    frames: int = 50,
    background: Callable | None = None,
    colors=None,
    title: Callable[[int], str] | None = None,
    steps=None,
    figsize=(5.0, 4.0),
    dpi: int = 60,
    interval: int = 100,
):
    """Animate trajectories ``theta`` (R, B, ≥2) growing in the plane of their first two coordinates.

    Frame ``k`` shows every path up to the recorded index ``r_k`` (``frames`` indices spread
    evenly over ``0..R−1``), with a dot at its current head. Rendered with :func:`animation`, so it
    plays in the static book.

    Args:
        theta: (R, B, d) recorded parameters (e.g. ``Trajectory.theta[:201]``).
        frames: number of frames (each is an embedded PNG: keep it at most about 60).
        background: ``background(ax)`` draws what does not move (tokens, SVM directions, limits,
            legend); called once.
        colors: one colour for all paths or a list of B colours.
        title: ``title(step) -> str`` for the frame's title (``step`` from ``steps``).
        steps: (R,) the step number of each recorded index (default ``0..R−1``).
        figsize, dpi: size of each frame (a small dpi keeps the page light).

    Returns an ``IPython.display.HTML`` object (make it the cell's last expression).
    """
    import numpy as np

    theta = np.asarray(theta, float)
    if theta.ndim != 3 or theta.shape[2] < 2:
        raise ValueError(f"theta must have shape (R, B, d>=2), got {theta.shape}")
    R, B = theta.shape[:2]
    if not isinstance(frames, (int, np.integer)) or not 1 <= frames <= R:
        raise ValueError(f"frames must be an integer in [1, {R}] (the number of recorded steps), got {frames!r}")
    steps = np.arange(R) if steps is None else np.asarray(steps)
    if steps.shape != (R,):
        raise ValueError(f"steps must have shape ({R},), got {steps.shape}")
    if colors is None or isinstance(colors, str):
        colors = [colors or "0.35"] * B
    if len(colors) != B:
        raise ValueError(f"colors must be one colour or {B} colours, got {len(colors)}")
    index = np.unique(np.linspace(0, R - 1, frames).round().astype(int))
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=figsize, dpi=dpi)
    ax = fig.add_subplot()
    if background is not None:
        background(ax)
    lines = [ax.plot([], [], color=c, lw=1.4)[0] for c in colors]
    heads = [ax.plot([], [], "o", color=c, ms=4)[0] for c in colors]

    def update(k):
        r = index[k]
        for b in range(B):
            lines[b].set_data(theta[: r + 1, b, 0], theta[: r + 1, b, 1])
            heads[b].set_data(theta[r : r + 1, b, 0], theta[r : r + 1, b, 1])
        if title is not None:
            ax.set_title(title(int(steps[r])))
        return lines + heads

    return animation(fig, update, frames=len(index), interval=interval)


def _png_slider(pngs: Sequence[bytes], labels: Sequence[str], description: str, start: int, mode=None):
    if explorer_mode(mode) == "static":
        return StaticSlider(pngs, labels, description, start)
    return _kernel_slider(pngs, labels, description, start)


def _column_layout(widgets):
    """A picture as wide as the book's column (its PNG has twice as many pixels), never wider than the output."""
    return widgets.Layout(width="100%", max_width=f"{COLUMN_PX}px", height="auto")


def _kernel_slider(pngs: Sequence[bytes], labels: Sequence[str], description: str, start: int):
    """The precomputed pictures behind an ipywidgets slider, swapped by a Python callback (a kernel).

    One ``Image`` whose value the callback sets: no ``Stack`` (whose view re-creation raced with
    Lumino messages). Not the static HTML: in a JupyterLab output, the notebook's keyboard shortcuts
    take the arrow keys of a plain ``<input type="range">`` (its keydown arrives default-prevented),
    so it would move only with the mouse; ipywidgets sliders opt out of those shortcuts.
    """
    import ipywidgets as widgets

    slider = widgets.IntSlider(
        value=start,
        min=0,
        max=len(pngs) - 1,
        description=description,
        readout=False,
        continuous_update=True,
        style={"description_width": "initial"},
        layout=widgets.Layout(width="420px"),
    )
    readout = widgets.HTML(f"<b>{html.escape(str(labels[start]))}</b>")
    picture = widgets.Image(value=bytes(pngs[start]), format="png", layout=_column_layout(widgets))

    def show(change):
        picture.value = bytes(pngs[change["new"]])
        readout.value = f"<b>{html.escape(str(labels[change['new']]))}</b>"

    slider.observe(show, names="value")
    box = widgets.VBox([widgets.HBox([slider, readout]), picture])
    box.slider, box.readout, box.picture = slider, readout, picture
    return box


class SkippedExplorer:
    """What an explorer shows in a checks-only run (``ATTNLIB_EXPLORERS=skip``): one line saying so.

    >>> SkippedExplorer("step size", 5)
    SkippedExplorer('step size', 5 positions not drawn)
    """

    def __init__(self, description: str, positions: int):
        self.description, self.positions = str(description), int(positions)

    def __repr__(self) -> str:
        return f"SkippedExplorer({self.description!r}, {self.positions} positions not drawn)"

    def _repr_html_(self) -> str:
        return f"<p><i>explorer ({html.escape(self.description)}) not drawn: a checks-only run</i></p>"


class StaticSlider:
    """A slider over precomputed PNG pictures, as self-contained HTML (displayed by its ``_repr_html_``).

    The page holds one ``<img>`` per position, all but one hidden, and an ``<input type="range">``
    whose ``input`` event shows the chosen one and its label: no kernel, no widget manager, nothing
    asynchronous, so moving it quickly cannot leave a message for a removed view.

    Attributes: ``pictures`` (PNG bytes per position), ``labels`` (readout per position),
    ``description`` (the slider's label), ``start`` (index shown first).
    """

    def __init__(self, pictures: Sequence[bytes], labels: Sequence[str], description: str, start: int = 0):
        if len(pictures) != len(labels) or not pictures:
            raise ValueError("one label per picture, and at least one picture")
        if not 0 <= start < len(pictures):
            raise ValueError(f"start must be an index in [0, {len(pictures) - 1}], got {start}")
        self.pictures = [bytes(p) for p in pictures]
        self.labels = [str(label) for label in labels]
        self.description = str(description)
        self.start = int(start)

    def __len__(self) -> int:
        return len(self.pictures)

    def __repr__(self) -> str:
        return f"StaticSlider({self.description!r}, {len(self)} positions)"

    def _repr_html_(self) -> str:
        uid = f"attnlib-slider-{uuid.uuid4().hex[:12]}"
        esc = html.escape
        images = "".join(
            f'<img class="attnlib-slider-picture" src="data:image/png;base64,{base64.b64encode(png).decode()}" '
            f'alt="{esc(self.description)}: {esc(label)}" style="width:100%;height:auto"'
            f"{'' if k == self.start else ' hidden'}>"
            for k, (png, label) in enumerate(zip(self.pictures, self.labels, strict=True))
        )
        # Labels go to the script as JSON; "</" is escaped so that no label can close the script.
        labels = json.dumps(self.labels).replace("</", "<\\/")
        return (
            f'<div class="attnlib-slider" id="{uid}">'
            '<div class="attnlib-slider-controls" '
            'style="display:flex;flex-wrap:wrap;align-items:center;gap:0.8em;margin:0.3em 0">'
            f'<label for="{uid}-input">{esc(self.description)}</label>'
            f'<input type="range" id="{uid}-input" min="0" max="{len(self) - 1}" step="1" value="{self.start}" '
            f'aria-valuetext="{esc(self.labels[self.start])}" style="flex:1 1 12em;min-width:8em;max-width:100%">'
            f'<output for="{uid}-input"><b>{esc(self.labels[self.start])}</b></output>'
            f"</div><div>{images}</div></div>"
            "<script>(function () {"
            f'const root = document.getElementById("{uid}");'
            "if (!root) return;"
            f"const labels = {labels};"
            'const input = root.querySelector("input"), readout = root.querySelector("output b");'
            'const pictures = root.querySelectorAll("img.attnlib-slider-picture");'
            "function show() {"
            "const k = Math.max(0, Math.min(pictures.length - 1, Math.round(Number(input.value))));"
            "pictures.forEach((picture, j) => { picture.hidden = j !== k; });"
            'readout.textContent = labels[k]; input.setAttribute("aria-valuetext", labels[k]);'
            "}"
            'input.addEventListener("input", show); input.addEventListener("change", show); show();'
            "})();</script>"
        )


def figure_slider(
    fig,
    update: Callable,
    values: Sequence,
    description: str,
    start: int = 0,
    dpi: float | None = None,
    format_value: Callable = str,
    mode: str | None = None,
):
    """Like :func:`image_slider`, but redraws **one** figure: ``update(value)`` changes its artists.

    Rendering the same figure again reuses matplotlib's text layout (tick labels, titles), which is
    most of the cost of a small figure, so a slider of a dozen positions renders several times
    faster than with :func:`image_slider`. Lay the figure out once (``fig.tight_layout()``) before
    calling; pictures are saved without ``bbox_inches="tight"`` so that they all have the same size.

    Args:
        fig: the figure; it is closed at the end.
        update: ``update(value)`` sets the figure to show ``value`` (set_data, set_text, ...).
        values, description, start, dpi, format_value, mode: as in :func:`image_slider`.

    Returns what :func:`image_slider` returns; make it the cell's last expression.
    """
    import matplotlib.pyplot as plt

    values = list(values)
    if not values:
        raise ValueError("values must hold at least one slider position")
    if not 0 <= start < len(values):
        raise ValueError(f"start must be an index in [0, {len(values) - 1}], got {start}")
    if explorer_mode(mode) == "skip":
        plt.close(fig)
        return SkippedExplorer(description, len(values))
    if dpi is None:
        dpi = 1.02 * explorer_dpi(fig.get_figwidth())  # 2% to spare: PNG widths round down
    pngs = []
    for v in values:
        update(v)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=dpi)
        pngs.append(buf.getvalue())
    plt.close(fig)
    return _png_slider(pngs, [format_value(v) for v in values], description, start, mode)


# --- Explorers: static in the book, live in a kernel ------------------------------------------------


@contextlib.contextmanager
def static_explorers(mode: str = "static") -> Iterator[None]:
    """Within this block, kernels started from this process build static explorers (``mode="skip"``:
    none at all, for a checks-only run).

    Sets ``ATTNLIB_EXPLORERS=static`` in ``os.environ`` (a kernel started by papermill inherits it) and
    restores the previous value on exit. :func:`attnlib.book.run.execute_notebook` runs every notebook
    inside it: the book, ``python -m attnlib run`` and sweeps all produce the precomputed sliders.
    """
    if mode not in ("static", "skip"):
        raise ValueError(f"mode must be 'static' or 'skip', got {mode!r}")
    previous = os.environ.get(EXPLORERS_ENV)
    os.environ[EXPLORERS_ENV] = mode
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(EXPLORERS_ENV, None)
        else:
            os.environ[EXPLORERS_ENV] = previous


def _in_kernel() -> bool:
    """True inside a Jupyter kernel (an IPython shell with a kernel attached)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def _frontend_answers() -> bool:
    """True when the running cell was sent by a frontend that answers the kernel (``allow_stdin``).

    JupyterLab, the Notebook and VS Code send every execution with ``allow_stdin=True``; nbclient,
    under papermill and ``jupyter nbconvert --execute``, sends ``allow_stdin=False``: nobody is there
    to move a slider, and the saved notebook should carry the precomputed explorer.
    """
    from IPython import get_ipython

    kernel = getattr(get_ipython(), "kernel", None)
    return bool(getattr(kernel, "_allow_stdin", False))


def explorer_mode(mode: str | None = None) -> str:
    """``"static"`` or ``"live"``: ``mode`` if given, else ``$ATTNLIB_EXPLORERS``, else live in a
    kernel driven by a frontend (JupyterLab) and static otherwise.

    Outside a kernel (a script, a unit test) there is nobody to call back, and a raw papermill or
    nbconvert run has no frontend (:func:`_frontend_answers`), so the default there is static.
    """
    if mode is None:
        mode = os.environ.get(EXPLORERS_ENV, "").strip().lower() or None
        source = f"${EXPLORERS_ENV}"
    else:
        source = "mode"
    if mode is None:
        return "live" if _in_kernel() and _frontend_answers() else "static"
    if mode not in MODES:
        raise ValueError(f"{source} must be one of {', '.join(map(repr, MODES))}, got {mode!r}")
    return mode


def _is_int(value) -> bool:
    import numbers

    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
    import numbers

    return isinstance(value, numbers.Real) and not isinstance(value, bool)


class _Control:
    """One live control: the widget shown, the widgets observed, and how to read its value."""

    def __init__(self, name: str, default):
        import ipywidgets as widgets

        self.name = name
        layout = widgets.Layout(width="150px")
        style = {"description_width": "initial"}
        if isinstance(default, widgets.ValueWidget):  # a ready-made control
            self.widget, self.inputs, self.read = default, [default], lambda: default.value
        elif isinstance(default, bool):
            box = widgets.Checkbox(value=default, description=name, indent=False)
            self.widget, self.inputs, self.read = box, [box], lambda: box.value
        elif _is_int(default):
            box = widgets.IntText(value=int(default), description=name, layout=layout, style=style)
            self.widget, self.inputs, self.read = box, [box], lambda: box.value
        elif _is_real(default):
            box = widgets.FloatText(value=float(default), description=name, layout=layout, style=style)
            self.widget, self.inputs, self.read = box, [box], lambda: box.value
        elif isinstance(default, str):
            box = widgets.Text(value=default, description=name, continuous_update=False, style=style)
            self.widget, self.inputs, self.read = box, [box], lambda: box.value
        elif isinstance(default, (tuple, list)) and default and all(_is_real(x) for x in default):
            boxes = [widgets.FloatText(value=float(x), layout=widgets.Layout(width="90px")) for x in default]
            label = widgets.Label(name)
            self.widget = widgets.HBox([label, *boxes])
            self.inputs = boxes
            self.read = lambda: tuple(b.value for b in boxes)
        else:
            raise TypeError(
                f"live control {name!r}: give a default bool, int, float, str, a tuple of numbers "
                f"or an ipywidgets control, got {default!r}"
            )


def explorer(
    draw: Callable,
    parameter: str,
    values: Sequence,
    description: str,
    live: Mapping | None = None,
    *,
    start: int = 0,
    dpi: float | None = None,
    format_value: Callable = str,
    mode: str | None = None,
):
    """One explorer: precomputed in the static book, recomputed on demand in a live kernel.

    Args:
        draw: ``draw(**params) -> matplotlib Figure``; ``params`` holds ``parameter`` and every
            name of ``live``. Closed after rendering. It may return the same figure every time,
            with its artists updated (cheaper, as :func:`figure_slider`).
        parameter: the name of the slider's parameter in ``draw``.
        values: the slider's positions (computed ahead in the static book).
        description: what the slider moves (its label).
        live: extra controls, live only, ``{name: default}``; the default's type picks the control:
            int → integer box (a seed), float → number box (a step size), tuple of numbers → one box
            per number (a start point), bool → checkbox, str → text, or any ipywidgets control.
            The static book draws every position with these defaults.
        start: index of the initial position in ``values``.
        format_value: how a value is shown next to the slider.
        mode: ``"static"`` or ``"live"`` to override the automatic choice (:func:`explorer_mode`:
            ``$ATTNLIB_EXPLORERS``, set to ``static`` by every attnlib run, else live in a kernel).

    Returns: static, a :class:`StaticSlider` (as :func:`image_slider`); live, an ``ipywidgets.VBox``
    with attributes ``controls`` (``{name: widget}``, the parameter's typed box under ``parameter``),
    ``picture`` (the ``Image``), ``status`` (an ``HTML`` line: computing, done, or the error) and
    ``redraw()``. Make it the cell's last expression.

    Example (a trajectory from a start the reader types)::

        def draw(lr, seed, start):
            ...  # train from `start` with step size `lr`, plot the path; return fig
        al.book.widgets.explorer(draw, "lr", [0.01, 0.1, 1.0], "step size η",
                            live={"seed": 0, "start": (1.0, -0.5)})
    """
    live = dict(live or {})
    values = list(values)
    if not values:
        raise ValueError("values must hold at least one slider position")
    if not 0 <= start < len(values):
        raise ValueError(f"start must be an index in [0, {len(values) - 1}], got {start}")
    if parameter in live:
        raise ValueError(f"{parameter!r} is the slider's parameter; it cannot also be a live control")
    if explorer_mode(mode) == "skip":
        return SkippedExplorer(description, len(values))
    if explorer_mode(mode) == "static":
        defaults = {name: getattr(value, "value", value) for name, value in live.items()}
        return image_slider(
            values, lambda v: draw(**{parameter: v}, **defaults), description, start, dpi, format_value, mode="static"
        )
    return _live_explorer(draw, parameter, values, description, live, start, dpi, format_value)


def _live_explorer(draw, parameter, values, description, live, start, dpi, format_value):
    import ipywidgets as widgets

    style = {"description_width": "initial"}
    # The slider offers the precomputed positions; the box beside it takes any value.
    slider = widgets.SelectionSlider(
        options=[(format_value(v), k) for k, v in enumerate(values)],
        value=start,
        description=description,
        continuous_update=False,
        style=style,
        layout=widgets.Layout(width="420px"),
    )
    first = values[start]
    box_options = {"description": "or type", "style": style, "layout": widgets.Layout(width="170px")}
    if all(_is_int(v) for v in values):
        typed = widgets.IntText(value=int(first), **box_options)
    elif all(_is_real(v) for v in values):
        typed = widgets.FloatText(value=float(first), **box_options)
    else:  # labels: the slider alone picks them
        typed = None
    controls = [_Control(name, default) for name, default in live.items()]
    picture = widgets.Image(format="png", layout=_column_layout(widgets))
    status = widgets.HTML()
    state = {"value": first}

    def params() -> dict:
        return {parameter: state["value"], **{c.name: c.read() for c in controls}}

    def redraw(*_):
        shown = ", ".join(f"{k} = {v!r}" for k, v in params().items())
        status.value = f"<i>computing {html.escape(shown)} …</i>"
        try:
            picture.value = figure_png(draw(**params()), dpi=dpi)
        except Exception as exc:  # shown to the reader, who typed the value
            status.value = f'<span style="color:#b00">{html.escape(type(exc).__name__)}: {html.escape(str(exc))}</span>'
            return
        status.value = f"<small>computed live: {html.escape(shown)}</small>"

    def from_slider(change):
        state["value"] = values[change["new"]]
        if typed is not None and typed.value != state["value"]:
            typed.value = state["value"]  # observed below: redraws once
        else:
            redraw()

    def from_box(change):
        state["value"] = change["new"]
        redraw()

    slider.observe(from_slider, names="value")
    if typed is not None:
        typed.observe(from_box, names="value")
    for control in controls:
        for widget in control.inputs:
            widget.observe(redraw, names="value")
    header = widgets.HBox([slider] + ([typed] if typed is not None else []))
    rows = [header]
    if controls:
        rows.append(widgets.HBox([c.widget for c in controls], layout=widgets.Layout(flex_flow="row wrap")))
    box = widgets.VBox([*rows, status, picture])
    box.controls = {**({parameter: typed} if typed is not None else {}), **{c.name: c.widget for c in controls}}
    box.slider, box.picture, box.status, box.redraw = slider, picture, status, redraw
    redraw()
    return box
