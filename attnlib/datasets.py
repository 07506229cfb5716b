"""Every instance of the papers by name, and the seeded random families.

The fixed-head instances of [MMTS] store the score in a third coordinate: ``v = (0, 0, 1)`` and
``W = diag(1, 1, 0)``, so the keys are the first two coordinates (the plane every figure is drawn
in) and ``γ_t`` is the third coordinate times the label.

Every instance generator is here, the random starts included: the key-plane instances, random
tokens, joint tokens, planted decoder tokens, separable data, the rank instances of [TFSVM],
the cone starts of the local theorem, and real tokens (:func:`digit_patches`: image patches of
scikit-learn's handwritten digits, each token the patch's pixels and a positional code).

>>> import attnlib as al
>>> data = al.datasets.digit_patches(digits=(3, 8), patch=4, n=10, seed=0)
>>> data.X.shape, data.T, data.d, sorted(set(data.y.tolist()))
((10, 4, 20), 4, 20, [-1.0, 1.0])
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .losses import get_loss
from .metrics import log_one_minus_mass
from .model import TokenSelectionProblem, check_integer, prompt_attention, self_attention

__all__ = [
    "KEY_PLANE",
    "SCORE_HEAD",
    "SINGLE_INPUT_INITS",
    "MULTI_INPUT_INITS",
    "JOINT_P0",
    "JOINT_V0",
    "single_input",
    "multi_input",
    "loss_study",
    "joint_tokens",
    "joint_start",
    "joint_slack",
    "JOINT_JITTER",
    "separable_data",
    "random_tokens",
    "random_and_adversarial_starts",
    "loss_study_offset",
    "loss_study_offset_ratio",
    "random_joint_tokens",
    "PlantedTokens",
    "planted_tokens",
    "gaussian_tokens",
    "rank_instance",
    "ReluHeadInstances",
    "relu_head_instances",
    "IMAGE_SIZE",
    "DigitPatches",
    "digit_patches",
    "cone_starts",
]


#: Keys are the first two coordinates of a token in the fixed-head figures of [MMTS].
KEY_PLANE = np.diag([1.0, 1.0, 0.0])


#: The head reads the score from the third coordinate.
SCORE_HEAD = np.array([0.0, 0.0, 1.0])


#: Fig. 1 initialisations ``p(0) = (0, y0, 0)``, ``y0 ∈ {1, 0.5, 0, −0.5, −1, −1.5}``.
SINGLE_INPUT_INITS = np.array([[0.0, y0, 0.0] for y0 in (1.0, 0.5, 0.0, -0.5, -1.0, -1.5)])


#: Multi-input figure initialisations ``p(0) = (x0, 0, 0)``.
MULTI_INPUT_INITS = np.array([[x0, 0.0, 0.0] for x0 in (1.0, 0.5, 0.0, -0.5, -1.0, -1.5)])


#: Joint-training initialisation of [MMTS] Fig. 3.
JOINT_P0 = np.array([0.0, -1.0])


JOINT_V0 = np.array([-1.0, 0.0])


def single_input(
    local: bool = False, third_score: float | None = None, loss: str = "logistic"
) -> TokenSelectionProblem:
    """[MMTS] Fig. 1: one input, tokens ``(−0.1, 1 | 1)``, ``(1, 0 | 0.9)``, ``(0, 0 | s)``.

    ``s = 0.9`` (Fig. 1(a), non-optimal scores tie: global regime) or ``s = 0`` with
    ``local=True`` (Fig. 1(b)); ``third_score`` sets ``s`` directly (it must stay below 1).

    >>> import attnlib as al
    >>> single_input(local=True).gamma.tolist()
    [[1.0, 0.9, 0.0]]
    """
    s = (0.0 if local else 0.9) if third_score is None else float(third_score)
    if not s < 1.0:
        raise ValueError(f"third_score must be below the optimal score 1, got {s}")
    X = np.array([[[-0.1, 1.0, 1.0], [1.0, 0.0, 0.9], [0.0, 0.0, s]]])
    return prompt_attention(X, [1.0], SCORE_HEAD, KEY_PLANE, loss)


def multi_input(seed: int = 0, nonopt_scores=0.5, noise: float = 0.2, loss: str = "logistic") -> TokenSelectionProblem:
    """[MMTS] multi-input figure: ``n=3, T=7``, keys ``noise·N(0, I)`` plus offsets.

    Token 0 ``+(1, 0)`` with score 1; tokens 1–3 ``+(−1, 1)``; tokens 4–6 ``+(−0.5, −0.5)``.
    ``nonopt_scores``: a number (equal scores, the global regime; 0.5 in the paper) or an (n, 6)
    array of scores below 1 for the non-optimal tokens. Labels are +1. The official code draws the
    noise with torch; this uses ``numpy.random.default_rng(seed)``.
    """
    rng = np.random.default_rng(seed)
    n, T = 3, 7
    X = noise * rng.standard_normal((n, T, 3))
    X[:, 0, :2] += (1.0, 0.0)
    X[:, 1:4, :2] += (-1.0, 1.0)
    X[:, 4:, :2] += (-0.5, -0.5)
    X[:, 0, 2] = 1.0
    X[:, 1:, 2] = np.broadcast_to(np.asarray(nonopt_scores, float), (n, T - 1))
    return prompt_attention(X, np.ones(n), SCORE_HEAD, KEY_PLANE, loss)


def loss_study(C: float, loss: str = "logistic") -> TokenSelectionProblem:
    """[MMTS] loss comparison: sample 1 ``(0,0|0), (1,1|C)``; sample 2 ``(0,0|0), (1,−1|1)``.

    The optimal tokens do not depend on ``C > 0``, so neither does ``p_mm* = (1, 0)``.
    """
    if not C > 0:
        raise ValueError(f"C must be positive, got {C}")
    X = np.array([[[0.0, 0.0, 0.0], [1.0, 1.0, C]], [[0.0, 0.0, 0.0], [1.0, -1.0, 1.0]]])
    return prompt_attention(X, [1.0, 1.0], SCORE_HEAD, KEY_PLANE, loss)


#: How far a seed other than 0 moves [MMTS] Fig. 3's data and start (:func:`joint_tokens`,
#: :func:`joint_start`): the relative change of the first coordinates of samples 1 and 2 (and of
#: sample 3 in the first set); in the second set, the range by which sample 3's first coordinate
#: grows and the interval of its slack (see :func:`joint_tokens`); the standard deviation of the
#: Gaussian added to p(0) and v(0). The slack is kept off 0: under NGD sample 3's pull on ``p``
#: decays like ``exp(−s‖p‖)``, and a finite run resolves its limit only once ``s·ηT`` is a few units
#: (chapter 4's offset-growth check needs ``s·ηT ≥ 0.78``; 0.05 gives 2, 2.5 times that, at its shortest
#: horizon ηT = 40, and 5 at its default ηT = 100).
JOINT_JITTER = {"relative": 0.1, "third_first": 0.2, "slack": (0.05, 0.5), "start": 0.1}


def joint_tokens(relaxed: bool = False, third=None, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """[MMTS] Fig. 3 joint-training data ``(X, y)``: ``d = 2``, ``W = I``, ``y = (1, −1, 1)``.

    ``X_1 = {(0,0), (1,1)}``, ``X_2 = {(0,0), (1,−1)}``, ``X_3 = {(0,0), (0.5, 1)}`` (every sample
    a support vector of the label SVM) or ``(0.5, 1.5)`` with ``relaxed=True`` (sample 3 is not).
    ``third`` overrides sample 3's second token.

    ``seed = 0`` is the paper's data exactly. Any other seed moves them inside the same regime
    (:data:`JOINT_JITTER`). The first coordinates ``a_1, a_2`` of the relevant tokens of samples 1
    and 2 change by a relative ±10% (uniform), their second coordinates ``y_i`` stay, so the label
    SVM stays ``v = (0, 1)``. In the first set sample 3's ``a_3`` changes alike, and every sample stays
    a support vector. In the second set sample 3 is not a support vector, and its place decides the
    limit of chapter 4's first-order direction ``p̂(1)``: with ``p̂`` the relaxed p-SVM's direction and
    ``γ = 1/‖p_relax‖`` its margin, ``p̂(1)`` is the relaxed p-SVM when sample 3's exponent
    ``⟨p̂, x_3⟩ + (h − 1)`` is at least ``γ``. The paper's set sits exactly on that edge (slack 0:
    moved to ``(0.45, 1.5)`` or ``(0.5, 1.45)``, ``p̂(1)`` is 1.1° off the relaxed SVM). A seed draws
    ``a_3 = 0.5 + U(0, 0.2)`` and a slack ``U(0.05, 0.5)`` and puts ``h`` where sample 3's exponent is ``γ``
    plus the slack (:func:`joint_slack`; kept off the edge, see :data:`JOINT_JITTER`).

    >>> X, y = joint_tokens(relaxed=True, seed=3)
    >>> bool(np.all(X[:, 0] == 0) and np.all(X[:2, 1, 1] == (1.0, -1.0)) and X[2, 1, 1] > 1.0)
    True
    """
    check_integer("seed", seed, 0, 2**63 - 1)
    x3 = np.asarray(third if third is not None else ((0.5, 1.5) if relaxed else (0.5, 1.0)), float)
    X = np.array([[[0.0, 0.0], [1.0, 1.0]], [[0.0, 0.0], [1.0, -1.0]], [[0.0, 0.0], x3]])
    if seed:
        rng = np.random.default_rng([seed, 4])  # 4: this data's own stream (chapter 4)
        rel = JOINT_JITTER["relative"]
        a1, a2 = X[:2, 1, 0] * (1 + rng.uniform(-rel, rel, 2))
        X[0, 1, 0], X[1, 1, 0] = a1, a2
        if third is None and relaxed:
            # the relaxed p-SVM of samples 1 and 2: the vertex of a1 p1 + p2 = 1 and a2 p1 - p2 = 1
            p_relax = np.array([2.0, a2 - a1]) / (a1 + a2)
            gamma = 1.0 / np.linalg.norm(p_relax)
            p_hat = p_relax * gamma
            a3 = 0.5 + rng.uniform(0, JOINT_JITTER["third_first"])
            slack = rng.uniform(*JOINT_JITTER["slack"])
            X[2, 1] = a3, (gamma + 1.0 + slack - a3 * p_hat[0]) / (p_hat[1] + 1.0)
        elif third is None:
            X[2, 1, 0] *= 1 + rng.uniform(-rel, rel)
    return X, np.array([1.0, -1.0, 1.0])


def joint_slack(X) -> float:
    """How far sample 3 of :func:`joint_tokens`'s second set sits off the edge of its regime (0: the paper's).

    With ``a_1, a_2`` the first coordinates of samples 1 and 2, the relaxed p-SVM is the vertex
    ``p_relax = (2, a_2 − a_1)/(a_1 + a_2)``, ``γ = 1/‖p_relax‖``, ``p̂ = γ p_relax``; sample 3's token
    ``x_3 = (a_3, h)`` has the exponent ``⟨p̂, x_3⟩ + (h − 1)`` and the slack is that exponent minus ``γ``
    (``≥ 0``: the first-order limit ``p̂(1)`` is the relaxed p-SVM). ``X``: (3, 2, 2).

    >>> round(joint_slack(joint_tokens(relaxed=True)[0]), 12)
    0.0
    """
    X = np.asarray(X, float)
    if X.shape != (3, 2, 2):
        raise ValueError(f"X must be joint_tokens' data of shape (3, 2, 2), got {X.shape}")
    a1, a2 = X[0, 1, 0], X[1, 1, 0]
    p_relax = np.array([2.0, a2 - a1]) / (a1 + a2)
    gamma = 1.0 / np.linalg.norm(p_relax)
    return float(gamma * p_relax @ X[2, 1] + X[2, 1, 1] - 1.0 - gamma)


def joint_start(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """[MMTS] Fig. 3's start ``(p(0), v(0)) = ((0, −1), (−1, 0))`` at ``seed = 0``; any other seed adds
    an independent Gaussian of standard deviation ``JOINT_JITTER["start"]`` to each.

    >>> p0, v0 = joint_start()
    >>> p0.tolist(), v0.tolist()
    ([0.0, -1.0], [-1.0, 0.0])
    """
    check_integer("seed", seed, 0, 2**63 - 1)
    if not seed:
        return JOINT_P0.copy(), JOINT_V0.copy()
    rng = np.random.default_rng([seed, 40])
    p_noise, v_noise = JOINT_JITTER["start"] * rng.standard_normal((2, 2))
    return JOINT_P0 + p_noise, JOINT_V0 + v_noise


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def separable_data(n: int, d: int, seed=0, gap: float = 0.2) -> tuple[np.ndarray, np.ndarray]:
    """``n`` Gaussian points in ``R^d`` labelled by a random hyperplane through the origin.

    Points closer than ``gap`` to the hyperplane are redrawn, so the data are linearly separable
    without bias (a few points become support vectors). The points are then scaled so that the
    largest has norm 1: the logistic loss is (1/4)-smooth and GD is stable for steps below 8.
    Returns ``X`` (n, d) and ``y`` (n,).
    """
    if not isinstance(n, (int, np.integer)) or n < 2:
        raise ValueError(f"n must be an integer >= 2, got {n!r}")
    if not isinstance(d, (int, np.integer)) or d < 1:
        raise ValueError(f"d must be a positive integer, got {d!r}")
    if not 0 < gap < 1:
        raise ValueError(f"gap must lie in (0, 1), got {gap!r}")
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(d)
    w /= np.linalg.norm(w)
    X = np.empty((0, d))
    while len(X) < n:
        draw = rng.standard_normal((2 * n, d))
        X = np.concatenate([X, draw[np.abs(draw @ w) >= gap]])
    X = X[:n]
    y = np.sign(X @ w)
    return X / np.linalg.norm(X, axis=1).max(), y


def random_tokens(
    n: int,
    T: int,
    d: int,
    seed=0,
    family: str = "random",
    queries: str = "self",
    c: float = 1.0,
    loss: str = "logistic",
) -> TokenSelectionProblem:
    """[FAST]/[TFSVM] random self-attention instance: unit tokens, unit decoder ``u``, labels ±1.

    Args:
        family: "random" (scores ``y_i uᵀx_it`` as drawn) or "global" (non-optimal tokens made
            orthogonal to ``u``, so their scores tie at 0, and one token per sample given the
            component ``y_i c u``: the equal-score family where convergence is global).
        queries: "self" (``z_i = x_i1``) or "cross" (an independent unit query per sample).
        seed: an int or a ``numpy.random.Generator``.
    """
    if family not in ("random", "global"):
        raise ValueError(f"family must be 'random' or 'global', got {family!r}")
    if queries not in ("self", "cross"):
        raise ValueError(f"queries must be 'self' or 'cross', got {queries!r}")
    for name, value in (("n", n), ("T", T), ("d", d)):
        if not isinstance(value, (int, np.integer)) or value < (2 if name != "n" else 1):
            raise ValueError(f"{name} must be an integer >= {2 if name != 'n' else 1}, got {value!r}")
    rng = np.random.default_rng(seed)
    X = _unit(rng.standard_normal((n, T, d)))
    u = _unit(rng.standard_normal(d))
    y = rng.choice([-1.0, 1.0], size=n)
    if family == "global":
        X = _unit(X - (X @ u)[..., None] * u)
        best = rng.integers(0, T, size=n)
        X[np.arange(n), best] = _unit(X[np.arange(n), best] + (y * c)[:, None] * u)
    Z = None if queries == "self" else _unit(rng.standard_normal((n, d)))
    return self_attention(X, y, u, Z, loss)


def random_and_adversarial_starts(prob: TokenSelectionProblem, theta_mm, count: int, norm: float, seed: int = 0):
    """Starts for "from any initialisation": adversarial ones, the rest random in the key plane.

    Adversarial (norm ``norm``): pointing at each non-optimal token of sample 0, at ``−θ_mm``, and
    perpendicular to ``θ_mm`` both ways. Random: uniform directions in the plane of the first two
    coordinates, norms log-uniform in ``[1/norm, norm]`` (``numpy.random.default_rng(seed)``).
    Returns ``(starts (count, d), is_adversarial (count,))``, the adversarial ones last.

    >>> import attnlib as al
    >>> prob = multi_input(0)
    >>> starts, adv = random_and_adversarial_starts(prob, al.max_margin(prob).theta, 20, 10.0)
    >>> starts.shape, int(adv.sum())
    ((20, 3), 9)
    """
    u = np.asarray(theta_mm, float) / np.linalg.norm(theta_mm)
    d = u.size
    keys = prob.A[0, np.arange(prob.T) != prob.opt[0]]  # sample 0's non-optimal tokens
    toward = np.zeros_like(keys)
    toward[:, :2] = keys[:, :2] / np.linalg.norm(keys[:, :2], axis=-1, keepdims=True)
    perp = np.zeros(d)
    perp[:2] = -u[1], u[0]
    adversarial = norm * np.vstack([toward, -u, perp, -perp])
    n_uniform = count - len(adversarial)
    if n_uniform < 0:
        raise ValueError(f"count must be at least the {len(adversarial)} adversarial starts, got {count}")
    rng = np.random.default_rng(seed)
    angles = rng.uniform(0, 2 * np.pi, n_uniform)
    radii = norm ** rng.uniform(-1, 1, n_uniform)
    uniform = np.zeros((n_uniform, d))
    uniform[:, 0], uniform[:, 1] = radii * np.cos(angles), radii * np.sin(angles)
    return np.vstack([uniform, adversarial]), np.r_[np.zeros(n_uniform, bool), np.ones(len(adversarial), bool)]


def loss_study_offset(C, loss: str = "logistic"):
    """The offset ``p_2(∞) = ½ ln(C |ℓ'(C)| / |ℓ'(1)|)`` where the loss study's path settles (any array ``C``).

    For large ``p_1`` input 1 pulls ``p_2`` up with strength ``C|ℓ'(C)| e^{−p_2}`` and input 2 pulls it
    down with ``|ℓ'(1)| e^{p_2}`` (a common factor ``e^{−p_1}`` aside); they balance there.

    >>> import attnlib as al
    >>> round(float(loss_study_offset(4.0, "linear")), 6)   # ½ ln C for the correlation loss
    0.693147
    """

    d = get_loss(loss).derivative
    C = np.asarray(C, float)
    return 0.5 * np.log(C * d(C) / d(1.0))


def loss_study_offset_ratio(run, C: float, loss: str, lr: float) -> float:
    """Error of a loss-study NGD run's final ``p_2`` from :func:`loss_study_offset`, over its bound.

    The bound: ``½ (C + 3) σ_max`` for the terms of relative order ``σ`` (the attention left off the
    optimal tokens) that the balance drops; ``δ ρ/(1 − ρ)`` for the distance still to go, ``δ`` the
    last recorded move of ``p_2`` over ``k`` steps and ``ρ = (1 − η)^k`` NGD's contraction near the
    balance; ``10⁻¹³(1 + ‖p‖)`` for rounding. ``run``: a :class:`attnlib.Trajectory` of one run.
    """
    final, before = run.theta[-1, 0], run.theta[-2, 0]
    rho = (1 - lr) ** int(run.steps[-1] - run.steps[-2])

    sigma_max = np.exp(log_one_minus_mass(loss_study(C, loss), final).max())
    bound = 0.5 * (C + 3) * sigma_max + abs(final[1] - before[1]) * rho / (1 - rho)
    bound += 1e-13 * (1 + np.linalg.norm(final))
    return float(abs(final[1] - loss_study_offset(C, loss)) / bound)


def random_joint_tokens(
    n: int = 6,
    d: int = 2,
    seed=0,
    tight: int | None = None,
    gap=(0.2, 1.0),
    attention=(0.3, 1.5),
    noise: float = 0.3,
) -> tuple[np.ndarray, np.ndarray]:
    """Random joint-training data in the shape of [MMTS] Fig. 3: ``(X, y)``, ``X`` (n, 2, d).

    Every sample has a zero token ``(0, …, 0)`` (index 0; key and value 0 whatever ``v``) and a
    relevant token (index 1)

    .. math::  x_i = a_i e_1 + y_i m_i e_2 + ε_i, \\qquad ε_i ⊥ e_1, e_2,

    with attention component ``a_i ~ U(attention)`` (positive, so the p-SVMs are feasible),
    planted label margin ``m_i = 1`` for ``tight`` samples and ``1 + U(gap)`` for the others (some
    samples have a larger label margin than others), and ``ε_i ~ noise·N(0, I)`` in the remaining
    ``d − 2`` coordinates. Labels are ±1 with both present. The planted margins are a recipe: the
    support set is what :func:`joint_svms` computes.

    Args:
        n: samples (>= 2).  d: token dimension (>= 2).  seed: an int or ``numpy.random.Generator``.
        tight: samples planted at margin 1 (default ``n // 2``, at least 1).

    >>> import attnlib as al
    >>> X, y = random_joint_tokens(n=5, seed=1)
    >>> X.shape, y.shape, bool((X[:, 0] == 0).all())
    ((5, 2, 2), (5,), True)
    """
    for name, value, low in (("n", n, 2), ("d", d, 2)):
        if not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    tight = max(1, n // 2) if tight is None else tight
    if not isinstance(tight, (int, np.integer)) or not 1 <= tight <= n:
        raise ValueError(f"tight must be an integer in [1, {n}], got {tight!r}")
    lo, hi = gap
    if not 0 <= lo <= hi:
        raise ValueError(f"gap must be (low, high) with 0 <= low <= high, got {gap!r}")
    a_lo, a_hi = attention
    if not 0 < a_lo <= a_hi:
        raise ValueError(f"attention must be (low, high) with 0 < low <= high, got {attention!r}")
    rng = np.random.default_rng(seed)
    y = rng.choice([-1.0, 1.0], size=n)
    y[:2] = (1.0, -1.0)
    margins = np.ones(n)
    margins[tight:] += rng.uniform(lo, hi, size=n - tight)
    X = np.zeros((n, 2, d))
    X[:, 1, 0] = rng.uniform(a_lo, a_hi, size=n)
    X[:, 1, 1] = y * margins
    X[:, 1, 2:] = noise * rng.standard_normal((n, d - 2))
    perm = rng.permutation(n)
    return X[perm], y[perm]


@dataclass(frozen=True, eq=False)
class PlantedTokens:
    """Data of :func:`planted_tokens`: ``X`` (n, T, d), ``y`` (n,), ``Z`` (n, d_z) or None (self-attention),
    ``signal`` (n,) the planted token of each sequence, ``u_star`` (d,) the planted unit direction."""

    X: np.ndarray
    y: np.ndarray
    Z: np.ndarray | None
    signal: np.ndarray
    u_star: np.ndarray


def planted_tokens(n: int, T: int, d: int, seed=0, c: float = 1.0, queries: str = "self") -> PlantedTokens:
    """The "global" family of :func:`attnlib.datasets.random_tokens`, returned with its ingredients.

    Unit tokens orthogonal to a unit direction ``u*``, except one token per sequence (``signal``)
    given the component ``y_i c u*`` and renormalised; labels ±1. For a *fixed* decoder ``u*``,
    every non-planted token scores 0 and the planted one scores ``y_i·(its u* component) > 0``. The
    draw is the same as ``random_tokens(n, T, d, seed, family="global", queries=queries, c=c)``.
    """
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, T, d))
    X /= np.linalg.norm(X, axis=-1, keepdims=True)
    u = rng.standard_normal(d)
    u /= np.linalg.norm(u)
    y = rng.choice([-1.0, 1.0], size=n)
    X = X - (X @ u)[..., None] * u
    X /= np.linalg.norm(X, axis=-1, keepdims=True)
    best = rng.integers(0, T, size=n)
    planted = X[np.arange(n), best] + (y * c)[:, None] * u
    X[np.arange(n), best] = planted / np.linalg.norm(planted, axis=-1, keepdims=True)
    Z = None
    if queries == "cross":
        Z = rng.standard_normal((n, d))
        Z /= np.linalg.norm(Z, axis=-1, keepdims=True)
    return PlantedTokens(X, y, Z, best, u)


def gaussian_tokens(n: int, T: int, d: int, seed=0, signal: float = 1.0) -> PlantedTokens:
    """Gaussian-like token data: one signal token per sequence, every other token pure noise.

    A unit direction ``u*``; token ``t`` of sequence ``i`` is ``ξ_it ~ N(0, I_d/d)`` (norm about 1),
    except the signal token ``x_{i,signal_i} = y_i·signal·u* + ξ_it``; labels ±1, query ``z_i = x_{i1}``
    (self-attention). This is the book's stand-in for the "Gaussian-like" data under which a summary
    of [FAST] v2 states the loss of joint training decays like ``exp(−t^{1/3})``; the paper's own
    data model could not be checked. Shapes: ``X`` (n, T, d), ``y`` (n,), ``signal`` (n,), ``u_star`` (d,).

    >>> D = gaussian_tokens(6, 8, 10, seed=0)
    >>> D.X.shape, bool(np.all(D.y * (D.X[np.arange(6), D.signal] @ D.u_star) > 0))
    ((6, 8, 10), True)
    """
    n, T, d = check_integer("n", n, 1, 10**6), check_integer("T", T, 2, 10**6), check_integer("d", d, 1, 10**6)
    if not np.isfinite(signal) or signal <= 0:
        raise ValueError(f"signal must be a positive number, got {signal!r}")
    rng = np.random.default_rng(seed)
    u = rng.standard_normal(d)
    u /= np.linalg.norm(u)
    y = rng.choice([-1.0, 1.0], size=n)
    X = rng.standard_normal((n, T, d)) / np.sqrt(d)
    best = rng.integers(0, T, size=n)
    X[np.arange(n), best] += (y * signal)[:, None] * u
    return PlantedTokens(X, y, None, best, u)


def rank_instance(n: int, T: int, d: int, seed: int):
    """The rank grid's data: unit tokens, unit decoder ``u``, labels ±1, unit cross-attention queries.

    The same draws as ``datasets.random_tokens(n, T, d, seed, queries="cross")`` (which needs
    ``d ≥ 2``), also at ``d = 1``. Returns ``X`` (n, T, d), ``y`` (n,), ``u`` (d,), ``Z`` (n, d) and
    ``opt`` (n,) ``argmax_t y_i uᵀx_it`` (the first one on ties, as the official code; ties happen
    only at d = 1, where tied tokens are equal and the SVM is infeasible).
    """
    rng = np.random.default_rng(seed)
    unit = lambda v: v / np.linalg.norm(v, axis=-1, keepdims=True)  # noqa: E731
    X = unit(rng.standard_normal((n, T, d)))
    u = unit(rng.standard_normal(d))
    y = rng.choice([-1.0, 1.0], size=n)
    Z = unit(rng.standard_normal((n, d)))
    return X, y, u, Z, np.argmax(y[:, None] * (X @ u), axis=1)


#: Side of a scikit-learn digit image, in pixels.
IMAGE_SIZE = 8


@dataclass(frozen=True)
class ReluHeadInstances:
    """S random instances of [TFSVM]'s ReLU-head experiment (``multi_token_converge``).

    ``X`` (S, n, T, d) unit tokens, ``Z`` (S, n, d) unit cross-attention queries, ``V`` (S, d, d)
    the head (unit Frobenius norm), ``y`` (S, n) labels ±1 with at least one −1 per instance,
    ``W0`` (S, d, d) the starts (uniform on ±1/√d, torch's default for a linear layer).
    """

    X: np.ndarray
    Z: np.ndarray
    V: np.ndarray
    y: np.ndarray
    W0: np.ndarray


def relu_head_instances(S: int, d: int, n: int = 3, T: int = 4, seed=0) -> ReluHeadInstances:
    """[TFSVM] ``multi_token_converge`` data: unit tokens and queries, ``V`` of unit Frobenius norm,
    random labels (an instance whose labels are all +1 is redrawn, as the official code skips it).

    >>> data = relu_head_instances(5, 4, seed=0)
    >>> data.X.shape, data.V.shape, bool((data.y == -1).any(axis=1).all())
    ((5, 3, 4, 4), (5, 4, 4), True)
    """
    S, d, n, T = (check_integer(name, v, 1, 10**6) for name, v in (("S", S), ("d", d), ("n", n), ("T", T)))
    rng = np.random.default_rng(seed)
    V = rng.standard_normal((S, d, d))
    V /= np.linalg.norm(V, axis=(1, 2), keepdims=True)
    X = _unit(rng.standard_normal((S, n, T, d)))
    Z = _unit(rng.standard_normal((S, n, d)))
    y = np.where(rng.standard_normal((S, n)) > 0, 1.0, -1.0)
    while (redraw := np.all(y == 1.0, axis=1)).any():
        y[redraw] = np.where(rng.standard_normal((int(redraw.sum()), n)) > 0, 1.0, -1.0)
    W0 = rng.uniform(-1.0, 1.0, (S, d, d)) / np.sqrt(d)
    return ReluHeadInstances(X, Z, V, y, W0)


@dataclass(frozen=True, eq=False)
class DigitPatches:
    """Digits as token sequences.

    Attributes:
        X: (n, T, d) tokens, ``d = patch² + T``: pixels in [0, 1] then ``pos_scale`` times a
            one-hot code of the patch's position (row-major over the patch grid).
        y: (n,) labels, ``+1`` for ``digits[0]`` and ``−1`` for ``digits[1]``.
        images: (n, 8, 8) the images, pixels in [0, 1].
        index: (n,) row of each image in ``sklearn.datasets.load_digits()``.
        digits: the two digit classes.  patch: patch side in pixels.  pos_scale: size of the code.
    """

    X: np.ndarray
    y: np.ndarray
    images: np.ndarray
    index: np.ndarray
    digits: tuple[int, int]
    patch: int
    pos_scale: float

    @property
    def n(self) -> int:
        return self.X.shape[0]

    @property
    def T(self) -> int:
        return self.X.shape[1]

    @property
    def d(self) -> int:
        return self.X.shape[2]

    @property
    def grid(self) -> int:
        """Patches per side, ``8 // patch``."""
        return IMAGE_SIZE // self.patch

    def __len__(self) -> int:
        return self.n

    def subset(self, index) -> DigitPatches:
        """The images ``index`` (a slice, indices or a mask) as a new :class:`DigitPatches`."""
        return DigitPatches(
            self.X[index], self.y[index], self.images[index], self.index[index], self.digits, self.patch, self.pos_scale
        )

    def corner(self, t: int) -> tuple[int, int]:
        """``(row, column)`` of the top-left pixel of patch ``t``."""
        if not 0 <= t < self.T:
            raise ValueError(f"patch index must be in [0, {self.T - 1}], got {t}")
        return (t // self.grid) * self.patch, (t % self.grid) * self.patch

    def patch_map(self, values) -> np.ndarray:
        """Paint one value per patch onto its pixels: ``values`` (..., T) → (..., 8, 8).

        >>> import numpy as np, attnlib as al
        >>> data = digit_patches(patch=4, n=2)
        >>> data.patch_map(np.arange(4.0))[[0, 0, 7, 7], [0, 7, 0, 7]].tolist()
        [0.0, 1.0, 2.0, 3.0]
        """
        values = np.asarray(values, float)
        if values.shape[-1] != self.T:
            raise ValueError(f"values must have a last axis of length T={self.T}, got shape {values.shape}")
        g, s = self.grid, self.patch
        grid = values.reshape(values.shape[:-1] + (g, g))
        return np.repeat(np.repeat(grid, s, axis=-2), s, axis=-1)


def digit_patches(digits=(3, 8), patch: int = 4, n: int | None = None, seed=0, pos_scale: float = 1.0) -> DigitPatches:
    """Images of two digit classes as patch tokens with a positional code, labels ±1.

    The images of each class are shuffled with ``seed`` and then interleaved (``digits[0]``,
    ``digits[1]``, ``digits[0]``, …), so that every prefix ``subset(slice(0, m))`` with ``m`` even
    holds as many images of each class; images of the larger class left over come last.

    Args:
        digits: two different digits in 0..9.
        patch: patch side, a divisor of 8 (1, 2, 4 or 8), so ``T = (8/patch)²`` tokens per image.
        n: number of images (``None``: all images of the two classes, about 360).
        seed: an int or a ``numpy.random.Generator``.
        pos_scale: size of the one-hot positional code (> 0).

    >>> import attnlib as al
    >>> data = digit_patches(digits=(0, 1), patch=2, n=6, seed=1)
    >>> data.X.shape, data.y.tolist()
    ((6, 16, 20), [1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
    """
    digits = tuple(digits)
    if len(digits) != 2:
        raise ValueError(f"digits must be two digit classes, got {digits!r}")
    a, b = (check_integer("digits", c, 0, 9) for c in digits)
    if a == b:
        raise ValueError(f"digits must be two different classes, got {digits!r}")
    patch = check_integer("patch", patch, 1, IMAGE_SIZE)
    if IMAGE_SIZE % patch:
        raise ValueError(f"patch must divide {IMAGE_SIZE} (1, 2, 4 or 8), got {patch}")
    if isinstance(pos_scale, bool) or not np.isfinite(pos_scale) or pos_scale <= 0:
        raise ValueError(f"pos_scale must be a positive finite number, got {pos_scale!r}")
    raw_images, target = _digits_table()  # scikit-learn's load_digits(), without importing scikit-learn
    rng = np.random.default_rng(seed)
    rows = [rng.permutation(np.flatnonzero(target == c)) for c in (a, b)]
    m = min(len(r) for r in rows)
    order = np.concatenate([np.stack([rows[0][:m], rows[1][:m]], axis=1).ravel(), rows[0][m:], rows[1][m:]])
    if n is not None:
        n = check_integer("n", n, 1, len(order))
        order = order[:n]
    images = raw_images[order] / 16.0
    g = IMAGE_SIZE // patch
    T = g * g
    pixels = images.reshape(-1, g, patch, g, patch).transpose(0, 1, 3, 2, 4).reshape(-1, T, patch * patch)
    code = np.broadcast_to(float(pos_scale) * np.eye(T), (len(order), T, T))
    X = np.concatenate([pixels, code], axis=-1)
    y = np.where(target[order] == a, 1.0, -1.0)
    return DigitPatches(X, y, images, order, (a, b), patch, float(pos_scale))


@lru_cache(maxsize=1)
def _digits_table() -> tuple[np.ndarray, np.ndarray]:
    """``(images (1797, 8, 8) in 0..16, target (1797,))``: scikit-learn's digits, read from the CSV it
    ships (``sklearn/datasets/data/digits.csv.gz``) without importing scikit-learn (about 1 s)."""
    import gzip
    import importlib.util
    import os

    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the digits data ship with scikit-learn: pip install scikit-learn")
    path = os.path.join(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz")
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",")
    images, target = table[:, :-1].reshape(-1, IMAGE_SIZE, IMAGE_SIZE), table[:, -1].astype(int)
    images.flags.writeable = target.flags.writeable = False
    return images, target


def cone_starts(direction, count: int, *, mu: float, radius: float, rng=None, span=None, edge: bool = False):
    """Initialisations in the cone of the local theorem around ``θ_mm(α)`` ([MMTS], [TFSVM]).

    Every start ``θ`` has ``1 − cos(θ, d) ≤ mu`` and norm ``radius · ‖d‖``: for ``d = θ_mm(α)``
    every SVM-neighbour's logit gap on the cone's axis, ``⟨radius · d, A_iα_i − A_it⟩``, equals
    ``radius``, so ``radius`` is the norm in units of ``‖θ_mm(α)‖`` (the theorem's ``R`` is
    ``radius · ‖θ_mm(α)‖``). A start is ``cos φ · radius · d + sin φ · radius · ‖d‖ · u`` with a
    unit tilt ``u ⟂ d`` drawn uniformly in the subspace ``span`` and the angle ``φ`` uniform in
    ``[0, φ_μ]``, ``cos φ_μ = 1 − mu`` (``edge=False``), or ``φ = φ_μ`` (``edge=True``: the
    tilts then come in antipodal pairs, so a 2-D cone gets both of its edges).

    Args:
        direction: (*shape) ``θ_mm(α)`` (any non-zero parameter).
        count: number of starts.  mu: cone width in ``(0, 1)``.  radius: > 0.
        rng: a ``numpy.random.Generator`` or a seed.
        span: (k, size) rows spanning the subspace to tilt in (default: the whole space), e.g.
            the plane of the keys when other coordinates never change a logit.
        edge: put every start on the cone's edge.

    Returns (count, *shape).

    >>> import numpy as np, attnlib as al
    >>> s = cone_starts([1.0, 0.0, 0.0], 4, mu=1e-3, radius=20, rng=0, span=np.eye(3)[:2], edge=True)
    >>> np.round(al.one_minus_cosine(s, [1.0, 0.0, 0.0]), 12).tolist(), np.round(s[:2, 1], 3).tolist()
    ([0.001, 0.001, 0.001, 0.001], [-0.894, 0.894])
    """
    d = np.asarray(direction, float)
    d_norm = np.linalg.norm(d)
    if not (np.isfinite(d_norm) and d_norm > 0):
        raise ValueError("direction must be finite and non-zero")
    if not isinstance(count, (int, np.integer)) or count < 1:
        raise ValueError(f"count must be a positive integer, got {count!r}")
    if not 0 < mu < 1:
        raise ValueError(f"mu must be in (0, 1), got {mu!r}")
    if not radius > 0:
        raise ValueError(f"radius must be > 0, got {radius!r}")
    unit = d.ravel() / d_norm
    basis = np.eye(unit.size) if span is None else np.asarray(span, float).reshape(-1, unit.size)
    q, _ = np.linalg.qr(basis.T)  # (size, k) orthonormal basis of the span
    rng = np.random.default_rng(rng)
    tilt = rng.standard_normal((count, q.shape[1])) @ q.T
    tilt -= (tilt @ unit)[:, None] * unit
    if edge:
        tilt[1::2] = -tilt[0 : count - 1 : 2]
    norms = np.linalg.norm(tilt, axis=-1, keepdims=True)
    if np.any(norms <= 1e-12):
        raise ValueError("span must contain a direction orthogonal to `direction`")
    tilt /= norms
    phi_mu = np.arccos(1.0 - mu)
    phi = np.full(count, phi_mu) if edge else rng.uniform(0.0, phi_mu, count)
    starts = radius * d_norm * (np.cos(phi)[:, None] * unit + np.sin(phi)[:, None] * tilt)
    return starts.reshape((count,) + d.shape)
