"""Where each chapter's execution time goes: imports, training, SVM solves, figures, the rest.

    python benchmarks/book_profile.py [NOTEBOOK ...] [--out benchmarks/results/book.json]

Each notebook runs in a fresh Python process, inside an IPython shell with the inline matplotlib
backend (what the Jupyter kernel does: every figure left open at the end of a cell is rendered to
PNG), with its default parameters. The process first times the imports every chapter makes, then
each code cell, and attributes the time inside the cells to a few categories by wrapping the
library's entry points (the outermost wrapped call owns the time, so ``train`` called from
``basin_map`` counts once):

- ``train``: :func:`attnlib.train`, :func:`attnlib.train_joint`, :func:`attnlib.optim.train_many`;
- ``svm``: every cvxpy max-margin solve (``attnlib.svm._solve_min_norm``, problem build included);
- ``regularization_path``: :func:`attnlib.regularization_path`;
- ``figures``: rendering figures to PNG (``print_figure``), outside animations;
- ``animations``: ``to_jshtml`` (every frame drawn and encoded);
- ``other``: the rest of the cells' time (array work, tables, glue, building figures).

The kernel start (a Jupyter kernel until it answers) is measured once. Also reported: the
``duration_s`` of the book build's summaries (``_build/stage/notebooks/*.json``) when they
exist, and each notebook's peak RSS. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMPORTS = ("numpy", "matplotlib.pyplot", "scipy.optimize", "cvxpy", "attnlib", "myst_nb", "ipywidgets", "pandas")

# ---------------------------------------------------------------------------------------------
# The child: run one notebook's cells with timers.

_CHILD = r"""
import json, sys, time
t_start = time.perf_counter()


def peak_rss_mib():
    # VmHWM: this process's high-water mark (ru_maxrss would include the parent's, through fork)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024

import importlib
imports = {}
for name in IMPORTS:
    s = time.perf_counter()
    try:
        importlib.import_module(name)
    except ImportError:
        continue
    imports[name] = time.perf_counter() - s

import nbformat
from IPython.core.interactiveshell import InteractiveShell
import matplotlib
import matplotlib.animation
import matplotlib.backend_bases
import attnlib, attnlib.svm, attnlib.optim, attnlib.paths

spent = {}
_active = []

def wrap(category, fn):
    def wrapper(*a, **k):
        if _active:
            return fn(*a, **k)
        _active.append(category)
        s = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            spent[category] = spent.get(category, 0.0) + time.perf_counter() - s
            _active.pop()
    wrapper.__wrapped__ = fn
    return wrapper

def patch(obj, category):
    wrapped = wrap(category, obj)
    for mod in list(sys.modules.values()):
        name = getattr(mod, "__name__", "") or ""
        if not name.startswith("attnlib"):
            continue
        for key, value in list(vars(mod).items()):
            if value is obj:
                setattr(mod, key, wrapped)

patch(attnlib.optim.train, "train")
patch(attnlib.optim.train_joint, "train")
patch(attnlib.optim.train_many, "train")
patch(attnlib.svm._solve_min_norm, "svm")
patch(attnlib.paths.regularization_path, "regularization_path")
cls = matplotlib.backend_bases.FigureCanvasBase
cls.print_figure = wrap("figures", cls.print_figure)
anim = matplotlib.animation.Animation
anim.to_jshtml = wrap("animations", anim.to_jshtml)

class Shell(InteractiveShell):
    def enable_gui(self, gui=None):  # the inline backend needs no GUI event loop
        pass

shell = Shell.instance()
shell.run_line_magic("matplotlib", "inline")
nb = nbformat.read(NOTEBOOK, as_version=4)
import os
os.chdir(os.path.dirname(os.path.abspath(NOTEBOOK)))
cells = []
t_cells = time.perf_counter()
for index, cell in enumerate(nb.cells):
    if cell.cell_type != "code":
        continue
    before = dict(spent)
    s = time.perf_counter()
    result = shell.run_cell(cell.source, store_history=False)
    wall = time.perf_counter() - s
    delta = {k: v - before.get(k, 0.0) for k, v in spent.items() if v - before.get(k, 0.0) > 0}
    first = cell.source.strip().splitlines()[0][:70] if cell.source.strip() else ""
    cells.append(dict(index=index, first_line=first, wall_s=wall, categories=delta,
                      ok=result.success, tags=cell.metadata.get("tags", [])))
    if not result.success:
        break
