"""Max-margin problems against independent solvers, and the paper's local-optimality verdicts."""

import itertools

import mpmath
import numpy as np
import pytest
from scipy.optimize import minimize, nnls

import attnlib as al
import attnlib.svm


def _problem(seed=0, n=4, T=5, d=6, cross=False, loss="logistic"):
    D = al.datasets.planted_tokens(n, T, d, seed, queries="cross" if cross else "self")
    return D, al.model.joint_self_attention(D.X, D.y, Z=D.Z, loss=loss)


def _constraint_batch(configs_seeds):
    cons = [
        al.svm.svm_constraints(X, Z, opt) for X, _, _, Z, opt in (al.datasets.rank_instance(*c) for c in configs_seeds)
    ]
    return np.stack([c[0] for c in cons]), np.stack([c[1] for c in cons])


def official(h):
    X, y = al.datasets.joint_tokens(third=(0.5, h))
    return X, y, al.joint_svms(X, y, select=1)


def _relaxed_by_slsqp(X, y, support):
    G = X[:, 1] - X[:, 0]
    h = np.where(support, 1.0, 0.0)
    cons = [{"type": "ineq", "fun": lambda p, g=g, c=c: g @ p - c, "jac": lambda p, g=g: g} for g, c in zip(G, h)]
    res = minimize(
        lambda p: p @ p,
        x0=np.array([5.0, 0.0]),
        jac=lambda p: 2 * p,
        constraints=cons,
        method="SLSQP",
        options={"ftol": 1e-14, "maxiter": 500},
    )
    assert res.success
    return res.x


def _balanced_by_grid(svms, rho):
    # Independent solve in 2-D: scan the unit circle (the optimum of a max-min of affine functions with
    # a positive value lies on the sphere), then zoom in around the best angle.
    G = svms.keys[:, 1] - svms.keys[:, 0]
    shift = rho * (svms.label_margins - svms.label_margins.min())

    def best_angle(angles):
        S = np.stack([np.cos(angles), np.sin(angles)], axis=-1) @ G.T
        value = np.where(np.all(S >= -1e-12, axis=-1), np.min(S + shift, axis=-1), -np.inf)
        return angles[np.argmax(value)]

    a = best_angle(np.linspace(-np.pi, np.pi, 100_001))
    a = best_angle(np.linspace(a - 1e-4, a + 1e-4, 100_001))
    return np.array([np.cos(a), np.sin(a)])


def _balanced_by_cvxpy(svms, rho):
    import cvxpy as cp

    n, T, dk = svms.keys.shape
    rows = np.ones((n, T), bool)
    rows[np.arange(n), svms.select] = False
    D = (svms.keys[np.arange(n), svms.select][:, None, :] - svms.keys)[rows]
    s = (rho * (svms.label_margins - svms.label_margins.min()))[:, None].repeat(T, 1)[rows]
    p, tau = cp.Variable(dk), cp.Variable()
    cp.Problem(cp.Maximize(tau), [D @ p + s >= tau, D @ p >= 0, cp.norm(p) <= 1]).solve(solver=cp.CLARABEL)
    return p.value, D, s


def nonlinear_model():
    rng = np.random.default_rng(0)
    return al.model.nonlinear_head(rng.normal(size=(3, 3, 6)), rng.normal(size=(8, 6)), rng.uniform(size=8))


def _mp_gradient(prob, theta, digits=250):
    """∇L from the textbook formula in 250-digit arithmetic (enough for 1 − σ_opt down to 1e-200)."""
    mpmath.mp.dps = digits
    grad = [mpmath.mpf(0)] * prob.size
    A = prob.A.reshape(prob.n, prob.T, prob.size)
    for i in range(prob.n):
        logits = [mpmath.fsum(mpmath.mpf(a) * mpmath.mpf(t) for a, t in zip(A[i, s], theta)) for s in range(prob.T)]
        top = max(logits)
        w = [mpmath.exp(z - top) for z in logits]
        total = mpmath.fsum(w)
        sigma = [x / total for x in w]
        f = mpmath.fsum(s * mpmath.mpf(g) for s, g in zip(sigma, prob.gamma[i]))
        dloss = -1 / (1 + mpmath.exp(f))  # logistic ℓ'(f)
        for t in range(prob.T):
            c = dloss * sigma[t] * (mpmath.mpf(prob.gamma[i, t]) - f) / prob.n
            for k in range(prob.size):
                grad[k] += c * mpmath.mpf(A[i, t, k])
    return np.array([float(g) for g in grad])


def least_distance(G, h):
    """``min ‖x‖ s.t. G x ≥ h`` by Lawson–Hanson's reduction to NNLS; ``None`` if infeasible."""
    m, d = G.shape
    E = np.vstack([G.T, h[None, :]])
    f = np.zeros(d + 1)
    f[-1] = 1.0
    u, _ = nnls(E, f, maxiter=50 * m)
    r = E @ u - f
    if np.linalg.norm(r) < 1e-10:
        return None
    return -r[:d] / r[d]


