"""The whole book as one PDF, offline: ``python -m attnlib pdf`` (what ``make pdf`` runs).

From the repository root, after ``python -m attnlib book`` (``make pdf`` runs it first):

1. **One page.** Jupyter Book's single-page HTML builder renders the *staged, executed* book of
   ``_build/stage`` (the copy the site was rendered from, claims table included) into
   ``_build/print/_build/singlehtml`` with :func:`attnlib.book.build.jupyter_book_build`: the same
   call as the site, with Sphinx's ``singlehtml`` builder.
2. **Typeset.** Chromium (Debian's ``/usr/bin/chromium``, driven by Playwright as in the browser
   tests; never ``playwright install``) opens that page without a network and waits until MathJax
   has typeset every formula. The build fails if MathJax reported an error, if a formula was left
   untypeset, or if raw TeX (``$…$``, ``\\begin``, ``\\frac``) or an unresolved ``{glue`` role shows
   in the text, or if an image did not load.
3. **Print.** A print style sheet (:data:`PRINT_CSS`) hides the navigation and sidebars, lets wide
   tables, code and equations wrap or shrink instead of being clipped, starts every chapter on a new
   page and keeps theorem boxes and figures whole. A title page and a table of contents are added;
   Chromium prints twice: the first print's links from the table of contents to the chapters (PDF
   named destinations) give the page on which each chapter starts, which the second print writes
   into the table of contents. Pages carry the book's
   title and ``page / pages``. (No PDF outline: Chromium writes one only into a tagged PDF, which
   doubled the file and the print time.)
4. **Publish.** The PDF is written atomically to ``_build/pdf/attnlib-book.pdf`` and copied into the
   site, ``_build/html/attnlib-book.pdf``, where the introduction links it. A PDF whose inputs (the
   staged book, this module, the Chromium used) have not changed is not printed again, only copied.
"""

from __future__ import annotations

import argparse
import hashlib
import html
import io
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from .build import (
    BUILD_DIR,
    RENDER_STAMP,
    STAGE_DIR,
    BookError,
    _build_lock,
    _stage_digest,
    jupyter_book_build,
)
from .citation import CITATION_FILE, load_citation
from .files import log as _log

__all__ = ["PDF_NAME", "PDF_PATH", "PRINT_CSS", "PdfError", "PdfReport", "build_pdf", "main", "print_pdf"]

PDF_NAME = "attnlib-book.pdf"
PDF_PATH = f"{BUILD_DIR}/pdf/{PDF_NAME}"
PDF_STAMP = f"{BUILD_DIR}/pdf/{PDF_NAME}.stamp"
PRINT_DIR = f"{BUILD_DIR}/print"  # jupyter-book --path-output of the single-page build
SINGLE_PAGE_DIR = f"{PRINT_DIR}/_build/singlehtml"
SITE_COPY = f"{BUILD_DIR}/html/{PDF_NAME}"  # the introduction links ../attnlib-book.pdf
DEFAULT_CHROMIUM = os.environ.get("ATTNLIB_CHROMIUM", "/usr/bin/chromium")
# A4 with room for the header and footer; the page is laid out at the printed text width (96 px per
# inch), so what would overflow the paper overflows the window too and is found before printing.
PAPER = {"format": "A4", "margin": {"top": "18mm", "bottom": "16mm", "left": "15mm", "right": "15mm"}}
TEXT_WIDTH_PX = round((210 - 30) / 25.4 * 96)
LOAD_TIMEOUT_MS = 180_000  # the single page holds every chapter's figures inline: tens of MB

