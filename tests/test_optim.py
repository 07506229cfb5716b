"""Optimizers: batching, long-horizon stability, stop reasons, joint training, bad input."""

import matplotlib
import numpy as np
import pytest

import attnlib as al
from attnlib.optim import PROCESSES_ENV, default_processes, run_independent

matplotlib.use("Agg")
import mpmath


def _problem(seed=0, n=4, T=5, d=6, cross=False, loss="logistic"):
    D = al.datasets.planted_tokens(n, T, d, seed, queries="cross" if cross else "self")
    return D, al.model.joint_self_attention(D.X, D.y, Z=D.Z, loss=loss)


def _stack_inputs(S=3, cross=False, B=2, seed=10):
    problems = [_problem(seed + s, cross=cross)[1] for s in range(S)]
    rng = np.random.default_rng(seed)
    P = 0.3 * rng.normal(size=(S, B, problems[0].keys.shape[2]))
    V = 0.3 * rng.normal(size=(S, B, problems[0].X.shape[2]))
    return problems, P, V


@pytest.fixture(scope="module")
def small_study():
    data = al.datasets.digit_patches(n=60, seed=0)
    v = al.experiments.real_tokens.fit_patch_head(data.X[:40], data.y[:40])
    pool = data.subset(slice(40, None))
    problems, solutions = al.experiments.real_tokens.nested_svms(pool, v, [2, 4, 8])
    return pool, v, problems, solutions


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


# ---------------------------------------------------------------------------------- many problems
def _random_problems(count, family="random", d=3, n=3, T=4):
    return [al.datasets.random_tokens(n=n, T=T, d=d, seed=s, family=family) for s in range(count)]


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


@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("method, lr", [("gd", 2.0), ("ngd", 0.1), ("polyak", 1.0)])
def test_stacked_run_equals_the_separate_runs(method, lr, cross):
    # 300 steps, two starts per problem: one batched loop gives each problem's own run (to rounding:
    # the stacked einsum may sum in another order; measured max |difference| ~1e-13 on norms ~30).
    problems, P, V = _stack_inputs(cross=cross)
    rec = al.log_steps(300)
    stacked = al.optim.train_joint_stack(problems, P, V, 300, method=method, lr=lr, record_steps=rec)
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
    shared = al.optim.train_joint_stack(problems, P[0, 0], V[0, 0], 20)
    per_set = al.optim.train_joint_stack(problems, np.broadcast_to(P[0], P.shape), np.broadcast_to(V[0], V.shape), 20)
    for a, b in zip(shared, per_set):
        assert a.p.shape == (21, 1, problems[0].keys.shape[2]) and np.array_equal(a.p, b.p)
    with pytest.raises(ValueError, match="p0"):
        al.optim.train_joint_stack(problems, P[:2], V[:2], 5)


def test_stacked_data_of_different_shapes_is_refused():
    (_, a), (_, b) = _problem(0), _problem(1, T=6)
    with pytest.raises(ValueError, match="problems must share X.shape"):
        al.optim.train_joint_stack([a, b], np.zeros(a.keys.shape[2]), np.zeros(6), 5)
    (_, c) = _problem(2, cross=True)
    c = al.model.joint_self_attention(c.X, c.y, Z=c.Z[:, :3])
    with pytest.raises(ValueError, match="problems must share .*Z.shape"):
        al.optim.train_joint_stack([a, c], np.zeros(a.keys.shape[2]), np.zeros(6), 5)
    with pytest.raises(ValueError, match="problems must share one loss"):
        al.optim.train_joint_stack([a, _problem(3, loss="exponential")[1]], np.zeros(a.keys.shape[2]), np.zeros(6), 5)
    with pytest.raises(ValueError, match="problems must be a non-empty sequence"):
        al.optim.train_joint_stack([], np.zeros(36), np.zeros(6), 5)
    with pytest.raises(ValueError, match="Z must have one query per sample"):
        al.model.StackedDecoderAttention(
            np.stack([a.X, a.X]), np.stack([a.y, a.y]), np.eye(6), "logistic", a.X[None, 1:, 0]
        )


def test_loss_study_offset_and_its_bound_ratio():
    assert al.datasets.loss_study_offset(np.array([1.0, 9.0]), "linear") == pytest.approx([0.0, np.log(3.0)])
    C = 3.0
    run = al.train(al.datasets.loss_study(C), np.zeros(3), steps=1000, method="ngd", lr=0.1, record_every=5)
    assert run.theta[-1, 0, 1] == pytest.approx(al.datasets.loss_study_offset(C), abs=1e-3)
    assert al.datasets.loss_study_offset_ratio(run, C, "logistic", 0.1) <= 1
    short = al.train(al.datasets.loss_study(30.0), np.zeros(3), steps=300, method="ngd", lr=0.1, record_every=5)
    assert al.datasets.loss_study_offset_ratio(short, 30.0, "logistic", 0.1) > 1  # the path has not turned yet