def constraint_rows(prob, select, relax=()):
    A = prob.A.reshape(prob.n, prob.T, -1)
    G, h = [], []
    for i in range(prob.n):
        for t in range(prob.T):
            if t != select[i]:
                G.append(A[i, select[i]] - A[i, t])
                h.append(0.0 if i in relax else 1.0)
    return np.array(G), np.array(h)


def random_problem(seed, n, T, d):
    rng = np.random.default_rng(seed)
    return al.prompt_attention(rng.normal(size=(n, T, d)), rng.choice([-1, 1], n), rng.normal(size=d))


# The exact NNLS fast path of max_margin against cvxpy (solver="cvxpy"), the independent solve.
def _solve_both(prob, select, relax):
    out = []
    for solver in ("auto", "cvxpy"):
        try:
            out.append(al.max_margin(prob, select, relax=relax, solver=solver))
        except al.InfeasibleError:
            out.append(None)
    return out


def test_locally_optimal_selections_of_fig1():
    # Fig. 1(b): the optimal token and token 2 are locally optimal; Fig. 1(a): token 2's only
    # SVM-neighbour (token 3) ties with it, so only the optimal selection is.
    local_b = {r.select for r in al.svm.locally_optimal_selections(al.datasets.single_input(local=True))}
    local_a = {r.select for r in al.svm.locally_optimal_selections(al.datasets.single_input(local=False))}
    assert local_b == {(0,), (1,)}
    assert local_a == {(0,)}


def test_decoder_svms_constraints():
    D, J = _problem(4, n=5, T=6, d=8)
    svms = al.svm.decoder_svms(J, D.signal)
    W = svms.full.theta.reshape(J.shape)
    logits = np.einsum("itd,de,ie->it", D.X, W, J.Z)
    gaps = logits[np.arange(5), D.signal][:, None] - logits
    gaps[np.arange(5), D.signal] = np.inf
    assert gaps.min() == pytest.approx(1.0, abs=1e-6)
    assert np.all(D.y * (D.X[np.arange(5), D.signal] @ svms.label.v) >= 1 - 1e-6)
    with pytest.raises(ValueError):
        al.svm.decoder_svms(J, D.signal[:-1])


def test_w_svm_of_one_query_is_the_raw_token_p_svm_times_the_query():
    """Logits x_tᵀ W z with one query z: the W-SVM is p_mm zᵀ/‖z‖², p_mm the SVM on the raw tokens
    (cvxpy as the independent solver)."""
    X = np.array([[[-0.1, 1.0, 1.0], [1.0, 0.0, 0.9], [0.0, 0.0, 0.9]]])
    z = np.array([1.0, -2.0, 0.5])
    W_mm = al.max_margin(al.self_attention(X, [1], al.datasets.SCORE_HEAD, Z=z[None]), solver="cvxpy").theta
    p_mm = al.max_margin(al.prompt_attention(X, [1], al.datasets.SCORE_HEAD)).theta
    assert X.shape == (1, 3, 3)
    np.testing.assert_allclose(W_mm, np.outer(p_mm, z) / (z @ z), atol=1e-7)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nuclear_svm_matches_cvxpy(seed):
    prob = al.datasets.random_tokens(5, 5, 6, seed=seed, queries="cross")
    X, Z = prob.factors
    fast = al.svm.nuclear_svm(X, Z, prob.opt)
    ref = al.max_margin(prob, norm="nuc", solver="cvxpy")
    assert fast.feasible and fast.violation < 1e-9 and abs(fast.gap) < 1e-8
    np.testing.assert_allclose(fast.nuclear_norm, 1 / ref.margin, rtol=1e-7)
    np.testing.assert_allclose(fast.W, ref.theta, atol=1e-4 * np.abs(ref.theta).max())
    # the nuclear solution never has the larger nuclear norm, the Frobenius one the larger Frobenius norm
    fro = al.max_margin(prob).theta
    assert fast.nuclear_norm <= np.linalg.norm(fro, "nuc") + 1e-8
    assert np.linalg.norm(fro) <= np.linalg.norm(fast.W) + 1e-8


def test_nuclear_svm_reports_infeasible():
    X, y, u, Z, opt = al.datasets.rank_instance(10, 5, 3, seed=0)
    assert not al.svm.nuclear_svm(X, Z, opt).feasible
    with pytest.raises(al.InfeasibleError):
        al.max_margin(al.self_attention(X, y, u, Z), opt)