PRINT_CSS = """
@media print {
  /* The site's navigation has no use on paper. */
  .bd-header, .bd-header-announcement, .bd-sidebar-primary, .bd-sidebar-secondary, .bd-footer,
  .bd-footer-article, .bd-footer-content, .header-article, .prev-next-area, .headerlink,
  #pst-back-to-top, .skip-link, .copybtn, .toctree-wrapper > p.caption, .attnlib-slider-controls,
  .animation .anim-controls, .anim-buttons, .anim-state, .attnlib-no-print,
  #jb-print-docs-body { display: none !important; }
  /* The theme prints a page's title in its own header (hidden above); the book's title page replaces it. */
  .bd-article section > h1 { display: block !important; }
  /* The article takes the whole text width; nothing scrolls, so nothing is cut off. */
  html, body, .bd-container, .bd-container__inner, .bd-page-width, .bd-main, .bd-content,
  .bd-article-container, .bd-article { display: block !important; max-width: none !important;
    min-width: 0 !important; width: auto !important; margin: 0 !important; padding: 0 !important;
    overflow: visible !important; }
  html { font-size: 10pt; }
  .cell_output, .output, div.highlight, .pst-scrollable-table-container, .table-wrapper, .math,
  mjx-container { overflow: visible !important; max-height: none !important; }
  pre { white-space: pre-wrap !important; overflow-wrap: anywhere; overflow: visible !important; }
  /* Long inline names (al.experiments.<chapter>.<helper>) break anywhere rather than pass the margin. */
  code.literal { white-space: normal !important; overflow-wrap: anywhere; word-break: break-all; }
  table { width: 100% !important; max-width: 100% !important; table-layout: auto; }
  table td, table th { overflow-wrap: break-word; white-space: normal !important; }
  img { max-width: 100% !important; height: auto !important; }
  /* Every chapter (and reference page) on a new page; boxes and figures kept whole. */
  .bd-article > section, .toctree-wrapper > section, .attnlib-print-contents { break-before: page; }
  figure, div.proof, div.admonition, .cell_output img, .attnlib-slider, tr { break-inside: avoid; }
  h1, h2, h3, h4, figcaption, .caption { break-after: avoid; }
  /* Collapsed code (hide-input) is left out: its "show" toggle means nothing on paper. */
  details.hide, .toggle-hidden, button.toggle-button { display: none !important; }
  /* The title page and the table of contents added by attnlib.book.pdf. */
  .attnlib-print-title { text-align: center; padding-top: 30%; break-after: page; }
  .attnlib-print-booktitle { font-size: 2.4em; line-height: 1.2; margin-bottom: 1.2em; }
  .attnlib-print-heading { font-size: 2em; margin: 0 0 0.8em; }
  .attnlib-print-title p { font-size: 1.1em; color: #444; }
  .attnlib-print-contents ol { list-style: none; padding-left: 0; }
  .attnlib-print-contents li { display: flex; gap: 0.5em; margin: 0.35em 0; }
  .attnlib-print-contents li .dots { flex: 1; border-bottom: 1px dotted #999; margin-bottom: 0.3em; }
  .attnlib-print-contents a { color: inherit; text-decoration: none; }
}
"""

# The documents of the book, in reading order: the root page (its h1) and then every page that its
# table of contents pulls in (a section under .toctree-wrapper in the single-page build).
_DOCUMENTS_JS = """
() => {
  const root = document.querySelector('.bd-article section');
  const pages = [root, ...document.querySelectorAll('.toctree-wrapper > section')];
  return pages.map((section, index) => {
    section.id = section.id || `attnlib-page-${index}`;
    const heading = section.querySelector('h1, h2').cloneNode(true);
    heading.querySelectorAll('.headerlink').forEach(e => e.remove());
    return {id: section.id, title: heading.innerText.trim(), html: heading.innerHTML};
  });
}
"""

