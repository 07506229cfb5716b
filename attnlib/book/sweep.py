"""Parameter sweeps over a notebook: the Cartesian product of grids, one papermill run per point.

    python -m attnlib sweep notebooks/04_joint_training.ipynb --grid seed=0:3 --grid lr=0.05,0.1 --jobs 2

Each point is executed with :func:`attnlib.book.run.execute_notebook` (the same path as ``run`` and the
book) into ``OUT/points/<name>.ipynb`` with its JSON summary beside it, and the whole sweep is
collected into ``OUT/results.csv`` and ``OUT/results.json``: one row per point with its
parameters, status, error, duration and every recorded check (value, verdict and its margin to the bound).

Nothing is lost:

- grids are validated before anything runs: names against the notebook's ``parameters`` cell,
  values against its ``al.validate`` specs (a malformed value such as ``seed=0:`` or ``seed=0;2``
  is refused with the reason, before any kernel starts); a grid of more than :data:`MAX_POINTS`
  points needs ``--yes``;
- the results table never shrinks: rows of an earlier run into the same folder that the new grid
  does not cover are kept (rerunning with a smaller grid adds nothing and loses nothing);
- a failed point is recorded with its error and the others go on;
- every finished point's files are written atomically as soon as it finishes, and the tables are
  rewritten after each point, so an interrupted sweep (Ctrl-C, a killed process) keeps them;
- rerunning the same command resumes: a point whose summary says ``ok`` for the same parameters
  and the same code (the notebook, attnlib and the pinned requirements) is not run again.
  Failed points are run again.

Beyond one machine: ``--backend dask`` starts a local Dask cluster, ``--scheduler ADDRESS`` sends
the points to an existing ``dask.distributed`` scheduler (its workers need this project
installed). Dask is an optional dependency, imported only on that path.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import itertools
import json
import math
import os
import re
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

from .build import cores_per_notebook, execution_digest
from .checks import status_of
from .files import log as _log
from .files import write_atomically, write_json_atomically
from .run import (
    ERROR,
    EXIT_CLAIMS_FAILED,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_INVALID_PARAMETER,
    EXIT_USAGE,
    OK,
    ParameterError,
    UsageError,
    check_values,
    execute_notebook,
    notebook_parameters,
    require_jupyter,
)
from .run import parse_value as _parse_literal

__all__ = [
    "MAX_POINTS",
    "SweepPoint",
    "SweepResult",
    "grid_size",
    "parse_grid",
    "grid_points",
    "run_sweep",
    "run_sweeps",
    "main",
]

PROJECT_ROOT = Path(__file__).resolve().parents[2]
MAX_POINTS = 200  # a larger grid runs only when asked for (--yes): 200 chapter runs are hours


def _split_values(text: str) -> list[str]:
    """Split on commas outside brackets and quotes: ``1,[2,3],'a,b'`` → ``['1', '[2,3]', "'a,b'"]``."""
    parts, depth, quote, current = [], 0, None, []
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        current.append(ch)
    parts.append("".join(current))
    return [p.strip() for p in parts]


_RANGE = re.compile(r"^(-?\d+):(-?\d+)(?::(\d+))?$")


def _refuse_malformed(spec: str, text: str, name: str, default) -> None:
    """A clear message for values that cannot be what was meant (before any literal parsing)."""
    if ";" in text:
        raise UsageError(f"malformed grid {spec!r}: separate values with commas (NAME=V1,V2), not ';'")
    if ":" in text and not any(ch in text for ch in "'\"[({"):
        raise UsageError(
            f"malformed range in grid {spec!r}: expected A:B or A:B:STEP with integers A <= B (B included), "
            f"for example {name}=0:9"
        )


def _refuse_wrong_kind(spec: str, name: str, values: list, default) -> None:
    """A string where the notebook's default is a number (``seed=a``) is refused by name."""
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        for value in values:
            if isinstance(value, str):
                kind = type(default).__name__
                raise UsageError(
                    f"malformed grid {spec!r}: parameter {name!r} takes {kind} values (default {default!r}), "
                    f"got {value!r}"
                )