def test_batched_svms_match_cvxpy_with_certified_gaps():
    # one batch, several seeds; each against cvxpy (Clarabel through cvxpy: an independent solver)
    instances = [(6, 4, 5, s) for s in range(4)]
    a, z = _constraint_batch(instances)
    fro, nuc = al.svm.frobenius_svm_batch(a, z), al.svm.nuclear_svm_batch(a, z)
    assert fro.certified.all() and nuc.certified.all()
    assert fro.gap.max() < 1e-10 and nuc.gap.max() < 1e-8 and np.all(fro.lower <= fro.norm)
    for j, (n, T, d, s) in enumerate(instances):
        X, y, u, Z, opt = al.datasets.rank_instance(n, T, d, s)
        prob = al.self_attention(X, y, u, Z)
        ref_f = al.max_margin(prob, opt, solver="cvxpy")
        ref_n = al.max_margin(prob, opt, norm="nuc", solver="cvxpy")
        np.testing.assert_allclose(fro.W[j], ref_f.theta, atol=1e-6 * np.abs(ref_f.theta).max())
        np.testing.assert_allclose(nuc.norm[j], 1 / ref_n.margin, rtol=1e-6)
        np.testing.assert_allclose(nuc.W[j], ref_n.theta, atol=1e-3 * np.abs(ref_n.theta).max())
        # exactly feasible, and the two norms rank the two solutions the right way round
        assert np.einsum("kd,de,ke->k", a[j], nuc.W[j], z[j]).min() >= 1 - 1e-12
        assert nuc.norm[j] <= np.linalg.norm(fro.W[j], "nuc") + 1e-8
        assert fro.norm[j] <= np.linalg.norm(nuc.W[j]) + 1e-8
    # the Frobenius zeros are exact to rounding (active-set polish), the nuclear ones at the solver's accuracy
    s_f = np.linalg.svd(fro.W, compute_uv=False)
    assert np.all((s_f / s_f[:, :1] < 1e-13) | (s_f / s_f[:, :1] > 1e-6))


def test_svm_pair_batch_decides_infeasible_by_lp():
    from attnlib.svm import _feasible

    a, z = _constraint_batch([(10, 5, 3, s) for s in range(12)])  # about 15% feasible at d = 3
    lp = np.array([_feasible(a_, z_) for a_, z_ in zip(a, z)])
    assert lp.any() and not lp.all()
    W, gaps, feasible, fallbacks = al.svm.svm_pair_batch(a, z)
    assert np.array_equal(feasible, lp) and fallbacks == 0
    assert np.isnan(W[:, ~lp]).all() and np.isfinite(W[:, lp]).all() and gaps[:, lp].max() < 1e-8
    fro = al.svm.frobenius_svm_batch(a, z)
    assert not fro.certified[~lp].any()  # never a certificate for an infeasible instance
    a1, z1 = _constraint_batch([(5, 5, 1, s) for s in range(3)])  # d = 1: tied tokens, a zero constraint row
    assert not al.svm.svm_pair_batch(a1, z1)[2].any()


def test_official_sets_support_and_svms():
    # First set: every sample is a support vector and the two p-SVMs coincide at (4/3, 1/3).
    _, _, tight = official(1.0)
    assert tight.support.tolist() == [True, True, True]
    np.testing.assert_allclose(tight.label.v, [0.0, 1.0], atol=1e-8)
    np.testing.assert_allclose(tight.full.theta, [4 / 3, 1 / 3], atol=1e-7)
    np.testing.assert_allclose(tight.relaxed.theta, tight.full.theta, atol=1e-9)
    assert tight.separation < 1e-5
    # Second set: sample 3 has label margin 1.5 and is relaxed; full (5/4, 1/4), relaxed (1, 0).
    _, _, relaxed = official(1.5)
    assert relaxed.support.tolist() == [True, True, False]
    np.testing.assert_allclose(relaxed.label_margins, [1.0, 1.0, 1.5], atol=1e-8)
    np.testing.assert_allclose(relaxed.full.theta, [1.25, 0.25], atol=1e-7)
    np.testing.assert_allclose(relaxed.relaxed.theta, [1.0, 0.0], atol=1e-7)
    assert relaxed.relaxed.relax.tolist() == [False, False, True]
    assert relaxed.separation == pytest.approx(np.degrees(np.arctan(0.2)), abs=1e-5)


def test_joint_svms_uses_keys_and_selection():
    X, y = al.datasets.joint_tokens(relaxed=True)
    # Swapping the two tokens and selecting token 0 is the same problem.
    swapped = al.joint_svms(X[:, ::-1], y, select=np.zeros(3, int))
    np.testing.assert_allclose(swapped.relaxed.theta, [1.0, 0.0], atol=1e-7)
    # Keys k = W x with W = 2 I halve every p-SVM; the label SVM does not depend on W.
    scaled = al.joint_svms(X, y, select=1, W=2 * np.eye(2))
    np.testing.assert_allclose(scaled.full.theta, [0.625, 0.125], atol=1e-7)
    np.testing.assert_allclose(scaled.label.v, [0.0, 1.0], atol=1e-8)
    for bad in (2, [1, 1], np.array([1.0, 1.0, 1.0])):
        with pytest.raises(ValueError, match="select"):
            al.joint_svms(X, y, select=bad)
    with pytest.raises(ValueError, match="W"):
        al.joint_svms(X, y, select=1, W=np.eye(3))


