"""Chapter experiments: attnlib.experiments.local_convergence."""

import numpy as np
import pytest

import attnlib as al


@pytest.fixture(scope="module")
def fig1b():
    prob = al.datasets.single_input(local=True)
    return prob, al.svm.locally_optimal_selections(prob)


def test_official_inits_basins(fig1b):
    prob, cands = fig1b
    m = al.experiments.local_convergence.basin_map(
        prob, al.datasets.SINGLE_INPUT_INITS, steps=400, lr=0.5, candidates=cands
    )
    assert m.kind().tolist() == [0, 0, 0, 0, 1, 1]
    assert m.is_global.tolist() == [True, False]
    assert sum(m.fractions().values()) == pytest.approx(1.0, abs=1e-15)
    assert np.all(m.position_cosine[m.labels == 0, 0] > 0.99)


def test_gd_readout_and_extension(fig1b):
    prob, cands = fig1b
    starts = np.array([[0.0, 0.5, 0.0], [0.0, -1.5, 0.0]])
    m = al.experiments.local_convergence.basin_map(
        prob, starts, steps=20, method="gd", lr=1.0, candidates=cands, readout_steps=4, extend_steps=400
    )
    assert m.extended[1]  # 4 read-out steps do not decide the local one; the extension does
    assert m.kind().tolist() == [0, 1]


def test_classify_motion_rejects_boundary_direction(fig1b):
    prob, cands = fig1b
    # Moving along the tie direction of tokens 1 and 3 (1, 0.1): 1 − cos ≈ 5e-3 from p_mm(α=2).
    a = np.array([[10.0, 1.0, 0.0]])
    labels, cos = al.experiments.local_convergence.classify_motion(prob, a, 2 * a, cands, tol=1e-3)
    assert labels.tolist() == [-1]
    labels, _ = al.experiments.local_convergence.classify_motion(prob, a, a + [[10.0, 0.0, 0.0]], cands, tol=1e-3)
    assert labels.tolist() == [1]
    with pytest.raises(ValueError, match="tol"):
        al.experiments.local_convergence.classify_motion(prob, a, 2 * a, cands, tol=0.0)


def test_basin_map_bad_candidates(fig1b):
    prob, _ = fig1b
    with pytest.raises(ValueError, match="candidates"):
        al.experiments.local_convergence.basin_map(prob, np.zeros((1, 3)), 10, candidates=[])


def test_key_plane_grid_layout_matches_basin_image():
    grid = al.experiments.local_convergence.key_plane_grid(-1.0, 1.0, 3)
    assert grid.shape == (9, 3) and np.all(grid[:, 2] == 0)
    # labels.reshape(size, size)[j, i] is the start (x_i, y_j)
    assert grid.reshape(3, 3, 3)[2, 0, :2].tolist() == [-1.0, 1.0]
    with pytest.raises(ValueError, match="size"):
        al.experiments.local_convergence.key_plane_grid(0.0, 1.0, 1)
    with pytest.raises(ValueError, match="below"):
        al.experiments.local_convergence.key_plane_grid(1.0, 0.0, 4)


def test_ngd_and_gd_basin_maps_equal_two_separate_maps(fig1b):
    prob, cands = fig1b
    grid = al.experiments.local_convergence.key_plane_grid(-4.0, 8.0, 9)
    maps = al.experiments.local_convergence.ngd_and_gd_basin_maps(
        prob, grid, cands, 1e-3, 60, 0.5, 20, 1.0, extend_steps=200
    )
    ngd = al.experiments.local_convergence.basin_map(prob, grid, 60, "ngd", 0.5, cands, 1e-3, extend_steps=200)
    gd = al.experiments.local_convergence.basin_map(
        prob, grid, 20, "gd", 1.0, cands, 1e-3, readout_steps=60, readout_lr=0.5, extend_steps=200
    )
    for mine, ref in ((maps["ngd"], ngd), (maps["gd"], gd)):
        assert np.array_equal(mine.labels, ref.labels) and np.array_equal(mine.extended, ref.extended)
        np.testing.assert_allclose(mine.final, ref.final, rtol=1e-12, atol=1e-12)
        assert (mine.steps, mine.readout_steps, mine.extend_steps) == (ref.steps, ref.readout_steps, ref.extend_steps)
    assert maps["ngd"].extended.any()  # the extension was exercised
    table = al.experiments.local_convergence.basin_table(maps)
    assert table.count("\n") == 3 and "| GD |" in table


