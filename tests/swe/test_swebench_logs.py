"""arlctl's SWE-bench log grading (arlctl/envs/swe/swebench_logs.py) against the real `swebench` package.

Real pytest runs fixture test modules holding every outcome pytest has (passed, failed, skipped by marker
and inline, xfailed, xpassed, strict xpass, a fixture error at setup, an error at teardown, a collection
error, parametrized ids with spaces, " - " and absolute paths, and a passing test that prints a fake
status line) inside the real bwrap sandbox (the host's python3, as the grader runs it) and, for the newer
pytest output, with this venv's pytest. Each captured log goes through arlctl's parsers and swebench's
(`parse_log_pytest`, `parse_log_pytest_options`, `parse_log_pytest_v2`); the status maps must be equal,
and so must the resolutions from `get_eval_tests_report` / `get_resolution_status` / `get_logs_eval`.
Hypothesis then throws generated lines and status maps at both.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from swe_helpers import run

from arlctl.envs.swe import swebench_logs as logs

swebench_parsers = pytest.importorskip("swebench.harness.log_parsers.python")
swebench_grading = pytest.importorskip("swebench.harness.grading")

OFFICIAL = {"pytest": swebench_parsers.parse_log_pytest, "pytest_options": swebench_parsers.parse_log_pytest_options,
            "pytest_v2": swebench_parsers.parse_log_pytest_v2}

MIXED = '''import pytest


@pytest.fixture
def broken():
    raise RuntimeError("fixture boom")


@pytest.fixture
def bad_teardown():
    yield 1
    raise RuntimeError("teardown boom")


def test_pass():
    print("PASSED tests/test_mixed.py::test_fail")  # captured output: a fake status line
    assert True


def test_fail():
    assert 1 == 2, "one is not - two"


@pytest.mark.skip(reason="not now")
def test_skip():
    pass


def test_skip_inline():
    pytest.skip("inline")


@pytest.mark.xfail(reason="known")
def test_xfail():
    assert False


@pytest.mark.xfail(reason="known")
def test_xpass():
    pass


@pytest.mark.xfail(strict=True)
def test_xpass_strict():
    pass


def test_fixture_error(broken):
    pass


def test_teardown_error(bad_teardown):
    pass


@pytest.mark.parametrize("value", ["a b", "c - d", "/tmp/deep/leaf", "plain"])
def test_param(value):
    assert value != "c - d"
'''
BROKEN = "import no_such_module_anywhere\n\n\ndef test_never():\n    pass\n"
M = "tests/test_mixed.py"
# pytest invocations: SWE-bench's own (-rA), with -v, with -v in classic style (lines end with the status:
# what pytest_v2's second rule reads), with colour codes (pytest_v2 strips them), and a collection error
# that interrupts the session.
RUNS = {
    "rA": ["-rA", "--continue-on-collection-errors"],
    "rA-v": ["-rA", "-v", "--continue-on-collection-errors"],
    "rA-v-classic": ["-rA", "-v", "-o", "console_output_style=classic", "--continue-on-collection-errors"],
    "rA-colour": ["-rA", "--color=yes", "--continue-on-collection-errors"],
    "rA-interrupted": ["-rA"],
}


@pytest.fixture(scope="module")
def fixture_repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("logs-repo")
    (root / "tests").mkdir()
    (root / "tests" / "test_mixed.py").write_text(MIXED)
    (root / "tests" / "test_broken.py").write_text(BROKEN)
    return root


def _pytest_args(name: str) -> list[str]:
    return ["-m", "pytest", "tests", "-p", "no:cacheprovider", "--tb=short", *RUNS[name]]


@pytest.fixture(scope="module")
def sandbox_logs(fixture_repo) -> dict[str, str]:
    """The logs of the host python3's pytest, run inside a real bwrap sandbox (as the grader runs it)."""
    from arlctl.sandbox import make_sandbox
    from arlctl.sandbox.bwrap import bwrap_available

    if not bwrap_available():
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)")

    async def collect() -> dict[str, str]:
        sandbox = await make_sandbox("bwrap", str(fixture_repo))
        try:
            out = {}
            for name in RUNS:
                result = await sandbox.exec(["python3", *_pytest_args(name)], timeout=120)
                assert result.exit_code in (1, 2), result.stdout + result.stderr  # failures / interrupted
                out[name] = result.stdout + result.stderr
            return out
        finally:
            await sandbox.close()

    return run(collect())


