"""The benchmarks run (smoke test, speed never asserted) and the SVM fast path agrees with cvxpy."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_quick_benchmark_writes_every_section(tmp_path):
    out = tmp_path / "core.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/run.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["quick"] is True
    for section in ("batching", "scaling", "svm", "memory", "local_converge"):
        assert section in result, section
    rows = result["batching"]["rows"]
    assert {r["blas_threads"] for r in rows} == {"default", "1"}
    assert all(np.isfinite(r["flop_fraction"]) and r["flop_fraction"] > 0 for r in rows)
    many = result["svm"]["many"]
    assert many["infeasible_agree"]
    assert many["nnls_max_relerr"] < 1e-6 and many["max_margin_max_relerr"] < 1e-6
    assert "NGD cost per trajectory-step" in proc.stdout


# ------------------------------------------------------------------ never divide by another day's number
BENCH = ROOT / "benchmarks"


def _side_by_side_module():
    import importlib.util

    sys.path.insert(0, str(BENCH))  # side_by_side imports its sibling machine_info
    try:
        spec = importlib.util.spec_from_file_location("side_by_side", BENCH / "side_by_side.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


def _divisions_by_official_names(tree):
    """``x / y`` or ``x // y`` anywhere in ``tree`` with a name containing "official" in the numerator."""
    import ast

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.FloorDiv)):
            names = [n.id for n in ast.walk(node.left) if isinstance(n, ast.Name)]
            names += [n.attr for n in ast.walk(node.left) if isinstance(n, ast.Attribute)]
            if any("official" in name.lower() for name in names):
                found.append(node.lineno)
    return found


def test_no_benchmark_script_divides_by_a_stored_official_time():
    """run.py (and any other driver but side_by_side.py, which times both itself) holds the official
    times of another day as references, and never divides anything by them; nor may any script keep
    an official time as a bare number to divide by."""
    import ast

    for path in sorted(BENCH.glob("*.py")):
        tree = ast.parse(path.read_text())
        if path.name != "side_by_side.py":
            assert _divisions_by_official_names(tree) == [], f"{path.name} divides by an official time"
        for node in tree.body:  # module-level constants
            number = isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
            if number and isinstance(node.value.value, (int, float)):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                assert not any("OFFICIAL" in n for n in names), f"{path.name}: bare official constant {names}"


def test_the_detector_finds_a_division_by_an_official_time():
    """The control of the test above: the same scan on the code this rule removed fails."""
    import ast

    old = "OFFICIAL_LOCAL_CONVERGE_S = 435.2\nratio = OFFICIAL_LOCAL_CONVERGE_S / best\n"
    assert _divisions_by_official_names(ast.parse(old)) == [2]


