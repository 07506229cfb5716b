"""Chapter experiments: attnlib.experiments.fast_rates."""

import numpy as np
import pytest

import attnlib as al
from attnlib.experiments import fast_rates as ex


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


def test_one_token_off_changes_only_sequence_zero():
    prob = al.datasets.random_tokens(4, 5, 6, 2)
    alpha = ex.one_token_off(prob)
    assert alpha[0] != prob.opt[0]
    np.testing.assert_array_equal(alpha[1:], prob.opt[1:])
    assert alpha[0] == np.argsort(-prob.gamma[0], kind="stable")[1]


def test_margins_match_the_svm_and_fall_when_the_direction_turns():
    probs = [al.model.reduce_to_span(al.datasets.random_tokens(3, 4, 6, s, family="global")).problem for s in (1, 2)]
    sols = [al.max_margin(p) for p in probs]
    R = np.stack([s.theta.ravel() for s in sols])
    np.testing.assert_allclose(ex.margins(probs, R), [s.margin for s in sols], rtol=1e-9)
    turned = al.metrics.rotate_toward(R, al.metrics.orthogonal_partners(R), 5.0)
    assert np.all(ex.margins(probs, turned) < np.array([s.margin for s in sols]))


def test_budget_gain_is_gd_inverse_log_rate():
    assert ex.budget_gain(np.e**2, np.e**2) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="clock"):
        ex.budget_gain(0.5, 10)


@pytest.mark.parametrize("method, lr", [("gd", 2.0), ("ngd", 0.3)])
def test_logistic_descent_is_the_trainer_on_logistic_regression(method, lr):
    """The vectorised logistic-regression GD/NGD matches al.train_many on the same problems (every
    record of theta, loss, gap and gradient norm), and compare_logistic matches compare_methods."""
    data = [al.datasets.separable_data(15, 3, s) for s in range(4)]
    problems = [al.model.logistic_regression(X, y) for X, y in data]
    fast = ex.logistic_descent(data, 300, method, lr)
    slow = al.train_many(problems, 300, method, lr)
    assert np.array_equal(fast.steps, slow.steps) and fast.theta.shape == slow.theta.shape
    np.testing.assert_allclose(fast.theta, slow.theta, rtol=1e-11, atol=1e-13)
    for name in ("loss", "log_gap", "log_grad_norm"):
        np.testing.assert_allclose(getattr(fast, name), getattr(slow, name), rtol=1e-10, atol=1e-12)
    assert fast.stopped == slow.stopped and fast.seconds.shape == fast.steps.shape
    sols = ex.solve_each(problems)
    a = ex.compare_logistic(data, sols, 300, {method: lr})
    b = ex.compare_methods(problems, sols, 300, {method: lr})
    np.testing.assert_allclose(a.curves[method]["direction_error"], b.curves[method]["direction_error"], rtol=1e-9)
    # the control: another step size is another trajectory
    assert not np.allclose(ex.logistic_descent(data, 300, method, 2 * lr).theta[-1], slow.theta[-1], rtol=1e-3)


def test_logistic_descent_rejects_a_bad_method_and_record():
    data = [al.datasets.separable_data(10, 2, 0)]
    with pytest.raises(ValueError, match="method"):
        ex.logistic_descent(data, 10, "polyak", 1.0)
    with pytest.raises(ValueError, match="record"):
        ex.logistic_descent(data, 10, "gd", 1.0, record=[0, 20])
    with pytest.raises(ValueError, match="lr"):
        ex.logistic_descent(data, 10, "gd", float("inf"))


# ------------------------------------------------------- the sequence-by-sequence sparsification check
def test_sequence_margins_and_the_one_token_off_svm():
    probs = [r.problem for r in al.experiments.fast_rates.reduced_tokens(6, 8, 10, [3, 4], size=42, family="global")]
    sols = al.experiments.fast_rates.solve_each(probs)
    refs = [s.theta.ravel() for s in sols]
    per_seq = al.experiments.fast_rates.sequence_margins(probs, refs)
    np.testing.assert_allclose(per_seq.min(axis=1), al.experiments.fast_rates.margins(probs, refs))
    assert np.all(per_seq >= np.array([s.margin for s in sols])[:, None] * (1 - 1e-6))  # every sequence >= 1/|W_mm|
    for p in probs:
        alpha = al.experiments.fast_rates.one_token_off(p)
        wrong = al.experiments.fast_rates.solve_each([p], select=alpha)[0]
        gamma = al.experiments.fast_rates.sequence_margins([p], [wrong.theta.ravel()])[0]
        assert gamma[0] <= -wrong.margin * (1 - 1e-6)  # opt below alpha_0 in the changed sequence


def test_sequence_sparsity_rates_follow_the_margins_within_the_bound_and_the_wrong_svm_does_not():
    ex = al.experiments.fast_rates
    probs = [r.problem for r in ex.reduced_tokens(6, 8, 10, [0, 1, 2], size=42, family="global")]
    sols = ex.solve_each(probs)
    run = al.train_many(probs, 1500, "ngd", 0.2)
    rates, dx = ex.sequence_sparsity_rates(probs, run.steps, run.theta, 0.2 * run.steps, 300)
    refs = np.stack([s.theta.ravel() for s in sols])
    dev = ex.sparsity_deviation(rates, ex.sequence_margins(probs, refs), dx, T=8)
    assert np.median(dev) <= 1
    wrong = np.stack([ex.solve_each([p], select=ex.one_token_off(p))[0].theta.ravel() for p in probs])
    wrong_dev = ex.sparsity_deviation(rates, ex.sequence_margins(probs, wrong), dx, T=8)
    bound = dx / (np.log(14) / np.array([s.margin for s in sols]))  # dx / (|W_mm| log(2(T - 1)))
    assert np.all(wrong_dev[dev <= 1] > bound[dev <= 1] - 1) and np.all(wrong_dev > 1)
