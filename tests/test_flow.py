"""Gradient flow, the smoothness bound and GD below 1/L (attnlib.flow)."""

import numpy as np
import pytest
from scipy.optimize import brentq

import attnlib as al
from attnlib import flow
from attnlib.experiments import global_convergence as ex


def trap_problem():
    """The two-input counterexample: keys {(1,0),(0,0)}, {(−3,0.1),(0,0)}, scores (1,0), logistic."""
    A = np.array([[[1.0, 0.0], [0.0, 0.0]], [[-3.0, 0.1], [0.0, 0.0]]])
    return al.token_selection(A, np.array([[1.0, 0.0], [1.0, 0.0]]), "logistic")


def problems():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(4, 5, 3))
    return {
        "fig1a": al.datasets.single_input(),
        "fig1b-exponential": al.datasets.single_input(local=True, loss="exponential"),
        "multi": al.datasets.multi_input(0),
        "loss-study-linear": al.datasets.loss_study(3.0, "linear"),
        "loss-study-logistic-C10": al.datasets.loss_study(10.0),
        "trap": trap_problem(),
        "self-attention-W": al.self_attention(X, [1, -1, 1, -1], u=[1.0, -0.5, 0.2]),
    }


@pytest.mark.parametrize("name", list(problems()))
def test_hessian_matches_finite_differences_of_the_gradient(name):
    prob = problems()[name]
    rng = np.random.default_rng(1)
    theta = rng.normal(scale=2.0, size=(4,) + prob.shape)
    H = flow.hessian(prob, theta)
    h = 1e-5
    basis = np.eye(prob.size).reshape((prob.size,) + prob.shape)
    fd = np.stack([(prob.grad(theta + h * e) - prob.grad(theta - h * e)) / (2 * h) for e in basis], -1)
    fd = fd.reshape(H.shape)
    # central differences: error O(h² ‖∇⁴L‖) plus rounding O(ε‖∇L‖/h) ≈ 1e-11 here
    np.testing.assert_allclose(H, fd, atol=1e-8 * (1 + np.abs(H).max()), rtol=0)
    np.testing.assert_allclose(H, np.swapaxes(H, -1, -2), atol=1e-15)


@pytest.mark.parametrize("name", list(problems()))
def test_smoothness_bound_is_above_every_sampled_hessian(name):
    prob = problems()[name]
    rng = np.random.default_rng(2)
    # many points: directions uniform, norms up to 8 (the Hessian is largest at moderate norms) and
    # points near each sample's two-token balance, where the softmax splits its mass
    radius = rng.uniform(0, 8, size=(3000, 1))
    theta = rng.normal(size=(3000, prob.size))
    theta = radius * theta / np.linalg.norm(theta, axis=-1, keepdims=True)
    sampled = flow.sampled_smoothness(prob, theta.reshape((3000,) + prob.shape))
    bound = flow.smoothness_bound(prob)
    assert np.all(sampled <= bound)


def test_smoothness_bound_of_a_stack_is_per_problem():
    probs = [al.datasets.loss_study(C) for C in (1.0, 3.0, 10.0)]
    stacked = flow.smoothness_bound(al.stack_problems(probs))
    np.testing.assert_allclose(stacked, [flow.smoothness_bound(p) for p in probs], rtol=1e-14)


def test_smoothness_bound_refuses_an_unbounded_loss_curvature():
    prob = al.token_selection(np.array([[[1.0], [0.0]]]), np.array([[1.0, 0.0]]), al.losses.CROSS_ENTROPY)
    assert flow.smoothness_bound(prob) == np.inf
    with pytest.raises(ValueError, match="fraction"):
        flow.step_below_smoothness(prob, 2.5)


