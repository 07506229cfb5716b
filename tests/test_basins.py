"""Tests for attnlib.basins: basin attribution and training a stack of problems."""

import numpy as np
import pytest

import attnlib as al


@pytest.fixture(scope="module")
def fig1b():
    prob = al.datasets.single_input(local=True)
    return prob, al.locally_optimal_selections(prob)


def test_official_inits_basins(fig1b):
    prob, cands = fig1b
    m = al.basin_map(prob, al.datasets.SINGLE_INPUT_INITS, steps=400, lr=0.5, candidates=cands)
    assert m.kind().tolist() == [0, 0, 0, 0, 1, 1]
    assert m.is_global.tolist() == [True, False]
    assert sum(m.fractions().values()) == pytest.approx(1.0, abs=1e-15)
    assert np.all(m.position_cosine[m.labels == 0, 0] > 0.99)


def test_gd_readout_and_extension(fig1b):
    prob, cands = fig1b
    starts = np.array([[0.0, 0.5, 0.0], [0.0, -1.5, 0.0]])
    m = al.basin_map(prob, starts, steps=20, method="gd", lr=1.0, candidates=cands, readout_steps=4, extend_steps=400)
    assert m.extended[1]  # 4 read-out steps do not decide the local one; the extension does
    assert m.kind().tolist() == [0, 1]


def test_classify_motion_rejects_boundary_direction(fig1b):
    prob, cands = fig1b
    # Moving along the tie direction of tokens 1 and 3 (1, 0.1): 1 − cos ≈ 5e-3 from p_mm(α=2).
    a = np.array([[10.0, 1.0, 0.0]])
    labels, cos = al.classify_motion(prob, a, 2 * a, cands, tol=1e-3)
    assert labels.tolist() == [-1]
    labels, _ = al.classify_motion(prob, a, a + [[10.0, 0.0, 0.0]], cands, tol=1e-3)
    assert labels.tolist() == [1]
    with pytest.raises(ValueError, match="tol"):
        al.classify_motion(prob, a, 2 * a, cands, tol=0.0)


def test_basin_map_bad_candidates(fig1b):
    prob, _ = fig1b
    with pytest.raises(ValueError, match="candidates"):
        al.basin_map(prob, np.zeros((1, 3)), 10, candidates=[])


def test_basin_image_draws():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    kind = np.zeros((5, 5), int)
    kind[:2] = 1
    kind[2, 2] = -1
    al.plots.basin_image(ax, kind, (-1, 1, -1, 1))
    assert len(ax.collections) == 1  # the undecided dot
    plt.close(fig)
    with pytest.raises(ValueError):
        al.plots.basin_image(ax, np.zeros(3), (0, 1, 0, 1))
