"""attnlib.book.kernels and kernel_state: a reused kernel behaves as a fresh one, and is never reused blindly."""

import json
import os
import re
from pathlib import Path
from unittest import mock

import nbformat
import pytest

from attnlib.book import kernels
from attnlib.book.run import collect_checks, execute_notebook

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))

# A notebook that changes every piece of state the reset puts back, and prints what it found first.
STATE_PROBE = [
    "import os, sys, warnings\nimport numpy as np\nimport matplotlib\nimport matplotlib.pyplot as plt",
    "print(sorted(k for k in globals() if not k.startswith('_') and k not in "
    "('In', 'Out', 'exit', 'quit', 'open', 'get_ipython', 'os', 'sys', 'warnings', 'np', 'matplotlib', 'plt')))",
    "print(matplotlib.rcParams['lines.linewidth'], np.get_printoptions()['precision'], np.geterr()['divide'])",
    "print(os.getcwd() == os.path.dirname(os.path.abspath('probe.ipynb')), sys.path.count('/nowhere'), "
    "len(plt.get_fignums()))",
    "warnings.warn('shown once per fresh kernel', UserWarning)",
    "leftover = 1\nmatplotlib.rcParams['lines.linewidth'] = 7.0\nnp.set_printoptions(precision=2)\n"
    "np.seterr(divide='raise')\nsys.path.append('/nowhere')\nplt.figure()\nos.chdir('/')",
    "print(os.getpid())",
]


def _notebook(path: Path, sources: list[str], tags: dict[int, list[str]] | None = None) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    for index, cell_tags in (tags or {}).items():
        nb.cells[index].metadata["tags"] = cell_tags
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def _outputs(path: Path) -> list:
    """Each code cell's execution count and outputs, without the kernel's process id (the last cell,
    and the temporary file name a traceback or warning shows)."""
    text = re.sub(r"ipykernel_\d+", "ipykernel_PID", path.read_text())
    cells = [c for c in json.loads(text)["cells"] if c["cell_type"] == "code"]
    return [(c["execution_count"], [{k: o.get(k) for k in ("name", "text", "data")} for o in c["outputs"]])
            for c in cells[:-1]]  # fmt: skip


def _pid(path: Path) -> int:
    return int("".join(json.loads(path.read_text())["cells"][-1]["outputs"][0]["text"]))


@pytest.fixture
def fresh_pool():
    kernels.shutdown_all()
    yield
    kernels.shutdown_all()


def test_a_reused_kernel_gives_a_fresh_kernels_outputs(tmp_path, fresh_pool):
    probe = _notebook(tmp_path / "probe.ipynb", STATE_PROBE)
    execute_notebook(probe, tmp_path / "cold.ipynb")
    first = execute_notebook(probe, tmp_path / "warm1.ipynb", warm_kernel=True)
    second = execute_notebook(probe, tmp_path / "warm2.ipynb", warm_kernel=True)
    assert first["status"] == second["status"] == "ok"
    cold = _outputs(tmp_path / "cold.ipynb")
    assert _outputs(tmp_path / "warm1.ipynb") == cold
    # the second run met a kernel the first one had changed (names, rcParams, numpy, sys.path, a figure,
    # the working directory, a warning already shown): it saw what a fresh kernel shows
    assert _outputs(tmp_path / "warm2.ipynb") == cold
    assert _pid(tmp_path / "warm1.ipynb") == _pid(tmp_path / "warm2.ipynb")  # the same kernel, reused
    assert "".join(cold[1][1][0]["text"]) == "[]\n" and "UserWarning" in "".join(cold[4][1][0]["text"])


def test_a_kernel_is_not_reused_across_environments_or_after_a_failure(tmp_path, fresh_pool):
    probe = _notebook(tmp_path / "probe.ipynb", ["x = 1", "import os", "print(os.getpid())"])
    failing = _notebook(tmp_path / "failing.ipynb", ["raise ValueError('boom')", "print(1)"])
    execute_notebook(probe, tmp_path / "a.ipynb", warm_kernel=True)
    with mock.patch.dict(os.environ, {"ATTNLIB_MUTATIONS": "some_mutant"}):
        execute_notebook(probe, tmp_path / "b.ipynb", warm_kernel=True)
    execute_notebook(probe, tmp_path / "c.ipynb", warm_kernel=True)
    assert _pid(tmp_path / "a.ipynb") != _pid(tmp_path / "b.ipynb")  # another environment, another kernel
    assert _pid(tmp_path / "a.ipynb") == _pid(tmp_path / "c.ipynb")
    with mock.patch.dict(os.environ, {kernels.FRESH_KERNELS_ENV: "1"}):
        execute_notebook(probe, tmp_path / "d.ipynb", warm_kernel=True)
    assert _pid(tmp_path / "d.ipynb") != _pid(tmp_path / "a.ipynb")  # ATTNLIB_FRESH_KERNELS=1: a kernel of its own
    summary = execute_notebook(failing, tmp_path / "f.ipynb", warm_kernel=True)
    assert summary["status"] == "error"
    execute_notebook(probe, tmp_path / "e.ipynb", warm_kernel=True)
    assert _pid(tmp_path / "e.ipynb") != _pid(tmp_path / "a.ipynb")  # the failed run's kernel was shut down


