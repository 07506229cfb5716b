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
        assert al.gradient_cosine(prob, p, d) == pytest.approx(expected, abs=1e-6)


def test_gradient_cosine_where_the_gradient_underflows():
    prob = al.datasets.single_input()
    sol = al.max_margin(prob)
    far = 5000.0 * sol.direction
    assert np.all(prob.grad(far) == 0)  # the plain gradient is lost ...
    assert al.gradient_cosine(prob, far, sol.theta) < -0.99  # ... its direction is not


@pytest.mark.parametrize("seed", range(4))
def test_descent_bound_holds_on_equal_scores(seed):
    prob = al.datasets.multi_input(seed)
    sol = al.max_margin(prob)
    P = np.random.default_rng(seed).normal(scale=8.0, size=(2000, 3))
    cos = al.gradient_cosine(prob, P, sol.theta)
    assert np.all(cos <= al.descent_bound(prob, sol.theta) + 1e-12)


def test_descent_bound_value_and_a_point_within_0_15_of_it():
    prob = al.datasets.loss_study(3.0)  # d = (1, ±1): p_mm* = (1, 0), cos = -1/√2 where one d dominates
    bound = al.descent_bound(prob, al.max_margin(prob).theta)
    assert bound == pytest.approx(-1 / np.sqrt(2))
    cos = al.gradient_cosine(prob, np.array([0.0, -8.0, 0.0]), [1.0, 0.0, 0.0])
    assert bound - 0.15 < cos <= bound + 1e-12


def test_descent_lemma_fails_with_unequal_scores():
    """Fig. 1(b) (the third token scores 0, not 0.9): the gradient has a component along p_mm* at some p."""
    prob = al.datasets.single_input(local=True)
    sol = al.max_margin(prob)
    assert al.gradient_cosine(prob, np.array([10.0, -10.0, 0.0]), sol.theta) > 0.05
    assert al.gradient_cosine(al.datasets.single_input(), np.array([10.0, -10.0, 0.0]), sol.theta) < 0


def test_exponential_rate_per_column_and_window():
    t = np.arange(0.0, 201.0)
    log_y = np.column_stack([-0.2 * t, -0.5 * t + np.where(t < 100, 3 * np.sin(t), 0.0)])
    assert al.exponential_rate(t, log_y) == pytest.approx([0.2, 0.5])
    with pytest.raises(ValueError):
        al.exponential_rate(t, log_y[:-1])


def test_ngd_gap_decays_at_the_margin_rate():
    prob = al.datasets.loss_study(3.0)  # M = 1
    run = al.train(prob, np.zeros(3), steps=400, method="ngd", lr=0.1)
    rate = al.exponential_rate(run.steps, prob.log_gap(run.theta))[0]
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