# What a reader would see broken: formulas MathJax could not typeset (an error box, or TeX left as
# text), raw TeX or an unresolved glue role in the text, images that did not load.
_PROBLEMS_JS = r"""
() => {
  const problems = [];
  const errors = document.querySelectorAll('mjx-merror');
  errors.forEach(e => problems.push('MathJax error: ' + (e.getAttribute('data-mjx-error') || e.textContent)));
  document.querySelectorAll('.math').forEach(m => {
    if (!m.querySelector('mjx-container')) problems.push('untypeset math: ' + m.textContent.slice(0, 80));
  });
  const article = document.querySelector('.bd-article').cloneNode(true);
  article.querySelectorAll('pre, code, script, style, mjx-container, .highlight').forEach(e => e.remove());
  const text = article.textContent;
  // $…$ or a TeX command (\\frac, \\top, \\begin, \\( …) as text, or a glue role left unresolved.
  for (const pattern of [/\$[^$\s][^$]*?\$/g, /\\[A-Za-z]+|\\[([]/g, /\{glue/g]) {
    for (const match of text.matchAll(pattern)) {
      problems.push('raw text: ' + text.slice(Math.max(0, match.index - 40), match.index + 60).replace(/\s+/g, ' '));
    }
  }
  document.querySelectorAll('img').forEach(i => {
    if (!i.naturalWidth) problems.push('image not loaded: ' + i.src.slice(0, 120));
  });
  return problems;
}
"""

# Wider than the text: a display formula or a figure is scaled down to fit; anything else is reported.
_FIT_JS = """
(width) => {
  const tooWide = [];
  document.querySelectorAll('mjx-container[display="true"], .cell_output img, figure img').forEach(e => {
    const w = e.scrollWidth;
    if (w > width + 1) { e.style.zoom = (width / w).toFixed(3); }
  });
  document.querySelectorAll('.bd-article *').forEach(e => {
    const r = e.getBoundingClientRect();
    if (r.width > 0 && r.right > width + 2 && !e.closest('mjx-container')) {
      tooWide.push(`${e.tagName.toLowerCase()}.${e.className}: ${Math.round(r.right)} px > ${width} px`);
    }
  });
  return tooWide;
}
"""

_FRONT_MATTER_JS = """
([title, lines, documents]) => {
  const article = document.querySelector('.bd-article');
  const front = document.createElement('div');
  front.className = 'attnlib-print-front';
  const cover = document.createElement('div');
  cover.className = 'attnlib-print-title';
  // Not h1: the theme's print style sheet hides the article's h1 (it prints its own page header).
  cover.innerHTML = '<div class="attnlib-print-booktitle"></div>' + lines.map(() => '<p></p>').join('');
  cover.querySelector('.attnlib-print-booktitle').textContent = title;
  cover.querySelectorAll('p').forEach((p, i) => { p.textContent = lines[i]; });
  const contents = document.createElement('nav');
  contents.className = 'attnlib-print-contents';
  contents.innerHTML = '<div class="attnlib-print-heading">Contents</div><ol></ol>';
  for (const doc of documents) {
    const item = document.createElement('li');
    item.innerHTML = '<a></a><span class="dots"></span><span class="page">000</span>';
    item.querySelector('a').innerHTML = doc.html;  // typeset math included
    item.querySelector('a').href = '#' + doc.id;
    contents.querySelector('ol').appendChild(item);
  }
  front.append(cover, contents);
  article.prepend(front);
  document.title = title;
}
"""

_SET_PAGES_JS = """
(pages) => document.querySelectorAll('.attnlib-print-contents .page').forEach((span, i) => {
  span.textContent = pages[i];
})
"""

_HEADER = '<div style="font-size:7pt;color:#777;width:100%;text-align:center;font-family:sans-serif">{title}</div>'
_FOOTER = (
    '<div style="font-size:7pt;color:#777;width:100%;text-align:center;font-family:sans-serif">'
    '<span class="pageNumber"></span> / <span class="totalPages"></span></div>'
)


class PdfError(BookError):
    """The PDF cannot be made, or would show a reader something broken."""


@dataclass(frozen=True)
class PdfReport:
    """What a print produced: where, how many pages, how large, how long, what each chapter's page is."""

    path: Path
    pages: int
    size_bytes: int
    duration_s: float
    contents: tuple[tuple[str, int], ...]  # (title, first page) of every document, in reading order
    printed: bool = True  # False when the PDF was up to date and only copied


