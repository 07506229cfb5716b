"""The sweeps page: its figures.

Functions draw on a given matplotlib ``Axes`` (or make a figure) and return it; what several
chapters draw is :mod:`attnlib.figures.common`.
"""

from __future__ import annotations

__all__ = [
    "VERDICT_COLORS",
    "check_values_by_seed",
]


#: Colour of each check verdict (sweep and robustness figures).
VERDICT_COLORS = {"passed": "tab:green", "failed": "tab:red", "not applicable": "0.6"}


def check_values_by_seed(rows, columns: int = 3, log=()):
    """Every check of a sweep: its value at each seed, coloured by verdict, one panel per check.

    ``rows``: dicts with ``seed``, ``check`` (its name), ``value`` (a number, or text that reads as
    one; other values are skipped) and ``status`` (``passed``, ``failed`` or ``not applicable``):
    the long format of the committed robustness tables (:func:`attnlib.book.robustness.read_table`).
    ``log``: names of the checks drawn on a log scale. Returns the Figure.
    """
    import matplotlib.pyplot as plt

    panels: dict[str, list] = {}
    for row in rows:
        try:
            value = float(row["value"])
        except (TypeError, ValueError):
            continue
        panels.setdefault(row["check"], []).append((row["seed"], value, row["status"]))
    n_rows = max(1, -(-len(panels) // columns))
    fig, axes = plt.subplots(n_rows, columns, figsize=(3.2 * columns, 2.3 * n_rows), squeeze=False)
    for ax, (name, points) in zip(axes.ravel(), panels.items()):
        seeds, values, verdicts = zip(*points)
        ax.scatter(seeds, values, c=[VERDICT_COLORS.get(v, "k") for v in verdicts], s=16, zorder=3)
        ax.set_title(name, fontsize=11, pad=14)  # the smallest size (names are long), above the 1e-n offset
        ax.set_xticks(sorted({min(seeds), max(seeds)}))
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.locator_params(axis="y", nbins=3)
        if name in log:
            ax.set_yscale("log")
    for ax in axes.ravel()[len(panels) :]:
        ax.axis("off")
    fig.supxlabel("seed")
    fig.tight_layout()
    return fig
