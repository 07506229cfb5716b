"""One executed notebook rendered as a page of the book: ``python -m attnlib run NOTEBOOK --html``.

A rerun with the reader's own parameters reads like the book only once its MyST is rendered: the
``{glue:text}`` roles show the run's numbers, the theorem boxes and cross-references are boxes and
links, and the book's MathJax macros (``_config.yml``) are defined. :func:`render_page` stages a
one-page book beside the executed notebook, with the book's configuration, text sources and
browser assets (the staging of :func:`attnlib.book.build.stage_sources`), and renders it with
Jupyter Book, execution off, exactly as ``make book`` renders a chapter::

    out/seed3.ipynb            the executed notebook (python -m attnlib run ... -o out/seed3.ipynb)
    out/seed3_html/            the one-page book's source and build
    out/seed3_html/_build/html/notebooks/seed3.html   the page

Links to other chapters of the book have no target in a one-page book: they render as plain
text, and Sphinx's warnings about them are not errors here (they are in ``make book``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from . import run
from .build import BookError, _jupyter_book_command, stage_sources

__all__ = ["PageError", "page_folder", "render_page", "render_page_or_report", "run_main"]

PROJECT_ROOT = Path(__file__).resolve().parents[2]


class PageError(RuntimeError):
    """The page could not be rendered (no Jupyter Book, a failed Sphinx run, a missing file)."""


def page_folder(executed: str | Path) -> Path:
    """Where the one-page book of ``executed`` goes: beside it, ``NAME_html/``."""
    executed = Path(executed)
    return executed.with_name(f"{executed.stem}_html")


def render_page(executed: str | Path, root: str | Path = PROJECT_ROOT) -> Path:
    """Render the executed notebook ``executed`` with the book's configuration; return the page.

    Args:
        executed: an executed notebook (the output of ``python -m attnlib run``).
        root: the repository whose ``_config.yml``, ``book/`` and ``node_modules/`` are used.
    """
    executed, root = Path(executed).resolve(), Path(root).resolve()
    if not executed.exists():
        raise PageError(f"no executed notebook at {executed}")
    folder = page_folder(executed)
    source = folder / "src"
    try:
        stage_sources(root, source)
    except BookError as exc:
        raise PageError(str(exc)) from None
    # The notebook sits where the chapters sit (notebooks/), so its relative links resolve as in the book.
    (source / "notebooks").mkdir(exist_ok=True)
    shutil.copyfile(executed, source / "notebooks" / executed.name)
    (source / "_toc.yml").write_text(f"format: jb-book\nroot: notebooks/{executed.stem}\n", encoding="utf-8")
    try:
        command = [*_jupyter_book_command(), "build", str(source), "--path-output", str(folder)]
    except BookError as exc:
        raise PageError(str(exc)) from None
    completed = subprocess.run(command, cwd=root, check=False, capture_output=True, text=True)
    page = folder / "_build" / "html" / "notebooks" / f"{executed.stem}.html"
    if completed.returncode != 0 or not page.exists():
        output = re.sub(r"\x1b\[[0-9;]*m", "", completed.stdout + completed.stderr)
        raise PageError(f"jupyter-book failed (exit code {completed.returncode}):\n{output[-3000:]}")
    return page


def render_page_or_report(executed: str | Path) -> Path | None:
    """:func:`render_page`, or ``None`` after printing why the page could not be rendered."""
    try:
        return render_page(executed)
    except PageError as exc:
        print(f"error: the page could not be rendered: {exc}", file=sys.stderr)
        return None


def run_main(argv: list[str] | None = None) -> int:
    """``python -m attnlib run``: :func:`attnlib.book.run.main` with ``--html`` rendered here."""
    return run.main(argv, render_page=render_page_or_report)
