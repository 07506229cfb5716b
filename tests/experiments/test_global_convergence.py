"""Chapter experiments: attnlib.experiments.global_convergence."""

import numpy as np
import pytest
from scipy.special import expit

import attnlib as al


def _numeric_grad(prob, p, h=1e-6):
    return np.array([(prob.value(p + h * e) - prob.value(p - h * e)) / (2 * h) for e in np.eye(p.size)])


def _fig1a_ngd(steps=2000):
    prob = al.datasets.single_input()
    run = al.train(prob, al.datasets.SINGLE_INPUT_INITS[:3], steps=steps, method="ngd", lr=0.1, record_every=10)
    return prob, al.max_margin(prob), run


def test_gradient_cosine_matches_finite_differences():
    prob = al.datasets.multi_input(3)
    d = al.max_margin(prob).theta
    for p in np.random.default_rng(0).normal(size=(5, 3)):
        g = _numeric_grad(prob, p)
        expected = g @ d / (np.linalg.norm(g) * np.linalg.norm(d))
        assert al.experiments.global_convergence.gradient_cosine(prob, p, d) == pytest.approx(expected, abs=1e-6)


def test_gradient_cosine_where_the_gradient_underflows():
    prob = al.datasets.single_input()
    sol = al.max_margin(prob)
    far = 5000.0 * sol.direction
    assert np.all(prob.grad(far) == 0)  # the plain gradient is lost ...
    assert al.experiments.global_convergence.gradient_cosine(prob, far, sol.theta) < -0.99  # ... its direction is not


@pytest.mark.parametrize("seed", range(4))
def test_descent_bound_holds_on_equal_scores(seed):
    prob = al.datasets.multi_input(seed)
    sol = al.max_margin(prob)
    P = np.random.default_rng(seed).normal(scale=8.0, size=(2000, 3))
    cos = al.experiments.global_convergence.gradient_cosine(prob, P, sol.theta)
    assert np.all(cos <= al.experiments.global_convergence.descent_bound(prob, sol.theta) + 1e-12)


def test_descent_bound_value_and_a_point_within_0_15_of_it():
    prob = al.datasets.loss_study(3.0)  # d = (1, ±1): p_mm* = (1, 0), cos = -1/√2 where one d dominates
    bound = al.experiments.global_convergence.descent_bound(prob, al.max_margin(prob).theta)
    assert bound == pytest.approx(-1 / np.sqrt(2))
    cos = al.experiments.global_convergence.gradient_cosine(prob, np.array([0.0, -8.0, 0.0]), [1.0, 0.0, 0.0])
    assert bound - 0.15 < cos <= bound + 1e-12


def test_descent_lemma_fails_with_unequal_scores():
    """Fig. 1(b) (the third token scores 0, not 0.9): the gradient has a component along p_mm* at some p."""
    prob = al.datasets.single_input(local=True)
    sol = al.max_margin(prob)
    assert al.experiments.global_convergence.gradient_cosine(prob, np.array([10.0, -10.0, 0.0]), sol.theta) > 0.05
    assert (
        al.experiments.global_convergence.gradient_cosine(
            al.datasets.single_input(), np.array([10.0, -10.0, 0.0]), sol.theta
        )
        < 0
    )


def test_late_offset_exponent_and_ratio_tell_the_limit_from_a_wrong_direction():
    prob, sol, run = _fig1a_ngd()
    wrong = al.enumerate_selections(prob)[1].solution.theta  # p_mm(alpha = 2): not a limit
    assert np.all(al.experiments.global_convergence.late_offset_exponent(run.steps, run.theta, sol.theta) < 0.1)
    assert np.all(al.experiments.global_convergence.late_offset_exponent(run.steps, run.theta, wrong) > 0.9)
    assert np.all(al.experiments.global_convergence.late_offset_ratio(run.steps, run.theta, sol.theta) <= 1)
    assert np.all(al.experiments.global_convergence.late_offset_ratio(run.steps, run.theta, wrong) > 2)


