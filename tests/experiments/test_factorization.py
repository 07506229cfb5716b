"""Chapter experiments: attnlib.experiments.factorization."""

import numpy as np
import pytest

import attnlib as al
from attnlib import paths  # noqa: E402
from attnlib.experiments import local_convergence as local  # noqa: E402
from attnlib.svm import svm_constraints, svm_pair_batch


def test_rank_grid_counts_infeasible_apart():
    grid = al.experiments.factorization.svm_rank_grid(configs=[(5, 5), (10, 5)], ds=[1, 3, 6], seeds=range(4))
    ranks = grid.ranks(1e-6)
    assert ranks.shape == (2, 2, 3, 4) and grid.fallbacks == 0
    assert np.all((ranks >= 1) == grid.feasible[None])  # never a rank for an infeasible instance
    assert np.all(ranks[:, :, 0] == -1)  # d = 1: infeasible
    assert grid.feasible[:, -1].all()  # d = 6 ≥ max(n, T − 1) for n = 5; and for n = 10? not required
    r = ranks[:, grid.feasible]
    assert np.all(r[1] <= r[0])
    assert np.nanmax(grid.accuracy) < 1e-8
    assert np.isnan(grid.mean_rank(1e-6)[:, :, 0]).all()


def test_train_kq_grid_is_the_unpadded_run():
    W = al.experiments.factorization.train_kq_grid([(5, 4)], [2, 4], range(3), steps=40, seed=1)
    assert W.shape == (1, 2, 3, 4, 4) and np.all(W[0, 0, :, 2:, :] == 0) and np.all(W[0, 0, :, :, 2:] == 0)
    K0, Q0 = al.optim.kq_init(3, 2, 2, seed=1)
    for j in range(3):
        X, y, u, Z, _ = al.datasets.rank_instance(5, 4, 2, j)
        traj = al.optim.train_kq(al.self_attention(X, y, u, Z), K0[j], Q0[j], 40, "ngd", 0.1, normalize="separate")
        np.testing.assert_allclose(W[0, 0, j, :2, :2], traj.final[0], rtol=1e-10, atol=1e-12)
    mask = np.zeros((1, 2, 3), bool)
    mask[0, 1, 0] = True
    Wm = al.experiments.factorization.train_kq_grid([(5, 4)], [2, 4], range(3), steps=40, seed=1, mask=mask)
    assert np.isnan(Wm[0, 0]).all() and np.array_equal(Wm[0, 1, 0], W[0, 1, 0])


def test_trained_kq_spectra_are_relative_and_skip_infeasible():
    grid = al.experiments.factorization.svm_rank_grid(configs=[(5, 5)], ds=[1, 6], seeds=range(3))
    sv = grid.trained_kq_spectra(steps=300)
    assert sv.shape == (1, 2, 3, 6) and np.isnan(sv[0, 0]).all()  # d = 1: infeasible, not trained
    np.testing.assert_allclose(sv[0, 1, :, 0], 1.0)
    # the start K0 Q0ᵀ has full rank; after training, the rank at 0.01 is below d, like the nuclear SVM's
    assert np.all(al.metrics.numerical_rank(grid.trained_kq_spectra(steps=0)[0, 1], 1e-6) == 6)
    assert np.all(al.metrics.numerical_rank(sv[0, 1], 0.01) < 6) and np.all(grid.ranks(1e-6)[1, 0, 1] < 6)


def test_local_convergence_is_train_and_train_kq_in_one_or_two_processes():
    probs = [al.datasets.random_tokens(4, 5, 6, seed=s, queries="cross") for s in range(3)]
    runs = [al.experiments.factorization.local_convergence(probs, 30, processes=p) for p in (1, 2)]
    stack = al.stack_problems(probs)
    W = al.train(stack, np.zeros((6, 6)), 30, "ngd", 0.1, record_steps=[30]).theta
    K0, Q0 = al.optim.kq_init(3, 6, 6, seed=0)
    KQ = al.optim.train_kq(stack, K0, Q0, 30, "ngd", 0.1, normalize="separate", record_steps=[30]).W
    for run in runs:
        assert np.array_equal(run.W["W"], W) and np.array_equal(run.W["KQ"], KQ)
        assert run.select["W"].tolist() == [p.selection(w).tolist() for p, w in zip(probs, W[-1])]
        for kind in ("W", "KQ"):  # the SVMs are those of the final selections
            sol = al.max_margin(probs[0], run.select[kind][0])
            np.testing.assert_allclose(run.svms[kind][0, 0], sol.theta, atol=1e-8)
    assert all(np.array_equal(runs[0].svms[k], runs[1].svms[k], equal_nan=True) for k in ("W", "KQ"))
    with pytest.raises(ValueError, match="processes must be 1 or 2"):
        al.experiments.factorization.local_convergence(probs, 5, processes=3)
    with pytest.raises(ValueError, match="self-attention"):
        al.experiments.factorization.local_convergence([al.datasets.loss_study(3.0)] * 2, 5)