def test_cone_runs_match_cone_starts_and_stay_in_locally_optimal_cones(fig1b):
    prob, _ = fig1b
    p_mm = {r.select[0] + 1: r.solution.theta for r in al.enumerate_selections(prob)}
    kw = dict(mu=1e-3, radius=20.0, steps=1000, ngd_lr=0.1, gd_lr=1.0)  # 1000: past α = 3's escape time
    runs = al.experiments.local_convergence.cone_runs(prob, p_mm, 4, rng=3, span=np.eye(3)[:2], **kw)
    rng = np.random.default_rng(3)
    first = al.datasets.cone_starts(p_mm[1], 2, mu=1e-3, radius=20.0, rng=rng, span=np.eye(3)[:2], edge=True)
    np.testing.assert_allclose(runs.ngd.theta[0, :2], first)
    assert runs.owner.tolist() == [1] * 4 + [2] * 4 + [3] * 4
    assert runs.steps[runs.half] == 500 and runs.steps[0] == 0 and runs.steps[-1] == 1000
    np.testing.assert_allclose(runs.omc[0, :2], 1e-3, rtol=1e-9)  # edge starts
    np.testing.assert_allclose(runs.start_offset, runs.ngd.norm[0] * np.sin(np.arccos(1 - 1e-3)))
    local = runs.owner < 3
    assert runs.omc[1:, local].max() <= 1e-3  # the theorem's claim, NGD
    assert np.all(prob.selection(runs.ngd.final[~local])[:, 0] != 2)  # α = 3 is left
    with pytest.raises(ValueError, match="count"):
        al.experiments.local_convergence.cone_runs(prob, p_mm, 2, mu=1e-3, radius=20.0, steps=10, ngd_lr=0.1, gd_lr=1.0)


def test_selection_alignment_on_a_stack():
    probs = [al.datasets.random_tokens(3, 4, 5, seed=s, queries="cross") for s in range(3)]
    traj = al.train(al.stack_problems(probs), np.zeros((5, 5)), 400, "ngd", 0.1, record_every=100)
    align = al.experiments.local_convergence.selection_alignment(probs, traj)
    assert align.corr["opt"].shape == (5, 3) and align.mass.shape == (5, 3)
    for j, p in enumerate(probs):
        assert align.alpha_hat[j].tolist() == p.selection(traj.final[j]).tolist()
        if align.is_opt[j]:
            np.testing.assert_allclose(align.corr["opt"][:, j], align.corr["alpha_hat"][:, j])
    assert np.all(np.isnan(align.corr["opt"][0]))  # W(0) = 0 has no direction
    assert np.nanmin(align.corr["alpha_hat"][-1]) > 0.9 and align.infeasible() == 0
    with pytest.raises(ValueError, match="problems"):
        al.experiments.local_convergence.selection_alignment(probs[:2], traj)


def test_score_basin_explorer_caches_shares_and_redraws(fig1b):
    prob, cands = fig1b
    big = al.experiments.local_convergence.basin_map(
        prob,
        al.experiments.local_convergence.key_plane_grid(-4.0, 8.0, 9),
        60,
        "ngd",
        0.5,
        cands,
        1e-3,
        extend_steps=100,
    )
    ex = al.figures.local_convergence.ScoreBasinExplorer(-4.0, 8.0, 5, 60, 0.5, 1e-3, shared={0.0: big})
    own = al.experiments.local_convergence.basin_map(prob, ex.grid, 60, "ngd", 0.5, tol=1e-3).kind().reshape(5, 5)
    assert np.array_equal(ex.maps[0.0], own)  # the shared sub-grid, before the extension
    ex.precompute([0.9, 0.0], (6.0, -3.0), 0.1, 30)
    single = al.train(ex.problem(0.9), np.array([6.0, -3.0, 0.0]), 30, "ngd", 0.1).theta[:, 0, :2]
    np.testing.assert_allclose(ex.paths[(0.9, (6.0, -3.0), 0.1, 30)], single, atol=1e-12)
    fig = ex.draw(0.9, (6.0, -3.0), 0.1, 30)
    assert fig is ex.draw(0.0, (1.0, 2.0), 0.1, 30)  # one figure, redrawn; a new start computed on demand
    ax = fig.axes[0]
    assert len(fig.axes) == 1 and len(ax.images) == 1 and ax.lines[0].get_xydata()[0].tolist() == [1.0, 2.0]
    assert "0.00" in ax.get_title()
    assert np.all(ex.maps[0.9] != 1)  # at 0.9 the non-optimal scores tie: no local basin


