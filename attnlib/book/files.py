"""Small file helpers shared by the book's pages and machinery."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

__all__ = ["find_upwards", "log", "write_atomically", "write_json_atomically"]


def log(message: str) -> None:
    """A progress line on stderr, flushed (the book build, sweeps and robustness runs report this way)."""
    print(message, file=sys.stderr, flush=True)


def write_atomically(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` through a hidden temporary file in the same folder and a rename, so
    that a reader never sees a half-written file (an interrupted run leaves the old one intact).

    >>> import tempfile; folder = Path(tempfile.mkdtemp())
    >>> write_atomically(folder / "a.txt", "done\\n").read_text()
    'done\\n'
    >>> sorted(p.name for p in folder.iterdir())
    ['a.txt']
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_json_atomically(path: str | os.PathLike, data) -> Path:
    """:func:`write_atomically` of ``data`` as indented JSON."""
    return write_atomically(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


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