def test_late_offset_ratio_of_a_frozen_offset_is_one_half():
    steps = np.arange(0.0, 101.0)
    theta = np.stack([steps + 1.0, np.full_like(steps, 2.0)], axis=-1)[:, None, :]  # offset 2, norm growing
    assert al.experiments.global_convergence.late_offset_ratio(steps, theta, [1.0, 0.0])[0] == pytest.approx(
        0.5, rel=1e-3
    )


def test_ngd_rate_tolerance_formula_and_the_rate_it_covers():
    prob, sol, run = _fig1a_ngd()
    eps = al.experiments.global_convergence.ngd_rate_tolerance(prob, sol.theta, run.steps, run.theta, 0.1)
    half = np.searchsorted(run.steps, run.steps[-1] / 2)
    d = np.array([[-1.1, 1.0, 0.0], [-0.1, 1.0, 0.0]])  # k_opt - k_t of Fig. 1(a)
    B = al.orthogonal_offset(run.theta[half:], sol.theta).max()
    spread = 2 * B * al.orthogonal_offset(d, sol.theta).max() + np.log(2)
    assert eps == pytest.approx(spread / (sol.margin * 0.1 * (run.steps[-1] - run.steps[half])))
    rate = al.fits.exponential_rate(run.steps, prob.log_gap(run.theta)) / (sol.margin * 0.1)
    assert np.all(np.abs(rate - 1) <= eps)


def test_gd_gap_constant_fails_where_tokens_outside_the_margin_linger():
    prob = al.datasets.multi_input(0)
    sol = al.max_margin(prob)
    run = al.train(prob, np.zeros(3), steps=3000, method="gd", lr=1.0, record_steps=al.log_steps(3000, 16))
    value, tol = al.experiments.global_convergence.gd_gap_constant(
        prob, run.steps[1:], run.theta[1:, 0], 1.0, 1 / sol.margin
    )
    assert abs(value - 1) > 10 * tol


def test_descent_ratio_is_the_largest_cosine_over_the_bound():
    prob = al.datasets.single_input()
    sol = al.max_margin(prob)
    points = np.random.default_rng(1).normal(scale=5, size=(7, 4, 3))
    expected = al.experiments.global_convergence.gradient_cosine(
        prob, points, sol.theta
    ).max() / -al.experiments.global_convergence.descent_bound(prob, sol.theta)
    assert al.experiments.global_convergence.descent_ratio(prob, sol.theta, points) == pytest.approx(expected)
    assert al.experiments.global_convergence.descent_ratio(prob, sol.theta, points) <= -1
    local = al.datasets.single_input(local=True)
    assert al.experiments.global_convergence.descent_ratio(local, al.max_margin(local).theta, [[10.0, -10.0, 0.0]]) > 0


def test_offset_relaxation_reason_only_for_two_neighbours_and_a_short_horizon():
    prob = al.datasets.loss_study(3.0)  # two neighbours, kappa = 1 (M = 1)
    sol = al.max_margin(prob)
    assert (
        al.experiments.global_convergence.offset_relaxation_reason(prob, sol, 120, 0.1) is None
    )  # 1 * 0.1 * 120 / 2 = 6
    reason = al.experiments.global_convergence.offset_relaxation_reason(prob, sol, 100, 0.1)
    assert reason is not None and "kappa = 1" in reason and "5.00 < 6" in reason
    single = al.datasets.single_input()  # one neighbour: nothing to relax (and the non-neighbour at c = 1.099)
    assert al.experiments.global_convergence.offset_relaxation_reason(single, al.max_margin(single), 1300, 0.1) is None