@pytest.mark.parametrize("seed", range(6))
def test_random_relaxed_svm_matches_slsqp(seed):
    X, y = al.datasets.random_joint_tokens(n=6, seed=seed)
    svms = al.joint_svms(X, y, select=1)
    # Support vectors are exactly the samples at the smallest label margin.
    np.testing.assert_array_equal(svms.support, np.isclose(svms.label_margins, svms.label_margins.min(), atol=1e-6))
    np.testing.assert_allclose(svms.relaxed.theta, _relaxed_by_slsqp(X, y, svms.support), atol=1e-5)
    np.testing.assert_allclose(svms.full.theta, _relaxed_by_slsqp(X, y, np.ones(6, bool)), atol=1e-5)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("rho", [0.0, 0.5, 1.0, 3.0])
def test_balanced_direction_matches_grid_search(seed, rho):
    X, y = al.datasets.random_joint_tokens(n=5, seed=seed)
    svms = al.joint_svms(X, y, select=1)
    assert al.angle_degrees(al.svm.balanced_direction(svms, rho), _balanced_by_grid(svms, rho)) < 5e-3


def test_balanced_direction_limits_and_the_official_boundary():
    _, _, svms = official(1.2)
    assert al.angle_degrees(al.svm.balanced_direction(svms, 0.0), svms.full.theta) < 1e-4
    assert al.angle_degrees(al.svm.balanced_direction(svms, 100.0), svms.relaxed.theta) < 1e-4
    # Closed form for (0.5, h): rows (1,1), (1,-1) at exponent cos a ± sin a, row 3 at
    # 0.5 cos a + h sin a + rho (h - 1); at rho = 1 the optimum has cos a - sin a = 0.5 cos a + h sin a + h - 1.
    a = al.svm.balanced_direction(svms, 1.0)
    assert a[0] - a[1] == pytest.approx(0.5 * a[0] + 1.2 * a[1] + 0.2, abs=1e-7)
    # The paper's second set sits exactly on the boundary: p_hat(1) is the relaxed SVM (1, 0).
    _, _, paper = official(1.5)
    assert al.angle_degrees(al.svm.balanced_direction(paper, 1.0), [1.0, 0.0]) < 1e-4
    with pytest.raises(ValueError, match="rho"):
        al.svm.balanced_direction(svms, -1.0)


@pytest.mark.parametrize("seed", range(6))
def test_balanced_direction_by_bisection_matches_the_cone_program_without_falling_back(seed, monkeypatch):
    """The exact bisection answers (no cvxpy fallback), and its objective is at least the SOCP solver's."""
    import attnlib.svm as svm

    def no_fallback(D, s):
        p = bisect(D, s)
        assert p is not None
        return p

    bisect = svm._balanced_by_bisection
    monkeypatch.setattr(svm, "_balanced_by_bisection", no_fallback)
    X, y = al.datasets.random_joint_tokens(n=6, d=2, seed=[seed, 7])
    D_ = al.datasets.planted_tokens(6, 4, 4, seed=seed)
    for svms in (
        al.joint_svms(X, y, select=1),
        al.svm.decoder_svms(al.model.joint_self_attention(D_.X, D_.y), D_.signal),
    ):
        for rho in (0.0, 1.0, 5.0):
            p = al.svm.balanced_direction(svms, rho)
            q, D, s = _balanced_by_cvxpy(svms, rho)
            assert abs(np.linalg.norm(p) - 1) < 1e-12 and np.min(D @ p) >= -1e-9
            assert np.min(D @ p + s) >= np.min(D @ q + s) - 1e-8  # as good as the SOCP, to its tolerance
            assert al.angle_degrees(p, q) < 1e-2


def test_logistic_regression_svm_is_the_hard_margin_svm():
    X, y = al.datasets.separable_data(15, 2, seed=4)
    sol = al.max_margin(al.model.logistic_regression(X, y))
    label = al.label_svm(X, y)
    assert np.allclose(sol.theta, label.v, atol=1e-6)
    assert np.min(y * (X @ sol.theta)) == pytest.approx(1.0, abs=1e-6)


def test_separable_data_is_separable_and_scaled():
    X, y = al.datasets.separable_data(30, 4, seed=7)
    assert X.shape == (30, 4) and set(np.unique(y)) <= {-1.0, 1.0}
    assert np.max(np.linalg.norm(X, axis=1)) == pytest.approx(1.0)
    al.label_svm(X, y)  # feasible: raises InfeasibleError otherwise


