"""Explorers that stay interactive in the static book (no kernel needed).

A Python callback needs a kernel, which the published book does not have. So explorers
precompute their pictures and switch between them in the browser:

- :func:`image_slider`: an ``ipywidgets`` slider ``jslink``-ed to a ``widgets.Stack`` of images
  (the link runs client-side in the embedded widget state);
- :func:`animation`: a matplotlib animation rendered with ``to_jshtml`` (self-contained HTML).

ipywidgets and IPython are imported lazily so that attnlib imports without Jupyter.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Sequence

__all__ = ["figure_png", "image_slider", "animation", "path_animation"]


def figure_png(fig, dpi: int = 80) -> bytes:
    """Render a matplotlib figure to PNG bytes and close it."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def image_slider(
    values: Sequence,
    draw: Callable,
    description: str,
    start: int = 0,
    dpi: int = 80,
    format_value: Callable = str,
):
    """A slider over ``values`` that swaps precomputed pictures client-side.

    Args:
        values: the slider's positions (numbers or labels).
        draw: ``draw(value) -> matplotlib Figure``, called once per value, here and now.
        description: the slider's label (say what it moves).
        start: index of the initial position.
        format_value: how a value is shown next to the slider.

    Returns an ``ipywidgets.VBox`` (slider, readout, pictures); display it as the cell's output.
    """
    values = list(values)
    if not values:
        raise ValueError("values must hold at least one slider position")
    if not 0 <= start < len(values):
        raise ValueError(f"start must be an index in [0, {len(values) - 1}], got {start}")
    pngs = [figure_png(draw(v), dpi=dpi) for v in values]
    return _png_slider(pngs, [format_value(v) for v in values], description, start)


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


def _png_slider(pngs: Sequence[bytes], labels: Sequence[str], description: str, start: int):
    """Slider ``jslink``-ed to a Stack of PNG images and a Stack of labels (client-side)."""
    import ipywidgets as widgets

    stack = widgets.Stack([widgets.Image(value=b, format="png") for b in pngs], selected_index=start)
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
    readout = widgets.Stack([widgets.HTML(f"<b>{label}</b>") for label in labels], selected_index=start)
    widgets.jslink((slider, "value"), (stack, "selected_index"))
    widgets.jslink((slider, "value"), (readout, "selected_index"))
    return widgets.VBox([widgets.HBox([slider, readout]), stack])


def figure_slider(
    fig,
    update: Callable,
    values: Sequence,
    description: str,
    start: int = 0,
    dpi: int = 70,
    format_value: Callable = str,
):
    """Like :func:`image_slider`, but redraws **one** figure: ``update(value)`` changes its artists.

    Rendering the same figure again reuses matplotlib's text layout (tick labels, titles), which is
    most of the cost of a small figure, so a slider of a dozen positions renders several times
    faster than with :func:`image_slider`. Lay the figure out once (``fig.tight_layout()``) before
    calling; pictures are saved without ``bbox_inches="tight"`` so that they all have the same size.

    Args:
        fig: the figure; it is closed at the end.
        update: ``update(value)`` sets the figure to show ``value`` (set_data, set_text, ...).
        values, description, start, dpi, format_value: as in :func:`image_slider`.

    Returns an ``ipywidgets.VBox`` (slider, readout, pictures); make it the cell's last expression.
    """
    import matplotlib.pyplot as plt

    values = list(values)
    if not values:
        raise ValueError("values must hold at least one slider position")
    if not 0 <= start < len(values):
        raise ValueError(f"start must be an index in [0, {len(values) - 1}], got {start}")
    pngs = []
    for v in values:
        update(v)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=dpi)
        pngs.append(buf.getvalue())
    plt.close(fig)
    return _png_slider(pngs, [format_value(v) for v in values], description, start)


__all__ += ["figure_slider"]
