"""attnlib.book.calibration: the thresholds chosen after a result, and their checks on two disjoint sweeps."""

import json
from pathlib import Path

import pytest

import attnlib as al
from attnlib.book import calibration, robustness
from attnlib.book.run import notebook_parameters
from attnlib.experiments import global_convergence as ex

ROOT = Path(__file__).resolve().parents[2]


def _checks_in(table_dir: Path, chapter: str) -> set[str]:
    return {row["check"] for row in robustness.read_table(table_dir / f"{chapter}.csv")}


@pytest.mark.parametrize("threshold", calibration.THRESHOLDS, ids=lambda t: f"{t.chapter[:2]}-{t.name}")
def test_every_registered_threshold_names_real_checks_and_a_real_value(threshold):
    assert threshold.chapter in robustness.THEOREM_CHAPTERS
    assert threshold.checks and threshold.how_chosen and threshold.calibrated_on
    for table_dir in (ROOT / robustness.TABLE_DIR, ROOT / calibration.CALIBRATION_DIR):
        missing = set(threshold.checks) - _checks_in(table_dir, threshold.chapter)
        assert not missing, f"{threshold.name}: checks {sorted(missing)} are not in {table_dir}"
    if not threshold.constant:
        params = notebook_parameters(ROOT / "notebooks" / f"{threshold.chapter}.ipynb")
        assert threshold.name in params
        assert calibration.threshold_value(threshold, ROOT) == params[threshold.name]
    else:
        assert isinstance(calibration.threshold_value(threshold, ROOT), (int, float))


def test_an_unknown_parameter_is_refused_by_name():
    bad = calibration.Threshold("05_fast_rates", "no_such_parameter", "w", "h", "c", ("ngd_speedup",))
    with pytest.raises(KeyError, match="no_such_parameter"):
        calibration.threshold_value(bad, ROOT)


def test_chapter_1s_horizon_rule_reads_the_registered_constant():
    assert ex.OFFSET_E_FOLDINGS == 6  # the registry's value is the one the rule uses
    prob = al.datasets.loss_study(3.0)  # two neighbours, kappa = 1: horizon 2 * e-foldings / (kappa * eta)
    assert ex.offset_check_horizon(prob, al.max_margin(prob), 100, 0.1) == 2 * ex.OFFSET_E_FOLDINGS * 10


def _rows(passed: int, failed: int, control_status: str = "failed") -> list[dict]:
    controls = json.dumps([["wrong", 1.0, control_status]])
    statuses = ["passed"] * passed + ["failed"] * failed
    return [{"check": "c", "seed": s, "status": st, "controls": controls} for s, st in enumerate(statuses)]


def test_pass_rates_count_checks_and_controls():
    rate = calibration.check_pass_rate(_rows(3, 1) + [{"check": "other", "status": "failed"}], ("c",))
    assert (rate["passed"], rate["failed"], rate["controls_failed"], rate["controls"]) == (3, 1, 4, 4)
    assert calibration.check_pass_rate(_rows(2, 0, "passed"), ("c",))["controls_failed"] == 0


def test_a_threshold_that_passes_less_often_on_the_evaluation_range_is_flagged():
    calib = calibration.check_pass_rate(_rows(20, 0), ("c",))

    def evaluate(passed, failed):
        return calibration.passes_less_often(calib, calibration.check_pass_rate(_rows(passed, failed), ("c",)))

    assert evaluate(100, 0) == ""
    assert evaluate(99, 1) == "less often"  # any drop is shown
    # control: the same checks failing on a fifth of the evaluation seeds must be flagged as beyond chance
    assert evaluate(80, 20) == "markedly less often"


def test_threshold_rows_on_the_committed_tables():
    read = lambda folder: {c: robustness.read_table(folder / f"{c}.csv") for c in robustness.THEOREM_CHAPTERS}  # noqa: E731
    rows = calibration.threshold_rows(ROOT, read(ROOT / calibration.CALIBRATION_DIR), read(ROOT / robustness.TABLE_DIR))
    assert len(rows) == len(calibration.THRESHOLDS)
    for row in rows:
        for sweep in ("calibration", "evaluation"):
            assert row[sweep]["passed"] + row[sweep]["failed"] + row[sweep]["not applicable"] > 0


def test_the_robustness_page_depends_on_the_calibration_tables():
    page = json.loads((ROOT / "notebooks" / "11_robustness.ipynb").read_text(encoding="utf-8"))
    assert "book/robustness/calibration/*" in page["metadata"]["attnlib"]["depends_on"]
    record = robustness.read_record(ROOT / calibration.CALIBRATION_DIR)
    assert set(record["chapters"]) == set(robustness.THEOREM_CHAPTERS)
