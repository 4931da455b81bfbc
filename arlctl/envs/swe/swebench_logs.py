"""SWE-bench's official log grading, reimplemented: pytest `-rA` logs -> per-test statuses -> resolution.

The SWE-bench harness captures the test command's output and grades it with a log parser and a few rules.
This module applies the same rules, written here so arlctl never imports `swebench` at run time (the
tests compare it with the real package, which is a test dependency only):

    statuses = parse_log(log, "pytest")                  # {"tests/t.py::test_a": "PASSED", ...}
    statuses, found = log_status_map(eval_log, "pytest")   # bare=True for a log without the markers
    report = tests_report(statuses, fail_to_pass, pass_to_pass)
    resolution_status(report)                            # RESOLVED_FULL | RESOLVED_PARTIAL | RESOLVED_NO

Parsers (SWE-bench picks one per repository): `pytest` reads each line that starts with a status word,
the status first and the test id second (pytest's `-rA` short summary); `pytest_options` is the same but
shortens a parameter that is an absolute path to its last component; `pytest_v2` also strips terminal
colour codes and control characters, keeps every word after the status as the id (parameters with
spaces), and reads `-v` progress lines that end with the status. A later line about the same test
replaces an earlier one. Statuses are SWE-bench's: PASSED, FAILED, SKIPPED, ERROR, XFAIL. XPASS is not
one of them, so a test that unexpectedly passed (non-strict) is simply absent; `SKIPPED [N] file:line`
summary lines name no test and are dropped, so under `-rA` a skipped test is absent too.

Resolution (EvalType PASS_AND_FAIL): a FAIL_TO_PASS test succeeds when PASSED or XFAIL and fails when
absent, FAILED, ERROR or SKIPPED; a PASS_TO_PASS test is also maintained when SKIPPED. RESOLVED_FULL when
every FAIL_TO_PASS and PASS_TO_PASS test succeeds (an empty list counts as all-passing), PARTIAL when some
but not all FAIL_TO_PASS do and every PASS_TO_PASS does, NO otherwise. An expected id that is cut inside
its parameter brackets (more `[` than `]`) matches the recorded ids it prefixes when they agree on
passing.

Why the arlctl reward does not come from here: a log is text the tested process writes, and in a SWE-bench
row the tested process runs the policy's code. That code can print `PASSED tests/x.py::test_y` at exit
(after pytest's own summary, so it is the line that counts), or call `pytest.xfail()` / `pytest.skip()`
so a test it cannot fix reads XFAIL or SKIPPED. The grader therefore scores from its HMAC-signed per-test
records and reports this module's verdict beside it (`cross_check`) for comparison with published
SWE-bench numbers; a disagreement is flagged, never believed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

PASSED, FAILED, SKIPPED, ERROR, XFAIL = "PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL"
STATUSES = (FAILED, PASSED, SKIPPED, ERROR, XFAIL)  # SWE-bench's TestStatus: no XPASS
RESOLVED_FULL, RESOLVED_PARTIAL, RESOLVED_NO = "RESOLVED_FULL", "RESOLVED_PARTIAL", "RESOLVED_NO"
# Markers of the SWE-bench eval script; a log without them is parsed whole (arlctl's own pytest log).
START_TEST_OUTPUT, END_TEST_OUTPUT = ">>>>> Start Test Output", ">>>>> End Test Output"
TEST_EXIT_CODE = ">>>>> Test Exit Code"
BAD_RUN_MARKERS = (">>>>> Patch Apply Failed", ">>>>> Reset Failed", ">>>>> Tests Errored",
                   ">>>>> Tests Timed Out")

_SKIP_SUMMARY_COUNT = re.compile(r"^\[\d+\]$")  # the "[3]" of "SKIPPED [3] path:line: reason"
_OPTION = re.compile(r"(.*?)\[(.*)\]")
_COLOUR = re.compile(r"\[(\d+)m")
_CONTROL = str.maketrans("", "", "".join(chr(c) for c in range(1, 32)))
_EXIT_CODE = re.compile(re.escape(TEST_EXIT_CODE) + r":\s*(-?\d+)")
# arlctl's signed outcomes (grader.outcomes_from) in SWE-bench's words; xpass has none (see above).
_FROM_OUTCOME = {"passed": PASSED, "failed": FAILED, "error": ERROR, "skipped": SKIPPED, "xfail": XFAIL}


def _status_line(line: str) -> tuple[str, list[str]] | None:
    """(status word, whitespace-split words) of a line that starts with a status, else None.

    The status is the first word as written: like SWE-bench, "PASSEDX a" counts, with status "PASSEDX".
    On a FAILED line " - " (before the assertion message) is dropped first."""
    if not line.startswith(STATUSES):
        return None
    if line.startswith(FAILED):
        line = line.replace(" - ", " ")
    words = line.split()
    if len(words) <= 1 or (words[0] == SKIPPED and _SKIP_SUMMARY_COUNT.match(words[1])):
        return None
    return words[0], words


def parse_pytest(log: str) -> dict[str, str]:
    """SWE-bench's `parse_log_pytest`: test id -> status from `STATUS id ...` lines."""
    statuses: dict[str, str] = {}
    for line in log.split("\n"):  # "\n" only: other line breaks stay inside a line, as in SWE-bench
        found = _status_line(line)
        if found is not None:
            statuses[found[1][1]] = found[0]
    return statuses