def _first_pages(pdf_bytes: bytes, ids: list[str]) -> list[int]:
    """The page (from 1) on which each of the elements ``ids`` starts in a PDF printed by Chromium,
    which writes a named destination for every element with an id that a link points to."""
    from pypdf import PdfReader  # only `make pdf` needs pypdf

    reader = PdfReader(io.BytesIO(pdf_bytes))
    destinations = reader.named_destinations
    missing = [name for name in ids if f"/{name}" not in destinations and name not in destinations]
    if missing:
        raise PdfError(f"the printed PDF has no destination for {missing}: cannot number the table of contents")
    return [
        reader.get_destination_page_number(destinations.get(f"/{name}", destinations.get(name))) + 1 for name in ids
    ]


def print_pdf(page_html: Path, output: Path, chromium: str, title: str, cover_lines: list[str]) -> PdfReport:
    """Print one HTML page (the single-page book) to ``output`` with Chromium, atomically.

    Raises :class:`PdfError` when the page shows something broken (see :data:`_PROBLEMS_JS`).
    """
    from playwright.sync_api import sync_playwright  # a heavy optional dependency, needed only here

    if not (Path(chromium).exists() or shutil.which(chromium)):
        raise PdfError(f"Chromium not found at {chromium!r}: apt-get install chromium, or pass --chromium PATH")
    start = time.perf_counter()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium, args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
        )
        try:
            context = browser.new_context(viewport={"width": TEXT_WIDTH_PX, "height": 1100})
            blocked: list[str] = []

            def offline(route):  # the PDF is made from the site's own files only
                if route.request.url.startswith(("file://", "data:", "blob:")):
                    route.continue_()
                else:
                    blocked.append(route.request.url)
                    route.abort()

            context.route("**/*", offline)
            page = context.new_page()
            page.set_default_timeout(LOAD_TIMEOUT_MS)
            page.goto(page_html.resolve().as_uri(), wait_until="load")
            page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise")
            page.evaluate("() => MathJax.startup.promise")
            page.emulate_media(media="print")
            page.add_style_tag(content=PRINT_CSS)
            problems = page.evaluate(_PROBLEMS_JS) + [f"network request (blocked): {url}" for url in blocked]
            documents = page.evaluate(_DOCUMENTS_JS)
            page.evaluate(_FRONT_MATTER_JS, [title, cover_lines, documents])
            problems += [f"wider than the page: {item}" for item in page.evaluate(_FIT_JS, TEXT_WIDTH_PX)]
            if problems:
                shown = "\n  ".join(problems[:20])
                raise PdfError(f"{len(problems)} problems a reader would see in the PDF:\n  {shown}")
            options = dict(
                PAPER,
                print_background=True,
                display_header_footer=True,
                header_template=_HEADER.format(title=html.escape(title)),
                footer_template=_FOOTER,
            )
            first_print = page.pdf(**options)
            first = _first_pages(first_print, [document["id"] for document in documents])
            page.evaluate(_SET_PAGES_JS, [str(number) for number in first])
            pdf_bytes = page.pdf(**options)
        finally:
            browser.close()
    from pypdf import PdfReader

    pages = len(PdfReader(io.BytesIO(pdf_bytes)).pages)
    # Only the numbers of the table of contents changed between the two prints ("000" was as wide
    # as a page number): the chapters must start on the same pages, or the numbers would be wrong.
    if _first_pages(pdf_bytes, [document["id"] for document in documents]) != first:
        raise PdfError("the chapters moved between the two prints: the table of contents would be wrong")
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(pdf_bytes)
        os.replace(tmp, output)
    finally:
        tmp.unlink(missing_ok=True)
    contents = tuple((document["title"], number) for document, number in zip(documents, first))
    return PdfReport(output, pages, len(pdf_bytes), time.perf_counter() - start, contents)


