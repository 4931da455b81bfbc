"""SWE-bench's own grading, called, not rewritten: the `swebench` package's log parsers and report functions.

    parser = parser_for(task)                   # "parse_log_django" | ... | None (no parser known)
    report = official_report(task, log, exit_code=1)
    report["resolved"], report["tests_status"]  # the package's verdict and its F2P/P2P lists

Which parser: the row's own `log_parser` (a key of the package's PARSER_REGISTRY, such as
`parse_log_sympy`, or that key without its `parse_log_` prefix), else the one the package maps the row's
`repo` to (MAP_REPO_TO_PARSER_* for every language it knows), else none: such a row must say how its log
reads, and a report without a parser says so (`error`) instead of guessing.

How: the log is framed the way the package's eval script frames a run (start and end markers, then the test
command's exit code) and handed to `get_logs_eval`, then `get_eval_tests_report` and `get_resolution_status`,
so every rule of the official harness (bad-run markers, the fallback to the whole log, the exit-code check
against forged PASSED lines, FAIL_ONLY rows) is the package's own. `signed` statuses (arlctl's HMAC-signed
per-test records, in SWE-bench's words) go through the same report function.

A log is text the tested process writes, so where arlctl has signed records the reward comes from those and
this report sits beside it for comparison with published numbers (grader.py). The package is a runtime
dependency of the swe environment (`pip install 'arlctl[swe]'`); without it every report carries the cause.
"""

from __future__ import annotations

import functools
import importlib
import os
import pkgutil
import tempfile
from collections.abc import Iterable
from typing import Any

PREFIX = "parse_log_"
# The package's eval-script framing (swebench.harness.constants), restated only to frame our own pytest log.
START, END, EXIT_CODE = ">>>>> Start Test Output", ">>>>> End Test Output", ">>>>> Test Exit Code"
RESOLVED_FULL, RESOLVED_PARTIAL, RESOLVED_NO = "RESOLVED_FULL", "RESOLVED_PARTIAL", "RESOLVED_NO"
MISSING_PACKAGE = "the swebench package is not installed (pip install 'arlctl[swe]')"


@functools.cache
def _package() -> Any:
    """The package's modules, imported once (they pull in docker, datasets, ...)."""
    from swebench.harness import constants, grading, log_parsers
    from swebench.types import TestSpec

    return type("Swebench", (), {"constants": constants, "grading": grading, "parsers": log_parsers,
                                 "TestSpec": TestSpec})


def available() -> bool:
    try:
        _package()
    except ImportError:
        return False
    return True


@functools.cache
def registry() -> dict[str, Any]:
    """Every log parser the package has, by its registry key."""
    return dict(_package().parsers.PARSER_REGISTRY)


@functools.cache
def repo_parsers() -> dict[str, str]:
    """repo ("django/django") -> registry key, for every repository the package's parser maps name."""
    parsers = _package().parsers
    key_of: dict[int, str] = {}
    for key, fn in registry().items():
        key_of.setdefault(id(fn), key)  # an alias (parse_log_flask is parse_log_pytest) reads as its first key
    mapped: dict[str, str] = {}
    for module in pkgutil.iter_modules(parsers.__path__):  # one module per language: python, javascript, go, ...
        found = importlib.import_module(f"{parsers.__name__}.{module.name}")
        for name in sorted(vars(found)):
            if name.startswith("MAP_REPO_TO_PARSER"):
                for repo, fn in getattr(found, name).items():
                    if id(fn) in key_of:
                        mapped.setdefault(repo, key_of[id(fn)])
    return mapped


def parser_key(name: str) -> str | None:
    """A registry key for a row's `log_parser` ("parse_log_sympy" or "sympy"), or None if the package has none."""
    keys = registry()
    for candidate in (name, PREFIX + name):
        if candidate in keys:
            return candidate
    return None


def parser_for(task: dict[str, Any]) -> str | None:
    """The parser a row's log is read with: its own `log_parser`, else its repo's, else None."""
    if task.get("log_parser"):
        return parser_key(str(task["log_parser"]))
    return repo_parsers().get(str(task.get("repo") or ""))


def pytest_parser_for(task: dict[str, Any]) -> str:
    """The parser for a log arlctl's driver wrote (pytest -rA): the row's or its repo's when that is one of the
    package's pytest parsers (a repo picks between their variants), else `parse_log_pytest`. A repo whose
    own runner is not pytest (django, sympy, ...) has a parser for that runner's log, not for this one."""
    pytest_family = {id(fn) for key, fn in registry().items() if key.startswith(PREFIX + "pytest")}
    key = parser_for(task)
    return key if key is not None and id(registry()[key]) in pytest_family else PREFIX + "pytest"