def test_reduction_keeps_the_w_svm():
    prob = al.datasets.random_tokens(n=3, T=4, d=5, seed=0)
    red = al.model.reduce_to_span(prob)
    full, small = al.max_margin(prob), al.max_margin(red.problem)
    assert small.margin == pytest.approx(full.margin, rel=1e-6)
    assert np.allclose(red.lift(small.theta), full.theta, atol=1e-6)


def test_nonlinear_head_path_turns_to_induced_svm():
    model = nonlinear_model()
    sol = al.max_margin(model.token_problem)
    path = al.regularization_path(model, [1.0, 10.0, 100.0], n_starts=4, seed=0)
    err = al.one_minus_cosine(path.theta, sol.theta)
    assert np.all(np.diff(err) < 0) and err[-1] < 1e-3
    np.testing.assert_allclose(path.norm, path.radii, rtol=1e-12)


def test_minimiser_inside_the_ball_when_the_svm_is_infeasible():
    """Outside the theorem's hypotheses the path need not reach the sphere: the failing input of the
    chapter's on-the-sphere check. Two inputs pull p in opposite directions along one key axis."""
    A = np.array([[[0.0], [1.0]], [[0.0], [1.0]]])
    gamma = np.array([[1.0, 0.0], [0.0, 2.0]])
    prob = al.TokenSelectionProblem(A, gamma, "logistic")
    with pytest.raises(al.InfeasibleError):
        al.max_margin(prob)
    path = al.regularization_path(prob, [10.0], n_starts=2, seed=0)
    assert path.norm[0] < 0.5 * path.radii[0]


@pytest.mark.parametrize("scale", [40.0, 150.0, 300.0])
def test_gradient_is_exact_at_saturation(scale):
    """At ‖θ‖·margin ≈ 300 the textbook float64 form is wrong; ours matches 60-digit arithmetic."""
    prob = al.datasets.multi_input(seed=0)
    sol = al.max_margin(prob)
    theta = scale * sol.theta + np.array([0.3, -0.2, 0.0])  # logit gaps ≈ scale: 1 − σ_opt ≈ e^{-scale}
    reference = _mp_gradient(prob, theta)
    assert np.all(np.abs(reference[:2]) > 0)  # the score coordinate carries no key
    np.testing.assert_allclose(prob.grad(theta), reference, rtol=1e-10)


def test_direction_of_gradient_survives_underflow():
    """Far past float underflow of ‖∇L‖ the scaled gradient still has the right direction."""
    prob = al.datasets.single_input()
    sol = al.max_margin(prob)
    theta = 2000.0 * sol.direction
    log_scale, g = prob.scaled_grad(theta)
    assert np.isfinite(log_scale) and log_scale < -1000
    assert np.linalg.norm(prob.grad(theta)) == 0.0  # the plain value underflows
    assert al.cosine(-g, sol.theta) > 0.99


def test_long_ngd_run_keeps_aligning():
    """10⁴ NGD steps: past ‖θ‖·margin ≈ 700 the gradient underflows, yet alignment keeps improving."""
    prob = al.datasets.multi_input(seed=0)
    sol = al.max_margin(prob)
    traj = al.train(prob, al.datasets.MULTI_INPUT_INITS, steps=10_000, lr=0.1, record_every=500)
    assert all(s is None for s in traj.stopped)
    assert traj.norm[-1].min() * sol.margin > 700
    gap = al.one_minus_cosine(traj.theta, sol.theta)  # (R, B)
    # 1 − cos ≈ ‖offset‖²/(2‖θ‖²) with a bounded offset: it must keep falling, not drift back up.
    assert np.all(np.diff(gap[4:], axis=0) <= 1e-15)
    assert gap[-1].max() < 1e-5
    np.testing.assert_allclose(traj.norm[-1], 0.1 * 10_000, rtol=0.01)


# solver="cvxpy" (an interior-point solve of the QP) against the test's own Lawson-Hanson
# least-distance solve: two independent methods. solver="auto" is the library's NNLS fast path,
# which is also checked against cvxpy below.
@pytest.mark.parametrize("solver", ["cvxpy", "auto"])
@pytest.mark.parametrize("seed", range(8))
def test_att_svm_matches_least_distance_solve(seed, solver):
    # d = 6 against n(T-1) = 12 rows: some instances are feasible, some are not.
    prob = random_problem(seed, n=4, T=4, d=6)
    rng = np.random.default_rng(100 + seed)
    for select in (prob.opt, rng.integers(0, prob.T, prob.n)):
        G, h = constraint_rows(prob, select)
        reference = least_distance(G, h)
        if reference is None:
            with pytest.raises(al.InfeasibleError, match="infeasible for selection"):
                al.max_margin(prob, select, solver=solver)
            continue
        sol = al.max_margin(prob, select, solver=solver)
        assert sol.status == "optimal"
        np.testing.assert_allclose(sol.theta, reference, atol=1e-7)
        assert np.all(G @ sol.theta >= 1 - 1e-8)
        assert sol.margin == pytest.approx(1 / np.linalg.norm(reference), rel=1e-7)