def parse_pytest_options(log: str) -> dict[str, str]:
    """`parse_log_pytest_options`: as parse_pytest, with an absolute-path parameter cut to its last part."""
    statuses: dict[str, str] = {}
    for line in log.split("\n"):
        found = _status_line(line)
        if found is None:
            continue
        name = found[1][1]
        option = _OPTION.search(name)
        if option:
            main, param = option.groups()
            if param.startswith("/") and not param.startswith("//") and "*" not in param:
                param = "/" + param.split("/")[-1]
            name = f"{main}[{param}]"
        statuses[name] = found[0]
    return statuses


def parse_pytest_v2(log: str) -> dict[str, str]:
    """`parse_log_pytest_v2`: colour codes and control characters removed; the id is every word after
    the status (a FAILED line is cut at its first " - "); `-v` lines ending with a status count too."""
    statuses: dict[str, str] = {}
    for raw in log.split("\n"):
        line = _COLOUR.sub("", raw).translate(_CONTROL)
        if line.startswith(STATUSES):
            if line.startswith(FAILED):
                line = line.split(" - ", 1)[0]
            words = line.split()
            if len(words) >= 2 and not (words[0] == SKIPPED and _SKIP_SUMMARY_COUNT.match(words[1])):
                statuses[" ".join(words[1:])] = words[0]
        elif line.endswith(STATUSES):
            words = line.split()
            if len(words) >= 2:
                statuses[" ".join(words[:-1])] = words[-1]
    return statuses


PARSERS: dict[str, Callable[[str], dict[str, str]]] = {
    "pytest": parse_pytest, "pytest_options": parse_pytest_options, "pytest_v2": parse_pytest_v2,
}


# The pytest-based SWE-bench repositories whose harness uses a parser other than `pytest`.
REPO_PARSERS = {"astropy/astropy": "pytest_v2", "scikit-learn/scikit-learn": "pytest_v2",
                "sphinx-doc/sphinx": "pytest_v2", "psf/requests": "pytest_options",
                "pydicom/pydicom": "pytest_options", "pylint-dev/pylint": "pytest_options"}


def parser_for(task: dict[str, Any]) -> str:
    """The parser a row is graded with: its own `log_parser`, else the one SWE-bench uses for its repo."""
    return str(task.get("log_parser") or REPO_PARSERS.get(str(task.get("repo") or ""), "pytest"))


def parse_log(log: str, parser: str = "pytest") -> dict[str, str]:
    """Per-test statuses of a log with the named parser (a key of PARSERS)."""
    if parser not in PARSERS:
        raise ValueError(f"unknown SWE-bench log parser {parser!r}; known: {', '.join(PARSERS)}")
    return PARSERS[parser](log)


def log_status_map(content: str, parser: str = "pytest", exit_code: int | None = None, *,
                   bare: bool = False) -> tuple[dict[str, str], bool]:
    """SWE-bench's `get_logs_eval` for pytest logs: (statuses, found). found=False means "no valid run".

    A log with a bad-run marker, or without both start and end markers, is not a run; bare=True reads a
    bare pytest log (arlctl's own, which has no markers) as if it stood between them. Between the markers
    the parser runs; an empty result falls back to the whole content. No test status at all is no run (for pytest, SWE-bench's
    "the suite ran" evidence never applies). A non-zero exit code (given, or from the eval script's
    `>>>>> Test Exit Code: N` line) with statuses that hold no FAILED or ERROR means the log does not
    describe the run that happened (code printed fake lines), so it is not a run either.
    """
    if any(marker in content for marker in BAD_RUN_MARKERS):
        return {}, False
    if bare:
        region = content
    elif START_TEST_OUTPUT in content and END_TEST_OUTPUT in content:
        region = content.split(START_TEST_OUTPUT)[1].split(END_TEST_OUTPUT)[0]
    else:
        return {}, False
    statuses = parse_log(region, parser) or parse_log(content, parser)
    if not statuses:
        return {}, False
    if exit_code is None:
        recorded = _EXIT_CODE.search(content)
        exit_code = int(recorded.group(1)) if recorded else None
    if exit_code not in (None, 0) and not any(s in (FAILED, ERROR) for s in statuses.values()):
        return {}, False
    return statuses, True


