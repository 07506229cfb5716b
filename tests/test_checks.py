"""The checks API (passed / failed / not applicable) and the declared parameter specs."""

import math

import pytest

from attnlib.book.checks import Checks, count_statuses, describe_counts, status_of
from attnlib.book.params import integer, list_of, one_of, real, validate


def test_predicates_generate_their_criterion_and_verdict():
    checks = Checks(display=False)
    assert checks.at_least("a", 0.5, 0.4, why="w").status == "passed"
    assert checks.at_least("b", 0.3, 0.4, why="w").status == "failed"
    assert checks.at_most("c", 2.0, 1.0, why="w").criterion == "<= 1"
    assert checks.within("d", 1.2, 0.9, 1.1, why="w").passed is False
    assert checks.close_to("e", 1.05, 1.0, atol=0.1, why="w").passed is True
    assert checks.equals("f", (1, 2), [1, 2], why="w").status == "passed"
    assert checks.equals("g", 3, 4, why="w").criterion == "== 4"
    assert checks.counts() == {"passed": 3, "failed": 4, "not applicable": 0}
    with pytest.raises(AssertionError, match="b = 0.3"):
        checks.assert_all()


def test_nan_fails_and_not_applicable_keeps_the_value_without_a_verdict():
    checks = Checks(display=False)
    assert checks.at_most("nan", math.nan, 1.0, why="w").status == "failed"
    na = checks.at_most("tie", 5.0, 1.0, why="w", not_applicable="the two SVMs tie")
    assert (na.status, na.passed, na.value, na.reason) == ("not applicable", None, 5.0, "the two SVMs tie")
    assert Checks(display=False).at_most("ok", 0.0, 1.0, why="w", not_applicable="n/a").status == "not applicable"


def test_bad_checks_are_refused():
    checks = Checks(display=False)
    with pytest.raises(ValueError, match="why="):
        checks.at_least("x", 1.0, 0.0, why="")
    with pytest.raises(ValueError, match="not_applicable="):
        checks.at_least("x", 1.0, 0.0, why="w", not_applicable="")
    with pytest.raises(TypeError, match="close_to"):
        checks.equals("x", 0.1, 0.1, why="w")
    with pytest.raises(TypeError, match="real number"):
        checks.at_least("x", "high", 0.0, why="w")
    with pytest.raises(ValueError, match="low"):
        checks.within("x", 1.0, 2.0, 0.0, why="w")
    checks.at_least("x", 1.0, 0.0, why="w")
    with pytest.raises(ValueError, match="already"):
        checks.at_least("x", 1.0, 0.0, why="w")


def test_summaries_read_old_and_new_records():
    records = [{"status": "passed"}, {"passed": True}, {"passed": False}, {"status": "not applicable", "passed": None}]
    assert [status_of(r) for r in records] == ["passed", "passed", "failed", "not applicable"]
    assert count_statuses(records) == {"passed": 2, "failed": 1, "not applicable": 1}
    assert describe_counts(records) == "2 of 4 checks pass, 1 not applicable, 1 failed"


def test_parameter_specs_name_the_parameter_and_the_allowed_values():
    ns = {"seed": 3, "lr": 0.1, "loss": "logistic", "sizes": [4, 8]}
    spec = dict(seed=integer(minimum=0), lr=real(above=0), loss=one_of("logistic", "linear"), sizes=list_of(integer(1)))
    assert validate(ns, **spec) == ns
    for name, bad, message in [
        ("seed", -1, "'seed' must be an int >= 0, got -1"),
        ("seed", 1.5, "'seed' must be an int >= 0"),
        ("seed", True, "'seed' must be an int"),
        ("lr", 0.0, "'lr' must be a float > 0"),
        ("lr", math.inf, "'lr' must be a float > 0"),
        ("loss", "hinge", "'loss' must be one of \\['logistic', 'linear'\\]"),
        ("sizes", [4, 0], "'sizes\\[1\\]' must be an int >= 1, got 0"),
        ("sizes", 4, "'sizes' must be a list"),
    ]:
        with pytest.raises(ValueError, match=message):
            validate({**ns, name: bad}, **spec)
    with pytest.raises(NameError, match="seed"):
        validate({}, seed=integer())
