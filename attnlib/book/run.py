"""Parameterised notebook runs: one execution path for users, the book and the tests.

:func:`execute_notebook` runs a notebook with papermill and writes two files:

- the executed notebook, atomically (a temporary file in the same directory, renamed at the end);
- a JSON summary beside it (same name, ``.json``)::

      {"notebook": "notebooks/01_global_convergence.ipynb",
       "parameters": {"seed": 0, "steps": 1000},      # every value used: defaults merged with overrides
       "status": "ok",                                 # or one of STATUSES, see below
       "error": null,                                  # or "ValueError: parameter 'steps' must be ..."
       "duration_s": 12.3,
       "provenance": {"commit": "99127ef...", "dirty": false, "attnlib": "0.1.0",
                      "started_utc": "2026-12-01T21:40:00Z", "python": "3.11.2"},
       "checks": [{"name": ..., "value": ..., "criterion": ..., "status": "passed",  # or "failed",
                   "passed": true, "description": ..., "reason": ""}]}       # "not applicable" (passed null)

A check record is copied as the notebook emitted it, so numeric bounds that
:mod:`attnlib.book.checks` records beside the criterion text come along unchanged.

What happened, as a ``status`` and as the exit code of ``python -m attnlib run``
(:data:`EXIT_CODES`):

====================  ====  =========================================================================
status                exit  meaning
====================  ====  =========================================================================
``ok``                0     the notebook ran to the end; every check passed or was not applicable
``claims failed``     1     the notebook ran its checks and at least one failed: data, not a bug
(refused)             2     refused before any kernel started: unknown name, malformed value,
                            repeated ``-p``, bad output path, no Jupyter in this Python
``invalid parameter`` 3     a value outside what the notebook's ``al.validate`` spec allows
                            (caught before the kernel starts when the spec can be read, else by
                            the notebook itself)
``error``             4     the notebook raised for another reason, or its kernel died
``timeout``           5     a cell ran longer than ``--timeout``
====================  ====  =========================================================================

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
import datetime
import hashlib
import io
import json
import os
import platform
import re
import subprocess
import sys
import time
import tokenize
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

import attnlib

from . import params as _params
from .checks import CHECK_MIME, FAILED, describe_counts, is_known_failure, status_of
from .files import write_json_atomically
from .widgets import static_explorers

__all__ = [
    "EXIT_CODES",
    "STATUSES",
    "ParameterInfo",
    "ParameterError",
    "UsageError",
    "check_values",
    "collect_checks",
    "parameter_specs",
    "provenance",
    "require_jupyter",
    "execute_notebook",
    "main",
    "notebook_parameters",
    "parse_value",
    "summary_path",
]

KERNEL_NAME = "python3"
# The committed chapter notebooks: never an output of a run.
SOURCE_NOTEBOOKS_DIR = Path(__file__).resolve().parents[2] / "notebooks"

# Where `run` writes without -o: under the build folder, never the repository root.
DEFAULT_RUNS_DIR = Path(__file__).resolve().parents[2] / "_build" / "runs"

OK, CLAIMS_FAILED, INVALID_PARAMETER, ERROR, TIMEOUT = "ok", "claims failed", "invalid parameter", "error", "timeout"
STATUSES = (OK, CLAIMS_FAILED, INVALID_PARAMETER, ERROR, TIMEOUT)

EXIT_OK = 0
EXIT_CLAIMS_FAILED = 1  # the theorem's predictions were tested and some failed: a result, not a crash
EXIT_USAGE = 2  # refused before any kernel started (unknown name, malformed value, bad path), as argparse does
EXIT_INVALID_PARAMETER = 3  # a value the notebook's spec refuses
EXIT_ERROR = 4  # the notebook raised for another reason, or the kernel died
EXIT_TIMEOUT = 5  # a cell ran longer than the timeout
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT
EXIT_FAILED = EXIT_CLAIMS_FAILED  # the older name
EXIT_CODES = {
    OK: EXIT_OK,
    CLAIMS_FAILED: EXIT_CLAIMS_FAILED,
    INVALID_PARAMETER: EXIT_INVALID_PARAMETER,
    ERROR: EXIT_ERROR,
    TIMEOUT: EXIT_TIMEOUT,
}

EXIT_CODES_HELP = """exit codes:
  0    ok: the notebook ran; every check passed or was not applicable
  1    claims failed: the notebook ran its checks and at least one failed (a result, not a crash)
  2    refused before any kernel started: unknown parameter, malformed or repeated -p, bad output
       path, or a Python without Jupyter (use .venv/bin/python, made by `make setup`)
  3    invalid parameter: a value the notebook's al.validate spec refuses (see --list-parameters)
  4    error: the notebook raised for another reason, or its kernel died
  5    timeout: a cell ran longer than --timeout
  130  interrupted (Ctrl-C)"""


class UsageError(ValueError):
    """The run was refused before execution: unknown parameter, unreadable notebook, bad output path."""


class ParameterError(UsageError):
    """A value that the notebook's own spec refuses, found before any kernel started (exit code 3)."""


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


