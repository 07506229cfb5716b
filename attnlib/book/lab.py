"""``make lab``: JupyterLab on working copies of the chapters, never on the committed notebooks.

JupyterLab saves a notebook by itself (autosave, every two minutes by default), outputs included:
opened on ``notebooks/``, a "Run All" wrote a thousand lines of outputs into a committed chapter.
So ``python -m attnlib lab`` (what ``make lab`` runs):

1. copies every ``notebooks/*.ipynb`` into ``_build/lab/notebooks/`` (the *working copies*), each
   with one generated markdown cell on top that defines the book's MathJax macros
   (``_config.yml``, ``mathjax3_config.tex.macros``) as ``\\newcommand``: JupyterLab's MathJax keeps
   macros defined in any cell for the whole page, so ``\\pmm`` or ``\\norm{x}`` render as in the book;
2. starts JupyterLab with ``_build/lab`` as its root: the server cannot open, and so cannot save,
   anything outside it (``notebooks/`` included).

A working copy is refreshed when its committed notebook changed, unless the reader edited the copy
(its cells' sources differ from what was copied): then it is kept, and the command says how to get
the new version. Outputs alone are not edits. ``_build/lab/.copies.json`` records what was copied.

>>> macros = {"pmm": "p^{\\\\mathrm{mm}}", "norm": ["\\\\left\\\\lVert #1 \\\\right\\\\rVert", 1]}
>>> print(newcommands(macros))
\\newcommand{\\pmm}{p^{\\mathrm{mm}}}
\\newcommand{\\norm}[1]{\\left\\lVert #1 \\right\\rVert}
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import yaml

from .files import write_atomically, write_json_atomically

__all__ = ["LAB_DIR", "lab_command", "macros_cell", "main", "newcommands", "prepare_working_copies"]

PROJECT_ROOT = Path(__file__).resolve().parents[2]
LAB_DIR = PROJECT_ROOT / "_build" / "lab"
MANIFEST = ".copies.json"
GENERATED = "book-macros"  # metadata attnlib.generated of the macros cell


def book_macros(config: str | Path = PROJECT_ROOT / "_config.yml") -> dict:
    """The book's MathJax macros, ``{name: definition or [definition, arity]}``, from ``_config.yml``."""
    data = yaml.safe_load(Path(config).read_text(encoding="utf-8"))
    return data["sphinx"]["config"]["mathjax3_config"]["tex"]["macros"]


def newcommands(macros: dict) -> str:
    """The macros as TeX ``\\newcommand`` lines (arity from a ``[definition, n]`` pair)."""
    lines = []
    for name, definition in macros.items():
        if isinstance(definition, (list, tuple)):
            body, arity = definition[0], int(definition[1])
            lines.append(f"\\newcommand{{\\{name}}}[{arity}]{{{body}}}")
        else:
            lines.append(f"\\newcommand{{\\{name}}}{{{definition}}}")
    return "\n".join(lines)


def macros_cell(macros: dict) -> dict:
    """A markdown cell defining ``macros`` for JupyterLab (only in working copies, never committed)."""
    math = "$$\n" + newcommands(macros) + "\n$$"
    text = (
        "*The book's notation macros, defined for JupyterLab (this cell was added by `make lab` to the "
        "working copy; the book defines them in `_config.yml`).*\n\n" + math
    )
    return {
        "cell_type": "markdown",
        "id": "attnlib-book-macros",
        "metadata": {"attnlib": {"generated": GENERATED}, "tags": ["remove-cell"]},
        "source": text,
    }


def _sources_digest(notebook: dict) -> str:
    """What the reader may have edited: every cell's type and source (not outputs, counts or metadata)."""
    cells = [
        (cell.get("cell_type"), "".join(cell.get("source", "")))
        for cell in notebook.get("cells", [])
        if cell.get("metadata", {}).get("attnlib", {}).get("generated") != GENERATED
    ]
    return hashlib.sha256(json.dumps(cells).encode()).hexdigest()


def _working_copy(source: dict, macros: dict) -> dict:
    notebook = copy.deepcopy(source)
    notebook["cells"] = [macros_cell(macros), *notebook.get("cells", [])]
    if notebook.get("nbformat_minor", 0) < 5:
        notebook["cells"][0].pop("id")
    return notebook


