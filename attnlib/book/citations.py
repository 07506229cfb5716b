"""Citation labels that name the paper: [MMTS], [FAST], [TFSVM], in the text and on the References page.

The book refers to its three papers by short names ([MMTS] Tarzanagh et al. 2023, "Max-margin token
selection"; [TFSVM] Tarzanagh et al. 2023, "Transformers as support vector machines"; [FAST]
Vasudeva et al.). Author-year labels cannot tell the first two apart ("Tarzanagh et al., 2023"
for both) and pybtex's alpha labels are opaque (TLZO23, TLTO23). This Sphinx extension registers:

- a pybtex **label style** ``shorthand``: an entry's ``shorthand`` field (as in biblatex) when it
  has one, else its alpha label;
- a pybtex **formatting style** ``attnlib``: pybtex's ``alpha`` (entries sorted by author and year)
  with that label style.

``_config.yml`` selects them with ``bibtex_default_style: attnlib`` and
``bibtex_reference_style: label``, so ``{cite}`` prints the same label as the bibliography.

>>> from pybtex.database import parse_string
>>> bib = parse_string('''
... @misc{a, author={Tarzanagh, D.}, title={Max-margin}, year={2023}, shorthand={MMTS}}
... @misc{b, author={Tarzanagh, D.}, title={Transformers}, year={2023}}''', "bibtex")
>>> list(ShorthandLabelStyle().format_labels(bib.entries.values()))
['MMTS', 'Tar23']
"""

from __future__ import annotations

import pybtex.plugin
from pybtex.style.formatting.alpha import Style as AlphaStyle
from pybtex.style.labels import BaseLabelStyle
from pybtex.style.labels.alpha import LabelStyle as AlphaLabelStyle

__all__ = ["ShorthandLabelStyle", "BookStyle", "setup"]  # setup: called by attnlib.book.site


class ShorthandLabelStyle(BaseLabelStyle):
    """An entry's ``shorthand`` field as its label, else pybtex's alpha label."""

    def format_labels(self, sorted_entries):
        sorted_entries = list(sorted_entries)
        # Alpha labels (and their a/b suffixes) only among the entries without a shorthand.
        plain = [entry for entry in sorted_entries if "shorthand" not in entry.fields]
        fallback = dict(zip(map(id, plain), AlphaLabelStyle().format_labels(plain), strict=True))
        for entry in sorted_entries:
            yield str(entry.fields["shorthand"]) if "shorthand" in entry.fields else fallback[id(entry)]


class BookStyle(AlphaStyle):
    """pybtex's alpha style with :class:`ShorthandLabelStyle` labels."""

    default_label_style = "shorthand"


def setup(app):
    """Sphinx extension: register the label and formatting styles with pybtex."""
    pybtex.plugin.register_plugin("pybtex.style.labels", "shorthand", ShorthandLabelStyle)
    pybtex.plugin.register_plugin("pybtex.style.formatting", "attnlib", BookStyle)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
