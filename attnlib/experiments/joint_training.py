"""Chapter 4, joint training of the attention ``p`` and the head ``v`` ([MMTS], joint training).

Trained together, ``v`` tends to the label SVM on the selected tokens, and ``p`` to an attention
SVM whose constraints the label SVM's *support vectors* decide:

- the **full** p-SVM (ATT-SVM of the selection): margin-1 rows for every sample;
- the **relaxed** p-SVM: margin-1 rows only for the support vectors ``S`` of the label SVM, and
  ``⟨p, k_iα_i − k_it⟩ ≥ 0`` (select, no margin) for ``i ∉ S``.

:func:`attnlib.svm.joint_svms` computes ``S`` from the label SVM (never hard-coded) and solves both.

Beyond the paper, :func:`attnlib.svm.balanced_direction` gives the direction predicted for ``p`` when ``‖v‖``
and ``‖p‖`` grow at a fixed ratio ``ρ = ‖v‖/‖p‖`` (joint NGD with one step size has ``ρ → 1``).
It is this book's first-order derivation, not a result of [MMTS]: with ``v = r v̂`` and ``p = R p̂``
the loss of sample ``i`` exceeds its floor by terms ``∝ exp(−(r m_i + R⟨p̂, k_iα_i − k_it⟩))``,
where ``m_i = y_i⟨v̂, x_iα_i⟩`` is the label margin, so ``p̂`` maximises the smallest exponent:

.. math::

    \\hat p(ρ) = \\arg\\max_{‖p‖ ≤ 1} \\min_{i, t ≠ α_i}
    \\big(⟨p, k_{iα_i} − k_{it}⟩ + ρ (m_i − \\min_j m_j)\\big)
    \\quad \\text{s.t.} \\quad ⟨p, k_{iα_i} − k_{it}⟩ ≥ 0 .

``ρ = 0`` gives the full p-SVM direction, ``ρ → ∞`` the relaxed one; in between, samples whose
label margin exceeds the smallest one by less than their attention deficit still pull ``p``.

This module holds the chapter's drivers: the random-instance runs (:func:`random_joint_runs`),
the alignment verdicts (:func:`classify_alignment`), the joint path's bounds and table
(:func:`joint_path_bounds`, :func:`joint_path_rows`, :func:`joint_path_table`); the problem,
the SVMs, the trainer and the path are in the core (``model``, ``svm``, ``optim``, ``paths``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy.integrate import solve_ivp

from ..datasets import JOINT_P0, JOINT_V0, random_joint_tokens
from ..flow import flow_grid, loss_curvature_bounds
from ..losses import get_loss
from ..metrics import angle_degrees, offset_tolerance, one_minus_cosine
from ..model import JointAttention, token_selection
from ..optim import train_joint_problem, train_joint_stack
from ..paths import JointPath, direction_bound, joint_log_gap, joint_log_loss
from ..svm import JointSVMs, balanced_direction, check_selection, joint_svms, max_margin

__all__ = [
    "ALIGNMENT_CLASSES",
    "classify_alignment",
    "RandomJointRuns",
    "random_joint_runs",
    "joint_path_bounds",
    "selected_mass",
    "classifier_confidence",
    "arc_position",
    "train_joint_ratio",
    "joint_path_rows",
    "joint_path_premise",
    "joint_path_table",
    "offset_growth",
    "joint_path_search_gap",
    "joint_smoothness_bound",
    "joint_gradient_flow",
    "train_joint_below_smoothness",
]


#: Labels returned by :func:`classify_alignment`.
ALIGNMENT_CLASSES = ("relaxed", "full", "neither", "same")


def classify_alignment(p, svms: JointSVMs, fraction: float = 0.25, min_separation: float = 2.0) -> np.ndarray:
    """Which p-SVM each ``p`` (*batch, d_k) follows: "relaxed", "full", "neither" or "same".

    With ``Δ`` the angle between the two SVM directions: "relaxed" if ``∠(p, p_relax) ≤
    fraction·Δ``, "full" if ``∠(p, p_full) ≤ fraction·Δ``, "neither" otherwise, and "same" for
    every ``p`` when ``Δ < min_separation`` degrees (the two predictions cannot be told apart).
    With ``fraction ≤ 1/4``, a "relaxed" ``p`` is (triangle inequality) at least three times
    closer in angle to the relaxed direction than to the full one.

    >>> import attnlib as al
    >>> X, y = al.datasets.joint_tokens(relaxed=True)
    >>> classify_alignment([[1.0, 0.01], [1.25, 0.25], [1.1, 0.12]], al.joint_svms(X, y, 1)).tolist()
    ['relaxed', 'full', 'neither']
    """
    if not 0 < fraction < 0.5:
        raise ValueError(f"fraction must be in (0, 0.5) so that the classes are disjoint, got {fraction!r}")
    to_relaxed = angle_degrees(p, svms.relaxed.theta)
    to_full = angle_degrees(p, svms.full.theta)
    sep = svms.separation
    out = np.full(np.shape(to_relaxed), "neither", dtype="<U7")
    if sep < min_separation:
        out[...] = "same"
        return out
    out[to_relaxed <= fraction * sep] = "relaxed"
    out[to_full <= fraction * sep] = "full"
    return out


@dataclass(frozen=True, eq=False)
class RandomJointRuns:
    """Joint NGD on random instances (:func:`random_joint_runs`), one row per run.

    Per instance ``k`` (K of them): ``svms[k]`` (:class:`JointSVMs`) and ``predicted[k]`` (d_k,),
    the direction ``p̂(1)`` of :func:`balanced_direction`. Per run (K·B rows, instance-major;
    ``init == 0`` is the paper's initialisation): ``instance``, ``init``, ``p`` (d_k,) final,
    ``observed`` / ``expected`` alignment classes of ``p`` and of ``p̂(1)``
    (:func:`classify_alignment`), ``v_gap`` / ``v_tol`` (:func:`offset_tolerance` of ``v`` against
    ``v_mm``), ``sv_mass`` / ``other_mass`` (smallest softmax probability of the selected token over
    support-vector inputs / over the other inputs, NaN if none), ``on_selection`` (every input
    puts more than half of its attention on its selected token at the end), ``zero_row`` (per
    instance: a "select, no margin" row is active in ``p̂(1)``).
    """

    svms: tuple
    predicted: np.ndarray
    instance: np.ndarray
    init: np.ndarray
    p: np.ndarray
    observed: np.ndarray
    expected: np.ndarray
    v_gap: np.ndarray
    v_tol: np.ndarray
    sv_mass: np.ndarray
    other_mass: np.ndarray
    on_selection: np.ndarray
    zero_row: np.ndarray
    steps: np.ndarray
    v_path: np.ndarray


def random_joint_runs(
    seed,
    instances: int,
    n: int = 6,
    inits: int = 3,
    steps: int = 1000,
    lr: float = 0.1,
    loss: str = "logistic",
    records: int = 40,
) -> RandomJointRuns:
    """Joint NGD on ``instances`` random instances of :func:`random_joint_tokens` (selection: token 1).

    Instance ``k`` is ``random_joint_tokens(n, d=2, seed=[seed, k])``; its ``inits`` initialisations
    (one batch) are the paper's ``p(0) = (0, −1)``, ``v(0) = (−1, 0)`` and ``inits − 1`` draws of
    ``N(0, I)`` for each of ``p`` and ``v`` (``numpy.random.default_rng(seed)``). Every run is
    recorded at ``records`` evenly spaced iterations, enough for :func:`offset_tolerance`.
    All instances train together as one batch (:func:`train_joint_stack`, one data set per row).

    >>> import attnlib as al
    >>> runs = random_joint_runs(seed=0, instances=2, inits=2, steps=200)
    >>> runs.p.shape, runs.instance.tolist(), runs.init.tolist()
    ((4, 2), [0, 0, 1, 1], [0, 1, 0, 1])
    """

    if not isinstance(instances, (int, np.integer)) or instances < 1:
        raise ValueError(f"instances must be an integer >= 1, got {instances!r}")
    if not isinstance(inits, (int, np.integer)) or inits < 1:
        raise ValueError(f"inits must be an integer >= 1, got {inits!r}")
    if not isinstance(records, (int, np.integer)) or records < 4:
        raise ValueError(f"records must be an integer >= 4, got {records!r}")
    rng = np.random.default_rng(seed)
    whole = ("svms", "predicted", "zero_row", "steps", "v_path")
    rows = {k: [] for k in RandomJointRuns.__dataclass_fields__ if k not in whole}
    all_svms, predicted, zero_row, problems, P, V = [], [], [], [], [], []
    for k in range(instances):
        X, y = random_joint_tokens(n=n, d=2, seed=[seed, k])
        svms = joint_svms(X, y, select=1)
        problems.append(JointAttention(X, y, np.eye(2), loss))
        all_svms.append(svms)
        predicted.append(balanced_direction(svms, rho=1.0))
        P.append(np.vstack([JOINT_P0, rng.standard_normal((inits - 1, 2))]))
        V.append(np.vstack([JOINT_V0, rng.standard_normal((inits - 1, 2))]))
    # every instance's batch in one run (one data set per row)
    trajs = train_joint_stack(problems, np.stack(P), np.stack(V), steps, lr=lr, record_every=max(1, steps // records))
    for k, (svms, p_hat, traj) in enumerate(zip(all_svms, predicted, trajs)):
        v_gap, v_tol, _ = offset_tolerance(traj.steps, traj.v, svms.label.v)
        mass = np.exp(traj.problem.log_attention(traj.p[-1])[..., 1])  # (B, n)
        rows["instance"].append(np.full(inits, k))
        rows["init"].append(np.arange(inits))
        rows["p"].append(traj.p[-1])
        rows["observed"].append(classify_alignment(traj.p[-1], svms))
        rows["expected"].append(np.full(inits, classify_alignment(p_hat, svms)[()]))
        rows["v_gap"].append(v_gap)
        rows["v_tol"].append(v_tol)
        rows["sv_mass"].append(mass[:, svms.support].min(-1))
        rows["other_mass"].append(mass[:, ~svms.support].min(-1) if (~svms.support).any() else np.full(inits, np.nan))
        rows["on_selection"].append(np.all(mass > 0.5, axis=-1))
        zero_row.append(bool(np.min((svms.keys[:, 1] - svms.keys[:, 0]) @ p_hat) < 1e-6))
    out = {key: np.concatenate(value) for key, value in rows.items()}
    return RandomJointRuns(
        svms=tuple(all_svms),
        predicted=np.array(predicted),
        zero_row=np.array(zero_row),
        steps=trajs[0].steps,
        v_path=np.concatenate([traj.v for traj in trajs], axis=1),
        **out,
    )


def joint_path_bounds(X, y, select, path: JointPath, svms, W=None, loss: str = "logistic"):
    """Finite-radius bounds on the joint path's directions, from the two SVM rays (one data set).

    **Head.** ``v̄`` minimises ``L(p̄, ·)`` on its sphere, so ``L(p̄, v̄) ≤ L(p̄, R_v v̂_mm)``. When every
    non-selected token is 0, ``y_i v̄ᵀ x_iα ≥ u_i = y_i v̄ᵀ x̄_i`` (``x̄_i = σ_iα x_iα``) and
    ``L ≥ ℓ(u_min)/n ≥ e^{−u_min}/(2n)`` (logistic, ``u_min ≥ 0``; ``e^{−u}/n`` exponential), so the label
    margin ratio is ``ρ_v ≥ (−log(2n L(p̄, R_v v̂_mm))) ‖v_mm‖/R_v`` and
    ``1 − cos(v̄, v_mm) ≤ 1/ρ_v² − 1`` (:func:`direction_bound`).

    **Attention.** At ``v̄`` the scores ``γ_it = y_i v̄ᵀx_it`` are fixed and ``p̄`` minimises the excess
    ``E = L − L_α(v̄)`` on its sphere. With ``p_S`` the SVM of the support vectors' rows only, the ray
    ``R_p p̂_S`` bounds ``E(p̄)``; as in :func:`ray_margin_bound`, the smallest support-vector margin
    ``m`` of ``p̄`` has ``E ≥ w_S/(e^m + T − 1)`` (``w_S`` the smallest support-vector weight
    ``|ℓ'(γ_iα)|(γ_iα − γ_it)/n``, in log space: ``|ℓ'(γ_iα)| ≈ e^{−R_v m_i}``), and every other term of
    ``E`` is ``≥ 0`` when the selected tokens score highest. So ``ρ_S ≥ m_lo ‖p_S‖/R_p`` and
    ``1 − cos(p̄, p_S) ≤ 1/ρ_S² − 1``. ``p_S`` is the relaxed p-SVM whenever its ``≥ 0`` rows are
    inactive (``relaxed_is_support_svm``).

    Args:
        X: (n, T, 2), y, select: one data set.  path: its :class:`JointPath` (unstacked).
        svms: :func:`attnlib.joint_svms` of the data.

    Returns ``(v_bound (N,), p_bound (N,), p_support (2,), relaxed_is_support_svm)``; a bound is
    ``inf`` where it does not apply (non-zero non-selected tokens for ``v``; a selected token that
    does not score highest, or a vacuous log, for ``p``).
    """

    loss = get_loss(loss)
    X, y = np.asarray(X, float), np.asarray(y, float)
    n, T, d = X.shape
    sel = np.asarray(select)
    W = np.eye(d) if W is None else np.asarray(W, float)
    keys = X @ W.T
    rp, rv = path.radii_p, path.radii_v
    others = np.arange(T) != sel[:, None]
    # head
    v_mm = np.asarray(svms.label.v, float)
    ray_v = rv[:, None] * v_mm / np.linalg.norm(v_mm)
    log_l = joint_log_loss(X, y, keys, path.p, ray_v, loss)
    c = np.log(2 * n) if loss.name == "logistic" else np.log(n)
    rho_v = np.maximum(-c - log_l, 0.0) * np.linalg.norm(v_mm) / rv
    v_bound = direction_bound(rho_v) if np.all(X[others] == 0) else np.full(len(rp), np.inf)
    # attention: SVM of the support vectors' rows only
    S = np.asarray(svms.support, bool)
    onehot = np.zeros((int(S.sum()), T))
    onehot[np.arange(int(S.sum())), sel[S]] = 1.0
    p_S = max_margin(token_selection(keys[S], onehot), sel[S]).theta
    same = bool(np.allclose(p_S, svms.relaxed.theta, atol=1e-6))
    p_bound = np.full(len(rp), np.inf)
    for j in range(len(rp)):
        gamma = y[:, None] * (X @ path.v[j])
        g_sel = gamma[np.arange(n), sel]
        if np.any(np.where(others, gamma, -np.inf) >= g_sel[:, None]):
            continue
        lg_ray, s_ray = joint_log_gap(X, y, keys, sel, rp[j] * p_S / np.linalg.norm(p_S), path.v[j], loss)
        if s_ray <= 0:
            continue
        with np.errstate(divide="ignore"):
            log_slope = loss.log_slope(g_sel)
            log_w = np.min(np.where(others[S], log_slope[S][:, None] + np.log(g_sel[S][:, None] - gamma[S]), np.inf))
        head = log_w - np.log(n) - lg_ray
        with np.errstate(over="ignore"):
            frac = (T - 1) * np.exp(-head)
        if frac >= 1:
            continue
        m_lo = head + np.log1p(-frac)
        p_bound[j] = direction_bound(m_lo * np.linalg.norm(p_S) / rp[j])
    return v_bound, p_bound, p_S, same


def selected_mass(traj, select=1) -> np.ndarray:
    """Softmax probability ``σ_iα_i(p(t))`` of each sample's selected token along a joint run.

    ``traj``: a :class:`attnlib.optim.JointTrajectory` (``p`` of shape (R, B, d_k)); ``select``: the
    selected token, one index for every sample or (n,). Returns (R, B, n).

    >>> import attnlib as al
    >>> traj = al.train_joint(*al.datasets.joint_tokens(), al.datasets.JOINT_P0, al.datasets.JOINT_V0, steps=5)
    >>> selected_mass(traj).shape
    (6, 1, 3)
    """
    log_sigma = traj.problem.log_attention(traj.p)
    sel = check_selection(select, log_sigma.shape[-2], log_sigma.shape[-1])
    return np.exp(log_sigma[..., np.arange(sel.size), sel])


def classifier_confidence(traj) -> np.ndarray:
    """Logistic probability ``σ(y_i f(X_i))`` of every sample along a joint run: (R, B, n).

    Computed as ``(1 + tanh(u/2))/2`` with ``u = y_i f(X_i)``, which never overflows.
    """
    return 0.5 * (1.0 + np.tanh(traj.problem.output(traj.p, traj.v) / 2.0))


def arc_position(P, svms: JointSVMs) -> np.ndarray:
    """Where 2-D directions ``P`` (*batch, 2) lie on the arc from the relaxed (0) to the full (1) p-SVM.

    The signed angle from the relaxed p-SVM towards the full one, in units of the angle between them
    (values below 0 or above 1 lie beyond an end). Meaningful only when the two SVMs differ.

    >>> import attnlib as al
    >>> svms = al.joint_svms(*al.datasets.joint_tokens(relaxed=True), select=1)
    >>> [round(float(a), 6) for a in arc_position([svms.relaxed.theta, svms.full.theta], svms)]
    [0.0, 1.0]
    """
    start = np.arctan2(svms.relaxed.theta[1], svms.relaxed.theta[0])
    sep = np.angle(np.exp(1j * (np.arctan2(svms.full.theta[1], svms.full.theta[0]) - start)))
    P = np.asarray(P, float)
    return np.angle(np.exp(1j * (np.arctan2(P[..., 1], P[..., 0]) - start))) / sep


def train_joint_ratio(
    datasets, p0, v0, steps: int, rho: float = 1.0, lr: float = 0.1, loss: str = "logistic", W=None, record_every=1
) -> list:
    """Joint NGD with step ``η`` on ``p`` and ``ρη`` on ``v``, so that ``‖v(t)‖/‖p(t)‖ → ρ``.

    Written as :func:`train_joint_stack` on the reparametrised problem ``v = ρ u``: the data
    ``ρ X`` with ``W/ρ`` have the same keys and the values ``uᵀ(ρ x) = vᵀ x``, and a normalised step
    of length ``η`` on ``u`` is one of length ``ρη`` on ``v`` along the same direction. ``rho = 1``
    is :func:`train_joint_stack` itself (``datasets``: a sequence of ``(X, y)``, ``W`` the keys, default identity);
    returns one :class:`attnlib.optim.JointTrajectory` per data set, in ``v`` (not ``u``), each with
    the original problem.

    >>> import numpy as np, attnlib as al
    >>> sets = [al.datasets.joint_tokens(relaxed=True)]
    >>> traj = train_joint_ratio(sets, al.datasets.JOINT_P0, al.datasets.JOINT_V0, 400, rho=3.0)[0]
    >>> round(float(np.linalg.norm(traj.v[-1, 0]) / np.linalg.norm(traj.p[-1, 0])))
    3
    """
    import dataclasses

    if not np.isfinite(rho) or rho <= 0:
        raise ValueError(f"rho must be a finite number > 0, got {rho!r}")
    d = np.asarray(datasets[0][0]).shape[-1]
    W = np.eye(d) if W is None else np.asarray(W, float)
    scaled = [JointAttention(rho * np.asarray(X, float), y, W / rho, loss) for X, y in datasets]
    trajs = train_joint_stack(scaled, p0, np.asarray(v0, float) / rho, steps, lr=lr, record_every=record_every)
    return [
        dataclasses.replace(t, v=rho * t.v, problem=JointAttention(np.asarray(X, float), y, W, t.problem.loss))
        for t, (X, y) in zip(trajs, datasets)
    ]


def _rotate2(P, degrees: float) -> np.ndarray:
    """2-D vectors ``P`` (..., 2) rotated by ``degrees`` (counter-clockwise)."""
    a = np.radians(degrees)
    return np.asarray(P, float) @ np.array([[np.cos(a), np.sin(a)], [-np.sin(a), np.cos(a)]])


def joint_path_premise(X, y, select, path: JointPath, svms, W=None, loss: str = "logistic", rotate: float = 0.0):
    """The premise of :func:`joint_path_bounds` at the largest radius: is the search's point no worse than the rays?

    The ray bounds hold for any point ``(p̄, v̄)`` with ``L(p̄, v̄) ≤ L(p̄, R_v v̂_mm)`` (head) and
    ``E(p̄) ≤ E(R_p p̂_S)`` at ``v̄`` (attention, ``E`` the excess :func:`joint_log_gap`), which the path's
    search claims but does not prove (a grid search). Returns ``(head, attention)``: the two log-excesses
    ``log L(p̄, v̄) − log L(p̄, ray)`` and ``log E(p̄) − log E(ray)`` (``≤ 0``: the premise holds; ``+inf``
    where ``E(p̄) ≤ 0`` fails the premise's sign). ``rotate`` (degrees) turns the block being compared
    first (``v̄`` in the head's excess, ``p̄`` in the attention's, the other block kept): the control, a
    search that missed that block's optimum by that angle. One data set, ``path`` unstacked.

    >>> import numpy as np, attnlib as al
    >>> X, y = al.datasets.joint_tokens(relaxed=True)
    >>> path = al.paths.joint_regularization_path(X, y, 1, [100.0], [1e4])
    >>> head, att = joint_path_premise(X, y, np.ones(3, int), path, al.joint_svms(X, y, select=1))
    >>> bool(head <= 1e-9 and att <= 1e-9)
    True
    """
    loss = get_loss(loss)
    X, y = np.asarray(X, float), np.asarray(y, float)
    d = X.shape[-1]
    W = np.eye(d) if W is None else np.asarray(W, float)
    keys = X @ W.T
    sel = np.asarray(select)
    rp, rv = float(path.radii_p[-1]), float(path.radii_v[-1])
    p_bar, v_bar = path.p[-1], path.v[-1]
    v_mm = np.asarray(svms.label.v, float)
    head = float(
        joint_log_loss(X, y, keys, p_bar, _rotate2(v_bar, rotate), loss)
        - joint_log_loss(X, y, keys, p_bar, rv * v_mm / np.linalg.norm(v_mm), loss)
    )
    S = np.asarray(svms.support, bool)
    onehot = np.zeros((int(S.sum()), X.shape[1]))
    onehot[np.arange(int(S.sum())), sel[S]] = 1.0
    p_S = max_margin(token_selection(keys[S], onehot), sel[S]).theta
    lg_bar, s_bar = joint_log_gap(X, y, keys, sel, _rotate2(p_bar, rotate), v_bar, loss)
    lg_ray, s_ray = joint_log_gap(X, y, keys, sel, rp * p_S / np.linalg.norm(p_S), v_bar, loss)
    attention = (
        float(lg_bar - lg_ray) if (s_bar > 0 and s_ray > 0) else (float("-inf") if s_bar <= 0 < s_ray else float("inf"))
    )
    return head, attention


def _signed_key(log_e, sign):
    """Order excesses ``E = sign·e^log_e`` on one axis: ``(sign, sign·log|E|)`` as in the path's search."""
    return np.asarray(sign, float), np.asarray(sign, float) * np.asarray(log_e, float)


def _excess_over(search, best) -> float:
    """``search − best`` of two ``(sign, key)`` pairs: the key difference when the signs agree, ``±inf`` else."""
    (s_search, k_search), (s_best, k_best) = search, best
    if s_search == s_best:
        return float(k_search - k_best)
    return float("inf") if s_search > s_best else float("-inf")


def joint_path_search_gap(
    X, y, select, path: JointPath, W=None, loss: str = "logistic", grid: int = 719, rotations=(0.0,)
) -> np.ndarray:
    """Is the path's point the minimiser? Its two block objectives against an independent search, at the largest radius.

    The path (:func:`attnlib.paths.joint_regularization_path`) claims that ``v̄`` minimises
    ``log L(p̄, ·)`` on the circle ``‖v‖ = R_v`` and ``p̄`` minimises the signed excess
    ``L(·, v̄) − L_α(v̄)`` (:func:`joint_log_gap`) on ``‖p‖ = R_p``. This evaluates both objectives on
    an independent grid of ``grid`` angles (a prime count, offset by half a spacing, so it shares no
    angle with the path's grid or the axes) and returns, for each angle of ``rotations`` (degrees: the
    block being judged turned by it, the other kept; ``0`` is the search's point, a turn is the
    control, a search that missed by that angle), the rows ``(head, attention)``: the point's
    objective minus the grid's best (``≤ 0``: no grid point beats it; a search trapped in a wrong
    basin or short of its optimum by more than half the grid's spacing gives ``> 0``). One data set,
    ``path`` unstacked. Returns (len(rotations), 2).

    >>> import numpy as np, attnlib as al
    >>> X, y = al.datasets.joint_tokens(relaxed=True)
    >>> path = al.paths.joint_regularization_path(X, y, 1, [100.0], [1e4])
    >>> gap = joint_path_search_gap(X, y, np.ones(3, int), path, rotations=(0.0, 1.0))
    >>> bool(np.all(gap[0] <= 0)), bool(np.all(gap[1] > 0))
    (True, True)
    """
    if not (isinstance(grid, (int, np.integer)) and grid >= 8):
        raise ValueError(f"grid must be an integer >= 8, got {grid!r}")
    loss = get_loss(loss)
    X, y = np.asarray(X, float), np.asarray(y, float)
    W = np.eye(X.shape[-1]) if W is None else np.asarray(W, float)
    keys = X @ W.T
    sel = np.asarray(select)
    rp, rv = float(path.radii_p[-1]), float(path.radii_v[-1])
    p_bar, v_bar = path.p[-1], path.v[-1]
    angles = (np.arange(grid) + 0.5) * 2 * np.pi / grid
    circle = np.stack([np.cos(angles), np.sin(angles)], axis=-1)
    # one grid per block, shared by the point and its controls
    head_best = joint_log_loss(X, y, keys, p_bar, rv * circle, loss).min()
    sign, key = _signed_key(*joint_log_gap(X, y, keys, sel, rp * circle, v_bar, loss))
    lowest = np.min(sign)
    best = int(np.argmin(np.where(sign == lowest, key, np.inf)))
    turned = np.stack([_rotate2(p_bar, a) for a in rotations]), np.stack([_rotate2(v_bar, a) for a in rotations])
    head = joint_log_loss(X, y, keys, p_bar, turned[1], loss) - head_best
    s_point, k_point = _signed_key(*joint_log_gap(X, y, keys, sel, turned[0], v_bar, loss))
    attention = [_excess_over((s, k), (float(sign[best]), float(key[best]))) for s, k in zip(s_point, k_point)]
    return np.stack([head, attention], axis=-1)


def joint_path_rows(path: JointPath, X, y, svms_list, select=1, predicted=None) -> list[dict]:
    """Per data set of a stacked :class:`JointPath`, the end of the path against the SVMs (a table row).

    Args: ``path`` with ``p``, ``v`` of shape (S, N, 2); ``X`` (S, n, T, 2), ``y`` (S, n);
    ``svms_list``: S :class:`JointSVMs`; ``select``: the selected token of every sample.

    Returns one dict per data set, at the largest radius: ``v_ratio`` ``(1 − cos(v̄, v_mm))`` over its
    bound, ``p_ratio`` / ``full_ratio`` ``(1 − cos)`` of ``p̄`` to the relaxed / full p-SVM over the
    attention bound (NaN when that bound is not for the relaxed SVM, ``same`` False), the angles
    ``to_v``, ``to_relaxed``, ``to_full``, ``to_balanced`` (to ``p̂(1)``) in degrees, and ``cls``
    (:func:`classify_alignment`). Bounds from :func:`joint_path_bounds`; ``premise_*`` from
    :func:`joint_path_premise` (the point against the rays); ``search_*`` / ``search_off_*`` from
    :func:`joint_path_search_gap` (the point, and the point turned by 1° either way, weaker of the
    two, against an independent grid). ``predicted``: the S
    directions ``p̂(1)`` if already computed (default: :func:`balanced_direction` of each).
    """
    p_hat = [balanced_direction(svms, rho=1.0) for svms in svms_list] if predicted is None else predicted
    rows = []
    for s, svms in enumerate(svms_list):
        one = JointPath(
            path.radii_p,
            path.radii_v,
            path.p[s],
            path.v[s],
            path.rounds[s],
            path.log_loss[s],
            path.log_gap[s],
            path.gap_sign[s],
            path.select,
            path.unsettled,
        )
        sel = check_selection(select, X.shape[1], X.shape[2])
        v_bound, p_bound, _, same = joint_path_bounds(X[s], y[s], sel, one, svms)
        premise = joint_path_premise(X[s], y[s], sel, one, svms)
        search, *off = joint_path_search_gap(X[s], y[s], sel, one, rotations=(0.0, -1.0, 1.0))
        off = np.array(off)
        p_end, v_end = path.p[s, -1], path.v[s, -1]
        rows.append(
            dict(
                v_ratio=float(one_minus_cosine(v_end, svms.label.v) / v_bound[-1]),
                p_ratio=float(one_minus_cosine(p_end, svms.relaxed.theta) / p_bound[-1]) if same else np.nan,
                full_ratio=float(one_minus_cosine(p_end, svms.full.theta) / p_bound[-1]) if same else np.nan,
                to_relaxed=float(angle_degrees(p_end, svms.relaxed.theta)),
                to_full=float(angle_degrees(p_end, svms.full.theta)),
                to_balanced=float(angle_degrees(p_end, p_hat[s])),
                to_v=float(angle_degrees(v_end, svms.label.v)),
                cls=str(classify_alignment(p_end, svms)[()]),
                same=same,
                premise_head=premise[0],
                premise_attention=premise[1],
                search_head=float(search[0]),
                search_attention=float(search[1]),
                search_off_head=float(off[:, 0].min()),
                search_off_attention=float(off[:, 1].min()),
            )
        )
    return rows


def joint_path_table(tables: dict, names: dict) -> str:
    """A Markdown table of :func:`joint_path_rows`: one line per data set and ratio exponent ``κ``.

    ``tables``: ``{(data, kappa): rows}``; ``names``: ``{data: [one name per row]}``.
    Columns: data, κ, ∠(v̄, v_mm), ∠(p̄, relaxed), ∠(p̄, full), ∠(p̄, p̂(1)), alignment class.
    """
    lines = [
        "| data | κ | ∠(v̄, v_mm) | ∠(p̄, relaxed) | ∠(p̄, full) | ∠(p̄, p̂(1)) | follows |",
        "|---|---|---|---|---|---|---|",
    ]
    for (data, kappa), rows in tables.items():
        for name, r in zip(names[data], rows):
            lines.append(
                f"| {name} | {kappa:g} | {r['to_v']:.2e}° | {r['to_relaxed']:.3g}° | {r['to_full']:.3g}° "
                f"| {r['to_balanced']:.3g}° | {r['cls']} |"
            )
    return "\n".join(lines)


def offset_growth(steps, theta, direction, slack: float = 1.5, floor: float = 1e-12) -> np.ndarray:
    """Does the offset from ``direction`` stop growing? ``spread_late / (slack·spread_early)``, (*batch,).

    With ``o(t) = θ(t) − ⟨θ(t), d̂⟩ d̂`` the offset orthogonal to ``d`` (``d`` (d,) or one per run,
    (*batch, d)), the late spread is ``max ‖o(s) − o(T)‖`` over the records ``s`` in ``[T/2, T]`` and
    the early spread ``max ‖o(s) − o(T/2)‖`` over ``[T/4, T/2]`` (``T`` the last recorded step). For an
    offset that moves monotonically in each window these are its changes over the two windows.

    *Where it is valid* (derived for a run converging in direction to ``d``, offset
    ``o(t) = o_∞ + Σ_k c_k φ_k(t)`` with decaying modes): a mode ``t^(−b)``, ``b > 0``, gives the ratio
    ``2^(−b)/slack < 1``; a mode ``exp(−a t)`` gives ``e^(−x)(1 + e^(−x))/slack``
    with ``x = aT/4``, at most 1 when ``aT ≥ 0.78`` (and ``4/3`` as ``aT → 0``: a mode still in its
    linear stretch at ``T`` looks like a wrong direction, and no statistic of the run can tell them
    apart). Two modes of opposite signs make the offset turn; the spread, unlike the net change,
    counts the excursion of a turn inside the early window, so a turn does not shrink the
    denominator. The early spread must stay above the rounding of ``o`` (``floor`` relative to
    ``‖θ(T)‖``, which also keeps it from dividing by zero): a run that settled to rounding before
    ``T/4`` is no longer measured, and passes only if its late spread is at rounding too.

    *What fails:* heading to a direction ``δ`` off ``d``, the offset from ``d`` grows like
    ``sin δ · ‖θ‖``; a run whose norm grows linearly in ``steps`` (NGD: ``‖θ‖ ≈ ηt``) doubles the
    spread from one window to the next, ratio ``→ 2/slack`` (``4/3`` for the default ``slack = 1.5``,
    the slack of :func:`attnlib.metrics.offset_tolerance`). The check is ``ratio ≤ 1``. Pass
    ``steps = log t`` for a norm that grows like ``log t`` (GD). Unlike the final ``1 − cos`` of
    :func:`offset_tolerance`, the spreads cancel the offset the run still carries, so a reference
    turned toward where the run happens to be at ``T`` does not score better than the limit.

    >>> import numpy as np
    >>> t = np.arange(0, 101.0)
    >>> run = np.stack([t + 1.0, 1.0 - 1.0 / (t + 1.0)], -1)  # offset settling at 1
    >>> bool(offset_growth(t, run, [1.0, 0.0]) <= 1), bool(offset_growth(t, run, [1.0, 0.02]) <= 1)
    (True, False)
    """
    steps = np.asarray(steps, float)
    theta = np.asarray(theta, float)
    if steps.ndim != 1 or theta.shape[0] != steps.size or steps.size < 3:
        raise ValueError(
            f"steps (R,) and theta (R, ...) must have the same length >= 3, got {steps.shape}, {theta.shape}"
        )
    if not slack >= 1:
        raise ValueError(f"slack must be >= 1, got {slack!r}")
    first, T = steps[0], steps[-1]
    quarter, half = np.searchsorted(steps, [first + (T - first) / 4, first + (T - first) / 2])
    if not 0 <= quarter < half < steps.size - 1:
        raise ValueError("offset_growth needs distinct records near T/4, T/2 and T")
    unit = np.asarray(direction, float)
    unit = unit / np.linalg.norm(unit, axis=-1, keepdims=True)
    offset = theta - np.sum(theta * unit, axis=-1, keepdims=True) * unit  # (R, *batch, d)
    late = np.linalg.norm(offset[half:] - offset[-1], axis=-1).max(axis=0)
    early = np.linalg.norm(offset[quarter : half + 1] - offset[half], axis=-1).max(axis=0)
    tiny = floor * np.linalg.norm(theta[-1], axis=-1)
    return late / (slack * np.maximum(early, tiny))


def joint_smoothness_bound(joint: JointAttention, radius: float) -> float:
    """An upper bound ``L(r)`` on ``‖∇²L(p, v)‖₂`` over every ``p`` and every ``‖v‖ ≤ r``.

    The joint loss has no global smoothness constant (its curvature in ``p`` grows with the
    scores ``γ_it = y_i vᵀx_it``, i.e. with ``‖v‖``), so GD's step condition ``η ≤ 1/L`` is stated on
    a ball in ``v``: the ball is convex, so the descent lemma holds for every step whose two ends lie
    in it. Derivation, as in :func:`attnlib.flow.smoothness_bound`, with ``u_i = E_σ[γ]``:
    ``∇_v u_i = y_i E_σ[x]`` (norm ``≤ X_i = max_t ‖x_it‖``), ``∇²_vv u_i = 0``,
    ``∇_p u_i = Cov(γ, k)`` (``≤ Δ_i D_i/4``), ``∇²_pp u_i`` (``≤ Δ_i D_i²/4``) and
    ``∇²_pv u_i = y_i Cov(x, k)`` (``≤ S_i D_i/4``), with ``D_i`` the keys' span, ``S_i`` the tokens'
    span and the scores' span ``Δ_i ≤ r S_i``. Then ``‖∇²u_i‖ ≤ Δ_i D_i²/4 + S_i D_i/4`` and

    .. math::

        L(r) = \\frac1n \\sum_i \\Big(\\max ℓ''\\,\\big((r S_i D_i/4)^2 + X_i^2\\big)
        + \\max|ℓ'|\\,\\big(r S_i D_i^2/4 + S_i D_i/4\\big)\\Big),

    ``ℓ'`` and ``ℓ''`` bounded over the outputs' range ``|u_i| ≤ r X_i``
    (:func:`attnlib.flow.loss_curvature_bounds`). The test compares it with a finite-difference Hessian.

    >>> import numpy as np, attnlib as al
    >>> X, y = al.datasets.joint_tokens(relaxed=True)
    >>> round(joint_smoothness_bound(al.JointAttention(X, y, np.eye(2), "logistic"), 10.0), 3)
    16.513
    """
    if not (np.isscalar(radius) and np.isfinite(radius) and radius > 0):
        raise ValueError(f"radius must be a positive finite number (the bound on ||v||), got {radius!r}")

    def span(Z):  # max_{t, tau} ||z_t - z_tau|| per sample
        return np.sqrt(((Z[:, :, None, :] - Z[:, None, :, :]) ** 2).sum(-1)).max(axis=(-2, -1))

    D, S = span(joint.keys), span(joint.X)
    Xmax = np.linalg.norm(joint.X, axis=-1).max(-1)
    d1, d2 = loss_curvature_bounds(joint.loss, -radius * Xmax, radius * Xmax)
    per_sample = d2 * ((radius * S * D / 4) ** 2 + Xmax**2) + d1 * (radius * S * D**2 / 4 + S * D / 4)
    return float(per_sample.mean())


def joint_gradient_flow(joint: JointAttention, p0, v0, times=None, t_max: float = 1e15, rtol: float = 1e-10):
    """Gradient flow of the joint loss, ``d(p, v)/dt = −∇L``, to ``t = t_max`` in the log time ``u = log(1 + t)``.

    The limit ``η → 0`` of plain GD (the step condition of the theorems holds for any ``L``), integrated
    as :func:`attnlib.flow.gradient_flow` does for ``p`` alone: ``d(p, v)/du = −(1 + t)∇L``, of order
    one once ``∇L ~ 1/t``, with the cancellation-free scaled gradients of
    :meth:`attnlib.JointAttention.scaled_grad` (LSODA, relative and absolute tolerance ``rtol``).
    ``p0`` (d_k,), ``v0`` (d,): one start. Returns ``(times (R,), p (R, d_k), v (R, d), seconds)``;
    raises RuntimeError if the solver fails (nothing half-computed is returned).

    >>> import numpy as np, attnlib as al
    >>> X, y = al.datasets.joint_tokens(relaxed=True)
    >>> t, p, v, _ = joint_gradient_flow(al.JointAttention(X, y, np.eye(2), "logistic"), [0, -1], [-1, 0], t_max=1e6)
    >>> p.shape, bool(np.linalg.norm(v[-1]) > np.linalg.norm(v[1]))
    ((66, 2), True)
    """
    times = flow_grid(t_max) if times is None else np.asarray(times, float)
    if times.ndim != 1 or times.size < 2 or times[0] != 0 or np.any(np.diff(times) <= 0):
        raise ValueError("times must be increasing record times starting at 0 (at least two)")
    start = np.concatenate([np.asarray(p0, float).ravel(), np.asarray(v0, float).ravel()])
    if not np.all(np.isfinite(start)):
        raise ValueError("p0 and v0 must be finite")
    k = joint.keys.shape[-1]

    def field(u, state):
        (m_p, g_p), (m_v, g_v) = joint.scaled_grad(state[:k], state[k:])
        with np.errstate(under="ignore"):
            return -np.concatenate([np.exp(u + m_p) * g_p, np.exp(u + m_v) * g_v])

    clock = time.perf_counter()
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        sol = solve_ivp(
            field, (0.0, np.log1p(times[-1])), start, method="LSODA", t_eval=np.log1p(times), rtol=rtol, atol=rtol
        )
    seconds = time.perf_counter() - clock
    if sol.status != 0 or sol.y.shape[1] != times.size or not np.all(np.isfinite(sol.y)):
        raise RuntimeError(f"joint gradient flow failed before t = {times[-1]:g}: {sol.message}")
    return times, sol.y[:k].T, sol.y[k:].T, seconds


def train_joint_below_smoothness(joint: JointAttention, p0, v0, steps: int, radius: float, record_steps=None):
    """Plain GD on ``(p, v)`` at ``η = 1/L(r)`` (:func:`joint_smoothness_bound`), certified on its ball.

    The step is below ``1/L`` only while ``‖v‖ ≤ r``; if the run leaves that ball the radius is
    doubled past the largest ``‖v‖`` reached and the run repeated (a smaller step), so the returned
    run never leaves the ball its step was computed on. Returns ``(trajectory, r, η)``.

    >>> import numpy as np, attnlib as al
    >>> X, y = al.datasets.joint_tokens(relaxed=True)
    >>> joint = al.JointAttention(X, y, np.eye(2), "logistic")
    >>> traj, r, lr = train_joint_below_smoothness(joint, [0, -1], [-1, 0], 50, 5.0)
    >>> bool(np.linalg.norm(traj.v, axis=-1).max() <= r), traj.method
    (True, 'gd')
    """
    if not (np.isscalar(radius) and np.isfinite(radius) and radius > 0):
        raise ValueError(f"radius must be a positive finite number (the bound on ||v||), got {radius!r}")
    for _ in range(20):
        lr = 1.0 / joint_smoothness_bound(joint, radius)
        traj = train_joint_problem(joint, p0, v0, steps, method="gd", lr=lr, record_steps=record_steps)
        reached = float(np.linalg.norm(traj.v, axis=-1).max())
        if reached <= radius:
            return traj, radius, lr
        radius = 2.0 * reached
    raise RuntimeError("train_joint_below_smoothness: the run kept leaving the ball of its step after 20 doublings")