def test_head_optimum_matches_a_linear_program():
    from scipy.optimize import linprog

    rng = np.random.default_rng(0)
    m, T, h = 40, 4, 6
    U = rng.normal(size=(m, T, h))
    support, region = al.experiments.local_convergence.head_optimum(U, -np.ones(m))
    for i in range(m):  # min Σ r_j s.t. r_j ≥ U_jᵀ s, r ≥ 0, s in the simplex
        c = np.concatenate([np.zeros(T), np.ones(h)])
        A_ub = np.hstack([U[i].T, -np.eye(h)])
        res = linprog(c, A_ub=A_ub, b_ub=np.zeros(h), A_eq=[[1.0] * T + [0.0] * h], b_eq=[1.0], bounds=(0, None))
        if res.fun <= 1e-9:
            continue  # a zero region or a zero vertex: the support is not unique
        assert not region[i]
        np.testing.assert_array_equal(support[i], res.x[:T] > 1e-7)
    positive, _ = al.experiments.local_convergence.head_optimum(U, np.ones(m))
    np.testing.assert_array_equal(positive.argmax(1), np.maximum(U, 0).sum(-1).argmax(1))


def test_svm_equivalence_runs_small():
    runs = al.experiments.local_convergence.svm_equivalence_runs(d_values=(4, 6), candidates=30, steps=600, seed=0)
    assert runs.candidates.tolist() == [30, 30]
    assert set(runs.d.tolist()) <= {4, 6} and len(runs.d) == runs.accepted.sum()
    assert (runs.masked_max <= al.experiments.local_convergence.SVMEQ_MASKED).all()
    for name in ("svmeq", "mm", "one_token"):
        assert runs.one_minus_corr[name].shape == (len(runs.d), len(runs.steps))
    # at the last step W^SVMeq is the projection of W on span{W_fin, W_dir}: never farther than W_dir
    assert np.all(runs.one_minus_corr["svmeq"][:, -1] <= runs.one_minus_corr["mm"][:, -1] + 1e-12)
    stats = al.experiments.local_convergence.svmeq_statistics(runs)
    assert stats["agreement_off"] < al.experiments.local_convergence.SVMEQ_AGREEMENT
    # the check's statistic against the nearest wrong answer, and its control (the two exchanged)
    assert stats["ratio_eq_off"] == pytest.approx(stats["ratio_one_token"] / stats["ratio_off"], rel=1e-12)
    assert stats["ratio_eq_off"] * stats["ratio_off_eq"] == pytest.approx(1.0, rel=1e-12)
    assert stats["ratio_eq_off"] < 1 < stats["ratio_off_eq"]
    # label +1 inputs whose head is dead at the trained attention are counted apart from the vertex claim
    alive = runs.head_value > 0
    well = runs.masked_max <= al.experiments.local_convergence.SVMEQ_WELL_MASKED
    assert stats["dead_positive"] == int((well[:, None] & (runs.y > 0) & ~alive).sum())
    assert stats["dead_positive_mixtures"] <= stats["dead_positive"]


def test_margin_rate_reads_the_step_length_and_the_svm_norm(fig1b):
    """NGD along p_mm(α=2): the margin grows by lr/‖p_mm‖ per step; a step 3% longer than the one the rate is
    read with reads 1.03, an SVM 15% too long 1.15, GD far below 1."""
    prob, _ = fig1b
    sol = al.max_margin(prob, select=[1])
    rate = al.experiments.local_convergence.margin_rate
    start = 40 * sol.theta[None]  # on the axis, far enough for token 1's pull to be negligible
    ngd = al.train(prob, start, 400, "ngd", 0.1, record_steps=[0, 200, 400])
    assert abs(rate(prob, [1], ngd.theta, ngd.steps, 1, 0.1, sol.theta)[0] - 1) < 1e-7
    longer = al.train(prob, start, 400, "ngd", 0.103, record_steps=[0, 200, 400])
    assert abs(rate(prob, [1], longer.theta, longer.steps, 1, 0.1, sol.theta)[0] - 1.03) < 1e-7
    assert abs(rate(prob, [1], ngd.theta, ngd.steps, 1, 0.1, 1.15 * sol.theta)[0] - 1.15) < 1e-7
    gd = al.train(prob, start, 400, "gd", 1.0, record_steps=[0, 200, 400])
    assert rate(prob, [1], gd.theta, gd.steps, 1, 0.1, sol.theta)[0] < 1e-3


