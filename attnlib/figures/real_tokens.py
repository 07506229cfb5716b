"""Chapter 6 (real tokens): its figures.

Functions draw on a given matplotlib ``Axes`` (or make a figure) and return it; what several
chapters draw is :mod:`attnlib.figures.common`.
"""

from __future__ import annotations

import numpy as np

from .common import COLORS

__all__ = [
    "patch_images",
    "token_matrix",
    "KIND_COLORS",
    "svm_margins",
    "selection_panels",
    "offset_growth",
    "attention_maps",
    "joint_curves",
    "race_curves",
]


def patch_images(
    ax,
    images,
    patch: int,
    weights=None,
    boxes=None,
    frames=None,
    titles=None,
    ncols: int | None = None,
    grid: bool = False,
    gap: int = 2,
):
    """Draw images (k, H, W) side by side in ONE axes, with per-patch overlays (a fast montage).

    Args:
        images: (k, H, W) pixels in [0, 1] (e.g. scikit-learn digits), or one image (H, W).
        patch: patch side in pixels; patches are numbered row-major in each image.
        weights: (k, T) values in [0, 1] per patch (an attention map), drawn as an orange veil.
        boxes: per image, a patch index or a list of ``(index, colour)`` or
            ``(index, colour, linestyle)``: outlined patches.
        frames: per image, ``None`` or a colour for a frame round the image (e.g. a support vector).
        titles: per image, a short text drawn above it.
        ncols: images per row (all in one row by default).  grid: draw the patch grid.
        gap: blank pixels between images.
    """
    import matplotlib
    from matplotlib.patches import Rectangle

    images = np.asarray(images, float)
    if images.ndim == 2:
        images = images[None]
        weights = None if weights is None else np.asarray(weights, float)[None]
        boxes = None if boxes is None else [boxes]
        frames = None if frames is None else [frames]
        titles = None if titles is None else [titles]
    k, H, W = images.shape
    ncols = k if ncols is None else ncols
    nrows = -(-k // ncols)
    g = W // patch
    step_x, step_y = W + gap, H + gap + (3 if titles is not None else 0)
    canvas = np.full((nrows * step_y - gap, ncols * step_x - gap), np.nan)
    veil = np.zeros(canvas.shape + (4,))
    veil[..., :3] = (1.0, 0.5, 0.0)
    offsets = []
    for j in range(k):
        r, c = divmod(j, ncols)
        y0, x0 = r * step_y + (3 if titles is not None else 0), c * step_x
        offsets.append((y0, x0))
        canvas[y0 : y0 + H, x0 : x0 + W] = images[j]
        if weights is not None:
            w = np.clip(np.asarray(weights[j], float).reshape(H // patch, g), 0, 1)
            veil[y0 : y0 + H, x0 : x0 + W, 3] = 0.6 * np.repeat(np.repeat(w, patch, 0), patch, 1)
    cmap = matplotlib.colormaps["gray_r"].with_extremes(bad="white")
    ax.imshow(canvas, cmap=cmap, vmin=0, vmax=1, interpolation="nearest")
    if weights is not None:
        ax.imshow(veil, interpolation="nearest")
    for j, (y0, x0) in enumerate(offsets):
        if grid:
            for line in range(patch, W, patch):
                ax.plot([x0 + line - 0.5] * 2, [y0 - 0.5, y0 + H - 0.5], color="tab:blue", lw=1)
                ax.plot([x0 - 0.5, x0 + W - 0.5], [y0 + line - 0.5] * 2, color="tab:blue", lw=1)
        spec = None if boxes is None else boxes[j]
        spec = [] if spec is None else list(spec) if isinstance(spec, (list, tuple)) else [(spec, "tab:red")]
        for item in spec:
            t, color, style = (tuple(item) + ("-",))[:3]
            r, c = divmod(int(t), g)
            ax.add_patch(
                Rectangle(
                    (x0 + c * patch - 0.5, y0 + r * patch - 0.5), patch, patch, fill=False, ec=color, lw=2, ls=style
                )
            )
        if frames is not None and frames[j] is not None:
            ax.add_patch(Rectangle((x0 - 0.5, y0 - 0.5), W, H, fill=False, ec=frames[j], lw=4))
        if titles is not None and titles[j]:
            ax.text(x0 + W / 2 - 0.5, y0 - 1.2, titles[j], ha="center", va="bottom")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)
    for spine in ax.spines.values():
        spine.set_visible(False)
    return ax


def token_matrix(ax, tokens, pixels: int):
    """One sequence of tokens (T, d) as a matrix, one row per token, with a red line after the
    first ``pixels`` coordinates (e.g. a patch's pixels, then its one-hot position code)."""
    tokens = np.asarray(tokens, float)
    if tokens.ndim != 2 or not 0 < pixels < tokens.shape[1]:
        raise ValueError(f"tokens must be (T, d) with 0 < pixels < d, got {tokens.shape} and {pixels}")
    T, d = tokens.shape
    ax.imshow(tokens, cmap="gray_r", vmin=0, vmax=1, aspect="auto", interpolation="nearest")
    ax.axvline(pixels - 0.5, color="tab:red", lw=2)
    ax.set(xlabel=f"coordinate: {pixels} pixels | {d - pixels} position", ylabel="token = patch", yticks=range(T))
    ax.grid(False)
    return ax


#: Colours of the two attention models across a page: prompt attention p red, self-attention W blue.
KIND_COLORS = {"p": "tab:red", "W": "tab:blue"}


def svm_margins(ax, n_values, margins: dict, floor: float = 1e-4):
    """Margin ``1/‖θ_mm‖`` of an SVM against the number of samples, one curve per model.

    ``margins``: ``{kind: [margin or None per n]}`` (``None``: infeasible, drawn as a cross at
    ``floor``, a little higher for each further model); colours :data:`KIND_COLORS` (others grey).
    """
    from matplotlib.ticker import NullLocator

    for j, (kind, values) in enumerate(margins.items()):
        color = KIND_COLORS.get(kind, "0.4")
        ok = [(n, m) for n, m in zip(n_values, values) if m is not None]
        bad = [n for n, m in zip(n_values, values) if m is None]
        if ok:
            ax.plot(*zip(*ok), marker="os"[j % 2], color=color, label=f"{kind}-SVM margin")
        if bad:
            ax.plot(bad, [floor * (j + 1)] * len(bad), "x", color=color, ms=10, mew=2, label=f"{kind}-SVM infeasible")
    ax.set(xscale="log", yscale="log", xlabel="number of samples n", ylabel=r"margin $1/\|\theta_{mm}^\star\|$")
    ax.set_ylim(bottom=floor / 2)
    ax.set_xticks(list(n_values), [str(n) for n in n_values])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.legend()
    return ax


_RUN_STYLES = (("ngd", "zero", "o-"), ("gd", "zero", "s--"), ("ngd", "cone", "^-"))


def selection_panels(results: dict, feasible: dict, n_values, kind: str, T: int):
    """Three panels on what trained attention selects, against the number of samples n; a Figure.

    Left: fraction of samples whose selected token is the optimal one, per run (NGD and GD from
    zero, NGD from the cone), grey where the optimal selection's SVM is infeasible. Middle:
    ``1 − cos`` of the final parameter with the SVM of its own selection (``omc_sel``), and of the
    NGD run from zero with the optimal selection's SVM (``omc_opt``, black). Right: score rank of
    the selected token in its sample (0 = optimal), NGD from zero.

    ``results``: ``(kind, n, method, start) →`` dicts with ``agree``, ``omc_sel``, ``omc_opt``,
    ``rank`` (as :attr:`attnlib.experiments.real_tokens.SelectionStudy.results`); ``feasible``: ``(kind, n) → bool``.
    """
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for method, start, style in _RUN_STYLES:
        ns = [n for n in n_values if (kind, n, method, start) in results]
        rs = [results[kind, n, method, start] for n in ns]
        label = f"{method.upper()} from {start}"
        axes[0].plot(ns, [r["agree"] for r in rs], style, label=label)
        axes[1].plot(ns, [r["omc_sel"] for r in rs], style, label=f"{label}: own SVM")
    bad = [n for n in n_values if not feasible[kind, n]]
    if bad:
        span = (min(bad) / 1.2, max(n_values) * 1.2)
        axes[0].axvspan(*span, color="0.85", alpha=0.6, lw=0, label="optimal SVM infeasible")
    ns = [n for n in n_values if feasible[kind, n]]
    omc_opt = [results[kind, n, "ngd", "zero"]["omc_opt"] for n in ns]
    axes[1].plot(ns, omc_opt, "kx:", label="NGD from zero: optimal SVM")
    bottom = np.zeros(len(n_values))
    for r in range(T):
        share = np.array([np.mean(results[kind, n, "ngd", "zero"]["rank"] == r) for n in n_values])
        if share.any():
            color, label = plt.cm.viridis(r / max(T - 1, 1)), f"rank {r}" + " (optimal)" * (r == 0)
            axes[2].bar(range(len(n_values)), share, bottom=bottom, color=color, label=label)
        bottom += share
    axes[0].set(xscale="log", ylabel="fraction with selected = optimal", ylim=(0, 1.05))
    axes[0].set_title("does it select the optimal token?")
    axes[1].set(xscale="log", yscale="log", ylabel=r"$1-\cos$")
    axes[1].set_title(r"alignment with $\theta_{mm}(\hat\alpha)$ of its own selection")
    axes[2].set(ylabel="fraction of samples", ylim=(0, 1))
    axes[2].set_xticks(range(len(n_values)), [str(n) for n in n_values])
    axes[2].set_title("NGD from zero: score rank of the selected token")
    for ax, loc in zip(axes, ("lower left", "best", "lower right")):
        ax.set_xlabel("samples n")
        ax.legend(loc=loc)
    for ax in axes[:2]:
        ax.set_xticks(list(n_values), [str(n) for n in n_values])
        ax.xaxis.set_minor_locator(plt.NullLocator())
    fig.suptitle({"p": "prompt attention p", "W": "self-attention W"}.get(kind, kind), fontsize=11)
    fig.tight_layout()
    return fig


def offset_growth(ax, curves, n_values, title: str = ""):
    """Offset from a reference line against the norm, both relative to a window's start, log-log.

    ``curves``: dicts with ``n``, ``norm``, ``offset`` and ``wrong`` (or ``None``) as
    :meth:`attnlib.experiments.real_tokens.SelectionStudy.offset_curves` returns them: the offset from the run's own SVM
    (coloured by ``n`` in ``n_values``) and from a wrong reference (orange dotted). Reference powers
    ``offset ∝ norm^e`` for e = 0 (grey, bounded), 1/2 (red, the threshold), 1 (black, fixed angle).
    """
    import matplotlib.pyplot as plt

    top = 2.0
    for c in curves:
        color = plt.cm.viridis(list(n_values).index(c["n"]) / max(len(n_values) - 1, 1))
        ax.plot(c["norm"], c["offset"], color=color, label=f"n={c['n']}, own SVM")
        if c["wrong"] is not None:
            ax.plot(c["norm"], c["wrong"], color="tab:orange", ls=":", lw=3, label=f"n={c['n']}, vs optimal SVM")
        top = max(top, float(c["norm"][-1]))
    g = np.geomspace(1, top, 30)
    for e, color in ((0.0, "0.5"), (0.5, "tab:red"), (1.0, "k")):
        ax.plot(g, g**e, color=color, lw=0.8, ls="-.", label=f"offset ~ norm^{e:g}")
    ax.set(xscale="log", yscale="log", xlabel=r"$\|\theta(t)\| / \|\theta(T/4)\|$", ylabel="offset / offset at T/4")
    ax.set_title(title)
    ax.legend(ncol=2)
    return ax


def attention_maps(ax, images, patch: int, attention, select, opt, titles=None, ncols=None):
    """Attention maps on images: the veil is the attention, the selected patch boxed red when it is
    the optimal one ``opt``, blue otherwise (with the optimal patch then dashed red). ``images``
    (k, H, W), ``attention`` (k, T), ``select`` and ``opt`` (k,). See :func:`patch_images`."""
    boxes = [[(s, "tab:red")] if s == o else [(s, "tab:blue"), (o, "tab:red", "--")] for s, o in zip(select, opt)]
    return patch_images(ax, images, patch, weights=attention, boxes=boxes, titles=titles, ncols=ncols)


def joint_curves(axes, steps, v_cos, accuracy, angle_full, angle_relaxed):
    """Joint training over iterations, on two axes: ``1 − cos(v, v_mm)`` (blue, log) with the training
    accuracy (dashed, right axis); the angles in degrees between ``p`` (red) and the full (solid) and
    relaxed (dotted) attention SVMs. All arrays (R,) over ``steps``."""
    ax, right = axes
    ax.plot(steps, 1 - np.asarray(v_cos), color=COLORS["v"], label=r"$1-\cos(v(t), v_{mm})$ (v, blue)")
    ax.set(yscale="log", xlabel="iteration", ylabel=r"$1-\cos$", title="the head heads for the label SVM")
    twin = ax.twinx()
    twin.plot(steps, accuracy, color="0.3", ls="--", label="training accuracy (right axis)")
    twin.set(ylim=(0, 1.05), ylabel="training accuracy")
    twin.grid(False)
    ax.legend(handles=ax.get_lines() + twin.get_lines(), loc="center right")
    right.plot(steps, angle_full, color=COLORS["p"], label="p (red) to the full p-SVM")
    right.plot(steps, angle_relaxed, color=COLORS["p"], ls=":", label="p (red) to the relaxed p-SVM")
    right.set(xlabel="iteration", ylabel="angle (degrees)", title="the attention, slower")
    right.legend()
    return axes


#: One colour per optimizer pair of :func:`race_curves` (GD/SGD, NGD/SNGD, Polyak/SPS, then controls).
METHOD_COLORS = ("0.35", "tab:red", "tab:blue", "0.35", "tab:red", "tab:blue", "tab:green", "tab:purple")


def race_curves(ax, steps, curves: dict, ylabel: str, log_y: bool = False, title: str = ""):
    """Median (line) and range (band) over seeds of one measure per optimizer, against iterations.

    Args: ``steps`` (R,) recorded steps (step 0 is drawn at 1 on the log axis); ``curves``
    ``{label: (R, S)}``, labels starting with "S" (the mini-batch versions) dashed; ``ylabel``,
    ``log_y`` (log scale for a loss), ``title``.
    """
    x = np.maximum(np.asarray(steps, float), 1.0)
    for k, (label, values) in enumerate(curves.items()):
        values = np.asarray(values, float)
        colour = METHOD_COLORS[k % len(METHOD_COLORS)]
        style = "--" if label.startswith("S") else "-"
        ax.plot(x, np.median(values, axis=1), style, color=colour, label=label)
        ax.fill_between(x, values.min(axis=1), values.max(axis=1), color=colour, alpha=0.12, linewidth=0)
    ax.set_xscale("log")
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel("iteration")
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    return ax
