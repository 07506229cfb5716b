"""Regularization path (attnlib.paths): direction, sphere, log-gap objective, gradients, inputs."""

import numpy as np
import pytest
from scipy.optimize import minimize

import attnlib as al


def unequal_multi_input(seed=0):
    """The [MMTS] multi-input data with unequal non-optimal scores (chapter 1's theorem does not apply)."""
    scores = np.random.default_rng(100 + seed).uniform(0.0, 0.9, size=(3, 6))
    return al.datasets.multi_input(seed, nonopt_scores=scores)


@pytest.fixture(scope="module")
def multi():
    prob = unequal_multi_input(0)
    radii = np.array([1.0, 3.0, 10.0, 30.0, 100.0])
    return prob, al.max_margin(prob), al.regularization_path(prob, radii, n_starts=3, seed=0)


def test_direction_approaches_svm_with_unequal_scores(multi):
    prob, sol, path = multi
    assert sol.status == "optimal"
    assert len(set(np.round(prob.gamma[:, 1:].ravel(), 12))) > 1  # non-optimal scores differ
    err = al.one_minus_cosine(path.theta, sol.theta)
    assert np.all(np.diff(err) < 0), err
    assert err[-1] < 1e-3
    assert path.converged.all()
    assert path.objective[0] == "loss" and path.objective[-1] == "log_gap"


def test_solution_lies_on_the_sphere(multi):
    _, _, path = multi
    np.testing.assert_allclose(path.norm, path.radii, rtol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(path.theta, axis=1), path.radii, rtol=1e-12)
    assert path.theta.shape == (5, 3)
    assert path.start_objective.shape == path.start_cosine.shape == (5, 7)


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


@pytest.mark.parametrize("scale", [0.5, 5.0, 80.0])
def test_log_gap_gradient_matches_finite_differences(scale, central_difference):
    prob = unequal_multi_input(1)
    rng = np.random.default_rng(3)
    p = scale * (al.max_margin(prob).direction + 0.3 * rng.standard_normal(3))
    f, g = al.paths.log_gap_grad(prob, p)
    fd = central_difference(lambda q: float(al.paths.log_gap_grad(prob, q)[0]), p, 1e-6)
    np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-7)
    assert f == pytest.approx(float(prob.log_gap(p)))


def test_log_gap_gradient_for_matrix_parameter_and_batch(central_difference):
    prob = al.datasets.random_tokens(3, 4, 4, seed=2)
    rng = np.random.default_rng(4)
    W = 2.0 * rng.standard_normal((3, 4, 4))
    f, g = al.paths.log_gap_grad(prob, W)
    assert f.shape == (3,) and g.shape == (3, 4, 4)
    fd = central_difference(lambda w: float(al.paths.log_gap_grad(prob, w)[0]), W[1], 1e-6)
    np.testing.assert_allclose(g[1], fd, rtol=1e-5, atol=1e-7)


def test_factor_gradients_match_finite_differences(central_difference):
    prob = al.datasets.random_tokens(3, 4, 4, seed=5)
    rng = np.random.default_rng(6)
    K, Q = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    gK, gQ = al.model.factor_grad(prob.grad(K @ Q.T), K, Q)
    fdK = central_difference(lambda k: float(prob.value(k @ Q.T)), K, 1e-6)
    fdQ = central_difference(lambda q: float(prob.value(K @ q.T)), Q, 1e-6)
    np.testing.assert_allclose(gK, fdK, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(gQ, fdQ, rtol=1e-6, atol=1e-9)
    # and of the log-gap objective, as the (K, Q) path uses it
    _, gW = al.paths.log_gap_grad(prob, K @ Q.T)
    gK, _ = al.model.factor_grad(gW, K, Q)
    fdK = central_difference(lambda k: float(prob.log_gap(k @ Q.T)), K, 1e-6)
    np.testing.assert_allclose(gK, fdK, rtol=1e-5, atol=1e-8)


def nonlinear_model():
    rng = np.random.default_rng(0)
    return al.model.nonlinear_head(rng.normal(size=(3, 3, 6)), rng.normal(size=(8, 6)), rng.uniform(size=8))


@pytest.mark.parametrize("scale", [0.3, 3.0, 300.0])
def test_nonlinear_head_gradients_match_finite_differences(scale, central_difference):
    model = nonlinear_model()
    rng = np.random.default_rng(7)
    sol = al.max_margin(model.token_problem)
    p = scale * sol.direction + 0.3 * rng.standard_normal(6)
    if scale < 100:  # the plain loss is resolvable only at moderate norms
        fd = central_difference(lambda q: float(model.value(q)), p, 1e-6)
        np.testing.assert_allclose(model.grad(p), fd, rtol=1e-5, atol=1e-9)
        assert np.exp(model.log_gap(p)) == pytest.approx(float(model.value(p)) - model.loss_floor, rel=1e-8)
    _, g = al.paths.log_gap_grad(model, p)
    fd = central_difference(lambda q: float(model.log_gap(q)), p, 1e-6)
    np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-7)