def prepare_working_copies(
    notebooks: str | Path = PROJECT_ROOT / "notebooks",
    lab_dir: str | Path = LAB_DIR,
    config: str | Path = PROJECT_ROOT / "_config.yml",
) -> list[str]:
    """Create or refresh the working copies in ``lab_dir/notebooks``; return one line per change.

    ``notebooks`` is only read. A copy is written when missing, or when its committed notebook
    changed and the copy's cell sources are still those that were copied.
    """
    notebooks, lab_dir = Path(notebooks), Path(lab_dir)
    target_dir = lab_dir / "notebooks"
    target_dir.mkdir(parents=True, exist_ok=True)
    manifest_path = lab_dir / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        manifest = {}
    macros = book_macros(config)
    messages = []
    for source_path in sorted(notebooks.glob("*.ipynb")):
        raw = source_path.read_bytes()
        source_digest = hashlib.sha256(raw + json.dumps(macros).encode()).hexdigest()
        target = target_dir / source_path.name
        record = manifest.get(source_path.name, {})
        if target.exists() and record.get("source") == source_digest:
            continue  # the committed notebook did not change since it was copied
        if target.exists():
            try:
                edited = _sources_digest(json.loads(target.read_text(encoding="utf-8"))) != record.get("cells")
            except ValueError:
                edited = True
            if edited:
                messages.append(
                    f"kept your edited {target.relative_to(lab_dir)}: {source_path.name} changed since it was copied; "
                    f"delete the copy (or rename it) to get the new version"
                )
                continue
        working = _working_copy(json.loads(raw), macros)
        write_atomically(target, json.dumps(working, indent=1, ensure_ascii=False) + "\n")
        manifest[source_path.name] = {"source": source_digest, "cells": _sources_digest(working)}
        messages.append(f"{'refreshed' if record else 'copied'} {target.relative_to(lab_dir)}")
    write_json_atomically(manifest_path, manifest)
    return messages


def lab_command(lab_dir: str | Path = LAB_DIR, port: int = 8888, extra: list[str] | None = None) -> list[str]:
    """The JupyterLab command of ``make lab``: this machine only, root ``lab_dir``, encrypted kernels."""
    jupyter = Path(sys.executable).with_name("jupyter-lab")
    command = [str(jupyter)] if jupyter.exists() else [sys.executable, "-m", "jupyterlab"]
    command += [
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        f"--ServerApp.root_dir={Path(lab_dir).resolve()}",
        # The kernels' traffic is encrypted: CurveZMQ keys provisioned by the kernel manager.
        "--KernelManager.transport_encryption=auto",
    ]
    if hasattr(os, "getuid") and os.getuid() == 0:
        command.append("--allow-root")  # a container, where everything runs as root
    return command + list(extra or [])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attnlib lab",
        description="Copy the chapters into _build/lab/notebooks (refreshing copies you did not edit) and "
        "start JupyterLab there, on 127.0.0.1: the committed notebooks/ are never opened, so never saved.",
        epilog="Arguments after -- go to JupyterLab, e.g. python -m attnlib lab -- --no-browser",
    )
    parser.add_argument("--port", type=int, default=8888, help="port (0: a free one); default 8888")
    parser.add_argument("--prepare-only", action="store_true", help="refresh the working copies, do not start")
    args, extra = parser.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    for message in prepare_working_copies():
        print(message, file=sys.stderr)
    print(f"working copies: {LAB_DIR / 'notebooks'} (notebooks/ is left alone)", file=sys.stderr)
    if args.prepare_only:
        return 0
    if shutil.which("jupyter-lab", path=str(Path(sys.executable).parent)) is None:
        try:
            import jupyterlab  # noqa: F401  (only to find out whether this Python has JupyterLab)
        except ImportError:
            print(
                f"error: JupyterLab is not installed for {sys.executable}: run `make lab` (or `make setup`)",
                file=sys.stderr,
            )
            return 2
    command = lab_command(LAB_DIR, args.port, extra)
    os.execv(command[0], command)
    return 0  # not reached
