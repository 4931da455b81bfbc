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
    if actual.get("mode") != mode or actual.get("site") != expected.get("site"):
        return False
    value, want = actual.get("v"), expected.get("v")
    try:
        if mode == "same":
            return same(value, want)
        if mode == "eq":
            return eq(value, want)
        if mode == "raises":  # want: ["raises", "ValueError" | [names], demands?]; value: ["raised", [names], msg?]
            return _raised_as_demanded(value, want)
        if mode == "almost":  # want: ["almost", number, places, delta]
            return _almost_equal(value, want)
    except (RecursionError, TypeError, IndexError, ValueError):
        return False
    return False


def _builtin_chain(names: list[Any]) -> bool:
    """A recorded class chain could be a real MRO: it names no class twice, and the built-in exception
    classes it names each derive from the next one named. A forger listing every built-in exception name
    (to pass any raise check) fails this: ValueError and KeyError are on no single chain."""
    import builtins

    if not (names and all(isinstance(n, str) for n in names)):
        return False
    if len(set(names)) != len(names):
        return False
    found = [getattr(builtins, n) for n in names
             if isinstance(getattr(builtins, n, None), type) and issubclass(getattr(builtins, n), BaseException)]
    return all(issubclass(a, b) for a, b in zip(found, found[1:]))


def _raised_as_demanded(value: Any, want: Any) -> bool:
    if not (_well_formed(value) and value[0] == "raised" and isinstance(value[1], list)):
        return False
    names = want[1] if isinstance(want[1], list) else [want[1]]
    if not (_builtin_chain(value[1]) and any(n in value[1] for n in names)):
        return False
    demands = want[2] if len(want) > 2 else {}
    if len(value[1]) > demands.get("max_mro", len(value[1])):  # no longer than the gold fix's own class chain
        return False
    pattern = demands.get("pattern")
    if pattern is None:
        return True
    message = value[2] if len(value) > 2 else None
    if not isinstance(message, str) or len(message) > _MAX_MESSAGE:
        return False
    if demands.get("how") == "contains":
        return pattern in message
    import re

    return re.search(pattern, message) is not None


def _almost_equal(value: Any, want: Any) -> bool:
    """unittest's assertAlmostEqual: a == b, or round(|a - b|, places) == 0, or |a - b| <= delta."""
    if not (_well_formed(value) and value[0] in ("int", "float") and len(value) == 2):
        return False
    actual, expected, places, delta = float(value[1]), float(want[1]), want[2], want[3]
    if actual == expected:
        return True
    diff = abs(actual - expected)
    if diff != diff:
        return False
    return diff <= delta if delta is not None else round(diff, places) == 0


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


# ---- prepare time: the probe form of any row's test file, test by test ---------------------------------
#
# `arlctl swe prepare` (prepare.py) converts the test files of SWE-bench-format rows. A check becomes a
# record of the values it looks at; the expected side leaves the file. A test some check of which cannot
# be converted soundly is reported as unconvertible with the reason (never converted with that check left
# out). Each converted raise or tolerance check gets a site number; what the check demands (exception
# names, message pattern, tolerance) stays on the trusted side under that number (`ProbeForm.sites`).

_EQUALITY_METHODS = {  # unittest methods whose two first arguments are compared: both recorded unless literal
    "assertEqual", "assertEquals", "failUnlessEqual", "assertNotEqual", "assertNotEquals", "failIfEqual",
    "assertListEqual", "assertTupleEqual", "assertDictEqual", "assertSetEqual", "assertSequenceEqual",
    "assertMultiLineEqual", "assertCountEqual", "assertIn", "assertNotIn", "assertGreater", "assertGreaterEqual",
    "assertLess", "assertLessEqual", "assertRegex", "assertNotRegex", "assertRegexpMatches",
}
_ONE_VALUE_METHODS = {  # the first argument is recorded (and compared with the gold fix's value)
    "assertTrue", "assert_", "failUnless", "assertFalse", "failIf", "assertIsNotNone",
    "assertIsInstance", "assertNotIsInstance",
}
_RAISES_METHODS = {"assertRaises": None, "assertRaisesRegex": "search", "assertRaisesRegexp": "search",
                   "assertRaisesMessage": "contains"}
_SINGLETONS = (None, True, False)
_MAX_MESSAGE = 10_000


