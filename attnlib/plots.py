"""The recurring figures: parameter paths in the key plane, and curves with seed spread.

Functions draw on a given matplotlib ``Axes`` and return it, so a notebook composes panels.
"""

from __future__ import annotations

import numpy as np

from .model import TokenSelectionProblem

__all__ = [
    "paths",
    "tokens",
    "direction",
    "band",
    "margin_strips",
    "COLORS",
    "SAMPLE_COLORS",
    "basin_image",
    "BASIN_COLORS",
    "patch_images",
    "joint_paths",
    "joint_angles",
    "selection_probabilities",
    "loss_angles",
    "arc_positions",
    "joint_run_figure",
    "gradient_cosine_map",
    "path_directions",
    "direction_error",
    "loss_gap_by_subtraction",
    "margin_deficit",
    "singular_value_spectra",
    "attention_on_keys",
    "token_matrix",
    "KIND_COLORS",
    "svm_margins",
    "selection_panels",
    "offset_growth",
    "attention_maps",
    "joint_curves",
    "radius_angles",
    "METHOD_COLORS",
    "finish",
    "method_bands",
    "rate_panels",
    "separators",
    "fit_residuals",
    "running_slope",
    "selection_fractions",
    "polyak_failure",
    "paths_to_two_directions",
    "cone_run_curves",
    "basin_maps_panels",
    "basin_explorer_frame",
    "selection_alignment_curves",
    "local_path_curves",
    "path_with_direction_error",
    "NORM_COLORS",
    "margin_deficits_and_spectra",
    "rates_overview",
    "start_paths",
    "direction_error_curves",
    "ngd_and_gd_overview",
    "input_gaps_by_angle",
    "offset_study",
    "random_start_runs",
    "gd_against_ngd",
    "VERDICT_COLORS",
    "check_values_by_seed",
    "gap_descent_and_w_panels",
    "norm_and_offset_settling",
]

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


def _joint_labels(plain_text: bool) -> dict:
    # Plain-text labels skip mathtext layout, which dominates the cost of small explorer pictures.
    if plain_text:
        return dict(
            p="attention p(t)",
            v="head v(t)",
            vmm="label SVM v_mm",
            full="full p-SVM",
            pred="first-order p\u0302(\u03c1)",
        )
    return dict(
        p="attention $p(t)$",
        v="head $v(t)$",
        vmm=r"label SVM $v^{\mathrm{mm}}$",
        full=r"full p-SVM $p^{\mathrm{mm}}$",
        pred=r"first-order $\hat p(\rho)$",
    )


def joint_paths(ax, traj, svms, upto=None, predicted=None, arrow_every: int = 10, plain_text: bool = False):
    """Joint training in the key plane: the paths of ``p(t)`` (red) and ``v(t)`` (blue), and the SVMs.

    Args:
        traj: a :class:`attnlib.optim.JointTrajectory` with 2-D ``p`` and ``v`` (R, B, 2).
        svms: the data's :class:`attnlib.joint.JointSVMs`: draws the label SVM ``v_mm`` (dotted
            blue), the relaxed p-SVM (dashed red) and the full p-SVM (dashed grey; one red line when
            they coincide), the selected keys (filled: support vectors of ``v_mm``) and the other
            keys (squares).
        upto: draw the iterations ``≤ upto`` only (default: all).
        predicted: a direction drawn dash-dotted black (e.g. ``p̂(ρ)``), or None.
        plain_text: labels without mathtext (faster).
    """
    lab = _joint_labels(plain_text)
    shown = slice(None) if upto is None else np.asarray(traj.steps) <= upto
    p, v = traj.p[shown], traj.v[shown]
    length = 1.08 * max(np.linalg.norm(p, axis=-1).max(), np.linalg.norm(v, axis=-1).max())
    paths(ax, p, color=COLORS["p"], arrow_every=arrow_every, label=lab["p"])
    paths(ax, v, color=COLORS["v"], arrow_every=arrow_every, label=lab["v"])
    direction(ax, svms.label.v, length, color=COLORS["v"], label=lab["vmm"], ls=":")
    if svms.separation < 1e-3:
        direction(ax, svms.full.theta, length, color=COLORS["p"], label="full = relaxed p-SVM")
    else:
        direction(ax, svms.full.theta, length, color="0.5", label=lab["full"])
        direction(ax, svms.relaxed.theta, length, color=COLORS["p"], label="relaxed p-SVM")
    if predicted is not None:
        direction(ax, predicted, length, color="k", ls="-.", lw=1.2, label=lab["pred"])
    n, T = svms.keys.shape[:2]
    chosen = svms.keys[np.arange(n), svms.select]
    others = svms.keys[np.arange(T)[None, :] != np.asarray(svms.select)[:, None]]
    ax.scatter(chosen[:, 0], chosen[:, 1], c=["k" if s else "w" for s in svms.support], edgecolors="k", s=30, zorder=6)
    ax.scatter(others[:, 0], others[:, 1], marker="s", c="k", s=18, zorder=6)
    ax.set_aspect("equal")
    return ax


def joint_angles(ax, steps, p, svms, v=None, predicted=None, ylim=(1e-4, 200.0), plain_text: bool = False):
    """Angles (degrees, log scale) of ``p`` (R, 2) to the relaxed (red) and full (grey, dashed) p-SVMs.

    Also of ``v`` (R, 2) to ``v_mm`` (blue) if given, and of ``p`` to ``predicted`` (black,
    dash-dotted) if given, against ``steps`` (R,). Colours as :func:`joint_paths`.
    """
    from .joint import angle_degrees

    lab = _joint_labels(plain_text)
    ax.plot(steps, angle_degrees(p, svms.relaxed.theta), color=COLORS["p"], label="p to relaxed p-SVM")
    ax.plot(steps, angle_degrees(p, svms.full.theta), color="0.5", ls="--", label="p to full p-SVM")
    if predicted is not None:
        ax.plot(steps, angle_degrees(p, predicted), color="k", ls="-.", label="p to " + lab["pred"])
    if v is not None:
        ax.plot(steps, angle_degrees(v, svms.label.v), color=COLORS["v"], label="v to " + lab["vmm"])
    ax.set_yscale("log")
    ax.set_ylim(*ylim)
    ax.minorticks_off()  # labelled decades only: minor log ticks double the cost of the figure
    ax.set_xlabel("iteration")
    return ax


def selection_probabilities(ax, steps, mass, confidence):
    """Mean softmax probability of the selected tokens (red) and mean ``σ(y f)`` (blue) against ``steps``.

    ``mass``, ``confidence``: (R, n) per sample (:func:`attnlib.joint.selected_mass`,
    :func:`attnlib.joint.classifier_confidence` of one run).
    """
    ax.plot(steps, np.mean(mass, -1), color=COLORS["p"], label="mean softmax probability of the selected tokens")
    ax.plot(steps, np.mean(confidence, -1), color=COLORS["v"], label=r"mean logistic probability $\sigma(y f)$")
    ax.set_xlabel("iteration")
    return ax


def loss_angles(axes, trajectories: dict, svms, head_reference, colors=None):
    """Joint runs under several losses: angles of ``p`` (``axes[0]``) and ``v`` (``axes[1]``), log scale.

    ``trajectories``: ``{loss name: JointTrajectory}`` (first run of each drawn). Left: ``p`` to the
    relaxed (solid) and full (dashed) p-SVM; right: ``v`` to ``v_mm`` (solid) and to
    ``head_reference`` (dotted, e.g. ``Σ_i y_i x_iα_i``). One colour per loss.
    """
    from .joint import angle_degrees

    colors = colors or {"logistic": "tab:red", "exponential": "tab:orange", "linear": "tab:purple"}
    for name, traj in trajectories.items():
        c = colors.get(name)
        p, v = traj.p[:, 0], traj.v[:, 0]
        axes[0].plot(traj.steps, angle_degrees(p, svms.relaxed.theta), color=c, label=name)
        axes[0].plot(traj.steps, angle_degrees(p, svms.full.theta), color=c, ls="--")
        axes[1].plot(traj.steps, angle_degrees(v, svms.label.v), color=c, label=name)
        axes[1].plot(traj.steps, angle_degrees(v, head_reference), color=c, ls=":")
    axes[0].plot([], [], color="k", label="to relaxed p-SVM")
    axes[0].plot([], [], color="k", ls="--", label="to full p-SVM")
    axes[1].plot([], [], color="k", label=r"to $v^{\mathrm{mm}}$")
    axes[1].plot([], [], color="k", ls=":", label=r"to $\sum_i y_i x_{i\alpha_i}$")
    for ax, title in zip(axes, ("attention $p$", "head $v$")):
        ax.set(yscale="log", ylim=(1e-3, 200), xlabel="iteration", ylabel="angle (degrees)", title=title)
        ax.minorticks_off()
        ax.legend(fontsize=8)
    return axes