def test_nonlinear_head_path_turns_to_induced_svm():
    model = nonlinear_model()
    sol = al.max_margin(model.token_problem)
    path = al.regularization_path(model, [1.0, 10.0, 100.0], n_starts=4, seed=0)
    err = al.one_minus_cosine(path.theta, sol.theta)
    assert np.all(np.diff(err) < 0) and err[-1] < 1e-3
    np.testing.assert_allclose(path.norm, path.radii, rtol=1e-12)


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


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(radii=[-1.0, 2.0]), "radii"),
        (dict(radii=[0.0]), "radii"),
        (dict(radii=[3.0, 2.0]), "radii"),
        (dict(radii=[[1.0, 2.0]]), "radii"),
        (dict(radii=[]), "radii"),
        (dict(radii=[1.0, np.inf]), "radii"),
        (dict(radii=[1.0], n_starts=-1), "n_starts"),
        (dict(radii=[1.0], n_starts=2.5), "n_starts"),
        (dict(radii=[1.0], parametrization="kq"), "parametrization='kq'"),
        (dict(radii=[1.0], parametrization="qk"), "parametrization"),
        (dict(radii=[1.0], objective="gap"), "objective"),
        (dict(radii=[1.0], width=2), "width"),
        (dict(radii=[1.0], max_iter=0), "max_iter"),
        (dict(radii=[1.0], tol=0.0), "tol"),
        (dict(radii=[1.0], switch_gap=2.0), "switch_gap"),
    ],
)
def test_bad_inputs_raise_naming_the_parameter(kwargs, name):
    prob = al.datasets.single_input()
    with pytest.raises(ValueError, match=name):
        al.regularization_path(prob, **kwargs)


def test_bad_problem_and_shapes_raise():
    with pytest.raises(ValueError, match="prob"):
        al.regularization_path(np.zeros((2, 3)), [1.0])
    prob = al.datasets.random_tokens(3, 4, 4, seed=0)
    with pytest.raises(ValueError, match="width"):
        al.regularization_path(prob, [1.0], parametrization="kq", width=0)
    with pytest.raises(ValueError, match="theta"):
        al.paths.log_gap_grad(prob, np.zeros(4))
    with pytest.raises(ValueError, match="V must"):
        al.model.nonlinear_head(np.zeros((2, 3, 4)), np.ones((5, 3)), np.ones(5))
    with pytest.raises(ValueError, match="u >= 0"):
        al.model.nonlinear_head(np.ones((2, 3, 4)), np.ones((5, 4)), -np.ones(5))
    with pytest.raises(ValueError, match="p must"):
        nonlinear_model().grad(np.zeros(5))


# ---------------------------------------------------------------------- the comparison with the SVM ray


def test_parameter_norm_min_margin_and_margin_ratio_of_the_svm():
    M = np.diag([3.0, 4.0])
    assert al.experiments.regularization_path.parameter_norm(M, "fro", 2) == pytest.approx(5.0)
    assert al.experiments.regularization_path.parameter_norm(M, "nuc", 2) == pytest.approx(7.0)
    np.testing.assert_allclose(
        al.experiments.regularization_path.parameter_norm(np.ones((4, 3)), "fro", 1), np.sqrt(3.0)
    )
    with pytest.raises(ValueError, match="norm"):
        al.experiments.regularization_path.parameter_norm(M, "max", 2)
    with pytest.raises(ValueError, match="trailing axes"):
        al.experiments.regularization_path.parameter_norm(np.ones(3), "nuc", 1)
    prob = unequal_multi_input(0)
    sol = al.max_margin(prob)
    assert al.experiments.regularization_path.min_margin(prob, sol.theta) == pytest.approx(
        1.0, abs=1e-6
    )  # the SVM's active constraints
    assert al.experiments.regularization_path.margin_ratio(prob, 7.0 * sol.theta, sol.theta) == pytest.approx(
        1.0, abs=1e-6
    )
    sa = al.datasets.random_tokens(3, 4, 4, seed=1)
    fro, nuc = al.max_margin(sa), al.max_margin(sa, norm="nuc")
    assert al.experiments.regularization_path.margin_ratio(sa, nuc.theta, nuc.theta, "nuc") == pytest.approx(
        1.0, abs=1e-5
    )
    assert (
        al.experiments.regularization_path.margin_ratio(sa, fro.theta, nuc.theta, "nuc") < 1.0
    )  # the other SVM has a smaller ratio
    assert al.experiments.regularization_path.margin_ratio(sa, nuc.theta, fro.theta, "fro") < 1.0


