"""Build the book: papermill executes the chapters, Jupyter Book renders a staged copy.

``python -m attnlib book`` (what ``make book`` runs) does, from the repository root:

1. **Stage** the book source under ``_build/stage/``: ``_config.yml``, ``_toc.yml``, ``book/``, and
   the browser assets (MathJax, require.js, the widget manager) copied from ``node_modules/`` into
   ``_build/stage/_vendor/`` (served by the site itself, so it works offline).
2. **Execute** every notebook listed in ``_toc.yml`` with :func:`attnlib.book.run.execute_notebook` (the
   run command's code path) into ``_build/stage/notebooks/``, two at a time. A notebook is
   re-executed only when it, ``attnlib/*.py``, ``requirements.txt`` or ``constraints.txt`` changed:
   a content hash of those is stamped beside the executed copy (``X.stamp``), written last. A failed
   execution removes the stale staged copy and leaves the executed notebook and its summary under
   ``_build/failed/`` for debugging; ``notebooks/`` is only ever read.
3. **Claims table**: every check of every chapter, from the executed notebooks' JSON summaries,
   into ``_build/stage/book/claims_table.md``, and how to cite the book, from ``CITATION.cff``, into
   ``_build/stage/book/citation.md`` (both included by the introduction).
4. **Render** the staged copy with ``jupyter-book build`` (execution off, warnings as errors) into
   ``_build/html``, and fail unless ``_build/html/index.html`` exists. Skipped when the staged
   content is exactly what the last successful render saw.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import string
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

from ..optim import PROCESSES_ENV
from .checks import (
    NOT_APPLICABLE,
    PASSED,
    count_statuses,
    describe_counts,
    is_known_failure,
    shown_at_precision,
    status_of,
)
from .citation import citation_markdown
from .files import log as _log
from .run import execute_notebook, summary_path

_VERDICTS = {"passed": "pass", "failed": "**FAIL**", "not applicable": "not applicable"}

__all__ = [
    "BookError",
    "ExecutionResult",
    "build",
    "claims_table",
    "execute_all",
    "chapter_modules",
    "execution_digest",
    "jupyter_book_build",
    "main",
    "stage_sources",
    "toc_notebooks",
]

BUILD_DIR = "_build"
STAGE_DIR = f"{BUILD_DIR}/stage"
FAILED_DIR = f"{BUILD_DIR}/failed"
RENDER_STAMP = f"{BUILD_DIR}/html.stamp"
# Besides the notebook itself, what every execution's result depends on: the core (and the front
# doors), the book's machinery, the figures every chapter shares, the pins, the benchmark results.
# A chapter's own experiment and figure modules are added by chapter_modules().
EXECUTION_INPUTS = (
    "attnlib/*.py",
    "attnlib/book/**/*.py",
    "attnlib/experiments/__init__.py",
    "attnlib/figures/__init__.py",
    "attnlib/figures/common.py",
    "requirements.txt",
    "constraints.txt",
    "benchmarks/results/*.json",
)
# How a notebook or a room names a chapter's room: al.experiments.<chapter>, from attnlib.figures
# import <chapter> as figs, from ..experiments.<chapter> import ..., from .<chapter> import ...
_ROOM_REFERENCE = re.compile(r"\b(experiments|figures)(?:\.|\s+import\s+)(\w+)")
_SIBLING_IMPORT = re.compile(r"^from \.(\w+) import", re.M)
# What the site serves from node_modules (npm ci, versions pinned in package-lock.json): source -> stage.
VENDORED_ASSETS = {
    "mathjax/es5/tex-mml-chtml.js": "_vendor/mathjax/tex-mml-chtml.js",
    "mathjax/es5/output/chtml/fonts/woff-v2": "_vendor/mathjax/output/chtml/fonts/woff-v2",
    "requirejs/require.js": "_vendor/ipywidgets/require.js",
    "@jupyter-widgets/html-manager/dist/embed-amd.js": "_vendor/ipywidgets/embed-amd.js",
}
HEARTBEAT_S = 30  # how often a long execution reports that it is still running
# The widget manager's icon fonts (Font Awesome), looked up next to embed-amd.js.
WIDGET_FONT_SUFFIXES = (".woff2", ".woff", ".ttf", ".eot", ".svg")


class BookError(RuntimeError):
    """The book cannot be built: a missing file, a failed notebook, a failed render."""


_lock_depth = 0  # re-entrant within a process: build() holds the lock while it calls execute_all()


@contextmanager
def _build_lock(root: Path):
    """One build at a time per tree: a second `make book` (or test run) waits for the first."""
    global _lock_depth
    if _lock_depth:
        _lock_depth += 1
        try:
            yield
        finally:
            _lock_depth -= 1
        return
    (root / BUILD_DIR).mkdir(exist_ok=True)
    with open(root / BUILD_DIR / ".book.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _log("[wait] another build of this book is running; waiting for it to finish")
            fcntl.flock(lock, fcntl.LOCK_EX)
        _lock_depth = 1
        try:
            yield
        finally:
            _lock_depth = 0
            fcntl.flock(lock, fcntl.LOCK_UN)


def _toc_files(entries) -> list[str]:
    files = []
    for entry in entries or []:
        if "file" in entry:
            files.append(entry["file"])
        for key in ("parts", "chapters", "sections"):
            files += _toc_files(entry.get(key))
    return files


def toc_notebooks(root: Path) -> list[Path]:
    """The notebooks listed in ``_toc.yml``, in reading order, relative to ``root``."""
    import yaml  # a dependency of Jupyter Book

    toc = yaml.safe_load((root / "_toc.yml").read_text(encoding="utf-8"))
    notebooks = []
    for name in [toc["root"], *_toc_files(toc.get("parts")), *_toc_files(toc.get("chapters"))]:
        name = name.removesuffix(".ipynb").removesuffix(".md")
        if (root / f"{name}.ipynb").exists():
            notebooks.append(Path(f"{name}.ipynb"))
        elif not (root / f"{name}.md").exists():
            raise BookError(f"_toc.yml lists {name!r}, but neither {name}.ipynb nor {name}.md exists")
    return notebooks


def declared_dependencies(root: Path, notebook: Path) -> list[Path]:
    """What ``notebook`` reads or runs besides attnlib: the globs of its ``attnlib.depends_on`` metadata.

    A page that sweeps another chapter (the sweeps page runs the joint-training notebook) or reads
    other pages' summaries or committed tables declares them in its notebook metadata::

        "metadata": {"attnlib": {"depends_on": ["notebooks/04_joint_training.ipynb"]}}

    Matches are paths relative to ``root``, sorted; the notebook itself is never its own dependency.
    """
    meta = json.loads((root / notebook).read_text(encoding="utf-8")).get("metadata", {}).get("attnlib", {})
    patterns = meta.get("depends_on", [])
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise BookError(f"{notebook}: metadata attnlib.depends_on must be a list of glob strings, got {patterns!r}")
    found = {path.relative_to(root) for pattern in patterns for path in root.glob(pattern) if path.is_file()}
    return sorted(found - {notebook})


def chapter_modules(root: Path, notebook: Path) -> list[Path]:
    """The chapter rooms ``notebook`` uses: the ``attnlib/experiments/<chapter>.py`` and
    ``attnlib/figures/<chapter>.py`` its code names, and the rooms those import, relative to ``root``.

    A chapter reaches its rooms as ``al.experiments.<chapter>`` / ``al.figures.<chapter>`` or through
    ``from attnlib.experiments import <chapter>``; a figure module imports its own experiment module
    and ``figures.common`` (the shared rooms are in :data:`EXECUTION_INPUTS` anyway).
    """
    cells = json.loads((root / notebook).read_text(encoding="utf-8")).get("cells", [])
    code = "\n".join(
        "".join(c.get("source", [])) for c in cells if isinstance(c, dict) and c.get("cell_type") == "code"
    )
    pending = [(room, name) for room, name in _ROOM_REFERENCE.findall(code)]
    found: set[Path] = set()
    while pending:
        room, name = pending.pop()
        path = Path("attnlib", room, f"{name}.py")
        if path in found or not (root / path).is_file():
            continue
        found.add(path)
        text = (root / path).read_text(encoding="utf-8")
        pending += _ROOM_REFERENCE.findall(text) + [(room, sibling) for sibling in _SIBLING_IMPORT.findall(text)]
    return sorted(found)


def execution_digest(root: Path, notebook: Path, _seen: frozenset = frozenset()) -> str:
    """A hash of everything an execution of ``notebook`` depends on: its bytes, the core, the book's
    machinery and the pins (:data:`EXECUTION_INPUTS`), the chapter rooms it uses
    (:func:`chapter_modules`: editing chapter 6's figures re-executes chapter 6, not chapter 2),
    and (recursively) its declared dependencies, so a change to a swept chapter re-executes the page
    that sweeps it."""
    digest = hashlib.sha256()
    shared = {path.relative_to(root) for pattern in EXECUTION_INPUTS for path in root.glob(pattern)}
    inputs = [notebook] + sorted(shared | set(chapter_modules(root, notebook)))
    for relative in inputs:
        digest.update(relative.as_posix().encode() + b"\0")
        digest.update((root / relative).read_bytes() if (root / relative).exists() else b"<missing>")
        digest.update(b"\0")
    for dependency in declared_dependencies(root, notebook):
        digest.update(b"depends on " + dependency.as_posix().encode() + b"\0")
        if dependency.suffix == ".ipynb" and dependency not in _seen:
            digest.update(execution_digest(root, dependency, _seen | {notebook}).encode())
        else:
            digest.update((root / dependency).read_bytes())
    return digest.hexdigest()


def _copy_if_changed(source: Path, target: Path) -> None:
    if target.exists() and target.read_bytes() == source.read_bytes():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)


def _mirror_tree(source: Path, target: Path) -> None:
    """Make ``target`` hold exactly the files of ``source`` (stale files removed)."""
    wanted = {path.relative_to(source) for path in source.rglob("*") if path.is_file()}
    if target.exists():
        for path in target.rglob("*"):
            if path.is_file() and path.relative_to(target) not in wanted:
                path.unlink()
    for relative in wanted:
        _copy_if_changed(source / relative, target / relative)


def stage_sources(root: Path, stage: Path | None = None) -> Path:
    """Copy the book's text sources and the vendored browser assets into the stage; return its path.

    ``stage`` defaults to ``_build/stage``; ``python -m attnlib run --html`` stages a one-page book elsewhere.
    """
    stage = root / STAGE_DIR if stage is None else stage
    for name in ("_config.yml", "_toc.yml"):
        _copy_if_changed(root / name, stage / name)
    _mirror_tree(root / "book", stage / "book")
    modules = root / "node_modules"
    missing = [source for source in VENDORED_ASSETS if not (modules / source).exists()]
    if missing:
        raise BookError(f"missing browser assets {missing}: run `npm ci` (or `make book`, which does)")
    for source, target in VENDORED_ASSETS.items():
        if (modules / source).is_dir():
            _mirror_tree(modules / source, stage / target)
        else:
            _copy_if_changed(modules / source, stage / target)
    for font in (modules / "@jupyter-widgets/html-manager/dist").iterdir():
        if font.suffix in WIDGET_FONT_SUFFIXES:
            _copy_if_changed(font, stage / "_vendor/ipywidgets" / font.name)
    return stage


@dataclass(frozen=True)
class ExecutionResult:
    """What happened to one notebook in a build."""

    notebook: Path  # relative to the root
    status: str  # "up to date", or a run's status: "ok", "claims failed", "error", ... (attnlib.book.run.STATUSES)
    duration_s: float
    checks_passed: int
    checks_total: int
    error: str | None = None
    checks_not_applicable: int = 0
    checks_known_failures: int = 0  # failed checks marked known_failure (attnlib.Checks): shown, not blocking

    @property
    def checks_failed(self) -> int:
        return self.checks_total - self.checks_passed - self.checks_not_applicable

    @property
    def ok(self) -> bool:
        return self.status in ("ok", "up to date") and self.checks_failed == self.checks_known_failures

    @property
    def reason(self) -> str:
        """Why it is not ok: the exception, or how many checks failed."""
        return self.error or f"{self.checks_failed} checks failed"


def _staged(root: Path, notebook: Path) -> tuple[Path, Path]:
    executed = root / STAGE_DIR / notebook
    return executed, executed.with_suffix(".stamp")


def _is_up_to_date(root: Path, notebook: Path, digest: str) -> bool:
    executed, stamp = _staged(root, notebook)
    if not (stamp.exists() and executed.exists() and summary_path(executed).exists()):
        return False
    summary = json.loads(summary_path(executed).read_text(encoding="utf-8"))
    return stamp.read_text().strip() == digest and summary.get("status") == "ok"


def _result(notebook: Path, summary: dict, status: str) -> ExecutionResult:
    checks = summary.get("checks", [])
    return ExecutionResult(
        notebook=notebook,
        status=status,
        duration_s=float(summary.get("duration_s", 0.0)),
        checks_passed=count_statuses(checks)[PASSED],
        checks_total=sum(count_statuses(checks).values()),  # certificates are not checks
        error=summary.get("error"),
        checks_not_applicable=count_statuses(checks)[NOT_APPLICABLE],
        checks_known_failures=sum(is_known_failure(c) for c in checks if c.get("kind", "check") == "check"),
    )


def _execute_one(root: Path, notebook: Path, digest: str) -> ExecutionResult:
    """Execute one notebook into the stage (runs in a worker process)."""
    executed, stamp = _staged(root, notebook)
    failed = root / FAILED_DIR / notebook.name
    # The stamp goes first and comes back last: an interrupted or failed run leaves no valid stamp.
    stamp.unlink(missing_ok=True)
    _log(f"[execute] {notebook} ...")
    summary = execute_notebook(
        root / notebook, executed, failed_output=failed, name=notebook.as_posix(), warm_kernel=True
    )
    if summary["status"] == "ok":
        failed.unlink(missing_ok=True)
        summary_path(failed).unlink(missing_ok=True)
        stamp.write_text(digest + "\n")
    else:
        # Nothing stale stays in the stage; the failed copy is kept apart for debugging.
        executed.unlink(missing_ok=True)
        summary_path(executed).unlink(missing_ok=True)
    result = _result(notebook, summary, summary["status"])
    if result.status == "ok":
        _log(f"[ok] {notebook} in {result.duration_s:.1f} s, {describe_counts(summary['checks'])}")
    else:
        _log(
            f"[FAILED] {notebook} after {result.duration_s:.1f} s: {result.error}\n"
            f"         executed copy with the traceback: {failed.relative_to(root)}"
        )
    return result


@contextmanager
def cores_per_notebook(jobs: int):
    """Inside: the kernels started get ``ATTNLIB_PROCESSES`` = the machine's cores over ``jobs`` (at least 1).

    A notebook run alone on two cores then runs its independent batches two at a time
    (:func:`attnlib.optim.run_independent`, the same numbers); ``jobs`` notebooks at once each get
    their share. A value already set in the environment is kept (the user's choice).
    """
    if PROCESSES_ENV in os.environ:
        yield int(os.environ[PROCESSES_ENV])
        return
    share = max(1, (os.cpu_count() or 1) // max(1, jobs))
    os.environ[PROCESSES_ENV] = str(share)
    try:
        yield share
    finally:
        os.environ.pop(PROCESSES_ENV, None)


def execute_all(root: Path | str = ".", jobs: int = 2) -> list[ExecutionResult]:
    """Execute the notebooks of ``_toc.yml`` that changed since their last successful execution."""
    root = Path(root).resolve()
    with _build_lock(root):
        notebooks = toc_notebooks(root)
        results: dict[Path, ExecutionResult] = {}
        pending = []
        for notebook in notebooks:
            digest = execution_digest(root, notebook)
            if _is_up_to_date(root, notebook, digest):
                executed, _ = _staged(root, notebook)
                summary = json.loads(summary_path(executed).read_text(encoding="utf-8"))
                results[notebook] = _result(notebook, summary, "up to date")
                _log(f"[up to date] {notebook} (executed in {results[notebook].duration_s:.1f} s)")
            else:
                pending.append((notebook, digest))
        (root / STAGE_DIR).mkdir(parents=True, exist_ok=True)
        if pending:
            # A notebook starts once the notebooks it depends on that are also pending have finished
            # (the performance page reads the other chapters' fresh summaries).
            waits_for = {
                notebook: {d for d in declared_dependencies(root, notebook) if d in dict(pending)}
                for notebook, _ in pending
            }
            # Worker processes, even for one notebook: this process stays free to report progress.
            # Spawned, not forked: a forked worker would inherit this process's asyncio loop and
            # jupyter_client state (a kernel this process used), and hang talking to its own kernel.
            workers = max(1, min(jobs, len(pending)))
            with (
                cores_per_notebook(workers),
                ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool,
            ):
                started = time.perf_counter()
                queue, done, futures = list(pending), set(), {}
                while queue or futures:
                    for notebook, digest in [item for item in queue if waits_for[item[0]] <= done]:
                        queue.remove((notebook, digest))
                        futures[pool.submit(_execute_one, root, notebook, digest)] = notebook
                    if not futures:
                        raise BookError(f"circular attnlib.depends_on among {[n for n, _ in queue]}")
                    finished, _ = wait(set(futures), timeout=HEARTBEAT_S, return_when=FIRST_COMPLETED)
                    for future in finished:
                        notebook = futures.pop(future)
                        results[notebook] = future.result()
                        done.add(notebook)
                    if futures and not finished:
                        names = ", ".join(sorted(n.stem for n in futures.values()))
                        _log(f"[running] {names} ({time.perf_counter() - started:.0f} s so far)")
        return [results[notebook] for notebook in notebooks]


def _format_value(value) -> str:
    """Four significant digits, except that a value close to ±1 keeps its distance from it visible
    (a cosine of 0.99998 must not read as 1).

    >>> _format_value(0.9999818), _format_value(0.08965), _format_value(1.0), _format_value(3)
    ('0.9999818', '0.08965', '1', '3')
    """
    if isinstance(value, float) and not isinstance(value, bool):
        text = f"{value:.4g}"
        if value != 0 and float(text) != value and abs(abs(value) - 1) < 1e-3:
            gap = abs(abs(value) - 1)
            digits = min(15, 2 - int(math.floor(math.log10(gap))) + 2) if gap > 0 else 4
            text = f"{value:.{digits}f}".rstrip("0")
        return text
    return str(value)


def _code(text: str) -> str:
    """Inline code, whatever backticks the text holds."""
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _plain(text: str) -> str:
    """Text shown as typed: every ASCII punctuation mark escaped (a leading ">" would start a quote)."""
    return "".join(f"\\{char}" if char in string.punctuation else char for char in " ".join(str(text).split()))


_SENSE_SIGNS = {">=": "≥", "<=": "≤", "==": "="}


def _distance_to_bound(record: dict, x) -> float | None:
    """How far ``x`` lies from the nearer edge of the record's bound (None for labels)."""
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return None
    if record.get("sense") == "in":
        return min(abs(x - record["low"]), abs(record["high"] - x))
    if isinstance(record.get("bound"), (int, float)) and not isinstance(record.get("bound"), bool):
        return abs(x - record["bound"])
    return None


def _precision(record: dict) -> float | None:
    """The distance at which the record's numbers are shown: the value's distance to the bound, else
    the nearest control's, else the interval's half-width."""
    distances = [_distance_to_bound(record, record.get("value"))]
    distances += [_distance_to_bound(record, c.get("value")) for c in record.get("controls", [])]
    if record.get("sense") == "in":
        distances.append((record["high"] - record["low"]) / 2)
    positive = [d for d in distances if d]
    return min(positive) if positive else None


def _number(record: dict, x) -> str:
    """A value of the record, at the precision of the record's tolerance (old records: four digits)."""
    if "sense" not in record:
        return _format_value(x)
    return shown_at_precision(x, _precision(record)) if isinstance(x, float) else str(x)


def _bound_text(record: dict) -> str:
    """``≥ 0.9928``, ``in [0.97, 1.03]``: the bound at the record's precision, else the criterion text."""
    sense = record.get("sense")
    if sense == "in":
        return f"in [{_number(record, record['low'])}, {_number(record, record['high'])}]"
    if sense in _SENSE_SIGNS and "bound" in record:
        return f"{_SENSE_SIGNS[sense]} {_number(record, record['bound'])}"
    return record["criterion"]


def _margin_text(record: dict) -> str:
    """The value's distance inside its bound (in the record's unit); a pass exactly at the bound is marked."""
    m = record.get("margin")
    if m is None:
        return "—"
    if m == 0:
        return "**at the bound**"
    return f"{m:+.2g} {record.get('scale', '')}".strip()


def _controls_text(record: dict) -> str:
    """Each control: what was planted, its value, its verdict (a control must fail)."""
    if not record.get("controls"):
        return "no control yet" if record.get("controls_pending") else "—"
    parts = []
    for control in record["controls"]:
        verdict = "fails, as it must" if control["status"] == "failed" else "**passes: the check cannot tell it**"
        parts.append(f"{_plain(control['planted'])}: {_code(_number(record, control['value']))} ({verdict})")
    return "; ".join(parts)


def _separation_text(record: dict) -> str:
    sep = record.get("separation")
    text = "—" if sep is None else f"{sep:+.2g} {record.get('scale', '')}".strip()
    resolution = record.get("resolution")
    if resolution is not None and math.isfinite(resolution):
        text += f"; detects a rotation of {resolution:.2g}°"
    elif resolution == math.inf:
        text += "; detects no rotation of its reference up to the largest tried"
    return text


def _chapter_title(notebook: Path) -> str:
    """The notebook's first level-1 heading (its title in the table of contents)."""
    try:
        cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    except (OSError, ValueError, KeyError):
        return notebook.stem
    for cell in cells:
        if cell.get("cell_type") == "markdown":
            for line in "".join(cell.get("source", "")).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return notebook.stem


def _chapter_claims(notebook: Path, records: list[dict], title: str | None = None) -> list[str]:
    """One chapter's claims, folded: a dropdown whose title counts them, holding the checks' table
    (name, value, bound, margin, controls, separation, verdict) and the proved bounds apart."""
    checks = [r for r in records if r.get("kind", "check") == "check"]
    certificates = [r for r in records if r.get("kind", "check") == "certificate"]
    counts = describe_counts(records)
    pending = sum(1 for r in checks if r.get("controls_pending") and not r.get("controls"))
    if pending:
        counts += f"; {pending} of them without a control yet"
    lines = [f":::{{dropdown}} {title or notebook.stem}: {counts}", ""]
    lines += [f"{{doc}}`/{notebook.with_suffix('').as_posix()}`: {counts}.", ""]
    if checks:
        lines += [
            "```{list-table}",
            ":header-rows: 1",
            ":class: claims-table",
            ":widths: 26 12 12 10 24 10 6",
            "",
            "* - check",
            "  - measured",
            "  - bound",
            "  - margin inside the bound",
            "  - control (the same test on a planted wrong answer)",
            "  - separation (the nearest control beyond the bound)",
            "  - verdict",
        ]
        for check in checks:
            status = status_of(check)
            verdict = _VERDICTS[status]
            if status == NOT_APPLICABLE:
                verdict += f" ({_plain(check.get('reason', ''))})"
            elif status == "failed" and check.get("value_status") == PASSED:
                verdict += " (a control passed)"
            if status == "failed" and check.get("known_failure"):
                verdict += f" (a known failure: {_plain(check['known_failure'])})"
            description = " ".join(check.get("description", "").split())
            lines += [
                # The description is the notebook's own prose (it may hold math); the numbers are code-like text.
                f"* - {_code(check['name'])}" + (f": {description}" if description else ""),
                f"  - {_code(_number(check, check['value']))}",
                f"  - {_plain(_bound_text(check))}",
                f"  - {_margin_text(check)}",
                f"  - {_controls_text(check)}",
                f"  - {_separation_text(check)}",
                f"  - {verdict}",
            ]
        lines += ["```", ""]
    if certificates:
        lines += ["Proved on the page (certificates: facts shown, not tested as claims):", ""]
        for cert in certificates:
            held = "holds" if status_of(cert) == PASSED else "**VIOLATED**"
            lines.append(
                f"- {_code(cert['name'])}: {_code(_number(cert, cert['value']))} {_plain(_bound_text(cert))}, {held}"
                f" ({' '.join(cert.get('description', '').split())})"
            )
        lines.append("")
    return lines + [":::", ""]


def claims_table(root: Path | str = ".") -> str:
    """The claims tables (MyST markdown): every check of every executed chapter, from its summary."""
    root = Path(root).resolve()
    lines, every = [], []
    for notebook in toc_notebooks(root):
        executed, _ = _staged(root, notebook)
        if not summary_path(executed).exists():
            raise BookError(f"{notebook} has no executed summary in {STAGE_DIR}: execute it first")
        checks = json.loads(summary_path(executed).read_text(encoding="utf-8"))["checks"]
        every += checks
        lines += _chapter_claims(notebook, checks, _chapter_title(root / notebook))
    if not every:
        return "No chapter has recorded a check yet.\n"
    header = (
        f"**{describe_counts(every)}**, generated from the executed notebooks when the book was built. A check "
        "passes when its value meets the bound *and* every control (the same test on a planted wrong answer) "
        "misses it; margins and separations are in the unit shown (decades: log10 of the ratio to the bound)."
    )
    return "\n".join([header, "", *lines])


def _stage_digest(stage: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in stage.rglob("*") if p.is_file() and p.suffix != ".stamp"):
        digest.update(path.relative_to(stage).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _jupyter_book_command() -> list[str]:
    script = Path(sys.executable).with_name("jupyter-book")
    if script.exists():
        return [str(script)]
    found = shutil.which("jupyter-book")
    if found is None:
        raise BookError("jupyter-book is not installed: run `make setup`")
    return [found]


def jupyter_book_build(root: Path, stage: Path, path_output: Path, builder: str = "html") -> None:
    """``jupyter-book build`` of the staged book with Sphinx's ``builder`` into
    ``path_output/_build/<builder>``: execution off (``_config.yml``), every page re-read, warnings as
    errors. Raises :class:`BookError` with the warnings. The site is ``builder="html"``; the PDF
    prints ``"singlehtml"`` (:mod:`attnlib.book.pdf`)."""
    # --all: re-read every page, so that -W reports the warnings of unchanged pages too.
    command = [*_jupyter_book_command(), "build", str(stage), "--path-output", str(path_output)]
    command += ["--builder", builder, "--all", "-W", "--keep-going"]
    completed = subprocess.run(command, cwd=root, check=False, capture_output=True, text=True)
    sys.stderr.write(completed.stdout + completed.stderr)
    if completed.returncode != 0:
        # Repeat the warnings in the error itself: under pytest the output above is captured.
        output = re.sub(r"\x1b\[[0-9;]*m", "", completed.stdout + completed.stderr)  # no terminal colours
        warnings = "\n".join(line for line in output.splitlines() if "WARNING" in line)
        raise BookError(f"jupyter-book failed (exit code {completed.returncode}), warnings are errors:\n{warnings}")


def render(root: Path | str = ".") -> bool:
    """Render the staged book into ``_build/html``; return False if it was already up to date."""
    root = Path(root).resolve()
    stage, html, stamp = root / STAGE_DIR, root / BUILD_DIR / "html", root / RENDER_STAMP
    digest = _stage_digest(stage)
    if (html / "index.html").exists() and stamp.exists() and stamp.read_text().strip() == digest:
        _log("[site] up to date: _build/html")
        return False
    stamp.unlink(missing_ok=True)
    shutil.rmtree(html, ignore_errors=True)  # index.html must come from this render, not an older one
    _log("[site] rendering with jupyter-book (execution off, warnings as errors) ...")
    start = time.perf_counter()
    jupyter_book_build(root, stage, root)
    if not (html / "index.html").exists():
        raise BookError("jupyter-book reported success but _build/html/index.html does not exist")
    stamp.write_text(digest + "\n")
    _log(f"[site] rendered in {time.perf_counter() - start:.1f} s: {html.relative_to(root)}/index.html")
    return True


def build(root: Path | str = ".", jobs: int = 2) -> list[ExecutionResult]:
    """Stage, execute what changed, write the claims table and render. Raises :class:`BookError`."""
    root = Path(root).resolve()
    start = time.perf_counter()
    with _build_lock(root):
        stage = stage_sources(root)
        results = execute_all(root, jobs=jobs)
        failures = [result for result in results if not result.ok]
        if failures:
            reasons = [f"  {result.notebook}: {result.reason}" for result in failures]
            raise BookError("notebooks failed, the site was not rendered:\n" + "\n".join(reasons))
        # Generated pages the introduction includes: the claims table, and how to cite the book
        # (from CITATION.cff). Rewritten only when they changed, so the render can stay up to date.
        for name, text in (("claims_table.md", claims_table(root)), ("citation.md", citation_markdown(root))):
            if not (stage / "book" / name).exists() or (stage / "book" / name).read_text() != text:
                (stage / "book" / name).write_text(text, encoding="utf-8")
        render(root)
    _log(f"[book] done in {time.perf_counter() - start:.1f} s")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attnlib book",
        description="Execute the notebooks of _toc.yml that changed (papermill) and render the book into _build/html.",
    )
    parser.add_argument("--root", type=Path, default=Path("."), help="the repository root (default: .)")
    parser.add_argument("-j", "--jobs", type=int, default=2, help="notebooks executed at once (default: 2)")
    parser.add_argument("--execute-only", action="store_true", help="stage and execute, do not render the site")
    args = parser.parse_args(argv)
    try:
        if args.execute_only:
            failures = [r for r in execute_all(args.root, jobs=args.jobs) if not r.ok]
            return 1 if failures else 0
        build(args.root, jobs=args.jobs)
    except BookError as exc:
        _log(f"error: {exc}")
        return 1
    return 0
