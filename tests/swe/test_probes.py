"""Probe grading's two halves without a sandbox: the recorder's encoding and the host's comparison."""

from __future__ import annotations

import importlib.util
import json
from decimal import Decimal
from fractions import Fraction

import pytest

from arlctl.envs.swe.grader import HARNESS_DIR
from arlctl.envs.swe.probes import ProbeSourceError, eq, record_matches, same, to_probe_source, verdicts


@pytest.fixture(scope="module")
def recorder():
    spec = importlib.util.spec_from_file_location("arlctl_probe_under_test", HARNESS_DIR / "probe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_encoding_is_type_exact_and_order_free(recorder):
    enc = recorder.encode
    assert enc(1) == ["int", "1"] and enc(True) == ["bool", True] and enc(1.0) == ["float", "1.0"]
    assert enc([1]) != enc((1,))
    assert enc({"b": 1, "a": 2}) == enc({"a": 2, "b": 1})  # dicts and sets in a fixed order
    assert enc({3, 1, 2}) == enc({2, 3, 1})
    assert enc(Decimal("2.67")) == ["Decimal", "2.67"] and enc(Fraction(1, 3)) == ["Fraction", "1/3"]

    class Weird:  # an object is its class name and its public attributes, never its repr or id
        def __init__(self):
            self.x, self._private = 1, object()

        def __repr__(self):
            return f"<{id(self)}>"

    assert enc(Weird()) == ["object", "test_encoding_is_type_exact_and_order_free.<locals>.Weird",
                            ["dict", [[["str", "x"], ["int", "1"]]]]]
    deep: list = []
    for _ in range(100):
        deep = [deep]
    assert "too_deep" in json.dumps(enc(deep))


def test_same_is_strict_like_the_helper_it_replaces(recorder):
    enc = recorder.encode
    assert same(enc(0.1 + 0.2), enc(0.3))  # |0.30000000000000004 - 0.3| <= 1e-9 * 1
    assert not same(enc(0.3001), enc(0.3))  # 1e-4 > 1e-9
    assert not same(enc(1), enc(1.0)) and not same(enc(True), enc(1))  # the exact type, as _same demands
    assert not same(enc([1, 2]), enc((1, 2))) and not same(enc([1]), enc([1, 2]))
    assert same(enc({"a": [1.0, "x"]}), enc({"a": [1.0 + 1e-12, "x"]}))
    assert not same(enc(float("nan")), enc(float("nan")))  # abs(nan - nan) <= tol is False in _same too


def test_eq_is_pythons_equality(recorder):
    enc = recorder.encode
    assert eq(enc(1), enc(1.0)) and eq(enc(True), enc(1)) and eq(enc(Decimal("0.5")), enc(0.5))
    assert not eq(enc(Decimal("0.1")), enc(0.1))  # Decimal('0.1') == 0.1 is False in Python
    assert not eq(enc([1]), enc((1,))) and eq(enc({1, 2}), enc(frozenset({1, 2})))
    assert not eq(enc(0.1 + 0.2), enc(0.3))  # == has no tolerance
    assert not eq(enc("1"), enc(1)) and not eq(enc(None), enc(0))
    assert not eq(["int", "1"], ["int"]) and not eq("garbage", ["int", "1"])  # hostile shapes are False


def test_raises_checks_the_class_named_in_the_test():
    want = {"mode": "raises", "v": ["raises", "ValueError"]}
    assert record_matches({"mode": "raises", "v": ["raised", ["InsufficientFunds", "ValueError", "Exception"]]}, want)
    assert not record_matches({"mode": "raises", "v": ["raised", ["KeyError", "LookupError"]]}, want)
    assert not record_matches({"mode": "raises", "v": ["none"]}, want)
    assert not record_matches({"mode": "eq", "v": ["raised", ["ValueError"]]}, want)  # the mode must match


def test_verdicts_need_exactly_the_expected_checks():
    expected = {"t::a": [{"mode": "eq", "v": ["int", "1"]}, {"mode": "same", "v": ["str", "x"]}],
                "t::b": [{"mode": "eq", "v": ["bool", True]}]}

    def line(node, mode, v):
        return json.dumps({"node": node, "mode": mode, "v": v})

    good = [line("t::a", "begin", ["none"]), line("t::a", "eq", ["float", "1.0"]), line("t::a", "same", ["str", "x"]),
            line("t::b", "eq", ["bool", True])]
    outcomes, details = verdicts("\n".join(good), expected, ["t::a", "t::b", "t::c"])
    assert outcomes == {"t::a": "passed", "t::b": "passed", "t::c": "missing"}
    extra = good + [line("t::b", "eq", ["bool", True])]  # one record too many: not what the test checks
    assert verdicts("\n".join(extra), expected, ["t::b"])[0] == {"t::b": "failed"}
    short = good[:2] + good[3:]  # the second check of t::a never recorded (the test died half-way)
    outcomes, details = verdicts("\n".join(short + ["{not json", "[1, 2]"]), expected, ["t::a"])
    assert outcomes == {"t::a": "failed"} and details["junk_lines"] == 2 and details["first_failed_check"] == {"t::a": 1}


def test_probe_form_keeps_calls_and_drops_expected_values():
    source = '''import pytest
from pkg import f


def test_one():
    assert f(1) == 7
    assert not f(0)
    _same(f(2), [1, 2])
    with pytest.raises(ValueError):
        f(-1)
'''
    probe, raises = to_probe_source(source)
    assert "_probe(f(1))" in probe and "_probe(f(0))" in probe and "_probe(f(2), 'same')" in probe
    assert "7" not in probe and "[1, 2]" not in probe and "ValueError" not in probe
    assert raises == {"test_one": ["ValueError"]}
    for unsupported in ("def test_x():\n    assert f(1) < 3\n", "def test_x():\n    assert f(1) is None\n",
                        "def test_x():\n    with pytest.raises(ValueError, match='x'):\n        f()\n"):
        with pytest.raises(ProbeSourceError):
            to_probe_source(unsupported)
