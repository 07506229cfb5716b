"""The core: attnlib.datasets."""

import matplotlib
import numpy as np
import pytest

import attnlib as al

matplotlib.use("Agg")
import mpmath

import attnlib.svm


def one_gd_step(prob, K, Q, lr=1e-3):
    traj = al.optim.train_kq(prob, K, Q, steps=1, method="gd", lr=lr)
    return (K - traj.K[-1, 0]) / lr, (Q - traj.Q[-1, 0]) / lr


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


# The exact NNLS fast path of max_margin against cvxpy (solver="cvxpy"), the independent solve.
def _solve_both(prob, select, relax):
    out = []
    for solver in ("auto", "cvxpy"):
        try:
            out.append(al.max_margin(prob, select, relax=relax, solver=solver))
        except al.InfeasibleError:
            out.append(None)
    return out


def test_cone_starts_bad_inputs():
    with pytest.raises(ValueError, match="mu"):
        al.datasets.cone_starts([1.0, 0.0], 3, mu=0.0, radius=1.0)
    with pytest.raises(ValueError, match="radius"):
        al.datasets.cone_starts([1.0, 0.0], 3, mu=0.1, radius=-1.0)
    with pytest.raises(ValueError, match="count"):
        al.datasets.cone_starts([1.0, 0.0], 0, mu=0.1, radius=1.0)
    with pytest.raises(ValueError, match="non-zero"):
        al.datasets.cone_starts([0.0, 0.0], 3, mu=0.1, radius=1.0)
    with pytest.raises(ValueError, match="span"):
        al.datasets.cone_starts([1.0, 0.0, 0.0], 3, mu=0.1, radius=1.0, span=[[2.0, 0.0, 0.0]])


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


