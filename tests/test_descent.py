"""The descent lemma, the loss-gap rate and the p ↔ W correspondence of chapter 1 ([MMTS])."""

import numpy as np
import pytest

import attnlib as al


def _numeric_grad(prob, p, h=1e-6):
    return np.array([(prob.value(p + h * e) - prob.value(p - h * e)) / (2 * h) for e in np.eye(p.size)])


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


def test_exponential_rate_per_column_and_window():
    t = np.arange(0.0, 201.0)
    log_y = np.column_stack([-0.2 * t, -0.5 * t + np.where(t < 100, 3 * np.sin(t), 0.0)])
    assert al.fits.exponential_rate(t, log_y) == pytest.approx([0.2, 0.5])
    with pytest.raises(ValueError):
        al.fits.exponential_rate(t, log_y[:-1])


def test_ngd_gap_decays_at_the_margin_rate():
    prob = al.datasets.loss_study(3.0)  # M = 1
    run = al.train(prob, np.zeros(3), steps=400, method="ngd", lr=0.1)
    rate = al.fits.exponential_rate(run.steps, prob.log_gap(run.theta))[0]
    assert rate / 0.1 == pytest.approx(1.0, abs=0.02)


def test_w_svm_of_one_query_is_the_raw_token_p_svm_times_the_query():
    """Logits x_tᵀ W z with one query z: the W-SVM is p_mm zᵀ/‖z‖², p_mm the SVM on the raw tokens
    (cvxpy as the independent solver)."""
    X = np.array([[[-0.1, 1.0, 1.0], [1.0, 0.0, 0.9], [0.0, 0.0, 0.9]]])
    z = np.array([1.0, -2.0, 0.5])
    W_mm = al.max_margin(al.self_attention(X, [1], al.datasets.SCORE_HEAD, Z=z[None]), solver="cvxpy").theta
    p_mm = al.max_margin(al.prompt_attention(X, [1], al.datasets.SCORE_HEAD)).theta
    assert X.shape == (1, 3, 3)
    np.testing.assert_allclose(W_mm, np.outer(p_mm, z) / (z @ z), atol=1e-7)


def _fig1a_ngd(steps=2000):
    prob = al.datasets.single_input()
    run = al.train(prob, al.datasets.SINGLE_INPUT_INITS[:3], steps=steps, method="ngd", lr=0.1, record_every=10)
    return prob, al.max_margin(prob), run


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
    single = al.datasets.single_input()  # one neighbour: nothing to relax
    assert al.experiments.global_convergence.offset_relaxation_reason(single, al.max_margin(single), 10, 0.1) is None


def test_random_and_adversarial_starts():
    prob = al.datasets.multi_input(2)
    sol = al.max_margin(prob)
    starts, adversarial = al.datasets.random_and_adversarial_starts(prob, sol.theta, 30, 4.0, seed=5)
    assert starts.shape == (30, 3) and adversarial.sum() == 9 and np.all(adversarial[-9:])
    np.testing.assert_allclose(np.linalg.norm(starts[adversarial], axis=-1), 4.0)
    assert np.all(starts[:, 2] == 0)
    norms = np.linalg.norm(starts[~adversarial], axis=-1)
    assert np.all((norms >= 1 / 4.0) & (norms <= 4.0))
    np.testing.assert_allclose(starts[-3], -4.0 * sol.direction)  # the one pointing away from p_mm*
    again, _ = al.datasets.random_and_adversarial_starts(prob, sol.theta, 30, 4.0, seed=5)
    np.testing.assert_array_equal(starts, again)
    with pytest.raises(ValueError):
        al.datasets.random_and_adversarial_starts(prob, sol.theta, 5, 4.0)


def test_loss_study_offset_and_its_bound_ratio():
    assert al.datasets.loss_study_offset(np.array([1.0, 9.0]), "linear") == pytest.approx([0.0, np.log(3.0)])
    C = 3.0
    run = al.train(al.datasets.loss_study(C), np.zeros(3), steps=1000, method="ngd", lr=0.1, record_every=5)
    assert run.theta[-1, 0, 1] == pytest.approx(al.datasets.loss_study_offset(C), abs=1e-3)
    assert al.datasets.loss_study_offset_ratio(run, C, "logistic", 0.1) <= 1
    short = al.train(al.datasets.loss_study(30.0), np.zeros(3), steps=300, method="ngd", lr=0.1, record_every=5)
    assert al.datasets.loss_study_offset_ratio(short, 30.0, "logistic", 0.1) > 1  # the path has not turned yet


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
