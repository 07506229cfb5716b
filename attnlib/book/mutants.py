"""Planted errors in the library, for the mutation test: does a chapter's checks catch them?

A *mutant* replaces one function or method of attnlib by a subtly wrong one: the SVM direction
rotated by 1.5°, the SVM scaled by 1.15, the NGD step 3% longer, GD silently run as NGD, a
locally-optimal selection dropped, the batched Frobenius or nuclear SVMs rotated by 1.5°, the
(K, Q) chain rule's Q-gradient without the transpose of ``∇_W``, the decoder trained on labels
shifted by one sample, the Polyak step without its division by ``‖∇L‖``.
``tests/test_mutations.py`` runs chapters with a mutant planted and asserts that their checks fail.

Chapters run in a Jupyter kernel, so the mutant is chosen by an environment variable that the
kernel inherits: ``ATTNLIB_MUTANT=name python -m attnlib run notebooks/X.ipynb -o /tmp/x.ipynb``.
:func:`apply_from_environment` is called when :mod:`attnlib.book` is imported (that is, by every
notebook's ``import attnlib``); without the variable it does nothing. A name that is not in
:data:`MUTANTS` raises, naming the allowed values.

The replacement is by identity: every ``attnlib`` module whose namespace holds the original object
(``from .svm import max_margin`` included) gets the mutant, so a module moved by a refactoring is
still reached as long as the function keeps its name.

>>> sorted(MUTANTS)[:3]
['decoder_labels_shifted', 'frobenius_batch_rotated', 'gd_as_ngd']
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys

import numpy as np

from ..metrics import rotate_toward

__all__ = ["ENV", "MUTANTS", "apply", "apply_from_environment", "active"]

ENV = "ATTNLIB_MUTANT"
_ROTATION_DEGREES = 1.5
_applied: list[str] = []
# Modules whose functions the mutants replace; imported before patching (the book package may be
# imported before them). Missing ones are skipped: a mutant then reports that it found nothing.
_CORE = ("model", "svm", "optim", "paths", "metrics", "fits", "datasets")


def _modules():
    for name in _CORE:
        try:
            importlib.import_module(f"attnlib.{name}")
        except ImportError:  # a module renamed by a refactoring: the search below still finds its functions
            pass
    return [m for n, m in list(sys.modules.items()) if (n == "attnlib" or n.startswith("attnlib.")) and m is not None]


def _find(name: str):
    """The attnlib function or class called ``name`` (where it is defined)."""
    for module in _modules():
        obj = module.__dict__.get(name)
        if (
            obj is not None
            and getattr(obj, "__module__", "").startswith("attnlib")
            and obj.__module__ == module.__name__
        ):
            return obj
    raise LookupError(f"mutant: attnlib defines no {name!r} any more; update attnlib/book/mutants.py")


def _replace(original, replacement) -> int:
    """Bind ``replacement`` wherever an attnlib module binds ``original``; returns how many bindings."""
    count = 0
    for module in _modules():
        for key, value in list(module.__dict__.items()):
            if value is original:
                setattr(module, key, replacement)
                count += 1
    return count


def _toward(shape) -> np.ndarray:
    """A fixed direction in which the planted rotations turn (the same in every run)."""
    return np.random.default_rng(20261201).standard_normal(shape)


def _rotated(theta) -> np.ndarray:
    return rotate_toward(theta, _toward(np.shape(theta)), _ROTATION_DEGREES)


def _wrap_svm(transform):
    original = _find("max_margin")

    def max_margin(*args, **kwargs):
        sol = original(*args, **kwargs)
        theta = transform(sol.theta)
        norm = np.linalg.norm(theta) / np.linalg.norm(sol.theta)
        return dataclasses.replace(sol, theta=theta, margin=sol.margin / norm)

    return _replace(original, max_margin)


def _svm_rotated() -> int:
    return _wrap_svm(_rotated)


def _svm_scaled() -> int:
    return _wrap_svm(lambda theta: 1.15 * theta)


def _method(cls_name: str, method: str, make) -> int:
    cls = _find(cls_name)
    setattr(cls, method, make(getattr(cls, method)))
    return 1


def _joint_move(make) -> int:
    original = _find("_joint_move") if any("_joint_move" in m.__dict__ for m in _modules()) else None
    return _replace(original, make(original)) if original is not None else 0


def _ngd_longer() -> int:
    count = _method(
        "NormalizedGradientDescent", "lengths", lambda f: lambda self, lrs, *a, **k: 1.03 * f(self, lrs, *a, **k)
    )
    return count + _joint_move(
        lambda f: lambda g, s, n, method, lr: f(g, s, n, method, 1.03 * lr if method == "ngd" else lr)
    )


def _gd_as_ngd() -> int:
    count = _method("GradientDescent", "lengths", lambda f: lambda self, lrs, *a, **k: lrs)
    return count + _joint_move(
        lambda f: lambda g, s, n, method, lr: f(g, s, n, "ngd" if method == "gd" else method, lr)
    )


def _no_local_selection() -> int:
    original = _find("_locally_optimal")

    def locally_optimal(prob, sol):  # every locally-optimal selection other than the global one is dropped
        return original(prob, sol) and bool(np.array_equal(np.asarray(sol.select), np.asarray(prob.opt)))

    return _replace(original, locally_optimal)


def _batch_rotated(name: str):
    def plant() -> int:
        original = _find(name)

        def batch(a, z, *args, **kwargs):
            out = original(a, z, *args, **kwargs)
            W = np.stack([_rotated(w) if np.all(np.isfinite(w)) else w for w in out.W])
            return dataclasses.replace(out, W=W)

        return _replace(original, batch)

    return plant


def _kq_gradient() -> int:
    # The chain rule of W = K Qᵀ with the transpose of ∇_W dropped in the Q-gradient: ∇_W K instead of
    # ∇_Wᵀ K. The shapes agree whenever W is square (every (K, Q) chapter), so nothing raises; the product
    # then moves along -(∇_W Q Qᵀ + K Kᵀ ∇_Wᵀ), not a descent direction of W. (The earlier mutant, the
    # Q-gradient halved, is invisible under NGD with K and Q normalised separately: it only rescales.)
    original = _find("factor_grad")

    def factor_grad(grad_W, K, Q):
        gK, _ = original(grad_W, K, Q)
        return gK, np.asarray(grad_W, float) @ np.asarray(K, float)

    return _replace(original, factor_grad)


def _decoder_labels() -> int:
    # The decoders are trained by the joint trainer's stack (chapter 8); prompt-attention problems
    # (chapter 4) pass through unchanged.
    original, make, decoder = _find("train_joint_stack"), _find("joint_self_attention"), _find("DecoderAttention")

    def train_joint_stack(problems, *args, **kwargs):
        shifted = [
            make(J.X, np.roll(J.y, 1), J.Z, J.loss.name) if isinstance(J, decoder) and J.X.ndim == 3 else J
            for J in problems
        ]
        return original(shifted, *args, **kwargs)

    return _replace(original, train_joint_stack)


def _polyak() -> int:
    return _method(
        "PolyakStep", "lengths", lambda f: lambda self, lrs, log_grad_norm, log_gap=None: lrs * np.exp(log_gap)
    )


#: name -> (what is planted, the function that plants it and returns how many bindings it replaced)
MUTANTS = {
    "svm_rotated": (f"the SVM direction rotated by {_ROTATION_DEGREES}°", _svm_rotated),
    "svm_scaled": ("the SVM solution scaled by 1.15", _svm_scaled),
    "ngd_longer": ("the NGD step 3% longer", _ngd_longer),
    "gd_as_ngd": ("GD silently run as NGD", _gd_as_ngd),
    "no_local_selection": ("every locally-optimal selection but the global one dropped", _no_local_selection),
    "frobenius_batch_rotated": (
        f"the batched Frobenius W-SVMs rotated by {_ROTATION_DEGREES}°", _batch_rotated("frobenius_svm_batch")
    ),
    "nuclear_batch_rotated": (
        f"the batched nuclear W-SVMs rotated by {_ROTATION_DEGREES}°", _batch_rotated("nuclear_svm_batch")
    ),
    "kq_gradient_untransposed": ("the (K, Q) chain rule's Q-gradient ∇_W K, its ∇_W not transposed", _kq_gradient),
    "decoder_labels_shifted": ("the decoder trained on labels shifted by one sample", _decoder_labels),
    "polyak_no_division": ("the Polyak step not divided by ‖∇L‖", _polyak),
}  # fmt: skip


def apply(name: str) -> int:
    """Plant the mutant ``name``; returns the number of bindings replaced (raises if it reached none)."""
    if name not in MUTANTS:
        raise ValueError(f"{ENV} must be one of {sorted(MUTANTS)}, got {name!r}")
    if name in _applied:
        return 0
    count = MUTANTS[name][1]()
    if count == 0:
        raise LookupError(f"mutant {name!r} replaced nothing: the library changed; update attnlib/book/mutants.py")
    _applied.append(name)
    print(f"[attnlib] MUTANT PLANTED: {MUTANTS[name][0]} ({name}, {count} bindings)", file=sys.stderr)
    return count


def active() -> list[str]:
    """The mutants planted in this process."""
    return list(_applied)


def apply_from_environment() -> None:
    """Plant the mutant named by ``$ATTNLIB_MUTANT``, if set (the mutation test's hook)."""
    name = os.environ.get(ENV, "").strip()
    if name:
        apply(name)