class ProbeForm:
    """The probe form of one test file: source, the trusted side's demands per site, and the issues found.

    issues: scope -> why; a scope is a test ("Class::test_x", "test_y"), a class's non-test code
    ("Class::*") or the module's ("*"): an issue in a scope makes every test it reaches unconvertible."""

    def __init__(self, source: str, sites: dict[str, dict[str, Any]], issues: dict[str, str]) -> None:
        self.source, self.sites, self.issues = source, sites, issues

    def cause_for(self, node_id: str) -> str | None:
        """Why the test `node_id` (path::[Class::]name[params]) could not be converted, or None."""
        parts = node_id.split("::")[1:]
        if parts:
            parts[-1] = parts[-1].split("[")[0]
        scopes = ["*"] + (["::".join(parts[:-1]) + "::*"] if len(parts) > 1 else []) + ["::".join(parts)]
        causes = [self.issues[s] for s in scopes if s in self.issues]
        return causes[0] if causes else None


def _literal_value(expr: ast.expr) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(expr)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _exception_names(expr: ast.expr) -> list[str]:
    """Class names a raise check accepts: `E`, `mod.E` or a tuple of them."""
    items = expr.elts if isinstance(expr, ast.Tuple) else [expr]
    if not items or not all(isinstance(i, (ast.Name, ast.Attribute)) for i in items):
        raise ProbeSourceError(f"raise check with a computed exception class: {ast.unparse(expr)}")
    return [ast.unparse(i).split(".")[-1] for i in items]


def _pattern(expr: ast.expr | None, what: str) -> str | None:
    if expr is None:
        return None
    ok, value = _literal_value(expr)
    if not ok or not isinstance(value, str):
        raise ProbeSourceError(f"{what} is not a string literal: {ast.unparse(expr)}")
    return value


