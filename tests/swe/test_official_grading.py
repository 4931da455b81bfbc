"""SWE-bench grading through the `swebench` package itself (arlctl/envs/swe/official.py), on real runners' logs.

Every Python repository the package maps to a log parser is read from a log its own runner wrote here: real
pytest (inside the real bwrap sandbox, the host's python3, as the grader runs it; and this venv's newer
pytest) on fixture modules holding every outcome pytest has (passed, failed, skipped by marker and inline,
xfailed, xpassed, strict xpass, errors at setup, teardown and collection, parametrized ids with spaces,
" - " and absolute paths, a passing test that prints a fake status line); django's own test runner
(`python -m django test -v 2`) on a project with passing, failing, erroring and skipped tests; sympy's own
runner (the `SymPyTests` and `PyTestReporter` classes `bin/test` drives). arlctl's report must equal the
one the package's top-level `get_eval_report` computes independently here from the same log, and the
statuses are checked by hand against what each runner printed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from swe_helpers import run

from arlctl.envs.swe import official

swebench_python = pytest.importorskip("swebench.harness.log_parsers.python")
swebench_grading = pytest.importorskip("swebench.harness.grading")
swebench_constants = pytest.importorskip("swebench.harness.constants")
swebench_types = pytest.importorskip("swebench.types")  # its TestSpec is not imported by name: pytest would collect it

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



# ---- django's and sympy's own runners ---------------------------------------------------------------------

DJANGO_TESTS = """
import unittest
from django.test import SimpleTestCase


class Checks(SimpleTestCase):
    def test_ok(self):
        self.assertEqual(1 + 1, 2)

    def test_fail(self):
        self.assertEqual(1, 2)

    def test_error(self):
        raise RuntimeError("boom")

    @unittest.skip("not now")
    def test_skip(self):
        pass

    def test_prints(self):
        print("test_fail (demo.tests.Checks.test_fail) ... ok")  # a fake status line, in django's format
"""


@pytest.fixture(scope="module")
def django_log(tmp_path_factory) -> str:
    """`python -m django test demo -v 2` (django's DiscoverRunner, as SWE-bench's runtests.py uses) on a
    project with one app whose tests pass, fail, error, skip, and print a fake status line."""
    pytest.importorskip("django")
    root = tmp_path_factory.mktemp("django-project")
    (root / "demo").mkdir()
    (root / "demo" / "__init__.py").write_text("")
    (root / "demo" / "tests.py").write_text(DJANGO_TESTS)
    (root / "settings.py").write_text('SECRET_KEY = "x"\nINSTALLED_APPS = ["demo"]\nDATABASES = {}\n'
                                      'USE_TZ = True\n')
    result = subprocess.run([sys.executable, "-m", "django", "test", "demo", "-v", "2", "--settings", "settings"],
                            cwd=root, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(root)})
    assert result.returncode == 1, result.stdout + result.stderr  # failures
    return result.stdout + result.stderr


SYMPY_TESTS = """
from sympy import Symbol, expand


def test_expand():
    x = Symbol("x")
    assert expand((x + 1) ** 2) == x**2 + 2 * x + 1


def test_wrong():
    x = Symbol("x")
    assert expand((x + 1) ** 2) == x**2 + 1


def test_raises():
    raise ZeroDivisionError("boom")
"""

SYMPY_RUNNER = """
import sys
from sympy.testing.runtests import PyTestReporter, SymPyTests