def test_train_problems_tiles_and_reduces_without_changing_a_trajectory(small_study):
    _, _, problems, solutions = small_study
    keys = list(problems)
    rng = np.random.default_rng(0)
    starts = [rng.normal(size=problems[k].shape) for k in keys]  # not in the span of the features
    record = [0, 10, 60]
    batched = al.optim.train_problems([problems[k] for k in keys], starts, 60, "ngd", 0.1, record)
    for key, start, theta in zip(keys, starts, batched):
        alone = al.train(problems[key], start, 60, method="ngd", lr=0.1, record_steps=record).theta[:, 0]
        assert theta.shape == alone.shape
        assert np.allclose(theta, alone, rtol=0, atol=1e-8 * np.abs(alone).max())
    gd = al.optim.train_problems([problems["p", 2], problems["p", 8]], [np.zeros(20)] * 2, 30, "gd", 5.0, reduce=False)
    assert np.allclose(gd[0][-1], al.train(problems["p", 2], np.zeros(20), 30, method="gd", lr=5.0).final[0])
    with pytest.raises(ValueError, match="one start per problem"):
        al.optim.train_problems([problems["p", 2]], [], 10)
    with pytest.raises(ValueError, match="shape"):
        al.optim.train_problems([problems["p", 2]], [np.zeros(3)], 10)


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


def test_train_joint_stack_matches_separate_runs():
    sets = [al.datasets.joint_tokens(relaxed=r) for r in (False, True)]
    sets += [al.datasets.joint_tokens(third=(0.5, h)) for h in (1.2, 1.8)]
    rng = np.random.default_rng(3)
    p0, v0 = rng.standard_normal((2, 2)), rng.standard_normal((2, 2))
    problems = [al.JointAttention(X, y, np.eye(2), "logistic") for X, y in sets]
    stacked = al.optim.train_joint_stack(problems, p0, v0, steps=120, record_every=7)
    for (X, y), J, traj in zip(sets, problems, stacked):
        one = al.train_joint(X, y, p0, v0, steps=120, record_every=7)
        np.testing.assert_allclose(traj.p, one.p, rtol=1e-11, atol=1e-12)
        np.testing.assert_allclose(traj.v, one.v, rtol=1e-11, atol=1e-12)
        np.testing.assert_allclose(traj.loss, one.loss, rtol=1e-11)
        np.testing.assert_array_equal(traj.steps, one.steps)
        assert traj.problem is J
    cut = al.optim.truncate_joint(stacked[0], 50)
    assert cut.steps[-1] <= 50 and cut.p.shape[0] == cut.steps.size
    other = al.JointAttention(*al.datasets.random_joint_tokens(n=5, seed=0), np.eye(2), "logistic")
    with pytest.raises(ValueError, match="problems must share X.shape"):
        al.optim.train_joint_stack([problems[0], other], p0, v0, steps=5)
    with pytest.raises(ValueError, match="problems must share the key matrix W"):
        al.optim.train_joint_stack([problems[0], al.JointAttention(*sets[1], 2 * np.eye(2), "logistic")], p0, v0, 5)
    decoder = al.model.joint_self_attention(*sets[0])
    with pytest.raises(ValueError, match="not a mix"):
        al.optim.train_joint_stack([problems[0], decoder], p0, v0, steps=5)