class _ToProbeForm(ast.NodeTransformer):
    """Rewrites checks into records (see ProbeForm); collects issues instead of stopping at the first."""

    def __init__(self, site_prefix: str = "") -> None:
        self.sites: dict[str, dict[str, Any]] = {}
        self.issues: dict[str, str] = {}
        self.scope = "*"
        self.prefix = site_prefix

    def _site(self, spec: dict[str, Any]) -> ast.Constant:
        name = f"{self.prefix}{len(self.sites)}"
        self.sites[name] = spec
        return ast.Constant(name)

    def _probe(self, expr: ast.expr, mode: str, site: ast.Constant | None = None) -> ast.stmt:
        args = [expr, ast.Constant(mode)] + ([site] if site is not None else [])
        return ast.Expr(ast.Call(ast.Name("_probe", ast.Load()), args, []))

    def _issue(self, why: str) -> None:
        self.issues.setdefault(self.scope, why)

    def _records(self, sides: list[ast.expr]) -> list[ast.stmt]:
        return [self._probe(side, "eq") for side in sides if not _is_literal(side)]

    # -- statements that hold checks

    def visit_Assert(self, node: ast.Assert) -> list[ast.stmt] | ast.stmt:  # noqa: N802
        try:
            stmts = self._assert_records(node.test)
        except ProbeSourceError as err:
            self._issue(str(err))
            return node
        return [ast.copy_location(s, node) for s in stmts] or [ast.copy_location(ast.Pass(), node)]

    def _assert_records(self, test: ast.expr) -> list[ast.stmt]:
        if isinstance(test, ast.BoolOp):
            return [s for value in test.values for s in self._assert_records(value)]
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return self._assert_records(test.operand)
        if isinstance(test, ast.Compare):
            operands = [test.left, *test.comparators]
            if any(isinstance(op, (ast.Is, ast.IsNot)) for op in test.ops):
                return self._identity(operands, "assert " + ast.unparse(test))
            return self._records(operands)
        return [self._probe(test, "eq")]

    def _identity(self, operands: list[ast.expr], text: str) -> list[ast.stmt]:
        """`x is None` / `x is True`: x recorded type-exactly. Identity of two computed objects cannot be
        recorded as a value, so such a check is unconvertible."""
        if len(operands) != 2:
            raise ProbeSourceError(f"chained identity check: {text}")
        for value, other in ((operands[0], operands[1]), (operands[1], operands[0])):
            ok, literal = _literal_value(other)
            if ok and any(literal is s for s in _SINGLETONS):
                return [] if _is_literal(value) else [self._probe(value, "same")]
        raise ProbeSourceError(f"identity of two computed objects cannot be recorded: {text}")

    def visit_Expr(self, node: ast.Expr) -> Any:  # noqa: N802
        call = node.value
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "_same":
            if len(call.args) != 2:
                self._issue(f"_same takes (actual, expected): {ast.unparse(call)}")
                return node
            return ast.copy_location(self._probe(call.args[0], "same"), node)
        method = _check_method(call)
        if method is None:
            return self.generic_visit(node)
        try:
            stmts = self._method_records(method, call)
        except ProbeSourceError as err:
            self._issue(str(err))
            return node
        return [ast.copy_location(s, node) for s in stmts] or [ast.copy_location(ast.Pass(), node)]

    def _method_records(self, method: str, call: ast.Call) -> list[ast.stmt]:
        text = ast.unparse(call)
        if any(k.arg is None for k in call.keywords) or any(isinstance(a, ast.Starred) for a in call.args):
            raise ProbeSourceError(f"check with *args / **kwargs: {text}")
        keywords = {k.arg: k.value for k in call.keywords}
        if method in _EQUALITY_METHODS:
            sides = call.args[:2] + [keywords[k] for k in ("first", "second", "member", "container", "text",
                                                           "expected_regex", "a", "b") if k in keywords]
            return self._records(sides)
        if method in _ONE_VALUE_METHODS:
            value = call.args[0] if call.args else keywords.get("expr", keywords.get("obj"))
            if value is None:
                raise ProbeSourceError(f"check without a value: {text}")
            return self._records([value])
        if method == "assertIsNone":
            value = call.args[0] if call.args else keywords.get("obj")
            return [] if value is None or _is_literal(value) else [self._probe(value, "same")]
        if method in ("assertIs", "assertIsNot"):
            return self._identity(call.args[:2], text)
        if method in ("assertAlmostEqual", "assertAlmostEquals", "assertNotAlmostEqual"):
            return self._almost(method, call, keywords, text)
        if method in _RAISES_METHODS:
            return self._raises_call(method, call, keywords, text)
        raise ProbeSourceError(f"unsupported check {method}: {text}")

    def _almost(self, method: str, call: ast.Call, keywords: dict[str, ast.expr], text: str) -> list[ast.stmt]:
        """assertAlmostEqual(actual, LITERAL, places=7 | delta=D): the literal and tolerance stay trusted."""
        if method == "assertNotAlmostEqual" or len(call.args) < 2:
            raise ProbeSourceError(f"unsupported tolerance check: {text}")
        ok_a, _ = _literal_value(call.args[0])
        ok_b, want = _literal_value(call.args[1])
        value = call.args[0]
        if ok_a and not ok_b:
            value, want, ok_b = call.args[1], _literal_value(call.args[0])[1], True
        if not ok_b or isinstance(want, bool) or not isinstance(want, (int, float)):
            raise ProbeSourceError(f"tolerance check against a computed value: {text}")
        tolerance = {"places": 7, "delta": None}
        for name, position in (("places", 2), ("delta", 4)):
            expr = keywords.get(name, call.args[position] if len(call.args) > position else None)
            if expr is not None:
                ok, number = _literal_value(expr)
                if not ok or isinstance(number, bool) or not isinstance(number, (int, float)):
                    raise ProbeSourceError(f"{name} is not a number literal: {text}")
                tolerance[name] = number
        site = self._site({"kind": "almost", "want": float(want), **tolerance})
        return [self._probe(value, "almost", site)]

    def _raises_spec(self, method: str, exc: ast.expr, pattern: ast.expr | None) -> dict[str, Any]:
        how = _RAISES_METHODS.get(method, "search")
        return {"kind": "raises", "names": _exception_names(exc), "how": how,
                "pattern": _pattern(pattern, "the message pattern")}

    def _raises_call(self, method: str, call: ast.Call, keywords: dict[str, ast.expr], text: str) -> list[ast.stmt]:
        """`self.assertRaises(E, f, *args)` as a call: `with _raises(site): f(*args)`."""
        takes_pattern = _RAISES_METHODS[method] is not None
        needed = 2 if takes_pattern else 1
        if len(call.args) <= needed:
            raise ProbeSourceError(f"raise check without a callable (use it as a context manager): {text}")
        pattern = call.args[1] if takes_pattern else None
        spec = self._raises_spec(method, call.args[0], pattern)
        rest = {k: v for k, v in keywords.items() if k != "msg"}
        body = ast.Expr(ast.Call(call.args[needed], call.args[needed + 1 :],
                                 [ast.keyword(k, v) for k, v in rest.items()]))
        item = ast.withitem(ast.Call(ast.Name("_raises", ast.Load()), [self._site(spec)], []))
        return [ast.With([item], [body])]

    def visit_With(self, node: ast.With) -> ast.stmt:  # noqa: N802
        checks = [self._raises_item(item) for item in node.items]
        if not any(c is not None for c in checks):
            return self.generic_visit(node)
        node.body = [out for stmt in node.body for out in _as_list(self.visit(stmt))]
        if len(node.items) != 1:
            self._issue("a raise check must be the only context manager of its with")
            return node
        spec = checks[0]
        if isinstance(spec, str):
            self._issue(spec)
            return node
        call = ast.Call(ast.Name("_raises", ast.Load()), [self._site(spec)], [])
        node.items = [ast.withitem(call, node.items[0].optional_vars)]
        return node

    def _raises_item(self, item: ast.withitem) -> dict[str, Any] | str | None:
        """The spec of a `with pytest.raises(...)` / `with self.assertRaises...(...)` item, an issue, or None."""
        call = item.context_expr
        if not isinstance(call, ast.Call):
            return None
        name = ast.unparse(call.func)
        method = _check_method(call)
        try:
            if name == "pytest.raises":
                keywords = {k.arg: k.value for k in call.keywords}
                if len(call.args) != 1 or set(keywords) - {"match"}:
                    return f"unsupported pytest.raises form: {ast.unparse(call)}"
                return self._raises_spec("pytest.raises", call.args[0], keywords.get("match"))
            if method in _RAISES_METHODS:
                keywords = {k.arg: k.value for k in call.keywords if k.arg != "msg"}
                takes_pattern = _RAISES_METHODS[method] is not None
                if len(call.args) != 1 + takes_pattern or keywords:
                    return f"unsupported {method} form: {ast.unparse(call)}"
                return self._raises_spec(method, call.args[0], call.args[1] if takes_pattern else None)
            if method is not None:
                return f"unsupported check {method} as a context manager: {ast.unparse(call)}"
        except ProbeSourceError as err:
            return str(err)
        return None

    # -- checks this rewriter cannot see into: the test is unconvertible

    def visit_Raise(self, node: ast.Raise) -> ast.stmt:  # noqa: N802
        if self.scope != "*" and not self.scope.endswith("::*"):  # a test that fails itself by raising
            self._issue(f"the test raises by itself: {ast.unparse(node)}")
        return node

    def visit_Call(self, node: ast.Call) -> ast.expr:  # noqa: N802
        name = ast.unparse(node.func)
        last = name.split(".")[-1]
        if _check_method(node) is not None or last in ("fail", "skipTest") or last.lower().startswith("assert") \
                or name in ("pytest.fail", "pytest.xfail", "pytest.raises", "pytest.warns", "pytest.deprecated_call"):
            self._issue(f"unsupported check {name} here: {ast.unparse(node)[:200]}")
        return self.generic_visit(node)

    # -- scopes

    def visit_FunctionDef(self, node: ast.FunctionDef) -> Any:  # noqa: N802
        if node.name == "_same" and self.scope == "*":  # the strict helper: its work moves to the host
            return ast.Pass()
        outer = self.scope
        if outer == "*" and node.name.startswith("test"):  # a test function; helpers stay module-wide
            self.scope = node.name
        elif outer.endswith("::*") and node.name.startswith("test"):
            self.scope = outer[:-1] + node.name
        try:
            return self.generic_visit(node)
        finally:
            self.scope = outer

    visit_AsyncFunctionDef = visit_FunctionDef  # noqa: N815

    def visit_ClassDef(self, node: ast.ClassDef) -> Any:  # noqa: N802
        outer = self.scope
        if outer == "*" and node.name.startswith("Test"):  # mixins and helper classes stay module-wide
            self.scope = node.name + "::*"
        try:
            return self.generic_visit(node)
        finally:
            self.scope = outer