def test_kq_svms_reuse_the_w_pairs_and_solve_only_where_the_selections_differ(monkeypatch):
    probs = [al.datasets.random_tokens(4, 5, 6, seed=s, queries="cross") for s in range(4)]
    stack = al.stack_problems(probs)
    fz = al.experiments.factorization
    opt = np.array([p.opt for p in probs])
    other = opt.copy()
    other[[1, 3], 0] = (opt[[1, 3], 0] + 1) % 5  # two problems where the halves select differently
    svms_w, feasible_w = fz._selection_svms(stack, range(4), opt)
    solved, selection_svms = [], fz._selection_svms

    def counted(st, rows, sel):
        solved.append(list(rows))
        return selection_svms(st, rows, sel)

    monkeypatch.setattr(fz, "_selection_svms", counted)
    svms_kq, feasible_kq = fz._kq_svms(stack, other, opt, svms_w, feasible_w)
    assert solved == [[1, 3]]  # the rows where the selections differ, and only those
    for select, svms, feasible in ((opt, svms_w, feasible_w), (other, svms_kq, feasible_kq)):
        cons = [svm_constraints(*p.factors, a) for p, a in zip(probs, select)]  # each half as if solved on its own
        W, _, ok, _ = svm_pair_batch(np.stack([c[0] for c in cons]), np.stack([c[1] for c in cons]))
        assert np.array_equal(svms, W, equal_nan=True) and np.array_equal(feasible, ok)
    # the control: the halves differ where their selections differ, so a mix-up of rows would be seen
    assert not np.array_equal(svms_w[:, 1], svms_kq[:, 1], equal_nan=True)
    assert fz._kq_svms(stack, opt, opt, svms_w, feasible_w)[0] is not svms_w and solved == [[1, 3]]


def test_selection_log_gap_matches_direct_difference_and_its_gradient():
    prob = al.datasets.single_input(local=True)
    theta = np.array([[1.0, 0.5, 0.0], [2.0, -1.0, 0.0], [0.3, 3.0, 0.0]])
    floor = float(np.mean(prob.loss.value(prob.gamma[0, [1]])))
    lg, sign, g = paths.selection_log_gap(prob, [1], theta, with_grad=True)
    np.testing.assert_allclose(sign * np.exp(lg), prob.value(theta) - floor, rtol=1e-9)
    np.testing.assert_allclose(g, prob.grad(theta) / np.exp(lg)[:, None], rtol=1e-9)
    lg_far, sign_far = paths.selection_log_gap(prob, [1], np.array([800.0, 10.0, 0.0]))
    assert sign_far == 1.0 and -900 < lg_far < -700  # far below the float resolution of L


def test_local_path_converges_for_a_locally_optimal_selection_and_obeys_its_bound():
    prob = al.datasets.single_input(local=True)
    sol = al.max_margin(prob, np.array([1]))
    case = local.local_path_case(prob, sol, per_decade=2)
    assert case.locally_optimal and case.resolved
    np.testing.assert_allclose(case.path.norm, case.radii, rtol=1e-9)
    assert np.all(case.omc <= case.bound + 1e-15)
    rho = al.normalized_margin(prob, case.path.theta, np.array([1])) * np.linalg.norm(sol.theta)
    lo = local.cone_margin_bound(prob, [1], sol.theta, case.radii, case.mu, case.min_norm)
    assert np.all(rho >= lo - 1e-12)
    # the failing input of the chapter's check: the wrong reference direction (p_mm*)
    wrong = al.one_minus_cosine(case.path.theta[-1], al.max_margin(prob).theta)
    assert wrong > 1e3 * case.bound[-1]


def test_local_path_leaves_when_every_neighbour_scores_higher():
    prob = al.datasets.single_input(local=True)
    sol = al.max_margin(prob, np.array([2]))
    case = local.local_path_case(prob, sol, per_decade=1)
    assert not case.locally_optimal and case.all_higher
    assert case.leave > 0.99
    assert local.admissible_cone_angle(prob, [2], sol.theta) == 0.0
    assert np.all(local.cone_margin_bound(prob, [2], sol.theta, [10.0], 0.001, 1.0) == -np.inf)


