"""The swe grader on real bwrap sandboxes: gold -> 1, empty -> 0, partial credit, record verification."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest
from swe_helpers import make_diff, run

from arlctl.envs.registry import get_reward
from arlctl.envs.swe.grader import REWARD_VERSION, grade, outcomes_from, self_check, verify_records
from arlctl.envs.swe.tasks import load_suite_task, suite_ids

# A spread of bug kinds: wrong condition, mutable default argument, state carried across modules.
FEW = ["stockroom-001", "bookshelf-007", "unitreg-039"]


@pytest.mark.slow
def test_self_check_few(bwrap):
    rows = run(self_check([load_suite_task(i) for i in FEW], bwrap))
    assert [(r["task_id"], r["gold"], r["empty"]) for r in rows] == [(i, 1.0, 0.0) for i in FEW]


@pytest.mark.sweep
def test_self_check_every_task(bwrap):
    rows = run(self_check(None, bwrap))
    assert len(rows) == len(suite_ids()) >= 40
    bad = [r for r in rows if not r["ok"]]
    assert bad == []


def test_gold_info_and_registered_reward(bwrap):
    task = load_suite_task("stockroom-001")
    reward = get_reward("swe")
    assert reward.version == REWARD_VERSION == "swe-3"
    value, components, info = run(reward.score(task["patch"], task, ""))
    assert value == 1.0
    assert components == {"f2p": 1.0, "p2p": 1.0, "tests_passed": 1.0}
    assert sorted(info["passed"]) == sorted(task["FAIL_TO_PASS"] + task["PASS_TO_PASS"])
    assert info["failed"] == [] and info["tamper"] == [] and info["harness_tamper"] == []
    json.dumps(info)  # reward_info must be JSON-able


def test_partial_credit(bwrap):
    """A fix for the threshold case only: 1 of 2 FAIL_TO_PASS passes; reward stays 0."""
    task = load_suite_task("stockroom-001")
    assert len(task["FAIL_TO_PASS"]) == 2
    # Handles quantity == reorder_at == 5 (the example) but nothing else.
    diff = make_diff(task, {"stockroom/reorder.py": lambda s: s.replace(
        "return item.quantity < item.reorder_at",
        "return item.quantity < item.reorder_at or item.quantity == item.reorder_at == 5")})
    value, components, info = run(grade(task, diff, bwrap))
    assert value == 0.0
    assert components["f2p"] == 0.5  # 1 of 2
    assert components["p2p"] == 1.0
    assert info["failed"] == ["tests/test_issue_reorder.py::test_reorder_after_remove_to_threshold"]


def test_diff_that_does_not_apply(bwrap):
    task = load_suite_task("stockroom-001")
    broken = task["patch"].replace("item.quantity < item.reorder_at", "item.quantity << item.reorder_at")
    value, components, info = run(grade(task, broken, bwrap))
    assert value == 0.0 and info["apply_ok"] is False and components["f2p"] == 0.0


@pytest.mark.slow
def test_hanging_code_times_out(bwrap):
    task = load_suite_task("stockroom-001")
    diff = make_diff(task, {"stockroom/reorder.py": lambda s: s.replace(
        '    """SKUs to reorder, sorted."""', '    """SKUs to reorder, sorted."""\n    while True:\n        pass')})
    value, _, info = run(grade(task, diff, bwrap, timeout=5))
    assert value == 0.0 and info["timed_out"] is True


# ---- record verification (pure) -----------------------------------------------------------------------

KEY = b"k" * 32


def _record(seq, kind, key=KEY, **fields):
    record = {"seq": seq, "kind": kind, **fields}
    payload = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
    return json.dumps({**record, "mac": hmac.new(key, payload, hashlib.sha256).hexdigest()})


def _run_records(outcome="passed", key=KEY):
    return [
        _record(0, "start", key, pid=1),
        _record(1, "report", key, nodeid="t::a", when="setup", outcome="passed", tampered=False),
        _record(2, "report", key, nodeid="t::a", when="call", outcome=outcome, tampered=False),
        _record(3, "report", key, nodeid="t::a", when="teardown", outcome="passed", tampered=False),
        _record(4, "session", key, exitstatus=0, hashed=[], tampered=False),
    ]


def test_verify_records_accepts_a_genuine_run():
    records, error = verify_records("\n".join(_run_records()), KEY)
    assert error is None and outcomes_from(records) == {"t::a": "passed"}


def test_verify_records_rejects_forgeries():
    lines = _run_records()
    assert verify_records("\n".join(_run_records(key=b"x" * 32)), KEY)[1] == "result record with a bad signature"
    assert verify_records("\n".join(lines[:2] + lines[3:]), KEY)[1] == "result records out of sequence"
    assert verify_records("\n".join(lines[:-1]), KEY)[1] == "no session record (pytest did not finish)"
    unsigned = json.dumps({"seq": 5, "kind": "report", "nodeid": "t::b", "when": "call", "outcome": "passed"})
    assert verify_records("\n".join(lines[:-1] + [unsigned]), KEY)[1] == "unauthenticated result line"
    assert verify_records("", KEY)[1] == "no start record"


def test_outcomes_need_every_phase_to_pass():
    records, _ = verify_records("\n".join(_run_records(outcome="skipped")), KEY)
    assert outcomes_from(records) == {"t::a": "skipped"}
    teardown_failed = [
        {"kind": "report", "nodeid": "t::a", "when": "setup", "outcome": "passed"},
        {"kind": "report", "nodeid": "t::a", "when": "call", "outcome": "passed"},
        {"kind": "report", "nodeid": "t::a", "when": "teardown", "outcome": "failed"},
    ]
    assert outcomes_from(teardown_failed) == {"t::a": "error"}
    setup_only = [{"kind": "report", "nodeid": "t::a", "when": "setup", "outcome": "passed"}]
    assert outcomes_from(setup_only) == {"t::a": "error"}