def _pdf_digest(root: Path, chromium: str) -> str:
    """What the PDF depends on: the staged book, this module and the Chromium that prints it."""
    digest = hashlib.sha256(_stage_digest(root / STAGE_DIR).encode())
    digest.update(Path(__file__).read_bytes())
    digest.update(str(Path(chromium).resolve() if Path(chromium).exists() else chromium).encode())
    return digest.hexdigest()


def _single_page(root: Path) -> Path:
    """Render the staged book with the single-page builder; return the page to print.

    The builder writes the root document at its own path (``book/intro.html``) with links computed
    as if it stood at the output's top, so the page is copied there before it is opened.
    """
    import yaml  # a dependency of Jupyter Book

    jupyter_book_build(root, root / STAGE_DIR, root / PRINT_DIR, builder="singlehtml")
    root_doc = yaml.safe_load((root / STAGE_DIR / "_toc.yml").read_text(encoding="utf-8"))["root"]
    single = root / SINGLE_PAGE_DIR
    page = single / "attnlib-book.html"
    shutil.copyfile(single / f"{root_doc.removesuffix('.md')}.html", page)
    return page


def build_pdf(root: Path | str = ".", chromium: str = DEFAULT_CHROMIUM) -> PdfReport:
    """Print the staged book (``python -m attnlib book`` first) to :data:`PDF_PATH` and copy it into the site."""
    root = Path(root).resolve()
    output, stamp, site_copy = root / PDF_PATH, root / PDF_STAMP, root / SITE_COPY
    with _build_lock(root):
        render_stamp = root / RENDER_STAMP
        if not render_stamp.exists() or render_stamp.read_text().strip() != _stage_digest(root / STAGE_DIR):
            raise PdfError(
                "the staged book is not the one the site was last rendered from: run `python -m attnlib book` "
                "(make pdf does) first"
            )
        digest = _pdf_digest(root, chromium)
        if output.exists() and stamp.exists() and stamp.read_text().strip() == digest:
            from pypdf import PdfReader

            report = PdfReport(output, len(PdfReader(output).pages), output.stat().st_size, 0.0, (), printed=False)
            _log(f"[pdf] up to date: {PDF_PATH}")
        else:
            stamp.unlink(missing_ok=True)
            _log("[pdf] rendering the staged book as one page (jupyter-book, singlehtml) ...")
            start = time.perf_counter()
            page = _single_page(root)
            _log(f"[pdf] rendered in {time.perf_counter() - start:.1f} s; printing with {chromium} ...")
            citation = load_citation(root / CITATION_FILE)
            authors = ", ".join(author.get("name") or author["family-names"] for author in citation["authors"])
            printed = time.strftime("%Y-%m-%d", time.gmtime())
            cover = [authors, f"Version {citation['version']}, printed {printed} from the executed notebooks"]
            report = print_pdf(page, output, chromium, citation["title"], cover)
            stamp.write_text(digest + "\n")
            report = PdfReport(**{**report.__dict__, "duration_s": time.perf_counter() - start})
            _log(
                f"[pdf] {PDF_PATH}: {report.pages} pages, {report.size_bytes / 1e6:.1f} MB, "
                f"{report.duration_s:.1f} s (single-page render and two prints)"
            )
        if (root / SITE_COPY).parent.is_dir():
            shutil.copyfile(output, site_copy)
            _log(f"[pdf] copied into the site: {SITE_COPY}")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attnlib pdf",
        description=f"Print the staged book (run `python -m attnlib book` first) as one PDF, {PDF_PATH}, "
        f"and copy it into the site ({SITE_COPY}).",
    )
    parser.add_argument("--root", type=Path, default=Path("."), help="the repository root (default: .)")
    parser.add_argument(
        "--chromium", default=DEFAULT_CHROMIUM, help=f"the Chromium or Chrome that prints (default: {DEFAULT_CHROMIUM})"
    )
    args = parser.parse_args(argv)
    try:
        build_pdf(args.root, chromium=args.chromium)
    except BookError as exc:
        _log(f"error: {exc}")
        return 1
    return 0
