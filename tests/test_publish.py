"""Publishing the book: the GitHub Pages workflow, ``CITATION.cff``, and the PDF of ``make pdf``.

- The workflow (``.github/workflows/book.yml``) is parsed and its deploy condition *evaluated*, not
  string-matched: it builds with the README's ``make book`` on pushes to main and on pull requests,
  uploads ``_build/html``, and deploys only on a push to main. Wrong conditions are controls.
- ``CITATION.cff`` is validated against the CFF 1.2.0 JSON schema, vendored in
  ``tests/fixtures/cff-schema-1.2.0.json``: it is the file ``cffconvert`` 2.0.0 ships
  (``cffconvert/schemas/1.2.0/schema.json``, $id https://citation-file-format.github.io/1.2.0/schema.json,
  CC-BY-4.0), taken from its wheel because ``cffconvert`` itself requires ``jsonschema<4`` and
  Jupyter needs ``jsonschema`` 4. Broken copies of the file are controls.
- The PDF is built through :func:`attnlib.book.pdf.build_pdf` (the code path of ``make pdf``; after
  ``make pdf`` nothing is printed again) and read with pypdf: its length, every chapter's title on
  the page the table of contents gives, no raw TeX, page numbers, figures, theorem boxes, the claims
  table, and the copy the site links. Without Chromium these tests are skipped, except under
  ``CI=true``, where they fail.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import tomllib
import unicodedata
from pathlib import Path

import bs4
import jsonschema
import pytest
import yaml

from attnlib.book import build as book
from attnlib.book import citation, pdf

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "book.yml"
CFF_SCHEMA = ROOT / "tests" / "fixtures" / "cff-schema-1.2.0.json"
CHROMIUM = os.environ.get("ATTNLIB_CHROMIUM", "/usr/bin/chromium")
PAPERS = {
    "2306.13596": "tarzanagh2023maxmargin",
    "2402.05738": "vasudeva2024fast",
    "2308.16898": "tarzanagh2023transformers",
}


# --- the workflow ---------------------------------------------------------------------------------


def _workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))


def _triggers(workflow: dict) -> dict:
    # YAML 1.1 reads the key `on` as the boolean True.
    return workflow.get("on", workflow.get(True))


def _steps(job: dict, action: str) -> list[dict]:
    return [step for step in job["steps"] if step.get("uses", "").split("@")[0] == action]


def _evaluate(condition: str, event: str, ref: str) -> bool:
    """A GitHub Actions `if:` made of `github.event_name`/`github.ref` comparisons, `&&`, `||`, `!`
    and parentheses, evaluated for one event (anything else in it is refused)."""
    expression = condition.strip().removeprefix("${{").removesuffix("}}")
    tokens = re.findall(r"\s+|github\.event_name|github\.ref|'[^']*'|==|!=|&&|\|\||!|\(|\)", expression)
    if "".join(tokens) != expression:
        raise ValueError(f"cannot evaluate the condition {condition!r}")
    words = {"github.event_name": repr(event), "github.ref": repr(ref), "&&": " and ", "||": " or ", "!": " not "}
    return bool(eval("".join(words.get(token, token) for token in tokens), {"__builtins__": {}}))  # noqa: S307


EVENTS = [  # (event, ref, should deploy)
    ("push", "refs/heads/main", True),
    ("push", "refs/heads/feature", False),
    ("pull_request", "refs/pull/7/merge", False),
    ("pull_request", "refs/heads/main", False),  # a pull request *into* main is still a pull request
    ("workflow_dispatch", "refs/heads/main", False),
]


def _deploys_only_on_push_to_main(condition: str | None) -> bool:
    return condition is not None and all(_evaluate(condition, e, r) == deploy for e, r, deploy in EVENTS)


def test_the_workflow_builds_on_pushes_to_main_and_on_pull_requests():
    triggers = _triggers(_workflow())
    assert triggers["push"]["branches"] == ["main"]
    assert "pull_request" in triggers


def test_the_workflow_builds_with_the_readme_command_on_a_clean_runner():
    build = _workflow()["jobs"]["build"]
    commands = [step["run"] for step in build["steps"] if "run" in step]
    assert any(re.search(r"(^|\s)make book(\s|$)", command) for command in commands), commands
    assert "make book" in (ROOT / "README.md").read_text(encoding="utf-8")  # the README's own command
    # No second recipe: nothing calls Jupyter Book, papermill or the build module directly.
    assert not [c for c in commands if re.search(r"jupyter-book|papermill|attnlib book|sphinx-build", c)], commands
    (python,) = _steps(build, "actions/setup-python")
    assert str(python["with"]["python-version"]) == "3.11" and python["with"]["cache"] == "pip"
    assert set(python["with"]["cache-dependency-path"].split()) == {"requirements.txt", "constraints.txt"}
    (node,) = _steps(build, "actions/setup-node")
    assert node["with"]["cache"] == "npm" and node["with"]["cache-dependency-path"] == "package-lock.json"
    (upload,) = _steps(build, "actions/upload-pages-artifact")
    assert upload["with"]["path"] == "_build/html"
    # the site is uploaded after it is built, and after the PDF that it links is copied into it
    order = [step.get("run", step.get("uses", "")) for step in build["steps"]]
    built = max(i for i, s in enumerate(order) if "make book" in s or "make pdf" in s)
    assert order.index(upload["uses"]) > built
    assert not _steps(build, "actions/deploy-pages"), "the build job must not deploy (it also runs on pull requests)"


def test_only_the_deploy_job_deploys_and_only_on_a_push_to_main():
    jobs = _workflow()["jobs"]
    deployers = [name for name, job in jobs.items() if _steps(job, "actions/deploy-pages")]
    assert deployers == ["deploy"]
    deploy = jobs["deploy"]
    assert deploy["needs"] == "build" or deploy["needs"] == ["build"]
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}
    assert deploy["environment"]["name"] == "github-pages"
    assert "pages" not in jobs["build"].get("permissions", {}) and "pages" not in _workflow().get("permissions", {})
    assert _deploys_only_on_push_to_main(deploy.get("if")), deploy.get("if")
    assert deploy["concurrency"]["cancel-in-progress"] is False  # a deployment is never cut halfway


@pytest.mark.parametrize(
    "condition",
    [
        None,  # no condition: pull requests would deploy
        "github.ref == 'refs/heads/main'",  # a manual run on main would deploy
        "github.event_name == 'push'",  # a push to any branch would deploy
        "github.event_name == 'push' || github.ref == 'refs/heads/main'",
        "github.event_name != 'pull_request'",
    ],
)
def test_control_wrong_deploy_conditions_are_caught(condition):
    assert not _deploys_only_on_push_to_main(condition)


def test_the_condition_evaluator_refuses_what_it_does_not_understand():
    with pytest.raises(ValueError, match="cannot evaluate"):
        _evaluate("always()", "push", "refs/heads/main")


# --- CITATION.cff ---------------------------------------------------------------------------------


def _cff() -> dict:
    return citation.load_citation(ROOT / citation.CITATION_FILE)


def _validate(cff: dict) -> None:
    schema = json.loads(CFF_SCHEMA.read_text(encoding="utf-8"))
    jsonschema.Draft7Validator(schema, format_checker=jsonschema.FormatChecker()).validate(cff)


def test_citation_file_is_valid_cff_1_2_0():
    cff = _cff()
    assert cff["cff-version"] == "1.2.0" and cff["type"] == "software"
    _validate(cff)


@pytest.mark.parametrize(
    "break_it",
    [
        lambda cff: cff.pop("authors"),
        lambda cff: cff.update({"date-released": "yesterday"}),
        lambda cff: cff["references"][0].update({"type": "paper"}),
        lambda cff: cff["references"][1]["authors"][0].update({"family_names": "Vasudeva"}),
    ],
    ids=["no authors", "bad date", "unknown reference type", "misspelt key"],
)
def test_control_broken_citation_files_fail_the_schema(break_it):
    cff = copy.deepcopy(_cff())
    break_it(cff)
    with pytest.raises(jsonschema.ValidationError):
        _validate(cff)


def test_citation_file_names_the_book_and_the_package_version():
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    cff = _cff()
    assert cff["title"] == config["title"]
    assert cff["version"] == project["version"]


def test_citation_references_are_the_papers_of_the_bibliography():
    """Each paper: the arXiv identifier, title and authors (in order) of its entry in references.bib."""
    from pybtex.database import parse_file  # sphinxcontrib-bibtex's BibTeX reader

    bib = parse_file(str(ROOT / "book" / "references.bib")).entries
    references = {ref["identifiers"][0]["value"].removeprefix("arXiv:"): ref for ref in _cff()["references"]}
    assert set(references) == set(PAPERS)
    for arxiv, key in PAPERS.items():
        entry, reference = bib[key], references[arxiv]
        assert entry.fields["eprint"] == arxiv and reference["doi"] == f"10.48550/arXiv.{arxiv}"
        assert reference["title"] == entry.fields["title"]
        expected = [(" ".join(p.last_names), " ".join(p.first_names + p.middle_names)) for p in entry.persons["author"]]
        assert [(a["family-names"], a["given-names"]) for a in reference["authors"]] == expected


def _bibtex_of(markdown: str):
    from pybtex.database import parse_string

    (block,) = re.findall(r"```bibtex\n(.*?)```", markdown, re.DOTALL)
    return parse_string(block, "bibtex").entries


def test_the_citation_section_is_generated_from_the_citation_file(tmp_path):
    cff = _cff()
    entries = _bibtex_of(citation.citation_markdown(ROOT))
    (book_key,) = [key for key, entry in entries.items() if entry.type == "software"]
    assert entries[book_key].fields["title"] == cff["title"]
    assert entries[book_key].fields["version"] == cff["version"]
    assert [str(person) for person in entries[book_key].persons["author"]] == ["{attnlib contributors}"]
    assert sorted(entry.fields.get("eprint") for key, entry in entries.items() if key != book_key) == sorted(PAPERS)
    # generated, not typed: a changed file changes the section
    (tmp_path / "CITATION.cff").write_text(yaml.safe_dump({**cff, "version": "9.9.9"}), encoding="utf-8")
    assert _bibtex_of(citation.citation_markdown(tmp_path))[book_key].fields["version"] == "9.9.9"


def test_the_introduction_shows_the_citation_and_links_the_pdf(built_site):
    intro = (built_site / "book" / "intro.html").read_text(encoding="utf-8")
    # The entry as a reader sees it: the highlighted code block splits it into spans in the HTML.
    text = bs4.BeautifulSoup(intro, "html.parser").get_text()
    assert "@software{attnlib" in text and _cff()["title"] in text
    (href,) = re.findall(r'href="([^"]*attnlib-book\.pdf)"', intro)
    assert (built_site / "book" / href).resolve() == (ROOT / pdf.SITE_COPY).resolve()


# --- the PDF --------------------------------------------------------------------------------------


def _need_chromium() -> None:
    if Path(CHROMIUM).exists() or shutil.which(CHROMIUM):
        return
    reason = f"Chromium not found at {CHROMIUM}: the PDF cannot be printed (apt-get install chromium)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason}; under CI the PDF is required")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def built_pdf(built_site):
    """``(report, text of every page)`` for the book's PDF, printed if anything changed."""
    _need_chromium()
    from pypdf import PdfReader

    report = pdf.build_pdf(ROOT, chromium=CHROMIUM)
    pages = [page.extract_text() for page in PdfReader(report.path).pages]
    return report, pages


