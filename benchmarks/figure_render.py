"""Inline figures to PNG: :func:`attnlib.book.style.tight_png` against matplotlib's tight path.

    python benchmarks/figure_render.py [NOTEBOOK ...] [--repeats 3] [--out benchmarks/results/figure_render.json]

Each notebook runs in this process, inside an IPython shell with the inline backend (as in
``benchmarks/book_profile.py``), keeping every figure the backend shows. Then, for each figure, at
the inline resolution (twice ``figure.dpi``):

- **same picture**: the PNG of :func:`~attnlib.book.style.tight_png` against
  ``print_figure(..., bbox_inches="tight")`` (what IPython's inline backend calls): equal bytes, or
  else the size and the largest pixel difference are reported;
- **time**: both paths rendered alternately ``--repeats`` times after one warm-up render each, in
  CPU seconds of this process (``time.process_time``: other processes on a shared machine change
  the wall time more than the CPU time), and their ratio, measured in the same process.

Nothing is asserted; the JSON has one row per figure and a total per notebook.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pickle
import sys
import time
from pathlib import Path

import nbformat
import numpy as np
from IPython.core.interactiveshell import InteractiveShell
from matplotlib.figure import Figure
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from attnlib.book.style import tight_png  # noqa: E402

DEFAULT_NOTEBOOKS = ("03_local_convergence", "04_joint_training", "07_factorization")


class _Shell(InteractiveShell):
    def enable_gui(self, gui=None):  # no event loop: the inline backend needs none
        pass


def shown_figures(notebook: Path) -> list:
    """Run ``notebook``'s code cells with the inline backend; every figure it shows, in order."""
    shell = _Shell.instance()
    shell.run_line_magic("matplotlib", "inline")
    figures = []
    formatter = shell.display_formatter.formatters["image/png"]

    def keep(fig, *args, **kwargs):
        figures.append(fig)
        return None  # not rendered here: the comparison renders it

    cwd = os.getcwd()
    os.chdir(notebook.parent)
    try:
        for cell in nbformat.read(notebook, as_version=4).cells:
            if cell.cell_type != "code":
                continue
            formatter.for_type(Figure, keep)  # after the chapter's style.use(), which installs its own
            if not shell.run_cell(cell.source, store_history=False).success:
                raise RuntimeError(f"{notebook.name}: a cell failed")
    finally:
        os.chdir(cwd)
    return figures


def matplotlib_tight(fig, dpi: float) -> bytes:
    """IPython's ``print_figure`` at ``dpi`` (the inline backend's call)."""
    buffer = io.BytesIO()
    fig.canvas.print_figure(
        buffer,
        format="png",
        dpi=dpi,
        bbox_inches="tight",
        facecolor=fig.get_facecolor(),
        edgecolor=fig.get_edgecolor(),
    )
    return buffer.getvalue()


def one_draw(fig, dpi: float) -> bytes:
    return tight_png(fig, dpi, facecolor=fig.get_facecolor(), edgecolor=fig.get_edgecolor())


def copy_of(fig):
    """An independent copy of ``fig`` in its current state."""
    return pickle.loads(pickle.dumps(fig))


def pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGBA"), dtype=int)


def compare(fig, repeats: int) -> dict:
    dpi = 2 * fig.dpi
    # Each path from the state the inline backend renders (a layout engine moves the axes when it
    # runs, and a second run may not land where the first did): two copies of the figure.
    ours, theirs = one_draw(copy_of(fig), dpi), matplotlib_tight(copy_of(fig), dpi)
    row = {"same_bytes": ours == theirs}
    a, b = pixels(ours), pixels(theirs)
    row["size"], row["size_matplotlib"] = list(a.shape[1::-1]), list(b.shape[1::-1])
    row["max_pixel_difference"] = int(np.abs(a - b).max()) if a.shape == b.shape else None
    cpu = {"one_draw": 0.0, "matplotlib": 0.0}
    for _ in range(repeats):  # alternately, so that both see the same load
        for name, render in (("matplotlib", matplotlib_tight), ("one_draw", one_draw)):
            start = time.process_time()
            render(fig, dpi)
            cpu[name] += time.process_time() - start
    row.update({f"{name}_cpu_s": seconds / repeats for name, seconds in cpu.items()})
    row["ratio"] = cpu["one_draw"] / cpu["matplotlib"]
    return row


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", default=[f"notebooks/{n}.ipynb" for n in DEFAULT_NOTEBOOKS])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    report = {}
    for name in args.notebooks:
        notebook = (ROOT / name).resolve()
        rows = [compare(fig, args.repeats) for fig in shown_figures(notebook)]
        mine = sum(r["one_draw_cpu_s"] for r in rows)
        theirs = sum(r["matplotlib_cpu_s"] for r in rows)
        report[notebook.stem] = {
            "figures": len(rows),
            "same_bytes": sum(r["same_bytes"] for r in rows),
            "max_pixel_difference": max((r["max_pixel_difference"] or 0) for r in rows) if rows else 0,
            "one_draw_cpu_s": mine,
            "matplotlib_cpu_s": theirs,
            "ratio": mine / theirs if theirs else None,
            "rows": rows,
        }
        summary = {k: v for k, v in report[notebook.stem].items() if k != "rows"}
        print(notebook.stem, json.dumps(summary, default=lambda x: round(x, 3)), flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
