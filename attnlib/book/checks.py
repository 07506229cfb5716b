"""A notebook's numerical checks, each beside a control: recorded, glued for the prose, read back by the run command.

Every chapter ends with its theorem's predictions as checks. A check compares a measured value
with a bound through one of the predicates below; the criterion text is generated from the
predicate, so the text the reader sees is the test that ran.

**Every applicable check carries controls** (``controls=``): the same statistic, evaluated by the
same predicate, on the nearest plausible wrong answer the page can name (the other SVM, the
reference rotated by the angle the check claims to resolve, a quarter of the horizon, GD in place
of NGD). A control must *fail*; a control that passes means the check cannot tell the wrong answer
from the truth, and the check fails. Pass ``controls`` as a mapping ``{what was planted: value}``
or a list of :class:`Control`. A predicate called without controls on an applicable check raises
(naming the check): an inequality the page *proves* is not a check but a :meth:`Checks.certificate`,
shown as a fact and kept out of the claims table's checks.

Each check ends in one of three states (:data:`STATUSES`):

- ``passed``: the value meets the bound and every control misses it;
- ``failed``: the value misses the bound, or a control meets it (``value_status`` and the
  controls' ``status`` say which);
- ``not applicable``: the instance lies outside the theorem's hypotheses. Pass ``not_applicable=
  reason`` (a non-empty string), decided *before* looking at the value, from quantities the
  theorem names (a tie, a margin the horizon cannot resolve). A search that cannot certify its
  optimum is a failed computation, never "not applicable".

Each record also carries the numeric bound (``sense`` one of ``>=``, ``<=``, ``in``, ``==``, with
``bound`` or ``low``/``high``), the value's ``margin`` inside the bound and each control's margin
(negative: beyond the bound) on one scale (:func:`margin`: decades for one-signed one-sided bounds,
half-widths of the interval or tolerances otherwise), the ``separation`` (the smallest distance by
which a control lands beyond the bound, in the same unit) and, for a direction check, its
``resolution``: the smallest rotation of the reference, in degrees, that the check detects
(:func:`attnlib.metrics.rotation_resolution`).

Records are glued (``myst_nb.glue``) under the check's name (the value), ``name_status`` (the
verdict), ``name_control`` (the first control's value) and ``name_resolution`` (if any), and
emitted as an output of MIME type :data:`CHECK_MIME`, which ``python -m attnlib run`` collects.
:meth:`Checks.assert_all` fails the notebook if any check or certificate failed, after every one
was recorded.

>>> checks = Checks(display=False)
>>> c = checks.at_least("final_cosine", 0.9991, 0.999, why="NGD aligns with p_mm*",
...                     controls={"the l2 SVM rotated by 2 degrees": 0.9985})
>>> c.status, c.controls[0]["status"], round(c.separation, 5)
('passed', 'failed', 0.00022)
>>> checks.at_most("offset", 0.2, 0.1, why="bounded offset", controls={"a wrong direction": 1.0}).criterion
'<= 0.1'
>>> checks.within("ratio", 1.3, 0.9, 1.1, why="a tie", not_applicable="two SVMs tie").status
'not applicable'
>>> checks.at_most("weak", 0.01, 0.1, why="w", controls={"a quarter of the horizon": 0.05}).status
'failed'
>>> checks.certificate("ray_bound", 2.9e-8, 8.2e-4, why="proved on the page for any point below the ray").kind
'certificate'
>>> checks.counts()
{'passed': 1, 'failed': 2, 'not applicable': 1}
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

__all__ = [
    "CHECK_MIME",
    "STATUSES",
    "Check",
    "Checks",
    "Control",
    "count_statuses",
    "describe_counts",
    "is_known_failure",
    "margin",
    "shown_at_precision",
    "status_of",
]

CHECK_MIME = "application/vnd.attnlib.check+json"
PASSED, FAILED, NOT_APPLICABLE = "passed", "failed", "not applicable"
STATUSES = (PASSED, FAILED, NOT_APPLICABLE)
CHECK, CERTIFICATE = "check", "certificate"


@dataclass(frozen=True)
class Control:
    """A planted wrong answer: ``planted`` says what was changed, ``value`` is the statistic on it.

    >>> Control("the Frobenius SVM in place of the nuclear one", 0.93).planted
    'the Frobenius SVM in place of the nuclear one'
    """

    planted: str
    value: float | int | str | bool | tuple


@dataclass(frozen=True)
class Check:
    """One recorded check (or certificate).

    ``status`` is one of :data:`STATUSES` (the overall verdict: the value meets the bound *and*
    every control misses it); ``value_status`` is the value's own verdict; ``passed`` is a boolean,
    or ``None`` when not applicable; ``reason`` says why it is not applicable; ``description`` is the
    claim in words. ``controls`` is a list of ``{"planted", "value", "status", "margin"}`` dicts.
    ``sense``/``bound``/``low``/``high`` are the numeric bound; ``margin`` (the value's distance
    inside the bound) and ``separation`` (the smallest control's distance beyond it) share the unit
    ``scale``. ``kind`` is ``"check"`` or ``"certificate"`` (an inequality the page proves).
    ``known_failure`` (a check's ``known_failure=``) says why a check is expected to fail and where
    its repair is tracked: it still fails, and shows as failed everywhere, but does not stop the
    build; if it passes, :meth:`Checks.assert_all` raises until the mark is removed (a strict xfail).
    """

    name: str
    value: float | int | str | bool
    criterion: str
    status: str
    passed: bool | None
    description: str = ""
    reason: str = ""
    kind: str = CHECK
    value_status: str = ""
    sense: str = ""
    bound: float | int | str | None = None
    low: float | None = None
    high: float | None = None
    margin: float | None = None
    scale: str = ""
    controls: list = field(default_factory=list)
    separation: float | None = None
    resolution: float | None = None
    controls_pending: str = ""
    seed_independent: str = ""
    known_failure: str = ""


def _plain(value):
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    if isinstance(value, (np.floating, float)):
        return float(value)
    if isinstance(value, (np.integer, int)):
        return int(value)
    if isinstance(value, (tuple, list)):
        return str(tuple(_plain(v) for v in value))
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


def shown_at_precision(x, resolution: float | None) -> str:
    """``x`` with just enough significant digits to resolve ``resolution`` (a distance to the bound) to
    two digits: the precision comes from the tolerance, not from the float.

    >>> shown_at_precision(0.99882, 0.006), shown_at_precision(2.94e-8, 8.2e-4), shown_at_precision(3, 1.0)
    ('0.9988', '2.9e-08', '3')
    >>> shown_at_precision(0.95, 0.0)
    '0.95'
    """
    if not isinstance(x, (float, np.floating)) or not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    if resolution is None or not math.isfinite(resolution) or resolution <= 0:
        return f"{x:.4g}"
    digits = int(math.floor(math.log10(abs(x))) - math.floor(math.log10(resolution)) + 2)
    return f"{x:.{min(max(digits, 2), 15)}g}"


def margin(sense: str, x: float, *, bound=None, low=None, high=None, log: bool = False) -> float:
    """Signed distance of ``x`` inside the bound (negative: beyond it), on the scale of :func:`_scale`.

    ``log=True`` (a one-sided bound with ``x`` and the bound of one strict sign): decades,
    ``log10`` of the ratio. Otherwise: an interval's half-widths (``in``), or units of ``|bound|``
    (one-sided; 1 if the bound is 0).

    >>> margin(">=", 0.5, bound=0.05, log=True), margin("<=", 0.5, bound=0.05, log=True)
    (1.0, -1.0)
    >>> round(margin("in", 1.05, low=0.9, high=1.1), 12)
    0.5
    """
    if math.isnan(x):
        return -math.inf
    if sense == "in":
        half = (high - low) / 2
        distance = min(x - low, high - x)
        return distance / half if half > 0 else (0.0 if distance == 0 else -math.inf)
    if log:
        ratio = math.log10(x / bound)
        flip = -1.0 if bound < 0 else 1.0  # for negative values, x <= b means |x| >= |b|
        return flip * ratio if sense == ">=" else -flip * ratio
    unit = abs(bound) if bound != 0 else 1.0
    return (x - bound) / unit if sense == ">=" else (bound - x) / unit


def _scale(sense: str, bound, values) -> tuple[bool, str]:
    if sense == "in":
        return False, "half-widths of the interval"
    if bound != 0 and all(math.isfinite(v) and v != 0 and (v > 0) == (bound > 0) for v in values):
        return True, "decades"
    return False, "units of |bound|" if bound != 0 else "absolute"


def _as_controls(name: str, controls) -> list[Control]:
    if controls is None:
        return []
    if isinstance(controls, Control):
        controls = [controls]
    if isinstance(controls, Mapping):
        controls = [Control(str(k), v) for k, v in controls.items()]
    if not isinstance(controls, Sequence) or isinstance(controls, str):
        raise TypeError(f"check {name!r}: controls= must be a mapping {{planted: value}} or a list of Control")
    out = []
    for c in controls:
        if not isinstance(c, Control):
            raise TypeError(f"check {name!r}: controls must be Control(planted=..., value=...), got {c!r}")
        if not isinstance(c.planted, str) or not c.planted.strip():
            raise ValueError(f"check {name!r}: a control must say what was planted (a non-empty string)")
        out.append(c)
    return out


def _control(control: Control, value: float, accepted: bool, distance: float) -> dict:
    return dict(planted=control.planted, value=float(value), status=PASSED if accepted else FAILED, margin=distance)


@dataclass
class Checks:
    """The checks of one notebook, in the order they were made.

    ``controls_pending``: a chapter whose checks have not yet been given controls names the issue
    here (e.g. ``"issue 22"``); its checks are then accepted without controls and every record and
    the claims table say so. Without it, an applicable check without a control raises.
    """

    display: bool = True
    records: list[Check] = field(default_factory=list)
    controls_pending: str = ""

    # -- predicates: the criterion text is generated from the test -------------------------------
    # Options of every predicate: controls= (required for an applicable check), resolution= (degrees,
    # direction checks), not_applicable= (a reason decided before the value is seen), and
    # seed_independent= (why the value cannot change with the seed, listed by the robustness page).
    def at_least(self, name: str, value, bound, *, why: str, controls=None, **options) -> Check:
        """``value >= bound``; each control must give ``value < bound``. A NaN value fails."""
        b = _number(name, "bound", bound)
        return self._one_sided(name, value, ">=", b, why, controls, lambda v: v >= b, **options)

    def at_most(self, name: str, value, bound, *, why: str, controls=None, **options) -> Check:
        """``value <= bound``; each control must give ``value > bound``. A NaN value fails."""
        b = _number(name, "bound", bound)
        return self._one_sided(name, value, "<=", b, why, controls, lambda v: v <= b, **options)

    def within(self, name: str, value, low, high, *, why: str, controls=None, **options) -> Check:
        """``low <= value <= high``; each control must land outside. A NaN value fails."""
        lo, hi = _number(name, "low", low), _number(name, "high", high)
        if lo > hi:
            raise ValueError(f"check {name!r}: low ({lo}) must not exceed high ({hi})")
        return self._interval(name, value, lo, hi, f"in [{_show(low)}, {_show(high)}]", why, controls, **options)

    def close_to(self, name: str, value, target, *, atol: float, why: str, controls=None, **options) -> Check:
        """``|value - target| <= atol``; each control must land farther."""
        t, a = _number(name, "target", target), _number(name, "atol", atol)
        if a < 0:
            raise ValueError(f"check {name!r}: atol must be >= 0, got {a}")
        criterion = f"within {_show(atol)} of {_show(target)}"
        return self._interval(name, value, t - a, t + a, criterion, why, controls, **options)

    def equals(self, name: str, value, expected, *, why: str, controls=None, **options) -> Check:
        """Exact equality, for counts, labels and tuples (never for floats: use :meth:`close_to`)."""
        if isinstance(value, (float, np.floating)) or isinstance(expected, (float, np.floating)):
            raise TypeError(f"check {name!r}: equals() compares counts and labels; use close_to() for floats")

        def same(x):
            return (tuple(x) if isinstance(x, (tuple, list)) else x) == want

        want = tuple(expected) if isinstance(expected, (tuple, list)) else expected
        records = [
            dict(planted=c.planted, value=_plain(c.value), status=PASSED if same(c.value) else FAILED)
            for c in _as_controls(name, controls)
        ]
        fields = dict(sense="==", bound=_plain(want))
        return self._record(name, value, f"== {want}", bool(same(value)), why, records, fields, **options)

    def certificate(self, name: str, value, bound, *, sense: str = "<=", why: str) -> Check:
        """An inequality the page *proves* (e.g. a bound that holds for any point below the SVM ray),
        recorded as a fact: shown on the page, never counted among the claims table's checks. A
        certificate that fails is a bug and fails :meth:`assert_all`."""
        if sense not in ("<=", ">="):
            raise ValueError(f"certificate {name!r}: sense must be one of ['<=', '>='], got {sense!r}")
        v, b = _number(name, "value", value), _number(name, "bound", bound)
        ok = v <= b if sense == "<=" else v >= b
        log, scale = _scale(sense, b, [v])
        fields = dict(sense=sense, bound=b, margin=margin(sense, v, bound=b, log=log), scale=scale)
        return self._record(name, value, f"{sense} {_show(bound)}", ok, why, [], fields, kind=CERTIFICATE)

    # -- bookkeeping -----------------------------------------------------------------------------
    def _one_sided(self, name, value, sense, b, why, controls, accept, **options) -> Check:
        v = _number(name, "value", value)
        planted = _as_controls(name, controls)
        cvals = [_number(name, f"control {c.planted!r}", c.value) for c in planted]
        log, scale = _scale(sense, b, [v, *cvals])
        fields = dict(sense=sense, bound=b, scale=scale, margin=margin(sense, v, bound=b, log=log))
        records = [
            _control(c, x, accept(x), margin(sense, x, bound=b, log=log)) for c, x in zip(planted, cvals, strict=True)
        ]
        return self._record(name, value, f"{sense} {_show(b)}", accept(v), why, records, fields, **options)

    def _interval(self, name, value, lo, hi, criterion, why, controls, **options) -> Check:
        v = _number(name, "value", value)
        planted = _as_controls(name, controls)
        cvals = [_number(name, f"control {c.planted!r}", c.value) for c in planted]
        scale = "half-widths of the interval"
        fields = dict(sense="in", low=lo, high=hi, scale=scale, margin=margin("in", v, low=lo, high=hi))
        records = [
            _control(c, x, lo <= x <= hi, margin("in", x, low=lo, high=hi)) for c, x in zip(planted, cvals, strict=True)
        ]
        return self._record(name, value, criterion, lo <= v <= hi, why, records, fields, **options)

    def _record(
        self,
        name,
        value,
        criterion,
        ok,
        why,
        controls,
        fields,
        *,
        not_applicable=None,
        resolution=None,
        seed_independent=None,
        known_failure=None,
        kind=CHECK,
    ):
        if not name.isidentifier():
            raise ValueError(f"check name must be an identifier (it is a glue key), got {name!r}")
        if any(c.name == name for c in self.records):
            raise ValueError(f"check {name!r} was already recorded")
        if not isinstance(why, str) or not why.strip():
            raise ValueError(f"check {name!r}: why= must say what the theorem predicts (a non-empty string)")
        for label, text in (
            ("not_applicable", not_applicable),
            ("seed_independent", seed_independent),
            ("known_failure", known_failure),
        ):
            if text is not None and (not isinstance(text, str) or not text.strip()):
                raise ValueError(f"check {name!r}: {label}= must be None or a non-empty reason")
        if kind == CHECK and not controls and not not_applicable and not self.controls_pending:
            raise ValueError(
                f"check {name!r} has no control: pass controls={{what was planted: value}} (the same statistic on "
                "the nearest plausible wrong answer), or record a proved inequality with Checks.certificate()"
            )
        if resolution is not None:
            resolution = _number(name, "resolution", resolution)
        value = _plain(value)
        if isinstance(value, float) and math.isnan(value):
            ok = False
        beyond = [-c["margin"] for c in controls if c.get("margin") is not None]
        common = dict(
            description=why,
            kind=kind,
            value_status=PASSED if ok else FAILED,
            controls=controls,
            separation=min(beyond) if beyond else None,
            resolution=resolution,
            controls_pending=self.controls_pending if kind == CHECK and not controls else "",
            seed_independent=seed_independent or "",
            known_failure=known_failure or "",
            **fields,
        )
        if not_applicable:
            check = Check(name, value, criterion, NOT_APPLICABLE, None, reason=not_applicable, **common)
        else:
            good = bool(ok) and all(c["status"] == FAILED for c in controls)
            check = Check(name, value, criterion, PASSED if good else FAILED, good, **common)
        self.records.append(check)
        if self.display:
            self._show(check)
        return check

    def _show(self, check: Check) -> None:
        from IPython.display import Markdown, display  # lazy: the package imports without Jupyter
        from myst_nb import glue

        # Prose quotes the value with {glue:text}`name:.4f`, the verdict with {glue:md}`name_status`,
        # the first control with {glue:text}`name_control:.4f` and the resolution with `name_resolution`.
        glue(check.name, check.value, display=False)
        glue(f"{check.name}_status", Markdown(self._verdict(check)), display=False)
        if check.controls:
            glue(f"{check.name}_control", check.controls[0]["value"], display=False)
        if check.resolution is not None:
            glue(f"{check.name}_resolution", check.resolution, display=False)
        display({CHECK_MIME: asdict(check), "text/plain": self._line(check)}, raw=True)

    @staticmethod
    def _verdict(check: Check) -> str:
        if check.kind == CERTIFICATE:
            return "holds" if check.passed else "**VIOLATED**"
        known = " (a known failure)" if check.known_failure and check.status == FAILED else ""
        if check.status == FAILED and check.value_status == PASSED:
            return "**FAIL** (a control passed)" + known
        return {PASSED: "pass", FAILED: "**FAIL**", NOT_APPLICABLE: "not applicable"}[check.status] + known

    @staticmethod
    def _line(check: Check) -> str:
        mark = {PASSED: "pass", FAILED: "FAIL", NOT_APPLICABLE: "n/a"}[check.status]
        if check.kind == CERTIFICATE:
            mark = "fact" if check.passed else "VIOLATED"
        tail = f"; not applicable: {check.reason}" if check.reason else ""
        tail += f"; known failure: {check.known_failure}" if check.known_failure else ""
        controls = "".join(f"; control [{c['status']}] {c['planted']} = {c['value']!r}" for c in check.controls)
        return f"[{mark}] {check.name} = {check.value!r} (criterion: {check.criterion}{tail}{controls})"

    def counts(self) -> dict[str, int]:
        """How many checks ended in each state (certificates are not checks)."""
        return {status: sum(c.status == status for c in self.records if c.kind == CHECK) for status in STATUSES}

    def table(self) -> str:
        """The checks as a markdown table (value, criterion, controls, verdict)."""
        rows = ["| check | value | criterion | controls (planted: value, verdict) | verdict |", "|---|---|---|---|---|"]
        for c in self.records:
            planted = "; ".join(f"{k['planted']}: {k['value']} ({k['status']})" for k in c.controls) or "—"
            rows.append(f"| {c.description or c.name} | {c.value} | {c.criterion} | {planted} | {self._verdict(c)} |")
        return "\n".join(rows)

    def assert_all(self) -> None:
        """Raise ``AssertionError`` listing every failed check, every control that passed (the check
        cannot tell the planted wrong answer from the truth) and every violated certificate; a check
        marked ``known_failure`` is listed only if it passed (the mark must then go)."""
        problems = []
        for c in self.records:
            if c.known_failure:
                if c.status == PASSED:
                    problems.append(f"a known failure passed: remove known_failure= from {c.name!r}: " + self._line(c))
                continue
            if c.kind == CERTIFICATE and not c.passed:
                problems.append("certificate violated (a proved inequality failed: a bug): " + self._line(c))
            elif c.kind == CHECK and c.status == FAILED:
                if c.value_status == FAILED:
                    problems.append("failed check: " + self._line(c))
                for k in c.controls:
                    if k["status"] == PASSED:
                        problems.append(
                            f"control passed: the check {c.name!r} cannot tell {k['planted']} ({k['value']!r}) "
                            f"from the truth ({c.value!r}; criterion {c.criterion})"
                        )
        if problems:
            raise AssertionError("failed checks:\n" + "\n".join(problems))


def _is_check(record: dict) -> bool:
    return record.get("kind", CHECK) == CHECK


def status_of(record: dict) -> str:
    """The status of a check record read back from a summary (records without one: from ``passed``)."""
    status = record.get("status")
    if status in STATUSES:
        return status
    return PASSED if record.get("passed") else FAILED


def is_known_failure(record: dict) -> bool:
    """A failed check marked ``known_failure`` (it shows as failed but does not fail its run)."""
    return bool(record.get("known_failure")) and status_of(record) == FAILED


def count_statuses(records: list[dict]) -> dict[str, int]:
    """How many of ``records`` (dicts, as in a run's summary) ended in each state; certificates are not counted."""
    checks = [r for r in records if _is_check(r)]
    return {status: sum(status_of(r) == status for r in checks) for status in STATUSES}


def describe_counts(records: list[dict]) -> str:
    """``"11 of 12 checks pass, 1 not applicable"``; failures named by count; certificates apart.

    >>> describe_counts([{"status": "passed"}, {"status": "not applicable"}, {"passed": False},
    ...                  {"status": "passed", "kind": "certificate"}])
    '1 of 3 checks pass, 1 not applicable, 1 failed; 1 proved bound (certificate) holds'
    >>> describe_counts([{"status": "passed"}, {"status": "failed", "known_failure": "why"}])
    '1 of 2 checks pass, 1 failed (1 marked as a known failure)'
    """
    counts = count_statuses(records)
    n = sum(_is_check(r) for r in records)
    text = f"{counts[PASSED]} of {n} checks pass"
    if counts[NOT_APPLICABLE]:
        text += f", {counts[NOT_APPLICABLE]} not applicable"
    if counts[FAILED]:
        text += f", {counts[FAILED]} failed"
        known = sum(is_known_failure(r) for r in records if _is_check(r))
        text += (
            f" ({known} marked as a known failure)"
            if known == 1
            else (f" ({known} marked as known failures)" if known else "")
        )
    certificates = [r for r in records if not _is_check(r)]
    if certificates:
        held = sum(status_of(r) == PASSED for r in certificates)
        noun = "proved bound (certificate) holds" if held == 1 else "proved bounds (certificates) hold"
        text += (
            f"; {held} {noun}" if held == len(certificates) else f"; {held} of {len(certificates)} proved bounds hold"
        )
    return text