def _as_list(result: Any) -> list[ast.stmt]:
    return result if isinstance(result, list) else [result]


def _check_method(call: Any) -> str | None:
    """'assertEqual' for `self.assertEqual(...)` (any unittest-style assert method on self/cls), else None."""
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and isinstance(call.func.value, ast.Name) and call.func.value.id in ("self", "cls")):
        return None
    attr = call.func.attr
    return attr if attr.startswith(("assert", "fail")) else None


def to_probe_form(source: str, site_prefix: str = "") -> ProbeForm:
    """The probe form of any test file (prepare time). A file that does not parse is one module-wide issue.

    site_prefix keeps the site names of several files of one row apart."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError) as err:
        return ProbeForm("", {}, {"*": f"the file does not parse: {err}"})
    shadows = _shadows_probe(tree)
    rewriter = _ToProbeForm(site_prefix)
    tree = ast.fix_missing_locations(rewriter.visit(tree))
    # The recorder's import goes after the docstring and `from __future__` imports, which must stay first.
    at = 1 if tree.body and _is_docstring(tree.body[0]) else 0
    while at < len(tree.body) and isinstance(tree.body[at], ast.ImportFrom) and tree.body[at].module == "__future__":
        at += 1
    header = ast.parse(PROBE_HEADER).body
    tree.body[at:at] = header
    text = ast.unparse(ast.fix_missing_locations(tree)) + "\n"
    if shadows:
        rewriter.issues["*"] = "the file itself binds _probe or _raises"
    return ProbeForm(text, rewriter.sites, rewriter.issues)


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _shadows_probe(tree: ast.Module) -> bool:
    """Whether the original file binds the recorder's names (its probe form would record through them)."""
    for node in ast.walk(tree):
        targets = [node.id] if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) else []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            targets.append(node.name)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            targets += [alias.asname or alias.name for alias in node.names]
        if {"_probe", "_raises"} & set(targets):
            return True
    return False


