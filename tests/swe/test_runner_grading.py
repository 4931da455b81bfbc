"""Runner mode: rows whose tests run under their own runner (`test_cmd`, or a SWE-bench 5 `eval_script` whose
tests pytest cannot be given) are graded from that runner's log by the swebench package's parser, in a real
bwrap sandbox; rows that say nothing of how their tests run, or name a repo the package has no parser for,
are refused as the row's own fault (BadTaskRow: env_error in a rollout, a null reward with the cause)."""

from __future__ import annotations

import json

import pytest
from swe_helpers import make_diff, run
from test_swebench_format import SUITE_IDS, build_dataset

from arlctl.envs.swe import official
from arlctl.envs.swe.grader import RUNNER_CAUSE, grade, grading_mode
from arlctl.envs.swe.tasks import BadTaskRow, check_task, runner_graded

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def row(tmp_path_factory):
    """A SWE-bench row over a real git repository whose tests run through `test_cmd` (pytest as the runner)."""
    import os

    root = tmp_path_factory.mktemp("runner-rows")
    saved = os.environ.get("ARLCTL_SNAPSHOT_BASES")
    os.environ["ARLCTL_SNAPSHOT_BASES"] = str(root)
    base = build_dataset(root, SUITE_IDS[:1])[0]
    files = sorted({i.split("::")[0] for i in json.loads(base["FAIL_TO_PASS"]) + json.loads(base["PASS_TO_PASS"])})
    yield {**base, "task_id": base["instance_id"], "log_parser": "pytest",
           "test_cmd": "python3 -m pytest -p no:cacheprovider -rA " + " ".join(files)}
    if saved is None:
        os.environ.pop("ARLCTL_SNAPSHOT_BASES", None)
    else:
        os.environ["ARLCTL_SNAPSHOT_BASES"] = saved


def test_gold_and_empty_through_the_rows_own_command(row, bwrap):
    assert runner_graded(row) and grading_mode(row) == "runner"
    gold, components, info = run(grade(row, row["patch"], bwrap, keep_log=True))
    assert gold == 1.0 and components == {"f2p": 1.0, "p2p": 1.0, "tests_passed": 1.0}
    assert info["trusted"] is False and info["untrusted_cause"] == RUNNER_CAUSE and info["log_disagrees"] is None
    assert info["swebench"]["parser"] == "parse_log_pytest" and info["swebench"]["resolution"] == "RESOLVED_FULL"
    assert ">>>>> Test Exit Code: 0" in info["runner_log"]  # the package's exit-code line, recorded by the script
    empty, components, info = run(grade(row, "", bwrap))
    f2p = json.loads(row["FAIL_TO_PASS"])
    assert empty == 0.0 and components["f2p"] == 0.0 and components["p2p"] == 1.0
    assert {i: info["outcomes"][i] for i in f2p} == dict.fromkeys(f2p, "failed") and "runner_log" not in info


def test_a_forged_log_fools_runner_mode_so_it_is_never_trusted(row, bwrap):
    """A real attack: package code prints PASSED lines for the FAIL_TO_PASS tests at exit, and a FAILED decoy
    (the package's exit-code check only catches a failing run with no failure in its log). The runner's log is
    the tested process's own output, so the verdict is forged: 1.0, trusted false, which `arlctl filter` drops
    unless --keep-untrusted. With the static scan on (the default) the forging code never runs."""
    f2p = json.loads(row["FAIL_TO_PASS"])
    forge = ("\nimport atexit\n\n\ndef _forge():\n    print('FAILED tests/decoy.py::test_decoy')\n"
             + "".join(f"    print('PASSED {nodeid}')\n" for nodeid in f2p) + "\n\natexit.register(_forge)\n")
    diff = make_diff(row, {"stockroom/__init__.py": lambda text: text + forge})
    forged, _, info = run(grade(row, diff, bwrap, scan=False))
    assert forged == 1.0 and info["trusted"] is False and info["mode"] == "runner"
    scanned, _, info = run(grade(row, diff, bwrap))
    assert scanned == 0.0 and info["tamper"] and info["trusted"] is True


def test_a_script_that_never_reaches_its_tests_is_no_verdict(row, bwrap):
    broken = {**row, "activate": "source /nonexistent/activate"}
    value, _, info = run(grade(broken, row["patch"], bwrap))
    assert value is None and info["infra"] and "stopped before its tests started" in info["error"]


