"""Property tests (hypothesis): invariances of the softmax model and of the loss gap."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import attnlib as al

seeds = st.integers(0, 2**31 - 1)
sizes = st.tuples(st.integers(1, 4), st.integers(2, 5), st.integers(1, 4))
losses = st.sampled_from(sorted(al.losses.LOSSES))
FAST = settings(max_examples=40, deadline=None, derandomize=True)  # the same examples in every run


def make(seed, n, T, d, loss):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, T, d))
    return al.prompt_attention(X, rng.choice([-1, 1], n), rng.normal(size=d), loss=loss), rng


@FAST
@given(seeds, sizes, losses, st.floats(-50, 50))
def test_attention_is_invariant_to_a_per_sample_shift_of_the_keys(seed, size, loss, scale):
    prob, rng = make(seed, *size, loss)
    shift = scale * rng.normal(size=(prob.n, 1) + prob.shape)  # adds ⟨θ, b_i⟩ to every logit of sample i
    shifted = al.token_selection(prob.A + shift, prob.gamma, loss)
    theta = rng.normal(size=(3,) + prob.shape)
    np.testing.assert_allclose(shifted.attention(theta), prob.attention(theta), rtol=1e-7, atol=1e-12)
    np.testing.assert_allclose(shifted.grad(theta), prob.grad(theta), rtol=1e-6, atol=1e-10)


@FAST
@given(seeds, sizes, losses)
def test_token_permutation_is_equivariant(seed, size, loss):
    prob, rng = make(seed, *size, loss)
    perm = np.stack([rng.permutation(prob.T) for _ in range(prob.n)])
    permuted = al.token_selection(
        np.take_along_axis(prob.A, perm.reshape(perm.shape + (1,) * len(prob.shape)), axis=1),
        np.take_along_axis(prob.gamma, perm, axis=1),
        loss,
    )
    theta = rng.normal(size=(2,) + prob.shape)
    np.testing.assert_allclose(
        permuted.attention(theta),
        np.take_along_axis(prob.attention(theta), np.broadcast_to(perm, (2,) + perm.shape), -1),
    )
    np.testing.assert_allclose(permuted.value(theta), prob.value(theta), rtol=1e-12)
    np.testing.assert_allclose(permuted.grad(theta), prob.grad(theta), rtol=1e-9, atol=1e-13)
    assert np.array_equal(permuted.opt, np.argsort(perm, axis=1)[np.arange(prob.n), prob.opt])


@FAST
@given(seeds, sizes, losses, st.integers(1, 6))
def test_batch_equals_loop(seed, size, loss, B):
    prob, rng = make(seed, *size, loss)
    theta = rng.normal(size=(B,) + prob.shape) * 3
    for method in (prob.value, prob.gap, prob.grad, prob.log_attention):
        batched = method(theta)
        looped = np.stack([method(t) for t in theta])
        # The batch and the loop sum in different orders (matrix-matrix against matrix-vector
        # products): each entry agrees to ~eps times the size of the terms it sums, which for a
        # gradient entry that cancels is the gradient's scale, not the entry's.
        scale = np.abs(looped).max(axis=tuple(range(1, looped.ndim)), keepdims=True)
        error = np.abs(batched - looped)
        assert np.all(error <= 1e-12 * (np.abs(looped) + scale)), (method.__name__, error.max(), scale.max())


@FAST
@given(seeds, sizes, losses, st.floats(0, 500))
def test_gap_is_nonnegative_and_its_log_finite(seed, size, loss, scale):
    prob, rng = make(seed, *size, loss)
    theta = scale * rng.normal(size=(4,) + prob.shape)
    assert np.all(prob.gap(theta) >= 0)
    assert np.all(np.isfinite(prob.log_gap(theta)))