def _key(case: str, statuses: dict[str, str]) -> str | None:
    """The recorded id for an expected one: itself, or, for an id cut inside its parameter brackets,
    the first recorded id it prefixes when all such ids agree on passing."""
    if case in statuses:
        return case
    if case.count("[") > case.count("]"):
        matches = [name for name in statuses if name.startswith(case)]
        if matches and len({statuses[name] in (PASSED, XFAIL) for name in matches}) == 1:
            return matches[0]
    return None


def _passed(case: str, statuses: dict[str, str]) -> bool:
    key = _key(case, statuses)
    return key is not None and statuses[key] in (PASSED, XFAIL)


def _maintained(case: str, statuses: dict[str, str]) -> bool:
    key = _key(case, statuses)
    return _passed(case, statuses) or (key is not None and statuses[key] == SKIPPED)


def _failed(case: str, statuses: dict[str, str]) -> bool:
    key = _key(case, statuses)
    return key is None or statuses[key] in (FAILED, ERROR, SKIPPED)


def tests_report(statuses: dict[str, str], fail_to_pass: Iterable[str],
                 pass_to_pass: Iterable[str]) -> dict[str, dict[str, list[str]]]:
    """SWE-bench's `get_eval_tests_report` (PASS_AND_FAIL): success and failure lists per kind.

    A test whose status is none of the known ones lands in neither list (as in SWE-bench)."""
    report: dict[str, dict[str, list[str]]] = {}
    for kind, cases, succeeded in (("FAIL_TO_PASS", fail_to_pass, _passed), ("PASS_TO_PASS", pass_to_pass, _maintained)):
        success: list[str] = []
        failure: list[str] = []
        for case in cases:
            if succeeded(case, statuses):
                success.append(case)
            elif _failed(case, statuses):
                failure.append(case)
        report[kind] = {"success": success, "failure": failure}
    return report


def _fraction(part: dict[str, list[str]]) -> float:
    total = len(part["success"]) + len(part["failure"])
    return 1.0 if total == 0 else len(part["success"]) / total  # SWE-bench: nothing counted is all-passing


def resolution_status(report: dict[str, dict[str, list[str]]]) -> str:
    """RESOLVED_FULL / RESOLVED_PARTIAL / RESOLVED_NO from a tests_report."""
    f2p, p2p = _fraction(report["FAIL_TO_PASS"]), _fraction(report["PASS_TO_PASS"])
    if f2p == 1 and p2p == 1:
        return RESOLVED_FULL
    if 0 < f2p < 1 and p2p == 1:
        return RESOLVED_PARTIAL
    return RESOLVED_NO


def _status_of(case: str, statuses: dict[str, str]) -> str:
    key = _key(case, statuses)
    return statuses[key] if key is not None else "missing"


def statuses_from_outcomes(outcomes: dict[str, str]) -> dict[str, str]:
    """arlctl's signed outcomes (passed, failed, error, skipped, xfail, xpass) as SWE-bench statuses;
    an xpass, which SWE-bench has no word for, is left out like its log line is."""
    return {nodeid: _FROM_OUTCOME[outcome] for nodeid, outcome in outcomes.items() if outcome in _FROM_OUTCOME}


def cross_check(outcomes: dict[str, str], log: str, fail_to_pass: list[str], pass_to_pass: list[str], *,
                parser: str = "pytest", exit_code: int | None = None) -> dict[str, Any]:
    """The SWE-bench verdict from the signed outcomes and from the captured log, side by side.

    `signed_resolution` applies the official rules to the authenticated outcomes; `log_resolution` is what
    SWE-bench's harness would conclude from the log. `disagree` lists the expected tests whose log status
    differs from the signed one (structural for a skipped or xpassed test, whose -rA line names no test);
    `log_claims_pass` those the log calls PASSED/XFAIL while the signed records do not: a forged line, or
    a parser limit (an id with spaces under `pytest`). Information only: the reward never reads it.
    """
    signed = statuses_from_outcomes(outcomes)
    logged, found = log_status_map(log, parser, exit_code, bare=True)
    expected = list(dict.fromkeys([*fail_to_pass, *pass_to_pass]))
    signed_resolution = resolution_status(tests_report(signed, fail_to_pass, pass_to_pass))
    log_resolution = resolution_status(tests_report(logged, fail_to_pass, pass_to_pass)) if found else RESOLVED_NO
    log_statuses = {case: _status_of(case, logged) for case in expected}
    disagree = [case for case in expected if log_statuses[case] != _status_of(case, signed)]
    return {
        "parser": parser, "log_found": found, "signed_resolution": signed_resolution,
        "log_resolution": log_resolution, "agree": signed_resolution == log_resolution,
        "log_statuses": log_statuses, "disagree": disagree,
        "log_claims_pass": [case for case in disagree if _passed(case, logged) and not _passed(case, signed)],
    }