def test_cone_too_wide_has_no_bound_and_the_path_sits_on_its_edge():
    """Fig. 1(b), α = 2: past the admissible angle token 1 (higher score) outweighs token 3 on the edge."""
    prob = al.datasets.single_input(local=True)
    sol = al.max_margin(prob, np.array([1]))
    mu = 0.05  # 18° > the admissible 5.45°
    assert np.arccos(1 - mu) > local.admissible_cone_angle(prob, [1], sol.theta)
    assert local.cone_min_norm(prob, [1], sol.theta, mu) == np.inf
    path = paths.local_regularization_path(prob, np.array([1]), [10.0, 100.0], mu, min_norm=1.0)
    np.testing.assert_allclose(al.one_minus_cosine(path.theta, sol.theta), mu, rtol=1e-6)


def test_per_seed_resolution_detects_a_common_rotation():
    fx = al.experiments.factorization
    rng = np.random.default_rng(0)
    refs, towards = rng.normal(size=(5, 3, 3)), rng.normal(size=(5, 3, 3))
    rotated = fx.rotate_each(refs, towards, 7.0)
    assert np.allclose(fx.angles_degrees(refs, rotated), 7.0)
    # a median-angle check at 3 degrees against the references themselves resolves 3 degrees
    res = fx.per_seed_resolution(lambda r: np.median(fx.angles_degrees(refs, r)) <= 3.0, refs, towards)
    assert abs(res - 3.0) < 1e-2


def test_train_w_grid_is_the_w_control():
    W = al.experiments.factorization.train_kq_grid([(5, 4)], [4], range(2), steps=30, factorised=False)
    prob = al.datasets.rank_instance(5, 4, 4, 0)
    X, y, u, Z, _ = prob
    run = al.train(al.self_attention(X, y, u, Z), np.zeros((4, 4)), 30, "ngd", 0.1, progress=False)
    assert np.allclose(W[0, 0, 0], run.final, atol=1e-10)


def test_plane_instances_are_the_official_families():
    fx = al.experiments.factorization
    X, y, u, Z, opt = fx.plane_instance(5, 3)
    assert X.shape == (2, 5, 2) and X[0, 0].tolist() == [1.0, 0.5] and X[1, 0].tolist() == [1.0, -0.5]
    assert np.allclose(np.linalg.norm(Z, axis=1), 1) and np.isclose(np.linalg.norm(u), 1) and np.all(y == 1)
    assert opt.tolist() == np.argmax(X @ u, axis=1).tolist()
    X3 = fx.plane_instance(3, 3)[0]
    assert X3.shape == (2, 3, 2) and X3[0, :, 0].mean() < 0 < X3[1, :, 0].mean()  # the two clusters
    assert not np.array_equal(fx.plane_instance(3, 4)[0], X3)  # a fresh seed is a fresh draw
    with pytest.raises(ValueError, match="T must be one of"):
        fx.plane_instance(4, 0)


