"""Inside a reused Jupyter kernel: the state a fresh kernel starts with, saved once and put back.

:mod:`attnlib.book.kernels` keeps one kernel per worker process for the notebooks it executes
(the book, sweeps, robustness runs). Right after the kernel starts it runs :func:`save`; before each
later notebook it runs :func:`restore`, which puts back what a notebook may change and a fresh
kernel would not have:

- the user namespace (IPython's ``reset``: every name, ``In``/``Out``, a new history session);
- open figures (closed), matplotlib's ``rcParams`` (as after start-up, inline backend included);
- the warnings filters, and the "already shown" registries (a warning shows again, as in a fresh kernel);
- numpy's print and floating-point error options;
- the working directory, ``sys.path``, and the execution counter (the first cell is ``[1]`` again).

One difference is kept on purpose: matplotlib's backend is already loaded (the inline backend
active, ``matplotlib.is_interactive()`` true) when the first cell runs, where a fresh kernel loads
it at the first figure; no figure or value depends on it (``tests/book/test_kernels.py``).

What it keeps is what makes the kernel warm: imported modules (numpy, scipy, matplotlib, cvxpy,
attnlib) and their caches of pure functions. A module's global state that a notebook mutates is not
covered; :mod:`attnlib.book.kernels` says what is guarded against, and ``tests/test_kernels.py``
checks that a notebook run in a used kernel gives the same outputs as in a fresh one.

This module runs in the kernel and imports only the standard library; numpy and matplotlib are
touched only when a notebook has imported them (``sys.modules``).
"""

from __future__ import annotations

import os
import sys
import warnings

__all__ = ["save", "restore"]

_SAVED: dict = {}


def _numpy():
    return sys.modules.get("numpy")


def save() -> None:
    """Record the kernel's state as it is now (just after start-up)."""
    # pyplot and its backend are loaded here (in the kernel, once: a documented lazy import), so that
    # the inline backend's activation (interactive mode, its rcParams) is part of what is saved.
    import matplotlib
    import matplotlib.pyplot

    matplotlib.pyplot.switch_backend(matplotlib.get_backend())

    _SAVED.update(
        rc=dict(matplotlib.rcParams),
        filters=list(warnings.filters),
        cwd=os.getcwd(),
        path=list(sys.path),
    )
    np = _numpy()
    if np is not None:
        _SAVED.update(printoptions=np.get_printoptions(), errstate=np.geterr())


def restore() -> None:
    """Put back the state :func:`save` recorded, and empty the user namespace."""
    if not _SAVED:
        raise RuntimeError("kernel_state.restore() before save(): the kernel's state was never recorded")
    shell = get_ipython()  # noqa: F821  (defined in every IPython kernel)
    # As %reset -f, and a new history session: the execution counter starts at 1 again, and the
    # history database would refuse a (session, line) it already has.
    shell.reset(new_session=True)
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        pyplot.close("all")
    matplotlib = sys.modules.get("matplotlib")
    if matplotlib is not None:
        # The saved values were validated when they were set: written back as they are, like
        # rcParams._set does (no deprecation warning for a key the notebook never touched).
        dict.update(matplotlib.rcParams, _SAVED["rc"])
    widgets = sys.modules.get("ipywidgets")
    if widgets is not None:
        widgets.Widget.close_all()
    warnings.resetwarnings()  # also forgets which warnings were already shown
    warnings.filters[:] = _SAVED["filters"]
    warnings._filters_mutated()  # the registries compare a version that only this bumps
    np = _numpy()
    if np is not None and "printoptions" in _SAVED:
        np.set_printoptions(**_SAVED["printoptions"])
        np.seterr(**_SAVED["errstate"])
    os.chdir(_SAVED["cwd"])
    sys.path[:] = _SAVED["path"]
