"""Chapter 8, beyond a fixed decoder and ``W(0) = 0`` [FAST]: the initialisation sweep and its ceiling.

The chapter's random-initialisation experiment: NGD and the Polyak step from ``W_0 = 0`` and from
random starts of a given norm on many problems of :func:`attnlib.datasets.random_tokens`, reduced
exactly to the span of their feature differences (:func:`attnlib.model.reduce_to_span`), every start
of every (family, d) in one batch per method (:class:`InitialisationSweep`); and the binomial ceiling
the random starts' count of local endings is checked against (:func:`local_ending_ceiling`); the
loss-rate check's per-run statistic (:func:`rate_deviation`) and the rule that decides which wrong
references it can resolve (:func:`resolvable`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import numpy as np
from scipy import stats

from .. import datasets
from ..model import reduce_to_span
from ..optim import run_independent, train_many
from ..svm import max_margin

__all__ = ["InitialisationSweep", "local_ending_ceiling", "rate_deviation", "resolvable"]


@dataclass
class InitialisationSweep:
    """Local endings of NGD and Polyak runs from ``W_0 = 0`` and from random starts, on many problems.

    Problem ``k`` of a (family, d, base) block is ``random_tokens(n, T, d, base·10⁴ + k, family=family)``
    (``base`` None: the page's ``seed``), ``k < n_init``, reduced to its ``n(T − 1)`` span coordinates.
    A start of scale ``s`` is a standard Gaussian ``d × d`` matrix rescaled to norm ``s·‖W_mm‖``
    (``s = 0``: ``W_0 = 0``), drawn in order from ``default_rng([base or seed, d])`` and projected on
    the span through its logit differences (the component outside the span changes no logit difference
    and receives no gradient, so the reduction stays exact for the selection).

    A run **ends locally** if its final selection ``argmax_t σ_it`` is not ``opt`` in every sequence,
    or (Polyak) if the optimizer's detector stopped it. ``drawn`` caches every block's problems, their
    reductions and W-SVM margins: ``drawn[family, d, base] = (full, reduced, margins)``.

    Attributes: ``n``, ``T``, ``n_init`` problems per block, ``seed`` the page's data seed, ``steps``
    and ``lr`` of NGD (Polyak runs with multiplier 1).

    >>> sweep = InitialisationSweep(n=3, T=4, n_init=5, seed=0, steps=50, lr=1.0)
    >>> counts = sweep.run([("global", 8, (0.0, 1.0), None)])[0]
    >>> sorted(counts), all(0 <= c <= 5 for c in counts.values())
    ([('ngd', 0.0), ('ngd', 1.0), ('polyak', 0.0), ('polyak', 1.0)], True)
    """

    n: int
    T: int
    n_init: int
    seed: int
    steps: int
    lr: float
    drawn: dict = field(default_factory=dict)

    def seeds(self, base=None) -> list[int]:
        """Data seeds of a block: ``base·10⁴ + k`` (``base`` None: the page's ``seed``), ``k < n_init``."""
        return [(self.seed if base is None else base) * 10_000 + k for k in range(self.n_init)]

    def problems(self, family: str, d: int, base=None) -> tuple[list, list, np.ndarray]:
        """``(full, reduced, margins)`` of a block: the problems, their reductions, their W-SVM margins (cached)."""
        if (family, d, base) not in self.drawn:
            full = [datasets.random_tokens(self.n, self.T, d, s, family=family) for s in self.seeds(base)]
            red = [reduce_to_span(p, size=self.n * (self.T - 1)) for p in full]
            self.drawn[family, d, base] = full, red, np.array([max_margin(r.problem).margin for r in red])
        return self.drawn[family, d, base]

    def starts(self, family: str, d: int, scales, base=None) -> np.ndarray:
        """Reduced starts of a block, ``(len(scales)·n_init, n(T − 1))``: row ``j·n_init + k`` starts problem ``k``
        at ``scales[j]``; the starts of every scale are drawn in order from one generator per block."""
        full, red, margins = self.problems(family, d, base)
        n = self.n
        rng = np.random.default_rng([self.seed if base is None else base, d])
        block = np.zeros((len(scales) * self.n_init, n * (self.T - 1)))
        for j, scale in enumerate(scales):
            for k, (r, p) in enumerate(zip(red, full)):
                W0 = rng.standard_normal((d, d))
                W0 *= scale / margins[k] / np.linalg.norm(W0)
                logits = p.logits(W0)
                gaps = logits - logits[np.arange(n), p.opt][:, None]  # the start's logit differences
                block[j * self.n_init + k, : r.rank] = r.coef.T @ gaps.ravel()
        return block

    def run(self, specs) -> list[dict]:
        """Local endings for every ``(family, d, scales, base)`` of ``specs``, every start in one batch per method.

        Returns one dict per spec, ``{(method, scale): count}`` (``method`` ``"ngd"`` or ``"polyak"``), the
        number of its ``n_init`` runs from that scale that end locally.
        """
        probs, starts = [], []
        for family, d, scales, base in specs:
            probs += [r.problem for r in self.problems(family, d, base)[1]] * len(scales)
            starts.append(self.starts(family, d, scales, base))
        local = [{} for _ in specs]
        cut = np.cumsum([len(b) for b in starts])
        theta0 = np.concatenate(starts)

        def ends_on_opt(method):  # one batch per method; the two are independent (run_independent)
            lr = self.lr if method == "ngd" else 1.0
            run = train_many(probs, self.steps, method, lr, record=[self.steps], theta0=theta0)
            return [np.all(p.selection(run.final[k]) == p.opt) and run.stopped[k] is None for k, p in enumerate(probs)]

        methods = ("ngd", "polyak")
        for method, ends_opt in zip(methods, run_independent([partial(ends_on_opt, m) for m in methods])):
            for counts, (_, _, scales, _), ends in zip(local, specs, np.split(ends_opt, cut)):
                missed = self.n_init - np.sum(np.reshape(ends, (len(scales), self.n_init)), axis=1)
                counts.update({(method, scale): int(m) for scale, m in zip(scales, missed)})
        return local


def local_ending_ceiling(k0: int, N: int, n_checked: int | None = None) -> tuple[int, float]:
    """The ceiling on local endings of ``n_checked`` runs (default ``N``) given ``k0`` of ``N`` reference runs.

    ``p⁺`` is the one-sided 95% Clopper–Pearson upper bound of the rate ``k0/N``; the ceiling is the
    99% quantile of ``Bin(n_checked, p⁺)``. Returns ``(ceiling, p⁺)``.

    >>> ceiling, p_hi = local_ending_ceiling(4, 200, 100)
    >>> ceiling, round(p_hi, 4)
    (10, 0.0452)
    """
    p_hi = 1.0 if k0 == N else float(stats.beta.ppf(0.95, k0 + 1, N - k0))
    return int(stats.binom.ppf(0.99, N if n_checked is None else n_checked, p_hi)), p_hi


def rate_deviation(rates, bounds, scale=1.0) -> np.ndarray:
    """Each run's ``|scale·r_k − 1|`` in units of its own bound ``τ_k``: at most 1 where the rate is predicted.

    ``rates`` (K,): a run's measured rate in units of ``1/‖u^mm‖`` (the drop of ``−log L`` per unit of
    ``‖u‖``), ``bounds`` (K,): ``τ_k = log(n)‖u^mm‖/Δ‖u‖``. ``scale`` (a number or (K,)) puts the rate
    in the units of another reference, of norm ``scale·‖u^mm‖`` (a control). Returns (K,).

    **The bound** (chapter 8's loss-rate derivation, fixed before the data): for the logistic loss and
    saturated attention ``−log L = min_i y_i f(X_i) + b`` with ``b ∈ [0, log n]``, and
    ``min_i y_i f → ‖u_t‖/‖u^mm‖``, so the end-to-end drop per unit of ``‖u‖`` is ``1/‖u^mm‖`` within
    ``log n/Δ‖u‖``.

    >>> rate_deviation([1.001, 0.99], [0.01, 0.02]).round(3).tolist()
    [0.1, 0.5]
    >>> rate_deviation([1.001], [0.01], scale=1.15).round(1).tolist()
    [15.1]
    """
    return np.abs(np.asarray(scale) * np.asarray(rates, float) - 1) / np.asarray(bounds, float)


def resolvable(norm_ratio, bounds) -> np.ndarray:
    """Runs on which a reference of norm ``ρ_k‖u^mm‖`` lies beyond what the rate check can resolve.

    ``norm_ratio`` (K,) ``ρ_k``, ``bounds`` (K,) ``τ_k`` (:func:`rate_deviation`). True where
    ``|ρ_k − 1| > τ_k(1 + ρ_k)``: there, a run whose rate passes (``|r_k − 1| ≤ τ_k``) gives
    ``|ρ_k r_k − 1| ≥ |ρ_k − 1| − ρ_k τ_k > τ_k``, so the control fails by construction. Closer than
    that, the statistic cannot tell the reference from the truth. Decided from the SVMs and the bound,
    before any control is evaluated. Returns (K,) bool.

    >>> resolvable([1.05, 1.002, 0.9], [0.01, 0.01, 0.01]).tolist()
    [True, False, True]
    """
    rho, tau = np.asarray(norm_ratio, float), np.asarray(bounds, float)
    return np.abs(rho - 1) > tau * (1 + rho)
