"""``python -m attnlib run``: refusals before any kernel starts, bad values, failures, summaries.

Uses the tiny notebooks of ``tests/fixtures/``; every test checks that the source notebook is left
byte-identical.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from attnlib.book import run

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
PARAMETERS = FIXTURES / "parameters.ipynb"
FAILING = FIXTURES / "failing.ipynb"


@dataclass
class Source:
    """A copy of a fixture notebook that a test runs, and its bytes before the run."""

    path: Path
    original: bytes

    def unchanged(self) -> None:
        assert self.path.read_bytes() == self.original, "the source notebook was modified"


def copy_fixture(fixture: Path, folder: Path) -> Source:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / fixture.name
    shutil.copyfile(fixture, path)
    return Source(path, path.read_bytes())


@pytest.fixture
def source(tmp_path) -> Source:
    return copy_fixture(PARAMETERS, tmp_path / "source")


def test_parse_value_reads_literals_else_strings():
    assert run.parse_value("3") == 3
    assert run.parse_value("-0.5") == -0.5
    assert run.parse_value("True") is True
    assert run.parse_value("[1, 2]") == [1, 2]
    assert run.parse_value("'quoted'") == "quoted"
    assert run.parse_value("logistic") == "logistic"
    assert run.parse_value("1e-3") == 1e-3


def test_notebook_parameters_reads_the_tagged_cell():
    assert run.notebook_parameters(PARAMETERS) == {"steps": 3, "scale": 0.5, "label": "a"}


def test_unknown_parameter_is_refused_before_a_kernel_starts(source, tmp_path, capsys, monkeypatch):
    # If a kernel started, papermill would be imported and called: make that an error.
    monkeypatch.setitem(sys.modules, "papermill", None)
    out = tmp_path / "out.ipynb"
    code = run.main([str(source.path), "-p", "stepz", "5", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == run.EXIT_USAGE
    assert "unknown parameter 'stepz'" in err
    assert "valid names: steps, scale, label" in err
    assert not out.exists() and not out.with_suffix(".json").exists()
    source.unchanged()


@pytest.mark.parametrize("spelling", ["same path", "another path to the same file"])
def test_output_equal_to_input_is_refused(source, capsys, monkeypatch, spelling):
    monkeypatch.chdir(source.path.parent)
    output = str(source.path) if spelling == "same path" else "../source/./parameters.ipynb"
    code = run.main([str(source.path), "-p", "steps", "4", "-o", output])
    assert code == run.EXIT_USAGE
    assert "refusing to overwrite the input notebook" in capsys.readouterr().err
    source.unchanged()


def test_output_into_the_committed_notebooks_is_refused(source, capsys):
    target = ROOT / "notebooks" / "not_a_chapter_output.ipynb"
    code = run.main([str(source.path), "-o", str(target)])
    assert code == run.EXIT_USAGE
    assert "committed notebooks" in capsys.readouterr().err
    assert not target.exists()
    source.unchanged()


@pytest.mark.notebook
def test_a_run_writes_the_executed_notebook_and_its_summary(source, tmp_path):
    out = tmp_path / "runs" / "steps7.ipynb"
    code = run.main([str(source.path), "-p", "steps", "7", "-p", "label", "b", "-o", str(out)])
    assert code == 0
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["status"] == "ok" and summary["error"] is None
    assert summary["parameters"] == {"steps": 7, "scale": 0.5, "label": "b"}  # defaults merged with overrides
    assert summary["duration_s"] > 0
    expected = {
        "name": "steps_seen",
        "value": 7,
        "criterion": ">= 1",
        "status": "passed",
        "passed": True,
        "description": "the steps parameter arrived",
        "reason": "",
        "sense": ">=",  # the numeric bound beside the criterion text
        "bound": 1.0,
    }
    assert [{k: c.get(k) for k in expected} for c in summary["checks"]] == [expected]
    executed = json.loads(out.read_text())
    assert executed["metadata"]["papermill"]["parameters"] == {"steps": 7, "label": "b"}
    assert not list(out.parent.glob(".*tmp*")), "a temporary file was left behind"
    source.unchanged()


@pytest.mark.notebook
def test_a_bad_value_fails_with_the_validation_message(source, tmp_path):
    """Through the real command line: exit code 1 and one clear line, not a traceback."""
    out = tmp_path / "bad.ipynb"
    completed = subprocess.run(
        [sys.executable, "-m", "attnlib", "run", str(source.path), "-p", "steps", "-3", "-o", str(out)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert completed.returncode == run.EXIT_FAILED, completed.stderr
    assert "ValueError: parameter 'steps' must be an int >= 1, got -3" in completed.stderr
    assert "Traceback" not in completed.stderr
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["status"] == "failed"
    assert summary["error"] == "ValueError: parameter 'steps' must be an int >= 1, got -3"
    assert summary["parameters"]["steps"] == -3
    assert summary["checks"] == []
    source.unchanged()


@pytest.mark.notebook
def test_a_failing_notebook_keeps_the_checks_recorded_before_the_failure(tmp_path, capsys):
    source = copy_fixture(FAILING, tmp_path)
    out = tmp_path / "out" / "failing.ipynb"
    code = run.main([str(source.path), "-o", str(out)])
    assert code == run.EXIT_FAILED
    assert "RuntimeError: this fixture fails on purpose" in capsys.readouterr().err
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["status"] == "failed"
    assert summary["error"] == "RuntimeError: this fixture fails on purpose"
    assert [check["name"] for check in summary["checks"]] == ["before_failure"]
    assert out.exists(), "the executed notebook (with the traceback) is kept for debugging"
    source.unchanged()


def test_help_and_import_without_jupyter():
    completed = subprocess.run(
        [sys.executable, "-m", "attnlib", "run", "--help"], capture_output=True, text=True, check=False
    )
    assert completed.returncode == 0 and "-p NAME VALUE" in completed.stdout
    probe = (
        "import sys, attnlib, attnlib.book.run, attnlib.book.build; assert 'papermill' not in sys.modules; print('ok')"
    )
    completed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False)
    assert completed.stdout.strip() == "ok", completed.stderr
