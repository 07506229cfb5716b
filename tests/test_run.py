"""``python -m attnlib run``: refusals before any kernel starts, bad values, failures, summaries,
exit codes that tell a failed claim from an error, ``--list-parameters``, provenance, progress and
``--html``.

Uses the tiny notebooks of ``tests/fixtures/`` (``outcomes.ipynb`` ends each way a run can end);
every test that runs one checks that the source notebook is left byte-identical.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest
from papermill.translators import PythonTranslator

from attnlib.book import page as book_page
from attnlib.book import run

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
PARAMETERS = FIXTURES / "parameters.ipynb"
FAILING = FIXTURES / "failing.ipynb"
OUTCOMES = FIXTURES / "outcomes.ipynb"
CHAPTERS = sorted((ROOT / "notebooks").glob("*.ipynb"))


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
def test_a_run_writes_the_executed_notebook_and_its_summary(source, tmp_path, capsys, monkeypatch):
    """Without -o, into _build/runs/NOTEBOOK/ (here redirected to a temporary folder)."""
    monkeypatch.setattr(run, "DEFAULT_RUNS_DIR", tmp_path / "runs")
    before = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    code = run.main([str(source.path), "-p", "steps", "7", "-p", "label", "b"])
    assert code == 0
    out = tmp_path / "runs" / "parameters" / "steps=7_label=b.ipynb"
    err = capsys.readouterr().err
    # A line per code cell: the parameters cell, papermill's injected one, validation, checks.
    assert [line.split(" in ")[0].strip() for line in err.splitlines() if line.startswith("  cell ")] == [
        f"cell {i}/4 done" for i in range(1, 5)
    ]
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["status"] == "ok" and summary["error"] is None
    prov = summary.pop("provenance")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert prov["commit"] == (commit or None) and prov["python"] == platform.python_version()
    assert prov["attnlib"] == __import__("attnlib").__version__
    started = datetime.datetime.fromisoformat(prov["started_utc"].replace("Z", "+00:00"))
    assert prov["started_utc"].endswith("Z") and before <= started <= datetime.datetime.now(datetime.UTC)
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


def test_a_bad_value_is_refused_before_a_kernel_starts(source, tmp_path):
    """Through the real command line: the notebook's own spec refuses -3, exit code 3, one clear line."""
    out = tmp_path / "bad.ipynb"
    probe = (
        "import sys; sys.modules['papermill'] = None\n"  # a kernel start would need papermill: make it fail
        "from attnlib.book.run import main; sys.exit(main(sys.argv[1:]))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", probe, str(source.path), "-p", "steps", "-3", "-o", str(out)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert completed.returncode == run.EXIT_INVALID_PARAMETER == 3, completed.stderr
    assert "parameter 'steps' must be an int >= 1, got -3" in completed.stderr
    assert "nothing was run" in completed.stderr and "Traceback" not in completed.stderr
    assert not out.exists() and not out.with_suffix(".json").exists()
    source.unchanged()


def test_a_bound_computed_from_another_parameter_is_the_notebooks():
    """Chapter 1 declares plot_steps <= steps: lowering steps alone makes the default plot_steps invalid."""
    chapter = ROOT / "notebooks" / "01_global_convergence.ipynb"
    if not chapter.exists():
        pytest.skip("chapter 1 was renamed")
    run.check_values(chapter, {"steps": 1000})
    with pytest.raises(run.ParameterError, match="parameter 'plot_steps' must be an int >= 10 and <= 100, got 200"):
        run.check_values(chapter, {"steps": 100})


@pytest.mark.notebook
def test_an_invalid_value_only_the_notebook_can_see_exits_3(tmp_path, capsys):
    """outcomes.ipynb bounds steps by a number it computes: the kernel runs, and refuses it."""
    source = copy_fixture(OUTCOMES, tmp_path)
    out = tmp_path / "out" / "invalid.ipynb"
    assert run.main([str(source.path), "-q", "-p", "steps", "5", "-o", str(out)]) == run.EXIT_INVALID_PARAMETER
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["status"] == "invalid parameter"
    assert summary["error"] == "ValueError: parameter 'steps' must be <= 3, got 5"
    source.unchanged()


@pytest.mark.notebook
@pytest.mark.parametrize(
    "outcome, status, code, message",
    [
        ("claim", "claims failed", 1, "claims failed: claim (1 of 2 checks pass, 1 failed)"),
        ("crash", "error", 4, "RuntimeError: this fixture crashes on purpose"),
    ],
)
def test_a_failed_claim_and_an_error_exit_differently(tmp_path, capsys, outcome, status, code, message):
    source = copy_fixture(OUTCOMES, tmp_path)
    out = tmp_path / "out" / f"{outcome}.ipynb"
    assert run.main([str(source.path), "-q", "-p", "outcome", outcome, "-o", str(out)]) == code
    assert message in capsys.readouterr().err
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["status"] == status
    assert [c["status"] for c in summary["checks"]] == ["passed", "failed" if outcome == "claim" else "passed"]
    claim = summary["checks"][1]  # the numeric bound beside the criterion text
    assert (claim["criterion"], claim["sense"], claim["bound"]) == ("<= 0.5", "<=", 0.5)
    assert out.exists(), "the executed notebook is kept either way"
    source.unchanged()


@pytest.mark.notebook
def test_a_cell_past_the_timeout_exits_5(tmp_path, capsys):
    source = copy_fixture(OUTCOMES, tmp_path)
    out = tmp_path / "out" / "sleep.ipynb"
    code = run.main([str(source.path), "-q", "-p", "outcome", "sleep", "--timeout", "2", "-o", str(out)])
    assert code == run.EXIT_TIMEOUT == 5
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["status"] == "timeout" and summary["error"].startswith("CellTimeoutError")
    assert summary["duration_s"] < 50, "the sleeping cell (60 s) was stopped"
    source.unchanged()


def test_classify_tells_a_failed_claim_from_an_error():
    failed, passed = [{"status": "failed"}], [{"status": "passed"}]
    assert run.classify(None, passed) == "ok"
    assert run.classify(None, failed) == "claims failed"  # a notebook that forgot assert_all
    assert run.classify(AssertionError("failed checks: ..."), failed) == "claims failed"
    assert run.classify(AssertionError("an assert in the notebook's code"), passed) == "error"
    assert run.classify(ValueError("parameter 'n' must be an int >= 1, got 0"), []) == "invalid parameter"
    assert run.classify(ValueError("math domain error"), []) == "error"
    assert run.classify(TimeoutError("cell"), failed) == "timeout"
    assert set(run.EXIT_CODES) == set(run.STATUSES) and len(set(run.EXIT_CODES.values())) == len(run.STATUSES)
    assert run.EXIT_USAGE not in run.EXIT_CODES.values()


def test_a_parameter_given_twice_is_refused(source, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "papermill", None)
    out = tmp_path / "out.ipynb"
    assert run.main([str(source.path), "-p", "steps", "1", "-p", "steps", "2", "-o", str(out)]) == run.EXIT_USAGE
    assert "parameter 'steps' is given twice" in capsys.readouterr().err
    assert not out.exists()
    source.unchanged()


def test_outside_the_venv_the_message_says_which_python(source, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "papermill", None)  # what a Python without Jupyter sees
    assert run.main([str(source.path), "-p", "steps", "2", "-o", str(tmp_path / "out.ipynb")]) == run.EXIT_USAGE
    err = capsys.readouterr().err
    assert "papermill (Jupyter) is not importable" in err
    assert ".venv/bin/python -m attnlib run" in err and "make setup" in err
    assert "ModuleNotFoundError" not in err and "Traceback" not in err


def test_the_default_output_is_under_build_runs(source):
    assert run.DEFAULT_RUNS_DIR == ROOT / "_build" / "runs"
    assert run.default_output(source.path, {"steps": 7}) == ROOT / "_build" / "runs" / "parameters" / "steps=7.ipynb"
    assert run.default_output(source.path, {}).name == "defaults.ipynb"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_list_parameters_reads_every_chapters_specs(chapter):
    """Every parameter of every chapter has its default, type and allowed values, read without running."""
    defaults = run.notebook_parameters(chapter)
    infos = run.parameter_specs(chapter)
    assert list(infos) == list(defaults)
    for info in infos.values():
        assert info.specs, f"{chapter.name}: {info.name} has no spec the notebook validates"
        assert not info.unread, f"{chapter.name}: {info.name}: specs not read: {info.unread}"
        for spec in info.specs:
            spec(info.name, info.default)  # the defaults pass the specs, as they do in the notebook
    run.check_values(chapter, {})
    text = run.format_parameters(chapter)
    assert all(f"  {name} " in text for name in defaults)


def test_list_parameters_command(source, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "papermill", None)  # nothing is executed
    assert run.main([str(source.path), "--list-parameters"]) == 0
    text = capsys.readouterr().out
    assert "steps  3        int    an int >= 1" in text and "label  'a'      str    a str" in text
    assert run.main([str(source.path), "--list-parameters", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(p["name"], p["default"], p["type"], p["allowed"]) for p in listed] == [
        ("steps", 3, "int", "an int >= 1"),
        ("scale", 0.5, "float", "a float >= 0"),
        ("label", "a", "str", "a str"),
    ]
    source.unchanged()


def test_list_parameters_shows_computed_bounds_and_the_notebooks_own_tests():
    infos = run.parameter_specs(OUTCOMES)
    assert infos["outcome"].kind == "choice"
    assert infos["outcome"].allowed == "one of ['pass', 'claim', 'crash', 'sleep']"
    assert infos["steps"].constraints == ["refused if steps > bound"]
    assert infos["steps"].description == "at most a bound that the notebook computes"


@pytest.mark.notebook
def test_a_failing_notebook_keeps_the_checks_recorded_before_the_failure(tmp_path, capsys):
    source = copy_fixture(FAILING, tmp_path)
    out = tmp_path / "out" / "failing.ipynb"
    code = run.main([str(source.path), "-q", "-o", str(out)])
    assert code == run.EXIT_ERROR
    assert "RuntimeError: this fixture fails on purpose" in capsys.readouterr().err
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["status"] == "error"
    assert summary["error"] == "RuntimeError: this fixture fails on purpose"
    assert [check["name"] for check in summary["checks"]] == ["before_failure"]
    assert out.exists(), "the executed notebook (with the traceback) is kept for debugging"
    source.unchanged()


def test_help_and_import_without_jupyter():
    completed = subprocess.run(
        [sys.executable, "-m", "attnlib", "run", "--help"], capture_output=True, text=True, check=False
    )
    assert completed.returncode == 0 and "-p NAME VALUE" in completed.stdout
    assert "1    claims failed" in completed.stdout and "4    error" in completed.stdout, "exit codes documented"
    probe = (
        "import sys, attnlib, attnlib.book.run, attnlib.book.build; assert 'papermill' not in sys.modules; print('ok')"
    )
    completed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False)
    assert completed.stdout.strip() == "ok", completed.stderr


@pytest.mark.notebook
def test_quiet_and_html_render_the_run_as_a_book_page(tmp_path, capsys):
    """--html: the executed notebook as a page of the book, the run's glued number in the prose."""
    source = copy_fixture(OUTCOMES, tmp_path)
    out = tmp_path / "out" / "page.ipynb"
    assert book_page.run_main([str(source.path), "--quiet", "--html", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "cell 1/" not in err, "--quiet prints no progress lines"
    page = tmp_path / "out" / "page_html" / "_build" / "html" / "notebooks" / "page.html"
    assert f"page: {page}" in err
    html = page.read_text(encoding="utf-8")
    text = " ".join(re.sub(r"<[^>]+>", " ", html).split())
    assert "{glue" not in html and "measured 1.000 on this run" in text
    assert "mathjax" in html.lower() and "norm" in html  # the book's MathJax configuration, macros included
    source.unchanged()


# --- make lab: working copies in _build/lab, never the committed notebooks ---------------------


def _lab_sources(tmp_path) -> tuple[Path, Path, dict]:
    sources = tmp_path / "notebooks"
    sources.mkdir()
    for fixture in (PARAMETERS, OUTCOMES):
        shutil.copyfile(fixture, sources / fixture.name)
    return sources, tmp_path / "_build" / "lab", {p: p.read_bytes() for p in sources.iterdir()}


def test_lab_working_copies_define_the_macros_and_keep_the_readers_edits(tmp_path):
    from attnlib.book import lab

    sources, lab_dir, originals = _lab_sources(tmp_path)
    assert sorted(lab.prepare_working_copies(sources, lab_dir)) == [
        "copied notebooks/outcomes.ipynb",
        "copied notebooks/parameters.ipynb",
    ]
    copy = json.loads((lab_dir / "notebooks" / "parameters.ipynb").read_text())
    first = "".join(copy["cells"][0]["source"])
    for name in lab.book_macros():  # every macro of _config.yml, as \newcommand
        assert f"\\newcommand{{\\{name}}}" in first
    assert "\\newcommand{\\norm}[1]{\\left\\lVert #1 \\right\\rVert}" in first
    assert copy["cells"][1:] == json.loads(PARAMETERS.read_text())["cells"]
    assert lab.prepare_working_copies(sources, lab_dir) == []  # nothing changed: nothing written

    # The committed notebook changes; the reader ran one copy (outputs only) and edited the other.
    for path in sources.iterdir():
        notebook = json.loads(path.read_text())
        notebook["cells"][0]["source"] = "# changed upstream"
        path.write_text(json.dumps(notebook))
    ran = lab_dir / "notebooks" / "outcomes.ipynb"
    notebook = json.loads(ran.read_text())
    notebook["cells"][2]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "ran\n"}]
    ran.write_text(json.dumps(notebook))
    edited = lab_dir / "notebooks" / "parameters.ipynb"
    notebook = json.loads(edited.read_text())
    notebook["cells"][2]["source"] = "steps = 99  # the reader's edit"
    edited.write_text(json.dumps(notebook))
    messages = lab.prepare_working_copies(sources, lab_dir)
    assert "refreshed notebooks/outcomes.ipynb" in messages
    assert any(m.startswith("kept your edited notebooks/parameters.ipynb") for m in messages)
    assert "the reader's edit" in edited.read_text()
    assert "changed upstream" in ran.read_text()


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.notebook
def test_make_lab_serves_and_saves_only_the_working_copies(tmp_path):
    """A real JupyterLab started with make lab's command: its root is _build/lab, a save lands there,
    and the committed notebooks cannot be reached (so neither a save nor an autosave can write them)."""
    import secrets
    import time
    import urllib.error
    import urllib.request

    from attnlib.book import lab

    sources, lab_dir, originals = _lab_sources(tmp_path)
    lab.prepare_working_copies(sources, lab_dir)
    port, token = _free_port(), secrets.token_hex(16)
    home = tmp_path / "home"
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_RUNTIME_DIR": str(home / "runtime")}
    extra = [
        "--no-browser",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--LabApp.user_settings_dir={home / 'settings'}",
        f"--LabApp.workspaces_dir={home / 'workspaces'}",
    ]
    command = lab.lab_command(lab_dir, port, extra)
    assert f"--ServerApp.root_dir={lab_dir.resolve()}" in command and "--ServerApp.ip=127.0.0.1" in command
    base = f"http://127.0.0.1:{port}/api/contents"

    def call(path: str, method: str = "GET", body: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{base}/{path}?token={token}", data=data, method=method)
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"null")

    with (tmp_path / "lab.log").open("w") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                listing = call("")
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not start:\n{(tmp_path / 'lab.log').read_text()[-2000:]}")
                time.sleep(0.5)
        assert [item["name"] for item in listing["content"] if not item["name"].startswith(".")] == ["notebooks"]
        opened = call("notebooks/parameters.ipynb")
        opened["content"]["cells"][-1]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "ran\n"}]
        body = {"type": "notebook", "format": "json", "content": opened["content"]}
        call("notebooks/parameters.ipynb", "PUT", body)
        saved = json.loads((lab_dir / "notebooks" / "parameters.ipynb").read_text())
        assert "".join(saved["cells"][-1]["outputs"][0]["text"]) == "ran\n", "the save went to the working copy"
        with pytest.raises(urllib.error.HTTPError) as refused:  # outside the root: refused by the server
            call("../../notebooks/parameters.ipynb", "PUT", body)
        assert refused.value.code in (400, 403, 404)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    assert {p: p.read_bytes() for p in sources.iterdir()} == originals, "the committed notebooks were written"


