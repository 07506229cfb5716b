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
from collections.abc import Callable, Sequence

__all__ = ["figure_png", "image_slider", "animation"]


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
    import ipywidgets as widgets

    values = list(values)
    if not values:
        raise ValueError("values must hold at least one slider position")
    if not 0 <= start < len(values):
        raise ValueError(f"start must be an index in [0, {len(values) - 1}], got {start}")
    images = [widgets.Image(value=figure_png(draw(v), dpi=dpi), format="png") for v in values]
    stack = widgets.Stack(images, selected_index=start)
    slider = widgets.IntSlider(
        value=start,
        min=0,
        max=len(values) - 1,
        description=description,
        readout=False,
        continuous_update=True,
        style={"description_width": "initial"},
        layout=widgets.Layout(width="420px"),
    )
    labels = widgets.Stack([widgets.HTML(f"<b>{format_value(v)}</b>") for v in values], selected_index=start)
    widgets.jslink((slider, "value"), (stack, "selected_index"))
    widgets.jslink((slider, "value"), (labels, "selected_index"))
    return widgets.VBox([widgets.HBox([slider, labels]), stack])


def animation(fig, update: Callable[[int], object], frames: int, interval: int = 80, embed_limit_mb: float = 30.0):
    """A matplotlib animation as self-contained HTML (``to_jshtml``): plays without a kernel.

    Args:
        fig: the figure to animate; ``update(frame)`` redraws it for frame ``frame``.
        frames: number of frames (each is embedded as an image: keep it modest, about 40–80).
        interval: milliseconds between frames.

    Returns an ``IPython.display.HTML`` object.
    """
    import matplotlib.pyplot as plt
    from IPython.display import HTML
    from matplotlib import animation as mpl_animation

    plt.rcParams["animation.embed_limit"] = embed_limit_mb
    anim = mpl_animation.FuncAnimation(fig, update, frames=frames, interval=interval)
    html = anim.to_jshtml(default_mode="once")
    plt.close(fig)
    return HTML(html)
