"""The token-selection problem: gradients, loss gap, stability at saturation, bad input."""

import numpy as np
import pytest

import attnlib as al


def _problem(seed=0, n=4, T=5, d=6, cross=False, loss="logistic"):
    D = al.datasets.planted_tokens(n, T, d, seed, queries="cross" if cross else "self")
    return D, al.model.joint_self_attention(D.X, D.y, Z=D.Z, loss=loss)


def _direct_loss(D, W, u, Z=None, loss="logistic"):
    """L(W, u) written out from the model f(X) = u^T X^T softmax(X W z), without the library."""
    Z = D.X[:, 0] if Z is None else Z
    logits = np.einsum("itd,de,ie->it", D.X, W, Z)
    s = np.exp(logits - logits.max(axis=1, keepdims=True))
    s /= s.sum(axis=1, keepdims=True)
    m = D.y * np.einsum("it,itd,d->i", s, D.X, u)
    return np.mean(np.logaddexp(0, -m) if loss == "logistic" else np.exp(-m))


def _stack_inputs(S=3, cross=False, B=2, seed=10):
    problems = [_problem(seed + s, cross=cross)[1] for s in range(S)]
    rng = np.random.default_rng(seed)
    P = 0.3 * rng.normal(size=(S, B, problems[0].keys.shape[2]))
    V = 0.3 * rng.normal(size=(S, B, problems[0].X.shape[2]))
    return problems, P, V


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


@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("loss", ["logistic", "exponential"])
def test_value_matches_the_model(cross, loss):
    D, J = _problem(1, cross=cross, loss=loss)
    rng = np.random.default_rng(0)
    W, u = rng.normal(size=J.shape), rng.normal(size=D.X.shape[2])
    assert np.isclose(J.value(W.ravel(), u), _direct_loss(D, W, u, D.Z, loss), rtol=1e-12)


@pytest.mark.parametrize("cross", [False, True])
def test_decoder_gradient_matches_finite_differences(cross, central_difference):
    D, J = _problem(2, cross=cross)
    rng = np.random.default_rng(1)
    W, u = rng.normal(size=J.shape), rng.normal(size=D.X.shape[2])
    gW, gu = J.grad(W.ravel(), u)
    fd_W = central_difference(lambda w: float(J.value(w, u)), W.ravel())
    fd_u = central_difference(lambda v: float(J.value(W.ravel(), v)), u)
    assert np.allclose(gW, fd_W, rtol=1e-6, atol=1e-9)
    assert np.allclose(gu, fd_u, rtol=1e-6, atol=1e-9)


def test_batched_gradient_matches_one_by_one():
    D, J = _problem(3)
    rng = np.random.default_rng(2)
    P, V = rng.normal(size=(3, J.keys.shape[2])), rng.normal(size=(3, D.X.shape[2]))
    gP, gV = J.grad(P, V)
    for b in range(3):
        gp, gv = J.grad(P[b], V[b])
        assert np.allclose(gP[b], gp) and np.allclose(gV[b], gv)


def test_planted_tokens_is_the_global_family():
    D = al.datasets.planted_tokens(6, 8, 10, seed=7)
    prob = al.datasets.random_tokens(6, 8, 10, 7, family="global")
    assert np.array_equal(D.X, prob.factors[0])
    fixed = al.self_attention(D.X, D.y, D.u_star)
    assert np.array_equal(fixed.opt, D.signal)
    assert np.allclose(np.delete(fixed.gamma, D.signal + 8 * np.arange(6)), 0, atol=1e-12)


