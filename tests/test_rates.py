"""attnlib.rates: the logistic-regression prototype, the span reduction, the many-problem runner."""

import numpy as np
import pytest

import attnlib as al


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


def test_logistic_regression_svm_is_the_hard_margin_svm():
    X, y = al.datasets.separable_data(15, 2, seed=4)
    sol = al.max_margin(al.model.logistic_regression(X, y))
    label = al.label_svm(X, y)
    assert np.allclose(sol.theta, label.v, atol=1e-6)
    assert np.min(y * (X @ sol.theta)) == pytest.approx(1.0, abs=1e-6)


def test_cross_entropy_excess_matches_direct_difference():
    loss = al.losses.CROSS_ENTROPY
    gamma = np.array([1.0, 0.5, 2.0])
    delta = np.array([0.3, 1e-3, 1.5])
    direct = loss.value(gamma - delta) - loss.value(gamma)
    assert np.allclose(loss.excess(gamma, delta), direct, rtol=1e-12)
    assert np.allclose(loss.log_excess(gamma, np.log(delta)), np.log(direct), rtol=1e-12)
    tiny = np.log(1e-200)  # below the switch to the first-order form
    assert loss.log_excess(1.0, tiny) == pytest.approx(tiny, rel=1e-12)


def test_separable_data_is_separable_and_scaled():
    X, y = al.datasets.separable_data(30, 4, seed=7)
    assert X.shape == (30, 4) and set(np.unique(y)) <= {-1.0, 1.0}
    assert np.max(np.linalg.norm(X, axis=1)) == pytest.approx(1.0)
    al.label_svm(X, y)  # feasible: raises InfeasibleError otherwise


@pytest.mark.parametrize(
    "kwargs",
    [dict(n=1, d=2), dict(n=5, d=0), dict(n=5, d=2, gap=0.0), dict(n=5, d=2, gap=1.5)],
)
def test_separable_data_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        al.datasets.separable_data(**kwargs)


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


def test_reduction_keeps_the_w_svm():
    prob = al.datasets.random_tokens(n=3, T=4, d=5, seed=0)
    red = al.model.reduce_to_span(prob)
    full, small = al.max_margin(prob), al.max_margin(red.problem)
    assert small.margin == pytest.approx(full.margin, rel=1e-6)
    assert np.allclose(red.lift(small.theta), full.theta, atol=1e-6)


def test_reduction_of_low_rank_features_and_padding():
    prob = al.datasets.multi_input()  # keys in a plane: the span has dimension 2
    red = al.model.reduce_to_span(prob, size=5)
    assert red.rank == 2 and red.problem.shape == (5,)
    c = np.array([1.0, -2.0, 0.0, 0.0, 0.0])
    assert np.allclose(red.problem.log_attention(c), prob.log_attention(red.lift(c)), atol=1e-12)
    with pytest.raises(ValueError, match="size"):
        al.model.reduce_to_span(prob, size=1)


def test_train_on_reduced_problem_equals_train_on_full_w():
    prob = al.datasets.random_tokens(n=4, T=5, d=7, seed=1, family="global")
    red = al.model.reduce_to_span(prob)
    for method, lr in (("gd", 1.0), ("ngd", 0.2), ("polyak", 1.0)):
        full = al.train(prob, np.zeros((1, 7, 7)), 60, method=method, lr=lr, polyak_max_step=100.0)
        small = al.train(red.problem, np.zeros((1, red.rank)), 60, method=method, lr=lr, polyak_max_step=100.0)
        scale = full.norm.max()
        assert np.max(np.abs(red.lift(small.theta) - full.theta)) <= 1e-12 * scale
        assert np.allclose(small.log_gap, full.log_gap, rtol=1e-9, atol=1e-9)


# ---------------------------------------------------------------------------------- many problems
def _random_problems(count, family="random", d=3, n=3, T=4):
    return [al.datasets.random_tokens(n=n, T=T, d=d, seed=s, family=family) for s in range(count)]


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


