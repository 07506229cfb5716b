"""The performance page's figures and tables: empty panels without results, drawn ones with them."""

import json
from pathlib import Path

import matplotlib
import numpy as np
import pytest

import attnlib as al

matplotlib.use("Agg")
perf = al.book.performance
RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def test_without_results_every_panel_says_so():
    for fig in (perf.batching_figure(None), perf.scaling_figure(None), perf.svm_figure(None)):
        assert all(ax.texts and ax.texts[0].get_text() == "no results" for ax in fig.axes)
    fig, note = perf.local_converge_figure(None)
    assert note == "" and fig.axes[0].texts[0].get_text() == "no full benchmark run"
    fig, note = perf.book_times_figure([], None)
    assert note == "" and [ax.texts[0].get_text() for ax in fig.axes] == ["no book build found", perf_profile_text()]
    assert perf.batching_table(None) == "" and perf.svm_and_memory_notes(None) == ""
    assert "run `make bench`" in perf.results_header(None)


def perf_profile_text():
    return "no profile (python benchmarks/book_profile.py)"


@pytest.mark.skipif(not (RESULTS / "core.json").exists(), reason="no committed benchmark results")
def test_the_committed_results_are_drawn():
    core = json.loads((RESULTS / "core.json").read_text())
    fig = perf.batching_figure(core)
    assert len(fig.axes[0].lines) >= 2 and not fig.axes[0].texts
    assert "| path, BLAS threads |" in perf.batching_table(core)
    assert all(ax.lines for ax in perf.scaling_figure(core).axes)
    assert core["measured_utc"] in perf.results_header(core)


def test_read_summaries_keeps_run_summaries_only(tmp_path):
    (tmp_path / "01_a.json").write_text(json.dumps({"notebook": "01_a.ipynb", "duration_s": 2.0}))
    (tmp_path / "12_performance.json").write_text(json.dumps({"notebook": "08.ipynb", "duration_s": 1.0}))
    (tmp_path / "broken.json").write_text("{")
    (tmp_path / "other.json").write_text("[1, 2]")
    found = perf.read_summaries(tmp_path, exclude="12_performance")
    assert [s["notebook"] for s in found] == ["01_a.ipynb"]
    fig, note = perf.book_times_figure(found, None)
    assert "1 chapters, 2 s" in note
    assert perf.read_json(tmp_path / "missing.json") is None and perf.read_json(None) is None


def test_results_folder_given_must_be_a_folder(tmp_path):
    assert perf.results_folder("x", str(tmp_path)) == tmp_path
    assert perf.results_folder("x", str(tmp_path / "nope")) is None


def test_measure_batching_times_both_paths_and_the_products():
    prob = al.datasets.random_tokens(3, 4, 3, seed=0)
    rows = perf.measure_batching(prob, [1, 8], work=16, repeats=1, rng=np.random.default_rng(0))
    assert [r["B"] for r in rows] == [1, 8] and [r["steps"] for r in rows] == [16, 3]
    assert all(r[k] > 0 for r in rows for k in ("generic", "rank_one", "matmul"))
    fig = perf.live_batching_figure(rows)
    assert len(fig.axes[0].lines) == 3


# ------------------------------------------------------------------ the official code: only side by side
def _sbs(rounds, together=True):
    rec = lambda kind, s, load: {  # noqa: E731
        "kind": kind,
        "seconds": s,
        "load_before": {"utc": "2026-12-01 23:01:00", "load_average": [load, 1.0, 1.0]},
    }
    return {
        "measured_together": together,
        "started_utc": "2026-12-01 23:01:00",
        "finished_utc": "2026-12-01 23:09:00",
        "machine": {"node": "vm", "cpu": "Some CPU", "cpus": 2},
        "setting": {"runs": 100, "steps": 2000},
        "official": {"repository": "github.com/umich-sota/TF-as-SVM", "commit": "568305aa" * 5, "versions": "torch"},
        "attnlib": {"commit": "abcdef12" * 5, "versions": "numpy"},
        "rounds": [
            [rec("official", o, 0.5), rec("attnlib_1", a1, 0.6), rec("attnlib_2", a2, 0.7)] for o, a1, a2 in rounds
        ],
    }


def test_side_by_side_table_shows_date_machine_load_and_the_rounds_ratios():
    table = perf.side_by_side_table(_sbs([(170.0, 1.7, 1.0), (180.0, 2.0, 1.2)]))
    assert "2026-12-01 23:01:00 to 2026-12-01 23:09:00 UTC" in table and "Some CPU, 2 CPUs" in table
    assert "| 170.0 | 1.70 | 1.00 | 100× | 170× | 0.5 / 0.6 / 0.7 |" in table
    assert "| 180.0 | 2.00 | 1.20 | 90× | 150× |" in table
    assert "| median of the rounds' ratios | | | | 95× | 160× | |" in table
    assert "byte-compiled" not in table  # said only of a run that compiled both sides first
    assert "Both sides ran from byte-compiled sources" in perf.side_by_side_table(
        dict(_sbs([(170.0, 1.7, 1.0)]), bytecode="both sides byte-compiled before the rounds")
    )


def test_no_ratio_without_a_pair_measured_together():
    no_ratio = "no ratio against the official code is shown"
    assert no_ratio in perf.side_by_side_table(None)
    assert no_ratio in perf.side_by_side_table(_sbs([(170.0, 1.7, 1.0)], together=False))
    broken = _sbs([(170.0, 1.7, 1.0)])
    broken["rounds"][0].pop(0)  # a round without its official run
    assert no_ratio in perf.side_by_side_table(broken) and "×" not in perf.side_by_side_table(broken)


def test_local_converge_note_gives_its_date_and_no_ratio():
    lc = {
        "setting": {"seeds": 100},
        "one_process": {"seconds": 2.5, "stages": {"train_W": 1.0, "svm_W": 0.2, "train_KQ": 1.1, "total": 2.5}},
        "two_processes": {"seconds": 1.5, "stages": {}},
        "results": {k: {"not_opt": 3, "median_corr_fro": 0.9, "median_corr_nuc": 0.8} for k in ("W", "KQ")},
        "nuclear_batched_vs_clarabel_max_relerr": 1e-6,
        "official_reference": {"seconds": 435.2, "measured_utc": "2026-11-29", "machine": "2 vCPU AMD EPYC"},
        "measured": {"utc": "2026-12-01 23:10:00", "load_before": [0.4, 0.4, 0.4]},
    }
    fig, note = perf.local_converge_figure({"quick": False, "local_converge": lc})
    assert "Measured 2026-12-01 23:10:00 UTC" in note and "435 s on 2026-11-29 (2 vCPU AMD EPYC)" in note
    assert "×" not in note and "not compared" in note
    assert not fig.axes[0].texts  # drawn


@pytest.mark.skipif(not (RESULTS / "side_by_side.json").exists(), reason="no side-by-side run committed")
def test_the_committed_side_by_side_run_is_shown_with_its_ratios():
    sbs = json.loads((RESULTS / "side_by_side.json").read_text())
    table = perf.side_by_side_table(sbs)
    assert sbs["started_utc"] in table and "×" in table
    assert len(perf.side_by_side_rounds(sbs)) == len(sbs["rounds"]) >= 2
