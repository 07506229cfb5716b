"""Regularization path (attnlib.paths): direction, sphere, log-gap objective, gradients, inputs."""

import numpy as np
import pytest

import attnlib as al


def unequal(seed):
    """The [MMTS] multi-input data with unequal non-optimal scores."""
    return al.datasets.multi_input(seed, nonopt_scores=np.random.default_rng(seed).uniform(0.0, 0.9, size=(3, 6)))


RADII = np.array([0.5, 2.0, 8.0, 40.0])


def unequal_multi_input(seed=0):
    """The [MMTS] multi-input data with unequal non-optimal scores (chapter 1's theorem does not apply)."""
    scores = np.random.default_rng(100 + seed).uniform(0.0, 0.9, size=(3, 6))
    return al.datasets.multi_input(seed, nonopt_scores=scores)


@pytest.fixture(scope="module")
def multi():
    prob = unequal_multi_input(0)
    radii = np.array([1.0, 3.0, 10.0, 30.0, 100.0])
    return prob, al.max_margin(prob), al.regularization_path(prob, radii, n_starts=3, seed=0)


def nonlinear_model():
    rng = np.random.default_rng(0)
    return al.model.nonlinear_head(rng.normal(size=(3, 3, 6)), rng.normal(size=(8, 6)), rng.uniform(size=8))


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


def test_regularization_paths_are_the_separate_paths_solved_as_one_batch():
    probs = [unequal(s) for s in (3, 4, 5)]
    many = al.paths.regularization_paths(probs, RADII, n_starts=2, seeds=[3, 4, 5])
    assert len(many) == 3
    for prob, seed, got in zip(probs, (3, 4, 5), many):
        alone = al.regularization_path(prob, RADII, n_starts=2, seed=seed)
        assert got.objective.tolist() == alone.objective.tolist()  # the same objective at every radius
        assert got.start_objective.shape == alone.start_objective.shape == (len(RADII), 5)
        assert np.all(np.abs(got.theta - alone.theta) <= 1e-6 * RADII[:, None])  # rounding, at the stopping test
        np.testing.assert_allclose(got.norm, RADII, rtol=1e-12)
        np.testing.assert_allclose(got.log_gap, prob.log_gap(got.theta))
        assert got.parametrization == "direct" and got.factors is None


def test_regularization_paths_rejects_mismatched_inputs():
    probs = [unequal(0), unequal(1)]
    with pytest.raises(ValueError, match="one seed per problem"):
        al.paths.regularization_paths(probs, RADII, n_starts=1, seeds=[0])
    with pytest.raises(ValueError, match="share n, T"):
        al.paths.regularization_paths([unequal(0), al.datasets.single_input()], RADII, n_starts=1)
    with pytest.raises(ValueError, match="strictly increasing"):
        al.paths.regularization_paths(probs, [2.0, 1.0], n_starts=1)
    with pytest.raises(ValueError, match="n_starts"):
        al.paths.regularization_paths(probs, RADII, n_starts=-1)


def test_solution_lies_on_the_sphere(multi):
    _, _, path = multi
    np.testing.assert_allclose(path.norm, path.radii, rtol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(path.theta, axis=1), path.radii, rtol=1e-12)
    assert path.theta.shape == (5, 3)
    assert path.start_objective.shape == path.start_cosine.shape == (5, 7)


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


@pytest.mark.parametrize("norm", ["fro", "nuc"])
def test_ball_stationarity_gap_is_the_frank_wolfe_gap(norm):
    prob = al.datasets.random_tokens(3, 4, 4, seed=0)
    rng = np.random.default_rng(1)
    W = rng.normal(size=(3, 4, 4))
    W[2] = W[1]
    R = al.experiments.regularization_path.parameter_norm(W, norm, 2) * np.array([1.0, 1.0, 2.0])  # last: inside
    gap = al.paths.ball_stationarity_gap(prob, W, R, norm)
    _, g = al.paths.log_gap_grad(prob, W)
    for k in range(3):
        # the linear minimisation oracle on the ball, written out: -R g/‖g‖_F, or -R u1 v1ᵀ (top singular pair)
        if norm == "fro":
            S, dual = -R[k] * g[k] / np.linalg.norm(g[k]), np.linalg.norm(g[k])
        else:
            U, s, Vt = np.linalg.svd(g[k])
            S, dual = -R[k] * np.outer(U[:, 0], Vt[0]), s[0]
        assert gap[k] == pytest.approx(np.sum(g[k] * (W[k] - S)) / (R[k] * dual), rel=1e-12)
        # no point of the ball does better than the oracle's
        T = rng.normal(size=(200, 4, 4))
        T *= (R[k] / al.experiments.regularization_path.parameter_norm(T, norm, 2))[:, None, None]
        assert np.all(np.sum(g[k] * (W[k] - T), axis=(1, 2)) <= gap[k] * R[k] * dual * (1 + 1e-12))
    assert np.all((gap >= 0) & (gap <= 2))
    assert gap[2] == pytest.approx(1 + (gap[1] - 1) / 2, rel=1e-12)  # the same point in a ball twice as large
    with pytest.raises(ValueError, match="norm must be one of"):
        al.paths.ball_stationarity_gap(prob, W, R, "spectral")


def test_polish_makes_the_stalled_kq_path_stationary():
    # chapter 2's self-attention instance: projected descent stops on its small-move test with a relative
    # nuclear Frank-Wolfe gap of about 4e-4 at R = 1000; the BFGS polish ends every radius below tol
    prob = al.datasets.random_tokens(4, 5, 6, seed=0)
    radii = np.geomspace(1.0, 1000.0, 4)
    run = al.experiments.regularization_path.matrix_paths_from_rays
    plain = run(prob, radii, seed=0, tol=1e-6, max_iter=400)
    polished = run(prob, radii, seed=0, tol=1e-6, max_iter=400, polish=True)
    assert plain.gap_kq[-1] > 1e-5  # the stall this fixes
    assert np.max(polished.gap_kq) <= 1e-6 and np.max(polished.gap_w) <= 1e-6
    assert polished.kq.log_gap[-1] < plain.kq.log_gap[-1]  # the polish only descends
    np.testing.assert_allclose(polished.kq.norm, radii, rtol=1e-9)  # and stays on the sphere
    np.testing.assert_allclose(polished.w.norm, radii, rtol=1e-9)
    # each path is far from stationary on the other geometry's ball (the checks' controls)
    assert np.max(polished.gap_w_nuc) > 0.1 and np.max(polished.gap_kq_fro) > 0.1
