"""Every theorem chapter rerun over seeds it never ran: how often each claim passes.

    python -m attnlib robustness --seeds 1000:1099 --jobs 2            # what `make robustness` runs
    python -m attnlib robustness --seeds 1000:1099 --backend dask      # on a local Dask cluster

Each chapter is swept with :func:`attnlib.book.sweep.run_sweeps` (resumable, one papermill run per
seed, every chapter through one pool of workers) into ``_build/robustness/<chapter>``; the outcome
of every check at every seed is then written to a small committed table,
``book/robustness/<chapter>.csv`` (long format: one row per seed and check), with
``book/robustness/sweep.json`` recording per chapter the commit, the date, the seeds, the wall time
and a digest of the code its numbers depend on (:func:`numerics_digest`), and the whole run's wall
time under ``run``. The book's robustness page reads those files, so it shows the sweep without
rerunning it, and says for each chapter whether its table is still current.

>>> rows = [{"check": "a", "status": "passed"}, {"check": "a", "status": "failed"},
...         {"check": "b", "status": "not applicable"}]
>>> [(r["check"], r["passed"], r["failed"], r["not applicable"]) for r in check_rates(rows)]
[('a', 1, 1, 0), ('b', 0, 0, 1)]
"""

from __future__ import annotations

import argparse
import ast
import csv
import datetime
import hashlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .checks import FAILED, NOT_APPLICABLE, STATUSES, status_of
from .files import log as _log
from .files import write_atomically, write_json_atomically
from .run import EXIT_USAGE, UsageError, notebook_parameters
from .sweep import PROJECT_ROOT, run_sweeps

__all__ = [
    "THEOREM_CHAPTERS",
    "check_rates",
    "chapter_outcomes",
    "controls_of",
    "fresh_rows",
    "seed_independent",
    "sweep_cells",
    "main",
    "collect_chapter",
    "numerics_digest",
    "source_digest",
    "read_record",
    "read_table",
    "run_robustness",
]

THEOREM_CHAPTERS = (
    "01_global_convergence",
    "02_regularization_path",
    "03_local_convergence",
    "04_joint_training",
    "05_fast_rates",
    "06_real_tokens",
    "07_factorization",
    "08_decoder_and_initialisation",
    "09_optimizer_geometry",
)
TABLE_DIR = Path("book/robustness")
COLUMNS = (
    "chapter",
    "seed",
    "point_status",
    "check",
    "value",
    "status",
    "reason",
    "kind",
    "controls",
    "seed_independent",
)
ERROR_CHECK = "(notebook error)"  # the row of a point that raised before or outside its checks


def _rows_of_point(chapter: str, seed: int, summary: dict) -> list[dict]:
    rows = []
    for check in summary.get("checks", []):
        rows.append(
            {
                "chapter": chapter,
                "seed": seed,
                "point_status": summary["status"],
                "check": check["name"],
                "value": check["value"],
                "status": status_of(check),
                "reason": check.get("reason", ""),
                "kind": check.get("kind", "check"),
                # each control as [what was planted, value, status]: a control that passed is a failed check
                "controls": json.dumps([[c["planted"], c["value"], c["status"]] for c in check.get("controls", [])]),
                "seed_independent": check.get("seed_independent", ""),
            }
        )
    failed_checks = any(r["status"] == FAILED for r in rows)
    if summary["status"] != "ok" and not failed_checks:  # an exception that is not a failed check
        rows.append(
            {
                "chapter": chapter,
                "seed": seed,
                "point_status": summary["status"],
                "check": ERROR_CHECK,
                "value": "",
                "status": FAILED,
                "reason": summary.get("error") or "",
                "kind": "check",
                "controls": "[]",
                "seed_independent": "",
            }
        )
    return rows


def _write_csv(path: Path, rows: list[dict]) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_atomically(path, buffer.getvalue())


