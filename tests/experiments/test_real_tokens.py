"""Chapter experiments: attnlib.experiments.real_tokens."""

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import attnlib as al  # noqa: E402


@pytest.fixture(scope="module")
def small_study():
    data = al.datasets.digit_patches(n=60, seed=0)
    v = al.experiments.real_tokens.fit_patch_head(data.X[:40], data.y[:40])
    pool = data.subset(slice(40, None))
    problems, solutions = al.experiments.real_tokens.nested_svms(pool, v, [2, 4, 8])
    return pool, v, problems, solutions


def test_head_solves_the_normal_equations_and_scores_patches():
    data = al.datasets.digit_patches(n=60, seed=0)
    v = al.experiments.real_tokens.fit_patch_head(data.X, data.y, ridge=0.5)
    F = data.X.reshape(-1, data.d)
    target = np.repeat(data.y, data.T)
    assert np.allclose((F.T @ F + 0.5 * np.eye(data.d)) @ v, F.T @ target)
    # The head is better than chance on single patches of its own training images.
    assert np.mean(np.sign(F @ v) == target) > 0.6
    prob = al.prompt_attention(data.X, data.y, v)
    assert prob.gamma.shape == (60, data.T)


def test_w_svm_contains_p_svm_through_the_position_code():
    # z_i = x_i1 carries pos_scale * e_1, so W = p e_1^T / pos_scale reproduces every logit of p.
    data = al.datasets.digit_patches(n=6, seed=0, pos_scale=2.0)
    v = al.experiments.real_tokens.fit_patch_head(data.X, data.y)
    p = np.random.default_rng(0).normal(size=data.d)
    a = np.zeros(data.d)
    a[data.patch**2] = 1.0 / data.pos_scale
    W = np.outer(p, a)
    prompt, selfatt = al.prompt_attention(data.X, data.y, v), al.self_attention(data.X, data.y, v)
    assert np.allclose(prompt.logits(p), selfatt.logits(W))


def test_bad_head_arguments_and_patch_index():
    data = al.datasets.digit_patches(n=4)
    with pytest.raises(ValueError, match="ridge"):
        al.experiments.real_tokens.fit_patch_head(data.X, data.y, ridge=0.0)
    with pytest.raises(ValueError, match="labels"):
        al.experiments.real_tokens.fit_patch_head(data.X, 2 * data.y)
    with pytest.raises(ValueError, match="X must be"):
        al.experiments.real_tokens.fit_patch_head(data.X[0], data.y)
    with pytest.raises(ValueError, match="patch index"):
        data.corner(data.T)
    with pytest.raises(ValueError, match="last axis"):
        data.patch_map(np.ones(3))


@pytest.mark.parametrize("n", [4, 8])
def test_w_svm_at_least_as_feasible_and_no_longer_than_p_svm(n):
    # W = p e_1^T / pos_scale reproduces every logit of p (test above), so the W-SVM is feasible wherever the
    # p-SVM is and its minimum norm is at most |p_mm*| / pos_scale (chapter 6 states it in prose).
    data = al.datasets.digit_patches(n=n, seed=0)
    v = al.experiments.real_tokens.fit_patch_head(data.X, data.y)
    p_sol = al.max_margin(al.prompt_attention(data.X, data.y, v))
    W_sol = al.max_margin(al.self_attention(data.X, data.y, v))
    assert np.linalg.norm(W_sol.theta) <= np.linalg.norm(p_sol.theta) * (1 + 1e-6)


def test_follow_selection_judges_a_run_against_its_own_selection():
    # Fig. 1(b) of [MMTS]: from (0, -1) NGD ends on the local selection (token 1), not on opt (token 0).
    prob = al.datasets.single_input(local=True)
    run = al.train(prob, np.array([0.0, -1.0, 0.0]), 2000, lr=0.1, record_steps=[0, 500, 2000])
    cache = {}
    r = al.experiments.real_tokens.follow_selection(prob, run.theta[:, 0], window=1, cache=cache)
    assert r["select"].tolist() == [1] and r["agree"] == 0.0 and r["rank"].tolist() == [1]
    assert r["local"] and r["feasible_sel"] and r["settled"] and r["saturated"] == 1.0
    assert np.isclose(r["omc_sel"], al.one_minus_cosine(run.final[0], al.max_margin(prob, [1]).theta))
    assert r["growth"] > 3 and r["exponent"] < 0.5
    assert list(cache) == [(1,)]  # the SVM of the selection is solved once per problem
    # Without a window: no settled/growth/exponent; a start that has not moved is not saturated.
    still = al.experiments.real_tokens.follow_selection(prob, np.zeros((1, 3)), cache=cache)
    assert "exponent" not in still and still["saturated"] == 0.0 and still["agree_min"] == still["agree"]
    with pytest.raises(ValueError, match="window"):
        al.experiments.real_tokens.follow_selection(prob, run.theta[:, 0], window=3)
    with pytest.raises(ValueError, match="theta must be"):
        al.experiments.real_tokens.follow_selection(prob, run.theta[-1, 0])