def test_train_on_reduced_problem_equals_train_on_full_w():
    prob = al.datasets.random_tokens(n=4, T=5, d=7, seed=1, family="global")
    red = al.model.reduce_to_span(prob)
    for method, lr in (("gd", 1.0), ("ngd", 0.2), ("polyak", 1.0)):
        full = al.train(prob, np.zeros((1, 7, 7)), 60, method=method, lr=lr, polyak_max_step=100.0)
        small = al.train(red.problem, np.zeros((1, red.rank)), 60, method=method, lr=lr, polyak_max_step=100.0)
        scale = full.norm.max()
        assert np.max(np.abs(red.lift(small.theta) - full.theta)) <= 1e-12 * scale
        assert np.allclose(small.log_gap, full.log_gap, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("method,lr", [("gd", 1.0), ("ngd", 0.3), ("polyak", 1.0)])
def test_train_many_equals_train_problem_by_problem(method, lr):
    # The global family: on random data heading to a local selection, Polyak's steps amplify
    # rounding exponentially (the library's own rank-one and generic logit paths then diverge too).
    problems = _random_problems(4, family="global")
    record = np.arange(0, 81, 10)
    many = al.train_many(problems, 80, method, lr, record=record, polyak_max_step=30.0)
    assert many.theta.shape == (len(record), 4, 3, 3)
    assert many.seconds.shape == (len(record),) and np.all(np.diff(many.seconds) >= 0)
    for k, prob in enumerate(problems):
        one = al.train(prob, np.zeros((1, 3, 3)), 80, method=method, lr=lr, record_every=10, polyak_max_step=30.0)
        assert np.allclose(many.theta[:, k], one.theta[:, 0], rtol=1e-12, atol=1e-12)
        assert np.allclose(many.log_gap[:, k], one.log_gap[:, 0], rtol=1e-10, atol=1e-10)
        assert many.stopped[k] == one.stopped[0]


def test_train_many_reports_polyak_explosions_like_train():
    # d = 2 with n = 3, T = 4: the W-SVM of opt is infeasible on most draws, so L* is out of reach.
    problems = _random_problems(6, d=2)
    many = al.train_many(problems, 40, "polyak", 1.0)
    stopped = [s for s in many.stopped if s is not None]
    assert stopped and all("polyak step exploded" in s.reason for s in stopped)
    for k, prob in enumerate(problems):
        one = al.train(prob, np.zeros((1, 2, 2)), 40, method="polyak", lr=1.0)
        assert many.stopped[k] == one.stopped[0]


def test_train_many_per_problem_step_sizes_and_initialisations():
    prob = al.datasets.single_input()
    lrs = np.array([0.05, 0.1, 0.2])
    theta0 = np.array([[0.0, 1.0, 0.0], [0.0, -1.0, 0.0], [1.0, 0.0, 0.0]])
    many = al.train_many([prob] * 3, 50, "ngd", lrs, record=np.array([0, 50]), theta0=theta0)
    for k in range(3):
        one = al.train(prob, theta0[k], 50, method="ngd", lr=lrs[k], record_every=50)
        assert np.allclose(many.theta[-1, k], one.final[0], rtol=1e-12)
    assert np.allclose(many.lr, lrs)


def test_train_many_rejects_bad_input():
    a = al.datasets.random_tokens(n=3, T=4, d=3, seed=0)
    b = al.datasets.random_tokens(n=3, T=4, d=4, seed=0)
    with pytest.raises(ValueError, match="must share n, T, parameter shape"):
        al.train_many([a, b], 10)
    with pytest.raises(ValueError, match="non-empty"):
        al.train_many([], 10)
    with pytest.raises(ValueError, match="method"):
        al.train_many([a], 10, method="adam")
    with pytest.raises(ValueError, match="lr"):
        al.train_many([a], 10, lr=-1.0)
    with pytest.raises(ValueError, match="lr"):
        al.train_many([a, a], 10, lr=[0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="record"):
        al.train_many([a], 10, record=np.array([0, 20]))
    with pytest.raises(ValueError, match="record"):
        al.train_many([a], 10, record=np.array([5, 3]))
    with pytest.raises(ValueError, match="theta0"):
        al.train_many([a], 10, theta0=np.zeros((2, 3, 3)))
    exp = al.datasets.random_tokens(n=3, T=4, d=3, seed=0, loss="exponential")
    with pytest.raises(ValueError, match="loss"):
        al.train_many([a, exp], 10)


def test_log_steps():
    steps = al.log_steps(1000, per_decade=10)
    assert steps[0] == 0 and steps[-1] == 1000 and np.all(np.diff(steps) > 0)
    assert np.issubdtype(steps.dtype, np.integer)
    assert 25 <= len(steps) <= 40
    with pytest.raises(ValueError):
        al.log_steps(0)
    with pytest.raises(ValueError):
        al.log_steps(10, per_decade=0)


@pytest.mark.parametrize("method, lr", [("gd", 1.0), ("ngd", 0.1), ("polyak", 1.0)])
def test_batch_equals_loop_over_members(method, lr):
    prob = al.datasets.multi_input(seed=1)
    inits = al.datasets.MULTI_INPUT_INITS
    batch = al.train(prob, inits, steps=60, method=method, lr=lr, record_every=7)
    for b, theta0 in enumerate(inits):
        single = al.train(prob, theta0, steps=60, method=method, lr=lr, record_every=7)
        np.testing.assert_allclose(batch.theta[:, b], single.theta[:, 0], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(batch.loss[:, b], single.loss[:, 0], rtol=1e-12)
    assert batch.steps.tolist() == [0, 7, 14, 21, 28, 35, 42, 49, 56, 60]


def test_gd_norm_grows_logarithmically():
    prob = al.datasets.multi_input(seed=0)
    traj = al.train(prob, np.zeros(3), steps=20_000, method="gd", lr=1.0, record_every=100)
    late = traj.steps >= 1000
    slope, _ = al.fit_slope(traj.steps[late], traj.norm[late, 0], log_y=False)
    # ‖p(t)‖ ≈ ‖p_mm‖ log t + O(log log t) (Soudry-type asymptotics): slope near ‖p_mm‖ at finite t.
    assert slope == pytest.approx(1 / al.max_margin(prob).margin, rel=0.25)


def test_polyak_stops_with_a_reason_on_a_local_run():
    prob = al.datasets.single_input(local=True)
    inits = np.array([[0.0, 1.0, 0.0], [10.0, -0.5, 0.0]])  # the second sits in the local cone
    traj = al.train(prob, inits, steps=400, method="polyak", lr=1.0)
    assert traj.stopped[0] is None
    assert traj.stopped[1] is not None
    assert "polyak step exploded" in traj.stopped[1].reason
    assert "samples [0] are saturated on a non-optimal token" in traj.stopped[1].reason
    assert np.all(np.isfinite(traj.theta))


def test_non_finite_trajectory_stops_and_others_go_on():
    prob = al.datasets.loss_study(C=2.0)
    inits = np.array([[0.0, 0.0, 0.0], [1e308, 1e308, 0.0]])  # the key (1, 1) overflows the logit
    traj = al.train(prob, inits, steps=20)
    assert traj.stopped[0] is None
    assert traj.stopped[1] == al.optim.Stop(0, "non-finite value")
    assert 1.9 < traj.norm[-1, 0] <= 2.0  # 20 unit-0.1 steps, nearly collinear


def test_single_init_is_a_batch_of_one():
    prob = al.datasets.single_input()
    traj = al.train(prob, np.zeros(3), steps=5)
    assert traj.theta.shape == (6, 1, 3)
    assert traj.loss.shape == traj.log_gap.shape == (6, 1)
    assert traj.final.shape == (1, 3)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(method="adam"), "method must be one of"),
        (dict(lr=-1.0), "lr must be a positive"),
        (dict(steps=-5), "steps must be a non-negative integer"),
        (dict(record_every=0), "record_every must be a positive integer"),
        (dict(theta0=np.zeros((2, 2))), "theta0 must have shape"),
        (dict(theta0=np.array([np.nan, 0, 0])), "theta0 must be finite"),
    ],
)
def test_bad_training_arguments_are_named(kwargs, message):
    args = dict(theta0=np.zeros(3), steps=3)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        al.train(al.datasets.single_input(), **args)