def test_the_closest_non_neighbour_needs_six_e_foldings_too():
    ex = al.experiments.global_convergence
    single = al.datasets.single_input()  # Fig. 1(a): one neighbour, the other token at c = 1.099
    sol = al.max_margin(single)
    c, M = ex.closest_non_neighbour(sol), np.linalg.norm(sol.theta)
    assert c == pytest.approx(1.0990099, rel=1e-6)
    need = int(np.ceil(2 * ex.OFFSET_E_FOLDINGS * M / ((c - 1) * 0.1)))  # (c - 1) eta T / (2M) = 6
    assert ex.offset_check_horizon(single, sol, 1000, 0.1) == need
    assert ex.offset_check_horizon(single, sol, 100, 0.1) == 400  # capped at 4 * base
    assert ex.offset_relaxation_reason(single, sol, need, 0.1) is None
    reason = ex.offset_relaxation_reason(single, sol, need - 10, 0.1)
    assert reason is not None and "closest non-neighbour c = 1.099" in reason and "kappa" not in reason
    both = al.datasets.loss_study(3.0)  # every non-selected token a neighbour: no non-neighbour
    assert ex.closest_non_neighbour(al.max_margin(both)) == np.inf


def test_norm_log_slope_reaches_M_on_neighbours_only_data():
    prob = al.datasets.loss_study(3.0)
    sol = al.max_margin(prob)
    run = al.train(prob, np.zeros(3), steps=10_000, method="gd", lr=1.0, record_steps=al.log_steps(10_000, 32))
    ratio, eps = al.experiments.global_convergence.norm_log_slope(
        run.steps[1:], run.norm[1:, 0], run.theta[1:, 0], sol.theta
    )
    assert abs(ratio - 1) <= eps < 0.01
    assert (
        al.experiments.global_convergence.offset_check_horizon(prob, sol, 50, 0.1, cap=2) == 100
    )  # 12 / (kappa eta) = 120, capped


@pytest.mark.parametrize("loss", ["logistic", "linear"])
@pytest.mark.parametrize("C", [1.0, 3.0, 10.0])
def test_offset_equilibrium_matches_the_two_input_balance(loss, C):
    # Keys (1, ±1) against (0, 0): p_mm* = (1, 0), both tokens are neighbours, and the offset
    # balances C|l'(C)| e^{-p2} against |l'(1)| e^{p2}: p2 = (1/2) ln(C |l'(C)| / |l'(1)|).
    prob = al.datasets.loss_study(C, loss)
    q, kappa = al.experiments.global_convergence.offset_equilibrium(prob, al.max_margin(prob))
    dl = (lambda u: expit(-u)) if loss == "logistic" else (lambda u: 1.0)
    assert q[1] == pytest.approx(0.5 * np.log(C * dl(C) / dl(1.0)), abs=1e-9)
    assert abs(q[0]) < 1e-9 and q[2] == 0.0
    assert kappa == pytest.approx(1.0, abs=1e-9)  # M = 1, d_perp = ±1 with equal weights


def test_single_neighbour_has_no_sideways_pull():
    prob = al.datasets.single_input()  # Fig. 1(a): one SVM-neighbour, parallel to p_mm*
    sol = al.max_margin(prob)
    assert sol.neighbors.sum() == 1
    q, kappa = al.experiments.global_convergence.offset_equilibrium(prob, sol)
    assert kappa == 0.0 and np.all(q == 0.0)


def test_ngd_offset_converges_to_the_equilibrium():
    prob = al.datasets.loss_study(3.0)
    sol = al.max_margin(prob)
    q, kappa = al.experiments.global_convergence.offset_equilibrium(prob, sol)
    traj = al.train(prob, np.array([[0.0, 2.0, 0.0], [0.0, -3.0, 0.0]]), steps=800, method="ngd", lr=0.1)
    offset = traj.final - (traj.final @ sol.direction)[:, None] * sol.direction
    assert np.allclose(offset, q, atol=1e-6)