def test_curves_match_the_metrics():
    problems = _random_problems(3, family="global", d=4)
    solutions = [al.max_margin(p) for p in problems]
    solutions[1] = None  # an infeasible W-SVM: its columns must be NaN, not computed
    traj = al.train_many(problems, 100, "ngd", 0.2, record=np.array([0, 50, 100]))
    out = al.metrics.curves(problems, traj, solutions)
    assert set(out) == set(al.metrics.CURVES)
    assert all(v.shape == (3, 3) for v in out.values())
    assert np.all(np.isnan(out["direction_error"][:, 1])) and np.all(np.isnan(out["margin_gap"][:, 1]))
    k = 2
    W = traj.theta[-1, k]
    assert out["direction_error"][-1, k] == pytest.approx(al.direction_error(W, solutions[k].theta))
    assert out["margin_gap"][-1, k] == pytest.approx(solutions[k].margin - al.normalized_margin(problems[k], W))
    log_mass = np.max(al.log_one_minus_mass(problems[k], W))
    assert out["log_mass"][-1, k] == pytest.approx(log_mass)
    assert out["sparsity_rate"][-1, k] == pytest.approx(-log_mass / np.linalg.norm(W))
    assert out["selects_opt"][-1, k] == 1.0
    with pytest.raises(ValueError, match="solutions"):
        al.metrics.curves(problems, traj, solutions[:2])


# ---------------------------------------------------------------------------------- slow shapes
def test_inverse_log_vs_power_tells_the_two_shapes_apart():
    t = al.log_steps(100_000)[1:].astype(float)
    window = t >= 1000
    inverse_log = al.fits.inverse_log_vs_power(t[window], 1.5 / (2.0 + 0.8 * np.log(t[window])))
    assert inverse_log.rms_inverse_log < 1e-12 and inverse_log.ratio > 1e6
    assert inverse_log.residual_power.shape == (window.sum(),)
    power = al.fits.inverse_log_vs_power(t[window], 4.0 * t[window] ** -0.07)
    assert power.rms_power < 1e-12 and power.ratio < 1e-6 and power.exponent == pytest.approx(0.07)
    # A 1/log t curve with a slowly drifting numerator (a bounded offset still moving) still fits
    # the 1/log t model far better than any power law over two decades.
    drift = (1.0 + 0.1 * np.log(np.log(t[window]))) / np.log(t[window])
    assert al.fits.inverse_log_vs_power(t[window], drift).ratio > 2