@pytest.mark.notebook
@pytest.mark.parametrize("asked", [None, "live"])
def test_raw_papermill_gives_the_static_explorers_unless_asked(tmp_path, asked):
    """A plain `papermill in out` has no frontend: the precomputed explorer, unless ATTNLIB_EXPLORERS=live."""
    source = copy_fixture(FIXTURES / "explorer.ipynb", tmp_path / "source")
    out = tmp_path / "raw.ipynb"
    env = {k: v for k, v in os.environ.items() if k != "ATTNLIB_EXPLORERS"}
    if asked:
        env["ATTNLIB_EXPLORERS"] = asked
    papermill = [sys.executable, "-m", "papermill", "--no-progress-bar", "-p", "steps", "20"]
    completed = subprocess.run([*papermill, str(source.path), str(out)], capture_output=True, text=True, env=env)
    assert completed.returncode == 0, completed.stderr
    mimes = {
        mime
        for cell in json.loads(out.read_text())["cells"]
        for o in cell.get("outputs", [])
        for mime in o.get("data", {})
    }
    widget = "application/vnd.jupyter.widget-view+json"
    assert (widget in mimes) == (asked == "live"), mimes
    source.unchanged()


def test_a_kernel_draws_figures_into_the_notebook_whatever_the_callers_backend(tmp_path, monkeypatch):
    """The test process runs with MPLBACKEND=Agg; a kernel that inherited it would draw no figure
    (and a book page would lose its figures and their labels)."""
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = {
        "cells": [
            {
                "cell_type": "code",
                "metadata": {},
                "source": ["import matplotlib.pyplot as plt\n", "plt.plot([0, 1])"],
                "outputs": [],
                "execution_count": None,
            }  # fmt: skip
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    source = tmp_path / "plot.ipynb"
    source.write_text(json.dumps(notebook))
    run.execute_notebook(source, tmp_path / "out" / "plot.ipynb")
    outputs = json.loads((tmp_path / "out" / "plot.ipynb").read_text())["cells"][0]["outputs"]
    assert any("image/png" in output.get("data", {}) for output in outputs)
    assert os.environ["MPLBACKEND"] == "Agg", "the caller's environment is restored"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_papermill_reads_every_parameter_the_book_does(chapter):
    """papermill's own reading of the parameters cell (a regular expression, not a parser) names the same
    parameters as :func:`run.notebook_parameters`, except a value it cannot read whatever the comment (a string
    holding ``=``, as ``--grid``'s specs do). A comment it cannot read (one holding ``=``) makes it log "Unable to
    parse line" on every run, and "Passed unknown parameter" for the parameter it lost, though it still injects
    the value."""

    def papermill_names(source: str) -> list[str]:
        return [p.name for p in PythonTranslator.inspect(nbformat.v4.new_code_cell(source))]

    cell = next(c for c in nbformat.read(chapter, as_version=4).cells if "parameters" in c.metadata.get("tags", []))
    lines = [line for line in cell.source.splitlines() if line.strip()]
    uncommented = [line.split("  #")[0] for line in lines]
    readable = papermill_names("\n".join(uncommented))
    assert papermill_names(cell.source) == readable, "a comment in the parameters cell hides a parameter from papermill"
    unreadable = set(run.notebook_parameters(chapter)) - set(readable)
    assert all("=" in run.notebook_parameters(chapter)[name].__repr__() for name in unreadable), unreadable


def test_validation_reads_the_notebook_as_it_is_now(tmp_path):
    """A sweep parses a notebook's validation once per content: a changed spec is the one applied, the
    unchanged file is not parsed again."""
    notebook = json.loads(PARAMETERS.read_text())
    path = tmp_path / "parameters.ipynb"
    path.write_text(json.dumps(notebook))
    run.check_values(path, {"steps": 2})
    assert run._validation_nodes(path) is run._validation_nodes(path)  # parsed once
    for cell in notebook["cells"]:
        source = "".join(cell["source"])
        cell["source"] = source.replace("integer(minimum=1", "integer(minimum=3")
    assert "minimum=3" in json.dumps(notebook), "the fixture's spec moved: update this test"
    path.write_text(json.dumps(notebook))
    with pytest.raises(run.ParameterError, match="steps"):
        run.check_values(path, {"steps": 2})
