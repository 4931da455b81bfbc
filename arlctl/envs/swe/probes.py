"""Probe grading: the verdict for the built-in suite is computed outside the process that runs model code.

A hidden or visible test of the built-in suite checks values (`_same(actual, expected)`, `assert a == b`,
`assert f(x)`, `with pytest.raises(E)`). When the suite is built, `to_probe_source` rewrites each test
file into its probe form: every check records the value it would have checked (`_probe(actual)`) and the
expected side is removed. Running the probe files on the gold fix gives the expected records, which are
kept in task.json (`probe_expected`) and never enter a sandbox. At grading time the sandbox runs the
probe files against the agent's code and returns the raw records (harness/probe.py); `verdicts` below,
on the host, compares them. Model code shares the tested process and can forge any record, but it cannot
see what a record must be to pass, so forging is no better than computing.

Comparison modes mirror the original checks:
  same    `_same`: exact types, recursively; floats within 1e-9 relative
  eq      `==` and truth checks: Python's equality on the decoded values (1 == 1.0 == True, [1] != (1,))
  raises  `pytest.raises(E)`: the block raised an exception with a class named E in its MRO
"""

from __future__ import annotations

import ast
import json
from fractions import Fraction
from typing import Any

PROBE_MODULE = "arlctl_probe"
PROBE_HEADER = f"from {PROBE_MODULE} import probe as _probe, raises as _raises  # the checks record, the host compares\n"
_NUMBER_TAGS = {"bool", "int", "float", "Decimal", "Fraction"}
_WRAPPED = {"dataclass", "namedtuple", "object", "enum", "exception"}
_MAX_RECORDS_PER_TEST = 10_000


class ProbeSourceError(ValueError):
    """A test uses a check the probe rewriter does not know; the suite build must not silently weaken it."""


# ---- build time: the probe form of a test file ---------------------------------------------------------


def _probe_call(expr: ast.expr, mode: str) -> ast.stmt:
    args = [expr] if mode == "eq" else [expr, ast.Constant(mode)]
    return ast.Expr(ast.Call(ast.Name("_probe", ast.Load()), args, []))


def _leaves(test: ast.expr) -> list[ast.expr]:
    """The values an assert checks: both sides of `==` (constants excepted), operands of and/or/not."""
    if isinstance(test, ast.BoolOp):
        return [leaf for value in test.values for leaf in _leaves(value)]
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _leaves(test.operand)
    if isinstance(test, ast.Compare):
        if len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
            raise ProbeSourceError(f"unsupported comparison in assert: {ast.unparse(test)}")
        return [side for side in (test.left, *test.comparators) if not _is_literal(side)]
    return [test]


def _is_literal(expr: ast.expr) -> bool:
    try:
        ast.literal_eval(expr)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _raises_name(item: ast.withitem) -> str | None:
    """'E' for `with pytest.raises(E)` (or `pytest.raises(mod.E)`), else None."""
    call = item.context_expr
    if not (isinstance(call, ast.Call) and ast.unparse(call.func) == "pytest.raises"):
        return None
    if len(call.args) != 1 or call.keywords:
        raise ProbeSourceError(f"unsupported pytest.raises form: {ast.unparse(call)}")
    return ast.unparse(call.args[0]).split(".")[-1]


class _ToProbes(ast.NodeTransformer):
    def __init__(self) -> None:
        self.raises: dict[str, list[str]] = {}  # test function -> exception names, in source order
        self.function = ""

    def visit_Assert(self, node: ast.Assert) -> list[ast.stmt]:  # noqa: N802
        return [ast.copy_location(_probe_call(leaf, "eq"), node) for leaf in _leaves(node.test)]

    def visit_Expr(self, node: ast.Expr) -> ast.stmt:  # noqa: N802
        call = node.value
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "_same":
            if len(call.args) != 2:
                raise ProbeSourceError(f"_same takes (actual, expected): {ast.unparse(call)}")
            return ast.copy_location(_probe_call(call.args[0], "same"), node)
        return self.generic_visit(node)

    def visit_With(self, node: ast.With) -> ast.stmt:  # noqa: N802
        self.generic_visit(node)
        names = [_raises_name(item) for item in node.items]
        if any(names):
            if len(node.items) != 1:
                raise ProbeSourceError("pytest.raises must be the only context manager of its with")
            self.raises.setdefault(self.function, []).append(names[0])
            node.items = [ast.withitem(ast.Call(ast.Name("_raises", ast.Load()), [], []))]
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.stmt:  # noqa: N802
        if node.name == "_same":  # the strict helper: its work moves to the host
            return ast.Pass()
        outer, self.function = self.function, self.function or node.name
        try:
            return self.generic_visit(node)
        finally:
            self.function = outer


def to_probe_source(source: str) -> tuple[str, dict[str, list[str]]]:
    """(probe form of a test file, {test function: exception names its pytest.raises blocks expect}).

    The names stay on the trusted side: the probe form says only that a block may raise."""
    tree = ast.parse(source)
    rewriter = _ToProbes()
    tree = ast.fix_missing_locations(rewriter.visit(tree))
    return PROBE_HEADER + ast.unparse(tree) + "\n", rewriter.raises


# ---- grading time: compare the records on the trusted side ---------------------------------------------