def test_inverse_log_vs_power_rejects_bad_input_and_flags_a_negative_denominator():
    with pytest.raises(ValueError, match="positive"):
        al.fits.inverse_log_vs_power([1.0, 2.0, 3.0], [1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="length"):
        al.fits.inverse_log_vs_power([1.0, 2.0], [1.0, 0.5])
    t = np.logspace(0, 2, 10)
    rising = np.exp(np.log(t) ** 2)  # 1/err falls faster than any line in log t: the fit turns negative
    assert al.fits.inverse_log_vs_power(t, rising).rms_inverse_log == np.inf


def test_half_decade_slopes():
    t = al.log_steps(10_000)[2:].astype(float)
    last, prev = al.fits.half_decade_slopes(t, 2.5 * np.log(t) - 1.0)
    assert last == pytest.approx(2.5) and prev == pytest.approx(2.5)
    # y = log t + 3 log log t: the slope 1 + 3/log t drifts down from one half-decade to the next.
    last, prev = al.fits.half_decade_slopes(t, np.log(t) + 3 * np.log(np.log(t)))
    assert 1 < last < prev
    assert last == pytest.approx(1 + 3 / np.log(10_000 / 10**0.25), rel=0.02)
    with pytest.raises(ValueError, match="half-decades"):
        al.fits.half_decade_slopes(np.array([1.0, 10.0, 100.0]), np.zeros(3))


# ------------------------------------------------------- comparing GD, NGD and Polyak (chapter 5's pieces)
def _local_case():
    # A random problem (d = 16) on which NGD from 0 ends at a locally-optimal selection alpha != opt.
    return al.experiments.fast_rates.reduced_tokens(6, 8, 16, [16], size=42, family="random")[0].problem


def test_solve_each_reports_infeasible_as_none():
    feasible = al.experiments.fast_rates.reduced_tokens(3, 4, 8, [0], size=9, family="global")[0].problem
    infeasible = al.experiments.fast_rates.reduced_tokens(6, 8, 2, range(20), size=42, family="random")
    sols = al.experiments.fast_rates.solve_each([feasible] + [r.problem for r in infeasible])
    assert sols[0] is not None and np.isclose(sols[0].margin, al.max_margin(feasible).margin)
    assert any(s is None for s in sols[1:])  # at d = 2 some W-SVMs of opt are infeasible


def test_reduced_tokens_are_the_reduced_random_tokens():
    batch = al.experiments.fast_rates.reduced_tokens(3, 4, 16, [5, 6], size=9, family="global", queries="cross")
    direct = al.model.reduce_to_span(al.datasets.random_tokens(3, 4, 16, 6, family="global", queries="cross"), size=9)
    assert len(batch) == 2 and batch[1].problem.shape == (9,)
    np.testing.assert_allclose(batch[1].problem.A, direct.problem.A)


def test_compare_methods_runs_each_method_and_selects_columns():
    probs = [r.problem for r in al.experiments.fast_rates.reduced_tokens(3, 4, 8, [0, 1, 2], size=9, family="global")]
    sols = al.experiments.fast_rates.solve_each(probs)
    cmp = al.experiments.fast_rates.compare_methods(probs, sols, {"gd": 60, "ngd": 40}, {"gd": 1.0, "ngd": 0.3})
    assert set(cmp.runs) == {"gd", "ngd"} and cmp.runs["gd"].steps[-1] == 60 and cmp.runs["ngd"].steps[-1] == 40
    alone = al.train_many(probs[1:2], 40, "ngd", 0.3)
    np.testing.assert_allclose(cmp.runs["ngd"].theta[:, 1], alone.theta[:, 0], atol=1e-12)
    two = cmp.select(np.array([False, True, True]))
    assert two.runs["gd"].theta.shape[1] == 2 and two.curves["ngd"]["direction_error"].shape[1] == 2
    np.testing.assert_allclose(two.curves["ngd"]["norm"], cmp.curves["ngd"]["norm"][:, 1:])
    polyak = al.experiments.fast_rates.compare_methods(probs, sols, 30, {"polyak": 1.0})
    assert set((cmp | polyak).runs) == {"gd", "ngd", "polyak"}


def test_late_slopes_and_late_decay():
    t = np.arange(0.0, 101.0)
    y = np.stack([3 * t + 1, -0.5 * t], axis=1)
    np.testing.assert_allclose(al.fits.late_slopes(t, y, start=40), [3.0, -0.5])
    norm = np.stack([2 * t, 4 * t], axis=1)
    np.testing.assert_allclose(al.fits.late_slopes((t, norm), y, start=40), [1.5, -0.125])
    np.testing.assert_allclose(al.fits.late_slopes(t[1:], np.exp(y[1:, :1]), start=10, log_y=True), [3.0])
    # the end-to-end difference, not a fit: a kink before the window does not count
    log_y = np.where(t < 20, -5 * t, -100 - 0.5 * (t - 20))[:, None]
    np.testing.assert_allclose(al.fits.late_decay(t, t, log_y, start=20), [0.5])
    np.testing.assert_allclose(al.fits.late_decay(t, 2 * t, log_y, start=20), [0.25])
    with pytest.raises(ValueError):
        al.fits.late_decay(t, t, log_y, start=100)
    with pytest.raises(ValueError):
        al.fits.late_slopes(t, y, start=100)


def test_running_half_decade_slopes_follow_a_changing_slope():
    t = al.log_steps(10_000)[1:]
    y = np.where(t < 300, 2 * np.log(t), 2 * np.log(300) + np.log(t / 300))[:, None]
    ends, s = al.fits.running_half_decade_slopes(t, y, 30)
    assert ends[0] >= 30 and s.shape == (len(ends), 1)
    np.testing.assert_allclose(s[ends <= 300 / 10**0.5 * 0.99, 0], 2.0)
    np.testing.assert_allclose(s[ends >= 300 * 10**0.5 * 1.01, 0], 1.0)


def test_ends_off_opt_local_selection_and_off_opt_runs():
    prob = _local_case()
    probs = [prob, al.experiments.fast_rates.reduced_tokens(6, 8, 16, [0], size=42, family="global")[0].problem]
    sols = al.experiments.fast_rates.solve_each(probs)
    ngd = al.train_many(probs, 300, "ngd", 1.0)
    assert al.experiments.fast_rates.ends_off_opt(probs, ngd).tolist() == [0]
    where = al.experiments.fast_rates.local_selection(prob, ngd.final[0], sols[0])
    assert where["off"].tolist() == [4] and where["locally_optimal"] and not where["neighbour"]
    assert where["to_local"] < 0.1 < where["to_opt"]  # heading to W_mm(alpha), not to W_mm
    polyak = al.train_many(probs, 300, "polyak", 1.0, polyak_max_step=100.0)
    assert (
        polyak.stopped[0] is not None
        and al.experiments.fast_rates.ends_off_opt(probs, polyak, unstopped=True).size == 0
    )
    cmp = al.experiments.fast_rates.compare_methods(probs, sols, 300, {"gd": 50.0, "ngd": 1.0})
    off = al.experiments.fast_rates.off_opt_runs(probs, cmp, sols)
    assert [k for k, _ in off["ngd_local"]] == [0] and off["gd_local"] + off["gd_slow"] in ([0], [])
    assert (
        al.experiments.fast_rates.off_opt_runs(probs, cmp, [None, sols[1]])["ngd_local"] == []
    )  # infeasible: never counted
    table = al.experiments.fast_rates.local_selection_table([(16, 16, where)])
    assert table.count("\n") == 2 and "| 16 | 16 | [4] | True | no |" in table


def test_selection_sweep_certifies_solves_and_tabulates():
    probs = [r.problem for r in al.experiments.fast_rates.reduced_tokens(6, 8, 2, range(8), size=42, family="random")]
    probs.append(_local_case())
    sweep = al.experiments.fast_rates.selection_sweep(probs, 300, 1.0)
    assert sweep.status[-1] == "solver" and not sweep.selects_opt[-1]
    assert np.all(sweep.status[sweep.selects_opt] == "certified")
    for k in np.flatnonzero(sweep.status == "infeasible"):
        with pytest.raises(al.InfeasibleError):
            al.max_margin(probs[k])
    groups = [2] * 8 + [16]
    fraction, table = sweep.table(groups)
    assert fraction[16] == 0.0 and table.splitlines()[-1] == "| 16 | 0 | 1 | 0 | 0.00 |"
    feas = sweep.feasible[:8]
    assert np.isnan(fraction[2]) if not feas.any() else np.isclose(fraction[2], sweep.selects_opt[:8][feas].mean())


def test_feasibility_and_fitted_rates_tables():
    sols = al.experiments.fast_rates.solve_each([al.datasets.single_input(), al.datasets.single_input(third_score=0.5)])
    table = al.experiments.fast_rates.feasibility_table([1, 2], [sols[0], None])
    assert table.splitlines()[2] == f"| 1 | 1 | 1 | {1 / sols[0].margin:.3f} |" and table.endswith("| 2 | 1 | 0 | – |")
    keys = [cell[2] for row in al.experiments.fast_rates.FITTED_RATES for cell in row[1:]]
    assert len(keys) == len(set(keys)) == 12
    table = al.experiments.fast_rates.fitted_rates_table({k: i / 8 for i, k in enumerate(keys)})
    assert "slope / η = 0.125" in table and table.count("|") == 6 * 8
    with pytest.raises(KeyError):
        al.experiments.fast_rates.fitted_rates_table({})


def test_svm_feasibility_agrees_with_max_margin_and_certifies():
    probs = [r.problem for r in al.experiments.fast_rates.reduced_tokens(6, 8, 2, range(12), size=42, family="random")]
    probs += [_local_case(), al.datasets.single_input()]
    verdicts = [al.svm.svm_feasibility(p) for p in probs]
    assert False in verdicts and True in verdicts
    for p, v in zip(probs, verdicts):
        if v is not None:
            assert v == (al.experiments.fast_rates.solve_each([p])[0] is not None)
    alpha = np.array([3, 4, 3, 3, 1, 1])  # the local selection NGD ends at on _local_case()
    assert al.svm.svm_feasibility(_local_case(), alpha) is True
