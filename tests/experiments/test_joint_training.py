"""Chapter experiments: attnlib.experiments.joint_training."""

import dataclasses

import numpy as np
import pytest

import attnlib as al


def official(h):
    X, y = al.datasets.joint_tokens(third=(0.5, h))
    return X, y, al.joint_svms(X, y, select=1)


def test_classify_alignment():
    _, _, svms = official(1.5)  # relaxed (1, 0), full along (5, 1): separation atan(0.2) = 11.3 degrees
    sep = np.radians(svms.separation)
    at = lambda frac: [np.cos(frac * sep), np.sin(frac * sep)]  # noqa: E731
    P = np.array([at(0.0), at(0.2), at(0.5), at(0.8), at(1.0), at(1.2), at(-0.3)])
    expected = ["relaxed", "relaxed", "neither", "full", "full", "full", "neither"]
    assert al.experiments.joint_training.classify_alignment(P, svms).tolist() == expected
    assert al.experiments.joint_training.classify_alignment(P[0], svms).shape == ()
    _, _, tight = official(1.0)
    assert set(al.experiments.joint_training.classify_alignment(P, tight).tolist()) == {"same"}
    with pytest.raises(ValueError, match="fraction"):
        al.experiments.joint_training.classify_alignment(P, svms, fraction=0.5)


def test_random_joint_runs_rows_and_records():
    runs = al.experiments.joint_training.random_joint_runs(seed=3, instances=3, n=5, inits=2, steps=400)
    assert runs.p.shape == (6, 2) and len(runs.svms) == 3 and runs.predicted.shape == (3, 2)
    assert runs.instance.tolist() == [0, 0, 1, 1, 2, 2] and runs.init.tolist() == [0, 1] * 3
    # Same data and first initialisation as a direct run.
    X, y = al.datasets.random_joint_tokens(n=5, d=2, seed=[3, 1])
    traj = al.train_joint(X, y, al.datasets.JOINT_P0, al.datasets.JOINT_V0, steps=400)
    np.testing.assert_allclose(runs.p[2], traj.p[-1, 0], rtol=1e-12)
    svms = runs.svms[1]
    np.testing.assert_allclose(runs.v_gap[2], al.one_minus_cosine(traj.v[-1, 0], svms.label.v), rtol=1e-9, atol=1e-300)
    mass = np.exp(traj.problem.log_attention(traj.p[-1, 0])[:, 1])
    assert runs.sv_mass[2] == pytest.approx(mass[svms.support].min())
    assert set(runs.observed.tolist()) <= set(al.experiments.joint_training.ALIGNMENT_CLASSES)
    assert runs.zero_row.shape == (3,) and runs.on_selection.dtype == bool
    for bad, match in ((dict(instances=0), "instances"), (dict(inits=0), "inits"), (dict(records=2), "records")):
        with pytest.raises(ValueError, match=match):
            al.experiments.joint_training.random_joint_runs(seed=0, **{"instances": 1, **bad})


def test_joint_path_on_the_papers_sets_follows_the_relaxed_svm_within_its_bounds():
    sets = [al.datasets.joint_tokens(relaxed=r) for r in (False, True)]
    radii = np.array([100.0, 1000.0])
    X, y = np.stack([s[0] for s in sets]), np.stack([s[1] for s in sets])
    path = al.paths.joint_regularization_path(X, y, 1, radii, radii**2)
    assert path.p.shape == (2, 2, 2) and not path.unsettled
    for s, (Xs, ys) in enumerate(sets):
        svms = al.joint_svms(Xs, ys, select=1)
        one = al.paths.joint_regularization_path(Xs, ys, 1, radii, radii**2)
        np.testing.assert_allclose(one.p, path.p[s], atol=1e-9)
        v_bound, p_bound, _, same = al.experiments.joint_training.joint_path_bounds(Xs, ys, np.ones(3, int), one, svms)
        assert same
        assert np.all(al.one_minus_cosine(one.v, svms.label.v) <= v_bound)
        assert np.all(al.one_minus_cosine(one.p, svms.relaxed.theta) <= p_bound)
        if s == 1:  # the full p-SVM is the wrong reference: the same test fails
            assert al.one_minus_cosine(one.p[-1], svms.full.theta) > 5 * p_bound[-1]