def test_joint_batch_equals_loop():
    X, y = al.datasets.joint_tokens()
    rng = np.random.default_rng(0)
    p0, v0 = rng.normal(size=(3, 2)), rng.normal(size=(3, 2))
    batch = al.train_joint(X, y, p0, v0, steps=40, record_every=10)
    for b in range(3):
        single = al.train_joint(X, y, p0[b], v0[b], steps=40, record_every=10)
        np.testing.assert_allclose(batch.p[:, b], single.p[:, 0], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(batch.v[:, b], single.v[:, 0], rtol=1e-12, atol=1e-12)


def test_joint_bad_arguments_are_named():
    X, y = al.datasets.joint_tokens()
    with pytest.raises(ValueError, match="method must be 'gd' or 'ngd'"):
        al.train_joint(X, y, [0, 0], [0, 0], steps=2, method="polyak")
    with pytest.raises(ValueError, match="p0 must have shape"):
        al.train_joint(X, y, [0, 0, 0], [0, 0], steps=2)
    with pytest.raises(ValueError, match="same number of initialisations"):
        al.train_joint(X, y, np.zeros((2, 2)), np.zeros((3, 2)), steps=2)


def test_matrix_parameters_train_like_their_flattening():
    """Self-attention W (d×d): the optimizer works on the flattened parameter and reshapes back."""
    prob = al.datasets.random_tokens(n=3, T=4, d=3, seed=0)
    flat = al.token_selection(prob.A.reshape(prob.n, prob.T, -1), prob.gamma)
    W0 = np.random.default_rng(0).normal(size=(2, 3, 3))
    traj = al.train(prob, W0, steps=30, lr=0.1)
    ref = al.train(flat, W0.reshape(2, 9), steps=30, lr=0.1)
    assert traj.theta.shape == (31, 2, 3, 3)
    np.testing.assert_allclose(traj.theta.reshape(31, 2, 9), ref.theta, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(traj.norm[-1], np.linalg.norm(ref.final, axis=-1))


@pytest.mark.parametrize("method, lr", [("gd", 1.0), ("ngd", 0.1), ("polyak", 1.0)])
def test_stacked_problems_train_like_each_alone(method, lr):
    """One trajectory per problem (e.g. per seed) in one batch equals each problem trained alone."""
    problems = [al.datasets.random_tokens(n=4, T=5, d=3, seed=s, family="global") for s in range(4)]
    stack = al.stack_problems(problems)
    W0 = np.random.default_rng(0).normal(size=(4, 3, 3))
    traj = al.train(stack, W0, steps=40, method=method, lr=lr, record_every=10)
    assert traj.theta.shape == (5, 4, 3, 3)
    for s, prob in enumerate(problems):
        alone = al.train(prob, W0[s], steps=40, method=method, lr=lr, record_every=10)
        np.testing.assert_allclose(traj.theta[:, s], alone.theta[:, 0], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(traj.log_gap[:, s], alone.log_gap[:, 0], rtol=1e-10)
    np.testing.assert_allclose(stack.loss_floor, [p.loss_floor for p in problems])


def test_polyak_does_not_stop_on_its_long_first_step():
    """From W = 0 the attention is uniform: a long Polyak step there is no sign of a local limit."""
    prob = al.datasets.random_tokens(6, 8, 10, seed=0, family="global")
    traj = al.train(prob, np.zeros((10, 10)), steps=5, method="polyak", lr=1.0)
    assert traj.stopped == (None,)
    assert traj.norm[1, 0] > 10.0  # the first step was longer than 10·(1 + ‖W(0)‖)


def test_per_trajectory_step_sizes_and_explicit_record_steps():
    prob = al.datasets.multi_input(seed=0)
    lrs = np.array([0.05, 0.1, 0.2])
    record = np.array([0, 1, 10, 100])
    traj = al.train(prob, np.zeros((3, 3)), steps=100, lr=lrs, record_steps=record)
    assert traj.steps.tolist() == record.tolist() and traj.seconds.shape == (4,)
    assert np.all(np.diff(traj.seconds) >= 0)
    for b, lr in enumerate(lrs):
        alone = al.train(prob, np.zeros(3), steps=100, lr=lr)
        np.testing.assert_allclose(traj.theta[:, b], alone.theta[record, 0], rtol=1e-12, atol=1e-14)
    assert traj.select([2]).lr.tolist() == [0.2]
    with pytest.raises(ValueError, match="lr must be a positive finite number or 3 of them"):
        al.train(prob, np.zeros((3, 3)), steps=5, lr=[0.1, 0.2])
    with pytest.raises(ValueError, match="record_steps must be increasing"):
        al.train(prob, np.zeros(3), steps=5, record_steps=[0, 7])


def test_train_joint_problem_takes_a_problem_with_one_data_set_per_row():
    """The parameter sizes come from the last axes, so a row-stacked problem trains as one batch."""
    sets = [al.datasets.joint_tokens(relaxed=r) for r in (False, True)]
    X, y = np.stack([s[0] for s in sets]), np.stack([s[1] for s in sets])
    rows = al.model.StackedJointAttention(X, y, np.eye(2), "logistic")
    traj = al.optim.train_joint_problem(rows, np.zeros((2, 2)), np.ones((2, 2)), steps=10)
    assert traj.p.shape == (11, 2, 2) and traj.v.shape == (11, 2, 2)
    one = al.train_joint(*sets[1], np.zeros(2), np.ones(2), steps=10)
    np.testing.assert_allclose(traj.p[:, 1], one.p[:, 0], rtol=1e-12, atol=1e-14)


def test_step_rules_by_name_and_as_objects():
    assert isinstance(al.step_rule("gd"), al.optim.GradientDescent)
    assert isinstance(al.step_rule("ngd"), al.optim.NormalizedGradientDescent)
    assert al.step_rule("polyak", polyak_max_step=3.0) == al.optim.PolyakStep(3.0)
    rule = al.optim.PolyakStep(5.0)
    assert al.step_rule(rule) is rule
    with pytest.raises(ValueError, match="method must be one of"):
        al.step_rule("adam")
    lrs, log_gn, log_gap = np.array([0.5, 2.0]), np.log([4.0, 0.25]), np.log([2.0, 1.0])
    np.testing.assert_allclose(al.optim.GradientDescent().lengths(lrs, log_gn), [2.0, 0.5])
    np.testing.assert_allclose(al.optim.NormalizedGradientDescent().lengths(lrs, log_gn), lrs)
    np.testing.assert_allclose(al.optim.PolyakStep().lengths(lrs, log_gn, log_gap), [0.25, 8.0])


def test_train_takes_a_step_rule_object():
    prob = al.datasets.single_input(local=True)
    by_name = al.train(prob, al.datasets.SINGLE_INPUT_INITS, steps=200, method="polyak", lr=1.0, polyak_max_step=5.0)
    by_rule = al.train(prob, al.datasets.SINGLE_INPUT_INITS, steps=200, method=al.optim.PolyakStep(5.0), lr=1.0)
    np.testing.assert_array_equal(by_name.theta, by_rule.theta)
    assert by_name.stopped == by_rule.stopped and by_rule.method == "polyak"


def test_factor_and_parameter_trajectories_share_the_batch_record():
    prob = al.datasets.random_tokens(4, 5, 6, seed=0, queries="cross")
    K0, Q0 = al.optim.kq_init(3, 6, 6, m=2, seed=1)
    kq = al.optim.train_kq(prob, K0, Q0, steps=4, lr=0.1)
    part = kq.select([0, 2])
    assert isinstance(kq, al.optim.BatchRecord)
    assert part.K.shape == (5, 2, 6, 2) and part.loss.shape == (5, 2) and len(part.stopped) == 2
    np.testing.assert_array_equal(part.gap, np.exp(kq.log_gap[:, [0, 2]]))
    traj = al.train(prob, np.zeros((3,) + prob.shape), steps=4, lr=[0.1, 0.2, 0.3])
    one = traj.select(1)
    assert one.theta.shape == (5, 1) + prob.shape and one.lr.tolist() == [0.2]
    assert al.optim.record_schedule(10, 4).tolist() == [0, 4, 8, 10]


def test_study_offset_exponent_is_the_judged_statistic_and_grows_for_a_wrong_reference(small_study):
    # SelectionStudy.offset_exponent is what chapter 6's direction check and its rotated control evaluate:
    # against a run's own SVM it must equal follow_selection's exponent; against a fixed other direction, ~1.
    _, _, problems, solutions = small_study
    study = al.experiments.real_tokens.selection_study(problems, solutions, 800, 0.1, 50, 40.0, 10.0, rng=0)
    assert study.judged, "the small study should judge at least one run"
    for key, r in study.judged.items():
        own = r["solution"].theta
        assert study.offset_exponent(key, own) == pytest.approx(r["exponent"], rel=1e-12, abs=1e-12)
        toward = np.random.default_rng(1).standard_normal(own.shape)
        assert study.offset_exponent(key, al.metrics.rotate_toward(own, toward, 20.0)) > 0.5


def _cross_batch(S=3, n=4, T=5, d=3, seed=0):
    data = [al.datasets.rank_instance(n, T, d, seed + s) for s in range(S)]
    return [np.stack([e[k] for e in data]) for k in range(4)]


def test_cross_attention_descent_is_minus_the_gradient_by_finite_differences():
    X, y, u, Z = _cross_batch()
    gamma = y[..., None] * (X @ u[:, None, :, None])[..., 0]
    W = 0.7 * np.random.default_rng(1).standard_normal((3, 3, 3))
    G, log_scale = al.optim._cross_attention_descent(X, gamma, Z, W)
    grad = -np.exp(log_scale)[:, None, None] * G / X.shape[1]
    for b in range(3):
        prob = al.self_attention(X[b], y[b], u[b], Z[b])
        h, fd = 1e-6, np.zeros((3, 3))
        for i, j in np.ndindex(3, 3):
            E = np.zeros((3, 3))
            E[i, j] = h
            fd[i, j] = (prob.value(W[b] + E) - prob.value(W[b] - E)) / (2 * h)
        np.testing.assert_allclose(grad[b], fd, rtol=1e-6, atol=1e-9)


def test_cross_attention_descent_keeps_its_direction_at_saturation():
    # far beyond exp's range (logit gaps ~ 1e4): the direction is that of the problem's scaled gradient
    X, y, u, Z = _cross_batch(seed=5)
    gamma = y[..., None] * (X @ u[:, None, :, None])[..., 0]
    W = 3e3 * np.random.default_rng(2).standard_normal((3, 3, 3))
    G, _ = al.optim._cross_attention_descent(X, gamma, Z, W)
    for b in range(3):
        prob = al.self_attention(X[b], y[b], u[b], Z[b])
        _, g = prob.scaled_grad(W[b])
        cos = -np.sum(G[b] * g) / (np.linalg.norm(G[b]) * np.linalg.norm(g))
        assert np.linalg.norm(G[b]) > 0 and cos > 1 - 1e-12


def test_ngd_cross_attention_is_train_and_train_kq_in_one_loop():
    X, y, u, Z = _cross_batch(S=2, n=5, T=6, d=4)
    K0, Q0 = al.optim.kq_init(2, 4, 4, seed=3)
    flags = np.array([False, True, False, True])
    rep = lambda a: np.repeat(a, 2, axis=0)  # noqa: E731
    steps, W = al.optim.ngd_cross_attention(rep(X), rep(y), rep(u), rep(Z), 60, 0.1, rep(K0), rep(Q0), flags,
                                            record_steps=[0, 30, 60])  # fmt: skip
    assert steps.tolist() == [0, 30, 60] and W.shape == (3, 4, 4, 4)
    stack = al.stack_problems([al.self_attention(X[s], y[s], u[s], Z[s]) for s in range(2)])
    ref_W = al.train(stack, np.zeros((4, 4)), 60, "ngd", 0.1, record_steps=[60], progress=False).final
    ref_KQ = al.optim.train_kq(stack, K0, Q0, 60, "ngd", 0.1, normalize="separate", record_steps=[60]).final
    np.testing.assert_allclose(W[-1, ~flags], ref_W, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(W[-1, flags], ref_KQ, rtol=1e-9, atol=1e-12)


def test_ngd_cross_attention_pads_tokens_out_of_the_softmax():
    X, y, u, Z = _cross_batch(S=1, n=3, T=3, d=2)
    padded = np.concatenate([X, 5.0 * np.ones((1, 3, 2, 2))], axis=2)  # two padding tokens per input
    _, W = al.optim.ngd_cross_attention(X, y, u, Z, 40)
    _, Wp = al.optim.ngd_cross_attention(padded, y, u, Z, 40, tokens=[3])
    np.testing.assert_allclose(Wp, W, rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="tokens"):
        al.optim.ngd_cross_attention(padded, y, u, Z, 4, tokens=[6])
    with pytest.raises(ValueError, match="K0 and Q0"):
        al.optim.ngd_cross_attention(X, y, u, Z, 4, factorised=[True])
    with pytest.raises(ValueError, match=r"X must be \(B, n, T, d\)"):
        al.optim.ngd_cross_attention(X[0], y, u, Z, 4)


def test_train_together_matches_separate_runs():
    # GD and NGD runs sharing one batch (GDOrNGD) give the numbers of their own train calls, up to
    # rounding: numpy's vectorised exp/log can round the last bit differently with the batch size.
    prob = al.datasets.multi_input(0)
    starts = np.random.default_rng(1).normal(size=(3, 3))
    gd, ngd, slow = al.optim.train_together(
        prob,
        [
            ("gd", starts, 1.0, al.log_steps(300, 8)),
            ("ngd", starts[:2], 0.1, np.arange(0, 201, 5)),
            ("gd", starts, 0.01, [0, 50]),
        ],
    )
    alone = [
        al.train(prob, starts, 300, method="gd", lr=1.0, record_steps=al.log_steps(300, 8)),
        al.train(prob, starts[:2], 200, method="ngd", lr=0.1, record_every=5),
        al.train(prob, starts, 50, method="gd", lr=0.01, record_steps=[0, 50]),
    ]
    for run, ref in zip((gd, ngd, slow), alone):
        assert run.method == ref.method and run.lr == ref.lr
        assert np.array_equal(run.steps, ref.steps)
        for name in ("theta", "loss", "log_gap", "log_grad_norm"):
            np.testing.assert_allclose(getattr(run, name), getattr(ref, name), rtol=1e-12, atol=1e-12, err_msg=name)
        assert run.stopped == ref.stopped


def test_train_together_rejects_bad_runs():
    prob = al.datasets.single_input()
    with pytest.raises(ValueError, match="method"):
        al.optim.train_together(prob, [("polyak", np.zeros(3), 1.0, [0, 5])])
    with pytest.raises(ValueError, match="record_steps"):
        al.optim.train_together(prob, [("gd", np.zeros(3), 1.0, [5, 0])])
    with pytest.raises(ValueError, match="lr"):
        al.optim.train_together(prob, [("gd", np.zeros((2, 3)), [1.0, 2.0, 3.0], [0, 5])])
    with pytest.raises(ValueError, match="at least one"):
        al.optim.train_together(prob, [])


def test_records_cuts_the_record_axis():
    traj = al.train(al.datasets.single_input(), np.zeros((2, 3)), steps=20, record_every=2)
    part = traj.records([0, 4, 10])
    assert part.theta.shape == (3, 2, 3) and np.array_equal(part.theta, traj.theta[[0, 2, 5]])
    assert np.array_equal(part.loss, traj.loss[[0, 2, 5]]) and part.seconds.shape == (3,)
    with pytest.raises(ValueError, match="recorded steps"):
        traj.records([0, 3])


def test_minibatch_weights_cover_every_sample_once_per_epoch():
    w = al.optim.minibatch_weights(12, 9, 4, seed=3)
    assert w.shape == (9, 12) and np.allclose(w.sum(axis=1), 1.0)
    assert set(np.unique(w)) == {0.0, 0.25}
    for epoch in range(3):  # 3 batches of 4 make an epoch of 12: each sample exactly once
        assert np.array_equal((w[3 * epoch : 3 * epoch + 3] > 0).sum(axis=0), np.ones(12))
    assert np.array_equal(w, al.optim.minibatch_weights(12, 9, 4, seed=3))
    assert not np.array_equal(w, al.optim.minibatch_weights(12, 9, 4, seed=4))
    assert np.allclose(al.optim.minibatch_weights(5, 2, None), 0.2)
    straddle = al.optim.minibatch_weights(5, 4, 2, seed=0)  # 8 draws over 2 epochs of 5
    assert np.allclose(straddle.sum(axis=1), 1.0) and (straddle[:, :] > 0).sum() == 8


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n=0, steps=3, batch_size=1), "n must"),
        (dict(n=4, steps=3, batch_size=5), "batch_size"),
        (dict(n=4, steps=3, batch_size=0), "batch_size"),
        (dict(n=4, steps=-1, batch_size=2), "steps"),
    ],
)
def test_minibatch_weights_reject_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        al.optim.minibatch_weights(**kwargs)


