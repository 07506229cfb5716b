"""A notebook's numerical checks: recorded, glued for the prose, read back by the run command.

Every chapter ends with its theorem's predictions as checks. Each :meth:`Checks.add` records a
measured value, the criterion it must meet and the verdict; it glues the value (``myst_nb.glue``)
under the check's name so that the prose and the book's claims table quote computed numbers, and
it emits the record as an output of MIME type :data:`CHECK_MIME`, which ``python -m attnlib run``
collects from the executed notebook (even when a later cell fails). :meth:`Checks.assert_all`
fails the notebook if any check failed, after every check was recorded.

>>> checks = Checks(display=False)
>>> checks.add("final_cosine", 0.9991, ">= 0.999", 0.9991 >= 0.999).passed
True
>>> checks.assert_all()
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

__all__ = ["CHECK_MIME", "Check", "Checks", "check_parameter"]

CHECK_MIME = "application/vnd.attnlib.check+json"


@dataclass(frozen=True)
class Check:
    """One recorded check: ``name`` (a glue key), measured ``value``, ``criterion``, ``passed``."""

    name: str
    value: float | int | str | bool
    criterion: str
    passed: bool
    description: str = ""


def _plain(value):
    if isinstance(value, (np.floating, float)):
        return float(value)
    if isinstance(value, (np.integer, int)) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    return str(value)


@dataclass
class Checks:
    """The checks of one notebook, in the order they were made."""

    display: bool = True
    records: list[Check] = field(default_factory=list)

    def add(self, name: str, value, criterion: str, passed, description: str = "") -> Check:
        """Record a check, glue its value as ``name`` and its verdict as ``name_status``, emit it."""
        if not name.isidentifier():
            raise ValueError(f"check name must be an identifier (it is a glue key), got {name!r}")
        if any(c.name == name for c in self.records):
            raise ValueError(f"check {name!r} was already recorded")
        check = Check(name, _plain(value), criterion, bool(passed), description)
        self.records.append(check)
        if self.display:
            from IPython.display import Markdown, display
            from myst_nb import glue

            # Prose quotes the value with {glue:text}`name:.4f` and the verdict with {glue:md}`name_status`.
            glue(name, check.value, display=False)
            glue(f"{name}_status", Markdown("pass" if check.passed else "**FAIL**"), display=False)
            display({CHECK_MIME: asdict(check), "text/plain": self._line(check)}, raw=True)
        return check

    @staticmethod
    def _line(check: Check) -> str:
        mark = "pass" if check.passed else "FAIL"
        return f"[{mark}] {check.name} = {check.value!r} (criterion: {check.criterion})"

    def table(self) -> str:
        """The checks as a markdown table."""
        rows = ["| check | value | criterion | verdict |", "|---|---|---|---|"]
        rows += [
            f"| {c.description or c.name} | {c.value} | {c.criterion} | {'pass' if c.passed else 'FAIL'} |"
            for c in self.records
        ]
        return "\n".join(rows)

    def assert_all(self) -> None:
        """Raise ``AssertionError`` listing every failed check."""
        failed = [self._line(c) for c in self.records if not c.passed]
        if failed:
            raise AssertionError("failed checks:\n" + "\n".join(failed))


def check_parameter(name: str, value, kind, minimum=None, maximum=None, choices=None):
    """Validate a notebook parameter; raise ``ValueError`` naming it and the allowed values.

    Args:
        name: the parameter's name as written in the notebook's ``parameters`` cell.
        kind: ``int``, ``float``, ``str`` or ``bool`` (an int is accepted where a float is asked).
        minimum, maximum: inclusive bounds for numbers.  choices: allowed values.

    >>> check_parameter("steps", 1000, int, minimum=1)
    1000
    >>> check_parameter("steps", -3, int, minimum=1)
    Traceback (most recent call last):
    ...
    ValueError: parameter 'steps' must be an int >= 1, got -3
    """
    numeric = kind in (int, float)
    ok_type = (
        isinstance(value, bool)
        if kind is bool
        else isinstance(value, kind) or (kind is float and isinstance(value, int))
        if numeric
        else isinstance(value, kind)
    )
    if numeric and isinstance(value, bool):
        ok_type = False
    parts = []
    if minimum is not None:
        parts.append(f">= {minimum}")
    if maximum is not None:
        parts.append(f"<= {maximum}")
    article = "an" if kind is int else "a"
    allowed = f"one of {list(choices)}" if choices is not None else f"{article} {kind.__name__} " + " and ".join(parts)
    bad = not ok_type
    if not bad and numeric:
        bad = (
            not np.isfinite(value)
            or (minimum is not None and value < minimum)
            or (maximum is not None and value > maximum)
        )
    if not bad and choices is not None:
        bad = value not in choices
    if bad:
        raise ValueError(f"parameter {name!r} must be {allowed.strip()}, got {value!r}")
    return value
