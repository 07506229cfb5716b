"""The performance page's figures and tables, drawn from `make bench`'s results and the book's run summaries.

Every function takes the parsed results (``core``: ``benchmarks/results/core.json``; ``profile``:
``benchmarks/results/book.json``; ``summaries``: the chapters' run summaries) and draws a panel
saying "no results" where a section is missing, so the page renders before any benchmark ran.

>>> import attnlib as al
>>> fig = batching_figure(None)  # no results yet: two empty panels
>>> [ax.texts[0].get_text() for ax in fig.axes]
['no results', 'no results']
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..model import TokenSelectionProblem
from ..optim import train
from .files import find_upwards
from .timing import blas_threads, timed


def results_folder(relative: str, given: str = "") -> Path | None:
    """``given`` if set (None when it is not a folder), else the first ``relative`` found upwards."""
    if given:
        return Path(given) if Path(given).is_dir() else None
    return find_upwards(relative)


def read_json(path: Path | None):
    """The parsed JSON file at ``path``, or None when there is none (or it is unreadable)."""
    if path is None or not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_summaries(folder: Path | None, exclude: str = "") -> list[dict]:
    """The run summaries (``*.json`` with a ``duration_s``) in ``folder``, sorted by file name."""
    found = []
    for path in sorted(folder.glob("*.json")) if folder else []:
        summary = read_json(path)
        if isinstance(summary, dict) and "duration_s" in summary and not (exclude and exclude in path.name):
            found.append(summary)
    return found


def no_data(ax, what: str = "no results") -> None:
    """Mark an empty panel."""
    ax.text(0.5, 0.5, what, ha="center", va="center", transform=ax.transAxes, color="0.5")
    ax.set(xticks=[], yticks=[])


def _figure(ncols: int, size):
    import matplotlib.pyplot as plt

    return plt.subplots(1, ncols, figsize=size)


def results_header(core) -> str:
    """Markdown: when and where the results were measured, and the load at the time."""
    if core is None:
        return "*No benchmark results found (run `make bench`); the figures below are left empty.*"
    m = core["machine"]
    text = (
        f"Results file last written **{core['measured_utc']} UTC** on `{m['node']}`: {m['cpu']}, {m['cpus']} CPUs, "
        f"Python {m['python']}, numpy {m['numpy']} ({m['blas']}); load average "
        f"{m['load_average'][0]:.1f} at the start and "
        f"{m.get('load_average_after', [float('nan')])[0]:.1f} at the end"
        + (" (**quick run**: small sizes, one repeat)." if core.get("quick") else ".")
    )
    stamps = [
        f"{name} {core[name]['measured']['utc']} (load {core[name]['measured']['load_before'][0]:.1f})"
        for name in ("batching", "scaling", "svm", "memory", "local_converge")
        if name in core and "measured" in core[name]
    ]
    if stamps:
        text += "\n\nSections measured at (UTC): " + "; ".join(stamps) + "."
    return text


def batching_figure(core):
    """(a) µs per trajectory-step against the batch size B, per path and BLAS setting, with the
    Python loop's cost as a horizontal line; (b) the generic path's fraction of the flop limit."""
    fig, axes = _figure(2, (11, 4))
    if not (core and "batching" in core):
        no_data(axes[0]), no_data(axes[1])
        return fig
    rows = core["batching"]["rows"]
    for (path, threads), style in zip(
        sorted({(r["path"], r["blas_threads"]) for r in rows}), ("o-", "o:", "s-", "s:", "^-", "^:")
    ):
        sub = [r for r in rows if r["path"] == path and r["blas_threads"] == threads]
        B = [r["B"] for r in sub]
        axes[0].loglog(B, [r["us_per_trajectory_step"] for r in sub], style, label=f"{path}, BLAS threads {threads}")
        if path.startswith("generic"):
            axes[1].semilogx(B, [r["flop_fraction"] for r in sub], style, label=f"BLAS threads {threads}")
        axes[0].axhline(sub[0]["loop_us_per_trajectory_step"], color=axes[0].lines[-1].get_color(), lw=0.6, alpha=0.6)
    axes[0].set(xlabel="batch size B", ylabel="µs per trajectory-step", title="(a) NGD, n=6, T=8, d=10")
    axes[0].legend()
    axes[1].set(xlabel="batch size B", ylabel="fraction of the flop limit", title="(b) generic path", ylim=(0, None))
    axes[1].legend()
    fig.tight_layout()
    return fig


def batching_table(core) -> str:
    """Markdown: the best cost per trajectory-step of each path, and its speed-up over the loop."""
    if not (core and "batching" in core):
        return ""
    lines = ["| path, BLAS threads | best µs per trajectory-step | × the Python loop | flop fraction at B ≥ 1024 |"]
    lines.append("|---|---|---|---|")
    for key, v in core["batching"]["best"].items():
        lines.append(
            f"| {key} | {v['us_per_trajectory_step']:.3g} | {v['speedup_vs_loop']:.0f} | "
            f"{v['flop_fraction']:.2f} (B = {v['B']}) |"
        )
    lines += [
        "",
        f"A 1000 × 1000 matrix product runs at {core['batching']['square_matmul_gflops']:.1f} GFLOP/s on this "
        "machine; the step's products are far smaller and reach less.",
    ]
    return "\n".join(lines)


def scaling_figure(core):
    """Cost per trajectory-step against n, T and d (log-log, with fitted exponents), and the total
    time against the number of steps."""
    from matplotlib.ticker import NullFormatter

    fig, axes = _figure(4, (14, 3.6))
    if not (core and "scaling" in core):
        for ax in axes:
            no_data(ax)
        return fig
    sc = core["scaling"]
    for ax, var in zip(axes[:3], ("n", "T", "d")):
        for path, style in (("rank-one", "o-"), ("generic", "s--")):
            sub = [r for r in sc[var]["rows"] if r["path"] == path]
            if len(sub) >= 2:
                label = f"{path}: exponent {sc[var]['exponent'][path]:.2f}"
                ax.loglog([r["value"] for r in sub], [r["us_per_trajectory_step"] for r in sub], style, label=label)
        ax.set(xlabel=var, title=f"cost against {var}")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.legend()
    axes[0].set_ylabel(f"µs per trajectory-step (B = {sc['B']})")
    st = sc["steps"]
    axes[3].loglog(
        [r["value"] for r in st["rows"]],
        [r["seconds"] for r in st["rows"]],
        "o-",
        label=f"exponent {st['exponent']:.2f}",
    )
    axes[3].set(xlabel="steps", ylabel="seconds", title="total time against steps")
    axes[3].legend()
    fig.tight_layout()
    return fig


SVM_SOLVERS = (
    ("cvxpy_fro_ms", "Frobenius, cvxpy (CLARABEL)", "o-"),
    ("max_margin_fro_ms", "Frobenius, al.max_margin (NNLS)", "o--"),
    ("cvxpy_nuc_clarabel_ms", "nuclear, cvxpy CLARABEL", "s-"),
    ("nuc_scs_ms", "nuclear, cvxpy SCS (DPP)", "s--"),
)


def svm_figure(core):
    """Milliseconds per SVM solve against n·T and against d, per solver, with fitted exponents."""
    fig, axes = _figure(2, (11, 4))
    if not (core and "svm" in core):
        no_data(axes[0]), no_data(axes[1])
        return fig
    sv = core["svm"]
    for ax, axis in zip(axes, ("nT", "d")):
        rows = [r for r in sv["rows"] if r["axis"] == axis and r["status"] == "optimal"]
        for col, label, style in SVM_SOLVERS:
            sub = [r for r in rows if col in r]
            if sub:
                a = sv["exponents"].get(f"{col} vs {axis}", float("nan"))
                ax.loglog([r[axis] for r in sub], [r[col] for r in sub], style, label=f"{label}: exponent {a:.2f}")
        ax.set(xlabel="n·T (d = 12)" if axis == "nT" else "d (n = 6, T = 8)", ylabel="ms per solve")
        ax.legend()
    fig.tight_layout()
    return fig


def svm_and_memory_notes(core) -> str:
    """Markdown: the cost of many W-SVMs by each route, and the memory of a batched run."""
    parts = []
    if core and "svm" in core:
        m = core["svm"]["many"]
        parts.append(
            f"**{m['seeds']} W-SVMs, one per seed** (n=6, T=8, d=10, {m['feasible']} feasible): rebuilding the cvxpy "
            f"problem for each costs {m['rebuild_ms_per_solve']:.1f} ms per solve; one DPP problem with the constraint "
            f"matrix as a `cvxpy.Parameter`, built once, {m['dpp_ms_per_solve']:.1f} ms (largest relative difference "
            f"{m['dpp_max_relerr']:.0e}); the NNLS least-distance solve {m['nnls_ms_per_solve']:.2f} ms, and "
            f"`al.max_margin` with it {m['max_margin_ms_per_solve']:.2f} ms (largest relative difference to cvxpy "
            f"{m['max_margin_max_relerr']:.0e}, which is cvxpy's accuracy)."
        )
    if core and "memory" in core:
        mem = core["memory"]
        lines = [
            f"**Memory** of a batched run ({mem['problem']}, S = {mem['S']} problems, {mem['steps']} steps, "
            "fresh process):",
            "",
            "| record_every | recorded states | stored θ (MiB) | peak RSS (MiB) |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {r['record_every']} | {r['recorded']} | {r['stored_theta_mib']:.1f} | {r['peak_rss_mib']:.0f} |"
            for r in mem["rows"]
        ]
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def local_converge_figure(core):
    """The rebuilt [TFSVM] local-convergence experiment's time by stage (one process) and in two
    processes, from ``make bench``; and a Markdown note with when it was measured and its results.

    No ratio against the official code here: ``core.json`` holds only attnlib's times (and, as
    context, the official time of another day with its date and machine); the ratio comes from a
    side-by-side run (:func:`side_by_side_table`).
    """
    fig, ax = _figure(1, (8, 3.2))
    lc = core.get("local_converge") if core else None
    if not (lc and "one_process" in lc and not core.get("quick")):
        no_data(ax, "no full benchmark run")
        fig.tight_layout()
        return fig, ""
    one, two = lc["one_process"], lc["two_processes"]
    stages = {k: v for k, v in one["stages"].items() if k != "total"}
    left = 0.0
    for name, value in stages.items():
        ax.barh(["one process"], [value], left=left, label=name)
        left += value
    ax.barh(["two processes (W | K, Q)"], [two["seconds"]], color="0.5", label="two halves at once")
    ax.set(xlabel="seconds", title="attnlib, inside one Python process (imports not included)")
    ax.legend(ncol=3)
    fig.tight_layout()
    w, kq = lc["results"]["W"], lc["results"]["KQ"]
    seeds = lc["setting"]["seeds"]
    when = lc.get("measured", {})
    note = (
        f"Measured {when.get('utc', 'at an unknown time')} UTC (load average "
        f"{when.get('load_before', [float('nan')])[0]:.1f}): attnlib takes **{one['seconds']:.1f} s** in one "
        f"process and **{two['seconds']:.1f} s** with its two halves in two processes, inside a process that "
        f"has already imported it. The batched nuclear-norm SVMs agree with "
        f"CLARABEL to {lc['nuclear_batched_vs_clarabel_max_relerr']:.0e} (relative). Results: {w['not_opt']} of "
        f"{seeds} `W` runs and {kq['not_opt']} of {seeds} `K Qᵀ` runs end on a selection other than the optimal "
        f"one; median correlation of the final `W` with its Frobenius W-SVM {w['median_corr_fro']:.4f}, with "
        f"its nuclear-norm SVM {w['median_corr_nuc']:.4f}; for `W = K Qᵀ`, {kq['median_corr_fro']:.4f} and "
        f"{kq['median_corr_nuc']:.4f} ([TFSVM]: the factorisation goes to the nuclear-norm SVM)."
    )
    ref = lc.get("official_reference")
    if ref:
        note += (
            f" For context only, not compared: the official notebook took {ref['seconds']:.0f} s on "
            f"{ref['measured_utc']} ({ref['machine']}): another day, another run, not comparable (on one "
            "machine type the official time drifted by a factor 1.7 between two days)."
        )
    return fig, note


SIDE_BY_SIDE_KINDS = ("official", "attnlib_1", "attnlib_2")


def side_by_side_rounds(sbs) -> list[dict]:
    """The rounds of a side-by-side result (``benchmarks/results/side_by_side.json``), each with its
    three whole-process times, the load before each, and the ratios recomputed from them.

    Returns ``[]`` unless the file says its runs were measured together and every round holds one
    run of each kind (official, attnlib with 1 and 2 processes): a ratio is only ever formed
    between runs of one round.

    >>> rec = lambda kind, s: {"kind": kind, "seconds": s, "load_before": {"utc": "t", "load_average": [1, 1, 1]}}
    >>> one_round = [rec("official", 170.0), rec("attnlib_1", 1.7), rec("attnlib_2", 1.0)]
    >>> sbs = {"measured_together": True, "rounds": [one_round]}
    >>> [round(r["ratio_2"]) for r in side_by_side_rounds(sbs)]
    [170]
    >>> side_by_side_rounds({"rounds": sbs["rounds"]})  # not measured together: no rounds, no ratio
    []
    """
    if not (isinstance(sbs, dict) and sbs.get("measured_together") is True and sbs.get("rounds")):
        return []
    out = []
    for records in sbs["rounds"]:
        by_kind = {rec.get("kind"): rec for rec in records}
        if sorted(by_kind) != sorted(SIDE_BY_SIDE_KINDS) or len(records) != len(SIDE_BY_SIDE_KINDS):
            return []
        seconds = {k: float(by_kind[k]["seconds"]) for k in SIDE_BY_SIDE_KINDS}
        out.append(
            dict(
                utc=records[0]["load_before"]["utc"],  # the round's first run (the order rotates)
                seconds=seconds,
                load={k: by_kind[k]["load_before"]["load_average"][0] for k in SIDE_BY_SIDE_KINDS},
                ratio_1=seconds["official"] / seconds["attnlib_1"],
                ratio_2=seconds["official"] / seconds["attnlib_2"],
            )
        )
    return out


def side_by_side_table(sbs) -> str:
    """Markdown: the official notebook and attnlib timed together, round by round, with the date,
    the machine, the load average before each run and the ratios of that round (and their median)."""
    rounds = side_by_side_rounds(sbs)
    if not rounds:
        return (
            "*No side-by-side measurement found (`python benchmarks/side_by_side.py --official-dir … "
            "--official-python …`): no ratio against the official code is shown.*"
        )
    m, st = sbs["machine"], sbs["setting"]
    lines = [
        f"Measured together from **{sbs['started_utc']} to {sbs['finished_utc']} UTC** on `{m['node']}`: "
        f"{m['cpu']}, {m['cpus']} CPUs. Official: {sbs['official']['repository']} at "
        f"`{sbs['official']['commit'][:8]}`, {sbs['official']['versions']}; attnlib at "
        f"`{sbs['attnlib']['commit'][:8]}`, {sbs['attnlib']['versions']}. RUN = {st['runs']} data sets, "
        f"ITN = {st['steps']} steps; every time is a whole process (start, imports, the experiment)."
        + (
            " Both sides ran from byte-compiled sources, compiled before the first round."
            if sbs.get("bytecode")
            else ""
        )
        + (
            ""
            if sbs.get("complete", True)
            else f" **Cut short: {len(rounds)} of the {sbs.get('rounds_asked', '?')} rounds asked for.**"
        ),
        "",
        "| round (start, UTC) | official (s) | attnlib, 1 process (s) | attnlib, 2 processes (s) | "
        "official / attnlib (1) | official / attnlib (2) | load average before each |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rounds:
        s, ld = r["seconds"], r["load"]
        lines.append(
            f"| {r['utc']} | {s['official']:.1f} | {s['attnlib_1']:.2f} | {s['attnlib_2']:.2f} | "
            f"{r['ratio_1']:.0f}× | {r['ratio_2']:.0f}× | "
            f"{ld['official']:.1f} / {ld['attnlib_1']:.1f} / {ld['attnlib_2']:.1f} |"
        )
    if len(rounds) > 1:
        med = lambda key: float(np.median([r[key] for r in rounds]))  # noqa: E731
        lines.append(f"| median of the rounds' ratios | | | | {med('ratio_1'):.0f}× | {med('ratio_2'):.0f}× | |")
    return "\n".join(lines)


PROFILE_CATEGORIES = ("imports", "train", "regularization_path", "svm", "figures", "animations", "other")


def book_times_figure(summaries: list[dict], profile):
    """(a) each chapter's execution time in the last book build; (b) a profile's breakdown of each
    chapter's time by kind of work. Returns the figure and a Markdown note."""
    fig, axes = _figure(2, (12, 4))
    note = ""
    if summaries:
        names = [Path(s["notebook"]).stem for s in summaries]
        axes[0].barh(names, [s["duration_s"] for s in summaries], color="0.4")
        axes[0].invert_yaxis()
        axes[0].set(xlabel="seconds (papermill execution)", title="(a) last book build")
        note = (
            f"Last book build: {len(summaries)} chapters, {sum(s['duration_s'] for s in summaries):.0f} s "
            "of execution in total (executed two at a time, so the wall time is shorter)."
        )
    else:
        no_data(axes[0], "no book build found")
    if profile:
        rows = [r for r in profile["notebooks"] if r.get("ok")]
        names = [Path(r["notebook"]).stem for r in rows]
        left = np.zeros(len(rows))
        for cat in PROFILE_CATEGORIES:
            vals = np.array([r["breakdown_s"].get(cat, 0.0) for r in rows])
            if vals.any():
                axes[1].barh(names, vals, left=left, label=cat)
                left += vals
        axes[1].invert_yaxis()
        axes[1].set(xlabel="seconds", title=f"(b) profile of {profile['measured_utc']} UTC")
        axes[1].legend()
        note += (
            f" Profile run: a Jupyter kernel takes {profile['kernel_start_s']:.1f} s to start (not included in (b)); "
            f"load average {profile['load_average_before'][0]:.1f} before and "
            f"{profile['load_average_after'][0]:.1f} after."
        )
    else:
        no_data(axes[1], "no profile (python benchmarks/book_profile.py)")
    fig.tight_layout()
    return fig, note


