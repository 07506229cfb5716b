"""ATT-SVM / W-SVM under the ℓp, ℓ1, ℓ∞, spectral and nuclear norms against independent solvers.

ℓ1 and ℓ∞ as linear programs (scipy's HiGHS), ℓp by SLSQP, spectral by its dual certificate
(weak duality with the nuclear norm), nuclear and ℓ2 against the library's own earlier programs;
the KKT conditions (feasibility, λ ≥ 0, complementary slackness) for every norm.
"""

import cvxpy as cp
import numpy as np
import pytest
from scipy.optimize import linprog, minimize

import attnlib as al
from attnlib import svm


def rows(prob):
    G, h, _ = svm._constraint_rows(prob, prob.opt)
    return G, h


def problems():
    yield "single", al.datasets.single_input()
    yield "multi", al.datasets.multi_input()
    yield "w", al.datasets.random_tokens(4, 5, 5, seed=3, family="global")


PROBLEMS = dict(problems())


def lp_l1(G, h):
    """min Σ|x| s.t. G x ≥ h as an LP in (x⁺, x⁻) ≥ 0."""
    m, k = G.shape
    res = linprog(np.ones(2 * k), A_ub=-np.hstack([G, -G]), b_ub=-h, bounds=(0, None), method="highs")
    assert res.status == 0
    return res.fun


def lp_linf(G, h):
    """min t s.t. G x ≥ h, −t ≤ x_j ≤ t as an LP in (x, t)."""
    m, k = G.shape
    c = np.zeros(k + 1)
    c[-1] = 1.0
    eye = np.eye(k)
    A = np.vstack(
        [np.hstack([-G, np.zeros((m, 1))]), np.hstack([eye, -np.ones((k, 1))]), np.hstack([-eye, -np.ones((k, 1))])]
    )
    b = np.concatenate([-h, np.zeros(2 * k)])
    res = linprog(c, A_ub=A, b_ub=b, bounds=[(None, None)] * (k + 1), method="highs")
    assert res.status == 0
    return res.fun


def kkt(prob, sol, norm, tol=1e-6):
    cert = svm.norm_certificate(prob, sol, norm)
    assert cert["min_slack"] > -tol  # primal feasible
    assert cert["min_dual"] > -tol  # dual feasible
    assert cert["primal"] - cert["dual"] <= tol * cert["primal"]  # zero duality gap (weak duality bound met)
    flat_duals = sol.duals[sol.constraint_values != 0]
    slack = sol.constraint_values[sol.constraint_values != 0] - 1.0
    assert np.max(np.abs(flat_duals * slack)) <= tol * max(1.0, np.max(flat_duals))  # complementary slackness


@pytest.mark.parametrize("name", list(PROBLEMS))
@pytest.mark.parametrize("norm, independent", [("l1", lp_l1), ("linf", lp_linf)])
def test_polyhedral_norms_match_linear_programs(name, norm, independent):
    prob = PROBLEMS[name]
    sol = svm.max_margin_norm(prob, norm)
    G, h = rows(prob)
    assert float(svm.norm_value(sol.theta.ravel(), norm)) == pytest.approx(independent(G, h), rel=1e-7)
    kkt(prob, sol, norm)


@pytest.mark.parametrize("name", list(PROBLEMS))
@pytest.mark.parametrize("p", [1.5, 3.0, 6.0])
def test_lp_norms_match_slsqp(name, p):
    prob = PROBLEMS[name]
    sol = svm.max_margin_norm(prob, p)
    G, h = rows(prob)
    x0 = al.max_margin(prob).theta.ravel() * 1.01  # feasible start: the ℓ2 SVM, scaled inside
    res = minimize(
        lambda x: np.sum(np.abs(x) ** p),
        x0,
        jac=lambda x: p * np.sign(x) * np.abs(x) ** (p - 1),
        constraints=[{"type": "ineq", "fun": lambda x: G @ x - h, "jac": lambda x: G}],
        method="SLSQP",
        options={"ftol": 1e-14, "maxiter": 2000},
    )
    assert res.success, res.message
    assert float(svm.norm_value(sol.theta.ravel(), p)) == pytest.approx(np.sum(np.abs(res.x) ** p) ** (1 / p), rel=1e-6)
    assert np.max(np.abs(sol.theta.ravel() - res.x)) <= 1e-3 * np.max(np.abs(res.x))  # strictly convex: one minimiser
    kkt(prob, sol, p)


def test_spectral_norm_certified_by_its_nuclear_dual():
    prob = PROBLEMS["w"]
    sol = svm.max_margin_norm(prob, "spectral")
    kkt(prob, sol, "spectral")
    # an independent second solver reaches the same optimal value
    G, h = rows(prob)
    W = cp.Variable(prob.shape)
    cp.Problem(cp.Minimize(cp.sigma_max(W)), [G @ cp.vec(W, order="C") >= h]).solve(solver=cp.SCS, eps=1e-9)
    assert float(svm.norm_value(sol.theta, "spectral")) == pytest.approx(float(np.linalg.norm(W.value, 2)), rel=1e-5)


def test_nuclear_and_l2_agree_with_max_margin():
    prob = PROBLEMS["w"]
    nuc = svm.max_margin_norm(prob, "nuc")
    assert np.allclose(nuc.theta, al.max_margin(prob, norm="nuc").theta, atol=1e-5)
    kkt(prob, nuc, "nuc")
    l2 = svm.max_margin_norm(prob, "l2")
    assert np.allclose(l2.theta, al.max_margin(prob).theta, atol=1e-5)  # the exact NNLS solve
    assert svm.max_margin_norm(prob, 2.0).norm == "l2"


def test_batched_programs_equal_separate_ones():
    probs = [al.datasets.random_tokens(3, 4, 4, seed=s, family="global") for s in range(3)]
    for norm in ("linf", "spectral", 1.5):
        together = svm.max_margin_norms(probs, norm)
        for prob, sol in zip(probs, together):
            alone = svm.max_margin_norm(prob, norm)
            assert sol.margin == pytest.approx(alone.margin, rel=1e-6)


def test_infeasible_and_bad_norms_raise():
    X = np.array([[[1.0, 0.0, 1.0], [2.0, 0.0, 0.0]], [[2.0, 0.0, 1.0], [1.0, 0.0, 0.0]]])
    prob = al.prompt_attention(X, [1, 1], al.datasets.SCORE_HEAD, al.datasets.KEY_PLANE)
    with pytest.raises(al.InfeasibleError, match="infeasible"):
        svm.max_margin_norm(prob, "linf")
    with pytest.raises(ValueError, match="norm must be one of"):
        svm.max_margin_norm(prob, 1.0)
    with pytest.raises(ValueError, match="norm must be one of"):
        svm.max_margin_norm(prob, "fro2")
    with pytest.raises(ValueError, match="matrix parameters"):
        svm.max_margin_norm(prob, "spectral")


def test_norm_values_and_duals():
    x = np.array([3.0, -4.0])
    assert float(svm.norm_value(x, 2.0)) == pytest.approx(5.0)
    assert float(svm.norm_value(x, "linf")) == 4.0
    assert float(svm.norm_value(np.zeros(3), 3.0)) == 0.0
    M = np.diag([3.0, 1.0])
    assert float(svm.norm_value(M, "spectral")) == 3.0 and float(svm.norm_value(M, "nuc")) == 4.0
    assert svm.dual_norm(1.5) == 3.0 and svm.dual_norm("l1") == "linf" and svm.dual_norm("nuc") == "spectral"