def read_table(path: str | os.PathLike) -> list[dict]:
    """The rows of a committed robustness table (values as text, seeds as ints)."""
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        row["seed"] = int(row["seed"])
    return rows


def controls_of(row: dict) -> list[tuple[str, object, str]]:
    """The controls of a table row, as ``(planted, value, status)`` (tables made before controls: none)."""
    return [tuple(c) for c in json.loads(row.get("controls") or "[]")]


def check_rates(rows: list[dict]) -> list[dict]:
    """Per check, in order of first appearance: how many seeds passed, failed, were not applicable; on how
    many seeds it had controls and on how many a control passed where the check applied (a wrong answer the
    check could not tell);
    its kind (check or certificate); the range of its controls' values per planted error."""
    table: dict[str, dict] = {}
    for row in rows:
        entry = table.setdefault(
            row["check"],
            {
                "check": row["check"],
                **dict.fromkeys(STATUSES, 0),
                "reasons": set(),
                "kind": row.get("kind") or "check",
                "with_controls": 0,
                "control_passed": 0,
                "controls": {},
            },
        )
        entry[row["status"]] += 1
        if row["status"] != "passed" and row.get("reason"):
            entry["reasons"].add(row["reason"])
        controls = controls_of(row)
        entry["with_controls"] += bool(controls)
        # On a seed where the check is not applicable its controls are judged against a bound that does not
        # hold there: a control that "passes" then tells nothing about the check's power.
        applicable = row["status"] != NOT_APPLICABLE
        entry["control_passed"] += applicable and any(status == "passed" for _, _, status in controls)
        for planted, value, _ in controls:
            entry["controls"].setdefault(planted, []).append(value)
    return list(table.values())


def seed_independent(rows: list[dict]) -> list[dict]:
    """The checks whose value is the same on every seed of the table (at least two seeds), with the reason
    the chapter declared (``seed_independent=`` of the predicate), or, when it declared none, what the
    table itself shows: if a control's value changes with the seed, the seed does reach the instance and
    the check's value sits at a bound it cannot pass (a count at its maximum, a rate of 1), which
    ``reached`` records; otherwise the seeds do not reach the claim, and the sweep adds no evidence for it.

    >>> rows = [{"check": "a", "seed": s, "value": "0.5", "seed_independent": ""} for s in (1, 2)]
    >>> rows += [{"check": "b", "seed": s, "value": str(s), "seed_independent": ""} for s in (1, 2)]
    >>> rows += [{"check": "c", "seed": s, "value": "1.0", "controls": f'[["wrong", {s / 4}, "failed"]]'}
    ...          for s in (1, 2)]
    >>> [(r["check"], r["value"], r["declared"], r["reached"]) for r in seed_independent(rows)]
    [('a', '0.5', False, False), ('c', '1.0', False, True)]
    """
    values: dict[str, dict] = {}
    for row in rows:
        if row["check"] == ERROR_CHECK:
            continue
        entry = values.setdefault(row["check"], {"values": set(), "seeds": set(), "controls": set(), "reason": ""})
        entry["values"].add(row["value"])
        entry["seeds"].add(row["seed"])
        entry["controls"].add(tuple((planted, str(value)) for planted, value, _ in controls_of(row)))
        entry["reason"] = entry["reason"] or row.get("seed_independent") or ""
    out = []
    for check, entry in values.items():
        if len(entry["seeds"]) >= 2 and len(entry["values"]) == 1:
            reached = not entry["reason"] and len(entry["controls"]) > 1
            if entry["reason"]:
                reason = entry["reason"]
            elif reached:
                reason = (
                    "none declared; the seed reaches the instance (the controls' values change with it), "
                    "and the value stays at the same bound"
                )
            else:
                reason = "none declared: the seed does not reach this check"
            out.append(
                {
                    "check": check,
                    "value": next(iter(entry["values"])),
                    "reason": reason,
                    "declared": bool(entry["reason"]),
                    "reached": reached,
                }
            )
    return out


