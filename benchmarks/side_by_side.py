"""The [TFSVM] local-convergence experiment, the official code and attnlib's, timed side by side.

    python benchmarks/side_by_side.py --official-dir DIR --official-python PY [--rounds 2]
        [--runs 100] [--steps 2000] [--out benchmarks/results/side_by_side.json]

``DIR`` is a checkout of the official repository (github.com/umich-sota/TF-as-SVM: its
``local_converge.ipynb`` and ``base.py``), ``PY`` a Python with what it needs (torch, cvxpy,
matplotlib); both stay outside this project and are recorded only as paths and file hashes. The
notebook's code cells run as one script (``MPLBACKEND=Agg``, so ``plt.show()`` draws nothing),
unmodified except its two settings ``RUN`` and ``ITN`` and a short epilogue that prints the final
softmax probabilities and correlations (agreement, not timing). attnlib's run is a fresh
process too: import attnlib, build the same 100 data sets (``datasets.random_tokens(6, 8, 10,
seed=s, queries="cross")``) and call ``local_convergence(probs, steps, lr=0.1,
kq_normalize="separate")`` with ``processes=1`` and with ``processes=2``.

Before the first round both sides' sources are byte-compiled (``python -m compileall``, the
official directory with its Python, attnlib with this one), as an installed package is: neither
side pays for compiling its own code in every run. Each round runs the official script, attnlib
in one process and attnlib in two, one after another (never two at once), in an order that
rotates from round to round (:func:`round_order`: over three rounds each kind runs first, second
and third once, so no run always comes right after the official one); the whole-process wall time
of every run is taken by this driver, with the load averages before and after. Ratios are
computed only within a round (an official run and the attnlib runs of the same round), never
against a time from another round. The
JSON is written after every round (``complete`` is true after the last), and a failed run
stops the driver without writing its round.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine_info import load, machine, utc_now

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = "local_converge.ipynb"
KINDS = ("official", "attnlib_1", "attnlib_2")

#: Appended to the official script: the final softmax probability and correlations of both
#: parametrisations (the notebook's own arrays), printed as one JSON line.
OFFICIAL_EPILOGUE = """
import json as _json
print("SIDE_BY_SIDE " + _json.dumps({
    "mean_final_softmax_prob": [float(sfx_probs[i, :, -1].mean()) for i in range(2)],
    "median_final_corr_fro": [float(np.median(W_fro_corrs[i, :, -1])) for i in range(2)],
    "median_final_corr_nuc": [float(np.median(W_nuc_corrs[i, :, -1])) for i in range(2)],
}))
"""

#: attnlib's side, run as ``python -c`` in a fresh process (argv: runs, steps, processes).
ATTNLIB_SCRIPT = """
import json, sys
import numpy as np
import attnlib as al
runs, steps, processes = (int(a) for a in sys.argv[1:4])
probs = [al.datasets.random_tokens(6, 8, 10, seed=s, queries="cross") for s in range(runs)]
experiment = al.experiments.factorization if hasattr(al, "experiments") else al
run = experiment.local_convergence(probs, steps, lr=0.1, kq_normalize="separate", processes=processes)
opt = np.array([p.opt for p in probs])
def median_corr(k, j):
    final, svm, ok = run.W[k][-1], run.svms[k][j], run.feasible[k]
    return float(np.median([al.cosine(W, S)[()] for W, S, good in zip(final, svm, ok) if good]))
