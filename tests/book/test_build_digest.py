"""A chapter's execution digest covers what it uses: the core, its own rooms, the book's machinery."""

import json
from pathlib import Path

from attnlib.book import build


def _project(root: Path) -> None:
    files = {
        "attnlib/__init__.py": "from . import core, experiments, figures\n",
        "attnlib/core.py": "x = 1\n",
        "attnlib/book/run.py": "y = 1\n",
        "attnlib/experiments/__init__.py": "from . import alpha, beta\n",
        "attnlib/experiments/alpha.py": "from ..core import x\n",
        "attnlib/experiments/beta.py": "from ..core import x\n",
        "attnlib/figures/__init__.py": "from . import alpha, common\n",
        "attnlib/figures/alpha.py": "from ..experiments.alpha import x\nfrom .common import z\n",
        "attnlib/figures/common.py": "z = 1\n",
        "requirements.txt": "numpy==2\n",
    }
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)

    def notebook(name, code, depends_on=None):
        cells = [{"cell_type": "code", "source": [code]}, {"cell_type": "markdown", "source": ["al.figures.beta"]}]
        meta = {"attnlib": {"depends_on": depends_on}} if depends_on else {}
        (root / name).write_text(json.dumps({"cells": cells, "metadata": meta}))

    notebook("a.ipynb", "import attnlib as al\nfrom attnlib.figures import alpha as figs\nfigs.x")
    notebook("b.ipynb", "import attnlib as al\nal.experiments.beta.x")
    notebook("sweeps.ipynb", "import attnlib as al", depends_on=["a.ipynb"])


def test_a_chapter_uses_its_rooms_and_what_they_import(tmp_path):
    _project(tmp_path)
    rooms = build.chapter_modules(tmp_path, Path("a.ipynb"))
    assert [p.as_posix() for p in rooms] == [
        "attnlib/experiments/alpha.py",
        "attnlib/figures/alpha.py",
        "attnlib/figures/common.py",
    ]
    # prose does not count: b's markdown names figures.beta, which does not exist anyway
    assert [p.as_posix() for p in build.chapter_modules(tmp_path, Path("b.ipynb"))] == ["attnlib/experiments/beta.py"]


def test_editing_a_chapter_room_reexecutes_that_chapter_and_its_dependants_only(tmp_path):
    _project(tmp_path)
    names = ["a.ipynb", "b.ipynb", "sweeps.ipynb"]

    def digests():
        return {n: build.execution_digest(tmp_path, Path(n)) for n in names}

    def changed_after(path, text):
        before = digests()
        (tmp_path / path).write_text(text)
        after = digests()
        return sorted(n for n in names if before[n] != after[n])

    assert changed_after(
        "attnlib/figures/alpha.py", "from ..experiments.alpha import x\nfrom .common import z\n# a new figure\n"
    ) == [
        "a.ipynb",
        "sweeps.ipynb",
    ]
    assert changed_after("attnlib/experiments/alpha.py", "x = 2\n") == ["a.ipynb", "sweeps.ipynb"]
    assert changed_after("attnlib/experiments/beta.py", "x = 3\n") == ["b.ipynb"]
    # the core, the shared figures and the book's machinery re-execute every chapter
    for path in ("attnlib/core.py", "attnlib/figures/common.py", "attnlib/book/run.py", "requirements.txt"):
        assert changed_after(path, "changed = True\n") == names, path