def chapter_outcomes(rows: list[dict]) -> dict[str, int]:
    """Seeds on which the chapter was ok (no failed check, no error; a check whose control passed is a
    failed check), and seeds in all."""
    seeds = sorted({row["seed"] for row in rows})
    bad = {row["seed"] for row in rows if row["status"] == FAILED}
    return {"seeds": len(seeds), "ok": len(seeds) - len(bad), "failed_seeds": sorted(bad)}


def fresh_rows(entry: dict, rows: list[dict]) -> list[dict]:
    """The rows of the fresh seeds: all but those in the ranges of the entry's ``seen_before``
    (``[[first, last], …]`` in ``sweep.json``: the seeds after seeing which a redesign of the chapter's
    checks was made, its calibration; written by whoever made it).

    >>> fresh_rows({"seen_before": [[1, 2]]}, [{"seed": 1}, {"seed": 3}])
    [{'seed': 3}]
    """
    seen = entry.get("seen_before") or []
    return [row for row in rows if not any(first <= int(row["seed"]) <= last for first, last in seen)]


def sweep_cells(entry: dict, rows: list[dict]) -> str:
    """A chapter's sweep as one markdown table cell: the ok count of its seeds, the failed seeds, and when it
    was swept (commit, date, the summed execution time of its points), from its entry in ``sweep.json`` and
    its table's rows; with ``seen_before``, the ok count on the fresh seeds (:func:`fresh_rows`) too. One cell,
    so that a table of two sweeps stays narrow enough to read.

    >>> entry = {"seed_range": [1, 2], "commit": "abc", "date": "today", "points_s": 3.2}
    >>> sweep_cells(entry, [{"seed": 1, "status": "passed"}, {"seed": 2, "status": "failed"}])
    'ok on 1 of 2 (seeds 1 to 2); failed: 2; swept at `abc`, today, 3 s'
    >>> rows = [{"seed": 1, "status": "passed"}, {"seed": 2, "status": "failed"}]
    >>> sweep_cells(entry | {"seen_before": [[1, 1]]}, rows).split("; ")[2]
    'on its 1 fresh seeds (not 1 to 1): ok on 0'
    """
    outcome = chapter_outcomes(rows)
    seen = entry.get("seen_before") or []
    fresh = ""
    if seen:
        unseen = chapter_outcomes(fresh_rows(entry, rows))
        ranges = ", ".join(f"{first} to {last}" for first, last in seen)
        fresh = f"; on its {unseen['seeds']} fresh seeds (not {ranges}): ok on {unseen['ok']}"
    return (
        f"ok on {outcome['ok']} of {outcome['seeds']} (seeds {entry['seed_range'][0]} to {entry['seed_range'][1]}); "
        f"failed: {', '.join(map(str, outcome['failed_seeds'])) or 'none'}{fresh}; "
        f"swept at `{entry['commit']}`, {entry['date']}, {entry['points_s']:.0f} s"
    )


def _commit(root: Path) -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "attnlib", "notebooks"], cwd=root, capture_output=True)
        return out.stdout.strip() + ("+changes" if dirty.stdout.strip() else "") if out.returncode == 0 else "unknown"
    except OSError:
        return "unknown"


def numerics_digest(notebook: dict) -> str:
    """A hash of a notebook's code (the syntax tree of its code cells: not its prose, comments,
    layout, cell boundaries or outputs, nor the parameters cell that papermill injects), so an
    executed copy and its source give the same digest.

    The robustness page compares the digest of the notebooks the sweep executed with that of the
    chapter's current source, to say whether a table was made by the chapter's current code.
    Changes to attnlib are not in it: the test suite reruns every chapter on two of the table's
    seeds and requires the same verdicts as the table.
    """
    sources = [
        "".join(cell.get("source", []))
        for cell in notebook.get("cells", [])
        if cell.get("cell_type") == "code" and "injected-parameters" not in cell.get("metadata", {}).get("tags", [])
    ]
    try:  # one syntax tree for the whole notebook: comments, layout and cell boundaries do not count
        code = ast.dump(ast.parse("\n".join(sources)))
    except SyntaxError:  # IPython syntax (a magic): the text as written
        code = "\0".join(sources)
    return hashlib.sha256(code.encode()).hexdigest()[:16]


