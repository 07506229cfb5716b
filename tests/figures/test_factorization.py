"""Chapter figures: attnlib.figures.factorization."""

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from attnlib.experiments.factorization import plane_paths  # noqa: E402
from attnlib.figures import factorization as figs  # noqa: E402


def test_plane_panel_draws_tokens_paths_rays_and_lines():
    run = plane_paths(draws=[0], steps=30)
    fig, ax = plt.subplots()
    assert figs.plane_paths_panel(ax, run, 1, 0) is ax
    # per kind and input: a path, a ray and a separating line, plus 4 legend stubs
    assert len(ax.lines) == 2 * 2 * 3 + 4
    lo, hi = ax.get_xlim()
    assert lo < 0 < hi and np.isclose(-lo, hi)
    plt.close(fig)
    assert figs.shown_draw(np.zeros((3, 2), bool)) == 0
