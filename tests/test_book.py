"""The book: chapter notebooks executed through the book's own path, their checks, the build.

``executed_book`` (conftest) runs the incremental execution step of ``make book``: every notebook
of ``_toc.yml`` is executed once per test run at most, and not at all if ``make book`` just did.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from attnlib.book import build as book
from attnlib.optim import PROCESSES_ENV

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
CHAPTERS = book.toc_notebooks(ROOT)


def test_the_toc_lists_chapter_notebooks():
    assert CHAPTERS, "_toc.yml lists no notebook"
    assert all(path.parts[0] == "notebooks" for path in CHAPTERS)


@pytest.mark.parametrize("notebook", sorted(ROOT.glob("notebooks/*.ipynb")), ids=lambda path: path.stem)
def test_committed_notebooks_have_no_outputs_and_the_python3_kernel(notebook):
    content = json.loads(notebook.read_text(encoding="utf-8"))
    with_outputs = [i for i, cell in enumerate(content["cells"]) if cell.get("outputs")]
    assert not with_outputs, f"cells {with_outputs} have outputs: clear them before committing"
    assert content["metadata"].get("kernelspec", {}).get("name") == "python3"


@pytest.mark.notebook
@pytest.mark.parametrize("notebook", CHAPTERS, ids=lambda path: path.stem)
def test_chapter_executes_and_every_check_passes(executed_book, notebook):
    result = executed_book[notebook]
    failed_copy = ROOT / book.FAILED_DIR / notebook.name
    assert result.status in ("ok", "up to date"), f"{notebook} failed: {result.error} (executed copy: {failed_copy})"
    summary = json.loads((ROOT / book.STAGE_DIR / notebook).with_suffix(".json").read_text(encoding="utf-8"))
    # a check marked known_failure fails by design and says why (attnlib.Checks); it does not fail its page
    failed = [
        f"{c['name']} = {c['value']!r} ({c['criterion']})"
        for c in summary["checks"]
        if c["passed"] is False and not c.get("known_failure")
    ]
    assert not failed, f"{notebook}: failed checks: {failed}"
    assert summary["checks"], f"{notebook} recorded no check (use attnlib.Checks)"
    # At its default parameters a chapter is inside its theorems' hypotheses: nothing is "not applicable".
    not_applicable = [f"{c['name']}: {c['reason']}" for c in summary["checks"] if c["status"] == "not applicable"]
    assert not not_applicable, f"{notebook}: not applicable at the defaults: {not_applicable}"


@pytest.mark.notebook
def test_a_second_execution_step_executes_nothing(executed_book):
    assert all(result.status == "up to date" for result in book.execute_all(ROOT))


def test_execution_digest_follows_the_notebook_attnlib_and_the_pins(tmp_path):
    (tmp_path / "attnlib").mkdir()
    (tmp_path / "attnlib" / "core.py").write_text("x = 1\n")
    (tmp_path / "requirements.txt").write_text("numpy==2\n")
    (tmp_path / "chapter.ipynb").write_text("{}")
    first = book.execution_digest(tmp_path, Path("chapter.ipynb"))
    assert book.execution_digest(tmp_path, Path("chapter.ipynb")) == first
    for path, text in [("attnlib/core.py", "x = 2\n"), ("requirements.txt", "numpy==3\n"), ("chapter.ipynb", "{ }")]:
        (tmp_path / path).write_text(text)
        changed = book.execution_digest(tmp_path, Path("chapter.ipynb"))
        assert changed != first, f"changing {path} must trigger a new execution"
        first = changed


def test_execution_digest_follows_declared_dependencies(tmp_path):
    """A page that sweeps another chapter, or reads committed tables, is re-executed when they change."""

    def notebook(name, depends_on=None):
        meta = {"attnlib": {"depends_on": depends_on}} if depends_on else {}
        (tmp_path / name).write_text(json.dumps({"cells": [], "metadata": meta}))

    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "a.csv").write_text("x\n1\n")
    notebook("swept.ipynb")
    notebook("sweeps.ipynb", ["swept.ipynb", "tables/*.csv"])
    first = book.execution_digest(tmp_path, Path("sweeps.ipynb"))
    assert book.declared_dependencies(tmp_path, Path("sweeps.ipynb")) == [Path("swept.ipynb"), Path("tables/a.csv")]
    for path, text in [("swept.ipynb", '{"cells": [1], "metadata": {}}'), ("tables/a.csv", "x\n2\n")]:
        (tmp_path / path).write_text(text)
        changed = book.execution_digest(tmp_path, Path("sweeps.ipynb"))
        assert changed != first, f"changing {path} must re-execute the page that depends on it"
        first = changed
    notebook("bad.ipynb", "swept.ipynb")
    with pytest.raises(book.BookError, match="depends_on must be a list"):
        book.execution_digest(tmp_path, Path("bad.ipynb"))


def _mini_book(root: Path, chapters: list[str]) -> None:
    (root / "book").mkdir(parents=True, exist_ok=True)
    (root / "book" / "intro.md").write_text("# Intro\n")
    (root / "notebooks").mkdir(exist_ok=True)
    for name in chapters:
        shutil.copyfile(FIXTURES / f"{name}.ipynb", root / "notebooks" / f"{name}.ipynb")
    lines = ["format: jb-book", "root: book/intro", "chapters:"] + [f"  - file: notebooks/{n}" for n in chapters]
    (root / "_toc.yml").write_text("\n".join(lines) + "\n")


@pytest.mark.notebook
def test_a_failed_execution_leaves_nothing_a_later_build_would_take(tmp_path):
    _mini_book(tmp_path, ["parameters", "failing"])
    sources = {path: path.read_bytes() for path in (tmp_path / "notebooks").iterdir()}
    results = {result.notebook.stem: result for result in book.execute_all(tmp_path, jobs=2)}

    assert results["parameters"].status == "ok" and results["parameters"].ok
    assert results["failing"].status == "error"
    assert results["failing"].error == "RuntimeError: this fixture fails on purpose"
    stage = tmp_path / book.STAGE_DIR / "notebooks"
    assert sorted(path.name for path in stage.iterdir()) == ["parameters.ipynb", "parameters.json", "parameters.stamp"]
    failed = tmp_path / book.FAILED_DIR
    assert (failed / "failing.ipynb").exists()
    assert json.loads((failed / "failing.json").read_text())["status"] == "error"
    assert {path: path.read_bytes() for path in (tmp_path / "notebooks").iterdir()} == sources

    # Only the good chapter left: it is up to date, nothing runs.
    _mini_book(tmp_path, ["parameters"])
    (result,) = book.execute_all(tmp_path)
    assert result.status == "up to date"


def test_claims_table_lists_every_check(tmp_path):
    _mini_book(tmp_path, ["parameters"])
    staged = tmp_path / book.STAGE_DIR / "notebooks"
    staged.mkdir(parents=True)
    checks = [
        {"name": "final_cosine", "value": 0.99912345, "criterion": ">= 0.999", "passed": True, "description": ""},
        {"name": "mass", "value": 1, "criterion": "== 1", "passed": False, "description": "softmax mass $\\to 1$"},
        {
            "name": "tied",
            "value": 0.5,
            "criterion": "<= 0.1",
            "status": "not applicable",
            "passed": None,
            "description": "a tie",
            "reason": "two SVMs tie",
        },
    ]
    summary = {"notebook": "x", "parameters": {}, "status": "ok", "error": None, "duration_s": 1.0, "checks": checks}
    (staged / "parameters.json").write_text(json.dumps(summary))
    table = book.claims_table(tmp_path)
    assert table.startswith("**1 of 3 checks pass, 1 not applicable, 1 failed**")
    assert ":::{dropdown} " in table  # each chapter folds
    assert "{doc}`/notebooks/parameters`: 1 of 3 checks pass, 1 not applicable, 1 failed." in table
    assert "not applicable (two SVMs tie)" in table
    # no description: the name; a value this close to 1 keeps its distance from 1 visible
    assert "`final_cosine`" in table and "`0.99912345`" in table
    assert "\\>\\= 0\\.999" in table  # criteria are shown as typed, not as markdown (">" would be a quote)
    assert "softmax mass $\\to 1$" in table and "**FAIL**" in table  # descriptions are prose, math allowed


def test_claims_table_shows_controls_margins_and_certificates(tmp_path):
    from attnlib.book.checks import Checks

    _mini_book(tmp_path, ["parameters"])
    staged = tmp_path / book.STAGE_DIR / "notebooks"
    staged.mkdir(parents=True)
    checks = Checks(display=False)
    checks.at_least("corr", 0.99882, 0.99277, why="W follows W_mm(α̂)", controls={"W_mm(opt) as reference": 0.76})
    checks.at_least("share", 0.95, 0.95, why="ok share", controls={"a quarter of the horizon": 0.5}, resolution=0.3)
    checks.at_most("weak", 0.1, 1.0, why="weak", controls={"the other SVM": 0.5})
    checks.certificate("ray_bound", 2.94e-8, 8.16e-4, why="proved for any point below the ray")
    records = [dataclasses.asdict(c) for c in checks.records]
    summary = {"notebook": "x", "parameters": {}, "status": "ok", "error": None, "duration_s": 1.0, "checks": records}
    (staged / "parameters.json").write_text(json.dumps(summary))
    table = book.claims_table(tmp_path)
    assert "2 of 3 checks pass, 1 failed; 1 proved bound (certificate) holds" in table
    assert "`corr`: W follows W_mm(α̂)" in table and "`0.9988`" in table  # precision from the distance to the bound
    assert "W\\_mm\\(opt\\) as reference: `0.76` (fails, as it must)" in table
    assert "**at the bound**" in table and "detects a rotation of 0.3°" in table
    assert "**passes: the check cannot tell it**" in table and "(a control passed)" in table
    assert "Proved on the page" in table and "`ray_bound`: `2.9e-08`" in table
    assert table.count("* - `") == 3  # certificates are not rows of the checks' table


def test_the_site_is_built_and_self_contained(built_site):
    assert (built_site / "index.html").exists()
    for notebook in CHAPTERS:
        assert (built_site / notebook.with_suffix(".html")).exists()
    for asset in ["mathjax/tex-mml-chtml.js", "ipywidgets/require.js", "ipywidgets/embed-amd.js", "widgets-offline.js"]:
        assert (built_site / "_static" / asset).exists(), asset
    remote = re.compile(r"""<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)=["'](?:https?:)?//""", re.IGNORECASE)
    for page in built_site.rglob("*.html"):
        found = remote.findall(page.read_text(encoding="utf-8"))
        assert not found, f"{page.relative_to(built_site)} loads remote resources: {found[:3]}"