def source_digest(root: str | os.PathLike, chapter: str) -> str:
    """:func:`numerics_digest` of the chapter's source notebook."""
    path = Path(root) / "notebooks" / f"{chapter}.ipynb"
    return numerics_digest(json.loads(path.read_text(encoding="utf-8")))


def stale_chapters(root: str | os.PathLike, record: dict, chapters, planted_edit: bool = False) -> list[str]:
    """The chapters of ``record`` whose table was not made by the chapter's current code.

    A table is current when the digest of the notebooks its sweep executed
    (``record["chapters"][c]["numerics_digest"]``) equals :func:`source_digest` of the chapter now.
    ``planted_edit=True`` is the control of that comparison: each chapter's code is judged with one
    statement added after its sweep, so every table must then read as stale.
    """
    stale = []
    for chapter in chapters:
        notebook = json.loads((Path(root) / "notebooks" / f"{chapter}.ipynb").read_text(encoding="utf-8"))
        if planted_edit:
            notebook["cells"] = [*notebook["cells"], {"cell_type": "code", "metadata": {}, "source": ["pass\n"]}]
        if numerics_digest(notebook) != record["chapters"][chapter]["numerics_digest"]:
            stale.append(chapter)
    return stale


def read_record(table_dir: str | os.PathLike) -> dict:
    """The sweep's record (``sweep.json``): per chapter, its commit, date, seeds, wall time, outcome."""
    path = Path(table_dir) / "sweep.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {"chapters": {}}


def collect_chapter(chapter: str, points: list[dict], sweep_dir: Path, root: Path, table_dir: Path) -> dict:
    """Write the chapter's table from the executed points of its sweep, and its entry in the record.

    The entry's digest is that of the notebooks the points executed (all of them must agree), and its
    date that of the last point: a resumed or collected sweep is described by what actually ran.
    """
    rows, digests, stamps = [], set(), []
    for point in points:
        summary_file = sweep_dir / "points" / f"{point['point']}.json"
        executed = summary_file.with_suffix(".ipynb")
        summary = json.loads(summary_file.read_text()) if summary_file.exists() else None
        if summary is None:
            summary = {"status": "failed", "error": point.get("error") or "no summary", "checks": []}
        if executed.exists():
            digests.add(numerics_digest(json.loads(executed.read_text(encoding="utf-8"))))
            stamps.append(executed.stat().st_mtime)
        rows += _rows_of_point(chapter, point["seed"], summary)
    _write_csv(table_dir / f"{chapter}.csv", rows)
    record = read_record(table_dir)  # other runs may have refreshed other chapters meanwhile
    record.setdefault("chapters", {})
    # The seeds a redesign of the chapter's checks was made after seeing stay seen when it is rerun
    seen = record["chapters"].get(chapter, {}).get("seen_before")
    seeds = [point["seed"] for point in points]
    last = datetime.datetime.fromtimestamp(max(stamps), datetime.UTC) if stamps else datetime.datetime.now(datetime.UTC)
    record["chapters"][chapter] = {
        "commit": _commit(root),
        "date": last.strftime("%Y-%m-%d %H:%M UTC"),
        "numerics_digest": digests.pop() if len(digests) == 1 else "mixed",
        "seed_range": [min(seeds), max(seeds)],
        # execution time of the points, also when an interrupted sweep was resumed
        "points_s": round(sum(float(p.get("duration_s") or 0.0) for p in points), 1),
        **chapter_outcomes(rows),
        **({"seen_before": seen} if seen else {}),
    }
    write_json_atomically(table_dir / "sweep.json", record)
    return record


