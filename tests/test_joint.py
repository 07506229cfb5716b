"""Joint training helpers (chapter 4): label SVM and the two p-SVMs, the rate-balanced prediction,
the random generator and the alignment classes, against closed forms and independent solves."""

import numpy as np
import pytest
from scipy.optimize import minimize

import attnlib as al


def official(h):
    X, y = al.datasets.joint_tokens(third=(0.5, h))
    return X, y, al.joint_svms(X, y, select=1)


def test_official_sets_support_and_svms():
    # First set: every sample is a support vector and the two p-SVMs coincide at (4/3, 1/3).
    _, _, tight = official(1.0)
    assert tight.support.tolist() == [True, True, True]
    np.testing.assert_allclose(tight.label.v, [0.0, 1.0], atol=1e-8)
    np.testing.assert_allclose(tight.full.theta, [4 / 3, 1 / 3], atol=1e-7)
    np.testing.assert_allclose(tight.relaxed.theta, tight.full.theta, atol=1e-9)
    assert tight.separation < 1e-5
    # Second set: sample 3 has label margin 1.5 and is relaxed; full (5/4, 1/4), relaxed (1, 0).
    _, _, relaxed = official(1.5)
    assert relaxed.support.tolist() == [True, True, False]
    np.testing.assert_allclose(relaxed.label_margins, [1.0, 1.0, 1.5], atol=1e-8)
    np.testing.assert_allclose(relaxed.full.theta, [1.25, 0.25], atol=1e-7)
    np.testing.assert_allclose(relaxed.relaxed.theta, [1.0, 0.0], atol=1e-7)
    assert relaxed.relaxed.relax.tolist() == [False, False, True]
    assert relaxed.separation == pytest.approx(np.degrees(np.arctan(0.2)), abs=1e-5)


def test_joint_svms_uses_keys_and_selection():
    X, y = al.datasets.joint_tokens(relaxed=True)
    # Swapping the two tokens and selecting token 0 is the same problem.
    swapped = al.joint_svms(X[:, ::-1], y, select=np.zeros(3, int))
    np.testing.assert_allclose(swapped.relaxed.theta, [1.0, 0.0], atol=1e-7)
    # Keys k = W x with W = 2 I halve every p-SVM; the label SVM does not depend on W.
    scaled = al.joint_svms(X, y, select=1, W=2 * np.eye(2))
    np.testing.assert_allclose(scaled.full.theta, [0.625, 0.125], atol=1e-7)
    np.testing.assert_allclose(scaled.label.v, [0.0, 1.0], atol=1e-8)
    for bad in (2, [1, 1], np.array([1.0, 1.0, 1.0])):
        with pytest.raises(ValueError, match="select"):
            al.joint_svms(X, y, select=bad)
    with pytest.raises(ValueError, match="W"):
        al.joint_svms(X, y, select=1, W=np.eye(3))


def _relaxed_by_slsqp(X, y, support):
    G = X[:, 1] - X[:, 0]
    h = np.where(support, 1.0, 0.0)
    cons = [{"type": "ineq", "fun": lambda p, g=g, c=c: g @ p - c, "jac": lambda p, g=g: g} for g, c in zip(G, h)]
    res = minimize(
        lambda p: p @ p,
        x0=np.array([5.0, 0.0]),
        jac=lambda p: 2 * p,
        constraints=cons,
        method="SLSQP",
        options={"ftol": 1e-14, "maxiter": 500},
    )
    assert res.success
    return res.x


@pytest.mark.parametrize("seed", range(6))
def test_random_relaxed_svm_matches_slsqp(seed):
    X, y = al.random_joint_tokens(n=6, seed=seed)
    svms = al.joint_svms(X, y, select=1)
    # Support vectors are exactly the samples at the smallest label margin.
    np.testing.assert_array_equal(svms.support, np.isclose(svms.label_margins, svms.label_margins.min(), atol=1e-6))
    np.testing.assert_allclose(svms.relaxed.theta, _relaxed_by_slsqp(X, y, svms.support), atol=1e-5)
    np.testing.assert_allclose(svms.full.theta, _relaxed_by_slsqp(X, y, np.ones(6, bool)), atol=1e-5)


def _balanced_by_grid(svms, rho):
    # Independent solve in 2-D: scan the unit circle (the optimum of a max-min of affine functions with
    # a positive value lies on the sphere), then zoom in around the best angle.
    G = svms.keys[:, 1] - svms.keys[:, 0]
    shift = rho * (svms.label_margins - svms.label_margins.min())

    def best_angle(angles):
        S = np.stack([np.cos(angles), np.sin(angles)], axis=-1) @ G.T
        value = np.where(np.all(S >= -1e-12, axis=-1), np.min(S + shift, axis=-1), -np.inf)
        return angles[np.argmax(value)]

    a = best_angle(np.linspace(-np.pi, np.pi, 100_001))
    a = best_angle(np.linspace(a - 1e-4, a + 1e-4, 100_001))
    return np.array([np.cos(a), np.sin(a)])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("rho", [0.0, 0.5, 1.0, 3.0])
