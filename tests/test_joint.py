"""Joint training helpers (chapter 4): label SVM and the two p-SVMs, the rate-balanced prediction,
the random generator and the alignment classes, against closed forms and independent solves."""

import numpy as np
import pytest
from scipy.optimize import minimize

import attnlib as al


def official(h):
    X, y = al.datasets.joint_tokens(third=(0.5, h))
    return X, y, al.joint_svms(X, y, select=1)


def test_official_sets_support_and_svms():
    # First set: every sample is a support vector and the two p-SVMs coincide at (4/3, 1/3).
    _, _, tight = official(1.0)
    assert tight.support.tolist() == [True, True, True]
    np.testing.assert_allclose(tight.label.v, [0.0, 1.0], atol=1e-8)
    np.testing.assert_allclose(tight.full.theta, [4 / 3, 1 / 3], atol=1e-7)
    np.testing.assert_allclose(tight.relaxed.theta, tight.full.theta, atol=1e-9)
    assert tight.separation < 1e-5
    # Second set: sample 3 has label margin 1.5 and is relaxed; full (5/4, 1/4), relaxed (1, 0).
    _, _, relaxed = official(1.5)
    assert relaxed.support.tolist() == [True, True, False]
    np.testing.assert_allclose(relaxed.label_margins, [1.0, 1.0, 1.5], atol=1e-8)
    np.testing.assert_allclose(relaxed.full.theta, [1.25, 0.25], atol=1e-7)
    np.testing.assert_allclose(relaxed.relaxed.theta, [1.0, 0.0], atol=1e-7)
    assert relaxed.relaxed.relax.tolist() == [False, False, True]
    assert relaxed.separation == pytest.approx(np.degrees(np.arctan(0.2)), abs=1e-5)


def test_joint_svms_uses_keys_and_selection():
    X, y = al.datasets.joint_tokens(relaxed=True)
    # Swapping the two tokens and selecting token 0 is the same problem.
    swapped = al.joint_svms(X[:, ::-1], y, select=np.zeros(3, int))
    np.testing.assert_allclose(swapped.relaxed.theta, [1.0, 0.0], atol=1e-7)
    # Keys k = W x with W = 2 I halve every p-SVM; the label SVM does not depend on W.
    scaled = al.joint_svms(X, y, select=1, W=2 * np.eye(2))
    np.testing.assert_allclose(scaled.full.theta, [0.625, 0.125], atol=1e-7)
    np.testing.assert_allclose(scaled.label.v, [0.0, 1.0], atol=1e-8)
    for bad in (2, [1, 1], np.array([1.0, 1.0, 1.0])):
        with pytest.raises(ValueError, match="select"):
            al.joint_svms(X, y, select=bad)
    with pytest.raises(ValueError, match="W"):
        al.joint_svms(X, y, select=1, W=np.eye(3))


def _relaxed_by_slsqp(X, y, support):
    G = X[:, 1] - X[:, 0]
    h = np.where(support, 1.0, 0.0)
    cons = [{"type": "ineq", "fun": lambda p, g=g, c=c: g @ p - c, "jac": lambda p, g=g: g} for g, c in zip(G, h)]
    res = minimize(
        lambda p: p @ p,
        x0=np.array([5.0, 0.0]),
        jac=lambda p: 2 * p,
        constraints=cons,
        method="SLSQP",
        options={"ftol": 1e-14, "maxiter": 500},
    )
    assert res.success
    return res.x


@pytest.mark.parametrize("seed", range(6))
def test_random_relaxed_svm_matches_slsqp(seed):
    X, y = al.datasets.random_joint_tokens(n=6, seed=seed)
    svms = al.joint_svms(X, y, select=1)
    # Support vectors are exactly the samples at the smallest label margin.
    np.testing.assert_array_equal(svms.support, np.isclose(svms.label_margins, svms.label_margins.min(), atol=1e-6))
    np.testing.assert_allclose(svms.relaxed.theta, _relaxed_by_slsqp(X, y, svms.support), atol=1e-5)
    np.testing.assert_allclose(svms.full.theta, _relaxed_by_slsqp(X, y, np.ones(6, bool)), atol=1e-5)


def _balanced_by_grid(svms, rho):
    # Independent solve in 2-D: scan the unit circle (the optimum of a max-min of affine functions with
    # a positive value lies on the sphere), then zoom in around the best angle.
    G = svms.keys[:, 1] - svms.keys[:, 0]
    shift = rho * (svms.label_margins - svms.label_margins.min())

    def best_angle(angles):
        S = np.stack([np.cos(angles), np.sin(angles)], axis=-1) @ G.T
        value = np.where(np.all(S >= -1e-12, axis=-1), np.min(S + shift, axis=-1), -np.inf)
        return angles[np.argmax(value)]

    a = best_angle(np.linspace(-np.pi, np.pi, 100_001))
    a = best_angle(np.linspace(a - 1e-4, a + 1e-4, 100_001))
    return np.array([np.cos(a), np.sin(a)])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("rho", [0.0, 0.5, 1.0, 3.0])
