"""No figure code overrides the book style with text smaller than its smallest font.

The book style (:mod:`attnlib.book.style`) sets every font to at least
:data:`~attnlib.book.style.SMALLEST_FONT_PT`, about 9 CSS px in the column. A literal
``fontsize=7`` in a figure module or a notebook's code undoes that for its text, so this test
reads the figure code (``attnlib/figures/``, ``attnlib/book/performance.py``, every notebook's code
cells) and fails naming the file and line of every literal size below it: ``fontsize=``,
``labelsize=``, ``title_fontsize=``, ``size=`` in a text call, a legend's ``prop={"size": ...}``,
and the named sizes below the base font (``"small"``...). Crowded figures are fixed by their
layout (fewer ticks, a wider figure, a legend outside), not by smaller text.
"""

from __future__ import annotations

import ast
import io
import json
from pathlib import Path

import matplotlib.font_manager
import matplotlib.pyplot as plt
import pytest
from matplotlib.backends.backend_agg import RendererAgg

from attnlib.book import style

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted((ROOT / "attnlib" / "figures").glob("*.py")) + [ROOT / "attnlib" / "book" / "performance.py"]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

# Keywords that are a text size in any call (``labelsize`` of tick_params, a legend's title).
SIZE_KEYWORDS = {"fontsize", "labelsize", "title_fontsize"}
# Calls whose ``size=`` is a text size (elsewhere ``size`` is a marker area, e.g. ``common.tokens``).
TEXT_CALLS = {
    "text",
    "annotate",
    "figtext",
    "title",
    "set_title",
    "suptitle",
    "supxlabel",
    "supylabel",
    "xlabel",
    "ylabel",
    "set_xlabel",
    "set_ylabel",
    "set_xticks",
    "set_yticks",
    "set_xticklabels",
    "set_yticklabels",
    "xticks",
    "yticks",
    "set_label_text",
}


def _points(node: ast.expr) -> float | None:
    """The size in points of a literal font size (a number or a named size), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        scale = matplotlib.font_manager.font_scalings.get(node.value)
        if scale is not None:
            return scale * style.RC_PARAMS["font.size"]
    return None


def _call_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def small_fonts(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, text)`` of every literal font size below the style's smallest in ``tree``.

    >>> small_fonts(ast.parse("ax.legend(fontsize=7)\\ncommon.tokens(ax, p, size=40)"))
    [(1, 'fontsize=7')]
    >>> small_fonts(ast.parse("ax.text(0, 0, 's', size='small')"))
    [(1, "size='small'")]
    """
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        for keyword in node.keywords:
            sizes = []
            if keyword.arg in SIZE_KEYWORDS or (keyword.arg == "size" and _call_name(node) in TEXT_CALLS):
                sizes.append(keyword.value)
            elif keyword.arg == "prop" and isinstance(keyword.value, ast.Dict):
                sizes += [v for k, v in zip(keyword.value.keys, keyword.value.values) if ast.literal_eval(k) == "size"]
            for size in sizes:
                points = _points(size)
                if points is not None and points < style.SMALLEST_FONT_PT:
                    found.append((node.lineno, f"{keyword.arg}={ast.unparse(size)}"))
    return sorted(found)


def _code(cell_source: str) -> str:
    """A code cell's Python: IPython magics and shell lines commented out, line numbers kept."""
    return "\n".join("#" + line if line.lstrip().startswith(("%", "!")) else line for line in cell_source.splitlines())


def offenders(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line: fontsize=7`` for every small literal font in a module or a notebook's code cells."""
    name = path.relative_to(root).as_posix()
    if path.suffix == ".py":
        return [f"{name}:{line}: {text}" for line, text in small_fonts(ast.parse(path.read_text(encoding="utf-8")))]
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    out = []
    for index, cell in enumerate(cells):
        if cell["cell_type"] == "code":
            for line, text in small_fonts(ast.parse(_code("".join(cell["source"])))):
                out.append(f"{name} cell {index} line {line}: {text}")
    return out


def test_the_scan_finds_a_small_font_and_passes_the_style_sizes(tmp_path):
    """Control: a planted ``fontsize=7`` (and a named ``x-small``) is found with its line; the
    style's own smallest size, marker sizes and larger fonts are not."""
    planted = "ax.legend(fontsize=8)\nax.set_yticks(y, labels, fontsize=7)\nax.set_title('t', size='x-small')\n"
    clean = f"ax.legend(fontsize={style.SMALLEST_FONT_PT})\ntokens(ax, p, size=40)\nax.text(0, 0, 't', size=12)\n"
    assert small_fonts(ast.parse(planted)) == [(1, "fontsize=8"), (2, "fontsize=7"), (3, "size='x-small'")]
    assert small_fonts(ast.parse(clean)) == []
    notebook = tmp_path / "notebooks" / "x.ipynb"
    notebook.parent.mkdir()
    cells = [
        {"cell_type": "markdown", "source": ["fontsize=7"]},
        {"cell_type": "code", "source": ["%matplotlib inline\n", planted]},
    ]
    notebook.write_text(json.dumps({"cells": cells}), encoding="utf-8")
    assert offenders(notebook, tmp_path)[0] == "notebooks/x.ipynb cell 1 line 2: fontsize=8"


@pytest.mark.parametrize("path", MODULES + NOTEBOOKS, ids=lambda path: path.name)
def test_no_literal_font_below_the_style(path):
    """Every figure module and notebook leaves text at least the style's smallest font."""
    found = offenders(path)
    assert not found, f"font sizes below style.SMALLEST_FONT_PT = {style.SMALLEST_FONT_PT} pt:\n" + "\n".join(found)


def test_one_mathtext_parser_for_every_figure_draws_the_same_pixels(monkeypatch):
    """:func:`style.share_mathtext_parses`: every Agg renderer reads one parser, and a figure with
    mathtext (log-axis tick labels, a TeX title) is byte-identical to one drawn with its own parser."""

    def png():
        fig, ax = plt.subplots(figsize=(3, 2))
        ax.loglog([1, 10, 1000], [1e-3, 1e-1, 1.0])
        ax.set_title(r"$\|W_t\| / \log t$")
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=80)
        plt.close(fig)
        return buf.getvalue()

    style.share_mathtext_parses()
    style.share_mathtext_parses()  # idempotent
    assert RendererAgg(10, 10, 72).mathtext_parser is RendererAgg(20, 30, 150).mathtext_parser
    shared = [png(), png()]
    monkeypatch.delattr(RendererAgg, "mathtext_parser")  # the control: each renderer makes its own parser again
    assert RendererAgg(10, 10, 72).mathtext_parser is not RendererAgg(10, 10, 72).mathtext_parser
    assert shared[0] == shared[1] == png()
