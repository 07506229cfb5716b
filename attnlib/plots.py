"""The recurring figures: parameter paths in the key plane, and curves with seed spread.

Functions draw on a given matplotlib ``Axes`` and return it, so a notebook composes panels.
"""

from __future__ import annotations

import numpy as np

from .model import TokenSelectionProblem

__all__ = ["paths", "tokens", "direction", "band", "margin_strips", "COLORS", "SAMPLE_COLORS"]

#: Colours used across the book: global SVM red, local/secondary blue, paths grey.
COLORS = {"global": "tab:red", "local": "tab:blue", "path": "0.45", "p": "tab:red", "v": "tab:blue"}
#: One colour per sample (cycled), as :func:`tokens` draws them when ``n > 1``.
SAMPLE_COLORS = ["tab:red", "tab:green", "tab:purple", "tab:orange", "tab:brown", "tab:pink", "tab:cyan"]


def paths(ax, theta, color=None, arrow_every: int = 10, label=None, alpha: float = 0.9, lw: float = 1.4):
    """Draw trajectories ``theta`` (R, B, ≥2) in the plane of their first two coordinates.

    Arrows every ``arrow_every`` recorded steps show the direction of travel.
    """
    theta = np.asarray(theta, float)
    if theta.ndim != 3 or theta.shape[2] < 2:
        raise ValueError(f"theta must have shape (R, B, d>=2), got {theta.shape}")
    color = COLORS["path"] if color is None else color
    for b in range(theta.shape[1]):
        xy = theta[:, b, :2]
        ax.plot(xy[:, 0], xy[:, 1], color=color, lw=lw, alpha=alpha, label=label if b == 0 else None)
        for r in range(arrow_every, len(xy), arrow_every):
            ax.annotate(
                "",
                xy=xy[r],
                xytext=xy[r - 1],
                arrowprops=dict(arrowstyle="->", color=color, lw=lw, alpha=alpha),
            )
    return ax


def tokens(ax, prob: TokenSelectionProblem, select=None, annotate_scores: bool = True, size: float = 90):
    """Draw each sample's keys (first two feature coordinates): stars for the selected tokens.

    ``select`` defaults to the optimal tokens; one colour per sample, scores written beside.
    """
    sel = prob.opt if select is None else np.asarray(select)
    keys = prob.A.reshape(prob.n, prob.T, -1)[..., :2]
    cmap = SAMPLE_COLORS
    for i in range(prob.n):
        c = cmap[i % len(cmap)] if prob.n > 1 else "k"
        for t in range(prob.T):
            marker = "*" if t == sel[i] else "o"
            ax.scatter(
                *keys[i, t],
                marker=marker,
                s=size * (2 if marker == "*" else 0.6),
                color=c,
                zorder=5,
                edgecolor="k",
                linewidth=0.5,
            )
            if annotate_scores:
                ax.annotate(
                    f"{prob.gamma[i, t]:.3g}",
                    keys[i, t],
                    textcoords="offset points",
                    xytext=(6, 6),
                    fontsize=8,
                    color=c,
                )
    return ax


def direction(ax, theta, length: float, color=None, label=None, ls="--", lw: float = 2.0):
    """Draw the ray from the origin along the first two coordinates of ``theta``."""
    v = np.asarray(theta, float).ravel()[:2]
    v = v / np.linalg.norm(v)
    ax.plot(
        [0, length * v[0]],
        [0, length * v[1]],
        ls=ls,
        color=COLORS["global"] if color is None else color,
        lw=lw,
        label=label,
    )
    return ax


def band(ax, x, Y, color=None, label=None, quantiles=(0.1, 0.9), log: bool = True):
    """Median over the last axis of ``Y`` (R, S) against ``x`` (R,), with a quantile band."""
    Y = np.asarray(Y, float)
    lo, mid, hi = np.nanquantile(Y, [quantiles[0], 0.5, quantiles[1]], axis=-1)
    line = ax.plot(x, mid, color=color, label=label)[0]
    ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, lw=0)
    if log:
        ax.set_yscale("log")
    return ax