def run_robustness(
    seeds: list[int],
    chapters=THEOREM_CHAPTERS,
    jobs: int = 2,
    backend: str = "local",
    scheduler: str | None = None,
    root: str | os.PathLike = PROJECT_ROOT,
    table_dir: str | os.PathLike | None = None,
    fixed: dict | None = None,
    progress: bool = True,
    checks_only: bool = True,
) -> dict:
    """Sweep every chapter over ``seeds``; write its table and the sweep's record; return the record.

    The chapters' points go through one pool of workers, chapter after chapter
    (:func:`attnlib.book.sweep.run_sweeps`): a worker keeps its kernel from one chapter to the next,
    and no core waits for a chapter's last point. Each chapter's table is written as its last point
    finishes; its ``wall_s`` is its share of the run's wall time (from the previous chapter's last
    point to its own), and the record's ``run`` says how long the whole run took.

    ``fixed`` holds parameter values applied to every chapter that defines them (for cheap test
    runs); the committed tables are made with each chapter's defaults. ``checks_only`` (the
    default): the points draw no figure and no explorer, since a table holds only the checks
    (:func:`attnlib.book.run.execute_notebook`); the test suite reruns two seeds per chapter with
    everything drawn and requires the table's verdicts.
    """
    root = Path(root)
    chapters = list(chapters)
    unknown = [c for c in chapters if not (root / "notebooks" / f"{c}.ipynb").exists()]
    if unknown:
        raise UsageError(f"unknown chapters {unknown}; choose among {', '.join(THEOREM_CHAPTERS)}")
    if not seeds:
        raise UsageError("seeds must not be empty")
    table_dir = root / TABLE_DIR if table_dir is None else Path(table_dir)
    table_dir.mkdir(parents=True, exist_ok=True)
    sweeps = []
    for chapter in chapters:
        notebook = root / "notebooks" / f"{chapter}.ipynb"
        known = notebook_parameters(notebook) or {}
        grid = {"seed": list(seeds), **{k: [v] for k, v in (fixed or {}).items() if k in known}}
        sweeps.append((notebook, grid, root / "_build" / "robustness" / chapter))
    start = time.perf_counter()
    last_done = start

    def collect(index: int, result) -> None:
        nonlocal last_done
        chapter, now = chapters[index], time.perf_counter()
        # The table describes this run only: rows of earlier grids in the sweep's folder (another
        # version of the chapter, the same seeds) stay in the sweep's own results, not in the table.
        current = result.rows[: len(result.rows) - result.kept]
        record = collect_chapter(chapter, current, result.csv_path.parent, root, table_dir)
        record["chapters"][chapter].update(
            backend=backend if scheduler is None else f"dask ({scheduler})",
            jobs=jobs,
            checks_only=checks_only,
            wall_s=round(now - last_done, 1),
        )
        last_done = max(last_done, now)
        write_json_atomically(table_dir / "sweep.json", record)
        _log(f"[robustness] {chapter}: ok on {record['chapters'][chapter]['ok']} of {len(seeds)} seeds")

    run_sweeps(sweeps, jobs=jobs, backend=backend, scheduler=scheduler, progress=progress, checks_only=checks_only,
               on_done=collect)  # fmt: skip
    record = read_record(table_dir)
    record["run"] = {
        "chapters": chapters,
        "seed_range": [min(seeds), max(seeds)],
        "jobs": jobs,
        "commit": _commit(root),
        "finished": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "wall_s": round(time.perf_counter() - start, 1),
    }
    write_json_atomically(table_dir / "sweep.json", record)
    return record