@pytest.mark.parametrize("patch", [2, 4])
def test_tokens_are_pixels_then_position(patch):
    data = al.datasets.digit_patches(digits=(3, 8), patch=patch, n=12, seed=0)
    T, g = (8 // patch) ** 2, 8 // patch
    assert data.X.shape == (12, T, patch * patch + T) and data.T == T and data.grid == g
    assert data.d == patch * patch + T
    # Pixels of patch t are the image block at corner(t), row-major.
    for t in range(T):
        r, c = data.corner(t)
        block = data.images[:, r : r + patch, c : c + patch].reshape(12, -1)
        assert np.array_equal(data.X[:, t, : patch * patch], block)
    # The positional code is one-hot (scale 1) and the same for every image.
    assert np.array_equal(data.X[:, :, patch * patch :], np.broadcast_to(np.eye(T), (12, T, T)))
    assert data.images.min() >= 0 and data.images.max() <= 1


def test_labels_balanced_prefixes_and_source_rows():
    from sklearn.datasets import load_digits

    data = al.datasets.digit_patches(digits=(0, 1), patch=4, seed=3)
    raw = load_digits()
    assert np.array_equal(data.images, raw.images[data.index] / 16.0)
    assert np.array_equal(data.y, np.where(raw.target[data.index] == 0, 1.0, -1.0))
    assert data.n == int(np.isin(raw.target, (0, 1)).sum())
    for m in (2, 10, 40, 200):
        assert data.y[:m].sum() == 0  # every even prefix is balanced


def test_seed_decides_the_order_and_subset_keeps_everything():
    a = al.datasets.digit_patches(n=20, seed=1)
    b = al.datasets.digit_patches(n=20, seed=1)
    c = al.datasets.digit_patches(n=20, seed=2)
    assert np.array_equal(a.index, b.index) and not np.array_equal(a.index, c.index)
    sub = a.subset(slice(5, 9))
    assert len(sub) == 4 and np.array_equal(sub.X, a.X[5:9]) and np.array_equal(sub.index, a.index[5:9])
    assert (sub.digits, sub.patch, sub.pos_scale) == (a.digits, a.patch, a.pos_scale)
    rng = np.random.default_rng(0)
    assert al.datasets.digit_patches(n=4, seed=rng).n == 4


def test_pos_scale_and_patch_map():
    data = al.datasets.digit_patches(patch=2, n=3, pos_scale=2.5)
    assert np.allclose(data.X[:, :, 4:], 2.5 * np.eye(16))
    values = np.arange(16.0)
    painted = data.patch_map(values)
    assert painted.shape == (8, 8)
    for t in range(16):
        r, c = data.corner(t)
        assert np.all(painted[r : r + 2, c : c + 2] == t)
    assert data.patch_map(np.ones((5, 16))).shape == (5, 8, 8)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(digits=(3, 3)), "two different"),
        (dict(digits=(3, 10)), "digits must be an integer"),
        (dict(digits=(3,)), "two digit classes"),
        (dict(patch=3), "patch must divide"),
        (dict(patch=0), "patch must be an integer"),
        (dict(n=0), "n must be an integer"),
        (dict(n=10_000), "n must be an integer"),
        (dict(pos_scale=0.0), "pos_scale"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        al.datasets.digit_patches(**kwargs)


@pytest.mark.parametrize("m", [2, 4])
def test_factor_gradient_matches_finite_differences(m, central_difference):
    prob = al.datasets.random_tokens(3, 4, 4, seed=5, queries="cross")
    rng = np.random.default_rng(6)
    K, Q = rng.standard_normal((4, m)), rng.standard_normal((4, m))
    gK, gQ = one_gd_step(prob, K, Q)
    np.testing.assert_allclose(gK, central_difference(lambda k: float(prob.value(k @ Q.T)), K), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(gQ, central_difference(lambda q: float(prob.value(K @ q.T)), Q), rtol=1e-6, atol=1e-9)


def test_rank_instance_is_random_tokens_cross():
    X, y, u, Z, opt = al.datasets.rank_instance(4, 5, 6, seed=3)
    prob = al.datasets.random_tokens(4, 5, 6, seed=3, queries="cross")
    np.testing.assert_array_equal(X, prob.factors[0])
    np.testing.assert_array_equal(Z, prob.factors[1])
    np.testing.assert_array_equal(opt, prob.opt)


def test_random_joint_tokens_recipe():
    X, y = al.datasets.random_joint_tokens(n=8, d=4, seed=3, tight=3, gap=(0.5, 0.7), attention=(0.4, 0.9))
    assert X.shape == (8, 2, 4) and set(y.tolist()) == {-1.0, 1.0}
    assert np.all(X[:, 0] == 0)
    assert np.all((X[:, 1, 0] >= 0.4) & (X[:, 1, 0] <= 0.9))
    planted = y * X[:, 1, 1]
    assert np.sum(np.isclose(planted, 1.0)) == 3
    assert np.all((planted == 1.0) | ((planted >= 1.5) & (planted <= 1.7)))
    again, _ = al.datasets.random_joint_tokens(n=8, d=4, seed=3, tight=3, gap=(0.5, 0.7), attention=(0.4, 0.9))
    np.testing.assert_array_equal(X, again)
    assert not np.array_equal(X, al.datasets.random_joint_tokens(n=8, d=4, seed=4)[0])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n=1), "n must"),
        (dict(d=1), "d must"),
        (dict(n=4, tight=5), "tight"),
        (dict(gap=(0.5, 0.1)), "gap"),
        (dict(attention=(0.0, 1.0)), "attention"),
    ],
)
def test_random_joint_tokens_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        al.datasets.random_joint_tokens(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [dict(n=1, d=2), dict(n=5, d=0), dict(n=5, d=2, gap=0.0), dict(n=5, d=2, gap=1.5)],
)
def test_separable_data_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        al.datasets.separable_data(**kwargs)


def test_gradient_exact_near_a_local_selection():
    """A run saturating on a non-optimal token needs the current selection as reference."""
    prob = al.datasets.single_input(local=True)
    theta = np.array([35.0, 0.8, 0.0])
    np.testing.assert_allclose(prob.grad(theta), _mp_gradient(prob, theta), rtol=1e-10)


