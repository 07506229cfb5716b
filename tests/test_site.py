"""The built site (``_build/html``) as a reader gets it: every page rendered, nothing raw.

Read from the HTML files, without a browser (``tests/test_browser.py`` measures the layout):

- no unrendered MyST in a page's text: a directive fence, ``{glue``, ``{numref}``, ``{cite}``,
  ``:label:``, ``{doc}``... (a fence whose title holds a role with backticks is not a directive);
- no raw TeX outside math elements: in the prose, tables, link texts, the sidebar, the search
  index's titles (pages without MathJax show the sidebar's TeX as typed);
- no parameter name where the prose means its value (``n = `w_n```): a chapter's parameter
  names in inline code are only allowed when the prose talks about the name (setting it,
  ``` `lr` = 1```, or the reader's controls in a kernel or a rerun);
- no stray ``Check(name=...)`` repr of a check cell, no promise of animations;
- every picture has alt text (not its file name) and at least two image pixels per CSS pixel
  shown, and the one figure style is what every chapter applies;
- citation labels name the papers, and the text and the References page agree.
"""

from __future__ import annotations

import base64
import json
import re
import struct
from functools import cache
from pathlib import Path

import pytest

from attnlib.book import build as book
from attnlib.book import style

bs4 = pytest.importorskip("bs4")

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["book/intro", "book/notation", "book/reproduce", "book/references"] + [
    path.with_suffix("").as_posix() for path in book.toc_notebooks(ROOT)
]
CHAPTERS = [page for page in PAGES if page.startswith("notebooks/")]

# MyST that reached the HTML as text: the parser did not see it as markup.
UNRENDERED_MYST = {
    "directive fence": re.compile(r"(```|:::)\s*\{[\w:-]+\}"),
    "glue role": re.compile(r"\{glue(:\w+)?\}"),
    "role": re.compile(r"\{(numref|cite(:\w+)?|doc|ref|eq|prf:ref|math|term|download)\}`"),
    "directive option": re.compile(r"^\s*:(label|name|class|caption|nowrap):", re.M),
}
# TeX outside math: delimiters, macros, a transpose written as TeX, inline-math dollars.
RAW_TEX = {
    "math delimiter": re.compile(r"\\[()\[\]]"),
    "TeX macro": re.compile(r"\\(?!n\b|t\b)[A-Za-z]{2,}"),
    "TeX superscript": re.compile(r"\^\{?\\?top\b"),
    "dollar math": re.compile(r"(?<![\w$])\$[^$\s][^$\n]{0,80}\$(?![\w$])"),
}
# Prose in which a parameter's *name* is the point: setting it, or a reader's controls.
NAME_CONTEXT = re.compile(r"kernel|rerun|re-run|make lab|\bparameters?\b|papermill|-p ", re.I)
STALE = {"animation promise": re.compile(r"\bPlay\b|animation", re.I)}


@pytest.fixture(scope="module")
def site(built_site) -> Path:
    return built_site


@cache
def _soup(path: Path):
    return bs4.BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")


def _page(site: Path, name: str):
    return _soup(site / f"{name}.html")


def _prose(page, keep_code_inputs: bool = False):
    """A copy of the page's main content without scripts, styles and (by default) code cells' sources."""
    main = bs4.BeautifulSoup(str(page.find("main")), "html.parser")
    for element in main(["script", "style"]):
        element.decompose()
    if not keep_code_inputs:
        for element in main.select(".cell_input, div.highlight-ipython3, div.highlight-python"):
            element.decompose()
    return main


def _without_math(tree):
    for element in tree.select(".math, mjx-container, math"):
        element.decompose()
    return tree


def _hits(patterns: dict, text: str) -> list[str]:
    found = []
    for kind, pattern in patterns.items():
        for match in pattern.finditer(text):
            found.append(f"{kind}: …{text[max(0, match.start() - 60) : match.end() + 40]!r}…")
    return found


def unrendered_myst(page) -> list[str]:
    """Raw MyST in the page's text (code cells' sources excluded: they may quote roles in comments)."""
    return _hits(UNRENDERED_MYST, _prose(page).get_text())


