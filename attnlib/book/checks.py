"""A notebook's numerical checks: recorded, glued for the prose, read back by the run command.

Every chapter ends with its theorem's predictions as checks. A check compares a measured value
with a bound through one of the predicates below; the criterion text is generated from the
predicate, so the text the reader sees is the test that ran. Each check ends in one of three
states (:data:`STATUSES`):

- ``passed`` / ``failed``: the prediction was tested;
- ``not applicable``: the instance lies outside the theorem's hypotheses. Pass ``not_applicable=
  reason`` (a non-empty string), decided *before* looking at the value, from quantities the
  theorem names (a tie, a margin the horizon cannot resolve, an uncertified search). The value is
  still recorded and shown, the verdict is not.

Each record is glued (``myst_nb.glue``) under the check's name (the value) and ``name_status``
(the verdict), so that prose and the book's claims table quote computed numbers, and emitted as
an output of MIME type :data:`CHECK_MIME`, which ``python -m attnlib run`` collects from the
executed notebook. :meth:`Checks.assert_all` fails the notebook if any check failed, after every
check was recorded.

>>> checks = Checks(display=False)
>>> checks.at_least("final_cosine", 0.9991, 0.999, why="NGD aligns with p_mm*").status
'passed'
>>> checks.at_most("offset", 0.2, 0.1, why="bounded offset").criterion
'<= 0.1'
>>> checks.within("ratio", 1.3, 0.9, 1.1, why="a tie", not_applicable="two SVMs tie").status
'not applicable'
>>> checks.counts()
{'passed': 1, 'failed': 1, 'not applicable': 1}
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

__all__ = ["CHECK_MIME", "STATUSES", "Check", "Checks", "count_statuses", "describe_counts", "status_of"]

CHECK_MIME = "application/vnd.attnlib.check+json"
PASSED, FAILED, NOT_APPLICABLE = "passed", "failed", "not applicable"
STATUSES = (PASSED, FAILED, NOT_APPLICABLE)


@dataclass(frozen=True)
class Check:
    """One recorded check.

    ``status`` is one of :data:`STATUSES`; ``passed`` is a boolean, or ``None`` when the check is not
    applicable; ``reason`` says why it is not applicable (empty otherwise); ``description`` is the
    claim in words (the ``why`` of the predicate).
    """

    name: str
    value: float | int | str | bool
    criterion: str
    status: str
    passed: bool | None
    description: str = ""
    reason: str = ""


def _plain(value):
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    if isinstance(value, (np.floating, float)):
        return float(value)
    if isinstance(value, (np.integer, int)):
        return int(value)
    return str(value)


def _number(name: str, label: str, x) -> float:
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise TypeError(f"check {name!r}: {label} must be a real number, got {x!r}")
    return float(x)


def _show(x) -> str:
    """Six significant digits, unless that hides the value (a bound of 1 − 1e-14 must not read "1").

    >>> _show(0.25), _show(1 - 1e-14), _show(1.0), _show(3)
    ('0.25', '0.99999999999999', '1', '3')
    """
    if not isinstance(x, (float, np.floating)):
        return str(x)
    text = f"{x:.6g}"
    return text if float(text) == float(x) or abs(float(text)) not in (0.0, 1.0) else repr(float(x))


@dataclass
class Checks:
    """The checks of one notebook, in the order they were made."""

    display: bool = True
    records: list[Check] = field(default_factory=list)

    # -- predicates: the criterion text is generated from the test -------------------------------
    def at_least(self, name: str, value, bound, *, why: str, not_applicable: str | None = None) -> Check:
        """``value >= bound``. A NaN value fails."""
        v, b = _number(name, "value", value), _number(name, "bound", bound)
        return self._record(name, value, f">= {_show(bound)}", v >= b, why, not_applicable)

    def at_most(self, name: str, value, bound, *, why: str, not_applicable: str | None = None) -> Check:
        """``value <= bound``. A NaN value fails."""
        v, b = _number(name, "value", value), _number(name, "bound", bound)
        return self._record(name, value, f"<= {_show(bound)}", v <= b, why, not_applicable)

    def within(self, name: str, value, low, high, *, why: str, not_applicable: str | None = None) -> Check:
        """``low <= value <= high``. A NaN value fails."""
        v, lo, hi = _number(name, "value", value), _number(name, "low", low), _number(name, "high", high)
        if lo > hi:
            raise ValueError(f"check {name!r}: low ({lo}) must not exceed high ({hi})")
        return self._record(name, value, f"in [{_show(low)}, {_show(high)}]", lo <= v <= hi, why, not_applicable)

    def close_to(self, name: str, value, target, *, atol: float, why: str, not_applicable: str | None = None) -> Check:
        """``|value - target| <= atol``."""
        v, t = _number(name, "value", value), _number(name, "target", target)
        ok = abs(v - t) <= _number(name, "atol", atol)
        return self._record(name, value, f"within {_show(atol)} of {_show(target)}", ok, why, not_applicable)

    def equals(self, name: str, value, expected, *, why: str, not_applicable: str | None = None) -> Check:
        """Exact equality, for counts, labels and tuples (never for floats: use :meth:`close_to`)."""
        if isinstance(value, (float, np.floating)) or isinstance(expected, (float, np.floating)):
            raise TypeError(f"check {name!r}: equals() compares counts and labels; use close_to() for floats")
        shown = _plain(value) if not isinstance(value, (tuple, list)) else str(tuple(value))
        want = expected if not isinstance(expected, (tuple, list)) else tuple(expected)
        got = value if not isinstance(value, (tuple, list)) else tuple(value)
        return self._record(name, shown, f"== {want}", bool(got == want), why, not_applicable)

    # -- bookkeeping -----------------------------------------------------------------------------
    def _record(self, name, value, criterion, ok, why, not_applicable) -> Check:
        if not name.isidentifier():
            raise ValueError(f"check name must be an identifier (it is a glue key), got {name!r}")
        if any(c.name == name for c in self.records):
            raise ValueError(f"check {name!r} was already recorded")
        if not isinstance(why, str) or not why.strip():
            raise ValueError(f"check {name!r}: why= must say what the theorem predicts (a non-empty string)")
        if not_applicable is not None and (not isinstance(not_applicable, str) or not not_applicable.strip()):
            raise ValueError(f"check {name!r}: not_applicable= must be None or a non-empty reason")
        value = _plain(value)
        if isinstance(value, float) and math.isnan(value):
            ok = False
        if not_applicable:
            check = Check(name, value, criterion, NOT_APPLICABLE, None, why, not_applicable)
        else:
            check = Check(name, value, criterion, PASSED if ok else FAILED, bool(ok), why)
        self.records.append(check)
        if self.display:
            from IPython.display import Markdown, display
            from myst_nb import glue

            # Prose quotes the value with {glue:text}`name:.4f` and the verdict with {glue:md}`name_status`.
            glue(name, check.value, display=False)
            glue(f"{name}_status", Markdown(self._verdict(check)), display=False)
            display({CHECK_MIME: asdict(check), "text/plain": self._line(check)}, raw=True)
        return check

    @staticmethod
    def _verdict(check: Check) -> str:
        return {PASSED: "pass", FAILED: "**FAIL**", NOT_APPLICABLE: "not applicable"}[check.status]

    @staticmethod
    def _line(check: Check) -> str:
        mark = {PASSED: "pass", FAILED: "FAIL", NOT_APPLICABLE: "n/a"}[check.status]
        tail = f"; not applicable: {check.reason}" if check.reason else ""
        return f"[{mark}] {check.name} = {check.value!r} (criterion: {check.criterion}{tail})"

    def counts(self) -> dict[str, int]:
        """How many checks ended in each state."""
        return {status: sum(c.status == status for c in self.records) for status in STATUSES}

    def table(self) -> str:
        """The checks as a markdown table."""
        rows = ["| check | value | criterion | verdict |", "|---|---|---|---|"]
        rows += [
            f"| {c.description or c.name} | {c.value} | {c.criterion} | {self._verdict(c)} |" for c in self.records
        ]
        return "\n".join(rows)

    def assert_all(self) -> None:
        """Raise ``AssertionError`` listing every failed check (not-applicable ones do not fail)."""
        failed = [self._line(c) for c in self.records if c.status == FAILED]
        if failed:
            raise AssertionError("failed checks:\n" + "\n".join(failed))


def status_of(record: dict) -> str:
    """The status of a check record read back from a summary (records without one: from ``passed``)."""
    status = record.get("status")
    if status in STATUSES:
        return status
    return PASSED if record.get("passed") else FAILED


def count_statuses(records: list[dict]) -> dict[str, int]:
    """How many of ``records`` (dicts, as in a run's summary) ended in each state."""
    return {status: sum(status_of(r) == status for r in records) for status in STATUSES}


def describe_counts(records: list[dict]) -> str:
    """``"11 of 12 checks pass, 1 not applicable"``; failures named by count.

    >>> describe_counts([{"status": "passed"}, {"status": "not applicable"}, {"passed": False}])
    '1 of 3 checks pass, 1 not applicable, 1 failed'
    """
    counts = count_statuses(records)
    text = f"{counts[PASSED]} of {len(records)} checks pass"
    if counts[NOT_APPLICABLE]:
        text += f", {counts[NOT_APPLICABLE]} not applicable"
    if counts[FAILED]:
        text += f", {counts[FAILED]} failed"
    return text