tests = SymPyTests(PyTestReporter(verbose=True, colors=False, force_colors=False), seed=0)
tests._testfiles.append(sys.argv[1])
sys.exit(0 if tests.test() else 1)
"""


@pytest.fixture(scope="module")
def sympy_log(tmp_path_factory) -> str:
    """sympy's own runner (the classes `bin/test --verbose` drives) on a test module of sympy checks."""
    pytest.importorskip("sympy")
    root = tmp_path_factory.mktemp("sympy-tests")
    (root / "test_demo.py").write_text(SYMPY_TESTS)
    result = subprocess.run([sys.executable, "-c", SYMPY_RUNNER, str(root / "test_demo.py")], cwd=root,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    return result.stdout + result.stderr


DJANGO = "demo.tests.Checks"


def _django_id(name: str) -> str:
    return f"{name} ({DJANGO}.{name})"


# The log each repository's runner writes, and (FAIL_TO_PASS, PASS_TO_PASS) sets to grade it with: one that
# resolves and one that does not, by the statuses checked by hand below.
def _cases(repo: str, logs: dict[str, str]) -> tuple[str, list[tuple[list[str], list[str], bool]]]:
    if repo == "django/django":
        return logs["django"], [([_django_id("test_ok")], [_django_id("test_prints")], True),
                                ([_django_id("test_ok"), _django_id("test_fail")], [], False),
                                ([_django_id("test_ok")], [_django_id("test_error")], False)]
    if repo == "sympy/sympy":
        return logs["sympy"], [(["test_expand"], [], True), (["test_expand", "test_wrong"], [], False),
                               (["test_expand"], ["test_raises"], False)]
    return logs["pytest"], [([f"{M}::test_pass"], [f"{M}::test_param[plain]"], True),
                            ([f"{M}::test_pass", f"{M}::test_fail"], [], False),
                            ([f"{M}::test_pass"], [f"{M}::test_fixture_error"], False)]


def _package_report(repo: str, log: str, f2p: list[str], p2p: list[str], exit_code: int, tmp_path: Path) -> dict:
    """The package's own verdict, from its top-level get_eval_report on an eval log framed with its constants."""
    key = next(k for k, fn in official.registry().items() if fn is swebench_python.MAP_REPO_TO_PARSER_PY[repo])
    spec = swebench_types.TestSpec(instance_id="row", image="", eval_script_list=[], repo=repo, version="", FAIL_TO_PASS=f2p,
                    PASS_TO_PASS=p2p, log_parser=key, eval_type="pass_and_fail")
    path = tmp_path / "eval.log"
    path.write_text(f"{swebench_constants.START_TEST_OUTPUT}\n{log}\n{swebench_constants.END_TEST_OUTPUT}\n"
                    f"{swebench_constants.TEST_EXIT_CODE}: {exit_code}\n")
    prediction = {"instance_id": "row", "model_name_or_path": "m", "model_patch": "diff"}
    return swebench_grading.get_eval_report(spec, prediction, str(path), include_tests_status=True)["row"]


@pytest.mark.slow
@pytest.mark.parametrize("repo", sorted(swebench_python.MAP_REPO_TO_PARSER_PY))
def test_every_python_repo_is_graded_from_its_own_runners_log_as_the_package_grades_it(
        repo, sandbox_logs, django_log, sympy_log, tmp_path):
    log, cases = _cases(repo, {"pytest": sandbox_logs["rA"], "django": django_log, "sympy": sympy_log})
    assert official.repo_parsers()[repo] in official.registry()
    assert official.registry()[official.repo_parsers()[repo]] is swebench_python.MAP_REPO_TO_PARSER_PY[repo]
    for f2p, p2p, resolved in cases:
        ours = official.official_report({"repo": repo}, log, f2p, p2p, exit_code=1)
        theirs = _package_report(repo, log, f2p, p2p, 1, tmp_path)
        assert ours["log_found"] is theirs["patch_successfully_applied"] is True, (repo, ours)
        assert ours["tests_status"] == theirs["tests_status"], (repo, f2p, p2p)
        assert ours["resolved"] is theirs["resolved"] is resolved, (repo, f2p, p2p)


@pytest.mark.slow
def test_django_and_sympy_statuses_by_hand(django_log, sympy_log):
    """What each runner printed, as the package reads it (checked against the logs by hand)."""
    django = official.official_report({"repo": "django/django"}, django_log, [], [], exit_code=1)["statuses"]
    assert {name: django.get(_django_id(name)) for name in ("test_ok", "test_fail", "test_error", "test_skip",
                                                               "test_prints")} == {
        "test_ok": "PASSED", "test_fail": "FAILED", "test_error": "ERROR", "test_skip": "SKIPPED",
        "test_prints": "PASSED"}
    sympy = official.official_report({"repo": "sympy/sympy"}, sympy_log, [], [], exit_code=1)["statuses"]
    # The runner appends the file's verdict to its last test's line ("test_wrong F   [FAIL]"), which the
    # package's parser does not read: that test is absent, which grades as failed all the same.
    assert "test_wrong F" in sympy_log and "[FAIL]" in sympy_log
    assert {k: sympy.get(k) for k in ("test_expand", "test_wrong", "test_raises")} == {
        "test_expand": "PASSED", "test_wrong": None, "test_raises": "ERROR"}
    # A row names its parser by the package's registry key, with or without the prefix.
    assert official.parser_for({"log_parser": "sympy", "repo": "someone/else"}) == "parse_log_sympy"
    assert official.parser_for({"log_parser": "parse_log_django"}) == "parse_log_django"


def test_a_row_without_a_known_parser_gets_no_guessed_verdict():
    unknown = official.official_report({"repo": "someone/else"}, "PASSED t.py::a", ["t.py::a"], [], exit_code=0)
    assert unknown["resolved"] is False and "knows no log parser for repo 'someone/else'" in unknown["error"]
    named = official.official_report({"log_parser": "junit"}, "PASSED t.py::a", ["t.py::a"], [], exit_code=0)
    assert "has no log parser 'junit'" in named["error"]
    # arlctl's own driver writes a pytest log: a repo whose runner is not pytest is read with the pytest parser.
    assert official.pytest_parser_for({"repo": "django/django"}) == "parse_log_pytest"
    assert official.pytest_parser_for({"repo": "psf/requests"}) == "parse_log_pytest_options"
    assert official.pytest_parser_for({"repo": "someone/else"}) == "parse_log_pytest"


# ---- pytest's outcomes, the eval log's rules ------------------------------------------------------------


def _statuses(log: str, parser: str = "parse_log_pytest") -> dict[str, str]:
    return official.official_report({}, log, [], [], exit_code=1, parser=parser)["statuses"]


@pytest.mark.slow
def test_statuses_of_each_outcome(sandbox_logs, venv_logs):
    """What the -rA summary says about each kind of test (hand-checked against the log: a later line about a
    test replaces an earlier one), for the host's pytest in bwrap and this venv's."""
    for logs in (sandbox_logs, venv_logs):
        statuses = _statuses(logs["rA"])
        assert statuses[f"{M}::test_pass"] == "PASSED"
        assert statuses[f"{M}::test_fail"] == "FAILED"  # the printed fake PASSED line comes before the summary
        assert statuses[f"{M}::test_xfail"] == "XFAIL"
        assert statuses[f"{M}::test_xpass_strict"] == "FAILED"
        assert statuses[f"{M}::test_fixture_error"] == "ERROR"
        assert statuses[f"{M}::test_teardown_error"] == "ERROR"  # "PASSED" (its call) then "ERROR" (teardown)
        assert statuses["tests/test_broken.py"] == "ERROR"  # the collection error names the file
        assert statuses[f"{M}::test_param[plain]"] == "PASSED"
        assert statuses[f"{M}::test_param[a"] == "PASSED"  # an id with a space is cut at the space
        # No status for an xpass (not a SWE-bench status) or a skip ("SKIPPED [1] file:line" names no test).
        for absent in ("test_xpass", "test_skip", "test_skip_inline"):
            assert f"{M}::{absent}" not in statuses
        options = _statuses(logs["rA"], "pytest_options")
        assert options[f"{M}::test_param[/leaf]"] == "PASSED"  # an absolute-path parameter keeps its last part
        v2 = _statuses(logs["rA-v-classic"], "pytest_v2")
        assert v2[f"{M}::test_param[a b]"] == "PASSED"  # pytest_v2 keeps every word of the id
        assert official.official_report({}, logs["rA-interrupted"], [], [], exit_code=2, parser="pytest")["statuses"] == {
            "tests/test_broken.py": "ERROR"}  # the session stopped at collection


F2P_P2P_SETS = [
    ([f"{M}::test_pass"], [f"{M}::test_param[plain]"], "RESOLVED_FULL"),
    ([f"{M}::test_xfail"], [], "RESOLVED_FULL"),  # XFAIL counts as passing
    ([f"{M}::test_pass", f"{M}::test_fail"], [f"{M}::test_param[plain]"], "RESOLVED_PARTIAL"),
    ([f"{M}::test_pass"], [f"{M}::test_skip"], "RESOLVED_NO"),  # a skipped P2P test is absent under -rA
    ([f"{M}::test_xpass"], [f"{M}::test_pass"], "RESOLVED_NO"),  # an xpass is absent: not resolved
    ([f"{M}::test_teardown_error"], [], "RESOLVED_NO"),
    (["tests/test_broken.py::test_never"], [f"{M}::test_pass"], "RESOLVED_NO"),  # never collected
    ([], [f"{M}::test_pass"], "RESOLVED_FULL"),  # nothing to fix: SWE-bench counts it as all-passing
]


@pytest.mark.slow
def test_expected_resolutions_by_hand(sandbox_logs):
    got = [official.official_report({}, sandbox_logs["rA"], f2p, p2p, exit_code=1, parser="pytest")["resolution"]
           for f2p, p2p, _ in F2P_P2P_SETS]
    assert got == [want for _, _, want in F2P_P2P_SETS]


@pytest.mark.slow
def test_the_eval_log_rules_are_the_packages(sandbox_logs):
    """Framed by us or by an eval script, a log is judged by the package's rules: forged PASSED lines with a
    failing exit code are no run, a bad-run marker is no run, a log without statuses is no run."""
    plain = sandbox_logs["rA"]
    passing_only = "\n".join(line for line in plain.split("\n") if line.startswith("PASSED"))
    f2p = [f"{M}::test_pass"]

    def found(log: str, exit_code: int | None = 1, framed: bool = False) -> bool:
        return official.official_report({}, log, f2p, [], exit_code=exit_code, framed=framed,
                                        parser="pytest")["log_found"]

    assert found(plain) and found(plain, None) and found(passing_only, 0)
    assert not found(passing_only, 1)  # only PASSED lines, yet the tests failed: the log is not the run
    assert not found("collected 0 items\n\nno tests ran in 0.01s", 5)
    eval_log = official.frame(plain, 1)
    assert found(eval_log, framed=True)
    assert not found(">>>>> Patch Apply Failed\n" + eval_log, framed=True)
    assert not found(f"{official.START}\n{plain}", framed=True)  # no end marker


# ---- the signed outcomes beside the log -----------------------------------------------------------------


def test_cross_check_flags_a_log_that_claims_what_the_records_do_not():
    f2p, p2p = ["t.py::fix"], ["t.py::keep"]
    signed = {"t.py::fix": "failed", "t.py::keep": "passed"}
    honest = "PASSED t.py::keep\nFAILED t.py::fix - assert 0"
    check = official.cross_check({}, signed, honest, f2p, p2p, exit_code=1)
    assert check["agree"] and check["disagree"] == [] and check["signed_resolution"] == "RESOLVED_NO"
    assert check["report"]["tests_status"]["FAIL_TO_PASS"] == {"success": [], "failure": ["t.py::fix"]}
    forged = honest + "\nFAILED t.py::decoy\nPASSED t.py::fix"  # printed after pytest's summary
    check = official.cross_check({}, signed, forged, f2p, p2p, exit_code=1)
    assert (check["signed_resolution"], check["log_resolution"]) == ("RESOLVED_NO", "RESOLVED_FULL")
    assert not check["agree"] and check["log_claims_pass"] == ["t.py::fix"]
    assert check["log_statuses"] == {"t.py::fix": "PASSED", "t.py::keep": "PASSED"}
    # xfail and skipped outcomes map to SWE-bench's words; an xpass has none, like its log line.
    assert official.statuses_from_outcomes({"a": "xfail", "b": "skipped", "c": "xpass", "d": "error"}) == {
        "a": "XFAIL", "b": "SKIPPED", "d": "ERROR"}


@pytest.mark.slow
def test_status_lines_keep_what_the_parsers_read(sandbox_logs, tmp_path):
    """The grading driver sends back only the log's status lines; parsing them gives the whole log's map."""
    source = (Path(official.__file__).with_name("harness") / "driver.py").read_text()
    namespace: dict = {}
    exec(compile(source.split("\ndef main():")[0], "driver.py", "exec"), namespace)  # the helpers, not main()
    for name, log in sandbox_logs.items():
        path = tmp_path / f"{name}.log"
        path.write_bytes(log.encode())
        lines, cut = namespace["_status_lines"](str(path))
        assert not cut and len(lines) < len(log)
        for parser in ("pytest", "pytest_options", "pytest_v2"):
            assert _statuses(lines, parser) == _statuses(log, parser), (name, parser)
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
