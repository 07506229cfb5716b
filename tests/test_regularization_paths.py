"""Many regularization paths at once, and their comparison with the SVM ray (attnlib.paths)."""

import numpy as np
import pytest

import attnlib as al


def unequal(seed):
    """The [MMTS] multi-input data with unequal non-optimal scores."""
    return al.datasets.multi_input(seed, nonopt_scores=np.random.default_rng(seed).uniform(0.0, 0.9, size=(3, 6)))


RADII = np.array([0.5, 2.0, 8.0, 40.0])


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


def test_paths_against_svm_compares_each_path_with_its_own_svm_ray():
    probs = [unequal(0), unequal(1)]
    cases = al.experiments.regularization_path.paths_against_svm(probs, RADII, n_starts=2, seeds=[0, 1])
    for prob, case in zip(probs, cases):
        sol = al.max_margin(prob)
        np.testing.assert_allclose(case.svm.theta, sol.theta)
        np.testing.assert_allclose(case.error, al.one_minus_cosine(case.path.theta, sol.theta))
        np.testing.assert_allclose(
            case.bound,
            al.paths.direction_bound(al.experiments.regularization_path.ray_margin_bound(prob, sol.theta, RADII)),
        )
        np.testing.assert_allclose(
            case.ray_excess, al.experiments.regularization_path.ray_gap_excess(prob, case.path, sol.theta)
        )
        assert case.certified == (case.ray_excess[-1] >= -al.experiments.regularization_path.CERTIFICATE_SLACK)
        assert case.certified and case.error[-1] <= case.bound[-1]  # the theorem's bound, on a certified path


def test_paths_against_svm_takes_a_nonlinear_head_with_the_svm_of_its_induced_tokens():
    rng = np.random.default_rng(0)
    head = al.model.nonlinear_head(rng.normal(size=(3, 3, 6)), rng.normal(size=(8, 6)), rng.uniform(size=8))
    [case] = al.experiments.regularization_path.paths_against_svm([head], [1.0, 10.0], n_starts=2, seeds=[0], tol=1e-6)
    np.testing.assert_allclose(case.svm.theta, al.max_margin(head.token_problem).theta)
    assert case.path.theta.shape == (2, 6)


def test_uncertified_reports_a_search_that_ended_above_the_ray():
    assert (
        al.experiments.regularization_path.uncertified(0.0) is None
        and al.experiments.regularization_path.uncertified(-0.5e-9) is None
    )
    reason = al.experiments.regularization_path.uncertified(-0.25)
    assert "-0.25" in reason and "not certified" in reason


def test_radius_table_has_one_column_per_radius():
    table = al.experiments.regularization_path.radius_table(
        [0.5, 200.0], {"error": [1e-3, 2e-8], "$B(R)$": [np.inf, 1e-4]}
    )
    assert table.splitlines() == [
        "| $R$ | 0.5 | 200 |",
        "|---|---|---|",
        "| error | 1.00e-03 | 2.00e-08 |",
        "| $B(R)$ | inf | 1.00e-04 |",
    ]
    with pytest.raises(ValueError, match="one value per radius"):
        al.experiments.regularization_path.radius_table([1.0, 2.0], {"error": [1.0]})


def test_matrix_paths_separate_the_frobenius_and_nuclear_limits():
    prob = al.datasets.random_tokens(3, 4, 4, seed=0)
    radii = [1.0, 30.0, 300.0]
    mat = al.experiments.regularization_path.matrix_paths(prob, radii, seed=0, tol=1e-6, max_iter=400)
    assert mat.w.parametrization == "direct" and mat.kq.parametrization == "kq"
    assert mat.w.theta.shape == mat.kq.theta.shape == (3, 4, 4)
    np.testing.assert_allclose(
        mat.rho_w, al.experiments.regularization_path.margin_ratio(prob, mat.w.theta, mat.fro, "fro")
    )
    np.testing.assert_allclose(
        mat.lo_nuc, al.experiments.regularization_path.ray_margin_bound(prob, mat.nuc, radii, "nuc")
    )
    assert mat.nuc_in_fro < 1 and mat.fro_in_nuc < 1  # each SVM is the other's worse direction
    # (K, Q): (‖K‖² + ‖Q‖²)/2 = R, and the product has nuclear norm at most R
    np.testing.assert_allclose(mat.kq.norm, radii, rtol=1e-9)
    assert np.all(
        al.experiments.regularization_path.parameter_norm(mat.kq.theta, "nuc", 2) <= np.array(radii) * (1 + 1e-9)
    )
    # where certified, each path's margin ratio is at least its bound
    for rho, lo, excess in ((mat.rho_w, mat.lo_fro, mat.excess_w), (mat.rho_kq, mat.lo_nuc, mat.excess_kq)):
        if al.experiments.regularization_path.uncertified(excess[-1]) is None:
            assert rho[-1] >= lo[-1]


def test_matrix_paths_nuclear_svm_is_the_cvxpy_one_with_or_without_factors():
    prob = al.datasets.random_tokens(3, 4, 4, seed=1)
    reference = al.max_margin(prob, norm="nuc").theta  # cvxpy
    fast = al.experiments.regularization_path.matrix_paths(
        prob, [1.0, 10.0], tol=1e-6, max_iter=100
    )  # Clarabel on the reduced SDP
    assert prob.factors is not None
    nuclear = al.experiments.regularization_path.parameter_norm(reference, "nuc", 2)
    assert al.experiments.regularization_path.parameter_norm(fast.nuc, "nuc", 2) == pytest.approx(nuclear, rel=1e-7)
    bare = al.TokenSelectionProblem(prob.A, prob.gamma, loss=prob.loss)  # no factors: the cvxpy route
    assert bare.factors is None
    slow = al.experiments.regularization_path.matrix_paths(bare, [1.0, 10.0], tol=1e-6, max_iter=100)
    assert al.experiments.regularization_path.parameter_norm(slow.nuc, "nuc", 2) == pytest.approx(nuclear, rel=1e-7)
