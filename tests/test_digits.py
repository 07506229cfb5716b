"""Digit patches as tokens (chapter 6): layout, labels, positional code, the head, bad inputs."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import attnlib as al  # noqa: E402


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


def test_patch_images_draws_one_axes_montage():
    data = al.datasets.digit_patches(n=6)
    fig, ax = plt.subplots()
    al.figures.real_tokens.patch_images(
        ax,
        data.images,
        data.patch,
        weights=np.full((6, data.T), 0.5),
        boxes=[0, [(1, "tab:blue", "--")], None, [(2, "tab:red"), (3, "k")], 1, 2],
        frames=["tab:green", None, None, None, None, None],
        titles=[f"{k}" for k in range(6)],
        ncols=3,
        grid=True,
    )
    assert len(ax.images) == 2  # the montage and the veil
    assert len(ax.patches) == 1 + 1 + 2 + 1 + 1 + 1  # boxes, then the one frame
    assert ax.images[0].get_array().shape == (2 * (8 + 2 + 3) - 2, 3 * (8 + 2) - 2)
    al.figures.real_tokens.patch_images(ax, data.images[0], data.patch, boxes=1)  # a single image
    plt.close(fig)


@pytest.mark.parametrize("n", [4, 8])
def test_w_svm_at_least_as_feasible_and_no_longer_than_p_svm(n):
    # W = p e_1^T / pos_scale reproduces every logit of p (test above), so the W-SVM is feasible wherever the
    # p-SVM is and its minimum norm is at most |p_mm*| / pos_scale (chapter 6 states it in prose).
    data = al.datasets.digit_patches(n=n, seed=0)
    v = al.experiments.real_tokens.fit_patch_head(data.X, data.y)
    p_sol = al.max_margin(al.prompt_attention(data.X, data.y, v))
    W_sol = al.max_margin(al.self_attention(data.X, data.y, v))
    assert np.linalg.norm(W_sol.theta) <= np.linalg.norm(p_sol.theta) * (1 + 1e-6)


def test_offset_exponent_separates_a_bounded_offset_from_a_fixed_angle():
    d = np.array([1.0, 0.0, 0.0])
    start = np.array([[10.0, 2.0, 1.0], [10.0, 2.0, 1.0], [10.0, 2.0, 1.0]])
    end = np.array([[80.0, 2.0, 1.0], [80.0, 16.0, 8.0], [80.0, 2.0 * 8**0.5, 8**0.5]])
    assert np.allclose(
        al.metrics.offset_exponent(start, end, d), [0.0, 1.0, 0.5], atol=0.01
    )  # the last: offset ~ norm^(1/2)
    # Matrices (W) are measured in the Frobenius norm, with a batch axis.
    W0, W1 = np.eye(2)[None] * [[[10.0]]], np.eye(2)[None] * [[[40.0]]]
    W0[..., 0, 1], W1[..., 0, 1] = 1.0, 4.0
    assert np.allclose(al.metrics.offset_exponent(W0, W1, np.eye(2)), 1.0)
    # On a run of the paper's single-input instance: the global SVM gives a small exponent, a wrong one about 1.
    prob = al.datasets.single_input()
    run = al.train(prob, np.zeros((1, 3)), 2000, method="ngd", lr=0.1, record_steps=[0, 500, 2000])
    right = al.metrics.offset_exponent(run.theta[1, 0], run.theta[2, 0], al.max_margin(prob).theta)
    wrong = al.metrics.offset_exponent(run.theta[1, 0], run.theta[2, 0], al.max_margin(prob, [1]).theta)
    assert right < 0.5 < wrong and wrong > 0.9


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


@pytest.fixture(scope="module")
def small_study():
    data = al.datasets.digit_patches(n=60, seed=0)
    v = al.experiments.real_tokens.fit_patch_head(data.X[:40], data.y[:40])
    pool = data.subset(slice(40, None))
    problems, solutions = al.experiments.real_tokens.nested_svms(pool, v, [2, 4, 8])
    return pool, v, problems, solutions


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