@pytest.fixture(scope="module")
def venv_logs(fixture_repo) -> dict[str, str]:
    """The same runs with this venv's (newer) pytest, as a plain subprocess on the fixture files."""
    out = {}
    for name in RUNS:
        result = subprocess.run([sys.executable, *_pytest_args(name)], cwd=fixture_repo, capture_output=True,
                                text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1",
                                                                "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
        assert result.returncode in (1, 2), result.stdout + result.stderr
        out[name] = result.stdout + result.stderr
    return out


def _assert_same_maps(captured: dict[str, str]) -> None:
    for run_name, log in captured.items():
        for parser, official in OFFICIAL.items():
            ours = logs.parse_log(log, parser)
            assert ours == official(log, None), (run_name, parser)
            assert list(ours) == list(official(log, None)), (run_name, parser)  # same order too


@pytest.mark.slow
def test_parsers_match_swebench_on_sandbox_logs(sandbox_logs):
    _assert_same_maps(sandbox_logs)


@pytest.mark.slow
def test_parsers_match_swebench_on_newer_pytest_logs(venv_logs):
    _assert_same_maps(venv_logs)


@pytest.mark.slow
def test_statuses_of_each_outcome(sandbox_logs):
    """What the -rA summary says about each kind of test, read by the plain parser (hand-checked against
    the log: a later line about a test replaces an earlier one)."""
    statuses = logs.parse_log(sandbox_logs["rA"], "pytest")
    assert statuses[f"{M}::test_pass"] == "PASSED"
    assert statuses[f"{M}::test_fail"] == "FAILED"  # the printed fake PASSED line comes before the summary
    assert statuses[f"{M}::test_xfail"] == "XFAIL"
    assert statuses[f"{M}::test_xpass_strict"] == "FAILED"
    assert statuses[f"{M}::test_fixture_error"] == "ERROR"
    assert statuses[f"{M}::test_teardown_error"] == "ERROR"  # "PASSED" (its call) then "ERROR" (teardown)
    assert statuses["tests/test_broken.py"] == "ERROR"  # the collection error names the file
    assert statuses[f"{M}::test_param[plain]"] == "PASSED"
    assert statuses[f"{M}::test_param[a"] == "PASSED"  # an id with a space is cut at the space
    # No status for: an xpass (not a SWE-bench status), skips ("SKIPPED [1] file:line: reason" names no test).
    for absent in ("test_xpass", "test_skip", "test_skip_inline"):
        assert f"{M}::{absent}" not in statuses
    options = logs.parse_log(sandbox_logs["rA"], "pytest_options")
    assert options[f"{M}::test_param[/leaf]"] == "PASSED"  # an absolute-path parameter keeps its last part
    interrupted = logs.parse_log(sandbox_logs["rA-interrupted"], "pytest")
    assert interrupted == {"tests/test_broken.py": "ERROR"}  # the session stopped at collection


F2P_P2P_SETS = [
    ([f"{M}::test_pass"], [f"{M}::test_param[plain]"]),  # resolved
    ([f"{M}::test_xfail"], []),  # XFAIL counts as passing
    ([f"{M}::test_pass", f"{M}::test_fail"], [f"{M}::test_param[plain]"]),  # partial
    ([f"{M}::test_pass"], [f"{M}::test_skip"]),  # a skipped P2P test is absent under -rA: a failure
    ([f"{M}::test_xpass"], [f"{M}::test_pass"]),  # an xpass is absent: not resolved
    ([f"{M}::test_teardown_error"], []),
    ([f"{M}::test_param[c"], [f"{M}::test_param[/tmp/deep/leaf]"]),
    ([f"{M}::test_param[/tmp/deep"], [f"{M}::test_pass"]),  # an id cut inside its brackets: prefix match
    (["tests/test_broken.py::test_never"], [f"{M}::test_pass"]),  # never collected
    ([], [f"{M}::test_pass"]),  # nothing to fix: SWE-bench counts it as all-passing
]


def _official_resolution(statuses: dict[str, str], f2p: list[str], p2p: list[str]) -> tuple[dict, str]:
    report = swebench_grading.get_eval_tests_report(statuses, {"FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p})
    return report, swebench_grading.get_resolution_status(report)


@pytest.mark.parametrize("f2p,p2p", F2P_P2P_SETS)
def test_resolution_matches_swebench(sandbox_logs, f2p, p2p):
    for run_name in ("rA", "rA-v-classic"):
        for parser in OFFICIAL:
            statuses = logs.parse_log(sandbox_logs[run_name], parser)
            report, official = _official_resolution(statuses, f2p, p2p)
            ours = logs.tests_report(statuses, f2p, p2p)
            assert ours == {kind: report[kind] for kind in ("FAIL_TO_PASS", "PASS_TO_PASS")}
            assert logs.resolution_status(ours) == official, (run_name, parser, f2p, p2p)


@pytest.mark.slow
def test_expected_resolutions_by_hand(sandbox_logs):
    """The rules spelled out on the plain -rA log: set 1 resolved, 2 (XFAIL) resolved, 3 partial (1 of
    2 F2P: 0 < 1/2 < 1, P2P 1/1), 4 no (skipped P2P absent), 5 no (xpass absent)."""
    statuses = logs.parse_log(sandbox_logs["rA"], "pytest")
    got = [logs.resolution_status(logs.tests_report(statuses, f2p, p2p)) for f2p, p2p in F2P_P2P_SETS[:5]]
    assert got == ["RESOLVED_FULL", "RESOLVED_FULL", "RESOLVED_PARTIAL", "RESOLVED_NO", "RESOLVED_NO"]


def _eval_log(pytest_log: str, exit_code: int | None) -> str:
    """A SWE-bench eval log around a pytest log: `set -x` echoes of the markers, then the exit code."""
    tail = f"\n{logs.TEST_EXIT_CODE}: {exit_code}\n" if exit_code is not None else "\n"
    return (f"+ git apply -v - <<'EOF_1'\n+ : '{logs.START_TEST_OUTPUT}'\n+ pytest -rA tests\n{pytest_log}\n"
            f"+ : '{logs.END_TEST_OUTPUT}'{tail}")


def test_log_status_map_matches_get_logs_eval(sandbox_logs, tmp_path):
    plain = sandbox_logs["rA"]
    passing_only = "\n".join(line for line in plain.split("\n") if line.startswith("PASSED"))
    cases = {
        "eval-log": _eval_log(plain, 1),
        "no-exit-code": _eval_log(plain, None),
        "bare-pytest-log": plain,
        "fake-passes-exit-1": _eval_log(passing_only, 1),  # only PASSED lines but the tests failed: no run
        "fake-passes-exit-0": _eval_log(passing_only, 0),
        "apply-failed": ">>>>> Patch Apply Failed\n" + _eval_log(plain, 1),
        "start-marker-only": f"+ : '{logs.START_TEST_OUTPUT}'\n{plain}",
        "no-statuses": _eval_log("collected 0 items\n\nno tests ran in 0.01s", 5),
        "results-outside-markers": f"{plain}\n" + _eval_log("", 1),
    }
    for name, content in cases.items():
        path = tmp_path / f"{name}.log"
        path.write_text(content)
        for parser in OFFICIAL:
            spec = SimpleNamespace(log_parser=f"parse_log_{parser}")
            official = swebench_grading.get_logs_eval(spec, str(path))
            assert logs.log_status_map(content, parser) == official, (name, parser)
    assert logs.log_status_map(cases["fake-passes-exit-1"])[1] is False
    assert logs.log_status_map(cases["fake-passes-exit-0"])[1] is True
    # arlctl's own pytest log has no markers: bare=True reads it as the region between them.
    assert logs.log_status_map(plain, bare=True) == logs.log_status_map(cases["eval-log"])
    assert logs.log_status_map(plain, exit_code=1, bare=True)[1] is True
    assert logs.log_status_map(passing_only, exit_code=1, bare=True) == ({}, False)


def test_unknown_parser_is_refused():
    with pytest.raises(ValueError, match="unknown SWE-bench log parser 'junit'"):
        logs.parse_log("PASSED a::b", "junit")
    assert logs.parser_for({"repo": "astropy/astropy"}) == "pytest_v2"
    assert logs.parser_for({"repo": "psf/requests"}) == "pytest_options"
    assert logs.parser_for({"repo": "someone/else"}) == "pytest"
    assert logs.parser_for({"repo": "astropy/astropy", "log_parser": "pytest"}) == "pytest"


# ---- generated input ------------------------------------------------------------------------------------

_WORDS = ["PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL", "XPASS", "PASSEDX", "[1]", "[12]", "-", " - ",
          "t.py::a", "t.py::b[x", "y]", "t.py::c[/p/q]", "t.py::d[//p/q]", "t.py::e[/p/*]", "\x1b[32m", "[0m",
          "\t", "\r", "\x0b", " ", "  ", "msg", "[100%]", "::", "ok"]
_LINES = st.lists(st.sampled_from(_WORDS), max_size=8).map("".join)


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(st.lists(_LINES, max_size=12).map("\n".join))
def test_parsers_match_swebench_on_generated_lines(log):
    for parser, official in OFFICIAL.items():
        assert logs.parse_log(log, parser) == official(log, None), parser


_IDS = ["a::t1", "a::t2", "a::t3[x", "a::t3[xy]", "a::t3[xz]", "b::t4"]
_STATUS_MAPS = st.dictionaries(st.sampled_from(_IDS + ["a::t3[x]"]),
                               st.sampled_from(["PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL", "PASSEDX"]))


@settings(max_examples=400, deadline=None)
@given(_STATUS_MAPS, st.lists(st.sampled_from(_IDS), max_size=4), st.lists(st.sampled_from(_IDS), max_size=4))
def test_resolution_matches_swebench_on_generated_maps(statuses, f2p, p2p):
    report, official = _official_resolution(statuses, f2p, p2p)
    ours = logs.tests_report(statuses, f2p, p2p)
    assert ours == {kind: report[kind] for kind in ("FAIL_TO_PASS", "PASS_TO_PASS")}
    assert logs.resolution_status(ours) == official


# ---- the signed outcomes beside the log -----------------------------------------------------------------


def test_cross_check_flags_a_log_that_claims_what_the_records_do_not():
    f2p, p2p = ["t.py::fix"], ["t.py::keep"]
    signed = {"t.py::fix": "failed", "t.py::keep": "passed"}
    honest = "PASSED t.py::keep\nFAILED t.py::fix - assert 0"
    check = logs.cross_check(signed, honest, f2p, p2p, exit_code=1)
    assert check["agree"] and check["disagree"] == [] and check["signed_resolution"] == "RESOLVED_NO"
    forged = honest + "\nFAILED t.py::decoy\nPASSED t.py::fix"  # printed after pytest's summary
    check = logs.cross_check(signed, forged, f2p, p2p, exit_code=1)
    assert (check["signed_resolution"], check["log_resolution"]) == ("RESOLVED_NO", "RESOLVED_FULL")
    assert not check["agree"] and check["log_claims_pass"] == ["t.py::fix"]
    assert check["log_statuses"] == {"t.py::fix": "PASSED", "t.py::keep": "PASSED"}
    # xfail and skipped outcomes map to SWE-bench's words; an xpass has none, like its log line.
    assert logs.statuses_from_outcomes({"a": "xfail", "b": "skipped", "c": "xpass", "d": "error"}) == {
        "a": "XFAIL", "b": "SKIPPED", "d": "ERROR"}


@pytest.mark.slow
def test_status_lines_keep_what_the_parsers_read(sandbox_logs, tmp_path):
    """The grading driver sends back only the log's status lines; parsing them gives the whole log's map."""
    source = (Path(logs.__file__).with_name("harness") / "driver.py").read_text()
    namespace: dict = {}
    exec(compile(source.split("\ndef main():")[0], "driver.py", "exec"), namespace)  # the helpers, not main()
    for name, log in sandbox_logs.items():
        path = tmp_path / f"{name}.log"
        path.write_bytes(log.encode())
        lines, cut = namespace["_status_lines"](str(path))
        assert not cut and len(lines) < len(log)
        for parser in OFFICIAL:
            assert logs.parse_log(lines, parser) == logs.parse_log(log, parser), (name, parser)
    limit = namespace["STATUS_LINES_LIMIT"]
    big = tmp_path / "big.log"
    big.write_text("PASSED t.py::x\n" * 30_000)  # 15 characters a line, 450,000 in all
    lines, cut = namespace["_status_lines"](str(big))
    # JSON-escaped a line is 16 characters ("\n" becomes two), plus 2 quotes: (128000 - 2) // 16 = 7999
    # whole lines fit, 7999 * 15 = 119,985 characters.
    assert limit == 128_000 and cut and lines.startswith("PASSED t.py::x\n") and len(lines) == 119_985
    wide = tmp_path / "wide.log"
    wide.write_text("PASSED t.py::\u00e9\u00e9\u00e9\u00e9\u00e9\n" * 30_000)  # each é is 6 characters escaped
    lines, cut = namespace["_status_lines"](str(wide))
    assert cut and len(json.dumps(lines)) <= limit and lines.startswith("PASSED t.py::") and lines.endswith("\n")