@pytest.mark.parametrize("loss", ["logistic", "exponential", "linear"])
def test_loss_gap_lower_bound_behind_ray_margin_bound(loss):
    """Step 2 of the derivation: L − L* ≥ w/(e^m + T − 1), m the smallest margin, at random θ."""
    scores = np.random.default_rng(5).uniform(0.0, 0.9, size=(3, 6))
    prob = al.datasets.multi_input(0, nonopt_scores=scores, loss=loss)
    sol = al.max_margin(prob)
    rng = np.random.default_rng(0)
    theta = sol.theta * rng.uniform(0.5, 30.0, size=(200, 1)) + rng.normal(scale=2.0, size=(200, 3))
    m = al.experiments.regularization_path.min_margin(prob, theta)
    g_opt = prob.gamma[np.arange(prob.n), prob.opt]
    w = np.min((-prob.loss.derivative(g_opt)[:, None] * (g_opt[:, None] - prob.gamma))[:, 1:]) / prob.n
    lower = np.log(w) - np.logaddexp(m, np.log(prob.T - 1))
    ok = m > 0
    assert ok.sum() > 50
    assert np.all(prob.log_gap(theta[ok]) >= lower[ok] - 1e-9)


def test_ray_margin_bound_holds_on_the_path_and_tends_to_one():
    prob = unequal_multi_input(1)
    sol = al.max_margin(prob)
    radii = np.array([2.0, 20.0, 200.0, 2000.0])
    path = al.regularization_path(prob, radii, n_starts=3, seed=0)
    lo = al.experiments.regularization_path.ray_margin_bound(prob, sol.theta, radii)
    assert np.all(np.diff(lo) > 0) and lo[-1] > 0.99
    assert np.all(al.experiments.regularization_path.ray_gap_excess(prob, path, sol.theta) >= -1e-9)
    rho = al.experiments.regularization_path.margin_ratio(prob, path.theta, sol.theta)
    assert np.all(rho >= lo - 1e-12) and np.all(rho <= 1 + 1e-9)
    bound = al.paths.direction_bound(lo)
    err = al.one_minus_cosine(path.theta, sol.theta)
    assert np.all(err[lo > 0] <= bound[lo > 0])
    # a wrong reference (the SVM on the raw tokens instead of the keys) violates the bound
    raw = al.max_margin(al.TokenSelectionProblem(prob_raw_tokens(prob), prob.gamma, prob.loss))
    assert al.one_minus_cosine(path.theta[-1], raw.theta) > bound[-1]


def prob_raw_tokens(prob):
    """The raw tokens of the multi-input data: keys (first two coordinates) plus the score coordinate."""
    return np.concatenate([prob.A[..., :2], prob.gamma[..., None]], axis=-1)


def test_direction_bound_from_margin_ratio():
    assert al.paths.direction_bound(0.5) == pytest.approx(3.0)
    assert al.paths.direction_bound(-0.1) == np.inf
    prob = unequal_multi_input(0)
    sol = al.max_margin(prob)
    theta = sol.theta + np.random.default_rng(2).normal(scale=0.3, size=(500, 3))
    rho = al.experiments.regularization_path.margin_ratio(prob, theta, sol.theta)
    ok = rho > 0
    assert ok.sum() > 100
    assert np.all(al.one_minus_cosine(theta[ok], sol.theta) <= al.paths.direction_bound(rho[ok]) + 1e-12)


def test_kq_path_with_guide_start():
    prob = al.datasets.random_tokens(3, 4, 4, seed=1)
    radii = [1.0, 10.0, 100.0]
    w = al.regularization_path(prob, radii, n_starts=1, seed=0)
    kq = al.regularization_path(prob, radii, n_starts=1, seed=0, parametrization="kq", guide=w.theta, tol=1e-6)
    assert kq.start_objective.shape == (3, 4)  # 2·n_starts + 1 + the guide
    np.testing.assert_allclose(kq.norm, radii, rtol=1e-10)
    nuc = al.max_margin(prob, norm="nuc")
    assert np.all(al.experiments.regularization_path.ray_gap_excess(prob, kq, nuc.theta, "nuc") >= -1e-9)
    with pytest.raises(ValueError, match="guide"):
        al.regularization_path(prob, radii, parametrization="kq", guide=w.theta[:2])


