"""A safe arithmetic evaluator: the `calculator` tool of the math environment.

Model text is never handed to eval/exec or to Python's parser. A small tokenizer turns the expression into
numbers, operators, parentheses and whitelisted function names; a recursive-descent parser evaluates them
with exact `Fraction` arithmetic (floats only where a result is irrational, e.g. sqrt(2)). Anything else —
quotes, underscores, attribute access, unknown names — is refused with a message the model can read.

Bombs are bounded: the input length, nesting depth, literal size, exponent size and the bit size of every
intermediate result are capped, and a power whose result would exceed the cap is refused before it is
computed, so every evaluation finishes in milliseconds.

Grammar (lowest to highest precedence):
    expr    := term (('+' | '-') term)*
    term    := unary (('*' | '/' | '//' | '%') unary)*
    unary   := ('+' | '-') unary | power
    power   := atom (('**' | '^') unary)?          # right-associative; -2**2 == -4 as in Python
    atom    := NUMBER | NAME | NAME '(' expr (',' expr)* ')' | '(' expr ')'
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

Number = Fraction | float

MAX_EXPRESSION_CHARS = 2000
MAX_DEPTH = 60  # nested parentheses / unary signs / function calls
MAX_LITERAL_DIGITS = 200
MAX_LITERAL_EXPONENT = 300  # 1e300 is fine; 1e999999999 would allocate a huge integer
MAX_RESULT_BITS = 13_000  # ~3900 decimal digits: below Python's 4300-digit int-to-str limit
MAX_ROUND_DIGITS = 50

# Friendly spellings models produce; mapped before tokenizing.
_TRANSLATIONS = str.maketrans({"×": "*", "·": "*", "÷": "/", "−": "-", "–": "-"})


class CalculatorError(ValueError):
    """The expression is invalid or unsafe; the message is meant for the model."""


@dataclass(frozen=True)
class _Token:
    kind: str  # "num", "name", "op", "(", ")", ",", "end"
    text: str
    pos: int


_TOKEN_RE = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<name>[A-Za-z][A-Za-z0-9]*)
  | (?P<op>\*\*|//|[-+*/%^])
  | (?P<lparen>\()
  | (?P<rparen>\))
  | (?P<comma>,)
    """,
    re.VERBOSE,
)


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    pos = 0
    while pos < len(text):
        match = _TOKEN_RE.match(text, pos)
        if match is None:
            raise CalculatorError(
                f"unexpected character {text[pos]!r} at position {pos}; only numbers, + - * / // % ** ^, "
                f"parentheses and the functions {', '.join(sorted(_FUNCTIONS))} are allowed"
            )
        kind = match.lastgroup or ""
        if kind != "space":
            kind = {"lparen": "(", "rparen": ")", "comma": ","}.get(kind, kind)
            tokens.append(_Token(kind, match.group(), pos))
        pos = match.end()
    tokens.append(_Token("end", "", len(text)))
    return tokens


def _parse_literal(text: str) -> Fraction:
    mantissa, _, exponent = text.lower().partition("e")
    if len(mantissa.replace(".", "")) > MAX_LITERAL_DIGITS:
        raise CalculatorError(f"number {text[:20]}... has more than {MAX_LITERAL_DIGITS} digits")
    if exponent and abs(int(exponent)) > MAX_LITERAL_EXPONENT:
        raise CalculatorError(f"exponent in {text} is too large (limit 1e{MAX_LITERAL_EXPONENT})")
    return Fraction(text)


def _check_size(value: Number) -> Number:
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CalculatorError("result is too large (overflow)")
        return value
    if max(value.numerator.bit_length(), value.denominator.bit_length()) > MAX_RESULT_BITS:
        raise CalculatorError(f"result is too large (more than {MAX_RESULT_BITS} bits)")
    return value


def _as_float(value: Number) -> float:
    try:
        return float(value)
    except OverflowError as exc:
        raise CalculatorError("number is too large for an inexact operation") from exc


def _power(base: Number, exponent: Number) -> Number:
    if isinstance(exponent, Fraction) and exponent.denominator == 1 and isinstance(base, Fraction):
        exp_int = exponent.numerator
        if base == 0 and exp_int < 0:
            raise CalculatorError("division by zero (0 raised to a negative power)")
        if base in (0, 1) or exp_int == 0:
            return Fraction(base**exp_int)
        if base == -1:
            return Fraction(1 if exp_int % 2 == 0 else -1)
        # Refuse before computing: the result needs about bits(base) * |exponent| bits.
        size = max(base.numerator.bit_length(), base.denominator.bit_length())
        if size * abs(exp_int) > MAX_RESULT_BITS:
            raise CalculatorError(
                f"exponent {_format_short(exponent)} is too large for base {_format_short(base)}"
            )
        return Fraction(base) ** exp_int
    base_f, exp_f = _as_float(base), _as_float(exponent)
    if base_f < 0 and not exp_f.is_integer():
        raise CalculatorError("a negative number raised to a fractional power is not a real number")
    try:
        return _check_size(base_f**exp_f)
    except OverflowError as exc:
        raise CalculatorError("result is too large (overflow)") from exc
    except ZeroDivisionError as exc:
        raise CalculatorError("division by zero (0 raised to a negative power)") from exc