def arc_positions(ax, series, bands: bool = True):
    """Positions on the arc from the relaxed (0) to the full (1) p-SVM, one column per instance.

    ``series``: a list of ``(positions, label, style)``: ``positions`` one array-like per column
    (:func:`attnlib.joint.arc_position`), ``style`` keyword arguments of ``ax.scatter``. With
    ``bands``, shades the quarter-separation zones of the two SVMs (red: relaxed, grey: full).
    """
    if bands:
        ax.axhspan(-0.25, 0.25, color=COLORS["p"], alpha=0.12, lw=0, label="follows the relaxed p-SVM")
        ax.axhspan(0.75, 1.25, color="0.5", alpha=0.15, lw=0, label="follows the full p-SVM")
    columns = 0
    for positions, label, style in series:
        for x, pos in enumerate(positions):
            pos = np.atleast_1d(np.asarray(pos, float))
            ax.scatter(np.full(pos.shape, x), pos, label=label if x == 0 else None, **style)
        columns = max(columns, len(positions))
    ax.axhline(0, color=COLORS["p"], lw=0.8)
    ax.axhline(1, color="0.5", lw=0.8, ls="--")
    ax.set_xticks(range(columns))
    ax.set_ylabel("position of $p$: 0 = relaxed, 1 = full")
    return ax


