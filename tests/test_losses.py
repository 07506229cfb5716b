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