def _binary(op: str, left: Number, right: Number) -> Number:
    if op in ("/", "//", "%") and right == 0:
        raise CalculatorError("division by zero")
    if op in ("**", "^"):
        return _check_size(_power(left, right))
    if isinstance(left, float) or isinstance(right, float):
        left, right = _as_float(left), _as_float(right)
    if op == "+":
        result = left + right
    elif op == "-":
        result = left - right
    elif op == "*":
        result = left * right
    elif op == "/":
        result = left / right
    elif op == "//":
        result = left // right
    else:
        result = left % right
    if isinstance(result, int):  # float // float returns float, Fraction // Fraction returns int
        result = Fraction(result)
    return _check_size(result)


def _sqrt(x: Number) -> Number:
    if x < 0:
        raise CalculatorError("sqrt of a negative number is not a real number")
    if isinstance(x, Fraction):
        num_root, den_root = math.isqrt(x.numerator), math.isqrt(x.denominator)
        if num_root * num_root == x.numerator and den_root * den_root == x.denominator:
            return Fraction(num_root, den_root)
    return math.sqrt(_as_float(x))


def _round(x: Number, digits: Number = Fraction(0)) -> Number:
    """Round half away from zero (what people expect of 2.5 -> 3), to `digits` decimal places."""
    if not (isinstance(digits, Fraction) and digits.denominator == 1) or abs(digits) > MAX_ROUND_DIGITS:
        raise CalculatorError(
            f"round digits must be a whole number between -{MAX_ROUND_DIGITS} and {MAX_ROUND_DIGITS}"
        )
    exact = Fraction(x) if isinstance(x, float) else x
    scale = Fraction(10) ** int(digits)
    scaled = abs(exact) * scale
    rounded = Fraction(math.floor(scaled + Fraction(1, 2))) / scale
    return rounded if exact >= 0 else -rounded


_FUNCTIONS: dict[str, tuple[Callable[..., Number], int, int]] = {
    # name: (function, min args, max args)
    "sqrt": (_sqrt, 1, 1),
    "abs": (lambda x: abs(x), 1, 1),
    "round": (_round, 1, 2),
    "floor": (lambda x: Fraction(math.floor(x)), 1, 1),
    "ceil": (lambda x: Fraction(math.ceil(x)), 1, 1),
    "min": (lambda *xs: min(xs), 1, 20),
    "max": (lambda *xs: max(xs), 1, 20),
}
_CONSTANTS: dict[str, Number] = {"pi": math.pi, "e": math.e}