def test_a_checks_only_run_leaves_figure_cells_out(tmp_path, fresh_pool):
    sources = [
        "import attnlib as al\nchecks = al.Checks()",
        "drawn = 'figure cell ran'\nprint(drawn)",
        "checks.at_most('one', 1.0, 2.0, why='a probe', controls={'two': 3.0});",
    ]
    notebook = _notebook(tmp_path / "tagged.ipynb", sources, tags={1: [kernels.FIGURE_TAG]})
    full = execute_notebook(notebook, tmp_path / "full.ipynb", warm_kernel=True)
    light = execute_notebook(notebook, tmp_path / "light.ipynb", warm_kernel=True, checks_only=True)
    cells = [c for c in json.loads((tmp_path / "light.ipynb").read_text())["cells"] if c["cell_type"] == "code"]
    assert cells[1]["outputs"] == [] and cells[1]["execution_count"] is None
    full_cells = [c for c in json.loads((tmp_path / "full.ipynb").read_text())["cells"] if c["cell_type"] == "code"]
    assert "figure cell ran" in "".join(full_cells[1]["outputs"][0]["text"])
    assert [c["value"] for c in full["checks"]] == [c["value"] for c in light["checks"]]
    assert collect_checks(json.loads((tmp_path / "light.ipynb").read_text()))


def test_figure_cell_problems_sees_a_name_read_later():
    cell = lambda source, *tags: {"cell_type": "code", "source": source, "metadata": {"tags": list(tags)}}  # noqa: E731
    cells = [cell("x = 1"), cell("fig, ax = draw(x)", "figure"), cell("fig, ax = draw(2)\nax.set(x=x)")]
    assert kernels.figure_cell_problems(cells) == []  # the later cell rebinds fig and ax before reading them
    assert kernels.figure_cell_problems([cell("y = 2", "figure"), cell("print(y)")]) == [
        "cell 1 binds 'y', which cell 2 reads"
    ]
    assert kernels.figure_cell_problems([cell("checks.check('a', 1, '<=', 2)", "figure")]) == ["cell 1 uses checks"]


@pytest.mark.parametrize("notebook", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_figure_cells_only_draw(notebook):
    """A cell tagged ``figure`` (skipped by checks-only runs) binds nothing a later cell reads and makes no check."""
    cells = json.loads(notebook.read_text())["cells"]
    assert kernels.figure_cell_problems(cells) == []


def test_a_kept_kernel_gets_the_ready_client_whose_drain_is_short(fresh_pool, tmp_path):
    km = kernels.acquire("python3", str(tmp_path))
    client = km.client()
    assert isinstance(client, kernels.ReadyClient)
    client.start_channels()
    timeouts = []
    real_get = client.iopub_channel.get_msg

    def get_msg(timeout=None):
        timeouts.append(timeout)
        return real_get(timeout=timeout)

    try:
        with mock.patch.object(client.iopub_channel, "get_msg", get_msg):
            client.wait_for_ready(timeout=60)
        # ready: one IOPub message proved the connection (0.2 s allowed for it, as jupyter_client),
        # then the drain listened IOPUB_DRAIN_S at a time, not jupyter_client's 0.2 s
        assert timeouts[0] == 0.2 and timeouts[-1] == kernels.IOPUB_DRAIN_S < 0.2
        reply = client.execute_interactive("print(6 * 7)", timeout=60, output_hook=lambda msg: None)
        assert reply["content"]["status"] == "ok"
    finally:
        client.stop_channels()
    # and a notebook run on it after the short drain has its own outputs, not a stray of the kernel_info
    nb = _notebook(tmp_path / "after.ipynb", ["print('first cell')", "1 + 1"])
    execute_notebook(str(nb), str(tmp_path / "after_out.ipynb"), {}, warm_kernel=True)
    cells = [c for c in json.loads((tmp_path / "after_out.ipynb").read_text())["cells"] if c["cell_type"] == "code"]
    assert "".join(cells[0]["outputs"][0]["text"]) == "first cell\n"
    assert "".join(cells[1]["outputs"][0]["data"]["text/plain"]) == "2"
