"""The token-selection problem: gradients, loss gap, stability at saturation, bad input."""

import mpmath
import numpy as np
import pytest

import attnlib as al

LOSS_NAMES = sorted(al.losses.LOSSES)


def random_prompt(seed, loss, n=4, T=5, d=3):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, T, d))
    return al.prompt_attention(X, rng.choice([-1, 1], n), rng.normal(size=d), rng.normal(size=(d, d)), loss)


def random_self(seed, loss, n=3, T=4, d=3, cross=False):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, T, d))
    Z = rng.normal(size=(n, d + 1)) if cross else None
    return al.self_attention(X, rng.choice([-1, 1], n), rng.normal(size=d), Z, loss)


@pytest.mark.parametrize("loss", LOSS_NAMES)
@pytest.mark.parametrize("make", [random_prompt, random_self, lambda s, l: random_self(s, l, cross=True)])
def test_gradient_matches_finite_differences(make, loss, central_difference):
    for seed in range(3):
        prob = make(seed, loss)
        theta = np.random.default_rng(10 + seed).normal(size=prob.shape)
        fd = central_difference(prob.value, theta)
        np.testing.assert_allclose(prob.grad(theta), fd, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("loss", LOSS_NAMES)
def test_joint_gradients_match_finite_differences(loss, central_difference):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(4, 3, 2))
    joint = al.JointAttention(X, np.array([1.0, -1, 1, -1]), rng.normal(size=(3, 2)), al.get_loss(loss))
    p, v = rng.normal(size=3), rng.normal(size=2)
    grad_p, grad_v = joint.grad(p, v)
    np.testing.assert_allclose(grad_p, central_difference(lambda q: joint.value(q, v), p), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(grad_v, central_difference(lambda w: joint.value(p, w), v), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("loss", LOSS_NAMES)
def test_gap_equals_value_minus_floor_where_both_are_accurate(loss):
    prob = random_prompt(1, loss)
    theta = np.random.default_rng(2).normal(size=(5,) + prob.shape)
    np.testing.assert_allclose(prob.gap(theta), prob.value(theta) - prob.loss_floor, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(np.exp(prob.log_gap(theta)), prob.gap(theta), rtol=1e-9)


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


def test_gradient_exact_near_a_local_selection():
    """A run saturating on a non-optimal token needs the current selection as reference."""
    prob = al.datasets.single_input(local=True)
    theta = np.array([35.0, 0.8, 0.0])
    np.testing.assert_allclose(prob.grad(theta), _mp_gradient(prob, theta), rtol=1e-10)


def test_batched_evaluation_has_leading_axes():
    prob = random_self(0, "logistic")
    theta = np.random.default_rng(0).normal(size=(2, 3) + prob.shape)
    assert prob.logits(theta).shape == (2, 3, prob.n, prob.T)
    assert prob.value(theta).shape == (2, 3)
    assert prob.grad(theta).shape == theta.shape
    np.testing.assert_allclose(prob.attention(theta).sum(-1), 1.0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(X=np.zeros((2, 3))), "X must be a 3-D array"),
        (dict(y=[1, 0]), "labels -1 and \\+1"),
        (dict(y=[1, 1, 1]), "y must have shape \\(2,\\)"),
        (dict(v=[1.0, 2.0]), "v must have shape \\(3,\\)"),
        (dict(X=np.full((2, 3, 3), np.nan)), "X must be finite"),
        (dict(W=np.eye(2)), "W must have shape"),
        (dict(loss="hinge"), "loss must be one of"),
    ],
)
def test_bad_input_is_named(kwargs, message):
    rng = np.random.default_rng(0)
    args = dict(X=rng.normal(size=(2, 3, 3)), y=[1, -1], v=[1.0, 0.5, -0.2], W=None, loss="logistic")
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        al.prompt_attention(**args)


def test_ties_in_optimal_token_are_rejected():
    X = np.array([[[0.0, 1.0], [1.0, 1.0], [2.0, 0.0]]])
    with pytest.raises(ValueError, match="optimal token must be unique.*samples \\[0\\]"):
        al.prompt_attention(X, [1], v=[0.0, 1.0])


def test_theta_of_wrong_shape_is_named():
    prob = al.datasets.single_input()
    with pytest.raises(ValueError, match="theta must have shape"):
        prob.value(np.zeros(2))


def test_rank_one_self_attention_path_equals_generic_features():
    """The factored self-attention path (A_it = x_it z_iᵀ) gives the generic path's numbers."""
    for queries in ("self", "cross"):
        prob = al.datasets.random_tokens(n=4, T=5, d=3, seed=1, queries=queries)
        generic = al.token_selection(prob.A, prob.gamma, prob.loss)
        assert prob.factors is not None and generic.factors is None
        W = np.random.default_rng(0).normal(size=(7,) + prob.shape) * 5
        np.testing.assert_allclose(prob.logits(W), generic.logits(W), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(prob.grad(W), generic.grad(W), rtol=1e-10, atol=1e-15)
        np.testing.assert_allclose(prob.log_gap(W), generic.log_gap(W), rtol=1e-12)


def test_inconsistent_factors_are_rejected():
    prob = al.datasets.random_tokens(n=2, T=3, d=2, seed=0)
    X, Z = prob.factors
    with pytest.raises(ValueError, match="factors"):
        al.TokenSelectionProblem(prob.A, prob.gamma, prob.loss, factors=(X, 2 * Z))


# ---------------------------------------------------------------------- the public protocol


def test_problems_implement_the_attention_problem_protocol():
    prob = random_prompt(0, "logistic")
    stack = al.stack_problems([random_prompt(s, "logistic") for s in range(2)])
    head = al.model.nonlinear_head(np.abs(np.random.default_rng(0).normal(size=(3, 4, 2))), np.eye(2), np.ones(2))
    for p in (prob, stack, head):
        assert isinstance(p, al.AttentionProblem)
    theta = np.random.default_rng(1).normal(size=(2,) + prob.shape)
    flat, batch = prob.flatten(theta)
    assert flat.shape == (2, prob.size) and batch == (2,)
    terms = prob.terms_from_flat(flat)
    assert terms.log_sigma.shape == (2, prob.n, prob.T) and terms.output.shape == (2, prob.n)
    np.testing.assert_array_equal(prob.log_gap_from(terms), prob.log_gap(theta))
    m, g = prob.scaled_grad_from(terms)
    np.testing.assert_array_equal(np.exp(m)[:, None] * g, prob.grad(theta).reshape(2, -1))


def test_joint_problems_implement_the_joint_protocol():
    X = np.random.default_rng(0).normal(size=(3, 4, 2))
    joint = al.JointAttention(X, [1.0, -1.0, 1.0], np.eye(2), "logistic")
    assert isinstance(joint, al.model.JointProblem)
    assert isinstance(al.model.joint_self_attention(X, [1, -1, 1]), al.model.JointProblem)
    assert not isinstance(random_prompt(0, "logistic"), al.model.JointProblem)


def test_stacked_joint_attention_matches_each_data_set():
    rng = np.random.default_rng(3)
    X, y = rng.normal(size=(2, 4, 3, 2)), rng.choice([-1.0, 1.0], size=(2, 4))
    p, v = rng.normal(size=(5, 2, 2)), rng.normal(size=(5, 2, 2))
    stacked = al.model.StackedJointAttention(X, y, np.eye(2), "logistic")
    (m_p, g_p), (m_v, g_v) = stacked.scaled_grad(p, v)
    for r in range(2):
        one = al.JointAttention(X[r], y[r], np.eye(2), "logistic")
        (n_p, h_p), (n_v, h_v) = one.scaled_grad(p[:, r], v[:, r])
        np.testing.assert_allclose(m_p[:, r], n_p, rtol=1e-13)
        np.testing.assert_allclose(g_p[:, r], h_p, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(g_v[:, r], h_v, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(stacked.value(p, v)[:, r], one.value(p[:, r], v[:, r]), rtol=1e-13)
    with pytest.raises(ValueError, match="labels -1 and \\+1"):
        al.model.StackedJointAttention(X, 2 * y, np.eye(2), "logistic")


def test_check_labels_is_the_one_label_check():
    assert al.model.check_labels([1, -1], 2).tolist() == [1.0, -1.0]
    assert al.model.check_labels([[1, -1], [-1, -1]], (2, 2)).shape == (2, 2)
    with pytest.raises(ValueError, match="shape \\(3,\\)"):
        al.model.check_labels([1, -1], 3)
    with pytest.raises(ValueError, match="labels -1 and \\+1"):
        al.model.check_labels([1, 0], 2)
    for build in (
        lambda: al.model.logistic_regression(np.eye(2), [1, 2]),
        lambda: al.experiments.real_tokens.fit_patch_head(np.ones((2, 3, 2)), [1, 0]),
        lambda: al.label_svm(np.eye(2), [1, 0.5]),
        lambda: al.prompt_attention(np.ones((2, 2, 2)), [1, 3], v=[0, 1]),
    ):
        with pytest.raises(ValueError, match="labels -1 and \\+1"):
            build()


@pytest.mark.parametrize("seed", range(5))
def test_logsumexp_matches_scipy_with_signs_and_weights(seed):
    from scipy.special import logsumexp as scipy_logsumexp

    from attnlib.model import logsumexp

    rng = np.random.default_rng(seed)
    x = rng.normal(scale=50, size=(4, 6))
    x[0, :] = -np.inf
    x[1, 2] = -np.inf
    b = rng.choice([-1.0, 0.0, 1.0], size=(4, 6))
    b[2] = 0.0
    got, sign = logsumexp(x, axis=-1, b=b, return_sign=True)
    with np.errstate(divide="ignore"):
        want, want_sign = scipy_logsumexp(x, axis=-1, b=b, return_sign=True)
    np.testing.assert_array_equal(sign, want_sign)
    np.testing.assert_array_equal(got, want)  # the same algorithm: bit for bit
    near = np.log(np.abs(rng.normal(size=(3, 5)))) + 1e-12 * rng.normal(size=(3, 5))
    signs = np.where(np.arange(5) % 2, -1.0, 1.0)
    np.testing.assert_array_equal(
        logsumexp(near, b=signs, return_sign=True)[0], scipy_logsumexp(near, axis=-1, b=signs, return_sign=True)[0]
    )
    np.testing.assert_allclose(logsumexp(x, axis=0)[1:], scipy_logsumexp(x, axis=0)[1:], rtol=1e-13)
    np.testing.assert_array_equal(logsumexp(x, axis=0, precise=True), scipy_logsumexp(x, axis=0))