def test_offset_equilibrium_is_a_stationary_point_of_the_neighbours_pull():
    # On random multi-input instances with two neighbours, the neighbours' pull at q_star has no
    # component orthogonal to p_mm*, and kappa is M times the curvature of log Z there.
    for seed in range(6):
        prob = al.datasets.multi_input(seed)
        sol = al.max_margin(prob)
        q, kappa = al.experiments.global_convergence.offset_equilibrium(prob, sol)
        rows, toks = np.nonzero(sol.neighbors)
        d = prob.A[rows, 0] - prob.A[rows, toks]
        w = np.abs(prob.loss.derivative(prob.gamma[rows, 0])) * (prob.gamma[rows, 0] - prob.gamma[rows, toks])
        u = sol.direction
        assert abs(q @ u) < 1e-9
        pull = (w * np.exp(-d @ q)) @ d
        assert np.linalg.norm(pull - (pull @ u) * u) < 1e-8 * np.linalg.norm(pull)
        if len(rows) == 1:
            assert kappa == 0.0
        else:
            e = np.array([-u[1], u[0], 0.0])

            def logZ(s, w=w, d=d, q=q, e=e):
                return np.log(np.sum(w * np.exp(-d @ (q + s * e))))

            h = 1e-4
            curvature = (logZ(h) - 2 * logZ(0.0) + logZ(-h)) / h**2
            assert kappa == pytest.approx(curvature / sol.margin, rel=1e-4)


# ---------------------------------------------------------------------- seeds, twins and the trap rates


def test_jittered_scores_keep_seed_zero_and_lower_the_others_by_at_most_the_jitter():
    ex = al.experiments.global_convergence
    scores = np.array([1.0, 3.0, 100.0])
    np.testing.assert_array_equal(ex.jittered_scores(scores, 0), scores)
    for seed in (1, 2003, 2017):
        moved = ex.jittered_scores(scores, seed)
        assert np.all(moved < scores) and np.all(moved >= scores * np.exp(-ex.SCORE_JITTER))
        np.testing.assert_array_equal(moved, ex.jittered_scores(scores, seed))  # the seed decides
    assert not np.allclose(ex.jittered_scores(scores, 1), ex.jittered_scores(scores, 2))


def test_tail_model_check_passes_the_flow_and_fails_its_rotated_and_wrong_references():
    ex = al.experiments.global_convergence
    prob = al.datasets.single_input()
    sol = al.max_margin(prob)
    flow = al.flow.gradient_flow(prob, al.datasets.SINGLE_INPUT_INITS[:3], t_max=1e15)
    wrong = al.enumerate_selections(prob)[1].solution.theta  # the SVM of token 2
    out = ex.tail_model_check(prob, sol, flow.steps, flow.theta, others={"token 2": wrong})
    assert out["value"] <= 1.0 and out["resolution"] > 0
    assert len(out["controls"]) == 2 and all(v > 1.0 for v in out["controls"].values())


def test_mass_rate_ratio_is_one_under_ngd_and_far_below_under_gd():
    ex = al.experiments.global_convergence
    prob = al.datasets.multi_input(0)
    sol = al.max_margin(prob)
    ngd = al.train(prob, al.datasets.MULTI_INPUT_INITS[:2], steps=3000, method="ngd", lr=0.1, record_every=10)
    eps = ex.ngd_rate_tolerance(prob, sol.theta, ngd.steps, ngd.theta, 0.1)
    assert np.all(np.abs(ex.mass_rate_ratio(prob, sol, ngd.steps, ngd.theta, 0.1) - 1) <= eps)
    gd = al.train(prob, al.datasets.MULTI_INPUT_INITS[:2], steps=3000, method="gd", lr=1.0, record_every=10)
    assert np.all(ex.mass_rate_ratio(prob, sol, gd.steps, gd.theta, 1.0) < 0.1)  # a power law, not e^{-eta t/M}


def test_trap_rates_worst_attention_off_is_above_one_half_exactly_when_a_run_is_trapped():
    # With two tokens per input a run is trapped iff sigma_opt < 1/2 at the end: the statistic of
    # chapter 1's n = 1 check separates the rows exactly as the count does.
    rows = al.experiments.global_convergence.trap_rates([(1, 2, 2, 2.0), (2, 2, 2, 2.0)], 30, seed=2, t_max=1e8)
    for row in rows:
        assert (row["worst_log_off"] > -np.log(2)) == (row["trapped"] > 0)
    assert rows[0]["trapped"] == 0 and rows[1]["trapped"] > 0  # the control row has trapped runs