def parse_grid(specs: Iterable[str], defaults: dict) -> dict[str, list]:
    """Parse ``NAME=V1,V2,...`` and ``NAME=A:B[:STEP]`` (integers A to B *inclusive*) specs.

    Raises :class:`~attnlib.book.run.UsageError` for a malformed spec, an unknown or repeated name, or an
    empty range, naming the spec and the valid parameter names.

    >>> parse_grid(["seed=0:3", "loss=logistic,linear"], {"seed": 0, "loss": "logistic", "lr": 0.1})
    {'seed': [0, 1, 2, 3], 'loss': ['logistic', 'linear']}
    """
    grid: dict[str, list] = {}
    valid = ", ".join(defaults) or "(none)"
    for spec in specs:
        name, sep, text = spec.partition("=")
        name = name.strip()
        if not sep or not name or not text.strip():
            raise UsageError(f"malformed grid {spec!r}: expected NAME=V1,V2,... or NAME=A:B")
        if name not in defaults:
            raise UsageError(f"unknown parameter {name!r} in grid {spec!r}; valid names: {valid}")
        if name in grid:
            raise UsageError(f"parameter {name!r} appears in two grids; give all its values in one")
        match = _RANGE.match(text.strip())
        if not match:
            _refuse_malformed(spec, text.strip(), name, defaults[name])
        if match:
            start, stop, step = int(match[1]), int(match[2]), int(match[3] or 1)
            if step < 1 or stop < start:
                raise UsageError(f"empty range in grid {spec!r}: A:B[:STEP] needs A <= B and STEP >= 1")
            values = list(range(start, stop + 1, step))
        else:
            raw = _split_values(text)
            if any(not r for r in raw):
                raise UsageError(f"malformed grid {spec!r}: empty value between commas")
            values = [_parse_literal(r) for r in raw]
            _refuse_wrong_kind(spec, name, values, defaults[name])
        grid[name] = values
    if not grid:
        raise UsageError("a sweep needs at least one --grid NAME=V1,V2,...")
    return grid


def grid_size(grid: dict[str, list]) -> int:
    """How many points the Cartesian product has (without building it).

    >>> grid_size({"seed": [0, 1, 2], "lr": [0.1, 0.2]})
    6
    """
    return math.prod(len(values) for values in grid.values())


def grid_points(grid: dict[str, list]) -> list[dict]:
    """The Cartesian product of the grids, in the order the grids were given."""
    names = list(grid)
    return [dict(zip(names, values)) for values in itertools.product(*(grid[n] for n in names))]


@dataclass(frozen=True)
class SweepPoint:
    """One point of a sweep: its parameters, a key (parameters + code) and where its files go."""

    parameters: dict
    key: str
    output: Path

    @property
    def summary(self) -> Path:
        return self.output.with_suffix(".json")


def _slug(parameters: dict) -> str:
    text = "_".join(f"{k}={v}" for k, v in parameters.items())
    return re.sub(r"[^A-Za-z0-9=._-]+", "-", text)[:80]


def _points(notebook: Path, grid: dict[str, list], out: Path) -> list[SweepPoint]:
    code = execution_digest(PROJECT_ROOT, notebook.resolve())
    points = []
    for parameters in grid_points(grid):
        blob = json.dumps(parameters, sort_keys=True, default=str) + code
        key = hashlib.sha256(blob.encode()).hexdigest()[:12]
        points.append(SweepPoint(parameters, key, out / "points" / f"{_slug(parameters)}-{key}.ipynb"))
    return points


def _is_done(point: SweepPoint) -> dict | None:
    try:
        summary = json.loads(point.summary.read_text())
    except (OSError, ValueError):
        return None
    # A failed claim is a result (the same code gives the same verdict): done. An error is run again.
    return summary if summary.get("status") in (OK, "claims failed") else None