corr = {k: [median_corr(k, j) for j in range(2)] for k in run.W}
print("SIDE_BY_SIDE " + json.dumps({
    "stages": run.seconds,
    "not_opt": {k: int(np.any(run.select[k] != opt, axis=1).sum()) for k in run.select},
    "median_final_corr_fro_nuc": corr,
}))
"""


def round_order(index: int) -> tuple[str, ...]:
    """The order of the runs in round ``index`` (from 0): :data:`KINDS` rotated by the round.

    >>> [round_order(r)[0] for r in range(4)]
    ['official', 'attnlib_1', 'attnlib_2', 'official']
    """
    shift = index % len(KINDS)
    return KINDS[shift:] + KINDS[:shift]


def official_script(notebook: Path, runs: int, steps: int) -> str:
    """The notebook's code cells as one script with ``RUN = runs`` and ``ITN = steps``.

    Raises ValueError when a setting is not found exactly once (a different notebook)."""
    cells = json.loads(notebook.read_text())["cells"]
    code = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    for name, value in (("RUN", runs), ("ITN", steps)):
        code, count = re.subn(rf"^{name} = \d+$", f"{name} = {value}", code, flags=re.M)
        if count != 1:
            raise ValueError(f"{notebook}: expected one line '{name} = <int>', found {count}")
    return code + "\n" + OFFICIAL_EPILOGUE


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _summary_line(stdout: str) -> dict:
    for line in reversed(stdout.splitlines()):
        if line.startswith("SIDE_BY_SIDE "):
            return json.loads(line[len("SIDE_BY_SIDE ") :])
    return {}


def timed_process(kind: str, argv: list[str], env: dict, cwd: Path) -> dict:
    """Run one whole process; its wall time, CPU time (user + sys) and the load around it."""
    before = load()
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    record = dict(kind=kind, seconds=wall, cpu_seconds=cpu, cpu_percent=100 * cpu / wall, load_before=before)
    record["load_after"] = load()
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    record["result"] = _summary_line(proc.stdout)
    print(
        f"{record['load_before']['utc']}  {kind:10s} {wall:8.2f} s  ({record['cpu_percent']:.0f}% CPU)  "
        f"load {before['load_average'][0]:.2f} -> {record['load_after']['load_average'][0]:.2f}",
        flush=True,
    )
    return record


def summarize(rounds: list[list[dict]]) -> dict:
    """Per kind the median, min and max seconds; per round and overall the ratios official/attnlib.

    ``rounds``: one list of records (``kind``, ``seconds``) per round, each holding one run of
    every kind in :data:`KINDS`. A ratio is formed only inside a round.
    """
    if not rounds:
        raise ValueError("no rounds to summarize")
    for r, records in enumerate(rounds):
        kinds = sorted(rec["kind"] for rec in records)
        if kinds != sorted(KINDS):
            raise ValueError(f"round {r} must hold one run of each of {KINDS}, got {kinds}")
    seconds = {k: [next(rec["seconds"] for rec in rnd if rec["kind"] == k) for rnd in rounds] for k in KINDS}
    per_round = [
        {f"official_over_{k}": seconds["official"][r] / seconds[k][r] for k in KINDS[1:]} for r in range(len(rounds))
    ]
    return dict(
        seconds={k: dict(median=statistics.median(v), min=min(v), max=max(v), runs=v) for k, v in seconds.items()},
        ratio_per_round=per_round,
        ratio_median={
            f"official_over_{k}": statistics.median(p[f"official_over_{k}"] for p in per_round) for k in KINDS[1:]
        },
        load_average_1min={
            k: [next(rec["load_before"]["load_average"][0] for rec in rnd if rec["kind"] == k) for rnd in rounds]
            for k in KINDS
        },
    )


def _versions(python: str, code: str, env: dict) -> str:
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env)
    return proc.stdout.strip() if proc.returncode == 0 else f"unknown ({proc.stderr.strip()[-200:]})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--official-dir", type=Path, required=True, help="checkout of umich-sota/TF-as-SVM")
    parser.add_argument("--official-python", required=True, help="a Python with torch, cvxpy and matplotlib")
    parser.add_argument("--official-commit", default="", help="the checkout's commit, if it is not a git work tree")
    parser.add_argument("--python", default=sys.executable, help="the Python that runs attnlib (default: this one)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--runs", type=int, default=100, help="RUN: data sets (seeds)")
    parser.add_argument("--steps", type=int, default=2000, help="ITN: NGD steps")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/side_by_side.json")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.runs < 1 or args.steps < 1:
        parser.error("--rounds, --runs and --steps must be positive integers")
    notebook = args.official_dir / NOTEBOOK
    if not notebook.is_file() or not (args.official_dir / "base.py").is_file():
        parser.error(f"--official-dir must hold {NOTEBOOK} and base.py; {args.official_dir} does not")
    scratch = Path(tempfile.mkdtemp(prefix="side_by_side_"))
    script = scratch / "local_converge.py"
    script.write_text(official_script(notebook, args.runs, args.steps))
    env = dict(os.environ, MPLBACKEND="Agg")
    official_env = dict(env, PYTHONPATH=str(args.official_dir.resolve()))
    attnlib_env = dict(env, PYTHONPATH=str(ROOT))
    commit = args.official_commit
    if not commit:
        git = subprocess.run(["git", "-C", str(args.official_dir), "rev-parse", "HEAD"], capture_output=True, text=True)
        commit = git.stdout.strip() if git.returncode == 0 else "unknown"
    started = utc_now()
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    sha = {name: _sha256(args.official_dir / name) for name in (NOTEBOOK, "base.py")}
    official_versions = _versions(
        args.official_python,
        "import platform, torch, numpy, cvxpy; print(f'Python {platform.python_version()}, torch "
        "{torch.__version__} ({torch.get_num_threads()} threads), numpy {numpy.__version__}, cvxpy "
        "{cvxpy.__version__}')",
        official_env,
    )
    attnlib_versions = _versions(
        args.python,
        "import platform, numpy; print(f'Python {platform.python_version()}, numpy {numpy.__version__}')",
        attnlib_env,
    )
    # Both sides run from byte-compiled sources, as an installed package does (pip compiles its files;
    # an editable install or a checkout has none, and PYTHONDONTWRITEBYTECODE keeps Python from writing them)
    for python, source in ((args.official_python, args.official_dir), (args.python, ROOT / "attnlib")):
        subprocess.run([python, "-m", "compileall", "-q", str(source)], check=True, capture_output=True)
    rounds = []
    for index in range(args.rounds):
        records = []
        for kind in round_order(index):
            if kind == "official":
                records.append(timed_process(kind, [args.official_python, str(script)], official_env, scratch))
            else:
                processes = kind.removeprefix("attnlib_")
                argv_ = [args.python, "-c", ATTNLIB_SCRIPT, str(args.runs), str(args.steps), processes]
                records.append(timed_process(kind, argv_, attnlib_env, ROOT))
        rounds.append(records)
        # Written after every round (atomically), marked complete only after the last: a run cut
        # short leaves its finished rounds, said to be fewer than asked for.
        result = dict(
            measured_together=True,
            order="rotating",  # round r ran its kinds in round_order(r); files without it ran official, 1, 2
            bytecode="both sides byte-compiled before the rounds (python -m compileall)",
            complete=len(rounds) == args.rounds,
            rounds_asked=args.rounds,
            started_utc=started,
            finished_utc=utc_now(),
            machine=machine(),
            setting=dict(runs=args.runs, steps=args.steps, n=6, T=8, d=10, lr=0.1, kq_normalize="separate"),
            official=dict(
                repository="github.com/umich-sota/TF-as-SVM",
                commit=commit,
                notebook=NOTEBOOK,
                sha256=sha,
                versions=official_versions,
            ),
            attnlib=dict(commit=head, versions=attnlib_versions),
            rounds=rounds,
            summary=summarize(rounds),
        )
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(result, indent=1) + "\n")
        tmp.replace(args.out)
    s = result["summary"]
    print(
        f"official {s['seconds']['official']['median']:.1f} s, attnlib {s['seconds']['attnlib_1']['median']:.2f} s "
        f"(1 process) / {s['seconds']['attnlib_2']['median']:.2f} s (2): "
        f"{s['ratio_median']['official_over_attnlib_1']:.0f}x / {s['ratio_median']['official_over_attnlib_2']:.0f}x "
        f"(median of per-round ratios) -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
