"""Real tokens: image patches of scikit-learn's handwritten digits.

Each 8×8 digit is cut into ``T = (8/patch)²`` non-overlapping ``patch×patch`` patches. Token
``t`` of image ``i`` is the patch's pixels (scaled to [0, 1]) followed by a one-hot positional
code of the patch's place, times ``pos_scale``:

.. math::

    x_{it} = \\big(\\mathrm{pixels}_{it},\\; s\\, e_t\\big) \\in \\mathbb{R}^{\\mathrm{patch}^2 + T}.

Two digit classes give the binary task, ``y = +1`` for ``digits[0]`` and ``−1`` for ``digits[1]``.
The data ship with scikit-learn (no download). :func:`fit_patch_head` fits a fixed linear head
on patches, which gives every patch a score ``γ_it = y_i vᵀ x_it`` ([MMTS] prompt attention).

>>> import attnlib as al
>>> data = al.digit_patches(digits=(3, 8), patch=4, n=10, seed=0)
>>> data.X.shape, data.T, data.d, sorted(set(data.y.tolist()))
((10, 4, 20), 4, 20, [-1.0, 1.0])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["DigitPatches", "digit_patches", "fit_patch_head", "follow_selection"]

#: Side of a scikit-learn digit image, in pixels.
IMAGE_SIZE = 8


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
        >>> data = al.digit_patches(patch=4, n=2)
        >>> data.patch_map(np.arange(4.0))[[0, 0, 7, 7], [0, 7, 0, 7]].tolist()
        [0.0, 1.0, 2.0, 3.0]
        """
        values = np.asarray(values, float)
        if values.shape[-1] != self.T:
            raise ValueError(f"values must have a last axis of length T={self.T}, got shape {values.shape}")
        g, s = self.grid, self.patch
        grid = values.reshape(values.shape[:-1] + (g, g))
        return np.repeat(np.repeat(grid, s, axis=-2), s, axis=-1)


