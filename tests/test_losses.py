"""The core: attnlib.losses."""

import numpy as np
import pytest

import attnlib as al


def test_cross_entropy_excess_matches_direct_difference():
    loss = al.losses.CROSS_ENTROPY
    gamma = np.array([1.0, 0.5, 2.0])
    delta = np.array([0.3, 1e-3, 1.5])
    direct = loss.value(gamma - delta) - loss.value(gamma)
    assert np.allclose(loss.excess(gamma, delta), direct, rtol=1e-12)
    assert np.allclose(loss.log_excess(gamma, np.log(delta)), np.log(direct), rtol=1e-12)
    tiny = np.log(1e-200)  # below the switch to the first-order form
    assert loss.log_excess(1.0, tiny) == pytest.approx(tiny, rel=1e-12)


def test_numpy_sigmoids_match_scipy_within_two_ulp():
    special = pytest.importorskip("scipy.special")
    x = np.concatenate([np.random.default_rng(0).normal(size=20000) * s for s in (1.0, 30.0, 800.0)])
    x = np.concatenate([x, [0.0, -0.0, 745.0, -745.0, 1e308, -1e308, np.inf, -np.inf]])
    with np.errstate(over="ignore"):
        for ours, ref in ((al.losses.expit, special.expit), (al.losses.log_expit, special.log_expit)):
            a, b = ours(x), ref(x)
            assert np.array_equal(np.isfinite(a), np.isfinite(b))
            assert np.array_equal(a[~np.isfinite(a)], b[~np.isfinite(b)])
            ok = np.isfinite(a)
            # two ulp of the larger value (numpy's exp and log1p against the C library's, then one
            # more rounding), or the smallest normal where both are subnormal or zero
            ulp = np.spacing(np.maximum(np.abs(a[ok]), np.abs(b[ok])))
            assert np.all(np.abs(a[ok] - b[ok]) <= np.maximum(2 * ulp, np.finfo(float).tiny)), ours.__name__
    # the control: a sigmoid off by 8 eps (relative) fails the same comparison
    ref = special.expit(x[:100])
    off = ref * (1 + 8 * np.finfo(float).eps)
    assert np.any(np.abs(off - ref) > 2 * np.spacing(np.maximum(np.abs(off), np.abs(ref))))


def test_import_attnlib_loads_no_scipy():
    import subprocess
    import sys

    code = "import sys, attnlib; print(sorted(m for m in sys.modules if m.split('.')[0] == 'scipy'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