def test_balanced_direction_matches_grid_search(seed, rho):
    X, y = al.datasets.random_joint_tokens(n=5, seed=seed)
    svms = al.joint_svms(X, y, select=1)
    assert al.angle_degrees(al.svm.balanced_direction(svms, rho), _balanced_by_grid(svms, rho)) < 5e-3


def test_balanced_direction_limits_and_the_official_boundary():
    _, _, svms = official(1.2)
    assert al.angle_degrees(al.svm.balanced_direction(svms, 0.0), svms.full.theta) < 1e-4
    assert al.angle_degrees(al.svm.balanced_direction(svms, 100.0), svms.relaxed.theta) < 1e-4
    # Closed form for (0.5, h): rows (1,1), (1,-1) at exponent cos a ± sin a, row 3 at
    # 0.5 cos a + h sin a + rho (h - 1); at rho = 1 the optimum has cos a - sin a = 0.5 cos a + h sin a + h - 1.
    a = al.svm.balanced_direction(svms, 1.0)
    assert a[0] - a[1] == pytest.approx(0.5 * a[0] + 1.2 * a[1] + 0.2, abs=1e-7)
    # The paper's second set sits exactly on the boundary: p_hat(1) is the relaxed SVM (1, 0).
    _, _, paper = official(1.5)
    assert al.angle_degrees(al.svm.balanced_direction(paper, 1.0), [1.0, 0.0]) < 1e-4
    with pytest.raises(ValueError, match="rho"):
        al.svm.balanced_direction(svms, -1.0)


def test_joint_ngd_follows_the_prediction():
    # The page's claim in one line: equal-rate NGD ends where p_hat(1) says, not on the relaxed SVM.
    X, y, svms = official(1.2)
    traj = al.train_joint(X, y, al.datasets.JOINT_P0, al.datasets.JOINT_V0, steps=1000, record_every=1000)
    p, v = traj.p[-1, 0], traj.v[-1, 0]
    assert al.angle_degrees(p, al.svm.balanced_direction(svms, 1.0)) < 0.2
    assert al.angle_degrees(p, svms.relaxed.theta) > 5.0
    assert al.cosine(v, svms.label.v) > 0.9999


def test_random_joint_tokens_recipe():
    X, y = al.datasets.random_joint_tokens(n=8, d=4, seed=3, tight=3, gap=(0.5, 0.7), attention=(0.4, 0.9))
    assert X.shape == (8, 2, 4) and set(y.tolist()) == {-1.0, 1.0}
    assert np.all(X[:, 0] == 0)
    assert np.all((X[:, 1, 0] >= 0.4) & (X[:, 1, 0] <= 0.9))
    planted = y * X[:, 1, 1]
    assert np.sum(np.isclose(planted, 1.0)) == 3
    assert np.all((planted == 1.0) | ((planted >= 1.5) & (planted <= 1.7)))
    again, _ = al.datasets.random_joint_tokens(n=8, d=4, seed=3, tight=3, gap=(0.5, 0.7), attention=(0.4, 0.9))
    np.testing.assert_array_equal(X, again)
    assert not np.array_equal(X, al.datasets.random_joint_tokens(n=8, d=4, seed=4)[0])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n=1), "n must"),
        (dict(d=1), "d must"),
        (dict(n=4, tight=5), "tight"),
        (dict(gap=(0.5, 0.1)), "gap"),
        (dict(attention=(0.0, 1.0)), "attention"),
    ],
)
def test_random_joint_tokens_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        al.datasets.random_joint_tokens(**kwargs)


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


def test_angle_degrees_is_accurate_for_tiny_angles():
    eps = 1e-10
    assert al.angle_degrees([np.cos(eps), np.sin(eps)], [1.0, 0.0]) == pytest.approx(np.degrees(eps), rel=1e-6)
    np.testing.assert_allclose(al.angle_degrees([[0.0, 1.0], [-1.0, 0.0]], [1.0, 0.0]), [90.0, 180.0])


