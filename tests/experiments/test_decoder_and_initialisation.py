"""Chapter experiments: attnlib.experiments.decoder_and_initialisation."""

import numpy as np
from scipy import stats

import attnlib as al
from attnlib.experiments import decoder_and_initialisation as ex


def _sweep(**kw):
    return ex.InitialisationSweep(**{**dict(n=3, T=4, n_init=6, seed=5, steps=60, lr=1.0), **kw})


def test_initialisation_sweep_counts_equal_one_batch_or_several():
    a, b = ("global", 8, (0.0, 1.0, 30.0), None), ("random", 8, (0.0,), 7)
    together = _sweep().run([a, b])
    assert together == _sweep().run([a]) + _sweep().run([b])  # a spec's counts do not depend on its batch mates
    assert set(together[0]) == {(m, s) for m in ("ngd", "polyak") for s in a[2]}
    assert all(0 <= c <= 6 for c in together[0].values())


def test_initialisation_sweep_draws_and_starts():
    sweep = _sweep()
    full, red, margins = sweep.problems("global", 8)
    assert sweep.seeds() == [50_000 + k for k in range(6)] and sweep.problems("global", 8)[0] is full  # cached
    assert np.allclose(margins, [al.max_margin(r.problem).margin for r in red])
    block = sweep.starts("global", 8, (0.0, 2.0))
    assert block.shape == (12, 9) and np.all(block[:6] == 0)
    # A start's reduced coordinates reproduce its logit differences (the reduction is exact for the selection).
    rng = np.random.default_rng([5, 8])
    for _ in range(6):
        rng.standard_normal((8, 8))  # the scale-0 starts come first from the same generator
    W0 = rng.standard_normal((8, 8))
    W0 *= 2.0 / margins[0] / np.linalg.norm(W0)
    logits, reduced = full[0].logits(W0), red[0].problem.logits(block[6])
    np.testing.assert_allclose(
        reduced - reduced[np.arange(3), full[0].opt][:, None],
        logits - logits[np.arange(3), full[0].opt][:, None],
        atol=1e-12,
    )


def test_local_ending_ceiling_is_the_binomial_quantile_of_the_clopper_pearson_bound():
    bound, p_hi = ex.local_ending_ceiling(9, 200, 100)
    assert np.isclose(p_hi, stats.beta.ppf(0.95, 10, 191)) and bound == int(stats.binom.ppf(0.99, 100, p_hi))
    assert (
        ex.local_ending_ceiling(0, 100)[0] <= ex.local_ending_ceiling(5, 100)[0] <= ex.local_ending_ceiling(20, 100)[0]
    )
    assert ex.local_ending_ceiling(100, 100) == (100, 1.0)


def test_a_resolvable_reference_fails_every_run_whose_rate_passes():
    rng = np.random.default_rng(0)
    tau = rng.uniform(0.005, 0.05, 2000)
    rates = 1 + tau * rng.uniform(-1, 1, 2000)  # every run passes
    rho = np.exp(rng.uniform(-0.3, 0.3, 2000))
    assert np.all(ex.rate_deviation(rates, tau) <= 1)
    beyond = ex.resolvable(rho, tau)
    assert 0 < beyond.sum() < 2000 and np.all(ex.rate_deviation(rates[beyond], tau[beyond], rho[beyond]) > 1)
    # Closer than the rule some wrong references pass: the check cannot tell them, so they are not controls.
    assert np.any(ex.rate_deviation(rates[~beyond], tau[~beyond], rho[~beyond]) <= 1)
