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


@pytest.mark.parametrize("method", ["gd", "ngd"])
def test_train_each_matches_train(method):
    probs = [al.datasets.random_tokens(3, 4, 5, seed=s, queries="cross") for s in range(3)]
    W0 = np.random.default_rng(0).normal(scale=0.1, size=(3, 5, 5))
    traj = al.train_each(probs, W0, 60, method, 0.1, record_every=20)
    assert traj.theta.shape == (4, 3, 5, 5)
    for s, p in enumerate(probs):
        # al.train on the same problem with W flattened to a vector (Frobenius geometry is the same).
        flat = al.token_selection(p.A.reshape(p.n, p.T, -1), p.gamma)
        ref = al.train(flat, W0[s].ravel(), 60, method, 0.1, record_every=20)
        np.testing.assert_allclose(traj.theta[:, s].reshape(4, -1), ref.theta[:, 0], atol=1e-12)
        np.testing.assert_allclose(traj.log_gap[:, s], ref.log_gap[:, 0], atol=1e-12)


def test_train_each_validates():
    p1 = al.datasets.random_tokens(2, 3, 4, seed=0)
    p2 = al.datasets.random_tokens(2, 4, 4, seed=0)
    with pytest.raises(ValueError, match="share"):
        al.train_each([p1, p2], np.zeros((4, 4)), 5)
    with pytest.raises(ValueError, match="method"):
        al.train_each([p1], np.zeros((4, 4)), 5, method="polyak")
    with pytest.raises(ValueError, match="theta0"):
        al.train_each([p1], np.zeros((2, 4, 4)), 5)


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