def test_flow_matches_fine_step_gd_at_moderate_t():
    """GD is first order in η: GD(η) − flow ≈ 2 (GD(η) − GD(η/2)) (Richardson); check the ratio."""
    prob = al.datasets.multi_input(0)
    inits = al.datasets.MULTI_INPUT_INITS
    eta, steps = 0.05, 400  # t = 20, where the softmax still moves
    record = np.arange(0, steps + 1, 40)
    coarse = al.train(prob, inits, steps=steps, method="gd", lr=eta, record_steps=record)
    fine = al.train(prob, inits, steps=2 * steps, method="gd", lr=eta / 2, record_steps=2 * record)
    gf = flow.gradient_flow(prob, inits, times=eta * record.astype(float))
    err_gd = np.linalg.norm(coarse.theta[1:] - gf.theta[1:], axis=-1)
    richardson = 2 * np.linalg.norm(coarse.theta[1:] - fine.theta[1:], axis=-1)
    ratio = err_gd / richardson
    assert np.all((ratio > 0.9) & (ratio < 1.1)), ratio
    # control: a flow integrated at the wrong speed (t scaled by 1.01) is far outside the same band
    slow = flow.gradient_flow(prob, inits, times=1.01 * eta * record.astype(float))
    wrong = np.linalg.norm(coarse.theta[1:] - slow.theta[1:], axis=-1) / richardson
    assert np.all(wrong[-1] > 1.5)


def closed_form_s(t, norm2):
    """One input, two tokens, scores (1, 0), linear loss, p(0) = 0: s = ⟨p, d⟩ solves
    ‖d‖² t = 2s + 2 sinh s (integrate ds/dt = ‖d‖² σ(s)σ(−s))."""

    def log_lhs(s):  # log(2s + e^s − e^{−s}) for s > 0, without overflow
        return s + np.log1p((2 * s - np.exp(-s)) * np.exp(-s))

    return np.array([0.0 if x == 0 else brentq(lambda s, x=x: log_lhs(s) - np.log(norm2 * x), 1e-12, 100) for x in t])


def test_flow_norm_grows_like_log_t_with_the_closed_form():
    d = np.array([2.0, 1.0])
    prob = al.token_selection(np.array([[d, [0.0, 0.0]]]), np.array([[1.0, 0.0]]), "linear")
    gf = flow.gradient_flow(prob, np.zeros(2), t_max=1e15)
    s = closed_form_s(gf.times, d @ d)
    expected = s[:, None] / (d @ d) * d  # p stays on the line of d
    np.testing.assert_allclose(gf.theta[:, 0], expected, rtol=1e-7, atol=1e-9)
    # ‖p‖ = s/‖d‖ → log(‖d‖² t)/‖d‖: the slope in log t is M = ‖p_mm‖ = 1/‖d‖
    late = gf.times > 1e12
    slope = np.polyfit(np.log(gf.times[late]), gf.norm[late, 0], 1)[0]
    assert abs(slope * np.linalg.norm(d) - 1) < 1e-6


def test_trap_instance_stays_trapped_under_flow_and_converges_from_zero():
    prob = trap_problem()
    sol = al.max_margin(prob)
    np.testing.assert_allclose(sol.theta, [1.0, 40.0], atol=1e-6)
    gf = flow.gradient_flow(prob, np.array([[3.0, 0.0], [0.0, 0.0]]), t_max=1e15)
    trapped, free = gf.theta[:, 0], gf.theta[:, 1]
    assert gf.times[-1] == 1e15
    # the trapped run: p₂ frozen below 3e-4 while p₁ grows like log t; the cosine stays at 0.025
    assert np.abs(trapped[:, 1]).max() < 3e-4
    assert al.cosine(trapped[-1], sol.theta) < 0.026
    assert np.polyfit(np.log(gf.times[-20:]), trapped[-20:, 0], 1)[0] == pytest.approx(1.0, abs=1e-6)
    # the control: from 0 the same flow converges to p_mm*
    assert al.cosine(free[-1], sol.theta) > 0.9999


def test_gd_below_one_over_L_stays_trapped():
    prob = trap_problem()
    L = flow.smoothness_bound(prob)
    for fraction in (0.1, 1.0):
        run = flow.train_below_smoothness(prob, np.array([[3.0, 0.0], [0.0, 0.0]]), steps=3000, fraction=fraction)
        assert run.lr == pytest.approx(fraction / L)
        assert abs(run.final[0, 1]) < 3e-4
        assert np.all(np.diff(run.loss[:, 0]) <= 0)  # η ≤ 1/L: the descent lemma
        assert run.final[1, 1] > 1000 * abs(run.final[0, 1])  # the start at 0 heads for p_mm* = (1, 40)


