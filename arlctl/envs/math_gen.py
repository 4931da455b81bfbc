"""Deterministic generation of math tasks: arithmetic expressions and short word problems.

A task is a pure function of (seed, index, difficulty): its random generator is seeded with that triple
as a string (Python hashes str seeds with SHA-512, stable across processes and versions), so task 17 of
seed 0 is the same everywhere, and generating 10 tasks or 10,000 gives the same first 10.

Every answer is computed with exact `Fraction` arithmetic and is an integer or a short terminating
decimal, so "NUMBER" in `<answer>NUMBER</answer>` is always writable. Difficulty 1-2 keep every
intermediate result a whole number; difficulty 3+ brings decimals, bigger numbers and more steps. Difficulty 0
is one operation (+ - *) on one-digit numbers, arithmetic only.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from arlctl.envs.calculator import format_number
from arlctl.errors import UsageError

KINDS = ("arithmetic", "word")
MAX_DIFFICULTY = 5


@dataclass(frozen=True)
class _Level:
    operands: tuple[int, int]  # min, max number of operands in an arithmetic expression
    number_max: int  # largest leaf number
    factor_max: int  # largest multiplier / divisor, keeps results readable
    decimals: bool  # leaves and results may be decimals
    ops: str


_LEVELS = {
    0: _Level((2, 2), 9, 9, False, "+-*"),  # one operation on one-digit numbers ("What is 7 * 8?"): make demo
    1: _Level((2, 3), 20, 10, False, "+-*"),
    2: _Level((3, 4), 99, 12, False, "+-*/"),
    3: _Level((4, 5), 999, 25, True, "+-*/"),
    4: _Level((5, 6), 9999, 50, True, "+-*/"),
    5: _Level((6, 7), 99999, 99, True, "+-*/"),
}
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


@dataclass(frozen=True)
class _Node:
    value: Fraction
    text: str
    precedence: int  # 3 for a number, else the operator's


def _terminates(value: Fraction, max_places: int) -> bool:
    """True if value has a decimal expansion of at most max_places digits."""
    return (value * 10**max_places).denominator == 1


def _leaf(rng: random.Random, level: _Level, low: int = 1, high: int | None = None) -> _Node:
    high = high or level.number_max
    if level.decimals and rng.random() < 0.25:
        value = Fraction(rng.randint(low * 10, high * 10 // 4 or 1), 10)  # one decimal place, smaller
    else:
        value = Fraction(rng.randint(low, high))
    return _Node(value, format_number(value), 3)


def _combine(op: str, left: _Node, right: _Node) -> _Node:
    if op == "+":
        value = left.value + right.value
    elif op == "-":
        value = left.value - right.value
    elif op == "*":
        value = left.value * right.value
    else:
        value = left.value / right.value
    prec = _PRECEDENCE[op]
    left_text = f"({left.text})" if left.precedence < prec else left.text
    # a - (b + c) and a / (b * c) need parentheses on the right; a * (b / c) does not.
    needs = right.precedence < prec or (right.precedence == prec and op in "-/")
    right_text = f"({right.text})" if needs else right.text
    return _Node(value, f"{left_text} {op} {right_text}", prec)


def _divisor(rng: random.Random, level: _Level, dividend: Fraction) -> Fraction | None:
    """A divisor that keeps the quotient a whole number (no decimals) or a short decimal."""
    if level.decimals:
        candidates = [2, 4, 5, 8, 10, 20, 25, 50][: 4 + level.factor_max // 25]
        candidates = [d for d in candidates if _terminates(dividend / d, 3)]
    else:
        if dividend.denominator != 1 or dividend == 0:
            return None
        candidates = [d for d in range(2, level.factor_max + 1) if dividend.numerator % d == 0]
    return Fraction(rng.choice(candidates)) if candidates else None


def _expression(rng: random.Random, level: _Level, operands: int) -> _Node:
    if operands == 1:
        return _leaf(rng, level)
    left_count = rng.randint(1, operands - 1)
    left = _expression(rng, level, left_count)
    op = rng.choice(level.ops)
    if op == "/":
        divisor = _divisor(rng, level, left.value)
        if divisor is not None:
            return _combine("/", left, _Node(divisor, format_number(divisor), 3))
        op = "+"
    if op == "*":
        # Keep products readable: a multi-operand factor times a small number.
        right = (
            _leaf(rng, level, 2, level.factor_max)
            if left_count > 1 or rng.random() < 0.5
            else _expression(rng, level, operands - left_count)
        )
        return _combine("*", left, right)
    right = _expression(rng, level, operands - left_count)
    if op == "-" and not level.decimals and right.value > left.value:
        left, right = right, left  # easy levels stay non-negative
    return _combine(op, left, right)


def _arithmetic(rng: random.Random, difficulty: int) -> tuple[str, Fraction, str]:
    level = _LEVELS[difficulty]
    for _attempt in range(100):
        node = _expression(rng, level, rng.randint(*level.operands))
        ok_decimals = _terminates(node.value, 4) if level.decimals else node.value.denominator == 1
        if ok_decimals and abs(node.value) <= 10**7 and node.precedence < 3:
            template = rng.choice(["What is {e}?", "Compute {e}.", "Evaluate {e}.", "Calculate {e}."])
            return template.format(e=node.text), node.value, "arithmetic"
    raise AssertionError("unreachable: arithmetic generation failed 100 times")  # pragma: no cover


# ---- word problems ----------------------------------------------------------------------------------

_NAMES = [
    "Maya",
    "Liam",
    "Aisha",
    "Kenji",
    "Sofia",
    "Omar",
    "Elena",
    "Tariq",
    "Priya",
    "Jonas",
    "Nia",
    "Mateo",
]
_ITEMS = [
    ("notebook", "notebooks"),
    ("pen", "pens"),
    ("apple", "apples"),
    ("ticket", "tickets"),
    ("sandwich", "sandwiches"),
    ("candle", "candles"),
    ("mug", "mugs"),
    ("book", "books"),
]
_THINGS = ["cookies", "marbles", "stickers", "pencils", "oranges", "cards", "beads", "eggs"]
_VEHICLES = ["train", "car", "bus", "cyclist", "boat", "truck"]


def _money(rng: random.Random, difficulty: int, low: int, high: int) -> Fraction:
    """A price in dollars: whole at difficulty 1, with cents above it."""
    dollars = rng.randint(low, high * difficulty)
    if difficulty == 1:
        return Fraction(dollars)
    return Fraction(dollars * 100 + rng.choice([25, 50, 75, 5, 95, 40]), 100)


def _dollars(amount: Fraction) -> str:
    """Prices read as prices: 12 or 12.50, never 12.5."""
    return (
        str(amount.numerator)
        if amount.denominator == 1
        else f"{amount.numerator * 100 // amount.denominator / 100:.2f}"
    )


def _shopping(rng: random.Random, d: int) -> tuple[str, Fraction]:
    name = rng.choice(_NAMES)
    (item, items), (item2, _) = rng.sample(_ITEMS, 2)
    qty, price, price2 = rng.randint(2, 3 + 2 * d), _money(rng, d, 1, 6), _money(rng, d, 1, 4)
    total = qty * price + price2
    bill = next(b for b in (10, 20, 50, 100, 200, 500, 1000, 5000) if b > total)
    question = (
        f"{name} buys {qty} {items} at ${_dollars(price)} each and one {item2} for "
        f"${_dollars(price2)}. {name} pays with a ${bill} bill. How much change, in dollars, "
        f"does {name} get back?"
    )
    return question, bill - total


def _sharing(rng: random.Random, d: int) -> tuple[str, Fraction]:
    name, things = rng.choice(_NAMES), rng.choice(_THINGS)
    friends = rng.randint(2, 4 + 2 * d)
    each = rng.randint(3, 8 * d + 4)
    if rng.random() < 0.5:
        total = friends * each
        question = (
            f"{name} has {total} {things} and shares them equally among {friends} friends. "
            f"How many {things} does each friend get?"
        )
        return question, Fraction(each)
    left = rng.randint(1, friends - 1)
    total = friends * each + left
    if rng.random() < 0.5:
        question = (
            f"{name} packs {total} {things} into bags of {friends}. After filling as many bags as "
            f"possible, how many {things} are left over?"
        )
        return question, Fraction(left)
    question = (
        f"{name} packs {total} {things} into bags that hold {friends} each. How many bags does "
        f"{name} need to pack all of them?"
    )
    return question, Fraction(each + 1)


def _speed(rng: random.Random, d: int) -> tuple[str, Fraction]:
    vehicle = rng.choice(_VEHICLES)
    speed = rng.randint(3, 12 + 4 * d) * 5
    hours = Fraction(rng.randint(1, 2 + d)) + (Fraction(rng.choice([0, 1, 1, 3]), 4) if d >= 2 else 0)
    distance = speed * hours
    form = rng.randrange(3)
    if form == 0:
        question = (
            f"A {vehicle} travels at {speed} km/h for {format_number(hours)} hours. "
            f"How many kilometres does it travel?"
        )
        return question, distance
    if form == 1:
        question = (
            f"A {vehicle} covers {format_number(distance)} km in {format_number(hours)} hours at a "
            f"steady speed. What is its speed in km/h?"
        )
        return question, Fraction(speed)
    question = (
        f"A {vehicle} must cover {format_number(distance)} km at {speed} km/h. "
        f"How many hours does the trip take?"
    )
    return question, hours


def _discount(rng: random.Random, d: int) -> tuple[str, Fraction]:
    item = rng.choice(_ITEMS)[0]
    price = Fraction(rng.randint(2, 10 * d) * (10 if d == 1 else 4))
    percent = rng.choice([10, 20, 25, 50] if d == 1 else [5, 10, 15, 20, 25, 30, 40, 75])
    question = (
        f"A {item} costs ${_dollars(price)}. It is on sale for {percent}% off. "
        f"What is the sale price in dollars?"
    )
    return question, price * (100 - percent) / 100


def _recipe(rng: random.Random, d: int) -> tuple[str, Fraction]:
    batch = rng.choice([4, 6, 8, 10, 12])
    cups = Fraction(rng.randint(1, 3 + d)) + (Fraction(1, 2) if d >= 2 and rng.random() < 0.5 else 0)
    wanted = batch * rng.randint(2, 2 + d) if d < 3 else batch * rng.randint(2, 4) + batch // 2
    question = (
        f"A recipe needs {format_number(cups)} cups of flour to make {batch} muffins. "
        f"How many cups of flour are needed to make {wanted} muffins?"
    )
    return question, cups * wanted / batch


def _ages(rng: random.Random, d: int) -> tuple[str, Fraction]:
    first, second, third = rng.sample(_NAMES, 3)
    age = rng.randint(3, 9 + d)
    times = rng.randint(2, 3 + d)
    younger = rng.randint(1, age * times - 1)
    question = (
        f"{first} is {age} years old. {second} is {times} times as old as {first}, and {third} is "
        f"{younger} years younger than {second}. How old is {third}?"
    )
    return question, Fraction(age * times - younger)


_WORD_TEMPLATES: dict[str, Callable[[random.Random, int], tuple[str, Fraction]]] = {
    "shopping": _shopping,
    "sharing": _sharing,
    "speed": _speed,
    "discount": _discount,
    "recipe": _recipe,
    "ages": _ages,
}


def generate_task(
    seed: int, index: int, difficulty: int = 1, kinds: tuple[str, ...] = KINDS
) -> dict[str, Any]:
    """Task number `index` of the stream defined by (seed, difficulty, kinds)."""
    if not 0 <= difficulty <= MAX_DIFFICULTY:
        raise UsageError(f"math difficulty must be 0..{MAX_DIFFICULTY}, got {difficulty}")
    if difficulty == 0 and "word" in kinds:
        raise UsageError("math difficulty 0 (one operation on one-digit numbers) has no word problems",
                         hint="add kinds=arithmetic")
    unknown = set(kinds) - set(KINDS)
    if unknown or not kinds:
        raise UsageError(
            f"unknown math task kind(s) {sorted(unknown)}", hint=f"choose from {', '.join(KINDS)}"
        )
    rng = random.Random(f"arlctl-math:{seed}:{index}:{difficulty}")
    kind = rng.choice(sorted(kinds))
    if kind == "arithmetic":
        question, answer, kind = _arithmetic(rng, difficulty)
    else:
        template = rng.choice(sorted(_WORD_TEMPLATES))
        question, answer = _WORD_TEMPLATES[template](rng, difficulty)
        kind = f"word:{template}"
    return {
        "task_id": f"math-s{seed}-d{difficulty}-{index:06d}",
        "env": "math",
        "question": question,
        "answer": format_number(answer),
        "kind": kind,
        "difficulty": difficulty,
        "seed": seed,
        "index": index,
    }


def generate_tasks(
    n: int, seed: int = 0, difficulty: int = 1, kinds: tuple[str, ...] = KINDS, start: int = 0
) -> list[dict[str, Any]]:
    """Tasks start .. start+n-1 of the stream; a longer request extends a shorter one."""
    if n < 0:
        raise UsageError(f"number of tasks must be >= 0, got {n}")
    return [generate_task(seed, index, difficulty, kinds) for index in range(start, start + n)]