def test_feasible_and_infeasible_instances_both_occur():
    verdicts = set()
    for seed in range(8):
        prob = random_problem(seed, n=4, T=4, d=6)
        G, h = constraint_rows(prob, prob.opt)
        verdicts.add(least_distance(G, h) is None)
    assert verdicts == {True, False}


@pytest.mark.parametrize("solver", ["cvxpy", "auto"])
def test_relaxed_rows_match_least_distance_solve(solver):
    prob = random_problem(3, n=4, T=3, d=8)
    G, h = constraint_rows(prob, prob.opt, relax=(1, 2))
    sol = al.max_margin(prob, relax=[1, 2], solver=solver)
    np.testing.assert_allclose(sol.theta, least_distance(G, h), atol=1e-7)
    assert sol.relax.tolist() == [False, True, True, False]


def test_neighbors_agree_with_positive_duals():
    prob = random_problem(5, n=3, T=5, d=12)
    sol = al.max_margin(prob)
    strongly_active = sol.duals > 1e-6
    assert np.all(sol.neighbors[strongly_active])
    assert not np.any(sol.neighbors[np.arange(prob.n), sol.select])


@pytest.mark.parametrize("solver", ["cvxpy", "auto"])
def test_self_attention_frobenius_svm_matches_least_distance(solver):
    prob = al.datasets.random_tokens(n=3, T=4, d=5, seed=0)
    G, h = constraint_rows(prob, prob.opt)
    sol = al.max_margin(prob, solver=solver)
    np.testing.assert_allclose(sol.theta.ravel(), least_distance(G, h), atol=1e-7)


@pytest.mark.parametrize("seed", range(3))
def test_nuclear_svm_is_certified_by_its_dual(seed):
    """min ‖W‖_* s.t. ⟨W, D_k⟩ ≥ 1 has dual max Σλ s.t. ‖Σ λ_k D_k‖_op ≤ 1, λ ≥ 0.

    A feasible primal and dual with equal objectives certify optimality independently of the solver.
    """
    prob = al.datasets.random_tokens(n=3, T=4, d=5, seed=seed)
    sol = al.max_margin(prob, norm="nuc")
    rows = ~np.eye(prob.T, dtype=bool)[prob.opt]
    D = (prob.A[np.arange(prob.n), prob.opt][:, None] - prob.A)[rows]  # (m, d, d)
    lam = sol.duals[rows]
    assert np.all(np.einsum("kij,ij->k", D, sol.theta) >= 1 - 1e-7)  # primal feasible
    assert np.all(lam >= -1e-9)
    dual_matrix = np.einsum("k,kij->ij", lam, D)
    assert np.linalg.norm(dual_matrix, 2) <= 1 + 1e-6  # dual feasible
    assert np.linalg.norm(sol.theta, "nuc") == pytest.approx(lam.sum(), rel=1e-6)  # zero duality gap
    fro = al.max_margin(prob, norm="fro")
    assert np.linalg.norm(sol.theta, "nuc") <= np.linalg.norm(fro.theta, "nuc") + 1e-7


def test_nuclear_norm_needs_a_matrix():
    with pytest.raises(ValueError, match="norm='nuc' needs a matrix parameter"):
        al.max_margin(al.datasets.single_input(), norm="nuc")


def test_label_svm_matches_least_distance():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(6, 4))
    y = np.sign(X @ rng.normal(size=4))
    sv = al.label_svm(X, y)
    reference = least_distance(y[:, None] * X, np.ones(6))
    np.testing.assert_allclose(sv.v, reference, atol=1e-7)
    assert sv.support.any()


def test_label_svm_support_vectors_of_the_joint_data():
    X, y = al.datasets.joint_tokens(relaxed=False)
    assert al.label_svm(X[:, 1], y).support.tolist() == [True, True, True]
    X, y = al.datasets.joint_tokens(relaxed=True)
    sv = al.label_svm(X[:, 1], y)
    assert sv.support.tolist() == [True, True, False]
    np.testing.assert_allclose(sv.v, [0.0, 1.0], atol=1e-8)