def frame(log: str, exit_code: int | None) -> str:
    """A test command's output as the package's eval script logs it."""
    tail = f"{EXIT_CODE}: {exit_code}\n" if exit_code is not None else ""
    return f"{START}\n{log}\n{END}\n{tail}"


def eval_type_of(task: dict[str, Any]) -> str:
    """The row's `eval_type`; without one, `fail_only` for a repo the package lists in FAIL_ONLY_REPOS (its
    parsers record failures only, so an absent test is a pass), else `pass_and_fail`."""
    if task.get("eval_type"):
        return str(task["eval_type"])
    fail_only = getattr(_package().constants, "FAIL_ONLY_REPOS", set())
    return "fail_only" if str(task.get("repo") or "") in fail_only else "pass_and_fail"


def _spec(task: dict[str, Any], parser: str, fail_to_pass: list[str], pass_to_pass: list[str]) -> Any:
    return _package().TestSpec(
        instance_id=str(task.get("instance_id") or task.get("task_id") or "row"), image=str(task.get("image") or ""),
        eval_script_list=[], repo=str(task.get("repo") or ""), version=str(task.get("version") or ""),
        FAIL_TO_PASS=fail_to_pass, PASS_TO_PASS=pass_to_pass, log_parser=parser,
        eval_type=eval_type_of(task))