def _check_int(name: str, value, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    return int(value)


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
    >>> data = al.digit_patches(digits=(0, 1), patch=2, n=6, seed=1)
    >>> data.X.shape, data.y.tolist()
    ((6, 16, 20), [1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
    """
    from sklearn.datasets import load_digits

    digits = tuple(digits)
    if len(digits) != 2:
        raise ValueError(f"digits must be two digit classes, got {digits!r}")
    a, b = (_check_int("digits", c, 0, 9) for c in digits)
    if a == b:
        raise ValueError(f"digits must be two different classes, got {digits!r}")
    patch = _check_int("patch", patch, 1, IMAGE_SIZE)
    if IMAGE_SIZE % patch:
        raise ValueError(f"patch must divide {IMAGE_SIZE} (1, 2, 4 or 8), got {patch}")
    if isinstance(pos_scale, bool) or not np.isfinite(pos_scale) or pos_scale <= 0:
        raise ValueError(f"pos_scale must be a positive finite number, got {pos_scale!r}")
    raw = load_digits()
    rng = np.random.default_rng(seed)
    rows = [rng.permutation(np.flatnonzero(raw.target == c)) for c in (a, b)]
    m = min(len(r) for r in rows)
    order = np.concatenate([np.stack([rows[0][:m], rows[1][:m]], axis=1).ravel(), rows[0][m:], rows[1][m:]])
    if n is not None:
        n = _check_int("n", n, 1, len(order))
        order = order[:n]
    images = raw.images[order] / 16.0
    g = IMAGE_SIZE // patch
    T = g * g
    pixels = images.reshape(-1, g, patch, g, patch).transpose(0, 1, 3, 2, 4).reshape(-1, T, patch * patch)
    code = np.broadcast_to(float(pos_scale) * np.eye(T), (len(order), T, T))
    X = np.concatenate([pixels, code], axis=-1)
    y = np.where(raw.target[order] == a, 1.0, -1.0)
    return DigitPatches(X, y, images, order, (a, b), patch, float(pos_scale))


def fit_patch_head(X, y, ridge: float = 1.0) -> np.ndarray:
    """A fixed linear head fit on patches: every patch of image ``i`` is asked to predict ``y_i``.

    .. math::

        v = \\arg\\min_v \\sum_{i,t} (vᵀx_{it} − y_i)^2 + λ‖v‖^2
          = \\Big(\\sum_{i,t} x_{it}x_{it}ᵀ + λI\\Big)^{-1} \\sum_{i,t} y_i x_{it}.

    Least squares rather than the label SVM: on digits the patches of the two classes are not
    linearly separable, so the label SVM over *all* patches is infeasible (:func:`attnlib.label_svm` reports it),
    while the attention theory takes any fixed ``v``. The score ``y_i vᵀ x_it`` then says how much
    patch ``t`` alone speaks for the label of its image.

    Args: ``X`` (n, T, d) tokens, ``y`` (n,) labels ±1, ``ridge`` λ > 0. Returns ``v`` (d,).

    >>> import numpy as np, attnlib as al
    >>> X = np.array([[[1.0, 0.0], [0.0, 0.0]], [[0.0, 1.0], [0.0, 0.0]]])
    >>> np.round(al.fit_patch_head(X, [1, -1], ridge=1.0), 3).tolist()
    [0.5, -0.5]
    """
    from .model import check_labels

    X = np.asarray(X, float)
    if X.ndim != 3:
        raise ValueError(f"X must be (n, T, d), got {X.shape}")
    y = check_labels(y, X.shape[0])
    if isinstance(ridge, bool) or not np.isfinite(ridge) or ridge <= 0:
        raise ValueError(f"ridge must be a positive finite number, got {ridge!r}")
    F = X.reshape(-1, X.shape[2])
    target = np.repeat(y, X.shape[1])
    return np.linalg.solve(F.T @ F + ridge * np.eye(F.shape[1]), F.T @ target)


def follow_selection(
    prob, theta, saturation: float = 0.99, window: int | None = None, cache: dict | None = None
) -> dict:
    """What one recorded trajectory did, measured against the SVM of the selection it made.

    The local theorem of [MMTS] ([TFSVM] for ``W``) says every limit of GD is the ATT-SVM direction
    ``θ_mm(α)`` of a *locally optimal* selection ``α``; on real tokens the selection a run makes need
    not be ``opt``. So the run is judged against its own final selection ``α̂_i = argmax_t σ_it(θ(T))``.

    Args:
        prob: a :class:`attnlib.TokenSelectionProblem` (n samples, T tokens).
        theta: (R, *shape) recorded parameters, the last one final.
        saturation: a sample is saturated when ``σ_iα̂_i ≥ saturation``.
        window: a record index ``w``; if given, also report over the records ``[w, R)``.
        cache: a dict reused across calls on the same ``prob``: selection → (solution, locally optimal).

    Returns a dict: ``select`` (n,) final selection; ``solution`` its ATT-SVM (``None`` if infeasible);
    ``local`` locally optimal (:func:`attnlib.is_locally_optimal`); ``feasible_sel``; ``agree`` the
    fraction of samples with ``α̂_i = opt_i`` and ``agree_min`` its minimum over the records;
    ``saturated`` the fraction saturated at the end; ``rank`` (n,) how many tokens of the sample score
    higher than the selected one (0: optimal); ``omc_sel`` ``1 − cos(θ(T), θ_mm(α̂))``. With ``window``:
    ``settled`` (one selection over the window and every sample saturated at its start), ``growth``
    ``‖θ(T)‖/‖θ(w)‖`` and ``exponent`` :func:`attnlib.offset_exponent` from ``θ(w)`` to ``θ(T)``
    against ``θ_mm(α̂)`` (NaN where the selection is infeasible).

    >>> import numpy as np, attnlib as al
    >>> prob = al.datasets.single_input()
    >>> run = al.train(prob, np.zeros(3), 1000, lr=0.1, record_steps=[0, 250, 1000])
    >>> r = al.follow_selection(prob, run.theta[:, 0], window=1)
    >>> r["select"].tolist(), r["local"], r["settled"], bool(r["exponent"] < 0.5)
    ([0], True, True, True)
    """
    from .metrics import log_one_minus_mass, offset_exponent, one_minus_cosine
    from .svm import InfeasibleError, is_locally_optimal, max_margin

    theta = np.asarray(theta, float)
    if theta.ndim != len(prob.shape) + 1 or theta.shape[1:] != prob.shape or len(theta) < 1:
        raise ValueError(f"theta must be (R, {', '.join(map(str, prob.shape))}) recorded parameters, got {theta.shape}")
    if not 0 < saturation < 1:
        raise ValueError(f"saturation must be in (0, 1), got {saturation!r}")
    cache = {} if cache is None else cache
    picks = prob.selection(theta)  # (R, n)
    final = picks[-1]
    key = tuple(final.tolist())
    if key not in cache:
        try:
            cache[key] = (max_margin(prob, final), is_locally_optimal(prob, final))
        except InfeasibleError:
            cache[key] = (None, False)
    sol, local = cache[key]
    saturated = log_one_minus_mass(prob, theta, final) <= np.log1p(-saturation)  # (R, n)
    chosen = prob.gamma[np.arange(prob.n), final]
    out = dict(select=final, solution=sol, local=local, feasible_sel=sol is not None)
    out["agree"] = float(np.mean(final == prob.opt))
    out["agree_min"] = float(np.mean(picks == prob.opt, axis=1).min())
    out["saturated"] = float(saturated[-1].mean())
    out["rank"] = (prob.gamma > chosen[:, None]).sum(1)
    out["omc_sel"] = float(one_minus_cosine(theta[-1], sol.theta)) if sol is not None else np.nan
    if window is not None:
        if not 0 <= window < len(theta):
            raise ValueError(f"window must be a record index in [0, {len(theta) - 1}], got {window!r}")
        out["settled"] = bool(np.all(picks[window:] == final) and saturated[window].all())
        out["growth"] = float(np.linalg.norm(theta[-1]) / np.linalg.norm(theta[window]))
        out["exponent"] = float(offset_exponent(theta[window], theta[-1], sol.theta)) if sol is not None else np.nan
    return out