def test_fig1b_local_optimality_table():
    """[MMTS] Fig. 1(b): selections 0 and 1 are locally optimal, selection 2 is feasible but not."""
    prob = al.datasets.single_input(local=True)
    reports = {r.select: r for r in al.enumerate_selections(prob)}
    assert [reports[(k,)].feasible for k in range(3)] == [True, True, True]
    assert [reports[(k,)].locally_optimal for k in range(3)] == [True, True, False]
    np.testing.assert_allclose(reports[(0,)].solution.theta[:2], [-10 / 101, 100 / 101], atol=1e-8)
    np.testing.assert_allclose(reports[(1,)].solution.theta[:2], [1.0, 0.0], atol=1e-8)
    np.testing.assert_allclose(reports[(2,)].solution.theta[:2], [-1.0, -1.1], atol=1e-8)
    assert reports[(1,)].solution.neighbors.tolist() == [[False, False, True]]
    assert reports[(2,)].solution.neighbors.tolist() == [[True, True, False]]
    assert [r.select for r in al.svm.locally_optimal_selections(prob)] == [(0,), (1,)]


def test_fig1a_tie_makes_the_local_selection_not_locally_optimal():
    prob = al.datasets.single_input(local=False)
    assert al.svm.is_locally_optimal(prob, [0])
    assert not al.svm.is_locally_optimal(prob, [1])  # its neighbour (0, 0) ties at score 0.9
    assert not al.svm.is_locally_optimal(prob, [2])


def test_enumeration_refuses_huge_problems():
    prob = al.datasets.random_tokens(n=6, T=8, d=10, seed=0)
    with pytest.raises(ValueError, match="cannot enumerate T\\^n = 8\\^6"):
        al.enumerate_selections(prob)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(select=[5]), "token indices in \\[0, 2\\]"),
        (dict(select=[0, 1]), "select must be 1 integer token indices"),
        (dict(norm="l1"), "norm must be 'fro' or 'nuc'"),
        (dict(relax=[3]), "relax must hold sample indices"),
    ],
)
def test_bad_svm_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        al.max_margin(al.datasets.single_input(), **kwargs)


def test_frobenius_fast_path_relaxed_rows_and_label_svm():
    prob = al.datasets.random_tokens(4, 5, 8, seed=3)
    fast, ref = _solve_both(prob, prob.opt, relax=[1, 2])
    np.testing.assert_allclose(fast.theta, ref.theta, atol=1e-6 * np.linalg.norm(ref.theta))
    assert fast.relax.tolist() == ref.relax.tolist()
    sv = al.label_svm([[1.0, 1.0], [1.0, -1.0], [0.5, 1.0]], [1, -1, 1])
    np.testing.assert_allclose(sv.v, [0.0, 1.0], atol=1e-12)
    assert sv.support.tolist() == [True, True, True]


def test_fast_path_certifies_infeasibility_like_cvxpy():
    # Two samples that need opposite directions: infeasible. NNLS returns a Farkas certificate
    # (margin bound 0), so no cvxpy is needed; cvxpy (solver="cvxpy") gives the same verdict.
    X = np.array([[[1.0, 0.0], [0.0, 0.0]], [[-1.0, 0.0], [0.0, 0.0]]])
    prob = al.prompt_attention(X, [1, 1], v=[1.0, 0.0])
    G = np.array([[1.0, 0.0], [-1.0, 0.0]])
    assert attnlib.svm._least_distance(G, np.ones(2)) == "infeasible"
    for solver in ("auto", "cvxpy"):
        with pytest.raises(al.InfeasibleError):
            al.max_margin(prob, select=np.array([1, 1]), solver=solver)
    # a feasible problem with badly scaled rows (1e-6·x ≥ 1e-6 and x ≥ 1) still gets its point x = 1
    x, _ = attnlib.svm._least_distance(np.array([[1e-6], [1.0]]), np.array([1e-6, 1.0]))
    np.testing.assert_allclose(x, [1.0], rtol=1e-12)


def test_least_distance_nnls_gives_the_point_or_a_farkas_certificate():
    from attnlib.svm import least_distance_nnls

    rng = np.random.default_rng(3)
    G, h = rng.normal(size=(6, 4)), np.abs(rng.normal(size=6))
    u, r = least_distance_nnls(G, h)
    x = -r[:-1] / r[-1]
    assert np.all(G @ x >= h - 1e-9) and np.allclose(x, G.T @ (u / -r[-1]))
    # x ≥ 1 and −x ≥ 1 cannot both hold: G^T u = 0 with h^T u = 1 certifies it.
    u, r = least_distance_nnls(np.array([[1.0], [-1.0]]), np.array([1.0, 1.0]))
    assert abs(r[-1]) < 1e-12 and abs(u[0] - u[1]) < 1e-12 and u.sum() == pytest.approx(1.0)