def raw_tex(page) -> list[str]:
    """TeX outside math elements, in the prose (code and literal blocks excluded) and the sidebar."""
    prose = _without_math(_prose(page))
    for element in prose.select("pre, code, .cell_output"):
        element.decompose()
    found = _hits(RAW_TEX, prose.get_text(" "))
    for nav in page.select("nav.bd-links, .bd-sidebar-primary nav"):
        found += [f"sidebar {hit}" for hit in _hits(RAW_TEX, nav.get_text(" "))]
    title = page.find("title")
    if title is not None:
        found += [f"<title> {hit}" for hit in _hits(RAW_TEX, title.get_text())]
    return found


@cache
def chapter_parameters(chapter: str) -> frozenset[str]:
    """The names assigned in a chapter's ``parameters`` cell."""
    notebook = json.loads((ROOT / f"{chapter}.ipynb").read_text(encoding="utf-8"))
    names = set()
    for cell in notebook["cells"]:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            source = "".join(cell["source"])
            names |= set(re.findall(r"^([A-Za-z_]\w*)\s*=", source, re.M))
    return frozenset(names)


def names_for_values(page, parameters: frozenset[str]) -> list[str]:
    """Inline code holding a parameter's name in prose that means its value.

    Allowed: the name followed by ``=`` (an instruction: "rerun with `lr` = 1"), and paragraphs
    about the reader's own controls or reruns (:data:`NAME_CONTEXT`).
    """
    found = []
    for code in _prose(page).select("p code, li code, td code, figcaption code, .proof code"):
        name = code.get_text().strip()
        if name not in parameters or code.find_parent("pre"):
            continue
        after = "".join(str(s) for s in code.next_siblings)[:12]
        block = code.find_parent(["p", "li", "td", "figcaption"])
        context = block.get_text(" ") if block else ""
        if re.match(r"\s*(\\\()?\s*(=|<|≤|≥)", bs4.BeautifulSoup(after, "html.parser").get_text()):
            continue
        if NAME_CONTEXT.search(context):
            continue
        found.append(f"`{name}` in …{' '.join(context.split())[:160]!r}…")
    return found


def check_reprs(page) -> list[str]:
    text = _prose(page, keep_code_inputs=False).get_text()
    return [f"…{text[m.start() : m.start() + 80]!r}…" for m in re.finditer(r"Check\(name=", text)]


def _png_size(data: bytes) -> tuple[int, int]:
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    return struct.unpack(">II", data[16:24])


def _image_bytes(site: Path, page_name: str, src: str) -> bytes:
    if src.startswith("data:image/png;base64,"):
        return base64.b64decode(src.split(",", 1)[1])
    return ((site / page_name).parent / src).resolve().read_bytes()


def _declared_css_width(img, natural: int) -> float:
    """The CSS width the page asks for: a ``width`` attribute or style, ``100%`` the column, else natural."""
    styles = img.get("style") or ""
    if re.search(r"(^|;)\s*width:\s*100%", styles):
        return style.COLUMN_PX
    match = re.search(r"(^|;)\s*width:\s*([\d.]+)px", styles)
    if match:
        return float(match.group(2))
    if img.get("width"):
        return float(str(img["width"]).removesuffix("px"))
    return natural


def image_problems(site: Path, page_name: str) -> list[str]:
    """Pictures without alt text (or with their file name as alt), or under 2 image px per CSS px."""
    found = []
    for img in _page(site, page_name).select("main img"):
        src = img.get("src", "")
        alt = (img.get("alt") or "").strip()
        short = src[:60] if not src.startswith("data:") else "data:image/png…"
        if not alt or alt.endswith((".png", ".jpg", ".svg")) or "_images/" in alt:
            found.append(f"{short}: no alt text (alt={alt[:60]!r})")
        if src.endswith(".svg"):
            continue
        natural, _ = _png_size(_image_bytes(site, page_name, src))
        shown = min(_declared_css_width(img, natural), style.COLUMN_PX)
        if natural < 2 * shown - 1:  # -1: the inline backend halves odd widths down
            found.append(f"{short}: {natural} image px for {shown:.0f} CSS px ({natural / shown:.2f} per px)")
    return found


@pytest.mark.parametrize("page_name", [*PAGES, "search"])
def test_no_unrendered_myst(site, page_name):
    hits = unrendered_myst(_page(site, page_name))
    assert not hits, f"{len(hits)} pieces of unrendered MyST:\n" + "\n".join(hits[:20])