def _joint_digits(S=2, n=8):
    sets = [al.datasets.digit_patches(patch=4, n=n, seed=s) for s in range(S)]
    X = np.stack([D.X for D in sets])
    Z = X.mean(axis=2)
    return al.model.FactoredDecoderAttention(X, np.stack([D.y for D in sets]), np.eye(X.shape[-1]), "logistic", Z)


def test_train_joint_methods_matches_each_method_alone():
    J = _joint_digits()
    d = J.X.shape[-1]
    methods = ["gd", "ngd", "polyak"]
    for name in methods:
        both = al.optim.train_joint_methods(
            J, np.zeros((2, d * d)), np.zeros((2, d)), 30, [name, name], [2.0 if name == "gd" else 0.5] * 2
        )
        alone = al.optim.train_joint_problem(
            J, np.zeros((2, d * d)), np.zeros((2, d)), 30, method=name, lr=2.0 if name == "gd" else 0.5
        )
        assert np.allclose(both.p, alone.p, rtol=1e-10, atol=1e-12), name
        assert np.allclose(both.loss, alone.loss, rtol=1e-10, atol=1e-14), name


def test_train_joint_methods_takes_minibatch_steps():
    # One SGD step from a start: minus lr times the gradient of that step's batch (its sub-problem's gradient).
    J = _joint_digits(S=1)
    d = J.X.shape[-1]
    rng = np.random.default_rng(0)
    p0, v0 = 0.1 * rng.normal(size=(1, d * d)), 0.1 * rng.normal(size=(1, d))
    w = al.optim.minibatch_weights(8, 1, 3, seed=1)[:, None]
    traj = al.optim.train_joint_methods(J, p0, v0, 1, ["gd"], 2.0, w)
    batch = np.flatnonzero(w[0, 0])
    sub = al.model.FactoredDecoderAttention(J.X[:, batch], J.y[:, batch], np.eye(d), "logistic", J.Z[:, batch])
    gp, gv = sub.grad(p0, v0)
    assert np.allclose(traj.p[-1], p0 - 2.0 * gp, rtol=1e-12) and np.allclose(traj.v[-1], v0 - 2.0 * gv, rtol=1e-12)
    assert np.isclose(traj.loss[-1, 0], J.value(traj.p[-1], traj.v[-1])[0])  # the recorded loss is the full one
    # SNGD: each block moves by exactly lr along its batch gradient
    sn = al.optim.train_joint_methods(J, p0, v0, 1, ["ngd"], 0.5, w)
    assert np.isclose(np.linalg.norm(sn.p[-1] - p0), 0.5) and np.allclose(
        (p0 - sn.p[-1]) / 0.5, gp / np.linalg.norm(gp), rtol=1e-10
    )