def test_plane_paths_are_the_library_runs_and_their_own_svms():
    fx = al.experiments.factorization
    run = fx.plane_paths(draws=[0, 1], steps=40, seed=2)
    rng = np.random.default_rng(2)
    K0 = 0.1 * rng.standard_normal((2, 2, 2, 2))  # (family, draw, 2, 2), as plane_paths draws them
    for f, T in enumerate(run.Ts):
        for j in range(2):
            X, y, u, Z, _ = fx.plane_instance(T, j)
            prob = al.self_attention(X, y, u, Z)
            W = al.train(prob, np.zeros((1, 2, 2)), 40, "ngd", 0.1, progress=False).final[0]
            KQ = al.optim.train_kq(prob, K0[f, j], np.zeros((2, 2)), 40, "ngd", 0.1, normalize="separate").final[0]
            np.testing.assert_allclose(run.W[-1, f, j, 0], W, rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(run.W[-1, f, j, 1], KQ, rtol=1e-9, atol=1e-12)
            for kind in (0, 1):
                select = run.select[f, j, kind]
                assert select.tolist() == prob.selection(run.W[-1, f, j, kind]).tolist()
                # the nuclear SVM against the independent solver (Clarabel on the SDP): the same optimal
                # nuclear norm, and feasible (a nuclear-norm minimiser need not be unique)
                nuc, ref = run.svms[1, f, j, kind], al.svm.nuclear_svm(X, Z, select).W
                norm = lambda M: np.linalg.svd(M, compute_uv=False).sum()  # noqa: E731
                assert abs(norm(nuc) - norm(ref)) <= 1e-7 * norm(ref)
                a, z = al.svm.svm_constraints(X, Z, select)
                assert np.min(np.einsum("kd,de,ke->k", a, nuc, z)) >= 1 - 1e-9
                np.testing.assert_allclose(run.svms[0, f, j, kind], al.max_margin(prob, select).theta, atol=1e-6)


def test_train_kq_grid_both_is_the_two_runs():
    fx = al.experiments.factorization
    both = fx.train_kq_grid([(5, 4)], [2, 4], range(2), steps=30, seed=1, factorised="both")
    kq = fx.train_kq_grid([(5, 4)], [2, 4], range(2), steps=30, seed=1)
    w = fx.train_kq_grid([(5, 4)], [2, 4], range(2), steps=30, seed=1, factorised=False)
    assert both.shape == (2, 1, 2, 2, 4, 4)
    np.testing.assert_allclose(both[0], kq, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(both[1], w, rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="factorised"):
        fx.train_kq_grid([(5, 4)], [2], range(1), steps=3, factorised="yes")


def test_feasibility_construction_is_feasible_and_bounds_the_frobenius_svm():
    from attnlib.experiments import factorization as ex

    for n, T, d in [(5, 5, 5), (3, 8, 10), (10, 5, 10)]:
        X, _, _, Z, opt = al.datasets.rank_instance(n, T, d, 0)
        W = ex.feasibility_construction(X, Z, opt)
        a, z = al.svm.svm_constraints(X, Z, opt)
        assert np.allclose(np.einsum("kd,de,ke->k", a, W, z), 1.0)
        fro = al.svm.frobenius_svm_batch(a[None], z[None]).W[0]
        assert np.linalg.norm(fro) <= np.linalg.norm(W) * (1 + 1e-12)
    X, _, _, Z, opt = al.datasets.rank_instance(5, 5, 3, 0)  # d < max(n, T - 1): the proof does not apply
    with pytest.raises(ValueError, match="independent"):
        ex.feasibility_construction(X, Z, opt)


def test_rescaled_norm_is_scale_free_and_the_independent_solver_agrees_with_the_batch():
    from attnlib.experiments import factorization as ex

    X, _, _, Z, opt = al.datasets.rank_instance(5, 5, 10, 1)
    a, z = al.svm.svm_constraints(X, Z, opt)
    batch = al.svm.nuclear_svm_batch(a[None], z[None])
    upper = ex.rescaled_norm(a[None], z[None], batch.W, "nuc")
    assert np.allclose(ex.rescaled_norm(a[None], z[None], 3.0 * batch.W, "nuc"), upper)
    norms, accuracy = ex.independent_nuclear_norms([(X, Z, opt)])
    assert abs(upper[0] / norms[0] - 1) <= batch.gap[0] + accuracy[0]
    # the Frobenius SVM, feasible but not of least nuclear norm, is longer in it
    fro = al.svm.frobenius_svm_batch(a[None], z[None]).W
    assert ex.rescaled_norm(a[None], z[None], fro, "nuc")[0] > norms[0] * (1 + 1e-3)
    assert ex.rescaled_norm(a[None], z[None], -batch.W, "nuc")[0] == np.inf  # separates nothing


def test_the_kq_mutant_drops_the_transpose_of_the_q_gradient():
    """The planted (K, Q) error of attnlib.book.mutants: ∇_W K in place of ∇_Wᵀ K (in a fresh process)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import numpy as np, attnlib as al\n"
        "from attnlib.book import mutants\n"
        "rng = np.random.default_rng(0)\n"
        "G, K, Q = rng.normal(size=(4, 4)), rng.normal(size=(4, 2)), rng.normal(size=(4, 2))\n"
        "assert np.allclose(al.model.factor_grad(G, K, Q)[1], G.T @ K)\n"
        "mutants.apply('kq_gradient_untransposed')\n"
        "gK, gQ = al.model.factor_grad(G, K, Q)\n"
        "assert np.allclose(gK, G @ Q) and np.allclose(gQ, G @ K) and not np.allclose(gQ, G.T @ K)\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("ATTNLIB_MUTANT", None)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-800:]