def measure_batching(prob, batch_sizes, work: int, repeats: int, rng) -> list[dict]:
    """Seconds per batched NGD step at each batch size B, on ``prob``'s rank-one factors and on its
    generic features A, next to the two matrix products a step needs (the flop limit).

    Each size runs ``max(3, min(100, work // B))`` steps from B random starts; a row holds
    ``B``, ``steps`` and the seconds per step of ``generic``, ``rank_one`` and ``matmul`` (the faster
    of the default BLAS threads and one thread: threads fight over a loaded machine's cores).
    """
    generic = TokenSelectionProblem(prob.A, prob.gamma, prob.loss)  # the same problem without its factors
    shape = prob.A.shape[2:]  # the parameter's shape, (d, d) for self-attention
    size, nT = int(np.prod(shape)), prob.A.shape[0] * prob.A.shape[1]
    rows = []
    for B in batch_sizes:
        steps = int(max(3, min(100, work // B)))
        inits = rng.normal(size=(B, *shape))
        row = dict(B=B, steps=steps)
        for name, p in (("generic", generic), ("rank_one", prob)):
            run = lambda p=p, inits=inits, steps=steps: train(p, inits, steps, record_every=steps)  # noqa: E731
            row[name] = timed(run, repeats)["median"] / steps
        a, F = rng.normal(size=(B, size)), rng.normal(size=(size, nT))
        w, G = rng.normal(size=(B, nT)), rng.normal(size=(nT, size))
        matmul = []
        for threads in (None, 1):
            with blas_threads(threads):
                products = lambda a=a, F=F, w=w, G=G: [(a @ F, w @ G) for _ in range(10)]  # noqa: E731
                matmul.append(timed(products, repeats)["median"] / 10)
        row["matmul"] = min(matmul)
        rows.append(row)
    return rows


def live_batching_figure(rows: list[dict]):
    """(a) µs per trajectory-step against B for both paths and the matrix products alone;
    (b) the products' share of a step's time (how close a step comes to the flop limit)."""
    fig, axes = _figure(2, (11, 4))
    B = np.array([r["B"] for r in rows], float)
    per_traj = {k: np.array([r[k] for r in rows]) / B * 1e6 for k in ("generic", "rank_one", "matmul")}
    axes[0].loglog(B, per_traj["generic"], "o-", label="generic features A (n·T·d² numbers)")
    axes[0].loglog(B, per_traj["rank_one"], "s--", label="rank-one factors (X, Z)")
    axes[0].loglog(B, per_traj["matmul"], "k:", label="the two matrix products alone")
    axes[0].set(xlabel="batch size B", ylabel="µs per trajectory-step", title="(a) cost per trajectory-step")
    axes[0].legend()
    axes[1].semilogx(B, per_traj["matmul"] / per_traj["generic"], "o-")
    axes[1].set(xlabel="batch size B", ylabel="matrix-product time / step time", title="(b) fraction of the flop limit")
    axes[1].set_ylim(0, None)
    fig.tight_layout()
    return fig