def test_selected_mass_and_confidence_against_their_definitions():
    X, y = al.datasets.joint_tokens(relaxed=True)
    traj = al.train_joint(X, y, al.datasets.JOINT_P0, al.datasets.JOINT_V0, steps=20)
    mass = al.experiments.joint_training.selected_mass(traj, 1)
    assert mass.shape == (21, 1, 3)
    logits = np.einsum("rbk,itk->rbit", traj.p, X)  # W = I: keys are the tokens
    np.testing.assert_allclose(mass, np.exp(logits[..., 1]) / np.exp(logits).sum(-1), rtol=1e-12)
    f = np.einsum("rbd,itd,rbit->rbi", traj.v, X, np.exp(logits) / np.exp(logits).sum(-1, keepdims=True))
    conf = al.experiments.joint_training.classifier_confidence(traj)
    np.testing.assert_allclose(conf, 1 / (1 + np.exp(-y * f)), rtol=1e-12)
    big = al.train_joint(X, y, al.datasets.JOINT_P0, al.datasets.JOINT_V0, steps=3000, lr=1.0)
    assert np.all(np.isfinite(al.experiments.joint_training.classifier_confidence(big)))  # no overflow at large outputs


def test_arc_position_is_zero_at_the_relaxed_svm_one_at_the_full_and_signed():
    _, _, svms = official(1.5)
    a_rel = np.arctan2(*svms.relaxed.theta[::-1])
    a_full = np.arctan2(*svms.full.theta[::-1])
    angles = a_rel + np.array([0.0, 0.5, 1.0, -0.5, 2.0]) * (a_full - a_rel)
    P = 3.0 * np.stack([np.cos(angles), np.sin(angles)], -1)
    np.testing.assert_allclose(
        al.experiments.joint_training.arc_position(P, svms), [0.0, 0.5, 1.0, -0.5, 2.0], atol=1e-12
    )