def test_a_slow_runner_times_out_as_a_zero(row, bwrap):
    slow = {**row, "test_cmd": "sleep 30; " + row["test_cmd"]}
    value, _, info = run(grade(slow, row["patch"], bwrap, timeout=2))
    assert value == 0.0 and info["timed_out"] is True


def test_eval_scripts_are_the_packages(row):
    """A SWE-bench 5 eval_script goes through the package's make_test_spec (which adds the exit-code line) and
    reads base_commit as the one-commit snapshot's HEAD; a test_cmd row gets the same shape."""
    base = row["base_commit"]
    script = (f"#!/bin/bash\nset -uxo pipefail\nsource /opt/miniconda3/bin/activate\nconda activate testbed\n"
              f"cd /testbed\ngit checkout {base} tests/a.py\n: '>>>>> Start Test Output'\n./tests/runtests.py x\n"
              f": '>>>>> End Test Output'\ngit checkout {base} tests/a.py\n")
    made, driver_applies = official.eval_script({**row, "eval_script": script}, "/testbed", True)
    assert not driver_applies and base not in made and made.count("git checkout HEAD tests/a.py") == 2
    lines = made.splitlines()
    end = lines.index(": '>>>>> End Test Output'")
    assert lines[end - 1] == "SWEBENCH_TEST_EXIT_CODE=$?" and lines[end + 1].startswith('echo ">>>>> Test Exit Code')
    made, driver_applies = official.eval_script(row, "/work", False)
    assert driver_applies and "cd /work" in made and row["test_cmd"] in made and "conda" not in made
    made, _ = official.eval_script({k: v for k, v in row.items() if k != "activate"}, "/testbed", True)
    assert official.CONDA_ACTIVATION in made  # an image row with no declared activation: the testbed env


def _bad(row: dict, **changes) -> str:
    with pytest.raises(BadTaskRow) as caught:
        check_task({k: v for k, v in {**row, **changes}.items() if v is not None})
    return str(caught.value) + " " + (caught.value.hint or "")


def test_rows_that_cannot_say_how_their_tests_run_are_refused(row):
    django_ids = json.dumps(["test_x (utils_tests.test_text.TestUtilsText.test_x)"])
    # non-pytest ids and nothing that says how to run them
    assert "eval_script" in _bad(row, test_cmd=None, FAIL_TO_PASS=django_ids)
    # a repo the package knows no parser for, and no log_parser
    assert "knows no log parser for repo" in _bad(row, log_parser=None, repo="someone/unknown")
    assert "unknown log_parser" in _bad(row, log_parser="no_such_runner")
    assert "must be a string" in _bad(row, test_cmd=["pytest"])
    assert "multi-line" in _bad(row, FAIL_TO_PASS=json.dumps(["a\nb"]))
    # a django row with the package's parser by repo, and an eval_script: accepted, runner-graded
    ok = {**row, "test_cmd": None, "repo": "django/django", "log_parser": None, "FAIL_TO_PASS": django_ids,
          "eval_script": "#!/bin/bash\n: '>>>>> Start Test Output'\n./tests/runtests.py\n: '>>>>> End Test Output'\n"}
    ok = {k: v for k, v in ok.items() if v is not None}
    check_task(ok)
    assert runner_graded(ok) and official.parser_for(ok) == "parse_log_django"
    # a pytest row that carries an eval_script keeps arlctl's own pytest harness (signed records)
    pytest_row = {k: v for k, v in {**row, "test_cmd": None, "eval_script": "x"}.items() if v is not None}
    assert not runner_graded(pytest_row) and grading_mode(pytest_row) == "inprocess"


def test_fail_only_repos_and_parser_errors_follow_the_package():
    from swebench.harness.constants import FAIL_ONLY_REPOS

    repo = sorted(FAIL_ONLY_REPOS)[0]
    assert official.eval_type_of({"repo": repo}) == "fail_only"
    assert official.eval_type_of({"repo": "django/django"}) == "pass_and_fail"
    assert official.eval_type_of({"repo": repo, "eval_type": "pass_and_fail"}) == "pass_and_fail"
    # lighthouse's parser picks its format by the row's version; a row without one is an error, not a raise
    report = official.official_report({"repo": "GoogleChrome/lighthouse"}, "anything", ["t"], [])
    assert "could not read" in report["error"] and report["resolved"] is False
