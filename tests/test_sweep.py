"""Sweeps: grid parsing, refusals before any kernel, an end-to-end sweep, failures kept, rows never
lost, resume after a kill, the Dask path."""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnlib.book import sweep
from attnlib.book.run import ParameterError, UsageError
from attnlib.book.sweep import grid_points, main, parse_grid, run_sweep

FIXTURE = Path(__file__).parent / "fixtures" / "parameters.ipynb"
SEEDED = Path(__file__).parent / "fixtures" / "seeded.ipynb"
OUTCOMES = Path(__file__).parent / "fixtures" / "outcomes.ipynb"
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


@pytest.mark.parametrize(
    "spec, message",
    [
        ("steps=0:", "malformed range in grid 'steps=0:'"),
        ("steps=a:b", "malformed range in grid 'steps=a:b'"),
        ("steps=1:2:", "malformed range"),
        ("scale=0.1:0.5", "malformed range"),
        ("steps=0;2", "separate values with commas"),
        ("steps=a", "parameter 'steps' takes int values \\(default 3\\), got 'a'"),
        ("steps=", "malformed grid"),
        ("steps= ", "malformed grid"),
    ],
)
def test_malformed_values_are_refused_with_the_reason(spec, message):
    with pytest.raises(UsageError, match=message):
        parse_grid([spec], DEFAULTS)