def test_train_joint_ratio_moves_v_rho_times_faster_and_is_the_stack_at_rho_1():
    sets = [al.datasets.joint_tokens(relaxed=r) for r in (False, True)]
    P0, V0 = al.datasets.JOINT_P0, al.datasets.JOINT_V0
    one = al.experiments.joint_training.train_joint_ratio(sets, P0, V0, 100, rho=1.0)
    stack = al.optim.train_joint_stack([al.JointAttention(X, y, np.eye(2), "logistic") for X, y in sets], P0, V0, 100)
    for a, b in zip(one, stack):
        np.testing.assert_allclose(a.p, b.p, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(a.v, b.v, rtol=1e-12, atol=1e-12)
    fast = al.experiments.joint_training.train_joint_ratio(sets, P0, V0, 300, rho=4.0)[1]
    step_p = np.linalg.norm(np.diff(fast.p[:, 0], axis=0), axis=-1)
    step_v = np.linalg.norm(np.diff(fast.v[:, 0], axis=0), axis=-1)
    np.testing.assert_allclose(step_p, 0.1, rtol=1e-9)  # NGD: every move has length eta on p ...
    np.testing.assert_allclose(step_v, 0.4, rtol=1e-9)  # ... and rho * eta on v
    np.testing.assert_array_equal(fast.problem.X, sets[1][0])  # the original data, not rho X
    # the loss recorded is the loss of the original problem at (p, v)
    np.testing.assert_allclose(fast.loss, fast.problem.value(fast.p, fast.v), rtol=1e-10)
    with pytest.raises(ValueError, match="rho"):
        al.experiments.joint_training.train_joint_ratio(sets, P0, V0, 10, rho=0.0)


def test_joint_path_rows_and_table_read_the_path_against_the_svms():
    sets = [al.datasets.joint_tokens(relaxed=r) for r in (False, True)]
    radii = np.array([100.0, 1000.0])
    X, y = np.stack([s[0] for s in sets]), np.stack([s[1] for s in sets])
    path = al.paths.joint_regularization_path(X, y, 1, radii, radii**2)
    svms = [al.joint_svms(*s, select=1) for s in sets]
    rows = al.experiments.joint_training.joint_path_rows(path, X, y, svms, 1)
    given = al.experiments.joint_training.joint_path_rows(
        path, X, y, svms, 1, [al.svm.balanced_direction(s) for s in svms]
    )
    assert rows == given
    assert [r["cls"] for r in rows] == ["same", "relaxed"]
    assert all(r["v_ratio"] <= 1 and r["p_ratio"] <= 1 for r in rows)
    assert rows[1]["full_ratio"] > 5  # the wrong reference fails the same bound
    np.testing.assert_allclose(rows[1]["to_full"], svms[1].separation, atol=0.05)
    table = al.experiments.joint_training.joint_path_table({("paper", 2.0): rows}, {"paper": ["tight", "relaxed"]})
    lines = table.splitlines()
    assert len(lines) == 4 and lines[2].startswith("| tight | 2 |") and lines[3].endswith("| relaxed |")


def test_joint_path_search_gap_passes_the_search_and_flags_a_missed_minimiser():
    """The path's point is no worse than an independent grid in either block; a point turned by 1 degree
    (a search that missed), or a path whose p is replaced by a worse angle, is beaten; bad grids are refused."""
    ex = al.experiments.joint_training
    for seed in (0, 7):
        X, y = al.datasets.joint_tokens(relaxed=True, seed=seed)
        path = al.paths.joint_regularization_path(X, y, 1, [300.0], [300.0**2])
        gap = ex.joint_path_search_gap(X, y, np.ones(3, int), path, rotations=(0.0, -1.0, 1.0, 0.3))
        assert gap.shape == (4, 2) and np.all(gap[0] <= 0) and np.all(gap[1:] > 0)
        # a stale search: its p from another radius' direction turned by 2 degrees
        wrong = dataclasses.replace(path, p=al.metrics.rotate_toward(path.p[-1], [0.0, 1.0], 2.0)[None])
        assert ex.joint_path_search_gap(X, y, np.ones(3, int), wrong)[0, 1] > 0
    with pytest.raises(ValueError, match="grid"):
        ex.joint_path_search_gap(X, y, np.ones(3, int), path, grid=3)


def test_offset_growth_passes_a_settling_offset_and_fails_a_turned_reference():
    ex = al.experiments.joint_training
    t = np.arange(0, 201.0)
    run = np.stack([t + 1.0, 2.0 - 1.0 / (t + 1.0)], -1)  # NGD-like: norm ~ t, offset settling at 2
    assert ex.offset_growth(t, run, [1.0, 0.0]) <= 1
    for degrees in (0.5, -0.5, 5.0):
        turned = al.metrics.rotate_toward([1.0, 0.0], [0.0, 1.0], degrees)
        assert ex.offset_growth(t, run, turned) == pytest.approx(2 / 1.5, rel=0.05)
    # one reference per run, (B, d): the same as one at a time
    runs = np.stack([run, run[:, ::-1]], 1)
    refs = np.array([[1.0, 0.0], [0.0, 1.0]])
    np.testing.assert_allclose(ex.offset_growth(t, runs, refs), [ex.offset_growth(t, run, refs[0])] * 2)
    # a turning offset (a fast mode of one sign, then a slow 1/t mode of the other), turning inside the
    # early window: the net change over [T/4, T/2] nearly cancels (2.85 times too small), the spread does not
    long = np.arange(0, 1001.0)
    turning = np.stack([long + 1.0, 0.3 * np.exp(-0.03 * long) - 0.1 / (long + 10.0)], -1)
    assert ex.offset_growth(long, turning, [1.0, 0.0]) <= 1
    # an exponential mode exp(-a t) passes when a T >= 0.78 and looks like a wrong direction below (its bound)
    for aT, ok in ((0.85, True), (0.7, False)):
        mode = np.stack([t + 1.0, 1.0 - np.exp(-aT / 200 * t)], -1)
        assert bool(ex.offset_growth(t, mode, [1.0, 0.0]) <= 1) is ok
    with pytest.raises(ValueError, match="slack"):
        ex.offset_growth(t, run, [1.0, 0.0], slack=0.5)
    with pytest.raises(ValueError, match="same length"):
        ex.offset_growth(t[:-1], run, [1.0, 0.0])


def _joint_hessian(joint, p, v, h=1e-5):
    """Central finite differences of the joint gradient: the Hessian in (p, v), (4, 4)."""
    z = np.concatenate([p, v])
    k = len(p)

    def grad(z):
        gp, gv = joint.grad(z[:k], z[k:])
        return np.concatenate([gp, gv])

    H = np.stack([(grad(z + h * e) - grad(z - h * e)) / (2 * h) for e in np.eye(len(z))])
    return (H + H.T) / 2


def test_joint_smoothness_bound_is_above_the_hessian_on_its_ball():
    ex = al.experiments.joint_training
    rng = np.random.default_rng(0)
    for X, y in [al.datasets.joint_tokens(relaxed=True), al.datasets.random_joint_tokens(n=5, d=2, seed=[1, 0])]:
        joint = al.JointAttention(X, y, np.eye(2), "logistic")
        for radius in (1.0, 10.0):
            bound = ex.joint_smoothness_bound(joint, radius)
            worst = 0.0
            for _ in range(200):
                p = rng.normal(size=2) * rng.uniform(0, 6)
                v = rng.normal(size=2)
                v *= radius * rng.uniform(0, 1) / np.linalg.norm(v)
                worst = max(worst, np.abs(np.linalg.eigvalsh(_joint_hessian(joint, p, v))).max())
            assert 0 < worst <= bound
    with pytest.raises(ValueError, match="radius"):
        ex.joint_smoothness_bound(joint, 0.0)


def test_joint_gradient_flow_is_the_limit_of_small_gd_steps_and_gd_below_1_over_L_stays_in_its_ball():
    ex = al.experiments.joint_training
    X, y = al.datasets.joint_tokens(relaxed=True)
    joint = al.JointAttention(X, y, np.eye(2), "logistic")
    gd = al.optim.train_joint_problem(joint, [0.0, -1.0], [-1.0, 0.0], 2000, method="gd", lr=1e-3, record_every=500)
    t, p, v, _ = ex.joint_gradient_flow(joint, [0.0, -1.0], [-1.0, 0.0], times=gd.steps * 1e-3)
    np.testing.assert_allclose(p, gd.p[:, 0], atol=2e-3)
    np.testing.assert_allclose(v, gd.v[:, 0], atol=2e-3)
    traj, radius, lr = ex.train_joint_below_smoothness(joint, [0.0, -1.0], [-1.0, 0.0], 200, 0.5)
    assert radius > 0.5  # the start has ||v|| = 1: the ball was enlarged
    assert np.linalg.norm(traj.v, axis=-1).max() <= radius
    assert lr == pytest.approx(1 / ex.joint_smoothness_bound(joint, radius))
    assert np.all(np.diff(traj.loss[:, 0]) <= 1e-15)  # below 1/L on its ball: GD descends
    with pytest.raises(ValueError, match="times"):
        ex.joint_gradient_flow(joint, [0.0, -1.0], [-1.0, 0.0], times=[1.0, 2.0])


def test_random_joint_runs_records_the_heads_for_offset_growth():
    runs = al.experiments.joint_training.random_joint_runs(seed=3, instances=2, n=5, inits=2, steps=400)
    assert runs.v_path.shape == (len(runs.steps), 4, 2)
    np.testing.assert_allclose(
        runs.v_path[-1, 2],
        al.train_joint(
            *al.datasets.random_joint_tokens(n=5, d=2, seed=[3, 1]),
            al.datasets.JOINT_P0,
            al.datasets.JOINT_V0,
            steps=400,
        ).v[-1, 0],
        rtol=1e-12,
    )