def _parameter_comments(source: str) -> dict[int, str]:
    """The trailing ``# comment`` of each line of a cell, by line number (the parameters' descriptions)."""
    comments = {}
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT:
                comments[token.start[0]] = token.string.lstrip("#").strip()
    except (tokenize.TokenError, IndentationError):
        pass
    return comments


@dataclass
class ParameterInfo:
    """One parameter of a notebook: its default and what the notebook's ``validate`` calls allow.

    ``specs`` are the spec callables (:mod:`attnlib.book.params`), evaluated with the parameter
    values; ``allowed`` their words; ``depends_on`` the other parameters a bound is computed from;
    ``constraints`` the notebook's further tests (``refused if d < max(n, T - 1)``); ``unread`` the
    source of specs that could not be evaluated outside the notebook.
    """

    name: str
    default: object
    description: str = ""
    specs: list = field(default_factory=list)
    depends_on: list[str] = field(default_factory=list)
    constraints: list[str] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        kinds = [getattr(spec, "kind", "") for spec in self.specs]
        return next((k for k in kinds if k), type(self.default).__name__)

    @property
    def allowed(self) -> str:
        words = [getattr(spec, "allowed", "") for spec in self.specs] + self.unread
        return " and ".join(w for w in dict.fromkeys(words) if w) or "(not validated by the notebook)"

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "default": self.default,
            "type": self.kind,
            "allowed": self.allowed,
            "depends_on": self.depends_on,
            "constraints": self.constraints,
            "description": self.description,
        }


def _spec_namespace(values: dict) -> dict:
    """What a validation cell's spec expressions may refer to: ``al``, the spec makers, the values."""
    names = {name: getattr(_params, name) for name in _params.__all__}
    return {"__builtins__": {"max": max, "min": min, "abs": abs, "len": len}, "al": attnlib, **names, **values}


def _is_validate_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call) or not node.args:
        return False
    func = node.func
    named = (isinstance(func, ast.Attribute) and func.attr == "validate") or (
        isinstance(func, ast.Name) and func.id == "validate"
    )
    first = node.args[0]
    return named and isinstance(first, ast.Call) and isinstance(first.func, ast.Name) and first.func.id == "globals"


_PARAMETER_MESSAGE = re.compile(r"^parameters? ")


def _refusal(node: ast.If) -> ast.Raise | None:
    """``raise ValueError("parameter 'x' must ...")`` as the body of an ``if`` (a notebook's own test)."""
    if len(node.body) != 1 or not isinstance(node.body[0], ast.Raise) or node.orelse:
        return None
    exc = node.body[0].exc
    if not (isinstance(exc, ast.Call) and isinstance(exc.func, ast.Name) and exc.func.id == "ValueError" and exc.args):
        return None
    message = exc.args[0]
    head = message.values[0] if isinstance(message, ast.JoinedStr) and message.values else message
    if isinstance(head, ast.Constant) and isinstance(head.value, str) and _PARAMETER_MESSAGE.match(head.value):
        return node.body[0]
    return None


def _message_names(message: ast.AST) -> list[str]:
    parts = message.values if isinstance(message, ast.JoinedStr) else [message]
    text = "".join(p.value for p in parts if isinstance(p, ast.Constant) and isinstance(p.value, str))
    return re.findall(r"'([A-Za-z_][A-Za-z0-9_]*)'", text)


def _code_cells(notebook: dict):
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") == "code":
            try:
                yield ast.parse(_cell_source(cell))
            except SyntaxError:  # IPython magics: no validation there
                continue


_VALIDATION_NODES: dict[str, tuple] = {}  # by the sha256 of a notebook file's content