def test_nnls_infeasibility_certificates_agree_with_clarabel():
    """Every selection of small problems with few parameters (many infeasible): the NNLS path's
    verdict (Farkas certificate, no cvxpy) equals CLARABEL's, and so does the label SVM's."""
    import attnlib as al

    verdicts = {"auto": [], "cvxpy": []}
    for seed in range(3):
        prob = al.datasets.random_tokens(3, 3, 2, seed=seed)  # p-problems in d=2: many infeasible selections
        for sel in itertools.product(range(prob.T), repeat=prob.n):
            for solver in verdicts:
                try:
                    al.max_margin(prob, np.array(sel), solver=solver)
                    verdicts[solver].append(True)
                except al.InfeasibleError:
                    verdicts[solver].append(False)
    assert verdicts["auto"] == verdicts["cvxpy"]
    assert 0 < sum(verdicts["auto"]) < len(verdicts["auto"])  # both verdicts occur
    X = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0]])  # x and −x both labelled +1: no v separates
    with pytest.raises(al.InfeasibleError):
        al.label_svm(X, [1, 1, -1])
    assert al.svm.farkas_margin_bound(X * np.array([[1], [1], [-1]]), np.ones(3), np.array([1.0, 1.0, 0.0])) == 0.0


def _svmeq_cvxpy(X, Z, selected, log_sigma, W):
    """Independent solve of [TFSVM]'s SVM-eq with cvxpy/Clarabel, constraints written as in the official code."""
    import cvxpy as cp

    n, T, d = X.shape
    W_dir, W_fin = cp.Variable((d, d)), cp.Variable((d, d))
    eq_fin, cons_dir = [], []
    for i in range(n):
        for t1 in range(T):
            for t2 in range(t1 + 1, T):
                a = X[i, t2] - X[i, t1]
                if selected[i, t1] and selected[i, t2]:
                    eq_fin.append(a @ W_fin @ Z[i] == log_sigma[i, t2] - log_sigma[i, t1])
                    cons_dir.append(a @ W_dir @ Z[i] == 0)
                elif selected[i, t1]:
                    cons_dir.append(a @ W_dir @ Z[i] <= -1)
                elif selected[i, t2]:
                    cons_dir.append(-a @ W_dir @ Z[i] <= -1)
    cp.Problem(cp.Minimize(cp.sum_squares(W_dir)), cons_dir).solve(solver="CLARABEL")
    cp.Problem(cp.Minimize(cp.sum_squares(W_fin)), eq_fin).solve(solver="CLARABEL")
    R = cp.Variable()
    cp.Problem(cp.Minimize(cp.sum_squares(W_fin.value + R * W_dir.value - W))).solve(solver="CLARABEL")
    return W_dir.value, W_fin.value, float(R.value)


def test_svm_equivalence_matches_an_independent_clarabel_solve():
    rng = np.random.default_rng(0)
    S, n, T, d = 6, 3, 4, 5
    X = rng.normal(size=(S, n, T, d))
    X /= np.linalg.norm(X, axis=-1, keepdims=True)
    Z = rng.normal(size=(S, n, d))
    log_sigma = np.log(rng.dirichlet(np.ones(T), size=(S, n)))
    selected = rng.uniform(size=(S, n, T)) < 0.5
    selected[..., 0] = True  # one selected token at least; some inputs select several
    W = rng.normal(size=(S, d, d))
    eq = al.svm.svm_equivalence(X, Z, selected, log_sigma, W)
    assert eq.solved.all()
    for s in range(S):
        W_dir, W_fin, R = _svmeq_cvxpy(X[s], Z[s], selected[s], log_sigma[s], W[s])
        np.testing.assert_allclose(eq.W_dir[s], W_dir, atol=1e-6)
        np.testing.assert_allclose(eq.W_fin[s], W_fin, atol=1e-6)
        assert abs(eq.R[s] - R) <= 1e-5 * max(1.0, abs(R))


def test_svm_equivalence_is_the_projection_on_its_two_matrices():
    # W_fin fixes W's component along the equality rows, so W^SVMeq is the projection of W on span{W_fin, W_dir}
    rng = np.random.default_rng(1)
    X = rng.normal(size=(1, 3, 4, 5))
    Z = rng.normal(size=(1, 3, 5))
    W = rng.normal(size=(1, 5, 5))
    logits = np.einsum("sntd,sde,sne->snt", X, W, Z)
    log_sigma = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    selected = np.array([[[True, True, False, False], [True, False, False, False], [False, True, True, True]]])
    eq = al.svm.svm_equivalence(X, Z, selected, log_sigma, W)
    np.testing.assert_allclose(np.sum(eq.W_fin * eq.W_dir), 0.0, atol=1e-10)
    residual = W - eq.W_eq
    np.testing.assert_allclose([np.sum(residual * eq.W_fin), np.sum(residual * eq.W_dir)], 0.0, atol=1e-9)


def test_svm_equivalence_reports_an_infeasible_selection():
    X = np.array([[[[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]]])  # tokens 1 and 2 equal: cannot tie one and mask the other
    eq = al.svm.svm_equivalence(
        X, np.array([[[1.0, 0.0]]]), np.array([[[True, False, True]]]), np.zeros((1, 1, 3)), np.zeros((1, 2, 2))
    )
    assert not eq.solved[0] and np.isnan(eq.W_eq).all()
