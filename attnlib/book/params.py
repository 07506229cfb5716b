"""Notebook parameters declared once: a spec per name, validated in one call.

A chapter's validation cell is one :func:`validate` call over its ``parameters`` cell::

    al.validate(globals(), seed=al.integer(minimum=0), lr=al.real(above=0),
                loss=al.one_of("logistic", "exponential"),
                n_values=al.list_of(al.integer(minimum=1), min_length=1))

Each spec also says what it accepts, for ``python -m attnlib run NOTEBOOK --list-parameters``:
``allowed`` (the words of the error message) and ``kind`` (``int``, ``float``, ``choice``, ``bool``,
``str``, ``list of ...``); numbers carry ``bounds``, choices ``choices``, lists ``length`` and
``element``.

Every spec raises ``ValueError`` naming the parameter (a list element by its index,
``n_values[2]``) and the allowed values; the run command reports it and exits 1.

>>> validate({"steps": 100}, steps=integer(minimum=1))
{'steps': 100}
>>> validate({"steps": 0}, steps=integer(minimum=1))
Traceback (most recent call last):
...
ValueError: parameter 'steps' must be an int >= 1, got 0
>>> validate({"sizes": [4, -1]}, sizes=list_of(integer(minimum=1)))
Traceback (most recent call last):
...
ValueError: parameter 'sizes[1]' must be an int >= 1, got -1
>>> spec = real(minimum=0, above=None); spec.kind, spec.allowed
('float', 'a float >= 0')
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

__all__ = ["Spec", "boolean", "check_parameter", "integer", "list_of", "one_of", "real", "text", "validate"]

Spec = Callable[[str, object], object]


def _fail(name: str, allowed: str, value) -> ValueError:
    return ValueError(f"parameter {name!r} must be {allowed}, got {value!r}")


def _bounds(minimum, maximum, above) -> str:
    parts = []
    if minimum is not None:
        parts.append(f">= {minimum}")
    if above is not None:
        parts.append(f"> {above}")
    if maximum is not None:
        parts.append(f"<= {maximum}")
    return (" " + " and ".join(parts)) if parts else ""


def _number(kind: type, minimum, maximum, above) -> Spec:
    article = "an" if kind is int else "a"
    allowed = f"{article} {kind.__name__}{_bounds(minimum, maximum, above)}"

    def check(name: str, value):
        ok = isinstance(value, (int, np.integer)) or (kind is float and isinstance(value, (float, np.floating)))
        ok = ok and not isinstance(value, (bool, np.bool_))
        ok = ok and math.isfinite(value)
        ok = ok and (minimum is None or value >= minimum) and (maximum is None or value <= maximum)
        ok = ok and (above is None or value > above)
        if not ok:
            raise _fail(name, allowed, value)
        return value

    check.allowed = allowed
    check.kind = kind.__name__
    check.bounds = {"minimum": minimum, "maximum": maximum, "above": above}
    return check


def integer(minimum=None, maximum=None) -> Spec:
    """An int (not a bool) in ``[minimum, maximum]``."""
    return _number(int, minimum, maximum, None)


def real(minimum=None, maximum=None, above=None) -> Spec:
    """A finite float (an int is accepted) in ``[minimum, maximum]`` and ``> above``."""
    return _number(float, minimum, maximum, above)


def one_of(*choices) -> Spec:
    """One of ``choices``."""
    allowed = f"one of {list(choices)}"

    def check(name: str, value):
        if isinstance(value, bool) != any(isinstance(c, bool) for c in choices) or value not in choices:
            raise _fail(name, allowed, value)
        return value

    check.allowed = allowed
    check.kind = "bool" if len(choices) == 2 and all(isinstance(c, bool) for c in choices) else "choice"
    check.choices = list(choices)
    return check


def boolean() -> Spec:
    """True or False."""
    return one_of(True, False)


def text() -> Spec:
    """Any string."""

    def check(name: str, value):
        if not isinstance(value, str):
            raise _fail(name, "a str", value)
        return value

    check.allowed = "a str"
    check.kind = "str"
    return check


def list_of(element: Spec, min_length: int = 0, max_length: int | None = None) -> Spec:
    """A list whose every element meets ``element``; a bad element is named by its index."""
    size = f" of length >= {min_length}" if min_length else ""
    size += f" and <= {max_length}" if max_length is not None else ""
    allowed = f"a list{size} of {getattr(element, 'allowed', 'valid values')}"

    def check(name: str, value):
        if not isinstance(value, (list, tuple)):
            raise _fail(name, allowed, value)
        if len(value) < min_length or (max_length is not None and len(value) > max_length):
            raise _fail(name, allowed, value)
        for i, item in enumerate(value):
            element(f"{name}[{i}]", item)
        return value

    check.allowed = allowed
    check.kind = f"list of {getattr(element, 'kind', 'values')}"
    check.length = {"min_length": min_length, "max_length": max_length}
    check.element = element
    return check


def validate(namespace: Mapping, /, **specs: Spec) -> dict:
    """Check every declared parameter in ``namespace`` (a notebook's ``globals()``); return them.

    Raises ``ValueError`` for the first bad value, naming it, and ``NameError`` when a declared
    parameter is missing from the namespace (a spec out of step with the ``parameters`` cell).
    """
    missing = [name for name in specs if name not in namespace]
    if missing:
        raise NameError(f"parameters declared but not defined: {', '.join(missing)}")
    return {name: spec(name, namespace[name]) for name, spec in specs.items()}


def check_parameter(name: str, value, kind, minimum=None, maximum=None, choices=None):
    """One parameter, the older call form: prefer :func:`validate` with a spec per name.

    >>> check_parameter("steps", -3, int, minimum=1)
    Traceback (most recent call last):
    ...
    ValueError: parameter 'steps' must be an int >= 1, got -3
    """
    if choices is not None:
        spec = one_of(*choices)
    elif kind is int:
        spec = integer(minimum, maximum)
    elif kind is float:
        spec = real(minimum, maximum)
    elif kind is bool:
        spec = boolean()
    elif kind is str:
        spec = text()
    else:
        raise TypeError(f"check_parameter: kind must be int, float, str or bool, got {kind!r}")
    return spec(name, value)