def _ratio_keys(obj, path=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            if re.search(r"(^|_)ratio(_|$)", k):  # ratio_vs_official, official_ratio; not "duration"
                yield f"{path}/{k}"
            yield from _ratio_keys(v, f"{path}/{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _ratio_keys(v, f"{path}[{i}]")


def test_committed_results_hold_ratios_only_for_pairs_measured_together():
    for path in sorted((BENCH / "results").glob("*.json")):
        data = json.loads(path.read_text())
        ratios = list(_ratio_keys(data))
        if path.name == "step.json":  # previous over today's step, both timed in each round of one process
            for kind, per_round in data["ratio_per_round"].items():
                cpu = data["cpu_seconds"][kind]
                assert per_round == [old / new for old, new in zip(cpu["previous"], cpu["today"])]
        elif path.name != "side_by_side.json":
            assert ratios == [], f"{path.name} holds ratios {ratios} without a side-by-side run"
    core = json.loads((BENCH / "results" / "core.json").read_text())
    for section in ("local_converge", "rank_grid"):
        if section in core:
            ref = core[section]["official_reference"]
            assert ref["measured_utc"] and ref["machine"] and ref["seconds"] > 0


def _record(kind, seconds, load=1.0):
    return dict(kind=kind, seconds=seconds, load_before=dict(utc="2026-12-01 23:00:00", load_average=[load] * 3))


def test_summarize_forms_ratios_inside_rounds_only():
    sbs = _side_by_side_module()
    rounds = [
        [_record("official", 100.0), _record("attnlib_1", 1.0), _record("attnlib_2", 0.5)],
        [_record("official", 200.0), _record("attnlib_1", 4.0), _record("attnlib_2", 2.0)],
    ]
    s = sbs.summarize(rounds)
    assert [r["official_over_attnlib_1"] for r in s["ratio_per_round"]] == [100.0, 50.0]
    # the median of the rounds' ratios (75), not a ratio of medians across rounds (150 / 2.5 = 60)
    assert s["ratio_median"]["official_over_attnlib_1"] == 75.0
    assert s["seconds"]["official"]["runs"] == [100.0, 200.0]
    with pytest.raises(ValueError, match="one run of each"):
        sbs.summarize([[_record("official", 100.0), _record("attnlib_1", 1.0)]])
    with pytest.raises(ValueError, match="no rounds"):
        sbs.summarize([])


def test_rounds_rotate_the_order_of_the_runs():
    sbs = _side_by_side_module()
    orders = [sbs.round_order(r) for r in range(3)]
    assert all(sorted(order) == sorted(sbs.KINDS) for order in orders)
    for kind in sbs.KINDS:  # each kind first, second and third once over three rounds
        assert sorted(order.index(kind) for order in orders) == [0, 1, 2]
    assert orders[0] == sbs.KINDS  # the control of the rotation: the first round as before


def test_official_script_sets_run_and_itn_exactly_once(tmp_path):
    sbs = _side_by_side_module()
    cells = [
        {"cell_type": "markdown", "source": ["RUN = 7\n"]},
        {"cell_type": "code", "source": ["import numpy as np\n", "ITN = 2000\n", "RUN = 100\n"]},
    ]
    nb = tmp_path / "local_converge.ipynb"
    nb.write_text(json.dumps({"cells": cells}))
    script = sbs.official_script(nb, runs=3, steps=50)
    assert "RUN = 3" in script and "ITN = 50" in script and "RUN = 100" not in script
    assert "RUN = 7" not in script  # markdown cells are left out
    cells[1]["source"].append("RUN = 5\n")
    nb.write_text(json.dumps({"cells": cells}))
    with pytest.raises(ValueError, match="found 2"):
        sbs.official_script(nb, runs=3, steps=50)


@pytest.mark.skipif(not (BENCH / "results" / "side_by_side.json").exists(), reason="no side-by-side run committed")
def test_the_committed_side_by_side_run_carries_date_machine_and_load():
    sbs = _side_by_side_module()
    data = json.loads((BENCH / "results" / "side_by_side.json").read_text())
    assert data["measured_together"] is True and data["started_utc"] <= data["finished_utc"]
    assert data["machine"]["cpu"] and data["machine"]["cpus"] >= 1
    assert data["complete"] and len(data["rounds"]) == data["rounds_asked"] >= 2  # two of each at least, alternately
    for index, records in enumerate(data["rounds"]):  # in the order they ran (before the rotation: always KINDS)
        ran = tuple(r["kind"] for r in records)
        assert ran == (sbs.round_order(index) if data.get("order") == "rotating" else sbs.KINDS)
        for r in records:
            assert r["seconds"] > 0 and len(r["load_before"]["load_average"]) == 3 and r["load_before"]["uptime"]
    assert data["summary"] == json.loads(json.dumps(sbs.summarize(data["rounds"])))


# ------------------------------------------------------------------ the fused training step
def test_step_benchmark_times_both_steps_on_identical_runs(tmp_path):
    """benchmarks/step.py runs today's and the previous step alternately, reports how far their
    trajectories differ, and writes CPU seconds with one ratio per round."""
    import importlib.util
    import json

    sys.path.insert(0, str(BENCH))  # step imports its sibling machine_info
    try:
        spec = importlib.util.spec_from_file_location("step_benchmark", BENCH / "step.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        out = tmp_path / "step.json"
        result = module.main(["--steps", "3", "--rounds", "2", "--out", str(out)])
    finally:
        sys.path.remove(str(BENCH))
    assert json.loads(out.read_text())["median_ratio"] == result["median_ratio"]
    for kind in ("W", "KQ"):
        assert len(result["ratio_per_round"][kind]) == 2
        assert all(t > 0 for t in result["cpu_seconds"][kind]["today"] + result["cpu_seconds"][kind]["previous"])