def expected_from_gold(gold_text: str, sites: dict[str, dict[str, Any]]
                       ) -> tuple[dict[str, list[dict[str, Any]]], dict[str, str]]:
    """probe_expected from the gold fix's records, and node id -> why a test's gold records cannot serve.

    A record without a site is expected as the gold fix wrote it. A raise or tolerance record is replaced
    by what its check demands (from `sites`, which come from the test source, not from any sandbox); the
    gold fix must satisfy that demand, or its test is not usable (the original test would fail on gold)."""
    by_test, junk = records_by_test(gold_text)
    expected: dict[str, list[dict[str, Any]]] = {}
    problems: dict[str, str] = {}
    for node, records in by_test.items():
        kept: list[dict[str, Any]] = []
        for record in records:
            site = record.get("site")
            entry: dict[str, Any] = {"mode": record["mode"], "v": record["v"]}
            if site is not None:
                spec = sites.get(str(site))
                entry = _demand(record, spec)
                if entry is None:
                    problems[node] = f"check at site {site} does not hold on the gold fix"
                    break
            elif record["mode"] in ("raises", "almost"):
                problems[node] = f"a {record['mode']} record without a site"
                break
            kept.append(entry)
        if len(records) >= _MAX_RECORDS_PER_TEST:
            problems.setdefault(node, f"more than {_MAX_RECORDS_PER_TEST} checks")
        expected[node] = kept
    if junk:
        problems["*"] = f"{junk} unreadable record lines on the gold fix"
    return expected, problems


def _demand(record: dict[str, Any], spec: dict[str, Any] | None) -> dict[str, Any] | None:
    """The expected record of one site check, or None when the gold fix does not satisfy it."""
    if spec is None or spec.get("kind") != record["mode"]:
        return None
    site = str(record["site"])
    if spec["kind"] == "raises":
        value = record["v"]
        if not (_well_formed(value) and value[0] == "raised" and isinstance(value[1], list)):
            return None
        demands = {"how": spec.get("how"), "pattern": spec.get("pattern"), "max_mro": len(value[1])}
        entry = {"mode": "raises", "site": site, "v": ["raises", list(spec["names"]), demands]}
    else:
        entry = {"mode": "almost", "site": site, "v": ["almost", spec["want"], spec["places"], spec["delta"]]}
    return entry if record_matches(record, entry) else None
