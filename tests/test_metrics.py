"""The core: attnlib.metrics."""

import matplotlib
import numpy as np
import pytest

import attnlib as al

matplotlib.use("Agg")
from scipy.optimize import minimize

from attnlib import paths  # noqa: E402


def official(h):
    X, y = al.datasets.joint_tokens(third=(0.5, h))
    return X, y, al.joint_svms(X, y, select=1)


# ---------------------------------------------------------------------------------- many problems
def _random_problems(count, family="random", d=3, n=3, T=4):
    return [al.datasets.random_tokens(n=n, T=T, d=d, seed=s, family=family) for s in range(count)]


def unequal_multi_input(seed=0):
    """The [MMTS] multi-input data with unequal non-optimal scores (chapter 1's theorem does not apply)."""
    scores = np.random.default_rng(100 + seed).uniform(0.0, 0.9, size=(3, 6))
    return al.datasets.multi_input(seed, nonopt_scores=scores)


@pytest.fixture(scope="module")
def multi():
    prob = unequal_multi_input(0)
    radii = np.array([1.0, 3.0, 10.0, 30.0, 100.0])
    return prob, al.max_margin(prob), al.regularization_path(prob, radii, n_starts=3, seed=0)


def test_cone_starts_inside_the_cone():
    d = np.array([[1.0, -2.0], [0.5, 3.0]])  # a matrix direction (W version)
    mu, radius = 1e-2, 7.0
    s = al.datasets.cone_starts(d, 50, mu=mu, radius=radius, rng=1)
    assert s.shape == (50, 2, 2)
    assert np.allclose(np.linalg.norm(s.reshape(50, -1), axis=-1), radius * np.linalg.norm(d))
    omc = al.one_minus_cosine(s, d)
    assert np.all(omc <= mu * (1 + 1e-12)) and omc.max() > 0.5 * mu  # angles fill the cone
    edge = al.datasets.cone_starts(d, 4, mu=mu, radius=radius, rng=1, edge=True)
    assert np.allclose(al.one_minus_cosine(edge, d), mu, rtol=1e-9)
    off = edge - radius * (1 - mu) * d  # tilts of an antipodal pair cancel
    assert np.allclose(off[0] + off[1], 0.0) and np.allclose(off[2] + off[3], 0.0)
    # Same seed, same starts; the span is respected (the third coordinate stays 0).
    a = al.datasets.cone_starts([1.0, 1.0, 0.0], 5, mu=mu, radius=2.0, rng=3, span=np.eye(3)[:2])
    assert np.array_equal(a, al.datasets.cone_starts([1.0, 1.0, 0.0], 5, mu=mu, radius=2.0, rng=3, span=np.eye(3)[:2]))
    assert np.all(a[:, 2] == 0.0)


def test_offset_exponent_separates_a_bounded_offset_from_a_fixed_angle():
    d = np.array([1.0, 0.0, 0.0])
    start = np.array([[10.0, 2.0, 1.0], [10.0, 2.0, 1.0], [10.0, 2.0, 1.0]])
    end = np.array([[80.0, 2.0, 1.0], [80.0, 16.0, 8.0], [80.0, 2.0 * 8**0.5, 8**0.5]])
    assert np.allclose(
        al.metrics.offset_exponent(start, end, d), [0.0, 1.0, 0.5], atol=0.01
    )  # the last: offset ~ norm^(1/2)
    # Matrices (W) are measured in the Frobenius norm, with a batch axis.
    W0, W1 = np.eye(2)[None] * [[[10.0]]], np.eye(2)[None] * [[[40.0]]]
    W0[..., 0, 1], W1[..., 0, 1] = 1.0, 4.0
    assert np.allclose(al.metrics.offset_exponent(W0, W1, np.eye(2)), 1.0)
    # On a run of the paper's single-input instance: the global SVM gives a small exponent, a wrong one about 1.
    prob = al.datasets.single_input()
    run = al.train(prob, np.zeros((1, 3)), 2000, method="ngd", lr=0.1, record_steps=[0, 500, 2000])
    right = al.metrics.offset_exponent(run.theta[1, 0], run.theta[2, 0], al.max_margin(prob).theta)
    wrong = al.metrics.offset_exponent(run.theta[1, 0], run.theta[2, 0], al.max_margin(prob, [1]).theta)
    assert right < 0.5 < wrong and wrong > 0.9


