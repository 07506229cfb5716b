"""Chapter experiments: attnlib.experiments.regularization_path."""

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


def prob_raw_tokens(prob):
    """The raw tokens of the multi-input data: keys (first two coordinates) plus the score coordinate."""
    return np.concatenate([prob.A[..., :2], prob.gamma[..., None]], axis=-1)


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