def joint_run_figure(traj, svms, predicted, title: str, figsize=(9.5, 3.8)):
    """One joint run as a two-panel Figure: :func:`joint_paths` and :func:`joint_angles` of ``p``.

    Plain-text labels (fast enough to redraw on every change of an explorer). ``predicted``: the
    first-order direction drawn in both panels. Returns the Figure.
    """
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=figsize)
    joint_paths(ax, traj, svms, predicted=predicted, arrow_every=max(1, len(traj.steps) // 8), plain_text=True)
    ax.legend(fontsize=7, loc="center right")
    ax.set_title(title, fontsize=10)
    joint_angles(ax2, traj.steps, traj.p[:, 0], svms, predicted=predicted, ylim=(1e-3, 200.0), plain_text=True)
    ax2.set_yticks([1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0], ["0.001", "0.01", "0.1", "1", "10", "100"])
    ax2.minorticks_off()
    ax2.set_ylabel("angle of p (degrees)")
    ax2.legend(fontsize=7, loc="lower left")
    fig.subplots_adjust(wspace=0.3)
    return fig


def gradient_cosine_map(ax, grid, cos, label=True):
    """Map of ``cos(∇L(p), d)`` over a square grid of ``p`` in the key plane, with its zero level.

    ``grid`` (G,) coordinates of both axes; ``cos`` (G·G,) or (G, G) with ``cos[a, b]`` at
    ``p = (grid[a], grid[b])`` (as :func:`attnlib.gradient_cosine` returns for the box
    ``np.column_stack([np.repeat(grid, G), np.tile(grid, G), ...])``). Blue where the gradient
    points against ``d`` (a descent direction along ``d``, the descent lemma), red where it fails;
    the black line is ``cos = 0``. Returns the image (for a colour bar).
    """
    grid = np.asarray(grid, float)
    cos = np.asarray(cos, float).reshape(grid.size, grid.size)
    image = ax.pcolormesh(grid, grid, cos.T, cmap="RdBu_r", vmin=-1, vmax=1, shading="nearest")
    if np.nanmin(cos) < 0 < np.nanmax(cos):
        ax.contour(grid, grid, cos.T, levels=[0.0], colors="k", linewidths=1.2)
    if label:
        ax.set(xlabel="$p_1$", ylabel="$p_2$")
    ax.set_aspect("equal")
    return image


# ---------------------------------------------------------------------- regularization paths


def path_directions(ax, directions, radii, length: float = 1.4, cmap: str = "viridis", colorbar: bool = True):
    """Arrows from the origin along the directions ``θ̄(R)/R`` of a regularization path, coloured by ``R``.

    Args:
        directions: (N, ≥2) unit directions (first two coordinates drawn), e.g. ``path.direction``.
        radii: (N,) the radii, increasing; the colour scale is logarithmic in ``R``.
        length: arrow length in data units.  colorbar: add a colour bar labelled with ``R``.
    """
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    directions = np.asarray(directions, float).reshape(len(radii), -1)
    norm = LogNorm(float(radii[0]), float(radii[-1]))
    colors = plt.get_cmap(cmap)(norm(np.asarray(radii, float)))
    for c, d in zip(colors, directions):
        ax.annotate("", xy=length * d[:2], xytext=(0, 0), arrowprops=dict(arrowstyle="->", color=c, lw=1.6))
    if colorbar:
        mappable = plt.cm.ScalarMappable(cmap=cmap, norm=norm)
        ax.figure.colorbar(mappable, ax=ax, label=r"radius $R$ of the arrow $\bar p(R)/R$")
    return ax


def direction_error(
    ax, radii, error, bound=None, others=None, color=None, label=None, scale=None, floor: float = 1e-20
):
    """A path's directional error ``1 − cos`` against ``R`` on log axes, with its bound and other instances.

    Args:
        radii: (N,).  error: (N,) ``1 − cos(θ̄(R), θ_mm)``, drawn with markers in ``color``.
        bound: (N,) the bound ``B(R)``, dashed in the same colour where it is below 1 (else ``None``).
        others: (K, N) errors of other instances, thin grey lines (label ``"other seeds"``).
        scale: (N,) factor applied to every curve (e.g. ``R²`` to show ``R²(1 − cos)``).
        floor: values are clipped below at ``floor`` (``1 − cos`` can be exactly 0 in floating point).
    """
    radii = np.asarray(radii, float)
    color = COLORS["global"] if color is None else color
    s = np.ones_like(radii) if scale is None else np.asarray(scale, float)
    for k, e in enumerate(np.atleast_2d(others) if others is not None else []):
        ax.loglog(radii, np.maximum(s * e, floor), color="0.6", lw=1, label="other seeds" if k == 0 else None)
    ax.loglog(radii, np.maximum(s * np.asarray(error, float), floor), "o-", color=color, label=label)
    if bound is not None:
        bound = np.asarray(bound, float)
        ax.loglog(radii, np.where(bound < 1, s * bound, np.nan), "--", color=color, label=r"bound $B(R)$")
    ax.set_xlabel("radius $R$")
    return ax


def loss_gap_by_subtraction(ax, radii, log_gap, subtracted, resolution: float):
    """The loss gap ``L − L*`` along a path, computed in log space and by subtracting the floor.

    Args: ``radii`` (N,); ``log_gap`` (N,) ``log(L − L*)``; ``subtracted`` (N,) ``L − L*`` computed as
    value minus floor (drawn where positive); ``resolution``: the float resolution of ``L``, dotted.
    """
    subtracted = np.asarray(subtracted, float)
    ax.semilogy(radii, np.exp(log_gap), "o-", label=r"$\mathcal{L}-\mathcal{L}_\star$ from attnlib (log space)")
    ax.semilogy(radii, np.where(subtracted > 0, subtracted, np.nan), "s--", label="value − floor (subtraction)")
    ax.axhline(resolution, color="k", lw=0.8, ls=":", label=r"float resolution of $\mathcal{L}$")
    ax.set_xscale("log")
    ax.set_xlabel("radius $R$")
    ax.set_ylabel(r"loss gap at $\bar p(R)$")
    return ax


def margin_deficit(ax, radii, rho, bound, other: float, color, label: str):
    """A path's margin deficit ``1 − ρ(R)`` (markers), its bound ``1 − ρ_lo(R)`` (dotted, where ``ρ_lo > 0``)
    and the deficit ``1 − other`` of a competing direction (dash-dot), all in ``color``, log axes."""
    bound = np.asarray(bound, float)
    ax.loglog(radii, 1 - np.asarray(rho, float), "o-", color=color, label=f"{label}: $1-\\rho$")
    ax.loglog(radii, np.where(bound > 0, 1 - bound, np.nan), ":", color=color, label=r"bound $1-\rho_{lo}(R)$")
    ax.axhline(1 - other, color=color, ls="-.", lw=0.8, label="other SVM in this norm")
    ax.set_xlabel("radius $R$")
    ax.set_ylabel(r"margin deficit $1-\rho$")
    return ax


def singular_value_spectra(ax, matrices, threshold: float | None = None, floor: float = 1e-14):
    """Normalised singular values ``s_k/s_1`` of matrices, one line each.

    Args: ``matrices``: ``{label: (M, color, marker)}``; ``threshold``: a rank threshold drawn dotted.
    """
    for label, (M, color, marker) in matrices.items():
        s = np.linalg.svd(np.asarray(M, float), compute_uv=False)
        k = np.arange(1, len(s) + 1)
        ax.semilogy(k, np.maximum(s / s[0], floor), marker + "-", color=color, label=label, ms=8, alpha=0.8)
    if threshold is not None:
        ax.axhline(threshold, color="k", lw=0.8, ls=":", label="rank threshold")
    ax.set_xlabel("singular value index")
    ax.set_ylabel(r"$s_k/s_1$")
    return ax


def attention_on_keys(ax, prob: TokenSelectionProblem, theta, theta_mm=None, ring_area: float = 900.0):
    """Keys in their plane (stars: optimal tokens, one colour per input) with the attention that ``θ`` gives.

    Each token gets a ring of area ``ring_area·σ_it(θ)``; a black arrow shows ``θ/‖θ‖`` and, if given,
    a dashed line the SVM direction ``θ_mm``. ``prob.A`` (n, T, ≥2): its first two coordinates are drawn.
    """
    keys = prob.A.reshape(prob.n, prob.T, -1)[..., :2]
    for i in range(prob.n):  # as :func:`tokens`, two scatters per input (cheaper to redraw)
        c = SAMPLE_COLORS[i % len(SAMPLE_COLORS)] if prob.n > 1 else "k"
        opt = np.arange(prob.T) == prob.opt[i]
        ax.scatter(*keys[i, ~opt].T, s=25, color=c, edgecolor="k", lw=0.5, zorder=5)
        ax.scatter(*keys[i, opt].T, s=160, marker="*", color=c, edgecolor="k", lw=0.5, zorder=5)
    weights = np.exp(prob.log_attention(np.asarray(theta, float)))
    ax.scatter(*keys.reshape(-1, 2).T, s=ring_area * weights.ravel(), facecolors="none", edgecolors="k", lw=1.2)
    d = np.asarray(theta, float).ravel()[:2] / np.linalg.norm(theta)
    ax.annotate("", xy=1.4 * d, xytext=(0, 0), arrowprops=dict(arrowstyle="-|>", color="k", lw=2))
    if theta_mm is not None:
        direction(ax, theta_mm, length=1.9)
    ax.set_aspect("equal")
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
    ``rank`` (as :attr:`attnlib.SelectionStudy.results`); ``feasible``: ``(kind, n) → bool``.
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
    axes[0].set_title("does it select the optimal token?", fontsize=10)
    axes[1].set(xscale="log", yscale="log", ylabel=r"$1-\cos$")
    axes[1].set_title(r"alignment with $\theta_{mm}(\hat\alpha)$ of its own selection", fontsize=10)
    axes[2].set(ylabel="fraction of samples", ylim=(0, 1))
    axes[2].set_xticks(range(len(n_values)), [str(n) for n in n_values])
    axes[2].set_title("NGD from zero: score rank of the selected token", fontsize=10)
    for ax, loc in zip(axes, ("lower left", "best", "lower right")):
        ax.set_xlabel("samples n")
        ax.legend(fontsize=7, loc=loc)
    for ax in axes[:2]:
        ax.set_xticks(list(n_values), [str(n) for n in n_values])
        ax.xaxis.set_minor_locator(plt.NullLocator())
    fig.suptitle({"p": "prompt attention p", "W": "self-attention W"}.get(kind, kind), fontsize=11)
    fig.tight_layout()
    return fig


def offset_growth(ax, curves, n_values, title: str = ""):
    """Offset from a reference line against the norm, both relative to a window's start, log-log.

    ``curves``: dicts with ``n``, ``norm``, ``offset`` and ``wrong`` (or ``None``) as
    :meth:`attnlib.SelectionStudy.offset_curves` returns them: the offset from the run's own SVM
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
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=6, ncol=2)
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


def radius_angles(ax, radii, p, svms, label: str, **style):
    """Angles (degrees, log-log) of regularization-path points ``p`` (N, 2) to the p-SVMs against ``radii`` (N,).

    To the relaxed p-SVM in red (floored at 1e-6° for the log scale) and, when the two SVMs differ,
    to the full one in grey; ``style``: further ``ax.plot`` keywords (line style, marker).
    """
    from .joint import angle_degrees

    rel = np.maximum(angle_degrees(p, svms.relaxed.theta), 1e-6)
    ax.plot(radii, rel, color=COLORS["p"], label=f"{label}: ∠(p̄, relaxed)", **style)
    if svms.separation > 1e-3:
        ax.plot(radii, angle_degrees(p, svms.full.theta), color="0.5", label=f"{label}: ∠(p̄, full)", **style)
    ax.set(xscale="log", yscale="log", xlabel="attention radius R_p", ylabel="angle (degrees)")
    ax.minorticks_off()
    return ax


# ------------------------------------------------------- GD, NGD and Polyak compared (fast rates)
#: One colour per optimizer, the same in every panel: GD grey, NGD red, Polyak blue.
METHOD_COLORS = {"gd": "tab:gray", "ngd": "tab:red", "polyak": "tab:blue"}


def finish(fig):
    """Minor ticks off (on log axes they are most of the cost of drawing, and add little), then a
    tight layout. Returns ``fig``."""
    for ax in fig.axes:
        ax.minorticks_off()
    fig.tight_layout()
    return fig


def method_bands(
    ax, runs, values, labels=None, members=None, upto=None, clock=False, transform=None, log=True, colors=None
):
    """One median band (10–90%) per optimizer against its iterations, on a log iteration axis.

    ``runs``: ``{method: Trajectory}``; ``values``: ``{method: (R_m, S)}`` on each run's records (e.g.
    ``curves[m]["direction_error"]``). Record 0 (``t = 0``) is left out. ``members``: the columns kept;
    ``upto``: the last step drawn; ``clock``: against the batch's wall-clock ``seconds`` instead;
    ``transform``: applied to the values first; ``log``: log value axis, non-positive values dropped.
    Colours: :data:`METHOD_COLORS` unless ``colors``.
    """
    colors = colors or METHOD_COLORS
    for m, run in runs.items():
        keep = run.steps <= (run.steps[-1] if upto is None else upto)
        keep[0] = False
        Y = np.asarray(values[m], float)[keep]
        Y = Y[:, members] if members is not None else Y
        Y = transform(Y) if transform is not None else Y
        if log:
            Y = np.where(Y > 0, Y, np.nan)
        x = (run.seconds if clock else run.steps)[keep]
        band(ax, x, Y, color=colors.get(m), label=labels.get(m) if labels else None, log=log)
    ax.set_xscale("log")
    return ax


def rate_panels(comparison, members, labels, wmm_norm, lr_ngd: float):
    """The six rate curves of GD, NGD and Polyak (a :class:`attnlib.rates.Comparison`): direction
    error, ``1 − corr``, margin gap, ``−log10`` of the attention off the optimal tokens and of the
    loss gap, and the norm with ``‖W_mm‖ log t + c`` (GD) and ``η t`` (NGD). ``members``: the columns
    drawn; ``wmm_norm``: (S,) ``‖W_mm‖``. Returns a Figure (2 × 3)."""
    import matplotlib.pyplot as plt

    runs, cur = comparison.runs, comparison.curves
    fig, axes = plt.subplots(2, 3, figsize=(13, 7.6))
    minus_log10 = lambda y: -y / np.log(10)  # noqa: E731
    panels = (
        ("direction_error", r"$\|W_t/\|W_t\| - W^{mm}/\|W^{mm}\|\|$", "(a) direction error", None),
        ("one_minus_corr", r"$1 - \mathrm{corr}(W_t, W^{mm})$", "(b) one minus correlation", None),
        ("margin_gap", r"$1/\|W^{mm}\| - \gamma(W_t)$", "(c) margin gap (where positive)", None),
        (
            "log_mass",
            r"$-\log_{10} \max_i (1 - \sigma_{i,\mathrm{opt}})$",
            "(d) attention off the optimal tokens",
            minus_log10,
        ),
        ("log_gap", r"$-\log_{10}(\mathcal{L} - \mathcal{L}_\star)$", "(e) loss gap", minus_log10),
        ("norm", r"$\|W_t\|$", "(f) norm", None),
    )
    for ax, (key, ylabel, title, transform) in zip(axes.flat, panels):
        method_bands(ax, runs, {m: cur[m][key] for m in runs}, labels, members, transform=transform)
        ax.set(xlabel="iteration $t$", ylabel=ylabel, title=title)
    gd_t = runs["gd"].steps[runs["gd"].steps >= 3]
    wmm = np.nanmedian(np.asarray(wmm_norm)[members])
    offset = np.median(runs["gd"].norm[-1, members]) - wmm * np.log(gd_t[-1])  # the O(1) term, read off at the end
    axes[1, 2].plot(gd_t, wmm * np.log(gd_t) + offset, "k:", label=r"$\|W^{mm}\| \log t + c$")
    t_ngd = runs["ngd"].steps[1:]
    axes[1, 2].plot(t_ngd, lr_ngd * t_ngd, "k--", lw=1, label=r"$\eta t$")
    axes[0, 0].legend(loc="lower left")
    axes[1, 2].legend(loc="upper left")
    return finish(fig)


def separators(ax, X, y, directions, reference, labels=None, extent: float = 1.3):
    """Labelled points in the plane (``X`` (n, 2), ``y`` ±1: red +, blue −) and the separators through
    0 of linear classifiers: ``directions`` (k, 2) in grey shades darkening with the index (labels
    ``labels``), ``reference`` (2,) dashed black (the max-margin separator)."""
    X, y = np.asarray(X, float), np.asarray(y)
    ax.scatter(*X[y > 0].T, marker="+", color="tab:red", s=60, label="$y = +1$")
    ax.scatter(*X[y < 0].T, marker="_", color="tab:blue", s=60, label="$y = -1$")
    shades = np.linspace(0.8, 0.3, len(directions))
    for k, w in enumerate(np.asarray(directions, float)):
        w = w / np.linalg.norm(w)
        label = labels[k] if labels is not None else None
        ax.plot(
            [-extent * w[1], extent * w[1]], [extent * w[0], -extent * w[0]], color=str(shades[k]), lw=1.5, label=label
        )
    w = np.asarray(reference, float) / np.linalg.norm(reference)
    ax.plot([-extent * w[1], extent * w[1]], [extent * w[0], -extent * w[0]], "k--", lw=2, label="max-margin separator")
    ax.set_aspect("equal")
    return ax


def fit_residuals(ax, t, fits):
    """The residuals (in ``log err``) of the two fits of each :class:`attnlib.ShapeFit` of ``fits``
    against ``t`` (R,): the best power law in orange, ``1/(a + b log t)`` in black."""
    for f in fits:
        ax.plot(t, f.residual_power, color="tab:orange", lw=0.8, alpha=0.6)
        ax.plot(t, f.residual_inverse_log, color="k", lw=0.8, alpha=0.6)
    ax.plot([], [], color="tab:orange", label=r"best power law $c\,t^{-p}$")
    ax.plot([], [], color="k", label=r"$1/(a + b \log t)$")
    ax.axhline(0, color="0.5", lw=0.8)
    ax.set(xscale="log", xlabel="iteration $t$", ylabel="residual in log(direction error)")
    return ax


def running_slope(ax, ends, slopes, tolerance: float, color=None, label=None):
    """Slopes (len(ends), S) against the ends of their windows, median and 10–90% band (linear axis),
    with the target 1 and the band ``1 ± tolerance`` shaded."""
    band(ax, ends, slopes, color=color, label=label, log=False)
    ax.axhline(1, color="k", lw=1, label="target 1")
    ax.axhspan(1 - tolerance, 1 + tolerance, color="k", alpha=0.08, label=f"±{tolerance:.3g}")
    ax.set_xscale("log")
    return ax


def selection_fractions(ax, d, feasible_fraction, global_fraction, threshold=None):
    """Against the dimension ``d``: the fraction of problems whose W-SVM of opt is feasible (grey
    squares) and, among those, the fraction whose run selects opt (red dots); ``threshold`` dotted."""
    ax.plot(d, feasible_fraction, "s-", color="0.4", label="W-SVM of opt feasible")
    ax.plot(d, global_fraction, "o-", color=COLORS["global"], label="selects opt (among feasible)")
    if threshold is not None:
        ax.axvline(threshold, color="k", ls=":", lw=1, label=r"$d = \max(n, T-1)$")
    ax.set(xscale="log", xlabel="token dimension $d$", ylabel="fraction of problems", ylim=(-0.03, 1.05))
    ax.set_xticks(list(d), [str(k) for k in d])
    ax.minorticks_off()
    ax.legend(loc="lower right")
    return ax


def polyak_failure(axes, polyak, ngd, stop_at: int, floor_gap: float, labels, refused=None):
    """A Polyak run stopped by its detector next to NGD on the same problem (one-member
    Trajectories): the norm (log-log) and ``log10(L − L*)`` against iterations, the stop marked, and
    the floor ``L*(α) − L*`` of the local selection dashed. ``labels``: ``{"polyak": .., "ngd": ..}``;
    ``refused``: the length of the refused step, annotated."""
    for run, m, style in ((polyak, "polyak", ".-"), (ngd, "ngd", "-")):
        upto = run.steps <= (stop_at if m == "polyak" else run.steps[-1])
        upto[0] = False
        color = METHOD_COLORS[m]
        axes[0].plot(run.steps[upto], run.norm[upto, 0], style, color=color, label=labels[m])
        axes[1].plot(run.steps[upto], run.log_gap[upto, 0] / np.log(10), style, color=color, label=labels[m])
    for ax in axes:
        ax.axvline(stop_at, color=METHOD_COLORS["polyak"], ls=":", lw=1, label=f"Polyak stopped (step {stop_at})")
    label = r"$\mathcal{L}_\star(\alpha) - \mathcal{L}_\star$"
    axes[1].axhline(np.log10(floor_gap), color="k", ls="--", lw=1, label=label)
    axes[0].set(xscale="log", yscale="log", xlabel="iteration $t$", ylabel=r"$\|W_t\|$", title="norm")
    ylabel = r"$\log_{10}(\mathcal{L} - \mathcal{L}_\star)$"
    axes[1].set(xscale="log", xlabel="iteration $t$", ylabel=ylabel, title="loss gap")
    if refused is not None:
        axes[0].annotate(
            f"next step refused:\nlength {refused:.2g}",
            (stop_at, polyak.norm[-1, 0]),
            xytext=(25, -55),
            textcoords="offset points",
            arrowprops=dict(arrowstyle="->"),
            fontsize=8,
        )
    axes[0].legend(loc="lower right")
    axes[1].legend(loc="upper right")
    return axes


# --- Local convergence: the official paths, cone runs, basin maps, the W version, local paths ---------


def paths_to_two_directions(
    ax, prob: TokenSelectionProblem, theta, global_dir, local_dir, local_label: str, local_ls="--", limits=None
):
    """Trajectories ``theta`` (R, B, ≥2) with the tokens, the global SVM direction and a local one.

    The global direction is drawn in ``COLORS["global"]`` (labelled "global p_mm*"), the local one in
    ``COLORS["local"]`` with ``local_label`` and line style ``local_ls`` (e.g. dotted when it is not a
    limit of anything). ``limits = (x0, x1, y0, y1)`` sets the axes (default: ``(-4, 12, -3, 10)``,
    the window of [MMTS] Fig. 1).
    """
    paths(ax, theta, arrow_every=40)
    tokens(ax, prob)
    direction(ax, global_dir, 14, color=COLORS["global"], label="global p_mm*")
    direction(ax, local_dir, 14, color=COLORS["local"], label=local_label, ls=local_ls)
    x0, x1, y0, y1 = (-4, 12, -3, 10) if limits is None else limits
    ax.set(xlim=(x0, x1), ylim=(y0, y1), xlabel="$p_1$", ylabel="$p_2$")
    ax.legend(loc="upper right", fontsize=8)
    return ax


def cone_run_curves(axes, runs, colors: dict):
    """Two panels of cone initialisations (an :class:`attnlib.basins.ConeRuns`).

    ``axes[0]``: NGD ``(1 − cos(θ(t), θ_mm(α)))/μ`` per run, with the cone's edge at 1;
    ``axes[1]``: ``‖θ(t)‖/‖θ(0)‖`` for NGD (solid) and GD (dotted). One colour per cone,
    ``colors[key]`` for the runs whose ``owner`` is ``key``.
    """
    x = np.maximum(runs.steps, 1)
    for key in runs.directions:
        for j, b in enumerate(np.flatnonzero(runs.owner == key)):
            label = f"start in the cone of α={key}" if j == 0 else None
            kw = dict(color=colors[key], lw=1, alpha=0.8, label=label)
            axes[0].plot(x, np.maximum(runs.omc[:, b] / runs.mu, 1e-9), **kw)
            axes[1].plot(x, runs.ngd.norm[:, b] / runs.ngd.norm[0, b], **kw)
            axes[1].plot(x, runs.gd.norm[:, b] / runs.ngd.norm[0, b], color=colors[key], lw=1, ls=":")
    axes[0].axhline(1.0, color="k", ls="--", lw=1, label="cone edge")
    axes[0].set(xscale="log", yscale="log", xlabel="iteration", ylabel="(1 − cos(p(t), p_mm(α))) / μ")
    axes[0].set_title("(a) NGD: distance to the cone's direction", fontsize=10)
    axes[1].plot([], [], color="k", ls=":", label="GD (all cones)")
    axes[1].set(xscale="log", yscale="log", xlabel="iteration", ylabel="‖p(t)‖ / ‖p(0)‖")
    axes[1].set_title("(b) norm: NGD (solid) and GD (dotted)", fontsize=10)
    for ax in axes:
        ax.legend(fontsize=8)
    return axes


def basin_maps_panels(axes, maps: dict, lo: float, hi: float, prob: TokenSelectionProblem, inits=None, tie_dir=None):
    """One basin map per axes: ``maps`` ``{name: BasinMap}`` over a square key-plane grid from ``lo`` to ``hi``.

    Draws :func:`basin_image`, the tokens, the initialisations ``inits`` (B, ≥2) as crosses and the
    direction ``tie_dir`` dotted; the title gives each map's global and local fractions.
    """
    for ax, (name, m) in zip(axes, maps.items()):
        size = int(round(np.sqrt(m.labels.size)))
        basin_image(ax, m.kind().reshape(size, size), (lo, hi, lo, hi))
        tokens(ax, prob, annotate_scores=False, size=50)
        if inits is not None:
            ax.scatter(*np.asarray(inits)[:, :2].T, marker="x", color="k", s=25, label="official inits")
        if tie_dir is not None:
            direction(ax, tie_dir, 20, color="k", ls=":", lw=1, label="tie of tokens 1, 3")
        f = m.fractions()
        ax.set(xlim=(lo, hi), ylim=(lo, hi), xlabel="$p_1(0)$", ylabel="$p_2(0)$")
        ax.set_title(f"{name.upper()}: global {f['global']:.3f}, local {f['local']:.3f}")
    return axes


def basin_explorer_frame(ax, kind, limits, prob: TokenSelectionProblem, path, title: str = ""):
    """One picture of the basin explorer: a basin map ``kind`` (G, G) over the square ``limits = (lo, hi)``,
    the tokens of ``prob``, and a path (R, 2) from its start (a black dot)."""
    lo, hi = limits
    basin_image(ax, kind, (lo, hi, lo, hi))
    tokens(ax, prob, size=40)
    path = np.asarray(path, float)
    ax.plot(path[:, 0], path[:, 1], color="k", lw=1.2)
    ax.plot(*path[0, :2], "ko", ms=5)
    ax.set(xlim=(lo, hi), ylim=(lo, hi), xlabel="p₁(0)", ylabel="p₂(0)")  # no mathtext: redrawn per position
    ax.set_title(title, fontsize=9)
    return ax


def selection_alignment_curves(axes, steps, alignment):
    """Two panels of an :class:`attnlib.basins.SelectionAlignment` against ``steps`` (R,).

    ``axes[0]``: mean attention on ``α̂`` (mean ± std over problems); ``axes[1]``: correlation of
    ``θ(t)`` with ``θ_mm(α̂)`` (``COLORS["local"]``) and with ``θ_mm(opt)`` (``COLORS["global"]``).
    The first recorded step is skipped when it is step 0 (``W(0) = 0`` has no direction).
    """
    first = 1 if steps[0] == 0 else 0
    x = np.asarray(steps)[first:]
    mass = alignment.mass[first:]
    mean, sd = mass.mean(axis=1), mass.std(axis=1)
    axes[0].plot(x, mean, color="k")
    axes[0].fill_between(x, mean - sd, np.minimum(mean + sd, 1), color="k", alpha=0.15)
    axes[0].set(xscale="log", xlabel="iteration", ylabel="mean attention on α̂", ylim=(0, 1.05), title="(a) selection")
    for key, color, label in (
        ("alpha_hat", COLORS["local"], "corr(W(t), W_mm(α̂))"),
        ("opt", COLORS["global"], "corr(W(t), W_mm(opt))"),
    ):
        corr = alignment.corr[key][first:]
        mean, sd = np.nanmean(corr, axis=1), np.nanstd(corr, axis=1)
        axes[1].plot(x, mean, color=color, label=label)
        axes[1].fill_between(x, mean - sd, np.minimum(mean + sd, 1), color=color, alpha=0.2)
    n_off, S = int((~alignment.is_opt).sum()), alignment.is_opt.size
    axes[1].set(xscale="log", xlabel="iteration", ylabel="correlation (mean ± std over seeds)", ylim=(0, 1.05))
    axes[1].set_title(f"(b) {n_off} of {S} seeds end with α̂ ≠ opt")
    axes[1].legend(loc="lower right")
    return axes


def local_path_curves(axes, cases):
    """Local regularization paths (``[(name, LocalPathCase)]``, :func:`attnlib.paths.local_path_case`).

    ``axes[0]``, locally optimal: ``1 − cos(θ̄_α(R), θ_mm(α))`` (solid), its bound (dashed), the cone's
    ``μ`` (dotted), one colour per case. ``axes[1]``, the others: ``(1 − cos)/μ`` (solid when every
    SVM-neighbour scores higher, dotted when mixed) and ``‖θ̄‖/R`` (grey).
    """
    j = 0
    for name, c in cases:
        label = f"{name}, α={tuple(a + 1 for a in c.select)}"
        if c.locally_optimal:
            color = f"C{j}"
            j += 1
            axes[0].plot(c.radii, np.maximum(c.omc, 1e-18), color=color, label=label)
            axes[0].plot(c.radii, np.where(np.isfinite(c.bound), c.bound, np.nan), color=color, ls="--", lw=1)
            axes[0].axhline(c.mu, color=color, ls=":", lw=1)
        else:
            style = "-" if c.all_higher else ":"
            label += "" if c.all_higher else " (mixed)"
            axes[1].plot(c.radii, np.nan_to_num(c.omc / c.mu, nan=1.0), ls=style, label=label)
            axes[1].plot(c.radii, c.path.norm / c.radii, ls=style, color="grey", lw=0.8)
    axes[0].set(xscale="log", yscale="log", xlabel="R", ylabel="1 − cos(p̄_α(R), p_mm(α))")
    axes[0].set_title("(a) locally optimal: path (solid), bound (dashed), cone μ (dotted)", fontsize=10)
    axes[1].set(xscale="log", xlabel="R", ylabel="(1 − cos)/μ (colour), ‖p̄‖/R (grey)")
    axes[1].set_title("(b) not locally optimal", fontsize=10)
    for ax in axes:
        ax.legend(fontsize=7)
    return axes


def path_with_direction_error(prob: TokenSelectionProblem, theta_mm, steps, theta, title=None, figsize=(9, 3.6)):
    """One trajectory: its path in the key plane over the margin strips, and its direction error.

    ``steps`` (R,) the recorded iterations, ``theta`` (R, d) the parameters there (keys in the first
    two coordinates, as in :func:`margin_strips`), ``theta_mm`` the SVM it should converge to. Left:
    tokens, margin strips of ``theta_mm``, its ray, the path and its start; right:
    ``1 − cos(θ(t), θ_mm)`` against ``t`` on log axes. Returns the Figure.
    """
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogFormatter, LogLocator, NullLocator

    from .metrics import one_minus_cosine

    steps = np.asarray(steps, float)
    theta = np.asarray(theta, float)
    if theta.ndim != 2 or theta.shape[0] != steps.shape[0]:
        raise ValueError(f"theta must have shape (R, d) with R = {steps.shape[0]}, got {theta.shape}")
    fig, axes = plt.subplots(1, 2, figsize=figsize)
    ax = axes[0]
    margin_strips(ax, prob, theta_mm, label=False)
    tokens(ax, prob, annotate_scores=False, size=50)
    reach = max(12.0, 1.1 * float(np.abs(theta[:, :2]).max()))
    direction(ax, theta_mm, length=2 * reach, label="p_mm*")
    ax.plot(theta[:, 0], theta[:, 1], "k", lw=1.5, label=f"path, {int(steps[-1])} steps")
    ax.plot(*theta[0, :2], "o", color="tab:orange", ms=7, zorder=7, label="p(0)")
    ax.set(xlim=(-reach / 2, reach), ylim=(-reach / 2, reach / 2), xlabel="p₁", ylabel="p₂")
    ax.set_aspect("equal")
    ax.legend(loc="lower right", fontsize=7)
    later = steps > 0
    axes[1].loglog(steps[later], one_minus_cosine(theta[later], theta_mm), "k")
    axes[1].set(xlabel="iteration t", ylabel="1 − cos(p(t), p_mm*)")  # plain text: TeX costs a parse per picture
    axes[1].yaxis.set_major_locator(LogLocator(numticks=4))
    for axis in (axes[1].xaxis, axes[1].yaxis):
        axis.set_minor_locator(NullLocator())  # log-axis minor ticks are most of the rendering time
        axis.set_major_formatter(LogFormatter())  # plain-text labels: parsing TeX ones costs more
    if title:
        fig.suptitle(title, fontsize=10)
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.15, top=0.85, wspace=0.3)  # no tight_layout: one draw
    return fig


#: Colours of the two matrix geometries, the same in every panel: the ``W`` path with the Frobenius W-SVM,
#: the ``(K, Q)`` path with the nuclear-norm SVM.
NORM_COLORS = {"fro": "tab:blue", "nuc": "tab:orange"}


def margin_deficits_and_spectra(mat, figsize=(10, 4)):
    """Two panels for a :class:`attnlib.paths.MatrixPaths`: margin deficits against ``R``, and singular values.

    Left: :func:`margin_deficit` of the ``W`` path (Frobenius) and of the ``(K, Q)`` path (nuclear).
    Right: :func:`singular_value_spectra` of both SVMs (markers ``o``, ``s``) and both paths at the
    largest radius (``x``, ``+``). Each geometry keeps its colour (:data:`NORM_COLORS`) in both panels.
    Returns the Figure.
    """
    import matplotlib.pyplot as plt

    fro, nuc = NORM_COLORS["fro"], NORM_COLORS["nuc"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=figsize, layout="constrained")  # laid out when drawn
    radii = mat.w.radii
    margin_deficit(ax1, radii, mat.rho_w, mat.lo_fro, mat.nuc_in_fro, fro, "W path, Frobenius")
    margin_deficit(ax1, radii, mat.rho_kq, mat.lo_nuc, mat.fro_in_nuc, nuc, "KQ path, nuclear")
    ax1.legend(fontsize=7)
    spectra = {
        "Frobenius W-SVM": (mat.fro, fro, "o"),
        f"W path, R={radii[-1]:g}": (mat.w.theta[-1], fro, "x"),
        "nuclear-norm SVM": (mat.nuc, nuc, "s"),
        f"KQ path, R={radii[-1]:g}": (mat.kq.theta[-1], nuc, "+"),
    }
    singular_value_spectra(ax2, spectra, threshold=1e-6)
    ax2.legend(fontsize=8)
    return fig


def rates_overview(comparison, members, labels, lr_ngd: float, wmm: float, upto=None, fig=None):
    """Two panels of a GD/NGD/Polyak comparison (a :class:`attnlib.rates.Comparison`, any subset of
    the methods): the direction error, and ``−log10 max_i(1 − σ_i,opt)`` with NGD's predicted line
    ``η t/(‖W_mm‖ ln 10)`` (``wmm``: the median ``‖W_mm‖``) when NGD is shown. ``members``: the columns
    drawn; ``upto``: the last iteration drawn. Returns a Figure (1 × 2): ``fig``, if given (a figure
    this function drew before), cleared and redrawn with its layout kept (not faster than a new figure:
    clearing the axes costs about as much as making them)."""
    import matplotlib.pyplot as plt

    runs, cur = comparison.runs, comparison.curves
    if fig is None:
        fig, axes = plt.subplots(1, 2, figsize=(9.5, 3.4))
    else:
        axes = fig.axes[:2]
        for ax in axes:
            ax.clear()
    method_bands(axes[0], runs, {m: cur[m]["direction_error"] for m in runs}, labels, members, upto=upto)
    mass = {m: cur[m]["log_mass"] for m in runs}
    method_bands(axes[1], runs, mass, None, members, upto=upto, transform=lambda y: -y / np.log(10))
    if "ngd" in runs:
        t = runs["ngd"].steps[1:]
        t = t[t <= (t[-1] if upto is None else upto)]
        axes[1].plot(t, lr_ngd * t / wmm / np.log(10), "k:", lw=1, label=r"$\eta t/(\|W^{mm}\| \ln 10)$ (NGD)")
    axes[0].set(xlabel="iteration $t$", ylabel="direction error", ylim=(1e-4, 2))
    axes[1].set(xlabel="iteration $t$", ylabel=r"$-\log_{10}\max_i(1-\sigma_{i,\mathrm{opt}})$", ylim=(0.03, 2e3))
    axes[0].legend(loc="lower left", fontsize=7)
    axes[1].legend(loc="upper left", fontsize=7)
    return fig


# --------------------------------------------------------------------------- global convergence figures


def _plain_log_axes(ax):
    """Few major ticks and no minor ones on a log-log panel: much cheaper to render."""
    from matplotlib.ticker import LogLocator, NullLocator

    ax.yaxis.set_major_locator(LogLocator(numticks=5))
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_minor_locator(NullLocator())


def start_paths(ax, prob: TokenSelectionProblem, theta, theta_mm, colors, title="", xlim=(-4, 10), ylim=(-2, 10)):
    """Trajectories from several starts, one colour each, with the tokens and the SVM ray.

    ``theta`` (R, B, d): the recorded parameters of B runs (all R records are drawn, so slice the
    steps to show first); ``colors`` B colours; ``theta_mm`` the SVM direction drawn as a ray.
    """
    theta = np.asarray(theta, float)
    tokens(ax, prob)
    for b, c in enumerate(colors):
        paths(ax, theta[:, b : b + 1], color=c, arrow_every=20)
        ax.plot(*theta[0, b, :2], "o", color=c, ms=5)
    direction(ax, theta_mm, length=30, label=r"$p^{\mathrm{mm}\star}$ (global SVM direction)")
    ax.set(xlim=xlim, ylim=ylim, xlabel="$p_1$", ylabel="$p_2$", title=title)
    ax.set_aspect("equal")
    return ax


def direction_error_curves(ax, steps, theta, theta_mm, colors, labels, slope=None):
    """``1 − cos(θ_b(t), θ_mm)`` of each run against ``t`` on log axes, one colour and label per run.

    ``steps`` (R,), ``theta`` (R, B, d). ``slope``: also draw the guide ``∝ t^slope`` through the
    largest final error (dashed black).
    """
    from .metrics import one_minus_cosine

    steps = np.asarray(steps, float)
    error = one_minus_cosine(theta, theta_mm)
    for b, (c, lab) in enumerate(zip(colors, labels)):
        ax.loglog(steps[1:], error[1:, b], color=c, label=lab)
    if slope is not None:
        guide = error[-1].max() * (steps[1:] / steps[-1]) ** slope
        ax.loglog(steps[1:], guide, "k--", lw=1, label=rf"slope ${slope:g}$: bounded offset")
    ax.set(xlabel="iteration $t$", ylabel=r"$1 - \cos(p(t), p^{\mathrm{mm}\star})$")
    return ax


def ngd_and_gd_overview(prob: TokenSelectionProblem, theta_mm, ngd, gd, starts, shown: int, lr_ngd, lr_gd):
    """The multi-input figure of [MMTS]: paths with the margin strips, attention, norm growth.

    ``ngd``, ``gd``: :class:`attnlib.Trajectory` runs from the B ``starts`` (B, d), recorded every
    step; the first ``shown`` steps are drawn. (a) NGD paths over each input's margin strip; (b) mean
    softmax mass on the optimal tokens and (c) ``‖p(t)‖``, NGD against GD from the start ``p(0) = 0``
    (the row of ``starts`` that is zero). Returns the Figure.
    """
    import matplotlib.pyplot as plt

    from .metrics import selection_mass

    zero = int(np.flatnonzero(np.all(np.asarray(starts) == 0, axis=1))[0])
    fig, axes = plt.subplots(1, 3, figsize=(16, 5), gridspec_kw={"width_ratios": [1.5, 1, 1]})
    ax = axes[0]
    margin_strips(ax, prob, theta_mm)
    tokens(ax, prob, annotate_scores=False)
    paths(ax, ngd.theta[: shown + 1], arrow_every=20)
    ax.plot(*np.asarray(starts)[:, :2].T, "o", color=COLORS["path"], ms=4)
    direction(ax, theta_mm, length=30, label=r"$p^{\mathrm{mm}\star}$")
    ax.plot([], [], color=COLORS["path"], label=f"NGD paths, {shown} steps")
    ax.plot([], [], "k*", ms=10, ls="none", label="optimal tokens (score 1)")
    ax.plot([], [], "ko", ms=5, ls="none", label="other tokens (score 0.5)")
    ax.set(xlim=(-2, 6), ylim=(-2, 4), xlabel="$p_1$ (key coordinate 1)", ylabel="$p_2$ (key coordinate 2)")
    ax.set_title("(a) paths, SVM direction and margins\n(one colour per input)")
    ax.set_aspect("equal")
    ax.legend(loc="upper right", fontsize=7)
    rows = slice(0, shown + 1)
    runs = [(ngd, COLORS["global"], rf"NGD, $\eta = {lr_ngd:g}$"), (gd, COLORS["local"], rf"GD, $\eta = {lr_gd:g}$")]
    for run, color, label in runs:
        axes[1].plot(run.steps[rows], selection_mass(prob, run.theta[rows, zero]).mean(-1), color=color, label=label)
        axes[2].plot(run.steps[rows], run.norm[rows, zero], color=color, label=label)
    axes[2].plot(ngd.steps[rows], lr_ngd * ngd.steps[rows], "k:", lw=1, label=r"$\eta t$")
    axes[1].set(xlabel="iteration $t$", ylabel="mean softmax mass on the optimal tokens", ylim=(0, 1.02))
    axes[1].set_title("(b) attention on the optimal tokens, $p(0) = 0$")
    axes[1].legend(loc="lower right")
    axes[2].set(xlabel="iteration $t$", ylabel=r"$\|p(t)\|$", title="(c) norm growth, $p(0) = 0$")
    axes[2].legend(loc="upper left")
    fig.tight_layout()
    return fig


def input_gaps_by_angle(ax, prob: TokenSelectionProblem, theta_mm, step_degrees: float = 0.25) -> float:
    """Each input's gap ``min_{t≠opt} ⟨p̂, k_opt − k_t⟩`` and their minimum over unit directions ``p̂``.

    The directions sweep the key plane (first two coordinates) on a grid of ``step_degrees``; the
    minimum over inputs is the normalised margin of ``p̂`` (:func:`attnlib.normalized_margin`),
    largest at the SVM direction ``theta_mm``. Returns the angle (degrees) of the grid's best direction.
    """
    from .metrics import normalized_margin

    phi = np.arange(-180, 180 + step_degrees / 2, step_degrees)
    U = np.zeros((phi.size,) + prob.shape)
    U[:, 0], U[:, 1] = np.cos(np.radians(phi)), np.sin(np.radians(phi))
    logits = prob.logits(U)  # (directions, n, T)
    opt_logit = np.take_along_axis(logits, np.broadcast_to(prob.opt, logits.shape[:2])[..., None], axis=-1)
    others = np.arange(prob.T) != prob.opt[:, None]
    gaps = np.min(np.where(others, opt_logit - logits, np.inf), axis=-1)  # (directions, n)
    margin = normalized_margin(prob, U)
    u = np.asarray(theta_mm, float).ravel()
    phi_star = np.degrees(np.arctan2(u[1], u[0]))
    for i in range(prob.n):
        ax.plot(phi, gaps[:, i], color=SAMPLE_COLORS[i % len(SAMPLE_COLORS)], lw=1, label=f"input {i + 1}: its own gap")
    ax.plot(phi, margin, "k", lw=2.5, label="minimum over inputs (normalised margin)")
    label = rf"direction of $p^{{\mathrm{{mm}}\star}}$ ({phi_star:.1f}°)"
    ax.axvline(phi_star, color=COLORS["global"], ls="--", label=label)
    M = np.linalg.norm(u)
    ax.axhline(1 / M, color="0.3", ls=":", label=rf"SVM margin $1/\|p^{{\mathrm{{mm}}\star}}\| = {1 / M:.3f}$")
    ax.set(xlim=(-90, 90), ylim=(-1.5, 2.2), xlabel=r"angle of the unit direction $\hat p$ in the key plane (degrees)")
    ax.set_ylabel(r"gap $\min_{t \neq opt}\, \langle \hat p, k_{opt} - k_t \rangle$")
    ax.legend(loc="lower center", fontsize=7)
    return float(phi[np.argmax(margin)])


def offset_study(runs: dict, predicted, shown: int, labels: dict, colors: dict):
    """The loss and score-magnitude study: paths, the offset ``p_2(t)`` settling, final offset against C.

    ``runs``: ``{(loss, C): Trajectory}`` of one run each from ``p(0) = 0`` (recorded at
    ``run.steps``); ``predicted(C, loss)`` the predicted final offset ``p_2(∞)``; the first ``shown``
    steps of each path are drawn. Darker: larger C; dashed: the largest C. Returns the Figure.
    """
    import matplotlib.pyplot as plt

    losses = list(dict.fromkeys(loss for loss, _ in runs))
    scores = sorted({C for _, C in runs})
    lo, hi = min(scores), max(scores)
    shade = {C: 0.35 + 0.65 * np.log(C / lo) / max(np.log(hi / lo), 1e-12) for C in scores}
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    for (loss, C), run in runs.items():
        style = dict(color=colors[loss], alpha=shade[C], ls="--" if C == hi else "-", lw=1.3)
        kept = run.steps <= shown
        axes[0].plot(run.theta[kept, 0, 0], run.theta[kept, 0, 1], **style)
        axes[1].plot(run.steps, run.theta[:, 0, 1], **style)
        axes[1].axhline(predicted(C, loss), color=colors[loss], lw=0.6, ls=":", alpha=shade[C])
    for loss in losses:
        axes[0].plot([], [], color=colors[loss], label=labels[loss])
        Cs = np.geomspace(lo, hi, 200)
        axes[2].semilogx(Cs, predicted(Cs, loss), color=colors[loss], lw=1, label=f"{labels[loss]}: formula")
        final = [runs[loss, C].theta[-1, 0, 1] for C in scores]
        axes[2].semilogx(scores, final, "o", color=colors[loss], mfc="none", label="measured")
    axes[0].plot([], [], "k--", label=f"C = {hi:g}")
    axes[0].axhline(0, color=COLORS["global"], lw=1, ls=":", label=r"direction of $p^{\mathrm{mm}\star} = (1, 0)$")
    axes[0].set(xlabel="$p_1$", ylabel="$p_2$", title=f"(a) NGD paths, first {shown} steps (darker: larger C)")
    axes[1].plot([], [], "k:", lw=0.8, label="predicted $p_2(\\infty)$")
    axes[1].set(xlabel="iteration $t$", ylabel="$p_2(t)$: offset from the $p_1$ axis", title="(b) the offset settles")
    axes[2].set(xlabel="score C of input 1's optimal token", ylabel=r"$p_2$ at the last step")
    axes[2].set_title("(c) final offset vs C")
    for ax in axes:
        ax.legend(loc="lower left")
    fig.tight_layout()
    return fig


def random_start_runs(theta, steps, long_steps, long_theta, theta_mm, adversarial, length: float):
    """Many starts: (a) their paths in the key plane, (b) every run's direction error, log axes.

    ``theta`` (R, B, d) the runs drawn in (a); ``long_steps`` (R',), ``long_theta`` (R', B, d) the same
    runs continued, drawn in (b) with the figures' horizon ``steps`` marked; ``adversarial`` (B,) bool,
    drawn in orange. Returns the Figure.
    """
    import matplotlib.pyplot as plt

    from .metrics import one_minus_cosine

    adversarial = np.asarray(adversarial, bool)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    error = one_minus_cosine(long_theta, theta_mm)
    for kind, style in (
        (~adversarial, dict(color="0.6", lw=0.6, alpha=0.6)),
        (adversarial, dict(color="tab:orange", lw=1.3)),
    ):
        for b in np.flatnonzero(kind):
            axes[0].plot(*theta[:, b, :2].T, **style)
        axes[1].loglog(long_steps[1:], error[1:, kind], **style)
    axes[0].plot(*theta[0, :, :2].T, "k.", ms=3)
    direction(axes[0], theta_mm, length=length, label=r"$p^{\mathrm{mm}\star}$")
    axes[0].plot([], [], color="0.6", label="random starts")
    axes[0].plot([], [], color="tab:orange", label="adversarial starts")
    axes[0].set(xlabel="$p_1$", ylabel="$p_2$", title=f"(a) {theta.shape[1]} NGD paths, {steps} steps")
    axes[0].legend(loc="upper left")
    axes[1].axvline(steps, color="k", lw=0.8, ls=":")
    axes[1].annotate(" the figures' horizon", (steps, 2e-6), fontsize=8)
    axes[1].set(xlabel="iteration $t$", ylabel=r"$1 - \cos(p(t), p^{\mathrm{mm}\star})$", ylim=(1e-7, 3))
    axes[1].set_title(f"(b) direction error of every run, continued to {int(long_steps[-1])} steps")
    fig.tight_layout()
    return fig


def gd_against_ngd(prob: TokenSelectionProblem, theta_mm, gd, ngd, zero: int, window):
    """Plain GD from several starts against NGD from ``p(0) = 0`` (run index ``zero``), log axes.

    (a) direction error, (b) attention left off the optimal tokens (with a ``1/t`` guide), (c) GD's
    ``‖p(t)‖`` against ``log t`` with the line fitted over the records ``window`` (a slice).
    ``gd``, ``ngd``: :class:`attnlib.Trajectory`. Returns ``(fig, slope)``, the fitted slope.
    """
    import matplotlib.pyplot as plt

    from .metrics import fit_slope, log_one_minus_mass, one_minus_cosine

    tg, tn = gd.steps, ngd.steps
    B = gd.theta.shape[1]
    shades = plt.cm.Blues(np.linspace(0.45, 1, B))
    off_gd = np.exp(log_one_minus_mass(prob, gd.theta)).mean(-1)
    off_ngd = np.exp(log_one_minus_mass(prob, ngd.theta[:, zero])).mean(-1)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4))
    err_gd = one_minus_cosine(gd.theta, theta_mm)
    for b in range(B):
        label = f"GD, {B} starts" if b == 0 else None
        axes[0].loglog(tg[1:], err_gd[1:, b], color=shades[b], label=label)
        axes[1].loglog(tg[1:], off_gd[1:, b], color=shades[b], label=label)
        axes[2].semilogx(tg[1:], gd.norm[1:, b], color=shades[b], label=label)
    slope, icpt = fit_slope(tg[window], gd.norm[window, zero], log_y=False)
    fit_label = rf"fit: {slope:.3f}$\,\log t$ + c"
    axes[2].semilogx(tg[window], slope * np.log(tg[window]) + icpt, "k--", lw=1.2, label=fit_label)
    M = np.linalg.norm(theta_mm)
    axes[2].set(xlabel="iteration $t$ (log scale)", ylabel=r"$\|p(t)\|$")
    axes[2].set_title(rf"(c) GD norm against $\log t$ ($M = \|p^{{\mathrm{{mm}}\star}}\| = {M:.3f}$)")
    ngd_label = "NGD from $p(0) = 0$"
    axes[0].loglog(tn[1:], one_minus_cosine(ngd.theta[1:, zero], theta_mm), color=COLORS["global"], label=ngd_label)
    axes[1].loglog(tn[1:], off_ngd[1:], color=COLORS["global"], label=ngd_label)
    axes[1].loglog(tg[10:], off_gd[-1, zero] * tg[-1] / tg[10:], "k--", lw=1, label=r"$\propto 1/t$")
    axes[0].set(xlabel="iteration $t$", ylabel=r"$1 - \cos(p(t), p^{\mathrm{mm}\star})$", ylim=(1e-6, 3))
    axes[0].set_title("(a) direction error: GD decreases, slowly")
    axes[1].set(xlabel="iteration $t$", ylabel=r"$1 -$ mean softmax mass on the optimal tokens", ylim=(1e-12, 1.5))
    axes[1].set_title("(b) attention not on the optimal tokens")
    for ax in axes:
        ax.legend(loc="lower left" if ax is not axes[2] else "upper left")
    fig.tight_layout()
    return fig, slope


#: Colour of each check verdict (sweep and robustness figures).
VERDICT_COLORS = {"passed": "tab:green", "failed": "tab:red", "not applicable": "0.6"}


def check_values_by_seed(rows, columns: int = 3, log=()):
    """Every check of a sweep: its value at each seed, coloured by verdict, one panel per check.

    ``rows``: dicts with ``seed``, ``check`` (its name), ``value`` (a number, or text that reads as
    one; other values are skipped) and ``status`` (``passed``, ``failed`` or ``not applicable``):
    the long format of the committed robustness tables (:func:`attnlib.book.robustness.read_table`).
    ``log``: names of the checks drawn on a log scale. Returns the Figure.
    """
    import matplotlib.pyplot as plt

    panels: dict[str, list] = {}
    for row in rows:
        try:
            value = float(row["value"])
        except (TypeError, ValueError):
            continue
        panels.setdefault(row["check"], []).append((row["seed"], value, row["status"]))
    n_rows = max(1, -(-len(panels) // columns))
    fig, axes = plt.subplots(n_rows, columns, figsize=(3.2 * columns, 2.3 * n_rows), squeeze=False)
    for ax, (name, points) in zip(axes.ravel(), panels.items()):
        seeds, values, verdicts = zip(*points)
        ax.scatter(seeds, values, c=[VERDICT_COLORS.get(v, "k") for v in verdicts], s=16, zorder=3)
        ax.set_title(name, fontsize=8)
        ax.set_xticks(sorted({min(seeds), max(seeds)}))
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.locator_params(axis="y", nbins=3)
        ax.tick_params(labelsize=7)
        if name in log:
            ax.set_yscale("log")
    for ax in axes.ravel()[len(panels) :]:
        ax.axis("off")
    fig.supxlabel("seed", fontsize=9)
    fig.tight_layout()
    return fig


def gap_descent_and_w_panels(axes, gap_curves, grid, cos, theta_mm, w_steps, w_errors):
    """Three panels: GD's loss gap in units of ``M²/(ηt)``, a map of ``cos(∇L, p_mm*)``, W's direction error.

    ``gap_curves``: ``[(t (R,), ηt(L − L*)/M² (R,), label), ...]`` drawn on ``axes[0]`` against the
    constant 1; ``grid``, ``cos``, ``theta_mm``: the map of :func:`gradient_cosine_map` with the SVM
    ray; ``w_steps`` (R,) and ``w_errors``: ``[(1 − corr (R, B), colour, label), ...]`` on log axes.
    """
    for t, value, label in gap_curves:
        axes[0].semilogx(t, value, label=label)
    axes[0].axhline(1, color="k", ls=":", lw=1, label=r"$M^2/(\eta t)$ exactly")
    axes[0].set(xlabel="iteration $t$", ylabel=r"$\eta\,t\,(L - L_\star)/M^2$", title="(a) plain GD: the loss gap")
    axes[0].legend(loc="lower right")
    image = gradient_cosine_map(axes[1], grid, cos)
    direction(axes[1], theta_mm, length=0.7 * float(np.max(np.abs(grid))), label=r"$p^{\mathrm{mm}\star}$")
    axes[1].figure.colorbar(image, ax=axes[1], label=r"$\cos(\nabla L(p), p^{\mathrm{mm}\star})$")
    lim = (float(grid[0]), float(grid[-1]))
    axes[1].set(xlim=lim, ylim=lim, title="(b) unequal scores: red = no descent along $p^{\\mathrm{mm}\\star}$")
    axes[1].legend(loc="upper right")
    for error, color, label in w_errors:
        axes[2].loglog(w_steps[1:], error[1:], color=color, lw=1)
        axes[2].plot([], [], color=color, label=label)
    axes[2].set(xlabel="iteration $t$", ylabel=r"$1 - \mathrm{corr}(W(t), \cdot)$", title="(c) NGD on $W$")
    axes[2].legend(loc="lower left")
    return axes


def norm_and_offset_settling(axes, steps, norm, M, offset_error, kappa_M):
    """GD on a log grid: ``‖p(t)‖`` against ``log t`` with slope ``M``, and ``|p_2 − p_2(∞)|`` with ``t^{−κM}``.

    ``steps``, ``norm``, ``offset_error``: (R,) positive steps and the run's values there; the guides
    pass through the last record.
    """
    color = COLORS["local"]
    axes[0].semilogx(steps, norm, color=color, label=r"GD, $\|p(t)\|$")
    guide = M * np.log(steps / steps[-1]) + norm[-1]
    axes[0].semilogx(steps, guide, "k--", lw=1, label=rf"$M \log t + c$, $M = {M:.3g}$")
    axes[0].set(xlabel="iteration $t$ (log scale)", ylabel=r"$\|p(t)\|$", title=r"(a) norm: slope $M$ against $\log t$")
    axes[1].loglog(steps, offset_error, color=color, label=r"$|p_2(t) - p_2(\infty)|$")
    guide = offset_error[-1] * (steps / steps[-1]) ** (-kappa_M)
    axes[1].loglog(steps, guide, "k--", lw=1, label=rf"$\propto t^{{-\kappa M}}$, $\kappa M = {kappa_M:.3g}$")
    axes[1].set(xlabel="iteration $t$", ylabel=r"$|p_2(t) - p_2(\infty)|$", title="(b) the offset settles")
    for ax in axes:
        ax.legend(loc="best")
    return axes