def test_offset_tolerance_passes_a_bounded_offset_and_rejects_another_direction():
    t = np.arange(0, 401)
    r = 0.1 * t + 1.0
    # theta = r (1, 0) + offset (0, 0.3 + 0.2 exp(-t/50)): bounded offset, converging from above.
    good = np.stack([r, 0.3 + 0.2 * np.exp(-t / 50)], axis=-1)
    gap, tol, c = al.metrics.offset_tolerance(t, good, [1.0, 0.0])
    assert gap <= tol
    assert c == pytest.approx(1.5 * (0.3 + 0.2 * np.exp(-2.0)), rel=1e-12)  # max over [T/4, T/2] at T/4
    np.testing.assert_allclose(tol, c**2 / (2 * np.linalg.norm(good[-1]) ** 2))
    # A run heading to a direction 2 degrees away: offset ~ |theta| sin 2deg, doubles from T/2 to T.
    a = np.radians(2.0)
    bad = r[:, None] * np.array([np.cos(a), np.sin(a)])
    gap, tol, _ = al.metrics.offset_tolerance(t, bad, [1.0, 0.0])
    assert gap > tol
    # Batched over runs, and the rounding floor when the offset vanishes.
    both = np.stack([good, r[:, None] * np.array([1.0, 0.0])], axis=1)
    gap, tol, _ = al.metrics.offset_tolerance(t, both, [1.0, 0.0])
    assert gap.shape == (2,) and tol[1] == 1e-14 and gap[1] == 0.0
    with pytest.raises(ValueError, match="same length"):
        al.metrics.offset_tolerance(t[:-1], good, [1.0, 0.0])
    with pytest.raises(ValueError, match=r"\[T/4, T/2\]"):
        al.metrics.offset_tolerance(np.array([0, 100]), good[[0, -1]], [1.0, 0.0])


def test_offset_tolerance_on_the_official_joint_runs():
    # Second set: p meets the test against the relaxed p-SVM and fails it against the full one.
    X, y, svms = official(1.5)
    traj = al.train_joint(X, y, al.datasets.JOINT_P0, al.datasets.JOINT_V0, steps=400)
    gap, tol, _ = al.metrics.offset_tolerance(traj.steps, traj.p[:, 0], svms.relaxed.theta)
    assert gap <= tol
    gap, tol, _ = al.metrics.offset_tolerance(traj.steps, traj.p[:, 0], svms.full.theta)
    assert gap > 2 * tol
    # The linear loss sends v towards sum_i y_i x_i, not v_mm: once v has turned (1000 steps), the test fails.
    linear = al.train_joint(X, y, al.datasets.JOINT_P0, al.datasets.JOINT_V0, steps=1000, loss="linear")
    gap, tol, _ = al.metrics.offset_tolerance(linear.steps, linear.v[:, 0], svms.label.v)
    assert gap > tol


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


# ---------------------------------------------------------------------- batched runs and the joint regularization path


def test_train_joint_stack_matches_separate_runs():
    sets = [al.datasets.joint_tokens(relaxed=r) for r in (False, True)]
    sets += [al.datasets.joint_tokens(third=(0.5, h)) for h in (1.2, 1.8)]
    rng = np.random.default_rng(3)
    p0, v0 = rng.standard_normal((2, 2)), rng.standard_normal((2, 2))
    stacked = al.optim.train_joint_stack(sets, p0, v0, steps=120, record_every=7)
    for (X, y), traj in zip(sets, stacked):
        one = al.train_joint(X, y, p0, v0, steps=120, record_every=7)
        np.testing.assert_allclose(traj.p, one.p, rtol=1e-11, atol=1e-12)
        np.testing.assert_allclose(traj.v, one.v, rtol=1e-11, atol=1e-12)
        np.testing.assert_allclose(traj.loss, one.loss, rtol=1e-11)
        np.testing.assert_array_equal(traj.steps, one.steps)
        assert traj.problem.X.shape == X.shape
    cut = al.optim.truncate_joint(stacked[0], 50)
    assert cut.steps[-1] <= 50 and cut.p.shape[0] == cut.steps.size
    with pytest.raises(ValueError, match="one shape"):
        al.optim.train_joint_stack([sets[0], al.datasets.random_joint_tokens(n=5, seed=0)], p0, v0, steps=5)