@pytest.mark.parametrize("page_name", [*PAGES, "search", "genindex"])
def test_no_raw_tex_outside_math(site, page_name):
    hits = raw_tex(_page(site, page_name))
    assert not hits, f"{len(hits)} pieces of raw TeX:\n" + "\n".join(hits[:20])


def test_search_index_titles_have_no_tex(site):
    script = (site / "searchindex.js").read_text(encoding="utf-8")
    index = json.loads(script[script.index("(") + 1 : script.rindex(")")])  # Search.setIndex({...})
    titles = [*index["titles"], *index.get("alltitles", {})]
    raw = [title for title in titles if _hits(RAW_TEX, title)]
    assert not raw, f"page titles with TeX (shown raw in the sidebar and search results): {raw}"


@pytest.mark.parametrize("page_name", CHAPTERS)
def test_prose_shows_parameter_values_not_names(site, page_name):
    hits = names_for_values(_page(site, page_name), chapter_parameters(page_name))
    assert not hits, f"{len(hits)} parameter names where the prose means the value:\n" + "\n".join(hits)


@pytest.mark.parametrize("page_name", PAGES)
def test_no_stray_check_repr_or_stale_promise(site, page_name):
    page = _page(site, page_name)
    assert not check_reprs(page), f"a check cell shows its Check(...) repr: {check_reprs(page)}"
    stale = _hits(STALE, _prose(page).get_text(" "))
    assert not stale, "the page promises animations (the explorers are sliders):\n" + "\n".join(stale)


@pytest.mark.parametrize("page_name", CHAPTERS)
def test_pictures_have_alt_text_and_twice_their_shown_resolution(site, page_name):
    problems = image_problems(site, page_name)
    assert not problems, "\n".join(problems)


def test_the_figure_style_makes_text_legible_in_the_column():
    """The style's numbers: 2 image px per CSS px, smallest text >= 9 CSS px at the column's scale."""
    rc = style.RC_PARAMS
    assert rc["figure.dpi"] * style.COLUMN_INCHES == pytest.approx(style.COLUMN_PX)
    assert rc["savefig.dpi"] >= 2 * rc["figure.dpi"]
    sizes = [rc[key] for key in ("font.size", "xtick.labelsize", "ytick.labelsize", "legend.fontsize")]
    assert min(sizes) == style.SMALLEST_FONT_PT
    assert style.text_px(min(sizes), style.COLUMN_INCHES) >= style.MIN_TEXT_PX
    assert 0.5 <= rc["legend.framealpha"] < 1  # over data, the frame hides the lines under its text
    assert style.explorer_dpi(5.0) * 5.0 >= 2 * style.COLUMN_PX


def test_every_chapter_applies_the_one_figure_style():
    """Each chapter calls ``al.book.style.use()`` in its import cell, and none sets dpi or font sizes itself."""
    for chapter in CHAPTERS:
        notebook = json.loads((ROOT / f"{chapter}.ipynb").read_text(encoding="utf-8"))
        code = ["".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "code"]
        first_import = next(k for k, source in enumerate(code) if re.search(r"^import attnlib", source, re.M))
        assert "al.book.style.use()" in code[first_import], f"{chapter}: the import cell does not apply the style"
        for source in code:
            assert not re.search(r"figure\.dpi|savefig\.dpi|legend\.fontsize", source), (
                f"{chapter} sets its own figure style: {source[:120]!r}"
            )


def test_citation_labels_name_the_papers_and_agree_with_the_references(site):
    references = _page(site, "book/references")
    labels = {label.get_text().strip("[] ") for label in references.select("main .label")}
    assert {"MMTS", "FAST", "TFSVM"} <= labels, f"References page labels: {sorted(labels)}"
    cited = set()
    for name in PAGES:
        for link in _page(site, name).select("main a[href*='references.html#'], main a[href^='#id']"):
            cited.add(link.get_text().strip())
            ambiguous = re.search(r"et al\.?,\s*\d{4}", link.get_text())
            assert not ambiguous, f"{name}: an author-year citation {link.get_text()!r} cannot tell the papers apart"
    assert {"MMTS", "FAST", "TFSVM"} <= cited
    assert cited <= labels, f"in-text labels not on the References page: {sorted(cited - labels)}"
