"""The (K, Q) factorisation: gradients (finite differences, 250-digit reference at saturation),
batching, rank cap, the fast nuclear-norm SVM and the rank grid."""

import mpmath
import numpy as np
import pytest

import attnlib as al


def one_gd_step(prob, K, Q, lr=1e-3):
    traj = al.optim.train_kq(prob, K, Q, steps=1, method="gd", lr=lr)
    return (K - traj.K[-1, 0]) / lr, (Q - traj.Q[-1, 0]) / lr


@pytest.mark.parametrize("m", [2, 4])
def test_factor_gradient_matches_finite_differences(m, central_difference):
    prob = al.datasets.random_tokens(3, 4, 4, seed=5, queries="cross")
    rng = np.random.default_rng(6)
    K, Q = rng.standard_normal((4, m)), rng.standard_normal((4, m))
    gK, gQ = one_gd_step(prob, K, Q)
    np.testing.assert_allclose(gK, central_difference(lambda k: float(prob.value(k @ Q.T)), K), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(gQ, central_difference(lambda q: float(prob.value(K @ q.T)), Q), rtol=1e-6, atol=1e-9)


def _mp_factor_gradient(prob, K, Q, digits=250):
    """(∇_K, ∇_Q) from the textbook formula in 250-digit arithmetic (logistic loss)."""
    mpmath.mp.dps = digits
    X, Z = prob.factors
    d, dz = prob.shape
    W = [[mpmath.fsum(mpmath.mpf(K[a, c]) * mpmath.mpf(Q[b, c]) for c in range(K.shape[1])) for b in range(dz)]
         for a in range(d)]  # fmt: skip
    gW = [[mpmath.mpf(0)] * dz for _ in range(d)]
    for i in range(prob.n):
        Wz = [mpmath.fsum(W[a][b] * mpmath.mpf(Z[i, b]) for b in range(dz)) for a in range(d)]
        logits = [mpmath.fsum(mpmath.mpf(X[i, t, a]) * Wz[a] for a in range(d)) for t in range(prob.T)]
        top = max(logits)
        w = [mpmath.exp(s - top) for s in logits]
        sigma = [x / mpmath.fsum(w) for x in w]
        f = mpmath.fsum(s * mpmath.mpf(g) for s, g in zip(sigma, prob.gamma[i]))
        dloss = -1 / (1 + mpmath.exp(f))
        for t in range(prob.T):
            c = dloss * sigma[t] * (mpmath.mpf(prob.gamma[i, t]) - f) / prob.n
            for a in range(d):
                for b in range(dz):
                    gW[a][b] += c * mpmath.mpf(X[i, t, a]) * mpmath.mpf(Z[i, b])
    gK = [[mpmath.fsum(gW[a][b] * mpmath.mpf(Q[b, c]) for b in range(dz)) for c in range(K.shape[1])] for a in range(d)]
    gQ = [[mpmath.fsum(gW[a][b] * mpmath.mpf(K[a, c]) for a in range(d)) for c in range(K.shape[1])] for b in range(dz)]
    return np.array(gK, dtype=float), np.array(gQ, dtype=float)


@pytest.mark.parametrize("scale", [40.0, 150.0])
def test_factor_gradient_is_exact_at_saturation(scale):
    """Near the SVM direction at logit gaps ≈ scale (1 − σ_opt ≈ e^{-scale}) the (K, Q) step matches
    250-digit arithmetic; the textbook float64 form cancels there."""
    prob = al.datasets.random_tokens(3, 4, 4, seed=2, queries="cross")
    W = scale * al.max_margin(prob).theta + 0.1 * np.random.default_rng(0).standard_normal(prob.shape)
    U, s, Vt = np.linalg.svd(W)
    K, Q = U * np.sqrt(s), Vt.T * np.sqrt(s)
    ref_K, ref_Q = _mp_factor_gradient(prob, K, Q)
    assert np.abs(ref_K).max() < 1e-10  # saturated: the gradient is tiny
    traj = al.optim.train_kq(prob, K, Q, steps=1, method="ngd", lr=1.0)  # a unit step along −∇/‖∇‖
    ref_norm = np.sqrt(np.sum(ref_K**2) + np.sum(ref_Q**2))
    np.testing.assert_allclose(K - traj.K[-1, 0], ref_K / ref_norm, rtol=0, atol=1e-12)
    np.testing.assert_allclose(Q - traj.Q[-1, 0], ref_Q / ref_norm, rtol=0, atol=1e-12)
    np.testing.assert_allclose(traj.log_grad_norm[0, 0], np.log(ref_norm), rtol=1e-9)


def test_stack_matches_single_problems_and_width_caps_rank():
    probs = [al.datasets.random_tokens(4, 5, 6, seed=s, queries="cross") for s in range(3)]
    K0, Q0 = al.optim.kq_init(3, 6, 6, m=2, seed=0)
    stacked = al.optim.train_kq(al.stack_problems(probs), K0, Q0, steps=30, record_every=10)
    for s, p in enumerate(probs):
        single = al.optim.train_kq(p, K0[s], Q0[s], steps=30, record_every=10)
        np.testing.assert_allclose(stacked.W[:, s], single.W[:, 0], rtol=1e-9, atol=1e-12)
    assert stacked.W.shape == (4, 3, 6, 6)
    assert max(np.linalg.matrix_rank(w) for w in stacked.final) == 2


@pytest.mark.parametrize("method", al.optim.METHODS)
def test_every_method_lowers_the_loss_and_ngd_moves_lr_per_step(method):
    prob = al.datasets.random_tokens(4, 5, 6, seed=1, queries="cross")
    K0, Q0 = al.optim.kq_init(2, 6, 6, seed=3)
    traj = al.optim.train_kq(prob, K0, Q0, steps=200, method=method, lr=0.1 if method != "gd" else 1.0)
    assert np.all(traj.loss[-1] < traj.loss[0]) and all(s is None for s in traj.stopped)
    assert traj.log_gap.shape == traj.loss.shape == (201, 2)
    if method == "ngd":
        moves = np.sqrt(np.sum(np.diff(traj.K, axis=0) ** 2, (2, 3)) + np.sum(np.diff(traj.Q, axis=0) ** 2, (2, 3)))
        np.testing.assert_allclose(moves, 0.1, rtol=1e-9)


def test_separate_normalisation_moves_each_factor_by_lr():
    prob = al.datasets.random_tokens(4, 5, 6, seed=1, queries="cross")
    K0, Q0 = al.optim.kq_init(1, 6, 6, seed=3)
    traj = al.optim.train_kq(prob, K0, Q0, steps=5, normalize="separate")
    np.testing.assert_allclose(np.linalg.norm(np.diff(traj.K, axis=0), axis=(2, 3)), 0.1, rtol=1e-9)
    np.testing.assert_allclose(np.linalg.norm(np.diff(traj.Q, axis=0), axis=(2, 3)), 0.1, rtol=1e-9)


def test_bad_inputs_are_named():
    prob = al.datasets.random_tokens(3, 4, 4, seed=0)
    with pytest.raises(ValueError, match="width m"):
        al.optim.train_kq(prob, np.ones((4, 2)), np.ones((4, 3)), steps=1)
    with pytest.raises(ValueError, match="K0 must have shape"):
        al.optim.train_kq(prob, np.ones((5, 2)), np.ones((4, 2)), steps=1)
    with pytest.raises(ValueError, match="method"):
        al.optim.train_kq(prob, np.ones((4, 2)), np.ones((4, 2)), steps=1, method="adam")
    with pytest.raises(ValueError, match="matrix parameter"):
        al.optim.train_kq(al.datasets.single_input(), np.ones((3, 1)), np.ones((3, 1)), steps=1)


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


def test_rank_instance_is_random_tokens_cross():
    X, y, u, Z, opt = al.datasets.rank_instance(4, 5, 6, seed=3)
    prob = al.datasets.random_tokens(4, 5, 6, seed=3, queries="cross")
    np.testing.assert_array_equal(X, prob.factors[0])
    np.testing.assert_array_equal(Z, prob.factors[1])
    np.testing.assert_array_equal(opt, prob.opt)


def test_rank_grid_counts_infeasible_apart():
    grid = al.experiments.factorization.svm_rank_grid(configs=[(5, 5), (10, 5)], ds=[1, 3, 6], seeds=range(4))
    ranks = grid.ranks(1e-6)
    assert ranks.shape == (2, 2, 3, 4) and grid.fallbacks == 0
    assert np.all((ranks >= 1) == grid.feasible[None])  # never a rank for an infeasible instance
    assert np.all(ranks[:, :, 0] == -1)  # d = 1: infeasible
    assert grid.feasible[:, -1].all()  # d = 6 ≥ max(n, T − 1) for n = 5; and for n = 10? not required
    r = ranks[:, grid.feasible]
    assert np.all(r[1] <= r[0])
    assert np.nanmax(grid.accuracy) < 1e-8
    assert np.isnan(grid.mean_rank(1e-6)[:, :, 0]).all()


def test_numerical_rank():
    s = np.array([[1.0, 0.5, 1e-9], [np.nan, np.nan, np.nan]])
    assert al.metrics.numerical_rank(s, 1e-6).tolist() == [2, -1]


def _constraint_batch(configs_seeds):
    cons = [
        al.svm.svm_constraints(X, Z, opt) for X, _, _, Z, opt in (al.datasets.rank_instance(*c) for c in configs_seeds)
    ]
    return np.stack([c[0] for c in cons]), np.stack([c[1] for c in cons])


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


def test_train_kq_grid_is_the_unpadded_run():
    W = al.experiments.factorization.train_kq_grid([(5, 4)], [2, 4], range(3), steps=40, seed=1)
    assert W.shape == (1, 2, 3, 4, 4) and np.all(W[0, 0, :, 2:, :] == 0) and np.all(W[0, 0, :, :, 2:] == 0)
    K0, Q0 = al.optim.kq_init(3, 2, 2, seed=1)
    for j in range(3):
        X, y, u, Z, _ = al.datasets.rank_instance(5, 4, 2, j)
        traj = al.optim.train_kq(al.self_attention(X, y, u, Z), K0[j], Q0[j], 40, "ngd", 0.1, normalize="separate")
        np.testing.assert_allclose(W[0, 0, j, :2, :2], traj.final[0], rtol=1e-10, atol=1e-12)
    mask = np.zeros((1, 2, 3), bool)
    mask[0, 1, 0] = True
    Wm = al.experiments.factorization.train_kq_grid([(5, 4)], [2, 4], range(3), steps=40, seed=1, mask=mask)
    assert np.isnan(Wm[0, 0]).all() and np.array_equal(Wm[0, 1, 0], W[0, 1, 0])


def test_trained_kq_spectra_are_relative_and_skip_infeasible():
    grid = al.experiments.factorization.svm_rank_grid(configs=[(5, 5)], ds=[1, 6], seeds=range(3))
    sv = grid.trained_kq_spectra(steps=300)
    assert sv.shape == (1, 2, 3, 6) and np.isnan(sv[0, 0]).all()  # d = 1: infeasible, not trained
    np.testing.assert_allclose(sv[0, 1, :, 0], 1.0)
    # the start K0 Q0ᵀ has full rank; after training, the rank at 0.01 is below d, like the nuclear SVM's
    assert np.all(al.metrics.numerical_rank(grid.trained_kq_spectra(steps=0)[0, 1], 1e-6) == 6)
    assert np.all(al.metrics.numerical_rank(sv[0, 1], 0.01) < 6) and np.all(grid.ranks(1e-6)[1, 0, 1] < 6)


def test_rank_one_stack_matches_the_dense_features():
    # A stack of self-attention problems takes the rank-one path (x_itᵀ W z_i); the same problems
    # without their factors take the dense one (⟨W, A_it⟩). Both sum ~d·d_z products: agree to 1e-13.
    probs = [al.datasets.random_tokens(5, 6, 7, seed=s, queries="cross") for s in range(4)]
    dense = al.stack_problems([al.token_selection(p.A, p.gamma, p.loss) for p in probs])
    stack = al.stack_problems(probs)
    assert stack.factors is not None and dense.factors is None
    rng = np.random.default_rng(0)
    W = rng.normal(size=(3, 4, 7, 7))  # a batch of 3 parameter sets for the 4 problems
    np.testing.assert_allclose(stack.logits(W), dense.logits(W), rtol=0, atol=1e-13 * np.abs(dense.logits(W)).max())
    g, gd = stack.grad(W), dense.grad(W)
    np.testing.assert_allclose(g, gd, rtol=0, atol=1e-13 * np.abs(gd).max())
    w = rng.normal(size=(3, 4, 5, 6))
    np.testing.assert_allclose(stack.adjoint_flat(w), dense.adjoint_flat(w), rtol=0, atol=1e-12)


def test_local_convergence_is_train_and_train_kq_in_one_or_two_processes():
    probs = [al.datasets.random_tokens(4, 5, 6, seed=s, queries="cross") for s in range(3)]
    runs = [al.experiments.factorization.local_convergence(probs, 30, processes=p) for p in (1, 2)]
    stack = al.stack_problems(probs)
    W = al.train(stack, np.zeros((6, 6)), 30, "ngd", 0.1, record_steps=[30]).theta
    K0, Q0 = al.optim.kq_init(3, 6, 6, seed=0)
    KQ = al.optim.train_kq(stack, K0, Q0, 30, "ngd", 0.1, normalize="separate", record_steps=[30]).W
    for run in runs:
        assert np.array_equal(run.W["W"], W) and np.array_equal(run.W["KQ"], KQ)
        assert run.select["W"].tolist() == [p.selection(w).tolist() for p, w in zip(probs, W[-1])]
        for kind in ("W", "KQ"):  # the SVMs are those of the final selections
            sol = al.max_margin(probs[0], run.select[kind][0])
            np.testing.assert_allclose(run.svms[kind][0, 0], sol.theta, atol=1e-8)
    assert all(np.array_equal(runs[0].svms[k], runs[1].svms[k], equal_nan=True) for k in ("W", "KQ"))
    with pytest.raises(ValueError, match="processes must be 1 or 2"):
        al.experiments.factorization.local_convergence(probs, 5, processes=3)
    with pytest.raises(ValueError, match="self-attention"):
        al.experiments.factorization.local_convergence([al.datasets.loss_study(3.0)] * 2, 5)