def test_theta_of_wrong_shape_is_named():
    prob = al.datasets.single_input()
    with pytest.raises(ValueError, match="theta must have shape"):
        prob.value(np.zeros(2))


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("size", [(6, 8, 10), (3, 5, 4), (5, 5, 3)])
def test_frobenius_fast_path_matches_cvxpy(seed, size):
    """The NNLS least-distance solve gives cvxpy's answer, its neighbours and its infeasibility verdicts."""
    prob = al.datasets.random_tokens(*size, seed=seed)
    rng = np.random.default_rng(seed)
    for select in (prob.opt, rng.integers(0, prob.T, size=prob.n)):
        fast, ref = _solve_both(prob, select, relax=None)
        assert (fast is None) == (ref is None)
        if ref is None:
            continue
        scale = np.linalg.norm(ref.theta)
        np.testing.assert_allclose(fast.theta, ref.theta, atol=1e-6 * scale)
        assert fast.margin == pytest.approx(ref.margin, rel=1e-6)
        assert fast.status == "optimal"
        # The fast solve meets every constraint (exactly, up to rounding, on the active ones).
        off = np.ones((prob.n, prob.T), bool)
        off[np.arange(prob.n), select] = False
        assert fast.constraint_values[off].min() >= 1 - 1e-9
        # Active sets agree except where cvxpy's own accuracy blurs a constraint across ACTIVE_TOL.
        differ = fast.neighbors != ref.neighbors
        assert np.all(np.abs(ref.constraint_values[differ] - 1) < 1e-5)


def test_joint_tokens_seed_zero_is_the_paper_and_other_seeds_stay_in_its_regime():
    """Seed 0: [MMTS] Fig. 3 exactly. Other seeds: the first set keeps every sample a support vector, the
    second keeps S = {1, 2} with the first-order limit p_hat(1) on the relaxed p-SVM (chapter 4's regime)."""
    for relaxed in (False, True):
        X0, y0 = al.datasets.joint_tokens(relaxed=relaxed)
        assert np.array_equal(X0, al.datasets.joint_tokens(relaxed=relaxed, seed=0)[0])
        assert X0[2, 1].tolist() == ([0.5, 1.5] if relaxed else [0.5, 1.0])
    assert [a.tolist() for a in al.datasets.joint_start(0)] == [[0.0, -1.0], [-1.0, 0.0]]
    for seed in range(1, 41):
        for relaxed, support in ((False, [0, 1, 2]), (True, [0, 1])):
            X, y = al.datasets.joint_tokens(relaxed=relaxed, seed=seed)
            assert not np.array_equal(X, al.datasets.joint_tokens(relaxed=relaxed)[0])
            svms = al.joint_svms(X, y, select=1)
            assert np.flatnonzero(svms.support).tolist() == support
            assert al.angle_degrees(al.svm.balanced_direction(svms, rho=1.0), svms.relaxed.theta) < 1e-6
            if relaxed:  # sample 3 off the edge by its slack, inside JOINT_JITTER's interval
                low, high = al.datasets.JOINT_JITTER["slack"]
                assert low - 1e-12 <= al.datasets.joint_slack(X) <= high + 1e-12
        p0, v0 = al.datasets.joint_start(seed)
        assert 0 < np.linalg.norm(p0 - al.datasets.JOINT_P0) < 1 and 0 < np.linalg.norm(v0 - al.datasets.JOINT_V0) < 1
    # inward (against the edge the paper's second set sits on) the first-order limit leaves the relaxed SVM
    svms = al.joint_svms(*al.datasets.joint_tokens(third=(0.45, 1.5)), select=1)
    assert al.angle_degrees(al.svm.balanced_direction(svms, rho=1.0), svms.relaxed.theta) > 0.5
    with pytest.raises(ValueError, match="seed"):
        al.datasets.joint_tokens(seed=-1)


def test_gaussian_tokens_plant_one_signal_token_in_gaussian_noise():
    D = al.datasets.gaussian_tokens(200, 8, 50, seed=3, signal=2.0)
    noise = np.delete(D.X.reshape(-1, 50), np.arange(200) * 8 + D.signal, axis=0)
    # Noise tokens are N(0, I/d): squared norms average 1, no component along u*.
    assert np.mean(np.sum(noise**2, axis=-1)) == pytest.approx(1.0, abs=0.02)
    assert np.mean(noise @ D.u_star) == pytest.approx(0.0, abs=0.02)
    signal = D.X[np.arange(200), D.signal] @ D.u_star * D.y
    assert np.mean(signal) == pytest.approx(2.0, abs=0.05)
    assert D.Z is None and np.linalg.norm(D.u_star) == pytest.approx(1.0)
    again = al.datasets.gaussian_tokens(200, 8, 50, seed=3, signal=2.0)
    assert np.array_equal(again.X, D.X) and np.array_equal(again.y, D.y)
    with pytest.raises(ValueError, match="signal"):
        al.datasets.gaussian_tokens(4, 5, 6, signal=0.0)
    with pytest.raises(ValueError, match="T"):
        al.datasets.gaussian_tokens(4, 1, 6)
