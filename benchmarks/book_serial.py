"""The whole book executed serially, page by page, with the load around it.

    python benchmarks/book_serial.py [--out benchmarks/results/book_serial.json]

Runs ``python -m attnlib book --jobs 1 --execute-only`` after removing the staged executions
(``_build/stage``: a build artefact), so that every page of ``_toc.yml`` runs, one after another,
in the build's one worker process and its one kernel, reset between pages to a fresh kernel's state
(:mod:`attnlib.book.kernels`: the first page pays the kernel's start and the imports); then reads
every page's run summary (``duration_s``: papermill's execution, the kernel's start or reset
included) and writes them with the date, the machine, the load average
before and after, and the wall time of the whole command. Nothing is asserted.

It also projects a robustness sweep (``make robustness``: one run of every theorem chapter per
seed, ``--jobs`` at once): seeds × the theorem chapters' page times / jobs, a projection from
one seed's full page times, not a measurement (the sweep's points run checks-only, without the
cells that only draw; its measured wall time is in ``book/robustness/sweep.json``).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from machine_info import load, machine, utc_now

ROOT = Path(__file__).resolve().parent.parent
STAGE = ROOT / "_build" / "stage"


def theorem_chapters() -> tuple[str, ...]:
    """The chapters ``make robustness`` sweeps (``attnlib.book.robustness.THEOREM_CHAPTERS``)."""
    code = "from attnlib.book.robustness import THEOREM_CHAPTERS as c; print(','.join(c))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return tuple(out.stdout.strip().split(","))


def projection(result: dict, chapters, seeds: int, jobs: int) -> dict:
    """``seeds`` × the theorem chapters' page times / ``jobs``, in minutes: from the wall times, and
    from the wall times scaled by the build's CPU / wall (on a loaded machine, a page's wall time is
    mostly waiting for a core; this assumes every page waited alike)."""
    point_s = {p["page"]: p["seconds"] for p in result["pages"] if p["page"] in chapters}
    one_seed = sum(point_s.values())
    busy = result["cpu_seconds"] / result["wall_seconds"]
    return dict(
        seeds=seeds,
        jobs=jobs,
        chapters=point_s,
        one_seed_seconds=one_seed,
        projected_minutes=one_seed * seeds / jobs / 60,
        cpu_over_wall=busy,
        projected_minutes_cpu_scaled=one_seed * min(busy, 1.0) * seeds / jobs / 60,
        missing=[c for c in chapters if c not in point_s],
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/book_serial.json")
    parser.add_argument("--seeds", type=int, default=100, help="seeds of the projected robustness sweep")
    parser.add_argument("--jobs", type=int, default=2, help="points at once in the projected sweep")
    parser.add_argument("--reproject", type=Path, help="only recompute the projection of this result file")
    args = parser.parse_args(argv)
    if args.reproject:
        result = json.loads(args.reproject.read_text())
        result["robustness_projection"] = projection(result, theorem_chapters(), args.seeds, args.jobs)
        args.reproject.write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result["robustness_projection"], indent=1))
        return 0
    shutil.rmtree(STAGE, ignore_errors=True)
    before, started = load(), utc_now()
    t0, cpu0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-m", "attnlib", "book", "--jobs", "1", "--execute-only"], cwd=ROOT)
    wall, cpu1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)  # the build and its kernels
    after = load()
    pages = []
    for path in sorted((STAGE / "notebooks").glob("*.json")):
        summary = json.loads(path.read_text())
        if "duration_s" in summary:
            name = Path(summary.get("notebook", path.stem)).stem
            pages.append(dict(page=name, seconds=summary["duration_s"], status=summary.get("status")))
    result = dict(
        started_utc=started,
        finished_utc=utc_now(),
        machine=machine(),
        load_before=before,
        load_after=after,
        command="python -m attnlib book --jobs 1 --execute-only (fresh stage)",
        exit_code=proc.returncode,
        wall_seconds=wall,
        cpu_seconds=cpu,
        pages=pages,
        pages_total_seconds=sum(p["seconds"] for p in pages),
    )
    result["robustness_projection"] = projection(result, theorem_chapters(), args.seeds, args.jobs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for p in pages:
        print(f"{p['page']:40s} {p['seconds']:7.1f} s  {p['status']}")
    print(
        f"total {result['pages_total_seconds']:.0f} s of pages, {wall:.0f} s wall; load {before['load_average']} -> "
        f"{after['load_average']}; robustness {args.seeds} seeds / {args.jobs} jobs ≈ "
        f"{result['robustness_projection']['projected_minutes']:.0f} min -> {args.out}"
    )
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