def tests_report(statuses: dict[str, str], fail_to_pass: Iterable[str], pass_to_pass: Iterable[str],
                 eval_type: str = "pass_and_fail") -> dict[str, Any]:
    """The package's F2P/P2P success and failure lists for a status map, and its resolution."""
    sb = _package()
    f2p, p2p = list(fail_to_pass), list(pass_to_pass)
    report = sb.grading.get_eval_tests_report(
        statuses, {"FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p}, eval_type=sb.constants.EvalType(eval_type))
    return {"tests_status": report, "resolution": sb.grading.get_resolution_status(report)}


def official_report(task: dict[str, Any], log: str, fail_to_pass: list[str], pass_to_pass: list[str], *,
                    exit_code: int | None = None, framed: bool = False, parser: str | None = None) -> dict[str, Any]:
    """What the official harness concludes from one test run's log.

    Keys: parser, log_found (False: the package calls it no valid run), statuses (its status map),
    tests_status (FAIL_TO_PASS / PASS_TO_PASS success and failure lists), resolution, resolved; or error
    (no parser for the row, or no package) with resolved False. `framed`: the log already carries the eval
    script's markers (a SWE-bench eval log); otherwise it is one command's output and is framed here."""
    out: dict[str, Any] = {"parser": parser, "log_found": False, "resolved": False}
    if not available():
        return out | {"error": MISSING_PACKAGE}
    key = parser_key(parser) if parser else parser_for(task)
    if key is None:
        named = parser or task.get("log_parser")
        cause = (f"the swebench package has no log parser {named!r}" if named else
                 f"the swebench package knows no log parser for repo {task.get('repo')!r}; the row must name "
                 "one (log_parser)")
        return out | {"error": cause}
    out["parser"] = key
    sb = _package()
    spec = _spec(task, key, fail_to_pass, pass_to_pass)
    content = log if framed else frame(log, exit_code)
    fd, path = tempfile.mkstemp(prefix="arlctl-swebench-", suffix=".log")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as handle:
            handle.write(content)
        try:
            statuses, found = sb.grading.get_logs_eval(spec, path)
        except Exception as err:  # a parser that picks its format from the row's version or id, and lacks it
            return out | {"error": f"the package's parser {key} could not read this row's log: "
                                   f"{type(err).__name__}: {err}"}
    finally:
        os.unlink(path)
    out.update(log_found=bool(found), statuses=statuses)
    if not found:
        return out | {"resolution": RESOLVED_NO, "tests_status": None}
    verdict = tests_report(statuses, fail_to_pass, pass_to_pass, spec.eval_type)
    return out | verdict | {"resolved": verdict["resolution"] == RESOLVED_FULL}


# arlctl's signed outcomes (grader.outcomes_from) in SWE-bench's words. An xpass has none: the package's
# TestStatus has no XPASS, and pytest's -rA line for one is read as no status at all.
_FROM_OUTCOME = {"passed": "PASSED", "failed": "FAILED", "error": "ERROR", "skipped": "SKIPPED", "xfail": "XFAIL"}


def statuses_from_outcomes(outcomes: dict[str, str]) -> dict[str, str]:
    return {nodeid: _FROM_OUTCOME[outcome] for nodeid, outcome in outcomes.items() if outcome in _FROM_OUTCOME}


def _status_of(case: str, statuses: dict[str, str]) -> str:
    return statuses.get(case, "missing")


def cross_check(task: dict[str, Any], outcomes: dict[str, str], log: str, fail_to_pass: list[str],
                pass_to_pass: list[str], *, exit_code: int | None = None) -> dict[str, Any]:
    """The official verdict from the signed outcomes and from the captured pytest log, side by side.

    `report` is the package's report from the log (official_report); `signed_resolution` the package's
    rules applied to the authenticated outcomes; `disagree` the expected tests whose log status differs
    from the signed one (structural for a skipped or xpassed test, whose -rA line names no test);
    `log_claims_pass` those the log calls PASSED/XFAIL while the signed records do not: a forged line, or
    a parser limit. Information only: the reward never reads it."""
    try:
        parser = pytest_parser_for(task)
    except ImportError:
        parser = None
    report = official_report(task, log, fail_to_pass, pass_to_pass, exit_code=exit_code, parser=parser)
    out: dict[str, Any] = {"parser": report["parser"], "log_found": report["log_found"], "report": report}
    if "error" in report:
        return out | {"error": report["error"], "agree": False}
    signed = statuses_from_outcomes(outcomes)
    signed_resolution = tests_report(signed, fail_to_pass, pass_to_pass)["resolution"]
    logged = report.get("statuses") or {}
    expected = list(dict.fromkeys([*fail_to_pass, *pass_to_pass]))
    log_statuses = {case: _status_of(case, logged) for case in expected}
    disagree = [case for case in expected if log_statuses[case] != _status_of(case, signed)]
    passing = ("PASSED", "XFAIL")
    return out | {
        "signed_resolution": signed_resolution, "log_resolution": report["resolution"],
        "agree": signed_resolution == report["resolution"], "log_statuses": log_statuses, "disagree": disagree,
        "log_claims_pass": [c for c in disagree if logged.get(c) in passing and signed.get(c) not in passing],
    }


# ---- runner-graded rows: the test run the package's eval script makes ----------------------------------

# SWE-bench images keep the test environment in a conda env; this is how their eval scripts enter it.
CONDA_ACTIVATION = "source /opt/miniconda3/bin/activate\nconda activate testbed"
DEFAULT_ACTIVATION = f"if [ -f /opt/miniconda3/bin/activate ]; then\n{CONDA_ACTIVATION}\nfi"


def activation(task: dict[str, Any], image_task: bool) -> str:
    """Shell lines that enter the row's test environment: the row's own `activate` (a declared activation,
    possibly empty), else for an image task the SWE-bench images' testbed conda env where the image has one,
    else nothing (a snapshot task runs with the sandbox's own interpreter)."""
    if task.get("activate") is not None:
        return str(task["activate"])
    return DEFAULT_ACTIVATION if image_task else ""


ACTIVATION_FAILED = 97  # the exit code of a script whose declared activation failed


def guarded(lines: str) -> list[str]:
    """Activation lines that stop the script when they fail (bash goes on past a failed `source` otherwise,
    and the tests would run in the wrong environment): exit ACTIVATION_FAILED, before the START marker."""
    if not lines.strip():
        return []
    return ["if ! {", *lines.splitlines(), "}; then", "  echo 'arlctl: the test environment could not be "
            "activated' >&2", f"  exit {ACTIVATION_FAILED}", "fi"]


def eval_script(task: dict[str, Any], workdir: str, image_task: bool) -> tuple[str, bool]:
    """(the bash script that runs the row's tests, whether the driver must apply test_patch first).

    A SWE-bench 5 row carries its own `eval_script` (activation, test_patch applied from a heredoc, the
    test command between the START/END markers): the package's `make_test_spec` takes it, adding the line
    that records the test command's exit code, and it runs as it is, except that `base_commit` reads as
    HEAD, since the grading snapshot is one commit holding base_commit's tree. A row with `test_cmd` gets
    a script of the same shape built here: its activation, the command between the markers, and the
    package's exit-code line; the driver applies its test_patch first, as in pytest mode."""
    sb_utils = importlib.import_module("swebench.harness.utils")
    if task.get("eval_script"):
        instance = {"instance_id": str(task.get("instance_id") or task.get("task_id") or "row"),
                    "image": str(task.get("image") or ""), "repo": str(task.get("repo") or ""),
                    "version": str(task.get("version") or ""), "FAIL_TO_PASS": task.get("FAIL_TO_PASS") or [],
                    "PASS_TO_PASS": task.get("PASS_TO_PASS") or [], "log_parser": str(task.get("log_parser") or ""),
                    "eval_type": eval_type_of(task), "eval_script": task["eval_script"]}
        script = sb_utils.make_test_spec(instance).eval_script
        base = str(task.get("base_commit") or "")
        if len(base) >= 7:
            script = script.replace(base, "HEAD")
        return script, False
    lines = [*guarded(activation(task, image_task)), f"cd {workdir}", f": '{START}'", str(task["test_cmd"]),
             f": '{END}'"]
    body = sb_utils.record_test_exit_code(lines)
    return "\n".join(["#!/bin/bash", "set -uxo pipefail", *body]) + "\n", True