@pytest.mark.parametrize("cross", [False, True])
def test_stacked_gradient_matches_finite_differences(cross, central_difference):
    # The stacked loss of row r as a function of row r's (vec W, u) alone, the other rows held fixed.
    problems, _, _ = _stack_inputs(S=2, cross=cross)
    X, y = np.stack([J.X for J in problems]), np.stack([J.y for J in problems])
    Z = np.stack([J.Z for J in problems]) if cross else None
    stack = al.model.StackedDecoderAttention(X, y, np.eye(X.shape[-1]), problems[0].loss, Z)
    assert stack.keys.shape == (2,) + problems[0].keys.shape
    rng = np.random.default_rng(5)
    P, V = rng.normal(size=(2, stack.keys.shape[-1])), rng.normal(size=(2, X.shape[-1]))
    gP, gV = stack.grad(P, V)

    def row_value(r, p=None, v=None):
        P2, V2 = P.copy(), V.copy()
        P2[r] = P[r] if p is None else p
        V2[r] = V[r] if v is None else v
        return float(stack.value(P2, V2)[r])

    for r, J in enumerate(problems):
        assert np.isclose(row_value(r), J.value(P[r], V[r]), rtol=1e-14)
        fd_p = central_difference(lambda p, r=r: row_value(r, p=p), P[r])
        fd_v = central_difference(lambda v, r=r: row_value(r, v=v), V[r])
        assert np.allclose(gP[r], fd_p, rtol=1e-6, atol=1e-9) and np.allclose(gV[r], fd_v, rtol=1e-6, atol=1e-9)
        gp, gv = J.grad(P[r], V[r])
        assert np.allclose(gP[r], gp, rtol=1e-12, atol=1e-15) and np.allclose(gV[r], gv, rtol=1e-12, atol=1e-15)


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