def test_the_claims_table_is_on_the_front_page(built_site, executed_book):
    intro = (built_site / "book" / "intro.html").read_text(encoding="utf-8")
    tables = re.findall(r"<table[^>]*claims-table.*?</table>", intro, re.DOTALL)
    assert tables, "no claims table in book/intro.html"
    expected = sum(result.checks_total for result in executed_book.values())
    chapters_with_checks = sum(1 for result in executed_book.values() if result.checks_total)
    assert len(tables) == chapters_with_checks  # one table per chapter
    assert sum(table.count("<tr") for table in tables) == expected + len(tables)  # a row per check, plus headers


@pytest.mark.parametrize("notebook", CHAPTERS, ids=lambda path: path.stem)
def test_notebook_text_has_no_control_characters(notebook):
    """A TeX command written into a Python string without a raw prefix ("\\alpha" as "\\a") becomes a
    control character, which MathJax then reports as a math input error on the page."""
    content = json.loads((ROOT / notebook).read_text(encoding="utf-8"))
    texts = [
        "".join(cell["source"]) + json.dumps(cell.get("metadata", {}), ensure_ascii=False) for cell in content["cells"]
    ]
    bad = [i for i, text in enumerate(texts) if any(ch < " " and ch not in "\n\t" for ch in text) or "\\u00" in text]
    assert not bad, f"{notebook}: control characters in cells {bad}"


def test_cores_per_notebook_shares_the_cores_and_keeps_a_users_choice(monkeypatch):
    monkeypatch.delenv(PROCESSES_ENV, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    with book.cores_per_notebook(2) as share:
        assert share == 2 and os.environ[PROCESSES_ENV] == "2"
    assert PROCESSES_ENV not in os.environ  # restored
    with book.cores_per_notebook(8) as share:
        assert share == 1
    monkeypatch.setenv(PROCESSES_ENV, "3")
    with book.cores_per_notebook(1) as share:
        assert share == 3 and os.environ[PROCESSES_ENV] == "3"