def _validation_nodes(path: Path) -> tuple[tuple[ast.Call, ...], tuple[ast.If, ...]]:
    """The notebook's ``validate(globals(), ...)`` calls and its ``if ...: raise ValueError("parameter ...")``
    tests, in the order of its code cells: parsed once per content of the file (a sweep validates
    every grid point against the same notebook)."""
    try:
        content = path.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"notebook not found: {path}") from None
    digest = hashlib.sha256(content).hexdigest()
    if digest not in _VALIDATION_NODES:
        try:
            notebook = json.loads(content)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UsageError(f"not a notebook (invalid JSON): {path}: {exc}") from None
        calls, refusals = [], []
        for tree in _code_cells(notebook):
            for node in ast.walk(tree):
                if _is_validate_call(node):
                    calls.append(node)
                elif isinstance(node, ast.If) and _refusal(node) is not None:
                    refusals.append(node)
        _VALIDATION_NODES[digest] = (tuple(calls), tuple(refusals))
    return _VALIDATION_NODES[digest]


def parameter_specs(path: str | os.PathLike, values: dict | None = None) -> dict[str, ParameterInfo]:
    """Every parameter of a notebook with the specs its ``validate(globals(), ...)`` calls declare.

    Read from the notebook's source without running it: the ``parameters`` cell gives the names,
    defaults and descriptions (trailing comments); each ``validate(globals(), name=spec, ...)`` call
    in any code cell gives a spec, evaluated with ``values`` (default: the defaults) so that a bound
    computed from another parameter (``al.integer(maximum=steps)``) is the one the notebook would
    use; each ``if ...: raise ValueError("parameter 'x' ...")`` gives a constraint. A spec that names
    anything else is kept as source text (``unread``): the notebook still checks it.

    >>> infos = parameter_specs(Path(__file__).parents[2] / "tests/fixtures/parameters.ipynb")
    >>> [(i.name, i.default, i.kind, i.allowed) for i in infos.values()]
    [('steps', 3, 'int', 'an int >= 1'), ('scale', 0.5, 'float', 'a float >= 0'), ('label', 'a', 'str', 'a str')]
    """
    path = Path(path)
    notebook = _read_notebook(path)
    defaults = notebook_parameters(path) or {}
    infos = {name: ParameterInfo(name, default) for name, default in defaults.items()}
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") == "code" and "parameters" in cell.get("metadata", {}).get("tags", []):
            source = _cell_source(cell)
            comments = _parameter_comments(source)
            for node in ast.parse(source).body:
                targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
                for target in targets:
                    if isinstance(target, ast.Name) and target.id in infos:
                        infos[target.id].description = comments.get(node.end_lineno, "")
            break
    namespace = _spec_namespace({**defaults, **(values or {})})
    calls, refusals = _validation_nodes(path)
    for node in calls:
        for keyword in node.keywords:
            info = infos.get(keyword.arg)
            if info is None:
                continue  # validated but not a parameter: the notebook raises NameError itself
            used = sorted({n.id for n in ast.walk(keyword.value) if isinstance(n, ast.Name)} & set(infos))
            info.depends_on += [n for n in used if n not in info.depends_on and n != info.name]
            try:
                info.specs.append(eval(compile(ast.Expression(keyword.value), str(path), "eval"), namespace))
            except Exception:  # names only the notebook defines: shown as written
                info.unread.append(ast.unparse(keyword.value))
    for node in refusals:
        for name in _message_names(_refusal(node).exc.args[0]):
            if name in infos:
                infos[name].constraints.append(f"refused if {ast.unparse(node.test)}")
    return infos


def check_values(path: str | os.PathLike, overrides: dict) -> None:
    """Refuse, before any kernel starts, values that the notebook's own validation would refuse.

    Every parameter (defaults merged with ``overrides``) is checked against every spec that
    :func:`parameter_specs` could read, and every ``if ...: raise ValueError("parameter ...")`` test
    whose names are all parameters is evaluated. Raises :class:`ParameterError` with the notebook's
    own message. Tests that need the notebook's computed data are left to the notebook.
    """
    path = Path(path)
    values = {**(notebook_parameters(path) or {}), **overrides}
    for info in parameter_specs(path, values).values():
        for spec in info.specs:
            try:
                spec(info.name, values[info.name])
            except ValueError as exc:
                raise ParameterError(str(exc)) from None
    namespace = _spec_namespace(values)
    for node in _validation_nodes(path)[1]:
        try:
            refused = bool(eval(compile(ast.Expression(node.test), str(path), "eval"), namespace))
            message = eval(compile(ast.Expression(_refusal(node).exc.args[0]), str(path), "eval"), namespace)
        except Exception:  # the test needs the notebook's data: the notebook checks it
            continue
        if refused:
            raise ParameterError(str(message))


