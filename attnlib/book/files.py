"""Small file helpers shared by the book's pages and machinery."""

from __future__ import annotations

from pathlib import Path

__all__ = ["find_upwards"]


def find_upwards(relative: str, start: str | Path | None = None) -> Path | None:
    """The first ``<folder>/relative`` that is a directory, for ``start`` (default: the working
    directory) and then each of its parents; ``None`` when there is none.

    A notebook runs with its own folder as working directory (papermill, the book, a user's
    Jupyter), so pages find the project's folders this way rather than by a fixed path.

    >>> find_upwards("no/such/folder/anywhere") is None
    True
    """
    here = Path.cwd() if start is None else Path(start)
    for folder in [here, *here.parents]:
        if (folder / relative).is_dir():
            return folder / relative
    return None
