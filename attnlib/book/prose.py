"""Numbers for a chapter's prose: its parameters glued under their own names.

A page that says "NGD runs {glue:text}`w_steps` steps" must show the number the run used, whatever
parameters papermill injected; typing the default, or leaving the name in backticks, shows the
wrong thing on a rerun. :func:`glue_parameters` glues each named parameter once, invisibly, so the
prose quotes it with ``{glue:text}`name``` (or ``{glue:text}`name:.2g``` for a format).

Strings are glued as their text (``logistic``, not ``'logistic'``); everything else as its repr
(``0.05``, ``[2, 4, 8]``), which ``{glue:text}`` format specifications read back as numbers.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["glue_parameters"]


class _Text(str):
    """A string whose repr is itself: glued, it reads ``logistic`` rather than ``'logistic'``."""

    def __repr__(self) -> str:
        return str(self)


def glue_parameters(namespace: Mapping, *names: str, glue=None) -> None:
    """Glue ``namespace[name]`` under ``name`` (``display=False``) for each name.

    Returns nothing, so that a cell ending with the call displays nothing.

    Args:
        namespace: the notebook's ``globals()`` (after the parameters cell and its validation).
        names: the parameters the prose quotes.
        glue: the glue function (default ``myst_nb.glue``, imported lazily: attnlib imports
            without Jupyter Book).

    Raises ``NameError`` naming a parameter that is not in ``namespace`` (a typo in the cell, or a
    parameter renamed in the ``parameters`` cell and not here).

    >>> glued = {}
    >>> record = lambda name, value, display: glued.update({name: repr(value)})
    >>> glue_parameters({"steps": 400, "loss": "logistic"}, "steps", "loss", glue=record)
    >>> glued
    {'steps': '400', 'loss': 'logistic'}
    >>> glue_parameters({"steps": 400}, "step", glue=record)
    Traceback (most recent call last):
    ...
    NameError: glue_parameters: no parameter named 'step' (defined: steps)
    """
    if glue is None:
        from myst_nb import glue
    missing = [name for name in names if name not in namespace]
    if missing:
        defined = ", ".join(sorted(k for k in namespace if not k.startswith("_")))
        raise NameError(f"glue_parameters: no parameter named {missing[0]!r} (defined: {defined})")
    for name in names:
        value = namespace[name]
        glue(name, _Text(value) if isinstance(value, str) else value, display=False)