@pytest.mark.parametrize("spec", ["steps=0:", "steps=a:b", "steps=0;2", "steps="])
def test_malformed_values_exit_2_before_any_kernel(tmp_path, capsys, monkeypatch, spec):
    monkeypatch.setitem(sys.modules, "papermill", None)  # a kernel start would need papermill
    assert main([str(FIXTURE), "--grid", spec, "--out", str(tmp_path)]) == 2
    assert "malformed" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_values_the_notebook_refuses_exit_3_before_any_kernel(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "papermill", None)
    assert main([str(FIXTURE), "--grid", "steps=1,-1", "--out", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert "parameter 'steps' must be an int >= 1, got -1 (at the grid point {'steps': -1})" in err
    assert not any(tmp_path.iterdir())
    with pytest.raises(ParameterError):
        run_sweep(FIXTURE, {"steps": [1, -1]}, tmp_path, progress=False)


def test_a_large_grid_needs_yes(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "papermill", None)
    assert main([str(SEEDED), "--grid", "seed=0:1000000", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"the grid has 1000001 points, more than {sweep.MAX_POINTS}: pass --yes" in err
    assert not any(tmp_path.iterdir())
    assert sweep.grid_size({"seed": list(range(sweep.MAX_POINTS))}) == sweep.MAX_POINTS  # 200 runs unasked
    with pytest.raises(UsageError, match="--yes"):
        run_sweep(SEEDED, {"seed": list(range(sweep.MAX_POINTS + 1))}, tmp_path, progress=False)


def test_outside_the_venv_the_sweep_says_which_python(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "papermill", None)
    assert main([str(FIXTURE), "--grid", "steps=1,2", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert ".venv/bin/python -m attnlib sweep" in err and "make setup" in err and "Traceback" not in err


@pytest.mark.notebook
def test_sweep_end_to_end_keeps_failures_and_resumes(tmp_path):
    """A failed claim and a crash are kept as rows, with their own statuses; the others go on."""
    grid = {"outcome": ["pass", "claim", "crash"]}
    first = run_sweep(OUTCOMES, grid, tmp_path, jobs=2, progress=False)
    assert [r["status"] for r in first.rows] == ["ok", "claims failed", "error"]
    assert first.exit_code() == 4  # an error outweighs a failed claim
    assert "RuntimeError: this fixture crashes on purpose" in first.rows[2]["error"]
    assert first.rows[1]["claim"] == 1.0 and first.rows[1]["claim_status"] == "failed"
    assert first.rows[1]["claim_margin"] < 0 < first.rows[0]["claim_margin"]  # beyond the bound, inside it
    assert first.rows[0]["holds"] == 1.0 and first.rows[0]["holds_status"] == "passed"
    table = json.loads(first.json_path.read_text())
    assert len(table["rows"]) == 3 and len(list(csv.DictReader(first.csv_path.open()))) == 3
    done = {p: p.stat().st_mtime_ns for p in tmp_path.glob("points/*.json") if "crash" not in p.name}
    assert len(done) == 2
    again = run_sweep(OUTCOMES, grid, tmp_path, jobs=2, progress=False)  # resume: only the crash reruns
    assert {p: p.stat().st_mtime_ns for p in done} == done
    assert [r["status"] for r in again.rows] == ["ok", "claims failed", "error"]


@pytest.mark.notebook
def test_a_smaller_grid_never_shrinks_the_table(tmp_path, capsys):
    """5 rows, then a 2-point grid into the same folder: the table keeps all 5 (and runs nothing)."""
    assert main([str(SEEDED), "--grid", "seed=0:4", "--jobs", "2", "--no-progress", "--out", str(tmp_path)]) == 1
    first = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [(r["seed"], r["status"]) for r in first] == [
        (0, "ok"),
        (1, "claims failed"),  # odd seeds fail a check: data, exit code 1, not an error
        (2, "ok"),
        (3, "claims failed"),
        (4, "ok"),  # seed 4's check is not applicable
    ]
    capsys.readouterr()
    assert main([str(SEEDED), "--grid", "seed=0:1", "--no-progress", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "2 already done, 0 to run; 3 rows of earlier grids kept" in err
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert len(rows) >= 5
    assert sorted((r["seed"], r["status"], r["odd_fails_status"]) for r in rows) == sorted(
        (r["seed"], r["status"], r["odd_fails_status"]) for r in first
    )
    assert len(list(csv.DictReader((tmp_path / "results.csv").open()))) == 5


def test_an_unreadable_table_is_not_overwritten(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "papermill", None)
    (tmp_path / "results.json").write_text("{not json")
    with pytest.raises(UsageError, match="cannot be read"):
        run_sweep(FIXTURE, {"steps": [1]}, tmp_path, progress=False)
    assert (tmp_path / "results.json").read_text() == "{not json"


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


@pytest.mark.notebook
def test_sweeps_through_one_pool_give_each_sweep_its_own_table(tmp_path):
    """Two sweeps through one pool of workers: each gets the rows it gets alone, and its ``on_done`` once,
    when its own last point finished; a sweep with nothing left to run is done before any point runs."""
    done = []
    results = sweep.run_sweeps(
        [(SEEDED, {"seed": [0, 1, 2]}, tmp_path / "a"), (OUTCOMES, {"outcome": ["pass", "claim"]}, tmp_path / "b")],
        jobs=2,
        progress=False,
        on_done=lambda index, result: done.append((index, [r["status"] for r in result.rows])),
    )
    assert sorted(done) == [(0, ["ok", "claims failed", "ok"]), (1, ["ok", "claims failed"])]
    alone = run_sweep(OUTCOMES, {"outcome": ["pass", "claim"]}, tmp_path / "alone", jobs=1, progress=False)
    for together, single in zip(results[1].rows, alone.rows):  # the same verdicts and values as a sweep alone
        assert {k: v for k, v in together.items() if k not in ("point", "duration_s")} == {
            k: v for k, v in single.items() if k not in ("point", "duration_s")
        }
    assert [len(json.loads(r.json_path.read_text())["rows"]) for r in results] == [3, 2]
    order = []
    sweep.run_sweeps(  # both already done: each is reported at once, in order, and nothing runs
        [(SEEDED, {"seed": [0, 1, 2]}, tmp_path / "a"), (OUTCOMES, {"outcome": ["pass", "claim"]}, tmp_path / "b")],
        progress=False,
        on_done=lambda index, result: order.append(index),
    )
    assert order == [0, 1]


def test_sweeps_are_all_validated_before_any_runs(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "papermill", None)  # nothing may get as far as a kernel
    with pytest.raises(ParameterError, match="at the grid point"):
        sweep.run_sweeps([(SEEDED, {"seed": [0]}, tmp_path / "a"), (FIXTURE, {"steps": [1, -1]}, tmp_path / "b")])
    assert not (tmp_path / "a").exists()
