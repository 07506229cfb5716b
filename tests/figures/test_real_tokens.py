"""Chapter figures: attnlib.figures.real_tokens."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import attnlib as al  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _tiny_results(n_values, T=4):
    results, feasible = {}, {}
    for k, n in enumerate(n_values):
        feasible["p", n] = k == 0
        for method, start in (("ngd", "zero"), ("gd", "zero"), ("ngd", "cone")):
            if start == "cone" and not feasible["p", n]:
                continue
            rank = np.arange(n) % T
            results["p", n, method, start] = dict(
                agree=float(np.mean(rank == 0)), omc_sel=1e-3, omc_opt=1e-2 if feasible["p", n] else np.nan, rank=rank
            )
    return results, feasible


def test_patch_images_draws_one_axes_montage():
    data = al.datasets.digit_patches(n=6)
    fig, ax = plt.subplots()
    al.figures.real_tokens.patch_images(
        ax,
        data.images,
        data.patch,
        weights=np.full((6, data.T), 0.5),
        boxes=[0, [(1, "tab:blue", "--")], None, [(2, "tab:red"), (3, "k")], 1, 2],
        frames=["tab:green", None, None, None, None, None],
        titles=[f"{k}" for k in range(6)],
        ncols=3,
        grid=True,
    )
    assert len(ax.images) == 2  # the montage and the veil
    assert len(ax.patches) == 1 + 1 + 2 + 1 + 1 + 1  # boxes, then the one frame
    assert ax.images[0].get_array().shape == (2 * (8 + 2 + 3) - 2, 3 * (8 + 2) - 2)
    al.figures.real_tokens.patch_images(ax, data.images[0], data.patch, boxes=1)  # a single image
    plt.close(fig)


def test_selection_panels_draw_agreement_alignment_and_ranks():
    results, feasible = _tiny_results([2, 4])
    fig = al.figures.real_tokens.selection_panels(results, feasible, [2, 4], "p", T=4)
    agree, align, ranks = fig.axes
    assert len(agree.get_lines()) == 3 and len(agree.patches) == 1  # three runs, the infeasible band
    assert agree.get_lines()[2].get_xdata().tolist() == [2]  # NGD from the cone where feasible only (n=2)
    assert agree.get_lines()[0].get_ydata().tolist() == [0.5, 0.25]  # rank 0 in 1 of 2, then 1 of 4 samples
    assert len(align.get_lines()) == 4  # own SVM for each run, and NGD from zero against the optimal SVM
    assert len(ranks.patches) == 2 * 4  # ranks 0..3 present, one bar per n each
    plt.close(fig)


def test_svm_margins_and_token_matrix():
    fig, (ax, bx) = plt.subplots(1, 2)
    al.figures.real_tokens.svm_margins(ax, [2, 4, 8], {"p": [0.5, 0.2, None], "W": [0.6, 0.3, 0.1]})
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"p-SVM margin", "p-SVM infeasible", "W-SVM margin"}
    assert lines["p-SVM infeasible"].get_xdata().tolist() == [8] and lines["p-SVM margin"].get_color() == "tab:red"
    al.figures.real_tokens.token_matrix(bx, np.eye(4, 6), pixels=2)
    assert bx.images[0].get_array().shape == (4, 6) and bx.get_lines()[0].get_xdata()[0] == 1.5
    with pytest.raises(ValueError, match="pixels"):
        al.figures.real_tokens.token_matrix(bx, np.eye(4, 6), pixels=6)
    plt.close(fig)


def test_offset_growth_attention_maps_and_joint_curves():
    fig, axes = plt.subplots(2, 2)
    growth = np.geomspace(1, 4, 5)
    curves = [dict(kind="p", n=4, norm=growth, offset=np.ones(5), wrong=growth, growth=4.0, wrong_exponent=1.0)]
    al.figures.real_tokens.offset_growth(axes[0, 0], curves, [4, 8], "p")
    labels = [line.get_label() for line in axes[0, 0].get_lines()]
    assert labels[:2] == ["n=4, own SVM", "n=4, vs optimal SVM"] and len(labels) == 5  # and three reference powers
    assert axes[0, 0].get_lines()[-1].get_xdata()[-1] == pytest.approx(4.0)
    images = np.random.default_rng(0).random((2, 8, 8))
    al.figures.real_tokens.attention_maps(axes[0, 1], images, 4, np.full((2, 4), 0.25), select=[0, 1], opt=[0, 2])
    styles = [(p.get_edgecolor()[:3], p.get_linestyle()) for p in axes[0, 1].patches]
    assert len(styles) == 3 and styles[2][1] == "--"  # a hit (red), a miss (blue, with the optimal dashed red)
    steps = np.arange(5)
    al.figures.real_tokens.joint_curves(
        axes[1], steps, np.linspace(0, 0.9, 5), np.ones(5), np.full(5, 30.0), np.full(5, 10.0)
    )
    assert len(axes[1, 1].get_lines()) == 2 and axes[1, 0].get_yscale() == "log"
    plt.close(fig)


def test_race_curves_draws_a_median_and_a_band_per_optimizer():
    fig, ax = plt.subplots()
    steps = np.array([0, 1, 10, 100])
    curves = {"GD": np.full((4, 3), 0.5), "SNGD": np.linspace(1, 1e-6, 12).reshape(4, 3)}
    out = al.figures.real_tokens.race_curves(ax, steps, curves, "training loss", log_y=True, title="t")
    assert out is ax and ax.get_yscale() == "log" and ax.get_xscale() == "log"
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == ["GD", "SNGD"] and lines[1].get_linestyle() == "--"
    assert np.allclose(lines[0].get_xdata(), [1, 1, 10, 100])  # step 0 is drawn at 1 on the log axis
    assert len(ax.collections) == 2