def test_step_size_basins_small_steps_follow_the_flow_large_ones_move(fig1b):
    prob, _ = fig1b
    ex = al.experiments.local_convergence
    starts = al.datasets.SINGLE_INPUT_INITS
    r = ex.step_size_basins(prob, starts, [0.1, 1.0, 100.0], 400, 0.5, 100)
    assert r.L == pytest.approx(al.flow.smoothness_bound(prob))
    assert r.gd.shape == (3, 6, 1) and r.ngd.shape == r.flow.shape == (6, 1) and r.loss.shape == (3, 401, 6)
    # the reference: gradient flow from the starts, the same basins as NGD's Fig. 1(b)
    assert r.flow[:, 0].tolist() == [0, 0, 0, 0, 1, 1]
    assert [r.disagreements(g) for g in r.gd[:2]] == [0, 0]
    assert r.disagreements(r.gd[2]) > 0  # a step 100x above 1/L moves a start across the boundary
    # the curvature these paths meet is far below the global bound, and the loss never rises here
    assert np.all(r.path_curvature < r.L) and np.all(r.path_curvature > 0)
    assert r.monotone.all()
    # the official starts lie outside every band; the band grows with the step (first order: like η²·K)
    assert r.band.shape == r.in_band.shape == (3, 6) and not r.in_band[:2].any()
    assert np.all(r.band[0] < r.band[1]) and np.all(r.band[1] < 0.1)
    assert r.disagreements(r.gd[2], ~r.in_band[1]) > 0  # the control: GD at 100/L moves starts outside 1/L's band
    with pytest.raises(ValueError, match="products"):
        ex.step_size_basins(prob, starts, [0.0, 1.0], 10, 0.5, 10)


def test_boundary_pairs_straddle_the_flows_boundary_just_outside_gds_band(fig1b):
    prob, _ = fig1b
    ex = al.experiments.local_convergence
    y = np.linspace(8.0, -4.0, 13)
    line = np.stack([np.zeros_like(y), y, np.zeros_like(y)], axis=-1)
    r = ex.boundary_pairs(prob, line, 1.0, 100.0, 400, 0.5, 100, curvature_ratio=0.2)
    # Fig. 1(b): the boundary crosses x = 0 between the starts y0 = -0.5 and -1 (the flow sends them apart)
    assert -1.0 < r.crossing[1] < -0.5 and r.crossing[0] == r.crossing[2] == 0
    assert r.half_width == pytest.approx(1.0 / 8 / 2 / 8)  # one grid step, then two rounds of 7 inner points
    assert 0 < r.incidence <= 1 and 0 < r.band < 0.1
    assert r.distance == pytest.approx((1 + 0.2 / 3) * r.band / r.incidence + r.half_width)
    assert r.flow.tolist() == [0, 1]  # the two starts lie on either side: the first side of the line goes to p_mm*
    assert r.moved(r.gd) == 0 and r.moved(r.control) > 0 and r.moved(r.ngd) > 0
    # the boundary does not cross a line wholly inside one basin
    far = np.stack([np.zeros(5), np.linspace(8.0, 4.0, 5), np.zeros(5)], axis=-1)
    assert ex.boundary_pairs(prob, far, 1.0, 100.0, 400, 0.5, 100, curvature_ratio=0.2) is None
    with pytest.raises(ValueError, match="control_product"):
        ex.boundary_pairs(prob, line, 1.0, 0.5, 400, 0.5, 100, curvature_ratio=0.2)
    with pytest.raises(ValueError, match="line"):
        ex.boundary_pairs(prob, line[:, :2], 1.0, 100.0, 400, 0.5, 100, curvature_ratio=0.2)


def test_discretisation_band_holds_the_starts_gd_moves_across_the_boundary(fig1b):
    """Starts placed across the flow's basin boundary (Fig. 1(b), on the line p = (0, y0)): GD at η = 1/L sends
    some of them to another basin than the flow, and every one it moves lies within its band."""
    prob, _ = fig1b
    ex = al.experiments.local_convergence

    def basin(points):
        run = al.flow.gradient_flow(prob, points, times=np.array([0.0, 1e15]), rtol=1e-8, atol=1e-8)
        return prob.selection(run.theta[-1])[:, 0]

    lo, hi = -1.0, -0.5  # the flow sends (0, −1) to the local direction, (0, −0.5) to the global one
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if basin(np.array([[0.0, mid, 0.0]]))[0] == 1 else (lo, mid)
    shifts = np.array([-0.04, -0.02, -0.01, -0.005, -0.002, 0.002, 0.005, 0.01, 0.02, 0.04])
    starts = np.stack([0 * shifts, (lo + hi) / 2 + shifts, 0 * shifts], axis=-1)
    eta = 1.0 / float(al.flow.smoothness_bound(prob))
    gd = al.train(prob, starts, 400, "gd", eta)
    moved = basin(gd.final) != basin(starts)
    band = ex.discretisation_band(prob, gd.theta, eta)
    across = np.abs(shifts * ex.transverse_direction(prob, starts)[:, 1])  # distance across the flow lines
    assert moved.any() and not moved.all()
    assert np.all(across[moved] <= band[moved])
    with pytest.raises(ValueError, match="iterates"):
        ex.discretisation_band(prob, gd.theta[0], eta)