def format_parameters(path: str | os.PathLike) -> str:
    """The table that ``run NOTEBOOK --list-parameters`` prints."""
    infos = parameter_specs(path)
    if not infos:
        return f"{path} takes no parameters (it has no cell tagged 'parameters')"
    rows = [("name", "default", "type", "allowed")]
    notes = []
    for info in infos.values():
        rows.append((info.name, repr(info.default), info.kind, info.allowed))
        extra = []
        if info.depends_on:
            extra.append(f"bounds computed from {', '.join(info.depends_on)} (shown for their defaults)")
        extra += info.constraints
        if info.description:
            extra.insert(0, info.description)
        notes.append(extra)
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [f"parameters of {path} (the parameters cell and the notebook's validate calls):"]
    for index, row in enumerate(rows):
        lines.append("  " + "  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths)) + "  " + row[3])
        if index:
            lines += ["      " + note for note in notes[index - 1]]
    lines.append("set any of them with -p NAME VALUE (VALUE read as a Python literal).")
    return "\n".join(lines)


def require_jupyter(command: str = "run") -> None:
    """Raise :class:`UsageError` saying which Python to use when papermill cannot be imported here."""
    try:
        import papermill  # noqa: F401  (only to find out whether this Python has Jupyter)
    except ImportError:
        raise UsageError(
            f"papermill (Jupyter) is not importable from this Python ({sys.executable}): run the command "
            f"with the project's environment, `.venv/bin/python -m attnlib {command} ...` "
            "(create it with `make setup`)"
        ) from None


def _git(*args: str) -> str | None:
    try:
        completed = subprocess.run(
            ["git", *args], cwd=SOURCE_NOTEBOOKS_DIR.parent, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return completed.stdout.strip() if completed.returncode == 0 else None


def provenance(started: datetime.datetime | None = None) -> dict:
    """Where a result comes from: the git commit (and whether the tree had changes), attnlib's
    version, the start time in UTC (ISO 8601) and the Python version.

    >>> sorted(provenance())
    ['attnlib', 'commit', 'dirty', 'python', 'started_utc']
    """
    started = started or datetime.datetime.now(datetime.UTC)
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {
        "commit": commit,
        "dirty": bool(status) if status is not None else None,
        "attnlib": getattr(attnlib, "__version__", None),
        "started_utc": started.astimezone(datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "python": platform.python_version(),
    }


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


def classify(exc: BaseException | None, checks: list[dict]) -> str:
    """The status of a run (:data:`STATUSES`) from the exception it ended with and its check records.

    A failed claim is data: the notebook raised ``AssertionError`` from ``Checks.assert_all`` after
    recording a failed check (or finished without asserting, with a failed check). A ``ValueError``
    whose message names a parameter (the convention of :mod:`attnlib.book.params`) is an invalid
    parameter; a cell timeout is a timeout; anything else is an error.

    >>> classify(None, [{"status": "passed"}]), classify(None, [{"status": "failed"}])
    ('ok', 'claims failed')
    >>> classify(AssertionError("failed checks: ..."), [{"status": "failed"}])
    'claims failed'
    >>> classify(AssertionError("a bug"), [{"status": "passed"}]), classify(ValueError("parameter 'n' must be ..."), [])
    ('error', 'invalid parameter')
    """
    # a check marked known_failure shows as failed but does not fail its run (attnlib.Checks)
    failed_claim = any(status_of(c) == FAILED and not is_known_failure(c) for c in checks)
    if exc is None:
        return CLAIMS_FAILED if failed_claim else OK
    ename = getattr(exc, "ename", None) or type(exc).__name__
    evalue = str(getattr(exc, "evalue", None) if getattr(exc, "ename", None) else exc)
    if isinstance(exc, TimeoutError) or ename in ("CellTimeoutError", "TimeoutError"):
        return TIMEOUT
    if ename == "AssertionError" and failed_claim:
        return CLAIMS_FAILED
    if ename == "ValueError" and _PARAMETER_MESSAGE.match(evalue):
        return INVALID_PARAMETER
    return ERROR


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
    progress: bool = False,
    timeout: float | None = None,
    checks_only: bool = False,
    warm_kernel: bool = False,
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
        progress: print a line on stderr as each code cell finishes.
        timeout: seconds a cell may run before the run stops with status ``timeout``.
        checks_only: run every cell but draw nothing (robustness sweeps, which read only the checks):
            the kernel gets matplotlib's Agg backend, so a figure is built but never rendered or
            embedded, and explorers draw none of their positions (``ATTNLIB_EXPLORERS=skip``). The
            checks are computed by the same cells as in a full run, less the cells tagged ``figure``
            (they only draw); the summary says which run it was.
        warm_kernel: run in this process's kept kernel (:mod:`attnlib.book.kernels`), reset to a
            fresh kernel's state, instead of starting one; the book and sweeps do.

    Raises:
        UsageError: before any kernel starts, for an unknown parameter or a bad output path.
        ParameterError: before any kernel starts, for a value the notebook's spec refuses.
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
    if overrides:
        check_values(notebook, overrides)
    destination_ok = output
    destination_failed = Path(failed_output) if failed_output is not None else output
    for destination in (destination_ok, destination_failed):
        _check_output_path(notebook, destination)
    require_jupyter()
    destination_ok.parent.mkdir(parents=True, exist_ok=True)

    import papermill  # lazily: attnlib must import without Jupyter

    from . import kernels  # lazily, for the same reason (it imports papermill and jupyter_client)

    # A hidden temporary name in the destination folder: the final rename is atomic, and nothing
    # that reads `output` ever sees a half-written notebook.
    tmp = destination_ok.with_name(f".{destination_ok.stem}.{os.getpid()}.tmp.ipynb")
    started = datetime.datetime.now(datetime.UTC)
    start = time.perf_counter()
    failure = None
    km = None
    cwd = str(notebook.resolve().parent)
    try:
        # The kernel inherits ATTNLIB_EXPLORERS=static (precomputed explorers), and not MPLBACKEND: a
        # backend such as Agg (the test process's) would draw no figure into the notebook, and the
        # book's figures and their labels would vanish from the executed copy. A checks-only run
        # wants exactly that: Agg, and no explorer drawn.
        with static_explorers("skip" if checks_only else "static"), mock.patch.dict(os.environ):
            os.environ.pop("MPLBACKEND", None)
            if checks_only:
                os.environ["MPLBACKEND"] = "agg"
            if warm_kernel and kernels.warm_enabled():
                km = kernels.acquire(kernel_name, cwd, config=_kernel_config())
            papermill.execute_notebook(
                str(notebook),
                str(tmp),
                parameters=overrides,
                kernel_name=kernel_name,
                engine_name=kernels.ENGINE,
                cwd=cwd,
                progress_bar=False,
                log_output=False,
                # papermill would rewrite (and validate) the whole notebook at the start and the end
                # of every cell, about 0.7 s per chapter; it is written once, at the end (or with the
                # traceback when a cell raises).
                request_save_on_cell_execute=False,
                execution_timeout=timeout,
                config=_kernel_config(),
                km=km,
                progress=progress,
                # cells that only draw: what a checks-only run reads is unchanged without them
                skip_tags=(kernels.FIGURE_TAG,) if checks_only else (),
            )
    except Exception as exc:  # the notebook raised, or the kernel died: report it, keep what ran
        failure = exc
        kernels.discard(km)  # its state is unknown: the next notebook gets a fresh kernel
    except BaseException:  # interrupted (Ctrl-C): leave no temporary file behind
        kernels.discard(km)
        tmp.unlink(missing_ok=True)
        raise
    duration = time.perf_counter() - start

    # papermill writes the notebook even when a cell raised, not when the kernel never started.
    checks = collect_checks(_read_notebook(tmp)) if tmp.exists() else []
    status = classify(failure, checks)
    destination = destination_ok if status == OK else destination_failed
    destination.parent.mkdir(parents=True, exist_ok=True)
    if tmp.exists():
        os.replace(tmp, destination)
    summary = {
        "notebook": name if name is not None else str(notebook),
        "parameters": {**(defaults or {}), **overrides},
        "status": status,
        "error": None if failure is None else _describe_error(failure),
        "duration_s": round(duration, 2),
        "checks_only": bool(checks_only),
        "provenance": provenance(started),
        "checks": checks,
    }
    write_json_atomically(summary_path(destination), summary)
    return summary


def _slug(parameters: dict) -> str:
    """A file-name part for a set of parameters: ``seed=3_lr=0.1``, or ``defaults``."""
    text = "_".join(f"{k}={v}" for k, v in parameters.items()) or "defaults"
    return re.sub(r"[^A-Za-z0-9=._-]+", "-", text)[:80]


def default_output(notebook: Path, parameters: dict) -> Path:
    """Where ``run`` writes without ``-o``: ``_build/runs/<notebook>/<parameters>.ipynb``."""
    return DEFAULT_RUNS_DIR / notebook.stem / f"{_slug(parameters)}.ipynb"


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m attnlib run",
        description="Execute a chapter notebook with papermill, with some parameters changed. "
        "Writes the executed notebook OUT and a JSON summary OUT.json (parameters used, status, "
        "error, duration, provenance, the notebook's checks). A line per code cell shows progress on stderr.",
        epilog="example:\n  python -m attnlib run notebooks/01_global_convergence.ipynb -p seed 3 -o /tmp/seed3.ipynb\n"
        "  python -m attnlib run notebooks/01_global_convergence.ipynb --list-parameters\n\n" + EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
        "(3, 0.1, True, [1, 2]) or else as a string. Repeat for several parameters (each name once).",
    )
    parser.add_argument(
        "-o",
        "--out",
        dest="output",
        type=Path,
        help="the executed notebook to write (default: _build/runs/NOTEBOOK/PARAMETERS.ipynb)",
    )
    parser.add_argument(
        "--list-parameters",
        action="store_true",
        help="print every parameter with its default, type and allowed values (read from the notebook, "
        "nothing is executed) and exit",
    )
    parser.add_argument("--json", action="store_true", help="with --list-parameters: print them as JSON")
    parser.add_argument(
        "--html",
        action="store_true",
        help="also render the executed notebook as a page of the book (its configuration, macros and "
        "glued numbers) into OUT's folder, NAME_html/index.html",
    )
    parser.add_argument("--timeout", type=float, metavar="SECONDS", help="stop if a cell runs longer (exit code 5)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress line per cell")
    parser.add_argument(
        "--checks-only",
        action="store_true",
        help="draw no figure and no explorer: the same checks, faster (what robustness sweeps run)",
    )
    return parser.parse_args(argv)


def _overrides(pairs: list[list[str]]) -> dict:
    overrides: dict = {}
    for name, value in pairs:
        if name in overrides:
            raise UsageError(f"parameter {name!r} is given twice with -p; give each parameter once")
        overrides[name] = parse_value(value)
    return overrides


def _report(summary: dict, output: Path) -> int:
    checks = describe_counts(summary["checks"])
    status = summary["status"]
    where = f"the executed notebook is {output}, the summary {summary_path(output)}"
    if status == OK:
        print(f"ok in {summary['duration_s']:.1f} s, {checks}: {where}", file=sys.stderr)
    elif status == CLAIMS_FAILED:
        failed = ", ".join(c["name"] for c in summary["checks"] if status_of(c) == FAILED)
        print(f"claims failed: {failed} ({checks}); {where}", file=sys.stderr)
    else:
        print(
            f"{status}: the notebook stopped after {summary['duration_s']:.1f} s: {summary['error']}\n"
            f"  {checks} before it stopped; {where}",
            file=sys.stderr,
        )
    return EXIT_CODES[status]


def main(argv: list[str] | None = None, render_page=None) -> int:
    """The ``run`` command; returns the exit code (:data:`EXIT_CODES_HELP`).

    ``render_page(executed) -> Path | None`` renders ``--html`` pages; the command line passes
    :func:`attnlib.book.page.render_page_or_report` (the page machinery sits above this module, on the
    book build).
    """
    args = _parse_args(argv)
    try:
        if args.list_parameters:
            if args.json:
                infos = parameter_specs(args.notebook)
                print(json.dumps([info.as_dict() for info in infos.values()], indent=2, default=str))
            else:
                print(format_parameters(args.notebook))
            return EXIT_OK
        overrides = _overrides(args.parameter)
        output = args.output if args.output is not None else default_output(args.notebook, overrides)
        print(f"running {args.notebook} -> {output}", file=sys.stderr, flush=True)
        summary = execute_notebook(
            args.notebook,
            output,
            overrides,
            progress=not args.quiet,
            timeout=args.timeout,
            checks_only=args.checks_only,
        )
    except ParameterError as exc:
        print(f"invalid parameter: {exc} (nothing was run; see --list-parameters)", file=sys.stderr)
        return EXIT_INVALID_PARAMETER
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    code = _report(summary, output)
    if args.html and output.exists():
        if render_page is None:
            print("error: --html renders through attnlib.book.page (python -m attnlib run)", file=sys.stderr)
            return code or EXIT_USAGE
        page = render_page(output)
        if page is None:
            return code or EXIT_ERROR
        print(f"page: {page}", file=sys.stderr)
    return code
