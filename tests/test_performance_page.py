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