def test_flow_batches_a_stack_of_problems_like_single_runs():
    probs = [al.datasets.loss_study(C) for C in (1.0, 3.0)]
    stack = al.stack_problems(probs)
    times = flow.flow_grid(1e6, per_decade=2)
    batched = flow.gradient_flow(stack, np.zeros((2, 3)), times=times)
    for k, prob in enumerate(probs):
        single = flow.gradient_flow(prob, np.zeros(3), times=times)
        np.testing.assert_allclose(batched.theta[:, k], single.theta[:, 0], rtol=1e-6, atol=1e-7)


def test_flow_trajectory_is_a_trajectory():
    gf = flow.gradient_flow(al.datasets.single_input(), np.zeros((3, 3)), t_max=1e4)
    assert isinstance(gf, al.Trajectory) and gf.method == "flow"
    assert gf.select([0, 2]).theta.shape == (len(gf.times), 2, 3)
    assert np.all(np.diff(gf.loss, axis=0) <= 1e-15)  # the loss decreases along the flow
    assert gf.nfev > 0 and gf.rtol == 1e-10


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"solver": "euler"}, "solver"),
        ({"rtol": -1.0}, "rtol"),
        ({"times": [1.0, 2.0]}, "times"),
        ({"theta0": np.zeros((2, 4))}, "theta0"),
    ],
)
def test_flow_bad_input(kwargs, match):
    args = {"theta0": np.zeros(3), **kwargs}
    with pytest.raises(ValueError, match=match):
        flow.gradient_flow(al.datasets.single_input(), **args)


def test_tail_form_is_the_gradient_of_the_exponential_tail_loss():
    """Finite differences: the tail field equals −∇ of Σ_j w_j e^{−⟨θ, d_j⟩}."""
    prob = al.datasets.multi_input(2)
    d, w = flow.tail_weights(prob)
    keep = w != 0
    theta = np.array([0.7, -0.4, 0.2])

    def tail_loss(x):
        return float((w[keep] * np.exp(-(d[keep] @ x))).sum())

    field = flow.tail_flow(prob, prob.opt, theta[None], 1.0, [1.0, 1.0 + 1e-9])  # only to exercise the call
    assert field.shape == (2, 1, 3)
    grad_fd = np.array([(tail_loss(theta + h) - tail_loss(theta - h)) / 2e-6 for h in 1e-6 * np.eye(3)])
    exact = -((w[keep] * np.exp(-(d[keep] @ theta)))[:, None] * d[keep]).sum(0)
    np.testing.assert_allclose(exact, grad_fd, rtol=1e-7, atol=1e-12)


@pytest.mark.parametrize("name", ["multi", "fig1a", "loss-study-logistic-C10", "fig1b-exponential"])
def test_tail_error_rate_bounds_the_tail_forms_error(name):
    """At points that select opt, ‖−∇L − tail‖ ≤ ε · Σ_j |tail term j| (the derivation's claim)."""
    prob = problems()[name]
    sol = al.max_margin(prob)
    d, w = flow.tail_weights(prob)
    rng = np.random.default_rng(3)
    radius = rng.uniform(3, 40, size=(200, 1)) / sol.margin
    theta = radius * sol.theta / np.linalg.norm(sol.theta) + rng.normal(scale=0.5, size=(200,) + prob.shape)
    eps = flow.tail_error_rate(prob, prob.opt, theta)
    terms = (w * np.exp(-np.einsum("ntk,bk->bnt", d, theta)))[..., None] * d  # (B, n, T, size)
    tail = terms.sum((1, 2))
    size = np.linalg.norm(terms, axis=-1).sum((1, 2))
    err = np.linalg.norm(-prob.grad(theta) - tail, axis=-1)
    ok = eps < 0.5
    assert ok.sum() > 100
    assert np.all(err[ok] <= (eps[ok] + 1e-13) * size[ok])  # 1e-13: float64 rounding of the two sums


