"""How to cite the book, derived from ``CITATION.cff`` (Citation File Format 1.2.0).

``CITATION.cff`` at the repository root is the one place the book's citation is written. When the
book is built, :func:`citation_markdown` turns it into the introduction's "cite this book" section
(``book/citation.md`` in the stage): a BibTeX entry for the book and the papers it accompanies, so
the entry is never typed twice.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["CITATION_FILE", "bibtex", "citation_markdown", "load_citation", "reference_line"]

CITATION_FILE = "CITATION.cff"
# CFF work types -> BibTeX entry types (biblatex has @software; the rest are classic BibTeX).
_ENTRY_TYPES = {
    "software": "software",
    "conference-paper": "inproceedings",
    "article": "article",
    "unpublished": "misc",
}


def load_citation(path: str | Path) -> dict:
    """``CITATION.cff`` as a dict, dates kept as the strings the file holds (the CFF schema types
    ``date-released`` as a string; plain YAML would turn ``2026-12-01`` into a ``datetime.date``).

    >>> import tempfile; folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / "CITATION.cff").write_text("title: T\\ndate-released: 2026-12-01\\n")
    >>> load_citation(folder / "CITATION.cff")
    {'title': 'T', 'date-released': '2026-12-01'}
    """
    import yaml  # a dependency of Jupyter Book; only the book build reads CITATION.cff

    class _DatesAsText(yaml.SafeLoader):
        pass

    _DatesAsText.add_constructor("tag:yaml.org,2002:timestamp", yaml.SafeLoader.construct_yaml_str)
    return yaml.load(Path(path).read_text(encoding="utf-8"), Loader=_DatesAsText)


def _person(author: dict) -> str:
    """``Family, Given`` for a person, ``{Name}`` (kept whole by BibTeX) for an entity."""
    if "family-names" in author:
        return f"{author['family-names']}, {author.get('given-names', '')}".rstrip(", ")
    return "{" + author["name"] + "}"


def _year(work: dict) -> str:
    return str(work.get("year") or str(work.get("date-released", ""))[:4])


def _arxiv(work: dict) -> str:
    """The work's arXiv identifier (``arXiv:2306.13596``), or ``""``."""
    found = [i["value"] for i in work.get("identifiers", []) if str(i["value"]).startswith("arXiv:")]
    return found[0] if found else ""


def bibtex(work: dict, key: str) -> str:
    """One BibTeX entry for a CFF work (the file's top level or one of its ``references``).

    >>> print(bibtex({"type": "article", "title": "T", "authors": [{"family-names": "Li", "given-names": "Y"}],
    ...               "year": 2023, "journal": "J"}, "li2023"))
    @article{li2023,
      title   = {T},
      author  = {Li, Y},
      journal = {J},
      year    = {2023},
    }
    """
    fields = {
        "title": work["title"],
        "author": " and ".join(_person(author) for author in work["authors"]),
        "booktitle": work.get("collection-title"),
        "journal": work.get("journal"),
        "volume": work.get("volume"),
        "version": work.get("version"),
        "year": _year(work),
        "doi": work.get("doi"),
        "eprint": _arxiv(work).removeprefix("arXiv:") or None,
        "archiveprefix": "arXiv" if _arxiv(work) else None,
        "url": work.get("url") or work.get("repository-code"),
    }
    present = {name: value for name, value in fields.items() if value}
    width = max(len(name) for name in present)
    lines = [f"@{_ENTRY_TYPES.get(work.get('type'), 'misc')}{{{key},"]
    lines += [f"  {name:<{width}} = {{{value}}}," for name, value in present.items()]
    return "\n".join([*lines, "}"])


def reference_line(work: dict) -> str:
    """A one-line reference: authors (year). *Title.* arXiv identifier or venue."""
    names = ", ".join(
        f"{a.get('given-names', '')} {a['family-names']}".strip() if "family-names" in a else a["name"]
        for a in work["authors"]
    )
    venue = work.get("journal") or work.get("collection-title") or ""
    where = ", ".join(part for part in [venue, _arxiv(work)] if part)
    return f"{names} ({_year(work)}). *{work['title']}.* {where}".rstrip() + ("." if where else "")


def _key(work: dict) -> str:
    """A citation key: the first author's family name (or the entity's first word), the year and the
    title's first word, in the style of ``book/references.bib`` (``tarzanagh2023maxmargin``)."""
    first = work["authors"][0]
    name = first.get("family-names") or first["name"].split()[0]
    word = "".join(char for char in work["title"].split()[0] if char.isalnum())
    return f"{name}{_year(work)}{word}".lower()


def citation_markdown(root: str | Path = ".") -> str:
    """The introduction's citation section (MyST markdown), from ``root/CITATION.cff``."""
    cff = load_citation(Path(root) / CITATION_FILE)
    entries = [bibtex(work, _key(work)) for work in [cff, *cff.get("references", [])]]
    papers = [f"- {reference_line(work)}" for work in cff.get("references", [])]
    return "\n".join(
        [
            f"{cff['message'].strip()} The entries below are generated from the repository's "
            f"`{CITATION_FILE}` (version {cff['version']}, released {cff['date-released']}).",
            "",
            *papers,
            "",
            "```bibtex",
            "\n\n".join(entries),
            "```",
            "",
        ]
    )