total_cells = time.perf_counter() - t_cells
out = dict(imports=imports, cells=cells, cells_s=total_cells, categories=spent,
           process_s=time.perf_counter() - t_start,
           peak_rss_mib=peak_rss_mib(),
           ok=all(c["ok"] for c in cells))
print("@@RESULT@@" + json.dumps(out))
"""


def profile_notebook(notebook: Path) -> dict:
    """Run ``notebook``'s code cells in a fresh process and return its timing breakdown."""
    code = f"IMPORTS = {IMPORTS!r}\nNOTEBOOK = {str(notebook)!r}\n" + _CHILD
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONHASHSEED="0")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - start
    marker = [line for line in proc.stdout.splitlines() if line.startswith("@@RESULT@@")]
    if proc.returncode or not marker:
        return dict(notebook=str(notebook.relative_to(ROOT)), ok=False, wall_s=wall, error=proc.stderr[-2000:])
    result = json.loads(marker[-1][len("@@RESULT@@") :])
    import_s = sum(result["imports"].values())
    categorized = sum(result["categories"].values())
    breakdown = dict(imports=import_s, **result["categories"])
    breakdown["other"] = max(0.0, result["cells_s"] - categorized)
    return dict(
        notebook=str(notebook.relative_to(ROOT)),
        ok=result["ok"],
        wall_s=wall,
        cells_s=result["cells_s"],
        breakdown_s=breakdown,
        imports_s=result["imports"],
        peak_rss_mib=result["peak_rss_mib"],
        slowest_cells=sorted(result["cells"], key=lambda c: -c["wall_s"])[:5],
    )


def kernel_start_s(repeat: int = 3) -> float | None:
    """Median time from launching a python3 Jupyter kernel until it answers ``pass``."""
    try:
        from jupyter_client.manager import start_new_kernel
    except ImportError:
        return None
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        km, kc = start_new_kernel(kernel_name="python3")
        kc.execute_interactive("pass", timeout=60)
        times.append(time.perf_counter() - start)
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return sorted(times)[len(times) // 2]


def build_summaries(root: Path = ROOT) -> list[dict]:
    """``duration_s`` of every executed notebook of the last book build (empty if none)."""
    rows = []
    for path in sorted((root / "_build/stage/notebooks").glob("*.json")):
        try:
            summary = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        rows.append(
            dict(
                notebook=summary.get("notebook", path.stem),
                duration_s=summary.get("duration_s"),
                status=summary.get("status"),
                modified=time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(path.stat().st_mtime)),
            )
        )
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebooks/*.ipynb")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/book.json")
    args = parser.parse_args(argv)
    notebooks = [p.resolve() for p in args.notebooks] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    notebooks = [p for p in notebooks if "12_performance" not in p.name] + [
        p for p in notebooks if "12_performance" in p.name
    ]
    load_before = os.getloadavg()
    kernel = kernel_start_s()
    rows = []
    for nb in notebooks:
        print(f"profiling {nb.name} ...", file=sys.stderr, flush=True)
        row = profile_notebook(nb)
        rows.append(row)
        if row["ok"]:
            parts = ", ".join(f"{k} {v:.1f}" for k, v in sorted(row["breakdown_s"].items(), key=lambda kv: -kv[1]))
            print(f"  {row['wall_s']:.1f} s ({parts}); peak RSS {row['peak_rss_mib']:.0f} MiB", file=sys.stderr)
        else:
            print(f"  FAILED after {row['wall_s']:.1f} s: {row['error'][-300:]}", file=sys.stderr)
    result = dict(
        measured_utc=time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        machine=dict(node=platform.node(), processor=platform.processor() or platform.machine(), cpus=os.cpu_count()),
        load_average_before=load_before,
        load_average_after=os.getloadavg(),
        kernel_start_s=kernel,
        notebooks=rows,
        build_summaries=build_summaries(),
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(args.out)
    print(f"written {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
