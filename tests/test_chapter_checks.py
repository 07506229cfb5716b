"""The helpers behind chapters 2 and 3's checks (issue 22): exact searches, the first-order rate,
perturbed instances, the locally-optimal final selection."""

import numpy as np
import pytest

import attnlib as al
from attnlib.experiments import local_convergence as local_checks
from attnlib.experiments import regularization_path as path_theory


def _instance(seed):
    scores = np.random.default_rng(seed).uniform(0, 0.9, size=(3, 6))
    return al.datasets.multi_input(seed, nonopt_scores=scores)


def test_the_exact_circle_search_finds_what_the_multistart_path_finds_and_no_better_point_exists():
    prob = _instance(1)
    radii = np.array([2.0, 30.0])
    exact = path_theory.exact_circle_path(prob, radii)
    path = al.paths.regularization_path(prob, radii, n_starts=4, seed=1)
    assert np.all(np.abs(path.log_gap - exact.log_gap) <= 1e-9)
    # an independent dense scan of the circle never goes below the exact minimum
    basis = path_theory.key_plane_basis(prob)
    phi = np.linspace(0, 2 * np.pi, 200_001)
    for R, best in zip(radii, exact.log_gap):
        scan = prob.log_gap(R * (np.cos(phi)[:, None] * basis[0] + np.sin(phi)[:, None] * basis[1]))
        assert scan.min() >= best - 1e-12
    assert np.allclose(np.linalg.norm(exact.theta, axis=1), radii)


def test_the_circle_max_margin_direction_is_the_svm_direction():
    for seed in (0, 3):
        prob = _instance(seed)
        u = path_theory.circle_max_margin_direction(prob)
        assert float(al.one_minus_cosine(u, al.max_margin(prob).theta)) < 1e-12


def test_the_linearized_log_gap_is_the_log_gap_to_first_order():
    prob = _instance(2)
    u = al.max_margin(prob).direction
    lin = path_theory.linearized_log_gap(prob)
    for R in (20.0, 60.0):
        # relative error O(attention off the optimal tokens) = O(e^{-R·margin})
        assert abs(lin(R * u[None])[0] - prob.log_gap(R * u)) < 10 * np.exp(-R * al.max_margin(prob).margin)


def test_the_path_rate_matches_the_path_and_tells_one_neighbour_from_two():
    radii = np.geomspace(1.0, 100.0, 5)
    for seed, supports in ((0, 1), (1, 2)):
        prob = _instance(seed)
        sol = al.max_margin(prob)
        rate = path_theory.path_rate(prob, sol, radii)
        [case] = path_theory.paths_against_svm([prob], radii, n_starts=4, seeds=[seed])
        assert rate.supports == supports
        assert abs(case.error[-1] / rate.predicted[-1] - 1) <= rate.accuracy[-1] + 10 * rate.linearization[-1]
    with pytest.raises(ValueError, match="span a plane"):
        path_theory.exact_circle_path(al.datasets.random_tokens(3, 4, 4, seed=0), [1.0])


def test_perturbed_fig1_keeps_the_hypotheses_and_seed_zero_is_the_paper():
    assert np.array_equal(local_checks.perturbed_single_input(0, False).A, al.datasets.single_input().A)
    for seed in range(1, 30):
        a, b = (local_checks.perturbed_single_input(seed, local) for local in (False, True))
        assert np.array_equal(a.A, b.A) and a.gamma[0, 1] == a.gamma[0, 2]  # the tie of Fig. 1(a) stays
        lo = [r.select for r in al.enumerate_selections(b) if r.locally_optimal]
        assert lo == [(0,), (1,)]  # Fig. 1(b): the optimal token and token 2, as in the paper
        d = local_checks.tie_direction(b)
        k = b.A[0]
        assert abs(d @ (k[0] - k[2])) < 1e-12 and d @ (k[1] - k[2]) > 0


def test_final_selection_report_checks_local_optimality_and_its_control():
    prob = al.datasets.single_input(local=True)
    final = np.array([[10.0, 0.0, 0.0], [-5.0, 1.0, 0.0]])  # logits favour token 2, then token 1
    report = local_checks.final_selection_report([prob, prob], final)
    assert report.alpha_hat.tolist() == [[1], [0]]
    assert report.locally_optimal.tolist() == [True, True]
    assert report.one_off.shape == (2, 1) and not np.array_equal(report.one_off, report.alpha_hat)
