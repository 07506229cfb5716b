"""Every instance of the papers by name, and the seeded random families.

The fixed-head instances of [MMTS] store the score in a third coordinate: ``v = (0, 0, 1)`` and
``W = diag(1, 1, 0)``, so the keys are the first two coordinates (the plane every figure is drawn
in) and ``γ_t`` is the third coordinate times the label.
"""

from __future__ import annotations

import numpy as np

from .model import TokenSelectionProblem, prompt_attention, self_attention

__all__ = [
    "KEY_PLANE",
    "SCORE_HEAD",
    "single_input",
    "SINGLE_INPUT_INITS",
    "multi_input",
    "MULTI_INPUT_INITS",
    "loss_study",
    "joint_tokens",
    "JOINT_P0",
    "JOINT_V0",
    "random_tokens",
    "separable_data",
    "random_and_adversarial_starts",
    "loss_study_offset",
    "loss_study_offset_ratio",
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
    >>> al.datasets.single_input(local=True).gamma.tolist()
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


def joint_tokens(relaxed: bool = False, third=None) -> tuple[np.ndarray, np.ndarray]:
    """[MMTS] Fig. 3 joint-training data ``(X, y)``: ``d = 2``, ``W = I``, ``y = (1, −1, 1)``.

    ``X_1 = {(0,0), (1,1)}``, ``X_2 = {(0,0), (1,−1)}``, ``X_3 = {(0,0), (0.5, 1)}`` (every sample
    a support vector of the label SVM) or ``(0.5, 1.5)`` with ``relaxed=True`` (sample 3 is not).
    ``third`` overrides sample 3's second token.
    """
    x3 = np.asarray(third if third is not None else ((0.5, 1.5) if relaxed else (0.5, 1.0)), float)
    X = np.array([[[0.0, 0.0], [1.0, 1.0]], [[0.0, 0.0], [1.0, -1.0]], [[0.0, 0.0], x3]])
    return X, np.array([1.0, -1.0, 1.0])


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
    >>> prob = al.datasets.multi_input(0)
    >>> starts, adv = al.datasets.random_and_adversarial_starts(prob, al.max_margin(prob).theta, 20, 10.0)
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
    >>> round(float(al.datasets.loss_study_offset(4.0, "linear")), 6)   # ½ ln C for the correlation loss
    0.693147
    """
    from .losses import get_loss

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
    from .metrics import log_one_minus_mass

    sigma_max = np.exp(log_one_minus_mass(loss_study(C, loss), final).max())
    bound = 0.5 * (C + 3) * sigma_max + abs(final[1] - before[1]) * rho / (1 - rho)
    bound += 1e-13 * (1 + np.linalg.norm(final))
    return float(abs(final[1] - loss_study_offset(C, loss)) / bound)