def _run_point(notebook: str, point: SweepPoint, checks_only: bool = False) -> dict:
    """Worker: execute one point (module-level so process pools and Dask can pickle it)."""
    try:
        return execute_notebook(
            notebook, point.output, point.parameters, name=notebook, checks_only=checks_only, warm_kernel=True
        )
    except Exception as exc:  # a crash outside the notebook (disk, kernel start): record it
        summary = {
            "notebook": notebook,
            "parameters": point.parameters,
            "status": ERROR,
            "error": f"{type(exc).__name__}: {exc}",
            "duration_s": None,
            "checks": [],
        }
        write_json_atomically(point.summary, summary)
        return summary


def _row(point: SweepPoint, summary: dict | None) -> dict:
    row = {"point": point.output.stem, **point.parameters}
    if summary is None:
        return {**row, "status": "pending", "error": None, "duration_s": None}
    row.update(status=summary["status"], error=summary["error"], duration_s=summary["duration_s"])
    for check in summary.get("checks", []):
        row[check["name"]] = check["value"]
        row[f"{check['name']}_status"] = status_of(check)
        if check.get("margin") is not None:  # the value's distance inside its bound (negative: beyond it)
            row[f"{check['name']}_margin"] = check["margin"]
    return row


@dataclass(frozen=True)
class SweepResult:
    """The table of a sweep: one row per point, and the files it was written to."""

    rows: list[dict]
    csv_path: Path
    json_path: Path

    kept: int = 0  # rows of earlier runs into the same folder that this grid does not cover

    @property
    def failed(self) -> list[dict]:
        return [r for r in self.rows if r["status"] != OK]

    def exit_code(self) -> int:
        """0 every point ok; 1 some claims failed and nothing else went wrong; 4 some point errored."""
        statuses = {r["status"] for r in self.rows if r["status"] != OK}
        if not statuses:
            return 0
        return EXIT_CLAIMS_FAILED if statuses == {"claims failed"} else EXIT_ERROR


