"""Self-attention with a trainable decoder (attnlib.decoder) and joint training with train_joint_problem."""

import numpy as np
import pytest

import attnlib as al


def _problem(seed=0, n=4, T=5, d=6, cross=False, loss="logistic"):
    D = al.planted_tokens(n, T, d, seed, queries="cross" if cross else "self")
    return D, al.joint_self_attention(D.X, D.y, Z=D.Z, loss=loss)


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
    D = al.planted_tokens(6, 8, 10, seed=7)
    prob = al.datasets.random_tokens(6, 8, 10, 7, family="global")
    assert np.array_equal(D.X, prob.factors[0])
    fixed = al.self_attention(D.X, D.y, D.u_star)
    assert np.array_equal(fixed.opt, D.signal)
    assert np.allclose(np.delete(fixed.gamma, D.signal + 8 * np.arange(6)), 0, atol=1e-12)


def test_decoder_svms_constraints():
    D, J = _problem(4, n=5, T=6, d=8)
    svms = al.decoder_svms(J, D.signal)
    W = svms.full.theta.reshape(J.shape)
    logits = np.einsum("itd,de,ie->it", D.X, W, J.Z)
    gaps = logits[np.arange(5), D.signal][:, None] - logits
    gaps[np.arange(5), D.signal] = np.inf
    assert gaps.min() == pytest.approx(1.0, abs=1e-6)
    assert np.all(D.y * (D.X[np.arange(5), D.signal] @ svms.label.v) >= 1 - 1e-6)
    with pytest.raises(ValueError):
        al.decoder_svms(J, D.signal[:-1])


@pytest.mark.parametrize("method", ["gd", "ngd", "polyak"])
def test_train_joint_problem_decreases_the_loss(method):
    D, J = _problem(5)
    lr = {"gd": 1.0, "ngd": 0.1, "polyak": 1.0}[method]
    run = al.train_joint_problem(J, np.zeros(J.keys.shape[2]), np.zeros(D.X.shape[2]), 200, method=method, lr=lr)
    assert run.p.shape == (201, 1, J.keys.shape[2]) and run.v.shape == (201, 1, D.X.shape[2])
    assert run.loss[-1, 0] < 0.5 * run.loss[0, 0]
    assert run.stopped[0] is None


def test_ngd_moves_each_block_by_the_step():
    D, J = _problem(6)
    rng = np.random.default_rng(3)
    p0, v0 = rng.normal(size=J.keys.shape[2]), rng.normal(size=D.X.shape[2])
    run = al.train_joint_problem(J, p0, v0, 5, method="ngd", lr=0.3)
    assert np.allclose(np.linalg.norm(np.diff(run.p[:, 0], axis=0), axis=-1), 0.3)
    assert np.allclose(np.linalg.norm(np.diff(run.v[:, 0], axis=0), axis=-1), 0.3)


def test_polyak_step_is_the_formula():
    D, J = _problem(8)
    rng = np.random.default_rng(4)
    p0, v0 = rng.normal(size=J.keys.shape[2]), rng.normal(size=D.X.shape[2])
    run = al.train_joint_problem(J, p0, v0, 1, method="polyak", lr=0.5)
    gp, gv = J.grad(p0, v0)
    c = 0.5 * J.value(p0, v0) / (gp @ gp + gv @ gv)
    assert np.allclose(run.p[1, 0], p0 - c * gp) and np.allclose(run.v[1, 0], v0 - c * gv)


def test_train_joint_unchanged_for_prompt_attention():
    X, y = al.datasets.joint_tokens()
    run = al.train_joint(X, y, p0=[0, -1], v0=[-1, 0], steps=30)
    joint = al.JointAttention(X, np.asarray(y, float), np.eye(2), al.get_loss("logistic"))
    direct = al.train_joint_problem(joint, [0, -1], [-1, 0], 30)
    assert np.array_equal(run.p, direct.p) and np.array_equal(run.v, direct.v)
    with pytest.raises(ValueError):
        al.train_joint(X, y, p0=[0, -1], v0=[-1, 0], steps=3, method="polyak")