def test_numerical_rank():
    s = np.array([[1.0, 0.5, 1e-9], [np.nan, np.nan, np.nan]])
    assert al.metrics.numerical_rank(s, 1e-6).tolist() == [2, -1]


def test_joint_ngd_follows_the_prediction():
    # The page's claim in one line: equal-rate NGD ends where p_hat(1) says, not on the relaxed SVM.
    X, y, svms = official(1.2)
    traj = al.train_joint(X, y, al.datasets.JOINT_P0, al.datasets.JOINT_V0, steps=1000, record_every=1000)
    p, v = traj.p[-1, 0], traj.v[-1, 0]
    assert al.angle_degrees(p, al.svm.balanced_direction(svms, 1.0)) < 0.2
    assert al.angle_degrees(p, svms.relaxed.theta) > 5.0
    assert al.cosine(v, svms.label.v) > 0.9999


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


def test_curves_match_the_metrics():
    problems = _random_problems(3, family="global", d=4)
    solutions = [al.max_margin(p) for p in problems]
    solutions[1] = None  # an infeasible W-SVM: its columns must be NaN, not computed
    traj = al.train_many(problems, 100, "ngd", 0.2, record=np.array([0, 50, 100]))
    out = al.metrics.curves(problems, traj, solutions)
    assert set(out) == set(al.metrics.CURVES)
    assert all(v.shape == (3, 3) for v in out.values())
    assert np.all(np.isnan(out["direction_error"][:, 1])) and np.all(np.isnan(out["margin_gap"][:, 1]))
    k = 2
    W = traj.theta[-1, k]
    assert out["direction_error"][-1, k] == pytest.approx(al.direction_error(W, solutions[k].theta))
    assert out["margin_gap"][-1, k] == pytest.approx(solutions[k].margin - al.normalized_margin(problems[k], W))
    log_mass = np.max(al.log_one_minus_mass(problems[k], W))
    assert out["log_mass"][-1, k] == pytest.approx(log_mass)
    assert out["sparsity_rate"][-1, k] == pytest.approx(-log_mass / np.linalg.norm(W))
    assert out["selects_opt"][-1, k] == 1.0
    with pytest.raises(ValueError, match="solutions"):
        al.metrics.curves(problems, traj, solutions[:2])


def test_direction_approaches_svm_with_unequal_scores(multi):
    prob, sol, path = multi
    assert sol.status == "optimal"
    assert len(set(np.round(prob.gamma[:, 1:].ravel(), 12))) > 1  # non-optimal scores differ
    err = al.one_minus_cosine(path.theta, sol.theta)
    assert np.all(np.diff(err) < 0), err
    assert err[-1] < 1e-3
    assert path.converged.all()
    assert path.objective[0] == "loss" and path.objective[-1] == "log_gap"


def test_plain_loss_solve_is_unreliable_at_large_radius(multi):
    """At R = 60, L − L* is below the float resolution of L: a standard solver handed L and ∇L stops
    at its start, and the computed gap of *every* candidate is exactly 0, so L cannot rank them."""
    prob, sol, _ = multi
    R = 60.0
    rng = np.random.default_rng(1)
    cons = {"type": "eq", "fun": lambda p: p @ p - R * R, "jac": lambda p: 2 * p}
    errs = []
    for _ in range(4):
        p0 = rng.standard_normal(3)
        p0 *= R / np.linalg.norm(p0)
        res = minimize(lambda p: float(prob.value(p)), p0, jac=prob.grad, constraints=[cons], method="SLSQP")
        errs.append(al.one_minus_cosine(res.x, sol.theta))
    assert max(errs) > 0.1  # some starts end far from the SVM direction, declared "successful"
    ours = al.regularization_path(prob, [R], n_starts=6, seed=0)
    assert al.one_minus_cosine(ours.theta, sol.theta)[0] < 1e-3
    # the plain loss cannot tell the good solution from a bad one: the computed gaps both vanish
    assert prob.value(ours.theta)[0] - prob.loss_floor == 0.0
    assert np.exp(ours.log_gap[0]) < np.finfo(float).eps * prob.loss_floor  # gap below L's resolution
    # with the plain loss as objective, starts that stopped in different directions tie exactly,
    # while with log(L − L*) the same starts all reach one direction
    plain = al.regularization_path(prob, [R], n_starts=6, seed=0, objective="loss")
    tied = plain.start_objective[0] == plain.start_objective[0].min()
    assert tied.sum() >= 2 and plain.start_cosine[0, tied].min() < 0.999
    assert ours.start_cosine[0, tied].min() > 1 - 1e-9