def test_stacked_joint_attention_rows_match_joint_attention():
    sets = [al.datasets.random_joint_tokens(n=4, seed=k) for k in range(3)]
    X, y = np.stack([s[0] for s in sets]), np.stack([s[1] for s in sets])
    rows = al.model.StackedJointAttention(X, y, np.eye(2), "logistic")
    rng = np.random.default_rng(0)
    p, v = rng.standard_normal((5, 3, 2)), rng.standard_normal((5, 3, 2))
    gp, gv = rows.grad(p, v)
    for r, (Xr, yr) in enumerate(sets):
        one = al.JointAttention(Xr, yr, np.eye(2), "logistic")
        a, b = one.grad(p[:, r], v[:, r])
        np.testing.assert_allclose(gp[:, r], a, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(gv[:, r], b, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(rows.value(p, v)[:, r], one.value(p[:, r], v[:, r]), rtol=1e-13)


# ---------------------------------------------------------------------------------- prototype
def test_logistic_regression_is_linear_logistic_regression():
    X, y = al.datasets.separable_data(12, 3, seed=0)
    prob = al.model.logistic_regression(X, y)
    w = np.random.default_rng(1).normal(size=(5, 3))
    margins = y * (w @ X.T)  # (5, 12)
    assert np.allclose(prob.value(w), np.mean(np.logaddexp(0, -margins), axis=-1))
    classic = -np.einsum("bi,id->bd", y * 0.5 * (1 - np.tanh(margins / 2)), X) / len(y)
    assert np.allclose(prob.grad(w), classic, rtol=1e-12, atol=1e-15)
    assert prob.loss_floor == 0.0
    assert np.allclose(prob.gap(w), prob.value(w), rtol=1e-12)


def test_logistic_regression_log_gap_survives_underflow():
    X, y = al.datasets.separable_data(10, 2, seed=3)
    prob = al.model.logistic_regression(X, y)
    w = al.max_margin(prob).theta * 2000.0  # every margin >= 2000: the gap is about e^-2000
    smallest = np.min(y * (X @ w))
    log_gap = float(prob.log_gap(w))
    assert np.isfinite(log_gap)
    # log(L) = log mean log(1 + e^-m) ≈ logsumexp(-m) - log n for huge margins m.
    expected = np.log(np.sum(np.exp(-(y * (X @ w)) + smallest))) - smallest - np.log(len(y))
    assert log_gap == pytest.approx(expected, rel=1e-9)


def test_logistic_regression_rejects_bad_labels():
    with pytest.raises(ValueError, match="labels"):
        al.model.logistic_regression([[1.0, 0.0]], [2.0])
    with pytest.raises(ValueError, match="must be"):
        al.model.logistic_regression([1.0, 0.0], [1.0])


# ---------------------------------------------------------------------------------- reduction
@pytest.mark.parametrize("queries", ["self", "cross"])
def test_reduction_is_an_isometry_with_the_same_softmax(queries):
    prob = al.datasets.random_tokens(n=3, T=4, d=6, seed=2, queries=queries)
    red = al.model.reduce_to_span(prob)
    assert red.rank == 3 * (4 - 1)
    c = np.random.default_rng(0).normal(size=(4, red.rank)) * 5
    W = red.lift(c)
    assert W.shape == (4, 6, 6)
    assert np.allclose(np.linalg.norm(W.reshape(4, -1), axis=-1), np.linalg.norm(c, axis=-1), rtol=1e-12)
    assert np.allclose(red.problem.log_attention(c), prob.log_attention(W), atol=1e-10)
    assert np.allclose(red.problem.value(c), prob.value(W), rtol=1e-12)
    # Gradients correspond: the lifted reduced gradient is the full gradient.
    assert np.allclose(red.lift(red.problem.grad(c)), prob.grad(W), atol=1e-12)


def test_reduction_of_low_rank_features_and_padding():
    prob = al.datasets.multi_input()  # keys in a plane: the span has dimension 2
    red = al.model.reduce_to_span(prob, size=5)
    assert red.rank == 2 and red.problem.shape == (5,)
    c = np.array([1.0, -2.0, 0.0, 0.0, 0.0])
    assert np.allclose(red.problem.log_attention(c), prob.log_attention(red.lift(c)), atol=1e-12)
    with pytest.raises(ValueError, match="size"):
        al.model.reduce_to_span(prob, size=1)


def test_factor_gradients_match_finite_differences(central_difference):
    prob = al.datasets.random_tokens(3, 4, 4, seed=5)
    rng = np.random.default_rng(6)
    K, Q = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    gK, gQ = al.model.factor_grad(prob.grad(K @ Q.T), K, Q)
    fdK = central_difference(lambda k: float(prob.value(k @ Q.T)), K, 1e-6)
    fdQ = central_difference(lambda q: float(prob.value(K @ q.T)), Q, 1e-6)
    np.testing.assert_allclose(gK, fdK, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(gQ, fdQ, rtol=1e-6, atol=1e-9)
    # and of the log-gap objective, as the (K, Q) path uses it
    _, gW = al.paths.log_gap_grad(prob, K @ Q.T)
    gK, _ = al.model.factor_grad(gW, K, Q)
    fdK = central_difference(lambda k: float(prob.log_gap(k @ Q.T)), K, 1e-6)
    np.testing.assert_allclose(gK, fdK, rtol=1e-5, atol=1e-8)


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


def test_stack_refuses_mismatched_problems():
    with pytest.raises(ValueError, match="problems must share n, T, parameter shape and loss; problem 1"):
        al.stack_problems([al.datasets.random_tokens(4, 5, 3, seed=0), al.datasets.random_tokens(4, 6, 3, seed=1)])
    stack = al.stack_problems([al.datasets.single_input(), al.datasets.single_input(local=True)])
    with pytest.raises(ValueError, match="theta0 must have shape"):
        al.train(stack, np.zeros((3, 3)), steps=1)


def _relu_instance(seed=0, S=3, d=5):
    data = al.datasets.relu_head_instances(S, d, seed=seed)
    stack, basis = al.model.relu_head_stack(data.X, data.Z, data.V, data.y)
    return data, stack, basis


def test_relu_head_stack_gradient_matches_finite_differences():
    data, stack, basis = _relu_instance()
    theta = np.random.default_rng(1).normal(size=(stack.S, stack.size))
    g = stack.grad(theta)
    eps = 1e-6
    for k in range(stack.size):
        step = np.zeros_like(theta)
        step[:, k] = eps
        fd = (stack.value(theta + step) - stack.value(theta - step)) / (2 * eps)
        np.testing.assert_allclose(g[:, k], fd, rtol=1e-6, atol=1e-9)


def test_relu_head_stack_is_the_official_model_in_w():
    # f_i = 1ᵀ relu(Vᵀ X_iᵀ softmax(X_i W z_i)), loss mean log(1 + exp(−y f)), W = W0 + unvec(B (θ − θ0))
    data, stack, basis = _relu_instance(seed=2)
    theta0 = np.einsum("sqk,sq->sk", basis, data.W0.reshape(stack.S, -1))
    theta = theta0 + np.random.default_rng(3).normal(size=theta0.shape)
    W = data.W0 + np.einsum("sqk,sk->sq", basis, theta - theta0).reshape(data.W0.shape)
    logits = np.einsum("sntd,sde,sne->snt", data.X, W, data.Z)
    sigma = np.exp(logits - logits.max(-1, keepdims=True))
    sigma /= sigma.sum(-1, keepdims=True)
    f = np.maximum(np.einsum("snt,sntd,sdh->snh", sigma, data.X, data.V), 0).sum(-1)
    np.testing.assert_allclose(stack.value(theta), np.log1p(np.exp(-data.y * f)).mean(-1), rtol=1e-12)


def test_relu_head_stack_direction_is_exact_at_saturation():
    data, stack, basis = _relu_instance(seed=4)
    theta = np.random.default_rng(5).normal(size=(stack.S, stack.size))
    m1, g1 = stack.scaled_grad_from(stack.terms_from_flat(theta))
    m2, g2 = stack.scaled_grad_from(stack.terms_from_flat(400 * theta))  # ‖∇L‖ underflows here
    assert np.all(np.isfinite(g2)) and np.all(np.linalg.norm(g2, axis=-1) > 0)


def test_relu_head_stack_rejects_bad_shapes():
    with pytest.raises(ValueError, match="X must be"):
        al.model.relu_head_stack(np.zeros((2, 3, 4)), np.zeros((2, 3)), np.zeros((2, 4, 4)), np.ones((2, 3)))


def _unfused_step(prob, flat):
    """The step as the trainers took it before the fusion: the two protocol calls."""
    terms = prob.terms_from_flat(flat)
    return (terms, *prob.scaled_grad_from(terms))


def _fused_cases():
    rng = np.random.default_rng(7)
    selfattn = [al.datasets.random_tokens(6, 8, 10, seed=s, queries="cross") for s in range(5)]
    exp_selfattn = [_with_loss(p, "exponential", factors=True) for p in selfattn]
    dense = [al.token_selection(rng.normal(size=(4, 5, 3)), rng.normal(size=(4, 5))) for _ in range(3)]
    twins = rng.normal(size=(3, 4, 2))
    twins[:, 1] = twins[:, 0]  # two equal tokens per sample: ties in log σ at every θ
    tied = al.token_selection(twins, rng.normal(size=(3, 4)))
    return [
        ("self-attention stack", al.stack_problems(selfattn), (5,)),
        ("two batches of a stack", al.stack_problems(selfattn), (2, 5)),
        ("self-attention stack, exponential loss", al.stack_problems(exp_selfattn), (5,)),
        ("dense stack, exponential loss", al.stack_problems([_with_loss(p, "exponential") for p in dense]), (3,)),
        ("dense stack, linear loss", al.stack_problems([_with_loss(p, "linear") for p in dense]), (3,)),
        ("one dense problem", dense[0], (4,)),
        ("tied tokens", tied, (3,)),
        ("one self-attention problem", selfattn[0], (4,)),
    ]


def _with_loss(prob, loss, factors=False):
    if factors:  # keep the rank-one factors (the fused step's BLAS path for the logits)
        return al.model.TokenSelectionProblem(prob.A, prob.gamma, al.losses.get_loss(loss), factors=prob.factors)
    return al.token_selection(prob.A, prob.gamma, loss)


@pytest.mark.parametrize("scale", [0.0, 1.0, 30.0, 400.0, 3000.0])
def test_the_fused_step_gives_the_numbers_of_the_two_calls(scale):
    """terms_and_scaled_grad (the trainers' fused step) against terms_from_flat + scaled_grad_from.

    Scale 0 ties every token (the argmax fallback), 400 and 3000 saturate the softmax so that most
    exponentials underflow (the guarded exp) and ‖∇L‖ is below the smallest float. The fused step
    sums in other orders (BLAS products for the logits, σ from the softmax's exponentials, the
    output from the weights' cancellation-free sum), so the two agree to rounding: 1e-12 relative
    to each array's largest entry. Without ``log_delta`` the other numbers are the same bits."""
    rng = np.random.default_rng(int(scale) + 1)
    for name, prob, lead in _fused_cases():
        flat = scale * rng.normal(size=lead + (prob.size,)) / np.sqrt(prob.size)
        with np.errstate(all="ignore"):
            old = _unfused_step(prob, flat)
            new = al.model.terms_and_scaled_grad(prob, flat)
            lean = al.model.terms_and_scaled_grad(prob, flat, log_delta=False)
        pairs = [(old[0].log_sigma, new[0].log_sigma), (old[0].log_delta, new[0].log_delta)]
        pairs += [(old[0].output, new[0].output), (old[1], new[1]), (old[2], new[2])]
        for a, b in pairs:
            assert a.shape == b.shape, name
            finite = np.isfinite(a)
            np.testing.assert_array_equal(finite, np.isfinite(b), err_msg=name)
            np.testing.assert_array_equal(a[~finite], b[~finite], err_msg=name)
            scale_a = np.abs(a[finite]).max(initial=0.0)
            np.testing.assert_allclose(b[finite], a[finite], rtol=1e-12, atol=1e-12 * scale_a, err_msg=name)
        assert lean[0].log_delta is None, name
        for a, b in [(new[0].log_sigma, lean[0].log_sigma), (new[0].output, lean[0].output), (new[1], lean[1])]:
            np.testing.assert_array_equal(a, b, err_msg=name)
        np.testing.assert_array_equal(new[2], lean[2], err_msg=name)


def test_the_fused_step_trains_the_trajectories_of_the_two_calls():
    """train and train_kq with the fused step against the unfused one (patched in): the same runs
    up to rounding. NGD on (K, Q) amplifies rounding (with the previous step too, a 1-ulp change of
    K0 moves some members' W by 1e-3 within 400 steps: benchmarks/step.py), so (K, Q) is compared
    to 1e-9 over 100 steps, where the growth has not started, and by its selections at step 300."""
    stack = al.stack_problems([al.datasets.random_tokens(6, 8, 10, seed=s, queries="cross") for s in range(4)])
    K0, Q0 = al.optim.kq_init(4, 10, 10, seed=0)

    def runs():
        W = al.train(stack, np.zeros(stack.shape), 300, "ngd", 0.1, record_every=100, progress=False)
        close, selections = [W.theta, W.log_gap, W.loss], [stack.selection(W.final)]
        for normalize in ("separate", "joint"):
            KQ = al.optim.train_kq(stack, K0, Q0, 300, "ngd", 0.1, normalize=normalize, record_steps=[0, 50, 100, 300])
            close += [KQ.K[:3], KQ.Q[:3], KQ.log_grad_norm[:3], KQ.log_gap[:3], KQ.loss[:3]]
            selections.append(stack.selection(KQ.final))
        return close, selections

    fused = runs()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(al.optim, "terms_and_scaled_grad", lambda prob, flat, log_delta=True: _unfused_step(prob, flat))
        unfused = runs()
    for a, b in zip(fused[0], unfused[0]):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9 * np.abs(b).max())
    for a, b in zip(fused[1], unfused[1]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("loss", ["logistic", "exponential"])
def test_the_fused_step_gradient_matches_finite_differences(loss, central_difference):
    """The fused step's ``exp(m)·g`` on a self-attention stack (its BLAS logits) and a dense one,
    against central differences of the loss, member by member, at a moderate θ (no saturation)."""
    selfattn = [al.datasets.random_tokens(4, 5, 3, seed=s, queries="cross") for s in range(2)]
    stacks = [al.stack_problems([_with_loss(p, loss, factors=True) for p in selfattn])]
    rng = np.random.default_rng(3)
    stacks.append(al.stack_problems([al.token_selection(rng.normal(size=(3, 4, 2)), rng.normal(size=(3, 4)), loss)]))
    for stack in stacks:
        flat = 0.7 * rng.normal(size=(stack.S, stack.size))
        _, m, g = al.model.terms_and_scaled_grad(stack, flat, log_delta=False)
        for s in range(stack.S):

            def member_loss(w, s=s, stack=stack, flat=flat):
                x = flat.copy()
                x[s] = w
                return float(stack.value(x.reshape((stack.S,) + stack.shape))[s])

            fd = central_difference(member_loss, flat[s])
            np.testing.assert_allclose(np.exp(m[s]) * g[s], fd, rtol=1e-6, atol=1e-8)


def test_guarded_exp_is_numpy_exp():
    x = np.concatenate([np.linspace(-760, -690, 70001), [0.0, -0.0, 1.0, 700.0, 710.0, -np.inf, np.inf, np.nan]])
    np.random.default_rng(0).shuffle(x)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(al.model._exp(x), np.exp(x))
        np.testing.assert_array_equal(al.model._exp(x[x > -700]), np.exp(x[x > -700]))  # the unguarded branch


@pytest.mark.parametrize("cross", [False, True])
def test_minibatch_gradient_matches_finite_differences(cross, central_difference):
    # The gradient of a weighted (mini-batch) loss sum_i c_i l(u_i), against central differences of that loss
    # written out without the library, and against the full gradient of the batch's own sub-problem.
    D, J = _problem(4, n=6, cross=cross)
    rng = np.random.default_rng(6)
    W, u = rng.normal(size=J.shape), rng.normal(size=D.X.shape[2])
    batch = np.array([0, 2, 3])
    c = np.zeros(D.X.shape[0])
    c[batch] = 1.0 / len(batch)
    ((m_p, g_p), (m_v, g_v)), out = J.weighted_scaled_grad(W.ravel(), u, c)
    assert np.allclose(np.sum(c * J.loss.value(out)), _direct_loss_weighted(D, W, u, c), rtol=1e-12)
    fd_W = central_difference(lambda w: _direct_loss_weighted(D, w.reshape(W.shape), u, c), W.ravel())
    fd_u = central_difference(lambda v: _direct_loss_weighted(D, W, v, c), u)
    assert np.allclose(np.exp(m_p) * g_p, fd_W, rtol=1e-6, atol=1e-9)
    assert np.allclose(np.exp(m_v) * g_v, fd_u, rtol=1e-6, atol=1e-9)
    Z = D.X[:, 0] if D.Z is None else D.Z
    sub = al.model.joint_self_attention(D.X[batch], D.y[batch], Z=Z[batch] if cross else None)
    g_sub = sub.grad(W.ravel(), u)
    assert np.allclose(np.exp(m_p) * g_p, g_sub[0], rtol=1e-12, atol=1e-15)
    assert np.allclose(np.exp(m_v) * g_v, g_sub[1], rtol=1e-12, atol=1e-15)


def _direct_loss_weighted(D, W, u, c):
    """sum_i c_i l(y_i f(X_i)) for the logistic loss, written out without the library."""
    Z = D.X[:, 0] if D.Z is None else D.Z
    logits = np.einsum("itd,de,ie->it", D.X, W, Z)
    s = np.exp(logits - logits.max(axis=1, keepdims=True))
    s /= s.sum(axis=1, keepdims=True)
    return float(np.sum(c * np.logaddexp(0, -D.y * np.einsum("it,itd,d->i", s, D.X, u))))


def test_weighted_gradient_without_weights_is_the_gradient():
    D, J = _problem(5)
    rng = np.random.default_rng(7)
    P, V = rng.normal(size=(3, J.keys.shape[2])), rng.normal(size=(3, D.X.shape[2]))
    plain = J.scaled_grad(P, V)
    uniform, _ = J.weighted_scaled_grad(P, V, np.full((3, D.X.shape[0]), 1.0 / D.X.shape[0]))
    for (m0, g0), (m1, g1) in zip(plain, uniform):
        assert np.allclose(np.exp(m0)[:, None] * g0, np.exp(m1)[:, None] * g1, rtol=1e-12, atol=1e-15)
    zero, _ = J.weighted_scaled_grad(P, V, np.zeros((3, D.X.shape[0])))  # an empty batch: gradient 0, not NaN
    for m, g in zero:
        assert np.all(np.exp(m)[:, None] * g == 0)


@pytest.mark.parametrize("cross", [False, True])
def test_factored_decoder_attention_matches_the_stack(cross):
    problems, _, _ = _stack_inputs(S=2, cross=cross)
    X, y = np.stack([J.X for J in problems]), np.stack([J.y for J in problems])
    Z = np.stack([J.Z for J in problems])
    args = (X, y, np.eye(X.shape[-1]), problems[0].loss, Z)
    slow, fast = al.model.StackedDecoderAttention(*args), al.model.FactoredDecoderAttention(*args)
    rng = np.random.default_rng(8)
    P, V = rng.normal(size=(4, 2, slow.keys.shape[-1])), rng.normal(size=(4, 2, X.shape[-1]))
    assert np.allclose(slow.log_attention(P), fast.log_attention(P), rtol=1e-12, atol=1e-12)
    assert np.allclose(slow.value(P, V), fast.value(P, V), rtol=1e-12)
    for a, b in zip(slow.grad(P, V), fast.grad(P, V)):
        assert np.allclose(a, b, rtol=1e-10, atol=1e-13)