def test_train_joint_methods_rejects_bad_input():
    J = _joint_digits(S=1)
    d = J.X.shape[-1]
    p0, v0 = np.zeros((1, d * d)), np.zeros((1, d))
    with pytest.raises(ValueError, match="methods"):
        al.optim.train_joint_methods(J, p0, v0, 3, ["adam"], 0.1)
    with pytest.raises(ValueError, match="methods"):
        al.optim.train_joint_methods(J, p0, v0, 3, ["gd", "gd"], 0.1)
    with pytest.raises(ValueError, match="weights"):
        al.optim.train_joint_methods(J, p0, v0, 3, ["gd"], 0.1, np.ones((2, 1, 8)))
    with pytest.raises(ValueError, match="lr"):
        al.optim.train_joint_methods(J, p0, v0, 3, ["gd"], -1.0)


def test_run_independent_returns_in_order_the_same_numbers_in_one_process_or_two(monkeypatch):
    probs = [al.datasets.single_input(), al.datasets.single_input(third_score=0.5)]
    tasks = [lambda p=p: al.train(p, al.datasets.SINGLE_INPUT_INITS, 300, "ngd", 0.1).final for p in probs]
    serial = run_independent(tasks, processes=1)
    forked = run_independent(tasks, processes=2)
    assert len(forked) == 2 and all(np.array_equal(a, b) for a, b in zip(serial, forked))  # bit for bit
    assert run_independent([], processes=2) == []
    monkeypatch.delenv(PROCESSES_ENV, raising=False)
    assert default_processes() == 1
    monkeypatch.setenv(PROCESSES_ENV, "2")
    assert default_processes() == 2
    monkeypatch.setenv(PROCESSES_ENV, "two")
    with pytest.raises(ValueError, match=PROCESSES_ENV):
        default_processes()
    with pytest.raises(ValueError, match="processes"):
        run_independent(tasks, processes=0)