def test_minimiser_inside_the_ball_when_the_svm_is_infeasible():
    """Outside the theorem's hypotheses the path need not reach the sphere: the failing input of the
    chapter's on-the-sphere check. Two inputs pull p in opposite directions along one key axis."""
    A = np.array([[[0.0], [1.0]], [[0.0], [1.0]]])
    gamma = np.array([[1.0, 0.0], [0.0, 2.0]])
    prob = al.TokenSelectionProblem(A, gamma, "logistic")
    with pytest.raises(al.InfeasibleError):
        al.max_margin(prob)
    path = al.regularization_path(prob, [10.0], n_starts=2, seed=0)
    assert path.norm[0] < 0.5 * path.radii[0]


# ---------------------------------------------------------------------- the local path (ball ∩ cone)

from attnlib import paths  # noqa: E402
from attnlib.experiments import local_convergence as local  # noqa: E402


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


def test_selection_log_gap_matches_direct_difference_and_its_gradient():
    prob = al.datasets.single_input(local=True)
    theta = np.array([[1.0, 0.5, 0.0], [2.0, -1.0, 0.0], [0.3, 3.0, 0.0]])
    floor = float(np.mean(prob.loss.value(prob.gamma[0, [1]])))
    lg, sign, g = paths.selection_log_gap(prob, [1], theta, with_grad=True)
    np.testing.assert_allclose(sign * np.exp(lg), prob.value(theta) - floor, rtol=1e-9)
    np.testing.assert_allclose(g, prob.grad(theta) / np.exp(lg)[:, None], rtol=1e-9)
    lg_far, sign_far = paths.selection_log_gap(prob, [1], np.array([800.0, 10.0, 0.0]))
    assert sign_far == 1.0 and -900 < lg_far < -700  # far below the float resolution of L


def test_local_path_converges_for_a_locally_optimal_selection_and_obeys_its_bound():
    prob = al.datasets.single_input(local=True)
    sol = al.max_margin(prob, np.array([1]))
    case = local.local_path_case(prob, sol, per_decade=2)
    assert case.locally_optimal and case.resolved
    np.testing.assert_allclose(case.path.norm, case.radii, rtol=1e-9)
    assert np.all(case.omc <= case.bound + 1e-15)
    rho = al.normalized_margin(prob, case.path.theta, np.array([1])) * np.linalg.norm(sol.theta)
    lo = local.cone_margin_bound(prob, [1], sol.theta, case.radii, case.mu, case.min_norm)
    assert np.all(rho >= lo - 1e-12)
    # the failing input of the chapter's check: the wrong reference direction (p_mm*)
    wrong = al.one_minus_cosine(case.path.theta[-1], al.max_margin(prob).theta)
    assert wrong > 1e3 * case.bound[-1]


def test_local_path_leaves_when_every_neighbour_scores_higher():
    prob = al.datasets.single_input(local=True)
    sol = al.max_margin(prob, np.array([2]))
    case = local.local_path_case(prob, sol, per_decade=1)
    assert not case.locally_optimal and case.all_higher
    assert case.leave > 0.99
    assert local.admissible_cone_angle(prob, [2], sol.theta) == 0.0
    assert np.all(local.cone_margin_bound(prob, [2], sol.theta, [10.0], 0.001, 1.0) == -np.inf)


def test_cone_too_wide_has_no_bound_and_the_path_sits_on_its_edge():
    """Fig. 1(b), α = 2: past the admissible angle token 1 (higher score) outweighs token 3 on the edge."""
    prob = al.datasets.single_input(local=True)
    sol = al.max_margin(prob, np.array([1]))
    mu = 0.05  # 18° > the admissible 5.45°
    assert np.arccos(1 - mu) > local.admissible_cone_angle(prob, [1], sol.theta)
    assert local.cone_min_norm(prob, [1], sol.theta, mu) == np.inf
    path = paths.local_regularization_path(prob, np.array([1]), [10.0, 100.0], mu, min_norm=1.0)
    np.testing.assert_allclose(al.one_minus_cosine(path.theta, sol.theta), mu, rtol=1e-6)