def _earlier_rows(out: Path, points: list[SweepPoint]) -> list[dict]:
    """Rows of ``out/results.json`` (an earlier run into the same folder) for points not in ``points``.

    Each keeps what its own summary says now (a point may have finished after the table was last
    written); a table that cannot be read is an error, never silently replaced.
    """
    table = out / "results.json"
    if not table.exists():
        return []
    try:
        rows = json.loads(table.read_text(encoding="utf-8"))["rows"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(
            f"{table} exists but cannot be read ({exc}); it would be overwritten: move it away or choose another --out"
        ) from None
    current = {p.output.stem for p in points}
    kept = []
    for row in rows:
        if row.get("point") in current:
            continue
        summary_file = out / "points" / f"{row.get('point')}.json"
        try:
            summary = json.loads(summary_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            summary = None
        if summary is not None:
            names = [k for k in row if k in summary.get("parameters", {})]
            point = SweepPoint({k: summary["parameters"][k] for k in names}, "", summary_file.with_suffix(".ipynb"))
            row = _row(point, summary)
        kept.append(row)
    return kept


def _write_tables(out: Path, notebook: str, grid: dict, rows: list[dict]) -> tuple[Path, Path]:
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    csv_path, json_path = out / "results.csv", out / "results.json"
    write_atomically(csv_path, buffer.getvalue())
    write_json_atomically(json_path, {"notebook": notebook, "grid": grid, "rows": rows})
    return csv_path, json_path


def _quiet_worker() -> None:
    """Send a worker's own output (kernel start-up warnings) to /dev/null.

    Everything a point produces is in its executed notebook and summary; the kernels' start-up
    chatter would otherwise interleave with the progress bar (and land in a notebook's output
    when a sweep runs inside one).
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)


def _executor(backend: str, scheduler: str | None, jobs: int):
    """Submit-style executor: a process pool, or a Dask client (local cluster or an address)."""
    if backend == "local" and scheduler is None:
        return ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn"), initializer=_quiet_worker), None
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError as exc:
        raise UsageError("the Dask backend needs dask.distributed: pip install 'dask[distributed]'") from exc
    if scheduler is not None:
        return Client(scheduler), None
    cluster = LocalCluster(n_workers=jobs, threads_per_worker=1, processes=True, dashboard_address=None)
    return Client(cluster), cluster


@dataclass
class _Sweep:
    """One sweep made ready to run: its validated points, the rows it keeps, what each point has given."""

    notebook: Path
    grid: dict[str, list]
    out: Path
    points: list[SweepPoint]
    earlier: list[dict]
    summaries: dict[str, dict | None]

    @property
    def todo(self) -> list[SweepPoint]:
        return [p for p in self.points if self.summaries[p.key] is None]

    def rows(self) -> list[dict]:
        return [_row(p, self.summaries[p.key]) for p in self.points] + self.earlier

    def record(self, point: SweepPoint, summary: dict) -> None:
        """Keep a finished point's summary and rewrite the tables (an interrupted sweep keeps them)."""
        self.summaries[point.key] = summary
        _write_tables(self.out, str(self.notebook), self.grid, self.rows())

    def result(self) -> SweepResult:
        rows = self.rows()
        csv_path, json_path = _write_tables(self.out, str(self.notebook), self.grid, rows)
        return SweepResult(rows, csv_path, json_path, kept=len(self.earlier))


def _prepare(notebook, grid: dict[str, list], out, max_points: int | None) -> _Sweep:
    """Validate a sweep before anything runs (see :func:`run_sweep` for what is refused) and find its points."""
    notebook = Path(notebook)
    defaults = notebook_parameters(notebook)
    if defaults is None:
        raise UsageError(f"{notebook} has no cell tagged 'parameters', so it cannot be swept")
    unknown = sorted(set(grid) - set(defaults))
    if unknown:
        raise UsageError(f"unknown parameters {unknown} for {notebook}; valid names: {', '.join(defaults)}")
    size = grid_size(grid)
    if max_points is not None and size > max_points:
        raise UsageError(
            f"the grid has {size} points, more than {max_points}: pass --yes (run_sweep(max_points=None)) "
            "to run them all"
        )
    for parameters in grid_points(grid):
        try:
            check_values(notebook, parameters)
        except ParameterError as exc:
            raise ParameterError(f"{exc} (at the grid point {parameters})") from None
    out = Path(out) if out is not None else PROJECT_ROOT / "_build" / "sweeps" / notebook.stem
    points = _points(notebook, grid, out)
    return _Sweep(notebook, grid, out, points, _earlier_rows(out, points), {p.key: _is_done(p) for p in points})


def run_sweep(
    notebook: str | os.PathLike,
    grid: dict[str, list],
    out: str | os.PathLike | None = None,
    jobs: int = 1,
    backend: str = "local",
    scheduler: str | None = None,
    progress: bool = True,
    max_points: int | None = MAX_POINTS,
    checks_only: bool = False,
) -> SweepResult:
    """Run ``notebook`` at every point of ``grid`` (a dict NAME → list of values).

    Args:
        out: output folder (default ``_build/sweeps/<notebook stem>``).
        jobs: points run at once (local processes, or local Dask workers).
        backend: "local" (processes on this machine) or "dask".
        scheduler: address of a running Dask scheduler (implies the Dask backend).
        progress: show a progress bar over points.
        max_points: refuse a larger grid (``None``: no limit; the command line's ``--yes``).
        checks_only: draw no figure and no explorer (:func:`attnlib.book.run.execute_notebook`);
            the command line's ``--checks-only``.

    Rows of an earlier sweep into ``out`` that this grid does not cover are kept in the tables.

    Raises:
        UsageError: before anything runs, for unknown parameters, bad arguments or a grid above
            ``max_points``.
        ParameterError: before anything runs, for a point whose values the notebook's specs refuse.
    """
    return run_sweeps(
        [(notebook, grid, out)], jobs, backend, scheduler, progress, max_points=max_points, checks_only=checks_only
    )[0]


def run_sweeps(
    sweeps: list[tuple],
    jobs: int = 1,
    backend: str = "local",
    scheduler: str | None = None,
    progress: bool = True,
    max_points: int | None = MAX_POINTS,
    checks_only: bool = False,
    on_done=None,
) -> list[SweepResult]:
    """Several sweeps, ``(notebook, grid, out)`` each, as :func:`run_sweep` runs one, through one pool of workers.

    Every sweep is validated before anything runs. Their points are queued in the order given, so
    the workers (and the kernels they keep) pass from one sweep to the next without stopping: no
    worker waits for the last point of a sweep, and none starts again for the next one.
    ``on_done(index, result)`` is called as each sweep's last point finishes (at once for a sweep
    with nothing left to run); an interrupted run keeps the tables of every sweep so far.
    ``max_points`` applies to each sweep.
    """
    if not isinstance(jobs, int) or jobs < 1:
        raise UsageError(f"jobs must be a positive integer, got {jobs!r}")
    if backend not in ("local", "dask"):
        raise UsageError(f"backend must be 'local' or 'dask', got {backend!r}")
    prepared = [_prepare(notebook, grid, out, max_points) for notebook, grid, out in sweeps]
    require_jupyter("sweep")
    for sweep in prepared:
        _log(
            f"sweep {sweep.notebook}: {len(sweep.points)} points, {len(sweep.points) - len(sweep.todo)} already "
            f"done, {len(sweep.todo)} to run"
            + (f"; {len(sweep.earlier)} rows of earlier grids kept in the table" if sweep.earlier else "")
        )
    todo = [(index, point) for index, sweep in enumerate(prepared) for point in sweep.todo]
    remaining = {index: len(sweep.todo) for index, sweep in enumerate(prepared)}
    results: dict[int, SweepResult] = {}

    def finish(index: int) -> None:
        results[index] = prepared[index].result()
        if on_done is not None:
            on_done(index, results[index])

    for index in [i for i, count in remaining.items() if count == 0]:
        finish(index)
    for sweep in prepared:
        sweep.out.mkdir(parents=True, exist_ok=True)
    bar = None
    if progress and todo:
        from tqdm.auto import tqdm

        name = prepared[0].notebook.stem if len(prepared) == 1 else f"{len(prepared)} notebooks"
        bar = tqdm(total=len(todo), desc=name, unit="point")
    with cores_per_notebook(jobs):  # points at once share the cores: ATTNLIB_PROCESSES for their kernels
        executor, cluster = _executor(backend, scheduler, jobs) if todo else (None, None)
        try:
            if executor is not None:
                futures = {
                    executor.submit(_run_point, str(prepared[index].notebook), point, checks_only): (index, point)
                    for index, point in todo
                }
                completed = as_completed(futures)
                if not isinstance(executor, ProcessPoolExecutor):
                    from dask.distributed import as_completed as dask_completed

                    completed = dask_completed(list(futures))
                for future in completed:
                    index, point = futures[future]
                    try:
                        summary = future.result()
                    except Exception as exc:  # the worker itself died
                        summary = {"status": ERROR, "error": f"{type(exc).__name__}: {exc}", "duration_s": None}
                    prepared[index].record(point, summary)
                    remaining[index] -= 1
                    if remaining[index] == 0:
                        finish(index)
                    if bar is not None:
                        bar.update(1)
                        failed = sum(1 for s in prepared for v in s.summaries.values() if v and v["status"] != OK)
                        bar.set_postfix(failed=failed)
        finally:
            if bar is not None:
                bar.close()
            if isinstance(executor, ProcessPoolExecutor):
                executor.shutdown(wait=False, cancel_futures=True)  # an interrupt must not wait for running points
            elif executor is not None:
                executor.close()
            if cluster is not None:
                cluster.close()
            for index, sweep in enumerate(prepared):
                if index not in results:  # interrupted: the tables as they stand
                    results[index] = sweep.result()
    return [results[index] for index in range(len(prepared))]


SWEEP_EXIT_CODES_HELP = f"""exit codes:
  0    every point ran ok
  1    some points' claims failed (their rows say which checks), no point errored
  2    refused before any kernel started: unknown or repeated name, malformed value, a grid above
       {MAX_POINTS} points without --yes, or a Python without Jupyter (use .venv/bin/python, made by `make setup`)
  3    a grid point has a value the notebook's al.validate spec refuses (nothing was run)
  4    some point stopped with an error, a timeout or an invalid parameter found by the notebook
  130  interrupted (Ctrl-C): finished points are kept; rerun the same command to resume"""


def _parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m attnlib sweep",
        description=__doc__.split("\n\n", 2)[0]
        + "\n\nEach point runs the notebook once with papermill; results go to OUT/results.csv and OUT/results.json. "
        "A rerun into the same folder resumes, and keeps the rows of earlier grids.",
        epilog=(
            "example:\n"
            "  python -m attnlib sweep notebooks/04_joint_training.ipynb --grid seed=0:3 --jobs 2\n"
            "  (4 points, written to _build/sweeps/04_joint_training; rerun the same command to resume)\n\n"
            + SWEEP_EXIT_CODES_HELP
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("notebook", help="the notebook to sweep (it is only read)")
    parser.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="NAME=VALUES",
        help="values of one parameter: V1,V2,... (Python literals) or A:B[:STEP] (integers A to B inclusive); "
        "repeat for several parameters (Cartesian product)",
    )
    parser.add_argument("--jobs", type=int, default=1, help="points run at once (default 1)")
    parser.add_argument("-o", "--out", "--output", dest="out", help="output folder (default _build/sweeps/NOTEBOOK)")
    parser.add_argument("--backend", choices=("local", "dask"), default="local", help="local processes or Dask")
    parser.add_argument("--scheduler", metavar="ADDRESS", help="a running dask.distributed scheduler")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--yes", action="store_true", help=f"run a grid of more than {MAX_POINTS} points")
    parser.add_argument(
        "--checks-only",
        action="store_true",
        help="draw no figure and no explorer (the checks are the same; each point is faster)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Command line; the exit codes are :data:`SWEEP_EXIT_CODES_HELP`."""
    args = _parse_args(argv)
    start = time.perf_counter()
    try:
        defaults = notebook_parameters(Path(args.notebook))
        if defaults is None:
            raise UsageError(f"{args.notebook} has no cell tagged 'parameters', so it cannot be swept")
        grid = parse_grid(args.grid, defaults)
        result = run_sweep(
            args.notebook,
            grid,
            args.out,
            args.jobs,
            args.backend,
            args.scheduler,
            not args.no_progress,
            max_points=None if args.yes else MAX_POINTS,
            checks_only=args.checks_only,
        )
    except ParameterError as exc:
        print(f"invalid parameter: {exc} (nothing was run; see run NOTEBOOK --list-parameters)", file=sys.stderr)
        return EXIT_INVALID_PARAMETER
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted: finished points are kept; rerun the same command to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    failed = result.failed
    _log(
        f"{len(result.rows) - len(failed)}/{len(result.rows)} rows ok in {time.perf_counter() - start:.1f} s"
        + (f" ({result.kept} kept from earlier grids)" if result.kept else "")
        + f"; table: {result.csv_path}"
    )
    for row in failed:
        _log(f"  {row['status']} {row['point']}: {row['error'] or 'see its checks'}")
    return result.exit_code()
