"""Parameterised notebook runs: one execution path for users, the book and the tests.

:func:`execute_notebook` runs a notebook with papermill and writes two files:

- the executed notebook, atomically (a temporary file in the same directory, renamed at the end);
- a JSON summary beside it (same name, ``.json``)::

      {"notebook": "notebooks/01_global_convergence.ipynb",
       "parameters": {"seed": 0, "steps": 1000},      # every value used: defaults merged with overrides
       "status": "ok",                                 # or "failed"
       "error": null,                                  # or "ValueError: parameter 'steps' must be ..."
       "duration_s": 12.3,
       "checks": [{"name": ..., "value": ..., "criterion": ..., "status": "passed",  # or "failed",
                   "passed": true, "description": ..., "reason": ""}]}       # "not applicable" (passed null)

Parameter names are checked against the notebook's ``parameters``-tagged cell *before* a kernel
starts (papermill itself only warns about an unknown name and runs anyway). The checks are the
records that :class:`attnlib.Checks` emits as outputs of MIME type :data:`attnlib.book.CHECK_MIME`; they
are collected even when a later cell failed.

``python -m attnlib run NOTEBOOK -p NAME VALUE ... -o OUT.ipynb`` is the command-line face of it
(:func:`main`); ``make book`` calls the same function for every chapter (:mod:`attnlib.book.build`).
papermill is imported only when a notebook is executed, so attnlib imports without Jupyter.

>>> parse_value("1000"), parse_value("0.1"), parse_value("logistic"), parse_value("[1, 2]")
(1000, 0.1, 'logistic', [1, 2])
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import time
from pathlib import Path

from .checks import CHECK_MIME, describe_counts, status_of
from .files import write_json_atomically
from .widgets import static_explorers

__all__ = [
    "UsageError",
    "collect_checks",
    "execute_notebook",
    "main",
    "notebook_parameters",
    "parse_value",
    "summary_path",
]

KERNEL_NAME = "python3"
# The committed chapter notebooks: never an output of a run.
SOURCE_NOTEBOOKS_DIR = Path(__file__).resolve().parents[2] / "notebooks"

EXIT_FAILED = 1  # the notebook ran and raised (a bad value, a failed check, a bug)
EXIT_USAGE = 2  # refused before any kernel started (unknown parameter, bad output path), as argparse does


class UsageError(ValueError):
    """The run was refused before execution: unknown parameter, unreadable notebook, bad output path."""


def parse_value(text: str):
    """A command-line value as a Python literal (``3``, ``0.1``, ``True``, ``[1, 2]``), else the raw string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def _read_notebook(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"notebook not found: {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"not a notebook (invalid JSON): {path}: {exc}") from None


def _cell_source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def notebook_parameters(path: str | os.PathLike) -> dict | None:
    """The defaults of the notebook's ``parameters``-tagged cell, or ``None`` if it has no such cell.

    Only top-level assignments count (``name = literal``, ``name: type = literal``). A value that is
    not a literal is kept as its source text: the name is still a valid parameter.
    """
    path = Path(path)
    notebook = _read_notebook(path)
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") == "code" and "parameters" in cell.get("metadata", {}).get("tags", []):
            source = _cell_source(cell)
            try:
                tree = ast.parse(source)
            except SyntaxError as exc:
                raise UsageError(f"{path}: the parameters cell is not valid Python: {exc}") from None
            defaults = {}
            for node in tree.body:
                targets, value = [], None
                if isinstance(node, ast.Assign):
                    targets, value = node.targets, node.value
                elif isinstance(node, ast.AnnAssign) and node.value is not None:
                    targets, value = [node.target], node.value
                for target in targets:
                    if isinstance(target, ast.Name):
                        try:
                            defaults[target.id] = ast.literal_eval(value)
                        except ValueError:
                            defaults[target.id] = ast.get_source_segment(source, value)
            return defaults
    return None


def summary_path(output: str | os.PathLike) -> Path:
    """Where the JSON summary of an executed notebook goes: beside it, ``.json`` instead of ``.ipynb``."""
    return Path(output).with_suffix(".json")


def _check_output_path(notebook: Path, output: Path) -> None:
    source, target = notebook.resolve(), output.resolve()
    if target == source or summary_path(target) == source:
        raise UsageError(f"refusing to overwrite the input notebook {notebook}: choose another -o")
    if target.parent == SOURCE_NOTEBOOKS_DIR:
        raise UsageError(
            f"refusing to write {output} into {SOURCE_NOTEBOOKS_DIR}: that folder holds the committed "
            "notebooks (without outputs); choose another -o"
        )
    if target.is_dir():
        raise UsageError(f"the output {output} is a directory: give a file name such as out.ipynb")


def collect_checks(executed: dict) -> list[dict]:
    """The check records (MIME :data:`CHECK_MIME`) of an executed notebook, in the order they were made."""
    checks = []
    for cell in executed.get("cells", []):
        for output in cell.get("outputs", []):
            record = output.get("data", {}).get(CHECK_MIME)
            if isinstance(record, str):  # some writers store JSON payloads as text
                record = json.loads(record)
            if isinstance(record, dict):
                checks.append(record)
    return checks


def _describe_error(exc: BaseException) -> str:
    ename = getattr(exc, "ename", None)  # papermill.PapermillExecutionError carries the notebook's exception
    if ename:
        return f"{ename}: {getattr(exc, 'evalue', '')}".rstrip(": ")
    return f"{type(exc).__name__}: {exc}"


def _kernel_config():
    """Kernel-manager settings for the kernels papermill starts.

    CurveZMQ keys provisioned by the kernel manager (jupyter_client ``transport_encryption="auto"``;
    ipykernel's kernelspec declares ``supported_encryption: curve``): the kernel's traffic is
    encrypted, so ipykernel no longer warns "Kernel is running over TCP without encryption" on every
    start. Left off where pyzmq has no CurveZMQ (the setting would be refused).
    """
    import zmq
    from traitlets.config import Config

    return Config({"KernelManager": {"transport_encryption": "auto"}} if zmq.has("curve") else {})


def execute_notebook(
    notebook: str | os.PathLike,
    output: str | os.PathLike,
    parameters: dict | None = None,
    *,
    failed_output: str | os.PathLike | None = None,
    kernel_name: str = KERNEL_NAME,
    name: str | None = None,
) -> dict:
    """Execute ``notebook`` with papermill into ``output``; return (and write beside it) the summary.

    Args:
        notebook: the notebook to run; it is only read. The kernel's working directory is its folder.
        output: where the executed notebook goes, written atomically; its summary goes to
            ``output`` with suffix ``.json``.
        parameters: overrides of the ``parameters`` cell; every name must be defined there.
        failed_output: where to put the executed notebook when execution fails (default: ``output``).
            The book sends failures elsewhere so that a failed copy is never taken for a good one.
        name: how the summary names the notebook (default: ``notebook`` as given).

    Raises:
        UsageError: before any kernel starts, for an unknown parameter or a bad output path.
    """
    notebook, output = Path(notebook), Path(output)
    overrides = dict(parameters or {})
    defaults = notebook_parameters(notebook)
    if overrides and defaults is None:
        raise UsageError(f"{notebook} has no cell tagged 'parameters', so it takes no parameters")
    unknown = sorted(set(overrides) - set(defaults or {}))
    if unknown:
        raise UsageError(
            f"unknown parameter{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} for {notebook}; "
            f"valid names: {', '.join(defaults) or '(none)'}"
        )
    destination_ok = output
    destination_failed = Path(failed_output) if failed_output is not None else output
    for destination in (destination_ok, destination_failed):
        _check_output_path(notebook, destination)
    destination_ok.parent.mkdir(parents=True, exist_ok=True)

    import papermill  # lazily: attnlib must import without Jupyter

    # A hidden temporary name in the destination folder: the final rename is atomic, and nothing
    # that reads `output` ever sees a half-written notebook.
    tmp = destination_ok.with_name(f".{destination_ok.stem}.{os.getpid()}.tmp.ipynb")
    start = time.perf_counter()
    error = None
    try:
        with static_explorers():  # the kernel inherits ATTNLIB_EXPLORERS=static: precomputed explorers
            papermill.execute_notebook(
                str(notebook),
                str(tmp),
                parameters=overrides,
                kernel_name=kernel_name,
                cwd=str(notebook.resolve().parent),
                progress_bar=False,
                log_output=False,
                # papermill would rewrite (and validate) the whole notebook at the start and the end
                # of every cell, about 0.7 s per chapter; it is written once, at the end (or with the
                # traceback when a cell raises).
                request_save_on_cell_execute=False,
                config=_kernel_config(),
            )
    except Exception as exc:  # the notebook raised, or the kernel died: report it, keep what ran
        error = _describe_error(exc)
    except BaseException:  # interrupted (Ctrl-C): leave no temporary file behind
        tmp.unlink(missing_ok=True)
        raise
    duration = time.perf_counter() - start

    destination = destination_ok if error is None else destination_failed
    destination.parent.mkdir(parents=True, exist_ok=True)
    checks = []
    if tmp.exists():  # papermill writes the notebook even when a cell raised, not when the kernel never started
        checks = collect_checks(_read_notebook(tmp))
        os.replace(tmp, destination)
    summary = {
        "notebook": name if name is not None else str(notebook),
        "parameters": {**(defaults or {}), **overrides},
        "status": "ok" if error is None else "failed",
        "error": error,
        "duration_s": round(duration, 2),
        "checks": checks,
    }
    write_json_atomically(summary_path(destination), summary)
    return summary


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m attnlib run",
        description="Execute a chapter notebook with papermill, with some parameters changed. "
        "Writes the executed notebook OUT and a JSON summary OUT.json (parameters used, status, "
        "error, duration, the notebook's checks).",
        epilog="Example: python -m attnlib run notebooks/01_global_convergence.ipynb -p seed 3 -o /tmp/seed3.ipynb",
    )
    parser.add_argument("notebook", type=Path, help="the notebook to execute (only read, never modified)")
    parser.add_argument(
        "-p",
        "--parameter",
        nargs=2,
        action="append",
        default=[],
        metavar=("NAME", "VALUE"),
        help="override a parameter of the notebook's 'parameters' cell; VALUE is read as a Python literal "
        "(3, 0.1, True, [1, 2]) or else as a string. Repeat for several parameters.",
    )
    parser.add_argument(
        "-o",
        "--out",
        "--output",  # the older spelling, kept as an alias
        dest="output",
        type=Path,
        help="the executed notebook to write (default: NOTEBOOK's name with .out.ipynb, in the current folder)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """The ``run`` command. Returns the exit code: 0 ok, 1 the notebook failed, 2 refused before running."""
    args = _parse_args(argv)
    overrides = {}
    for name, value in args.parameter:
        overrides[name] = parse_value(value)
    output = args.output if args.output is not None else Path(f"{args.notebook.stem}.out.ipynb")
    print(f"running {args.notebook} -> {output}", file=sys.stderr, flush=True)
    try:
        summary = execute_notebook(args.notebook, output, overrides)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    checks = describe_counts(summary["checks"])
    failed = ", ".join(c["name"] for c in summary["checks"] if status_of(c) == "failed")
    if summary["status"] == "ok" and failed:  # a notebook that forgot assert_all
        print(f"error: the notebook ran, but checks failed: {failed} ({checks}); see {output}", file=sys.stderr)
        return EXIT_FAILED
    if summary["status"] != "ok":
        print(
            f"error: the notebook failed after {summary['duration_s']:.1f} s: {summary['error']}\n"
            f"  {checks} before the failure; the executed notebook (with the traceback) is {output}, "
            f"the summary {summary_path(output)}",
            file=sys.stderr,
        )
        return EXIT_FAILED
    print(f"ok in {summary['duration_s']:.1f} s, {checks}: {output}, summary {summary_path(output)}", file=sys.stderr)
    return 0