def test_stacked_joint_attention_rows_match_joint_attention():
    sets = [al.datasets.random_joint_tokens(n=4, seed=k) for k in range(3)]
    X, y = np.stack([s[0] for s in sets]), np.stack([s[1] for s in sets])
    rows = al.model.StackedJointAttention(X, y, np.eye(2), "logistic")
    rng = np.random.default_rng(0)
    p, v = rng.standard_normal((5, 3, 2)), rng.standard_normal((5, 3, 2))
    gp, gv = rows.grad(p, v)
    for r, (Xr, yr) in enumerate(sets):
        one = al.JointAttention(Xr, yr, np.eye(2), "logistic")
        a, b = one.grad(p[:, r], v[:, r])
        np.testing.assert_allclose(gp[:, r], a, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(gv[:, r], b, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(rows.value(p, v)[:, r], one.value(p[:, r], v[:, r]), rtol=1e-13)


def test_joint_log_gap_matches_the_direct_difference():
    X, y = al.datasets.joint_tokens(relaxed=True)
    keys, sel = X, np.ones(3, int)
    rng = np.random.default_rng(1)
    p, v = 2 * rng.standard_normal((6, 2)), 2 * rng.standard_normal((6, 2))
    joint = al.JointAttention(X, y, np.eye(2), "logistic")
    gamma = y[:, None] * np.einsum("bd,itd->bit", v, X)
    floor = np.mean(np.logaddexp(0.0, -gamma[:, np.arange(3), sel]), axis=-1)
    lg, sign = al.paths.joint_log_gap(X, y, keys, sel, p, v, "logistic")
    np.testing.assert_allclose(sign * np.exp(lg), joint.value(p, v) - floor, rtol=1e-8, atol=1e-15)
    np.testing.assert_allclose(
        al.paths.joint_log_loss(X, y, keys, p, v, "logistic"), np.log(joint.value(p, v)), rtol=1e-12
    )
    lg_far, s_far = al.paths.joint_log_gap(X, y, keys, sel, np.array([1000.0, 0.0]), np.array([0.0, 1e6]), "logistic")
    assert s_far == 1.0 and np.isfinite(lg_far) and lg_far < -1e5  # far below the float range of L


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


def test_joint_path_at_equal_radii_goes_to_the_balanced_direction():
    """R_v = R_p: the path ends at p_hat(1), not at the relaxed SVM; R_v = R_p^2: at the relaxed SVM."""
    X, y = al.datasets.random_joint_tokens(n=6, d=2, seed=[0, 4])
    svms = al.joint_svms(X, y, select=1)
    balanced = al.svm.balanced_direction(svms, rho=1.0)
    assert al.angle_degrees(balanced, svms.relaxed.theta) > 2.0
    radii = np.array([1000.0])
    equal = al.paths.joint_regularization_path(X, y, 1, radii, radii)
    squared = al.paths.joint_regularization_path(X, y, 1, radii, radii**2)
    assert al.angle_degrees(equal.p[-1], balanced) < 0.1
    assert al.angle_degrees(squared.p[-1], svms.relaxed.theta) < 0.1


# ---------------------------------------------------------------------- reading joint runs and paths


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
    stack = al.optim.train_joint_stack(sets, P0, V0, 100)
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


def _balanced_by_cvxpy(svms, rho):
    import cvxpy as cp

    n, T, dk = svms.keys.shape
    rows = np.ones((n, T), bool)
    rows[np.arange(n), svms.select] = False
    D = (svms.keys[np.arange(n), svms.select][:, None, :] - svms.keys)[rows]
    s = (rho * (svms.label_margins - svms.label_margins.min()))[:, None].repeat(T, 1)[rows]
    p, tau = cp.Variable(dk), cp.Variable()
    cp.Problem(cp.Maximize(tau), [D @ p + s >= tau, D @ p >= 0, cp.norm(p) <= 1]).solve(solver=cp.CLARABEL)
    return p.value, D, s


@pytest.mark.parametrize("seed", range(6))
def test_balanced_direction_by_bisection_matches_the_cone_program_without_falling_back(seed, monkeypatch):
    """The exact bisection answers (no cvxpy fallback), and its objective is at least the SOCP solver's."""
    import attnlib.svm as svm

    def no_fallback(D, s):
        p = bisect(D, s)
        assert p is not None
        return p

    bisect = svm._balanced_by_bisection
    monkeypatch.setattr(svm, "_balanced_by_bisection", no_fallback)
    X, y = al.datasets.random_joint_tokens(n=6, d=2, seed=[seed, 7])
    D_ = al.datasets.planted_tokens(6, 4, 4, seed=seed)
    for svms in (
        al.joint_svms(X, y, select=1),
        al.svm.decoder_svms(al.model.joint_self_attention(D_.X, D_.y), D_.signal),
    ):
        for rho in (0.0, 1.0, 5.0):
            p = al.svm.balanced_direction(svms, rho)
            q, D, s = _balanced_by_cvxpy(svms, rho)
            assert abs(np.linalg.norm(p) - 1) < 1e-12 and np.min(D @ p) >= -1e-9
            assert np.min(D @ p + s) >= np.min(D @ q + s) - 1e-8  # as good as the SOCP, to its tolerance
            assert al.angle_degrees(p, q) < 1e-2
