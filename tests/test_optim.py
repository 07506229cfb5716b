"""Optimizers: batching, long-horizon stability, stop reasons, joint training, bad input."""

import numpy as np
import pytest

import attnlib as al


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


def test_joint_training_follows_the_relaxed_svm():
    """[MMTS] joint training: sample 3 is not a support vector, so p follows the relaxed p-SVM."""
    X, y = al.datasets.joint_tokens(relaxed=True)
    traj = al.train_joint(X, y, al.datasets.JOINT_P0, al.datasets.JOINT_V0, steps=300)
    prob = al.prompt_attention(X, y, [0.0, 1.0])
    select = np.array([1, 1, 1])
    support = al.label_svm(X[:, 1], y).support
    relaxed = al.max_margin(prob, select, relax=~support)
    full = al.max_margin(prob, select)
    p_final = traj.p[-1, 0]
    assert al.cosine(p_final, relaxed.theta) > 0.999
    assert al.cosine(p_final, relaxed.theta) - al.cosine(p_final, full.theta) > 0.01
    assert al.cosine(traj.v[-1, 0], [0.0, 1.0]) > 0.999


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


def test_stack_refuses_mismatched_problems():
    with pytest.raises(ValueError, match="problems must share n, T, parameter shape and loss; problem 1"):
        al.stack_problems([al.datasets.random_tokens(4, 5, 3, seed=0), al.datasets.random_tokens(4, 6, 3, seed=1)])
    stack = al.stack_problems([al.datasets.single_input(), al.datasets.single_input(local=True)])
    with pytest.raises(ValueError, match="theta0 must have shape"):
        al.train(stack, np.zeros((3, 3)), steps=1)


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


# ---------------------------------------------------------------------- step rules


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