def test_balanced_direction_matches_grid_search(seed, rho):
    X, y = al.random_joint_tokens(n=5, seed=seed)
    svms = al.joint_svms(X, y, select=1)
    assert al.angle_degrees(al.balanced_direction(svms, rho), _balanced_by_grid(svms, rho)) < 5e-3


def test_balanced_direction_limits_and_the_official_boundary():
    _, _, svms = official(1.2)
    assert al.angle_degrees(al.balanced_direction(svms, 0.0), svms.full.theta) < 1e-4
    assert al.angle_degrees(al.balanced_direction(svms, 100.0), svms.relaxed.theta) < 1e-4
    # Closed form for (0.5, h): rows (1,1), (1,-1) at exponent cos a ± sin a, row 3 at
    # 0.5 cos a + h sin a + rho (h - 1); at rho = 1 the optimum has cos a - sin a = 0.5 cos a + h sin a + h - 1.
    a = al.balanced_direction(svms, 1.0)
    assert a[0] - a[1] == pytest.approx(0.5 * a[0] + 1.2 * a[1] + 0.2, abs=1e-7)
    # The paper's second set sits exactly on the boundary: p_hat(1) is the relaxed SVM (1, 0).
    _, _, paper = official(1.5)
    assert al.angle_degrees(al.balanced_direction(paper, 1.0), [1.0, 0.0]) < 1e-4
    with pytest.raises(ValueError, match="rho"):
        al.balanced_direction(svms, -1.0)


def test_joint_ngd_follows_the_prediction():
    # The page's claim in one line: equal-rate NGD ends where p_hat(1) says, not on the relaxed SVM.
    X, y, svms = official(1.2)
    traj = al.train_joint(X, y, al.datasets.JOINT_P0, al.datasets.JOINT_V0, steps=1000, record_every=1000)
    p, v = traj.p[-1, 0], traj.v[-1, 0]
    assert al.angle_degrees(p, al.balanced_direction(svms, 1.0)) < 0.2
    assert al.angle_degrees(p, svms.relaxed.theta) > 5.0
    assert al.cosine(v, svms.label.v) > 0.9999


def test_random_joint_tokens_recipe():
    X, y = al.random_joint_tokens(n=8, d=4, seed=3, tight=3, gap=(0.5, 0.7), attention=(0.4, 0.9))
    assert X.shape == (8, 2, 4) and set(y.tolist()) == {-1.0, 1.0}
    assert np.all(X[:, 0] == 0)
    assert np.all((X[:, 1, 0] >= 0.4) & (X[:, 1, 0] <= 0.9))
    planted = y * X[:, 1, 1]
    assert np.sum(np.isclose(planted, 1.0)) == 3
    assert np.all((planted == 1.0) | ((planted >= 1.5) & (planted <= 1.7)))
    again, _ = al.random_joint_tokens(n=8, d=4, seed=3, tight=3, gap=(0.5, 0.7), attention=(0.4, 0.9))
    np.testing.assert_array_equal(X, again)
    assert not np.array_equal(X, al.random_joint_tokens(n=8, d=4, seed=4)[0])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n=1), "n must"),
        (dict(d=1), "d must"),
        (dict(n=4, tight=5), "tight"),
        (dict(gap=(0.5, 0.1)), "gap"),
        (dict(attention=(0.0, 1.0)), "attention"),
    ],
)
def test_random_joint_tokens_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        al.random_joint_tokens(**kwargs)


def test_classify_alignment():
    _, _, svms = official(1.5)  # relaxed (1, 0), full along (5, 1): separation atan(0.2) = 11.3 degrees
    sep = np.radians(svms.separation)
    at = lambda frac: [np.cos(frac * sep), np.sin(frac * sep)]  # noqa: E731
    P = np.array([at(0.0), at(0.2), at(0.5), at(0.8), at(1.0), at(1.2), at(-0.3)])
    expected = ["relaxed", "relaxed", "neither", "full", "full", "full", "neither"]
    assert al.classify_alignment(P, svms).tolist() == expected
    assert al.classify_alignment(P[0], svms).shape == ()
    _, _, tight = official(1.0)
    assert set(al.classify_alignment(P, tight).tolist()) == {"same"}
    with pytest.raises(ValueError, match="fraction"):
        al.classify_alignment(P, svms, fraction=0.5)


def test_angle_degrees_is_accurate_for_tiny_angles():
    eps = 1e-10
    assert al.angle_degrees([np.cos(eps), np.sin(eps)], [1.0, 0.0]) == pytest.approx(np.degrees(eps), rel=1e-6)
    np.testing.assert_allclose(al.angle_degrees([[0.0, 1.0], [-1.0, 0.0]], [1.0, 0.0]), [90.0, 180.0])