def _normal(text: str) -> str:
    # NFKC: the PDF's text has the font's ligatures ("ﬁ" in "fixed"), the titles the letters.
    text = unicodedata.normalize("NFKC", text)
    text = re.sub(r"(?<=\w)-\n(?=\w)", "-", text)  # a hyphenated word the page broke at its hyphen
    return " ".join(text.replace("\u2019", "'").replace("\u2018", "'").split())


def _titles() -> dict[str, str]:
    """The title (first heading) of every document of ``_toc.yml``, by document."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    names = [toc["root"], *book._toc_files(toc.get("parts")), *book._toc_files(toc.get("chapters"))]
    titles = {}
    for name in names:
        source = ROOT / f"{name}.ipynb"
        if source.exists():
            cells = json.loads(source.read_text(encoding="utf-8"))["cells"]
            text = "\n".join("".join(cell["source"]) for cell in cells if cell["cell_type"] == "markdown")
        else:
            text = (ROOT / f"{name}.md").read_text(encoding="utf-8")
        titles[name] = re.search(r"^# (.+)$", text, re.MULTILINE).group(1).strip()
    return titles


def _words_of(title: str) -> list[str]:
    """The parts of a title outside its math (typeset math has no stable text), markup removed."""
    parts = re.split(r"\$[^$]*\$", title.replace("*", "").replace("`", ""))
    return [_normal(part).strip(" :,") for part in parts if len(_normal(part).strip(" :,")) >= 4]


def _contents_links(path: Path) -> list[int]:
    """The page (from 1) each link of the contents page (page 2) points to, in order."""
    from pypdf import PdfReader

    reader = PdfReader(path)
    destinations = reader.named_destinations
    links = [annotation.get_object() for annotation in reader.pages[1].get("/Annots", [])]
    return [reader.get_destination_page_number(destinations[link["/Dest"]]) + 1 for link in links if "/Dest" in link]


def test_the_pdf_has_every_chapter_on_the_page_its_contents_give(built_pdf):
    report, pages = built_pdf
    titles = _titles()
    assert report.pages > len(titles) + 2, f"{report.pages} pages for {len(titles)} documents, a cover and contents"
    whole, contents = _normal(" ".join(pages)), _normal(pages[1])
    assert contents.startswith("Attention selects tokens") or "Contents" in contents[:200]
    for name, title in titles.items():
        for words in _words_of(title):
            assert words in whole, f"{name}: {words!r} is not in the PDF"
            assert words in contents, f"{name}: {words!r} is not in the table of contents"
    # Each entry links to the page where its document starts: the title is there, and the number
    # the contents print next to it is that page.
    targets = _contents_links(report.path)
    assert len(targets) == len(titles)
    for (name, title), page in zip(titles.items(), targets):
        words = _words_of(title)[0]
        assert words in _normal(pages[page - 1]), f"{name}: {words!r} is not on page {page}, where its entry links"
        assert re.search(re.escape(_words_of(title)[-1]) + r"[^0-9]*?\b" + str(page) + r"\b", contents), (name, page)


def test_the_pdf_has_no_raw_tex_or_unresolved_glue(built_pdf):
    """Raw TeX or a glue role anywhere in the text, except inside a raw Python string of the code
    shown (a matplotlib label such as r"$\\ell(u)$" is code, and prints as typed)."""
    _, pages = built_pdf
    found = []
    for number, text in enumerate(pages, start=1):
        for line in text.splitlines():
            for pattern in (r"\$[^$\s][^$]*?\$", r"\\begin\{", r"\\frac", r"\{glue", r"\\\(", r"\\\["):
                for match in re.finditer(pattern, line):
                    if not re.search(r"\br[\"']", line[: match.start()]):
                        found.append(f"page {number}: {line.strip()[:100]!r}")
    assert not found, "raw TeX in the PDF:\n" + "\n".join(found)


def test_the_pdf_has_page_numbers_figures_theorems_and_the_claims_table(built_pdf):
    report, pages = built_pdf
    for number in (2, report.pages // 2, report.pages):
        assert f"{number} / {report.pages}" in pages[number - 1], f"no page number on page {number}"
    whole = _normal(" ".join(pages))
    assert re.search(r"Theorem \d+(\.\d+)?", whole), "no numbered theorem box"
    assert re.search(r"Fig\. \d+\.\d+", whole), "no numbered figure caption"
    assert "criterion" in whole and "measured" in whole and "verdict" in whole, "no claims table"
    from pypdf import PdfReader

    images = sum(len(page.images) for page in PdfReader(report.path).pages)
    chapters = [name for name in _titles() if name.startswith("notebooks/")]
    assert images >= 2 * len(chapters), f"{images} images for {len(chapters)} chapters"


def test_the_site_serves_the_pdf_it_links(built_pdf, built_site):
    report, _ = built_pdf
    assert (ROOT / pdf.SITE_COPY).read_bytes() == report.path.read_bytes()
    assert report.path == ROOT / pdf.PDF_PATH


def test_make_test_builds_the_pdf_after_the_book():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    prerequisites = re.search(r"^test:(.*)$", makefile, re.MULTILINE).group(1).split()
    assert "pdf" in prerequisites and prerequisites.index("pdf") > prerequisites.index("book")
    recipe = re.search(r"^pdf:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE).group(1)
    assert "-m attnlib pdf" in recipe
