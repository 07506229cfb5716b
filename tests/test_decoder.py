"""Self-attention with a trainable decoder (attnlib.decoder) and joint training with train_joint_problem."""

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


@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("loss", ["logistic", "exponential"])
def test_value_matches_the_model(cross, loss):
    D, J = _problem(1, cross=cross, loss=loss)
    rng = np.random.default_rng(0)
    W, u = rng.normal(size=J.shape), rng.normal(size=D.X.shape[2])
    assert np.isclose(J.value(W.ravel(), u), _direct_loss(D, W, u, D.Z, loss), rtol=1e-12)


@pytest.mark.parametrize("cross", [False, True])
def test_gradient_matches_finite_differences(cross, central_difference):
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


@pytest.mark.parametrize("method", ["gd", "ngd", "polyak"])
def test_train_joint_problem_decreases_the_loss(method):
    D, J = _problem(5)
    lr = {"gd": 1.0, "ngd": 0.1, "polyak": 1.0}[method]
    run = al.optim.train_joint_problem(J, np.zeros(J.keys.shape[2]), np.zeros(D.X.shape[2]), 200, method=method, lr=lr)
    assert run.p.shape == (201, 1, J.keys.shape[2]) and run.v.shape == (201, 1, D.X.shape[2])
    assert run.loss[-1, 0] < 0.5 * run.loss[0, 0]
    assert run.stopped[0] is None


def test_ngd_moves_each_block_by_the_step():
    D, J = _problem(6)
    rng = np.random.default_rng(3)
    p0, v0 = rng.normal(size=J.keys.shape[2]), rng.normal(size=D.X.shape[2])
    run = al.optim.train_joint_problem(J, p0, v0, 5, method="ngd", lr=0.3)
    assert np.allclose(np.linalg.norm(np.diff(run.p[:, 0], axis=0), axis=-1), 0.3)
    assert np.allclose(np.linalg.norm(np.diff(run.v[:, 0], axis=0), axis=-1), 0.3)


def test_polyak_step_is_the_formula():
    D, J = _problem(8)
    rng = np.random.default_rng(4)
    p0, v0 = rng.normal(size=J.keys.shape[2]), rng.normal(size=D.X.shape[2])
    run = al.optim.train_joint_problem(J, p0, v0, 1, method="polyak", lr=0.5)
    gp, gv = J.grad(p0, v0)
    c = 0.5 * J.value(p0, v0) / (gp @ gp + gv @ gv)
    assert np.allclose(run.p[1, 0], p0 - c * gp) and np.allclose(run.v[1, 0], v0 - c * gv)


def test_train_joint_unchanged_for_prompt_attention():
    X, y = al.datasets.joint_tokens()
    run = al.train_joint(X, y, p0=[0, -1], v0=[-1, 0], steps=30)
    joint = al.JointAttention(X, np.asarray(y, float), np.eye(2), al.get_loss("logistic"))
    direct = al.optim.train_joint_problem(joint, [0, -1], [-1, 0], 30)
    assert np.array_equal(run.p, direct.p) and np.array_equal(run.v, direct.v)
    with pytest.raises(ValueError):
        al.train_joint(X, y, p0=[0, -1], v0=[-1, 0], steps=3, method="polyak")


def _stack_inputs(S=3, cross=False, B=2, seed=10):
    problems = [_problem(seed + s, cross=cross)[1] for s in range(S)]
    rng = np.random.default_rng(seed)
    P = 0.3 * rng.normal(size=(S, B, problems[0].keys.shape[2]))
    V = 0.3 * rng.normal(size=(S, B, problems[0].X.shape[2]))
    return problems, P, V


@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("method, lr", [("gd", 2.0), ("ngd", 0.1), ("polyak", 1.0)])
def test_stacked_run_equals_the_separate_runs(method, lr, cross):
    # 300 steps, two starts per problem: one batched loop gives each problem's own run (to rounding:
    # the stacked einsum may sum in another order; measured max |difference| ~1e-13 on norms ~30).
    problems, P, V = _stack_inputs(cross=cross)
    rec = al.log_steps(300)
    stacked = al.optim.train_decoder_stack(problems, P, V, 300, method=method, lr=lr, record_steps=rec)
    assert len(stacked) == len(problems)
    for s, (J, run) in enumerate(zip(problems, stacked)):
        one = al.optim.train_joint_problem(J, P[s], V[s], 300, method=method, lr=lr, record_steps=rec)
        assert run.problem is J and run.method == one.method and np.array_equal(run.steps, one.steps)
        assert run.p.shape == one.p.shape and run.v.shape == one.v.shape
        assert np.allclose(run.p, one.p, rtol=1e-12, atol=1e-12)
        assert np.allclose(run.v, one.v, rtol=1e-12, atol=1e-12)
        assert np.allclose(run.loss, one.loss, rtol=1e-12, atol=0)
        assert run.stopped == one.stopped
    assert np.linalg.norm(stacked[0].v[-1]) > 1.0  # the runs went somewhere


def test_stacked_starts_broadcast():
    problems, P, V = _stack_inputs(B=1)
    shared = al.optim.train_decoder_stack(problems, P[0, 0], V[0, 0], 20)
    per_set = al.optim.train_decoder_stack(problems, np.broadcast_to(P[0], P.shape), np.broadcast_to(V[0], V.shape), 20)
    for a, b in zip(shared, per_set):
        assert a.p.shape == (21, 1, problems[0].keys.shape[2]) and np.array_equal(a.p, b.p)
    with pytest.raises(ValueError, match="p0"):
        al.optim.train_decoder_stack(problems, P[:2], V[:2], 5)


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


def test_stacked_data_of_different_shapes_is_refused():
    (_, a), (_, b) = _problem(0), _problem(1, T=6)
    with pytest.raises(ValueError, match="problems must share X.shape"):
        al.optim.train_decoder_stack([a, b], np.zeros(a.keys.shape[2]), np.zeros(6), 5)
    (_, c) = _problem(2, cross=True)
    c = al.model.joint_self_attention(c.X, c.y, Z=c.Z[:, :3])
    with pytest.raises(ValueError, match="problems must share .*Z.shape"):
        al.optim.train_decoder_stack([a, c], np.zeros(a.keys.shape[2]), np.zeros(6), 5)
    with pytest.raises(ValueError, match="problems must share one loss"):
        al.optim.train_decoder_stack([a, _problem(3, loss="exponential")[1]], np.zeros(a.keys.shape[2]), np.zeros(6), 5)
    with pytest.raises(ValueError, match="problems must be a non-empty sequence"):
        al.optim.train_decoder_stack([], np.zeros(36), np.zeros(6), 5)
    with pytest.raises(ValueError, match="Z must have one query per sample"):
        al.model.StackedDecoderAttention(
            np.stack([a.X, a.X]), np.stack([a.y, a.y]), np.eye(6), "logistic", a.X[None, 1:, 0]
        )