class _Parser:
    def __init__(self, tokens: list[_Token]):
        self.tokens = tokens
        self.index = 0
        self.depth = 0

    def peek(self) -> _Token:
        return self.tokens[self.index]

    def take(self) -> _Token:
        token = self.tokens[self.index]
        self.index += 1
        return token

    def expect(self, kind: str) -> _Token:
        token = self.take()
        if token.kind != kind:
            found = repr(token.text) if token.kind != "end" else "end of expression"
            raise CalculatorError(f"expected {kind!r} at position {token.pos}, found {found}")
        return token

    def descend(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise CalculatorError(f"expression is nested too deeply (limit {MAX_DEPTH})")

    def expr(self) -> Number:
        value = self.term()
        while self.peek().kind == "op" and self.peek().text in ("+", "-"):
            op = self.take().text
            value = _binary(op, value, self.term())
        return value

    def term(self) -> Number:
        value = self.unary()
        while self.peek().kind == "op" and self.peek().text in ("*", "/", "//", "%"):
            op = self.take().text
            value = _binary(op, value, self.unary())
        return value

    def unary(self) -> Number:
        token = self.peek()
        if token.kind == "op" and token.text in ("+", "-"):
            self.take()
            self.descend()
            operand = self.unary()
            self.depth -= 1
            return -operand if token.text == "-" else operand
        return self.power()

    def power(self) -> Number:
        base = self.atom()
        if self.peek().kind == "op" and self.peek().text in ("**", "^"):
            op = self.take().text
            self.descend()
            exponent = self.unary()
            self.depth -= 1
            return _binary(op, base, exponent)
        return base

    def atom(self) -> Number:
        token = self.take()
        if token.kind == "num":
            return _parse_literal(token.text)
        if token.kind == "(":
            self.descend()
            value = self.expr()
            self.expect(")")
            self.depth -= 1
            return value
        if token.kind == "name":
            return self.name(token)
        found = repr(token.text) if token.kind != "end" else "end of expression"
        raise CalculatorError(f"expected a number or '(' at position {token.pos}, found {found}")

    def name(self, token: _Token) -> Number:
        lowered = token.text.lower()
        if lowered in _CONSTANTS and self.peek().kind != "(":
            return _CONSTANTS[lowered]
        if lowered not in _FUNCTIONS:
            allowed = ", ".join(sorted(_FUNCTIONS) + sorted(_CONSTANTS))
            raise CalculatorError(f"unknown name {token.text!r}; allowed names: {allowed}")
        function, min_args, max_args = _FUNCTIONS[lowered]
        self.expect("(")
        self.descend()
        args = [self.expr()]
        while self.peek().kind == ",":
            self.take()
            args.append(self.expr())
        self.expect(")")
        self.depth -= 1
        if not min_args <= len(args) <= max_args:
            raise CalculatorError(f"{lowered}() takes {min_args}..{max_args} arguments, got {len(args)}")
        return _check_size(function(*args))


def evaluate(expression: str) -> Number:
    """Evaluate an arithmetic expression exactly; raise CalculatorError with a readable message."""
    if not isinstance(expression, str):
        raise CalculatorError(f"expression must be a string, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression is longer than {MAX_EXPRESSION_CHARS} characters")
    text = expression.translate(_TRANSLATIONS).strip()
    if not text:
        raise CalculatorError("empty expression")
    parser = _Parser(_tokenize(text))
    value = parser.expr()
    if parser.peek().kind != "end":
        token = parser.peek()
        raise CalculatorError(f"unexpected {token.text!r} at position {token.pos}")
    return value


def _format_short(value: Number) -> str:
    text = format_number(value)
    return text if len(text) <= 30 else text[:27] + "..."


def _scientific(value: Fraction, significant: int) -> str:
    """Scientific notation computed with integers, so it works far beyond the float range."""
    magnitude = abs(value)
    exponent = len(str(magnitude.numerator)) - len(str(magnitude.denominator))
    if magnitude < Fraction(10) ** exponent:
        exponent -= 1
    scaled = round(magnitude / Fraction(10) ** exponent * 10 ** (significant - 1))
    if scaled >= 10**significant:  # rounding carried into a new digit (9.99... -> 10.0)
        scaled //= 10
        exponent += 1
    digits = str(scaled).rstrip("0") or "0"
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{'-' if value < 0 else ''}{mantissa}e{exponent:+d}"


def _terminating_decimal(value: Fraction) -> str | None:
    """The exact decimal expansion if the denominator has only the factors 2 and 5 and it is short."""
    denominator = value.denominator
    twos = fives = 0
    while denominator % 2 == 0:
        denominator //= 2
        twos += 1
    while denominator % 5 == 0:
        denominator //= 5
        fives += 1
    places = max(twos, fives)
    if denominator != 1 or places > 30:
        return None
    scaled = abs(value.numerator * 10**places // value.denominator)
    digits = str(scaled).rjust(places + 1, "0")
    sign = "-" if value < 0 else ""
    return f"{sign}{digits[:-places]}.{digits[-places:]}" if places else f"{sign}{digits}"


def format_number(value: Number, significant: int = 15) -> str:
    """Render a result for the model: integers and short terminating decimals exactly, else 15 digits."""
    if isinstance(value, float):
        value = Fraction(value) if value != 0 else Fraction(0)
        exact = False
    else:
        exact = True
    if value == 0:
        return "0"
    if exact and value.denominator == 1:
        text = str(value.numerator)
        return text if len(text.lstrip("-")) <= 40 else _scientific(value, significant)
    if exact:
        decimal = _terminating_decimal(value)
        if decimal is not None and len(decimal) <= 60:
            return decimal
    if Fraction(1, 10**6) <= abs(value) < 10**15:
        text = f"{float(value):.{significant}g}"
        return text.rstrip("0").rstrip(".") if "." in text and "e" not in text else text
    return _scientific(value, significant)


def calculate(expression: str) -> str:
    """The tool function: the result as text, or `error: ...` that the model sees as the observation."""
    try:
        return format_number(evaluate(expression))
    except CalculatorError as exc:
        return f"error: {exc}"
    except (RecursionError, MemoryError, OverflowError, ValueError, ZeroDivisionError) as exc:
        # Defensive: the limits above should make these unreachable; never crash the env.
        return f"error: could not evaluate expression ({type(exc).__name__})"
