"""Sweeps: grid parsing, an end-to-end sweep, failures kept, resume after a kill, the Dask path."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnlib.book.run import UsageError
from attnlib.book.sweep import grid_points, main, parse_grid, run_sweep

FIXTURE = Path(__file__).parent / "fixtures" / "parameters.ipynb"
DEFAULTS = {"steps": 3, "scale": 0.5, "label": "a"}


def test_grid_parsing():
    grid = parse_grid(["steps=1:5:2", "scale=0.1,1e-3", "label='x,y',b"], DEFAULTS)
    assert grid == {"steps": [1, 3, 5], "scale": [0.1, 0.001], "label": ["x,y", "b"]}
    assert len(grid_points(grid)) == 12
    assert grid_points({"steps": [1, 2], "label": ["a"]}) == [{"steps": 1, "label": "a"}, {"steps": 2, "label": "a"}]


@pytest.mark.parametrize(
    "specs, message",
    [
        (["steps"], "malformed grid 'steps'"),
        (["steps="], "malformed grid"),
        (["seed=1,2"], "unknown parameter 'seed'.*valid names: steps, scale, label"),
        (["steps=1", "steps=2"], "appears in two grids"),
        (["steps=5:1"], "empty range"),
        (["steps=1,,2"], "empty value between commas"),
        ([], "at least one --grid"),
    ],
)
def test_bad_grids_are_refused(specs, message):
    with pytest.raises(UsageError, match=message):
        parse_grid(specs, DEFAULTS)


def test_bad_grid_exits_2_before_running(tmp_path, capsys):
    assert main([str(FIXTURE), "--grid", "nope=1", "--out", str(tmp_path)]) == 2
    assert "unknown parameter 'nope'" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_sweep_end_to_end_keeps_failures_and_resumes(tmp_path):
    grid = {"steps": [1, -1], "label": ["a", "b"]}  # steps = -1 fails the notebook's validation
    first = run_sweep(FIXTURE, grid, tmp_path, jobs=2, progress=False)
    assert [r["status"] for r in first.rows] == ["ok", "ok", "failed", "failed"]
    assert "parameter 'steps' must be an int >= 1" in first.rows[2]["error"]
    assert first.rows[0]["steps_seen"] == 1 and first.rows[0]["steps_seen_status"] == "passed"
    table = json.loads(first.json_path.read_text())
    assert len(table["rows"]) == 4 and first.csv_path.read_text().count("\n") == 5
    done = sorted(tmp_path.glob("points/steps=1_*.json"))
    stamps = [p.stat().st_mtime_ns for p in done]
    again = run_sweep(FIXTURE, grid, tmp_path, jobs=2, progress=False)  # resume: only failed points rerun
    assert [p.stat().st_mtime_ns for p in done] == stamps
    assert [r["status"] for r in again.rows] == ["ok", "ok", "failed", "failed"]


def test_interrupted_sweep_keeps_finished_points(tmp_path):
    """Kill a sweep after its first point; rerunning finishes the rest without redoing the first."""
    command = [sys.executable, "-m", "attnlib", "sweep", str(FIXTURE), "--grid", "steps=1:3", "--out", str(tmp_path)]
    proc = subprocess.Popen(command + ["--no-progress"], start_new_session=True, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not list(tmp_path.glob("points/*.json")):
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = {p: p.stat().st_mtime_ns for p in tmp_path.glob("points/*.json")}
    assert finished, "the sweep was killed before any point finished"
    result = subprocess.run(command + ["--no-progress"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert f"{len(finished)} already done" in result.stderr
    assert all(p.stat().st_mtime_ns == t for p, t in finished.items())
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [r["steps"] for r in rows] == [1, 2, 3] and all(r["status"] == "ok" for r in rows)


def test_dask_backend_on_a_local_cluster(tmp_path):
    pytest.importorskip("dask.distributed")
    result = run_sweep(FIXTURE, {"steps": [1, 2]}, tmp_path, jobs=2, backend="dask", progress=False)
    assert [r["status"] for r in result.rows] == ["ok", "ok"]
    assert [r["steps_seen"] for r in result.rows] == [1, 2]
