"""offset_equilibrium: the sideways offset set by the SVM-neighbours, and its relaxation rate."""

import numpy as np
import pytest
from scipy.special import expit

import attnlib as al


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