def test_digit_table_is_scikit_learns_without_importing_it():
    from sklearn.datasets import load_digits

    from attnlib.datasets import _digits_table

    images, target = _digits_table()
    raw = load_digits()
    assert np.array_equal(images, raw.images) and np.array_equal(target, raw.target)
    assert not images.flags.writeable  # cached: nobody may change it


def test_score_spread_is_zero_exactly_under_equal_scores():
    assert al.experiments.real_tokens.score_spread([[3.0, 1.0, 1.0, 1.0], [0.0, 2.0, 0.0, 0.0]]) == 0.0
    assert al.experiments.real_tokens.score_spread([[3.0, 2.0, 1.0]]) == 0.5  # others span 1 of the range 2
    assert al.experiments.real_tokens.score_spread([[0.0, 1.0, 2.0], [4.0, 0.0, 4.0 - 1e-9]]) == pytest.approx(
        0.5 * (0.5 + 1.0)
    )
    with pytest.raises(ValueError, match="T >= 3"):
        al.experiments.real_tokens.score_spread([[1.0, 0.0]])


def test_nested_svms_are_the_svms_of_the_first_n_images(small_study):
    pool, v, problems, solutions = small_study
    assert sorted(problems) == sorted((k, n) for k in ("p", "W") for n in (2, 4, 8))
    for (kind, n), prob in problems.items():
        assert prob.n == n and prob.shape == ((20,) if kind == "p" else (20, 20))
        assert np.array_equal(prob.gamma, pool.y[:n, None] * (pool.X[:n] @ v))
        sol = solutions[kind, n]
        if sol is not None:  # the optimal patches' SVM: every gap at least 1, with equality somewhere
            gaps = prob.logits(sol.theta)[np.arange(n), prob.opt][:, None] - prob.logits(sol.theta)
            gaps[np.arange(n), prob.opt] = np.inf
            assert gaps.min() == pytest.approx(1.0, abs=1e-6)


def test_gap_cone_start_keeps_every_gap_of_the_selection(small_study):
    _, _, problems, solutions = small_study
    for key, sol in solutions.items():
        if sol is None:
            continue
        prob = problems[key]
        start = al.experiments.real_tokens.gap_cone_start(prob, sol, 10.0, rng=1)
        assert start.shape == prob.shape
        assert np.linalg.norm(start) == pytest.approx(10.0 * np.linalg.norm(sol.theta))
        logits = prob.logits(start)
        gaps = logits[np.arange(prob.n), prob.opt][:, None] - logits
        gaps[np.arange(prob.n), prob.opt] = np.inf
        # cos(phi) * 10 - sin(phi) * 10 |theta_mm| * widest >= (sqrt(3)/2 - 1/2) * 10 with sin(phi) <= 1/2
        assert gaps.min() >= (np.sqrt(3) / 2 - 0.5) * 10.0 - 1e-9
        assert 0 < al.one_minus_cosine(start, sol.theta) < 0.14  # tilted, by at most 30 degrees


def test_selection_study_follows_every_run_and_sums_up(small_study):
    _, _, problems, solutions = small_study
    study = al.experiments.real_tokens.selection_study(problems, solutions, 400, 0.1, 100, 40.0, 10.0, rng=0)
    feasible = study.feasible
    assert study.record[study.window] == 100 and 100 in study.record and study.record[-1] == 400
    for key in problems:
        assert study.ngd[key + ("zero",)].shape == (len(study.record),) + problems[key].shape
        assert (key + ("cone",) in study.ngd) == feasible[key] and study.gd[key].shape[0] == 2
        assert np.array_equal(study.ngd[key + ("zero",)][0], np.zeros(problems[key].shape))
    for key, r in study.results.items():
        assert 0 <= r["agree"] <= 1 and ("saturated_at_gd" in r) == (key[2] == "ngd")
        assert np.isnan(r["omc_opt"]) != feasible[key[:2]]
    cone = [study.results[k + ("ngd", "cone")]["agree_min"] for k in problems if feasible[k]]
    assert cone and min(cone) == 1.0  # the local theorem from the cone, on small sizes
    for r in study.judged.values():
        assert r["settled"] and r["local"] and r["growth"] >= 2
    for c in study.offset_curves():
        assert c["norm"][0] == c["offset"][0] == 1.0 and len(c["norm"]) == len(study.record) - study.window
    summary = study.summary()
    assert summary["judged_runs"] == len(study.judged) and summary["ngd_runs"] == len(problems)
    assert summary["zero_feasible_count"] == sum(feasible.values())
    assert len(study.table().splitlines()) == 1 + len(study.results)


