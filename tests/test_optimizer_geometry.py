"""The optimizer-geometry step rules, the engine hook they use, and the chapter's statistics."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import attnlib as al
from attnlib import optim
from attnlib.experiments import optimizer_geometry as og
from attnlib.figures import optimizer_geometry as og_fig

FIXTURE = Path(__file__).parent / "fixtures" / "optim_before_geometry.npz"


def test_gd_ngd_polyak_match_the_engine_before_the_hook():
    # tests/fixtures/optim_before_geometry.npz was written by attnlib at 99127ef, before
    # StepRule.moves_itself existed (script: the loop below, 200 steps, every 50th recorded). It was
    # bit-identical until the fused step of 2026-12-02 (one exp pass fewer, BLAS logits), which agrees
    # with the old formula to rounding (tests/test_model.py): the trajectories now agree to 1e-13 of
    # their size. Polyak on the random instance is the exception, and is compared by its loss: its
    # loss has a floor (0.4155 > 0 = the rule's target), so the step L / |g|^2 grows as g -> 0 and
    # amplifies any rounding difference along the floor's flat direction (3% by step 50); the losses
    # agree (2.6e-9 relative at step 50, where one member is still descending; equal from step 100).
    before = np.load(FIXTURE)
    probs = {"single": al.datasets.single_input(local=True), "w": al.datasets.random_tokens(3, 4, 3, seed=3)}
    for key, prob in probs.items():
        theta0 = np.random.default_rng(0).standard_normal((2,) + prob.shape)
        for method, lr in (("gd", 0.5), ("ngd", 0.1), ("polyak", 1.0)):
            traj = al.train(prob, theta0, 200, method=method, lr=lr, record_every=50)
            old = before[f"{key}_{method}"]
            if (key, method) == ("w", "polyak"):
                old_loss = np.array([[prob.value(t) for t in step] for step in old])
                assert np.allclose(traj.loss, old_loss, rtol=1e-8, atol=0), (key, method)
                continue
            scale = np.max(np.abs(old), axis=tuple(range(1, old.ndim)), keepdims=True)
            assert np.max(np.abs(traj.theta - old) / scale) <= 1e-13, (key, method)


def test_mirror_map_inverts_and_p2_is_gd_and_ngd():
    x = np.array([[-2.0, 0.0, 0.5]])
    for p in (1.2, 1.5, 3.0, 7.0):
        assert np.allclose(optim.inverse_mirror_map(optim.mirror_map(x, p), p), x, rtol=1e-14, atol=0)
    prob = al.datasets.multi_input()
    starts = al.datasets.MULTI_INPUT_INITS
    gd = al.train(prob, starts, 200, "gd", 1.0)
    md = al.train(prob, starts, 200, optim.MirrorDescent(p=2.0), 1.0)
    assert np.allclose(md.theta, gd.theta, rtol=1e-12, atol=1e-12)
    ngd = al.train(prob, starts, 200, "ngd", 0.1)
    nmd = al.train(prob, starts, 200, optim.MirrorDescent(p=2.0, normalized=True), 0.1)
    assert np.allclose(nmd.theta, ngd.theta, rtol=1e-11, atol=1e-11)


def test_mirror_step_is_the_dual_update():
    prob = al.datasets.random_tokens(3, 4, 3, seed=1)
    theta = np.random.default_rng(2).standard_normal((2,) + prob.shape)
    p = 3.0
    traj = al.train(prob, theta, 1, optim.MirrorDescent(p=p), 0.3)
    grad = np.stack([prob.grad(t) for t in theta])
    expected = optim.inverse_mirror_map(optim.mirror_map(theta, p) - 0.3 * grad, p)
    assert np.allclose(traj.theta[-1], expected, rtol=1e-12, atol=1e-14)


def test_steepest_moves_have_length_eta_in_their_norm_and_descend():
    prob = al.datasets.random_tokens(3, 4, 3, seed=5)
    theta = np.random.default_rng(4).standard_normal((3,) + prob.shape)
    grad = np.stack([prob.grad(t) for t in theta])
    for rule, norm in (
        (optim.SignDescent(), "linf"),
        (optim.CoordinateDescent(), "l1"),
        (optim.SpectralDescent(), "spectral"),
    ):
        moved = al.train(prob, theta, 1, rule, 0.05).theta[-1]
        step = theta - moved
        assert np.allclose(al.svm.norm_value(step, norm, prob.shape), 0.05, rtol=1e-12)
        # the steepest move: ⟨∇L, Δ⟩ equals η times the dual norm of the gradient
        dual = al.svm.norm_value(grad, al.svm.dual_norm(norm), prob.shape)
        assert np.allclose(np.sum(grad * step, axis=(1, 2)), 0.05 * dual, rtol=1e-10)


def test_adam_first_step_is_sign_and_scale_free():
    prob = al.datasets.multi_input()
    theta = al.datasets.MULTI_INPUT_INITS
    adam = al.train(prob, theta, 1, optim.Adam(), 0.01).theta[-1]
    sign = al.train(prob, theta, 1, optim.SignDescent(), 0.01).theta[-1]
    assert np.allclose(adam, sign, rtol=0, atol=1e-15)
    # moments stored relative to the gradient's scale: 50 steps equal a direct float64 Adam
    rule = optim.Adam(beta1=0.9, beta2=0.99)
    traj = al.train(prob, theta, 50, rule, 0.01)
    x, m, v = theta.copy(), np.zeros_like(theta), np.zeros_like(theta)
    for t in range(1, 51):
        g = np.stack([prob.grad(row) for row in x])
        m, v = 0.9 * m + 0.1 * g, 0.99 * v + 0.01 * g * g
        mh, vh = m / (1 - 0.9**t), v / (1 - 0.99**t)
        x = x - 0.01 * np.where(mh != 0, mh / np.sqrt(np.where(vh > 0, vh, 1.0)), 0.0)
    assert np.allclose(traj.theta[-1], x, rtol=1e-10, atol=1e-12)


def test_rule_blocks_equal_separate_runs():
    prob = al.datasets.single_input()
    starts = al.datasets.SINGLE_INPUT_INITS
    rules = (optim.step_rule("ngd"), optim.MirrorDescent(1.5, True), optim.SignDescent(), optim.Adam())
    blocks = optim.RuleBlocks(rules, (6,) * 4)
    together = al.train(prob, np.tile(starts, (4, 1)), 300, blocks, 0.1)
    for k, rule in enumerate(rules):
        alone = al.train(prob, starts, 300, rule, 0.1)
        assert np.allclose(together.theta[:, 6 * k : 6 * k + 6], alone.theta, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="Polyak"):
        optim.RuleBlocks((optim.PolyakStep(),), (1,))
    with pytest.raises(ValueError, match="blocks hold"):
        al.train(prob, starts, 1, optim.RuleBlocks(rules, (1, 1, 1, 1)), 0.1)


def test_rules_by_name_and_bad_parameters():
    assert isinstance(optim.step_rule("sign"), optim.SignDescent)
    assert optim.step_rule("mirror").p == 3.0
    with pytest.raises(ValueError, match="p must be a real number in"):
        optim.MirrorDescent(p=1.0)
    with pytest.raises(ValueError, match="method must be one of"):
        optim.step_rule("momentum")
    with pytest.raises(ValueError, match="matrix parameter"):
        al.train(al.datasets.single_input(), np.zeros(3), 1, optim.SpectralDescent(), 0.1)


def test_margin_ratio_is_one_on_the_svm_and_below_elsewhere():
    prob = al.datasets.single_input()
    for norm in (1.5, "l2", "linf", "l1"):
        sol = al.svm.max_margin_norm(prob, norm)
        assert og.margin_ratio(prob, sol.theta, sol, norm) == pytest.approx(1.0, abs=1e-7)
        other = al.svm.max_margin_norm(prob, "linf" if norm != "linf" else "l2")
        assert og.margin_ratio(prob, other.theta, sol, norm) < 1 - 1e-3


def test_chapter_checks_pass_and_controls_fail_on_a_small_run():
    groups = og.instances(seed=0, w_count=2)
    runs = []
    for inst in (groups["single"], groups["random"]):
        rules = og.optimizer_rules([1.5], matrix=inst.matrix)
        rules = {k: v for k, v in rules.items() if k in ("NGD", "MD p=1.5", "sign", "spectral")}
        runs.append(og.run_optimizers(inst, rules, 1500, [1.5, "l2", "linf", "spectral"]))
    mirror = og.margin_check(runs, "MD p=1.5", 1.5)
    assert mirror.admitted > 0 and mirror.value <= og.MIDPOINT < mirror.control
    for r in runs:  # H1's run: sign descent at the smaller step, same length eta t
        og.add_runs(r, {"sign small": (optim.SignDescent(), 0.1 / og.SIGN_STEP_FACTOR)}, 1500 * og.SIGN_STEP_FACTOR)
    sign = og.margin_check(runs, "sign small", "linf")
    assert sign.value <= og.MIDPOINT < sign.control
    # the wrong optimizer fails the same check: NGD measured as if it were sign descent
    assert og.margin_check(runs, "NGD", "linf").value > og.MIDPOINT
    checks = al.Checks(display=False)
    check = og.record_with_control(checks, "m", mirror, why="x", planted="y")
    assert check.status == "passed" and check.controls[0]["status"] == "failed"


def test_face_minimum_is_below_the_solvers_point_and_exact_for_lp():
    prob = al.datasets.random_tokens(3, 4, 4, seed=2, family="global")
    for norm in ("linf", "l1", "spectral"):
        sol = al.svm.max_margin_norm(prob, norm)
        assert al.svm.face_min_l2(prob, sol, norm) <= np.linalg.norm(sol.theta) + 1e-12
    sol = al.svm.max_margin_norm(prob, 1.5)
    assert al.svm.face_min_l2(prob, sol, 1.5) == np.linalg.norm(sol.theta)


def test_path_explorer_draws_every_choice_with_its_norms_svm():
    choices = {"NGD": ("ngd", "l2"), "mirror descent": (None, None), "sign descent": ("sign", "linf")}
    explorer = og_fig.PathExplorer(al.datasets.single_input(), choices)
    for choice in choices:
        fig = explorer.draw(choice, p=1.5, steps=20)
        assert fig is explorer.fig and explorer.ax.get_title().startswith(choice)
    assert len(explorer._cache) == 3
    explorer.draw("mirror descent", p=3.0, steps=20)  # another exponent: another path and SVM
    assert len(explorer._cache) == 4 and 3.0 in explorer._svms


def test_random_problems_start_at_their_l2_svm_and_added_runs_share_the_starts():
    inst = og.instances(seed=3, w_count=2)["random"]
    svms = og.solve_svms(inst, ["l2"])
    starts = og.problem_starts(inst, svms)
    assert starts.shape == (2, 1, 5, 5)
    for s, prob in enumerate(inst.problems):  # every optimal token ahead by exactly one logit at the start
        assert og.margin_ratio(prob, starts[s], svms["l2"][s], "l2") == pytest.approx(1.0, abs=1e-7)
    runs = og.run_optimizers(inst, {"NGD": ("ngd", 0.1)}, 20, ["l2"], svms=svms)
    og.add_runs(runs, {"sign": (optim.SignDescent(), 0.05)}, 40)
    assert np.allclose(runs.trajectories["sign"].theta[0], runs.trajectories["NGD"].theta[0])
    assert runs.trajectories["sign"].steps[-1] == 40


def test_plain_horizon_extrapolates_a_logarithmic_growth():
    inst = og.instances(seed=0)["single"]
    svms = og.solve_svms(inst, [1.5, "l2"])
    runs = og.run_optimizers(inst, {"plain": (optim.MirrorDescent(p=1.5), 1.0)}, 1000, [1.5, "l2"], svms=svms)
    h = og.plain_horizon(runs, "plain", 1.5)
    # far from the midpoint at this horizon, the norm still growing, so the horizon needed is far beyond
    assert h.value > og.MIDPOINT and h.growth > 0 and h.norm > 0
    assert h.log10_steps > 6 and np.isfinite(h.product_early) and np.isfinite(h.product_late)


def test_a_longer_rule_resumed_after_the_shared_batch_is_its_own_run():
    inst = og.instances(seed=3, w_count=2)["random"]
    svms = og.solve_svms(inst, ["l2", "linf"])
    rules = {"NGD": ("ngd", 0.1), "Adam": (optim.Adam(), 0.01)}
    longer = {"sign small": (optim.SignDescent(), 0.05, 120), "Adam long": (optim.Adam(), 0.01, 90)}
    runs = og.run_optimizers(inst, rules, 60, ["l2", "linf"], svms=svms, longer=longer)
    alone = og.run_optimizers(inst, {"sign small": longer["sign small"][:2]}, 120, ["l2", "linf"], svms=svms)
    assert list(runs.trajectories) == ["NGD", "Adam", "sign small", "Adam long"]
    for label, steps in (("sign small", 120), ("Adam long", 90)):
        assert runs.trajectories[label].steps.tolist() == og._chapter_records(steps, 12).tolist()
    assert np.array_equal(runs.trajectories["sign small"].theta, alone.trajectories["sign small"].theta)
    # the shared part: the same numbers as the rules' own batch
    short = og.run_optimizers(inst, rules, 60, ["l2", "linf"], svms=svms)
    assert np.array_equal(runs.trajectories["Adam"].theta, short.trajectories["Adam"].theta)


def test_window_statistic_is_one_on_the_svm_ray_and_bounded_by_the_pointwise_mean():
    inst = og.instances(seed=0, w_count=1)["random"]
    svms = og.solve_svms(inst, [1.5, "l2"])
    runs = og.run_optimizers(
        inst, {"MD": (optim.MirrorDescent(p=1.5, normalized=True), 0.1)}, 400, [1.5, "l2"], svms=svms
    )
    assert og.window_steps(400).tolist() == np.unique(np.rint(np.linspace(200, 400, og.WINDOW_POINTS))).tolist()
    window = np.isin(runs.trajectories["MD"].steps, og.window_steps(400))
    pointwise = og.member_margin_ratios(runs, "MD", 1.5)[window].mean(axis=0)
    assert np.all(og.window_margin_ratios(runs, "MD", 1.5) >= pointwise - 1e-12)
    ray = replace(
        runs.trajectories["MD"], theta=np.stack([svms[1.5][0].theta[None] * (1 + k) for k in range(len(window))])
    )
    runs.trajectories["ray"] = ray
    assert og.window_margin_ratios(runs, "ray", 1.5) == pytest.approx(1.0, abs=1e-9)