def test_kq_path_goes_to_nuclear_svm_and_w_path_to_frobenius():
    prob = al.datasets.random_tokens(3, 4, 4, seed=1)
    fro, nuc = al.max_margin(prob), al.max_margin(prob, norm="nuc")
    radii = [1.0, 10.0, 60.0]
    w = al.regularization_path(prob, radii, n_starts=2, seed=0)
    kq = al.regularization_path(prob, radii, n_starts=2, seed=0, parametrization="kq", tol=1e-7)
    np.testing.assert_allclose(kq.norm, radii, rtol=1e-10)
    np.testing.assert_allclose(np.linalg.norm(kq.theta, "nuc", axis=(1, 2)), radii, rtol=1e-6)
    K, Q = kq.factors
    np.testing.assert_allclose(K @ np.swapaxes(Q, 1, 2), kq.theta)
    assert al.one_minus_cosine(w.theta[-1], fro.theta) < al.one_minus_cosine(w.theta[-1], nuc.theta)
    assert al.one_minus_cosine(kq.theta[-1], nuc.theta) < al.one_minus_cosine(kq.theta[-1], fro.theta)


def test_cone_project_is_the_nearest_feasible_point():
    rng = np.random.default_rng(0)
    u = np.array([1.0, 2.0, -1.0])
    mu = 0.05
    x = rng.normal(scale=3.0, size=(400, 3))
    proj = paths.cone_project(x, u, mu, rho=2.0)
    norms = np.linalg.norm(proj, axis=1)
    assert np.all(norms <= 2.0 + 1e-12)
    ok = norms > 1e-12
    assert np.all(al.one_minus_cosine(proj[ok], u) <= mu + 1e-12)
    np.testing.assert_allclose(paths.cone_project(proj, u, mu, rho=2.0), proj, atol=1e-12)  # idempotent
    # no feasible point is nearer: compare with many random feasible points
    cand = paths.cone_project(rng.normal(scale=3.0, size=(4000, 3)), u, mu, rho=2.0)
    dist = np.linalg.norm(x[:, None] - cand[None], axis=-1).min(axis=1)
    assert np.all(np.linalg.norm(x - proj, axis=1) <= dist + 1e-12)


def test_joint_training_follows_the_relaxed_svm():
    """[MMTS] joint training: sample 3 is not a support vector, so p follows the relaxed p-SVM."""
    X, y = al.datasets.joint_tokens(relaxed=True)
    traj = al.train_joint(X, y, al.datasets.JOINT_P0, al.datasets.JOINT_V0, steps=300)
    prob = al.prompt_attention(X, y, [0.0, 1.0])
    select = np.array([1, 1, 1])
    support = al.label_svm(X[:, 1], y).support
    relaxed = al.max_margin(prob, select, relax=~support)
    full = al.max_margin(prob, select)
    p_final = traj.p[-1, 0]
    assert al.cosine(p_final, relaxed.theta) > 0.999
    assert al.cosine(p_final, relaxed.theta) - al.cosine(p_final, full.theta) > 0.01
    assert al.cosine(traj.v[-1, 0], [0.0, 1.0]) > 0.999


def test_orthogonal_partners_turn_every_row_by_the_same_angle():
    rng = np.random.default_rng(3)
    R = rng.standard_normal((4, 7)) * np.array([[1.0], [3.0], [0.5], [2.0]])
    P = al.metrics.orthogonal_partners(R, seed=1)
    np.testing.assert_allclose(np.sum(P * R, axis=1), 0, atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(P, axis=1), np.linalg.norm(R, axis=1))
    turned = al.metrics.rotate_toward(R, P, 10.0)
    cos = np.sum(turned * R, axis=1) / (np.linalg.norm(turned, axis=1) * np.linalg.norm(R, axis=1))
    np.testing.assert_allclose(np.degrees(np.arccos(cos)), 10.0, atol=1e-9)