def margin_strips(
    ax,
    prob: TokenSelectionProblem,
    theta_mm,
    select=None,
    extent: float = 100.0,
    alpha: float = 0.0,
    ring_neighbors: bool = True,
    label: bool = True,
):
    """Draw each sample's margin strip of an ATT-SVM solution in the key plane.

    For sample ``i`` the strip lies between the level lines ``⟨θ̂, k⟩ = ⟨θ̂, k_iα_i⟩`` (through
    the selected token, solid) and ``⟨θ̂, k⟩ = ⟨θ̂, k_iα_i⟩ − 1/‖θ_mm‖`` (one margin below,
    dashed), drawn in the sample's colour (:data:`SAMPLE_COLORS`) and shaded with ``alpha``, with
    ``θ̂ = θ_mm/‖θ_mm‖``. The SVM constraints say exactly that no other token of sample ``i``
    enters its strip; the SVM-neighbours (active constraints) lie on its lower edge and are ringed.
    All strips have the width ``1/‖θ_mm‖``, the margin, which no other direction can exceed for
    every sample at once. The margin separates tokens *inside* each sample, so the strips of
    different samples sit at different heights.

    Args:
        prob: a problem whose features live in their first two coordinates (the key plane of the
            fixed-head instances); otherwise the picture would be a projection, and this raises.
        theta_mm: (d,) the SVM solution (e.g. ``max_margin(prob).theta``).
        select: (n,) the selection it was solved for (default: the optimal tokens).
        extent: half-length of the drawn lines (clip with the axes limits).
        ring_neighbors: circle the SVM-neighbour tokens (constraint value 1 up to ``1e-6``).
        alpha: opacity of the shading between the two lines (0: lines only, the default; shading
            overlapping strips muddies the picture).
        label: add legend entries for the lines, the shading (if any) and the rings.
    """
    A = prob.A.reshape(prob.n, prob.T, -1)
    if A.shape[-1] < 2 or np.any(A[..., 2:] != 0):
        raise ValueError("margin_strips needs features that live in their first two coordinates (the key plane)")
    theta = np.asarray(theta_mm, float).ravel()
    if theta.shape != (A.shape[-1],):
        raise ValueError(f"theta_mm must have {A.shape[-1]} entries, got {theta.shape}")
    sel = prob.opt if select is None else np.asarray(select)
    keys = A[..., :2]
    w = theta[:2]
    size = np.linalg.norm(w)
    unit = w / size
    perp = np.array([-unit[1], unit[0]])
    along = np.linspace(-extent, extent, 2)
    ring_label = "SVM-neighbour (on its input's margin)" if label else None
    for i in range(prob.n):
        color = SAMPLE_COLORS[i % len(SAMPLE_COLORS)] if prob.n > 1 else "k"
        top = unit @ keys[i, sel[i]]
        bottom = top - 1.0 / size
        hi = top * unit[None, :] + along[:, None] * perp[None, :]
        lo = bottom * unit[None, :] + along[:, None] * perp[None, :]
        if alpha > 0:
            poly = np.vstack([hi, lo[::-1]])
            strip_label = "margin strip of each input (width = margin)" if (label and i == 0) else None
            ax.fill(poly[:, 0], poly[:, 1], color=color, alpha=alpha, lw=0, label=strip_label)
        first = label and i == 0
        ax.plot(
            hi[:, 0],
            hi[:, 1],
            color=color,
            lw=1.0,
            ls="-",
            alpha=0.8,
            label="level of each input's selected token" if first else None,
        )
        ax.plot(
            lo[:, 0], lo[:, 1], color=color, lw=1.0, ls="--", alpha=0.8, label="one margin below it" if first else None
        )
        if ring_neighbors:
            values = (keys[i, sel[i]] - keys[i]) @ w
            active = np.abs(values - 1.0) <= 1e-6 * np.maximum(1.0, np.abs(values))
            active[sel[i]] = False
            for t in np.flatnonzero(active):
                ax.scatter(*keys[i, t], s=260, facecolor="none", edgecolor="k", lw=1.2, zorder=6, label=ring_label)
                ring_label = None
    return ax


#: Colours of :func:`basin_image`: global basin, local basin(s), undecided within the horizon.
BASIN_COLORS = {"global": "#f4a6a6", "local": "#a6c8f4", "undecided": "k"}


def basin_image(ax, kind, extent, legend: bool = True, undecided_size: float = 6.0):
    """Draw a basin map: ``kind`` (G_y, G_x) with 0 global, 1 local, −1 undecided.

    Rows of ``kind`` run along the second coordinate (``kind[j, i]`` is the initialisation
    ``(x_i, y_j)``); ``extent = (x_min, x_max, y_min, y_max)`` are the grid's end points. The two
    basins are filled (global red, local blue, the colours of :data:`COLORS`); undecided
    initialisations are drawn as black dots on top, so that even a single one is visible.
    """
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    kind = np.asarray(kind)
    if kind.ndim != 2:
        raise ValueError(f"kind must be a 2-D grid of labels, got shape {kind.shape}")
    x0, x1, y0, y1 = extent
    gy, gx = kind.shape
    dx = (x1 - x0) / max(gx - 1, 1) / 2
    dy = (y1 - y0) / max(gy - 1, 1) / 2
    cmap = ListedColormap([BASIN_COLORS["global"], BASIN_COLORS["local"]])
    ax.imshow(
        np.where(kind == 1, 1, 0),
        origin="lower",
        extent=(x0 - dx, x1 + dx, y0 - dy, y1 + dy),
        cmap=cmap,
        vmin=0,
        vmax=1,
        interpolation="nearest",
        aspect="auto",
    )
    jj, ii = np.nonzero(kind < 0)
    if jj.size:
        xs = np.linspace(x0, x1, gx)[ii]
        ys = np.linspace(y0, y1, gy)[jj]
        ax.scatter(xs, ys, s=undecided_size, color=BASIN_COLORS["undecided"], zorder=4)
    if legend:
        handles = [
            Patch(color=BASIN_COLORS["global"], label="→ global p_mm*"),
            Patch(color=BASIN_COLORS["local"], label="→ local p_mm(α)"),
            Patch(color=BASIN_COLORS["undecided"], label=f"undecided ({jj.size})"),
        ]
        ax.legend(handles=handles, loc="upper right", fontsize=8, framealpha=0.9)
    return ax


__all__ += ["basin_image", "BASIN_COLORS"]


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
            ax.text(x0 + W / 2 - 0.5, y0 - 1.2, titles[j], ha="center", va="bottom", fontsize=7)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)
    for spine in ax.spines.values():
        spine.set_visible(False)
    return ax


__all__ += ["patch_images"]
