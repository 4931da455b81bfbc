"""Tests of the safe calculator: arithmetic results, limits, and injection attempts refused."""

from __future__ import annotations

import subprocess
import sys
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arlctl.envs.calculator import CalculatorError, calculate, evaluate, format_number


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("1 + 2 * 3", "7"),  # * before +: 1 + 6
        ("(1 + 2) * 3", "9"),  # parentheses first: 3 * 3
        ("10 - 4 - 3", "3"),  # left-associative: (10 - 4) - 3
        ("2 ** 3 ** 2", "512"),  # right-associative: 2 ** 9
        ("2 ^ 10", "1024"),  # ^ is power, as people write it
        ("-2 ** 2", "-4"),  # as in Python: -(2 ** 2)
        ("(-2) ** 2", "4"),
        ("7 / 2", "3.5"),
        ("1 / 3", "0.333333333333333"),  # 15 significant digits
        ("0.1 + 0.2", "0.3"),  # exact decimals, not 0.30000000000000004
        ("17 // 5", "3"),
        ("17 % 5", "2"),
        ("-7 // 2", "-4"),  # floor division rounds down: -3.5 -> -4
        ("1.5 * 4", "6"),
        (".5 + 1.", "1.5"),
        ("2 × 3 − 1 ÷ 2", "5.5"),  # unicode operators: 6 - 0.5
        ("sqrt(144)", "12"),
        ("sqrt(2)", "1.4142135623731"),  # 1.41421356237310 with the trailing 0 dropped
        ("abs(-3.25)", "3.25"),
        ("round(2.5)", "3"),  # half away from zero, not banker's rounding
        ("round(3.14159, 2)", "3.14"),
        ("min(4, 2, 8) + max(1, 9)", "11"),
        ("floor(7/2) + ceil(7/2)", "7"),  # 3 + 4
        ("1e3 + 1", "1001"),
        ("2 ** -2", "0.25"),
        ("10 ** 50", "1e+50"),
        ("(-pi) ** 2", "9.86960440108936"),  # float base, whole exponent: real
        ("2 ** 0.5 * 2 ** 0.5", "2"),  # 2.0000000000000004 shown to 15 digits
        ("((((1))))", "1"),
        ("(10 ** 2000) * (10 ** 1900)", "1e+3900"),  # big but allowed, and printable
    ],
)
def test_results(expression, expected):
    assert calculate(expression) == expected


def test_exact_fraction_value():
    assert evaluate("1/3 + 1/6") == Fraction(1, 2)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("", "empty expression"),
        ("2 +", "expected a number or '('"),
        ("(1 + 2", "expected ')'"),
        ("1 + 2)", "unexpected ')'"),
        ("2 3", "unexpected '3'"),
        ("(-8) ** (1/3)", "not a real number"),
        ("sqrt(-1)", "not a real number"),
        ("round(1, 2, 3)", "round() takes 1..2 arguments, got 3"),
    ],
)
def test_errors_are_messages(expression, message):
    result = calculate(expression)
    assert result.startswith("error: ")
    assert message in result


@pytest.mark.parametrize(
    "expression",
    [
        "9 ** 9 ** 9",
        "2 ** 100000",
        "10 ** 10 ** 10",
        "99999999999 ** 99999999999",
        "1e300 ** 1e300",
        "1e999999999",
        "(10 ** 3000) * (10 ** 3000) * (10 ** 3000)",
        "(10 ** 2000) * (10 ** 2000)",  # 13288 bits > 13000: past Python's int-to-str digit limit
        "-" * 500 + "1",
        "(" * 500 + "1" + ")" * 500,
        "1" * 5000,
    ],
)
def test_bombs_are_refused_before_computing(expression):
    # In a child process so that a bomb that does get computed (9**9**9 takes minutes and holds the GIL)
    # fails the test at the generous timeout instead of hanging the whole run.
    try:
        child = subprocess.run(
            [sys.executable, "-c", _CALCULATE, expression], capture_output=True, text=True, timeout=120
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"calculate({expression[:40]!r}) did not return: the bomb was computed, not refused")
    assert child.returncode == 0, child.stderr
    assert child.stdout.startswith("error: "), child.stdout


# Prints calculate(argv[1]) for the bomb test.
_CALCULATE = "import sys\nfrom arlctl.envs.calculator import calculate\nprint(calculate(sys.argv[1]), end='')"


@pytest.mark.parametrize(
    ("attack", "message"),
    [
        ("__import__('os').system('id')", "unexpected character '_'"),
        ("().__class__", "unexpected character '.'"),
        ("().__class__.__bases__[0].__subclasses__()", "unexpected character '.'"),
        ("open('/etc/passwd')", 'unexpected character "\'"'),
        ("lambda: 1", "unexpected character ':'"),
        ("lambda", "unknown name 'lambda'"),
        ("exec", "unknown name 'exec'"),
        ("eval(1)", "unknown name 'eval'"),
        ("abs.__call__(1)", "unexpected character '.'"),
        ("sqrt.real", "unexpected character '.'"),
        ("[1, 2]", "unexpected character '['"),
        ("x = 1", "unexpected character '='"),
        ("x + 1", "unknown name 'x'"),
        ("1; import os", "unexpected character ';'"),
        ("globals()", "unknown name 'globals'"),
    ],
)
def test_code_injection_is_refused(attack, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = calculate(attack)
    assert result.startswith("error: ")
    assert message in result
    assert list(tmp_path.iterdir()) == []  # nothing ran, nothing was written


def test_injection_never_runs_a_side_effect(tmp_path):
    marker = tmp_path / "pwned"
    calculate(f"__import__('pathlib').Path('{marker}').touch()")
    calculate(f"open('{marker}', 'w')")
    assert not marker.exists()


def test_evaluate_raises_typed_error():
    with pytest.raises(CalculatorError, match="division by zero"):
        evaluate("1/0")
    with pytest.raises(CalculatorError, match="must be a string"):
        evaluate(42)  # type: ignore[arg-type]


def test_format_number():
    assert format_number(Fraction(-7, 4)) == "-1.75"
    assert format_number(Fraction(1, 1024)) == "0.0009765625"
    assert format_number(Fraction(10**41)) == "1e+41"
    assert format_number(Fraction(1, 3) * 10**20) == "3.33333333333333e+19"
    assert format_number(0.5) == "0.5"
    assert format_number(Fraction(0)) == "0"


# ---- property tests: the parser agrees with exact arithmetic on random expressions --------------------


def _expressions():
    """(text, exact value) pairs built with Fractions, fully parenthesised so precedence is explicit."""
    leaves = st.integers(min_value=0, max_value=999).map(lambda n: (str(n), Fraction(n)))

    def extend(children):
        def combine(pair):
            (left_text, left), op, (right_text, right) = pair
            if op == "/" and right == 0:
                op = "*"
            value = {"+": left + right, "-": left - right, "*": left * right}.get(op)
            value = left / right if op == "/" else value
            return f"({left_text} {op} {right_text})", value

        return st.tuples(children, st.sampled_from("+-*/"), children).map(combine)

    return st.recursive(leaves, extend, max_leaves=12)


@settings(max_examples=100, deadline=None)
@given(_expressions())
def test_random_expressions_evaluate_exactly(pair):
    text, value = pair
    assert evaluate(text) == value


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet="0123456789+-*/%^().,e_ ab'\"[]", max_size=60))
def test_arbitrary_text_never_crashes(text):
    result = calculate(text)
    assert isinstance(result, str) and result