def test_attention_run_trains_a_readers_own_setting(small_study):
    pool, v, problems, solutions = small_study
    prob, theta = al.experiments.real_tokens.attention_run(pool, v, 4, "p", "zero", 200, 0.1, 10.0)
    assert prob.n == 4 and theta.shape == (20,) and np.linalg.norm(theta) == pytest.approx(20.0, rel=0.05)
    prob, theta = al.experiments.real_tokens.attention_run(pool, v, 2, "W", "cone", 50, 0.1, 10.0, rng=0)
    assert theta.shape == (20, 20) and np.all(prob.selection(theta) == prob.opt)
    with pytest.raises(ValueError, match="kind"):
        al.experiments.real_tokens.attention_run(pool, v, 4, "q", "zero", 10, 0.1, 10.0)
    with pytest.raises(ValueError, match="n must be"):
        al.experiments.real_tokens.attention_run(pool, v, 1, "p", "zero", 10, 0.1, 10.0)
    infeasible = [
        n for n in range(2, pool.n) if al.experiments.real_tokens.nested_svms(pool, v, [n])[1]["p", n] is None
    ][:1]
    if infeasible:
        with pytest.raises(al.InfeasibleError):
            al.experiments.real_tokens.attention_run(pool, v, infeasible[0], "p", "cone", 10, 0.1, 10.0)


def _race(steps=30):
    sets = [al.datasets.digit_patches(patch=4, n=40, seed=s) for s in (0, 1)]
    lrs = {"gd": 10.0, "ngd": 1.0, "polyak": 0.5}
    slow = [("GD, step/10", "gd", False, 1.0)]
    return al.experiments.real_tokens.optimizer_race(sets, 12, steps, lrs, 4, seed=0, extra=slow)


def test_optimizer_race_shapes_and_records():
    race = _race()
    R = len(race.steps)
    assert race.labels == ("GD 10", "NGD 1", "Polyak 0.5", "SGD 10", "SNGD 1", "SPS 0.5", "GD, step/10")
    assert race.loss.shape == race.top_mass.shape == race.test_accuracy.shape == (R, 2, 7)
    assert race.W.shape == (R, 2, 7, 20, 20) and race.u.shape == (R, 2, 7, 20)
    assert np.allclose(race.loss[0], np.log(2)) and np.allclose(race.top_mass[0], 1 / 4)  # W = u = 0
    assert np.allclose(race.test_accuracy[0], 0.5)  # u = 0: every output a tie
    assert race.train[0].n == 12 and race.test[0].n == 28
    # the recorded loss is the full training loss of each set
    D = race.train[1]
    J = al.model.joint_self_attention(D.X, D.y, Z=al.experiments.real_tokens.pooled_queries(D.X))
    assert np.isclose(race.loss[-1, 1, 2], J.value(race.W[-1, 1, 2].ravel(), race.u[-1, 1, 2]))
    first = race.steps_to(0.5)
    assert first.shape == (2, 7) and np.all(np.isin(first[np.isfinite(first)], race.steps))
    assert np.all(np.isinf(race.steps_to(0.0)))
    assert race.selections().shape == (2, 7, 12)


def test_selection_svm_correlations_and_controls():
    race = _race(steps=60)
    corr = al.experiments.real_tokens.selection_svm_correlations(race, [(0, 1), (1, 4)], seed=0)
    for key in [(0, 1), (1, 4)]:
        c = corr[key]
        assert c is None or (c["curve"].shape == race.steps.shape and -1 <= c["shifted"] <= 1)
    sel = race.selections()[0, 1]
    D = race.train[0]
    prob = al.self_attention(D.X, D.y, race.u[-1, 0, 1], Z=al.experiments.real_tokens.pooled_queries(D.X))
    if corr[0, 1] is not None:  # the curve ends at the final W's cosine with its own selection's W-SVM
        own = al.max_margin(prob, select=sel).theta
        assert np.isclose(corr[0, 1]["curve"][-1], al.cosine(race.W[-1, 0, 1], own))
    top = al.experiments.real_tokens.unit_norm_top_mass(race)
    assert top.shape == (2, 7) and np.all((top >= 1 / 4 - 1e-12) & (top <= 1))


def test_pooled_queries_rejects_bad_shape():
    with pytest.raises(ValueError, match="X must"):
        al.experiments.real_tokens.pooled_queries(np.ones((3, 4)))


def test_optimizer_race_best_of_grid():
    sets = [al.datasets.digit_patches(patch=4, n=30, seed=s) for s in (0, 1)]
    lrs = {"gd": [1.0, 10.0], "ngd": 1.0, "polyak": 0.5}
    race = al.experiments.real_tokens.optimizer_race(sets, 12, 40, lrs, 4)
    assert race.labels[:3] == ("GD 1", "GD 10", "NGD 1") and race.grid("GD") == [0, 1] and race.grid("SGD") == [4, 5]
    first, columns = race.best("GD", 0.3)
    reach = race.steps_to(0.3)[:, :2]
    reach = np.where(np.isfinite(reach), reach, 41)
    assert np.array_equal(first, reach.min(axis=1)) and np.all(np.isin(columns, [0, 1]))
    with pytest.raises(ValueError, match="label must be one of"):
        race.best("Adam", 0.3)