def _parse_seeds(text: str) -> list[int]:
    try:
        if ":" in text:
            first, last = (int(part) for part in text.split(":"))
            seeds = list(range(first, last + 1))
        else:
            seeds = [int(part) for part in text.split(",")]
    except ValueError:
        raise UsageError(f"--seeds must be A:B (inclusive) or a comma list of integers, got {text!r}") from None
    if not seeds:
        raise UsageError(f"--seeds {text!r} is an empty range")
    return seeds


def _executed_digest(sweep_dir: Path, point: dict) -> str | None:
    executed = sweep_dir / "points" / f"{point['point']}.ipynb"
    return numerics_digest(json.loads(executed.read_text(encoding="utf-8"))) if executed.exists() else None


def _collect_only(args) -> int:
    root, seeds = PROJECT_ROOT, set(_parse_seeds(args.seeds))
    table_dir = root / TABLE_DIR if args.out is None else Path(args.out)
    table_dir.mkdir(parents=True, exist_ok=True)
    for chapter in [c.strip().removesuffix(".ipynb") for c in args.chapters.split(",") if c.strip()]:
        sweep_dir = root / "_build" / "robustness" / chapter
        if not (sweep_dir / "results.json").exists():
            raise UsageError(f"no sweep of {chapter} in {sweep_dir}: run it first (without --collect)")
        # One point per seed, the latest that ran the chapter's current code: the folder also keeps the
        # points of earlier versions of the notebook.
        digest, latest = source_digest(root, chapter), {}
        for p in json.loads((sweep_dir / "results.json").read_text())["rows"]:
            executed = sweep_dir / "points" / f"{p['point']}.ipynb"
            if p["seed"] in seeds and _executed_digest(sweep_dir, p) == digest:
                if p["seed"] not in latest or executed.stat().st_mtime > latest[p["seed"]][0]:
                    latest[p["seed"]] = (executed.stat().st_mtime, p)
        points = [latest[seed][1] for seed in sorted(latest)]
        if sorted(p["seed"] for p in points) != sorted(seeds) or any(p["status"] == "pending" for p in points):
            raise UsageError(
                f"the sweep of {chapter} has not run every seed of {args.seeds} once with the current code"
            )
        entry = collect_chapter(chapter, points, sweep_dir, root, table_dir)["chapters"][chapter]
        _log(f"[robustness] {chapter}: collected, ok on {entry['ok']} of {entry['seeds']} seeds")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnlib robustness", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="1000:1099", help="A:B (inclusive) or a comma list (default 1000:1099)")
    parser.add_argument("--chapters", default=",".join(THEOREM_CHAPTERS), help="comma list of chapter notebooks")
    parser.add_argument("--jobs", type=int, default=2, help="points run at once (default 2)")
    parser.add_argument("--backend", choices=("local", "dask"), default="local", help="local processes or Dask")
    parser.add_argument("--scheduler", metavar="ADDRESS", help="a running dask.distributed scheduler")
    parser.add_argument("-o", "--out", help=f"folder of the tables (default {TABLE_DIR})")
    parser.add_argument(
        "--draw",
        action="store_true",
        help="draw every figure and explorer as the book does (default: checks only, faster; same checks)",
    )
    parser.add_argument(
        "--collect",
        action="store_true",
        help="run nothing: rewrite the tables and the record from the points already executed in _build/robustness",
    )
    args = parser.parse_args(argv)
    try:
        if args.collect:
            return _collect_only(args)
        if args.jobs < 1:
            raise UsageError(f"--jobs must be a positive integer, got {args.jobs}")
        record = run_robustness(
            _parse_seeds(args.seeds),
            chapters=[c.strip().removesuffix(".ipynb") for c in args.chapters.split(",") if c.strip()],
            jobs=args.jobs,
            backend=args.backend,
            scheduler=args.scheduler,
            table_dir=args.out,
            checks_only=not args.draw,
        )
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    bad = {c: r["failed_seeds"] for c, r in record["chapters"].items() if r["failed_seeds"]}
    print(json.dumps(record["chapters"], indent=2))
    return 1 if bad else 0
