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


def test_locally_optimal_selections_of_fig1():
    # Fig. 1(b): the optimal token and token 2 are locally optimal; Fig. 1(a): token 2's only
    # SVM-neighbour (token 3) ties with it, so only the optimal selection is.
    local_b = {r.select for r in al.locally_optimal_selections(al.datasets.single_input(local=True))}
    local_a = {r.select for r in al.locally_optimal_selections(al.datasets.single_input(local=False))}
    assert local_b == {(0,), (1,)}
    assert local_a == {(0,)}


def test_selection_table(fig1b):
    prob, _ = fig1b
    lines = al.selection_table(prob, al.enumerate_selections(prob)).splitlines()
    assert len(lines) == 2 + prob.T
    assert lines[2].startswith("| 1 | (-0.1, 1) | 1 | (-0.099, 0.990) | 3 (0) | **yes** |")
    assert lines[4] == "| 3 | (0, 0) | 0 | (-1.000, -1.100) | 1 (1), 2 (0.9) | no |"
    infeasible = al.SelectionReport((1,), False, False, None)
    assert al.selection_table(prob, [infeasible]).splitlines()[2] == "| 2 | (1, 0) | 0.9 | infeasible | – | no |"
    two = al.datasets.multi_input()
    with pytest.raises(ValueError, match="one input"):
        al.selection_table(two, [])


def test_cone_starts_inside_the_cone():
    d = np.array([[1.0, -2.0], [0.5, 3.0]])  # a matrix direction (W version)
    mu, radius = 1e-2, 7.0
    s = al.cone_starts(d, 50, mu=mu, radius=radius, rng=1)
    assert s.shape == (50, 2, 2)
    assert np.allclose(np.linalg.norm(s.reshape(50, -1), axis=-1), radius * np.linalg.norm(d))
    omc = al.one_minus_cosine(s, d)
    assert np.all(omc <= mu * (1 + 1e-12)) and omc.max() > 0.5 * mu  # angles fill the cone
    edge = al.cone_starts(d, 4, mu=mu, radius=radius, rng=1, edge=True)
    assert np.allclose(al.one_minus_cosine(edge, d), mu, rtol=1e-9)
    off = edge - radius * (1 - mu) * d  # tilts of an antipodal pair cancel
    assert np.allclose(off[0] + off[1], 0.0) and np.allclose(off[2] + off[3], 0.0)
    # Same seed, same starts; the span is respected (the third coordinate stays 0).
    a = al.cone_starts([1.0, 1.0, 0.0], 5, mu=mu, radius=2.0, rng=3, span=np.eye(3)[:2])
    assert np.array_equal(a, al.cone_starts([1.0, 1.0, 0.0], 5, mu=mu, radius=2.0, rng=3, span=np.eye(3)[:2]))
    assert np.all(a[:, 2] == 0.0)


def test_cone_starts_bad_inputs():
    with pytest.raises(ValueError, match="mu"):
        al.cone_starts([1.0, 0.0], 3, mu=0.0, radius=1.0)
    with pytest.raises(ValueError, match="radius"):
        al.cone_starts([1.0, 0.0], 3, mu=0.1, radius=-1.0)
    with pytest.raises(ValueError, match="count"):
        al.cone_starts([1.0, 0.0], 0, mu=0.1, radius=1.0)
    with pytest.raises(ValueError, match="non-zero"):
        al.cone_starts([0.0, 0.0], 3, mu=0.1, radius=1.0)
    with pytest.raises(ValueError, match="span"):
        al.cone_starts([1.0, 0.0, 0.0], 3, mu=0.1, radius=1.0, span=[[2.0, 0.0, 0.0]])