def records_by_test(text: str) -> tuple[dict[str, list[dict[str, Any]]], int]:
    """Parse the recorder's lines into node id -> [record]; also the count of lines that were not records."""
    by_test: dict[str, list[dict[str, Any]]] = {}
    junk = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            node, mode = record["node"], record["mode"]
            if not isinstance(node, str) or not isinstance(mode, str):
                raise TypeError
        except (ValueError, TypeError, KeyError, RecursionError):
            junk += 1
            continue
        if mode in ("begin", "end"):
            by_test.setdefault(node, [])
            continue
        bucket = by_test.setdefault(node, [])
        if len(bucket) < _MAX_RECORDS_PER_TEST:
            bucket.append(record)
    return by_test, junk


def _number(encoded: list) -> Fraction | None:
    from decimal import Decimal, InvalidOperation

    tag, raw = encoded[0], encoded[1]
    try:
        if tag == "bool":
            return Fraction(int(bool(raw)))
        if tag == "int":
            return Fraction(int(raw))
        if tag == "float":
            value = float(raw)
            return None if value != value or value in (float("inf"), float("-inf")) else Fraction(value)
        if tag == "Decimal":
            value = Decimal(raw)
            return Fraction(value) if value.is_finite() else None
        return Fraction(raw)
    except (ValueError, TypeError, ArithmeticError, InvalidOperation):
        return None


def _well_formed(encoded: Any) -> bool:
    return isinstance(encoded, list) and bool(encoded) and isinstance(encoded[0], str)


def _float_close(actual: str, expected: str) -> bool:
    try:
        a, e = float(actual), float(expected)
    except (TypeError, ValueError):
        return False
    return abs(a - e) <= 1e-9 * max(1.0, abs(e))


def _items_match(actual: Any, expected: Any, match: Any) -> bool:
    """Containers and wrapped objects item by item with `match`; anything else must be equal as encoded."""
    tag = expected[0]
    if tag in ("list", "tuple", "set", "frozenset", "dict"):
        items_a, items_e = actual[1], expected[1]
        if not isinstance(items_a, list) or len(items_a) != len(items_e):
            return False
        if tag == "dict":  # [[key, value], ...] sorted by key: keys exactly, values by `match`
            return all(isinstance(a, list) and len(a) == 2 and a[0] == e[0] and match(a[1], e[1])
                       for a, e in zip(items_a, items_e))
        return all(match(a, e) for a, e in zip(items_a, items_e))
    if tag in _WRAPPED:  # [tag, class name, encoding of the contents]
        return len(actual) == 3 and actual[1] == expected[1] and match(actual[2], expected[2])
    return actual == expected


def same(actual: Any, expected: Any) -> bool:
    """`_same` on encodings: the exact type everywhere, floats within 1e-9 relative."""
    if not (_well_formed(actual) and _well_formed(expected)) or actual[0] != expected[0]:
        return False
    if expected[0] == "float":
        return len(actual) == 2 and _float_close(actual[1], expected[1])
    return _items_match(actual, expected, same)


def eq(actual: Any, expected: Any) -> bool:
    """Python's `==` on encodings: numbers by exact value across int/float/bool/Decimal, containers by item."""
    if not (_well_formed(actual) and _well_formed(expected)):
        return False
    tag_a, tag_e = actual[0], expected[0]
    if tag_a in _NUMBER_TAGS and tag_e in _NUMBER_TAGS and len(actual) == 2 and len(expected) == 2:
        left, right = _number(actual), _number(expected)
        return left is not None and left == right
    sets = {"set", "frozenset"}
    if tag_a != tag_e and not (tag_a in sets and tag_e in sets):
        return False
    return _items_match(actual, expected, eq)


def record_matches(actual: dict[str, Any], expected: dict[str, Any]) -> bool:
    """Whether one recorded check passes against its expected record (same mode, value compared by mode)."""
    mode = expected.get("mode")
    if actual.get("mode") != mode:
        return False
    value, want = actual.get("v"), expected.get("v")
    try:
        if mode == "same":
            return same(value, want)
        if mode == "eq":
            return eq(value, want)
        if mode == "raises":  # want: ["raises", "ValueError"]; value: ["raised", [class names]]
            return (_well_formed(value) and value[0] == "raised" and isinstance(value[1], list)
                    and want[1] in value[1])
    except RecursionError:
        return False
    return False


def verdicts(records_text: str, expected: dict[str, list[dict[str, Any]]],
             test_ids: list[str]) -> tuple[dict[str, str], dict[str, Any]]:
    """node id -> passed | failed | missing for each of `test_ids`, and details for reward_info.

    A test passes when it recorded exactly its expected checks, in order, each matching."""
    by_test, junk = records_by_test(records_text)
    outcomes: dict[str, str] = {}
    first_mismatch: dict[str, int] = {}
    for test_id in test_ids:
        want = expected.get(test_id)
        got = by_test.get(test_id)
        if want is None or got is None:
            outcomes[test_id] = "missing"
            continue
        bad = next((i for i, (g, w) in enumerate(zip(got, want)) if not record_matches(g, w)), None)
        if bad is None and len(got) != len(want):
            bad = min(len(got), len(want))
        outcomes[test_id] = "passed" if bad is None else "failed"
        if bad is not None:
            first_mismatch[test_id] = bad
    details = {"checks_recorded": sum(len(v) for v in by_test.values()), "junk_lines": junk,
               "first_failed_check": first_mismatch}
    return outcomes, details