def test_gd_direction_follows_the_tail_flow_and_its_controls_fail():
    prob = al.datasets.multi_input(0)
    sol = al.max_margin(prob)
    gf = flow.gradient_flow(prob, al.datasets.MULTI_INPUT_INITS, t_max=1e15)
    check = flow.gd_direction(prob, sol, gf.times, gf.theta)
    assert np.all(check.angle <= check.tolerance)
    assert np.all(check.mass_off < 1e-5)
    # 1/log t leaves degrees of direction error at 1e15; the tail model predicts them exactly
    assert np.all(check.direction_error > 1.0)
    np.testing.assert_allclose(check.predicted_error, check.direction_error, atol=1e-6)
    # control: θ_mm rotated by twice the resolution in the key plane
    phi = np.radians(2 * check.resolution())
    c, s = np.cos(phi), np.sin(phi)
    rotated = np.array([c * sol.theta[0] - s * sol.theta[1], s * sol.theta[0] + c * sol.theta[1], sol.theta[2]])
    assert np.all(check.against(rotated) > check.tolerance)


def test_gd_direction_fails_the_trap_and_passes_its_control():
    prob = trap_problem()
    sol = al.max_margin(prob)
    gf = flow.gradient_flow(prob, np.array([[3.0, 0.0], [0.0, 0.0]]), t_max=1e15)
    check = flow.gd_direction(prob, sol, gf.times, gf.theta)
    assert check.angle[0] > check.tolerance[0] and check.tolerance[0] == 0  # trapped: input 2 never selects opt
    assert check.angle[1] <= check.tolerance[1]  # from 0 it converges
    run = flow.train_below_smoothness(prob, np.array([[3.0, 0.0]]), steps=2000, record_steps=al.log_steps(2000, 20))
    gd = flow.gd_direction(prob, sol, run.steps, run.theta, lr=run.lr)
    assert not gd.angle[0] <= gd.tolerance[0]


def test_gd_norm_slope_explains_the_multi_input_slope():
    """On the multi-input data GD's slope is ≈ 0.88 M at 3000 steps; the tail model predicts it."""
    prob = al.datasets.multi_input(0)
    sol = al.max_margin(prob)
    run = al.train(prob, np.zeros(3), steps=3000, method="gd", lr=1.0, record_steps=al.log_steps(3000, 40))
    measured, predicted, tol = flow.gd_norm_slope(prob, sol, run.steps, run.theta, lr=1.0)
    assert measured[0] < 0.95  # well short of M ...
    assert abs(measured[0] - predicted[0]) <= tol[0]  # ... and explained
    assert abs(measured[0] - 1.0) > tol[0]  # the naive prediction (slope M) is the control: it fails


# ---------------------------------------------------------------------- chapter 1's counterexample helpers


def test_trap_instance_seed_zero_is_exact_and_other_seeds_perturb():
    exact = ex.trap_instance(0)
    np.testing.assert_array_equal(exact.A, ex.TRAP_KEYS)
    moved = ex.trap_instance(7, scale=0.02)
    assert 0 < np.abs(moved.A - exact.A).max() < 0.1
    np.testing.assert_array_equal(moved.gamma, exact.gamma)  # scores kept: the hypotheses stay true
    assert ex.perturbed(exact, 0, 0.02) is exact


def test_trap_basin_contains_the_trapped_start_and_not_the_origin():
    grid = np.array([-3.0, 0.0, 3.0])
    basin = ex.trap_basin(ex.trap_instance(), grid, t_max=1e8)
    assert basin[1, 2]  # p(0) = (3, 0): trapped
    assert not basin[1, 1]  # p(0) = 0: converges


def test_equal_score_problems_meet_the_hypotheses_and_n1_is_never_trapped():
    probs = ex.equal_score_problems(2, 3, 2, 5, seed=1)
    for prob in probs:
        assert np.all(prob.gamma[:, 1:] == 0) and np.all(prob.gamma[:, 0] == 1)
        al.max_margin(prob)  # feasible, or it raises
    rows = ex.trap_rates([(1, 2, 2, 2.0)], 10, seed=0, t_max=1e8)
    assert rows[0]["trapped"] == 0 and rows[0]["runs"] == 10


def test_step_size_sweep_flags_the_first_loss_increase():
    prob = ex.trap_instance()
    rows = ex.step_size_sweep(prob, np.array([[3.0, 0.0], [0.0, 0.0]]), [0.5, 100.0], 50)
    assert rows[0]["monotone"] == 1.0 and rows[0]["first_increase"] is None  # below 1/L: the descent lemma
    assert rows[1]["monotone"] < 1.0 and rows[1]["first_increase"] is not None
