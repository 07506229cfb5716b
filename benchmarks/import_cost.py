"""What ``import attnlib`` costs a fresh process, and which heavy libraries it loads.

    python benchmarks/import_cost.py [--repeat 3] [--out benchmarks/results/import_cost.json]

Each measurement is a fresh interpreter (``sys.executable``, this checkout first on the path)
that imports numpy, then times ``import attnlib`` in CPU seconds (``time.process_time``) and
lists which of the heavy libraries (matplotlib, scipy's submodules, cvxpy, ipywidgets) are loaded
after it; then, in the same process, what reaching ``al.experiments.factorization`` (a script's
first use) and ``al.figures`` + ``al.book.style`` (a page's) adds. Medians of ``repeat`` runs.
CPU seconds rise with the machine's load (a shared core); compare runs taken together.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from machine_info import load, machine, utc_now

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("import", "script_first_use", "page_first_use")
HEAVY = ("matplotlib", "matplotlib.pyplot", "scipy.special", "scipy.integrate", "scipy.optimize", "cvxpy", "ipywidgets")

PROBE = """
import json, sys, time
import numpy
t0 = time.process_time()
import attnlib as al
t1 = time.process_time()
loaded = [m for m in HEAVY if m in sys.modules]
al.experiments.factorization
t2 = time.process_time()
al.figures.common, al.book.style
t3 = time.process_time()
print(json.dumps({"import": t1 - t0, "script_first_use": t2 - t1, "page_first_use": t3 - t2, "loaded": loaded}))
"""


def probe() -> dict:
    code = f"HEAVY = {HEAVY!r}\n" + PROBE
    env = {"PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg", "OPENBLAS_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env, cwd="/")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default=None, help="write the result as JSON here")
    args = parser.parse_args(argv)
    before = load()
    runs = [probe() for _ in range(args.repeat)]
    result = {
        "when": utc_now(),
        "machine": machine(),
        "load_before": before,
        "load_after": load(),
        "cpu_seconds": {k: statistics.median(r[k] for r in runs) for k in STAGES},
        "loaded_by_import": runs[0]["loaded"],
        "runs": runs,
    }
    print(json.dumps({k: result[k] for k in ("cpu_seconds", "loaded_by_import")}, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
