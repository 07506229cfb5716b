"""The book's Sphinx extension (listed in ``_config.yml``): what the rendered site needs beyond
Jupyter Book's defaults.

- **Citation labels** that name the paper ([MMTS], [FAST], [TFSVM]): :mod:`.citations`.
- **Alt text from captions**: a figure's picture without alt text of its own (Sphinx would use the
  file name) gets the caption's text, so a screen reader reads what the caption says. A cell can
  still set its own with the myst-nb metadata ``mystnb: image: alt: ...``.
"""

from __future__ import annotations

from docutils import nodes

from . import citations

__all__ = ["alt_text_from_captions", "setup"]


def alt_text_from_captions(app, doctree, docname) -> int:
    """Give every image in a captioned figure that has no alt text the caption's text; return how many."""
    changed = 0
    for figure in doctree.findall(nodes.figure):
        captions = [child for child in figure.children if isinstance(child, nodes.caption)]
        if not captions:
            continue
        text = " ".join(captions[0].astext().split())
        for image in figure.findall(nodes.image):
            if not image.get("alt"):
                image["alt"] = text
                changed += 1
    return changed


def setup(app):
    """Register the citation styles and the alt-text pass."""
    citations.setup(app)
    app.connect("doctree-resolved", alt_text_from_captions)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
