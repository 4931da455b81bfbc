"""`arlctl swe prepare` through the real CLI and bwrap: rows without a probe form get one, and trusted grading.

Default tier, one CLI run over five rows (-j 2): a built-in task with its probe fields removed, a SWE-bench
row built from another (repo_path at a base_commit, lists as JSON strings, as in test_swebench_format), a
unittest-style task (self.assertEqual / assertRaises / assertRaisesRegex / assertTrue / assertIn /
assertAlmostEqual / assertListEqual / assertFalse), a task whose test fails by raising (a check the probe
form cannot express: unconvertible, with its cause in the summary) and a row whose test_patch does not
apply (named, left out, exit 1). A prepared row is probe-graded and trusted (gold diff: 1); an unprepared
copy is graded in-process, trusted: false with a cause. Usage errors exit 2, no bwrap 75.

Integration tier: for every converted test of those rows the probe verdict equals pytest's on the gold
and on the buggy code, checked again here by grading each row both ways; and `arlctl reward` then
`arlctl filter` drop the untrusted group (counted under `untrusted`) while `--keep-untrusted` keeps it.
Slow tier: the whole suite (42 tasks) in both forms.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from swe_helpers import make_diff, run
from test_swebench_format import build_dataset  # the SWE-bench rows of the format tests, built the same way

from arlctl.envs.swe.grader import grade, grading_mode
from arlctl.envs.swe.tasks import load_suite_task, suite_ids
from arlctl.envs.swe.tasks import test_ids as ids_of  # renamed: pytest would collect a test_* name
from arlctl.io.shards import Lineage, write_shard
from arlctl.schemas.rows import TrajectoryRow, rows_to_table

PROBE_FIELDS = ("probe_patch", "probe_expected", "probe_tests")
BUILTIN_ID, SWEBENCH_ID = "stockroom-001", "b64tools-019"
ARLCTL = str(Path(sys.executable).with_name("arlctl"))


def _cli(args: list[str], env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([ARLCTL, *args], env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)


def _unprepared(task_id: str) -> dict:
    return {k: v for k, v in load_suite_task(task_id).items() if k not in PROBE_FIELDS}


def _write_jsonl(rows: list[dict], path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _prepare(tasks: Path, out: Path, timeout: float = 900) -> tuple[subprocess.CompletedProcess, dict]:
    done = _cli(["swe", "prepare", str(tasks), "--out", str(out), "--json", "-j", "2"], timeout=timeout)
    return done, json.loads(done.stdout) if done.stdout.strip() else {}


def _read_jsonl(path: Path) -> dict[str, dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["task_id"]: r for r in rows}


def _graded(row: dict) -> list[str]:
    return ids_of(row, "FAIL_TO_PASS") + ids_of(row, "PASS_TO_PASS")


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    """A directory listed in ARLCTL_SNAPSHOT_BASES for this module's repositories and snapshots."""
    root = tmp_path_factory.mktemp("prepare-bases")
    saved = os.environ.get("ARLCTL_SNAPSHOT_BASES")
    os.environ["ARLCTL_SNAPSHOT_BASES"] = str(root)
    yield root
    if saved is None:
        os.environ.pop("ARLCTL_SNAPSHOT_BASES", None)
    else:
        os.environ["ARLCTL_SNAPSHOT_BASES"] = saved


BUGGY = '''def clamp(x, lo, hi):
    return max(lo, min(x, hi - 1))


def ratio(a, b):
    if b == 0:
        raise ValueError("b is zero")
    return a / b


def words(text):
    return text.split(" ")
'''
FIXED = BUGGY.replace("min(x, hi - 1)", "min(x, hi)").replace('text.split(" ")', "text.split()")
OLD_TESTS = '''import unittest

from calc.ops import ratio


class TestRatio(unittest.TestCase):
    def test_third(self):
        self.assertAlmostEqual(ratio(1, 3), 0.3333, places=3)

    def test_zero(self):
        self.assertRaises(ValueError, ratio, 1, 0)
        with self.assertRaisesRegex(ValueError, "zero"):
            ratio(2, 0)
'''
NEW_TESTS = '''import unittest

from calc.ops import clamp, words


class TestClamp(unittest.TestCase):
    def test_upper_bound(self):
        self.assertEqual(clamp(5, 0, 5), 5)
        self.assertTrue(clamp(9, 0, 5) == 5)
        self.assertIn(clamp(7, 0, 7), [7])

    def test_words(self):
        self.assertListEqual(words("a  b"), ["a", "b"])
        self.assertFalse("" in words(" x "))
'''
OPAQUE_TESTS = '''from calc.ops import clamp


def test_opaque():
    if clamp(5, 0, 5) != 5:
        raise AssertionError("clamp excludes hi")  # a test that fails by raising: no check to record
'''


def _git(repo: Path, *args: str) -> str:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(repo), "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "t",
           "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", "-C", str(repo), *args], env=env, check=True, capture_output=True,
                          text=True).stdout


def _diff(base: Path, edits: dict[str, str], scratch: Path) -> str:
    """The git diff that takes `base` to `base` + edits."""
    if scratch.exists():
        shutil.rmtree(scratch)
    shutil.copytree(base, scratch)
    _git(scratch, "init", "-q")
    _git(scratch, "add", "-A")
    _git(scratch, "commit", "-q", "-m", "base")
    for rel, text in edits.items():
        (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
        (scratch / rel).write_text(text)
    _git(scratch, "add", "-A")
    diff = _git(scratch, "diff", "--cached")
    shutil.rmtree(scratch)
    return diff


def _unittest_rows(root: Path) -> list[dict]:
    repo = root / "calc-repo"
    (repo / "calc").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "calc" / "__init__.py").write_text("")
    (repo / "calc" / "ops.py").write_text(BUGGY)
    (repo / "tests" / "test_ratio.py").write_text(OLD_TESTS)
    patch = _diff(repo, {"calc/ops.py": FIXED}, root / "scratch")
    base = {"repo": "local/calc", "problem_statement": "clamp excludes hi; words splits on single spaces",
            "repo_snapshot": str(repo), "patch": patch,
            "PASS_TO_PASS": json.dumps(["tests/test_ratio.py::TestRatio::test_third",
                                        "tests/test_ratio.py::TestRatio::test_zero"])}
    unittest_row = {**base, "instance_id": "calc__unittest",
                    "test_patch": _diff(repo, {"tests/test_clamp.py": NEW_TESTS}, root / "scratch"),
                    "FAIL_TO_PASS": json.dumps(["tests/test_clamp.py::TestClamp::test_upper_bound",
                                                "tests/test_clamp.py::TestClamp::test_words"])}
    opaque_row = {**base, "instance_id": "calc__opaque",
                  "test_patch": _diff(repo, {"tests/test_opaque.py": OPAQUE_TESTS}, root / "scratch"),
                  "FAIL_TO_PASS": json.dumps(["tests/test_opaque.py::test_opaque"])}
    return [unittest_row, opaque_row]


@pytest.fixture(scope="module")
def prepared(bases, bwrap, tmp_path_factory):
    """One real `arlctl swe prepare` over the five rows: (process, summary, input rows by id, output rows)."""
    swebench = build_dataset(bases / "swebench", [SWEBENCH_ID])[0]
    bad = {**_unprepared(BUILTIN_ID), "task_id": "bad-test-patch", "instance_id": "bad-test-patch",
           "test_patch": _unprepared(SWEBENCH_ID)["test_patch"].replace("--- /dev/null", "--- a/nowhere.py")}
    rows = [_unprepared(BUILTIN_ID), swebench, *_unittest_rows(bases / "unittest"), bad]
    out = tmp_path_factory.mktemp("prepare-out")
    done, summary = _prepare(_write_jsonl(rows, out / "rows.jsonl"), out / "prepared")
    by_id = {r.get("task_id") or r["instance_id"]: {**r, "task_id": r.get("task_id") or r["instance_id"], "env": "swe"}
             for r in rows}
    written = _read_jsonl(out / "prepared" / "tasks.jsonl") if (out / "prepared" / "tasks.jsonl").exists() else {}
    return done, summary, by_id, written, out / "prepared"


@pytest.mark.slow
def test_the_cli_prepares_every_row_it_can_and_names_the_one_it_cannot(prepared):
    done, summary, rows, written, out = prepared
    assert done.returncode == 1, done.stderr[-3000:]  # one row could not be prepared at all
    assert [f["task_id"] for f in summary["failed"]] == ["bad-test-patch"], summary["failed"]
    assert "test_patch does not apply" in summary["failed"][0]["error"]
    assert "1 row(s) could not be prepared" in done.stderr and "bad-test-patch" in done.stderr
    swebench = f"suite__{SWEBENCH_ID}"
    assert sorted(written) == sorted([BUILTIN_ID, swebench, "calc__unittest", "calc__opaque"])
    assert (summary["rows"], summary["prepared"], summary["probe_graded"]) == (5, 4, 3)
    convertible = sum(len(_graded(rows[i])) for i in (BUILTIN_ID, swebench, "calc__unittest", "calc__opaque")) - 1
    assert summary["tests"] == {"converted": convertible, "unconvertible": 1, "disagrees": 0, "broken": 0}
    cause = "the test raises by itself: raise AssertionError('clamp excludes hi')"
    assert summary["unconvertible_causes"] == {cause: 1} and summary["disagreements"] == []
    # the human summary on stderr: a line per row, the counts with the causes, where the rows went
    for line in (f"probe     {BUILTIN_ID}: ", "untrusted calc__opaque: 2 converted, 1 unconvertible",
                 f"tests: {convertible} converted, 1 unconvertible, 0 disagree", f"unconvertible x1: {cause}",
                 f"wrote {out / 'tasks.jsonl'}"):
        assert line in done.stderr, line
    assert json.loads((out / "prepare.json").read_text())["tests"] == summary["tests"]
    for task_id in (BUILTIN_ID, swebench, "calc__unittest"):
        row = written[task_id]
        assert {t["id"]: t["status"] for t in row["probe_tests"]} == dict.fromkeys(_graded(rows[task_id]), "converted")
        assert set(row["probe_expected"]) == set(_graded(rows[task_id])) and row["probe_patch"]
        assert grading_mode(row) == "probe" and grading_mode(rows[task_id]) == "inprocess"
    # a SWE-bench row stays as the datasets write it: lists as JSON strings, its repository where it was
    assert isinstance(written[swebench]["FAIL_TO_PASS"], str)
    assert written[swebench]["repo_path"] == rows[swebench]["repo_path"]


@pytest.mark.slow
def test_a_prepared_row_is_trusted_and_its_unprepared_copy_is_not(prepared, bwrap):
    _, _, rows, written, _ = prepared
    reward, _, info = run(grade(written["calc__unittest"], rows["calc__unittest"]["patch"], bwrap))
    assert (reward, info["mode"], info["trusted"]) == (1.0, "probe", True), info
    assert "untrusted_cause" not in info
    reward, _, info = run(grade(rows["calc__unittest"], rows["calc__unittest"]["patch"], bwrap))
    assert (reward, info["mode"], info["trusted"], info["records_authentic"]) == (1.0, "inprocess", False, True)
    assert "not prepared" in info["untrusted_cause"] and "arlctl swe prepare" in info["untrusted_cause"]
    # the row with an unconvertible test is written but grades in-process: the cause names that test
    reward, _, info = run(grade(written["calc__opaque"], rows["calc__opaque"]["patch"], bwrap))
    assert (reward, info["mode"], info["trusted"]) == (1.0, "inprocess", False)
    assert "tests/test_opaque.py::test_opaque" in info["untrusted_cause"]
    assert "the test raises by itself" in info["untrusted_cause"]


def test_zeros_the_host_decides_are_trusted(bwrap):
    """`trusted` says where the verdict was computed, not whether the diff was any good: a diff that does not
    apply (probe mode) and one the scan refuses (either mode: nothing ran) score a trusted 0, so the filter's
    untrusted rule never takes a policy's failures or hacks out of its training signal."""
    task = load_suite_task(BUILTIN_ID)  # the shipped probe form
    reward, _, info = run(grade(task, load_suite_task(SWEBENCH_ID)["patch"], bwrap))  # another task's fix
    assert (reward, info["mode"], info["trusted"], info["apply_ok"]) == (0.0, "probe", True, False), info
    attack = make_diff(task, {"stockroom/__init__.py": lambda t: t + "\nimport sys\n_f = sys._getframe(1).f_globals\n"})
    for graded in (task, _unprepared(BUILTIN_ID)):
        reward, _, info = run(grade(graded, attack, bwrap))
        assert (reward, info["trusted"]) == (0.0, True) and info["results_error"].startswith("tamper:"), info


def test_usage_errors_and_no_sandbox(tmp_path, monkeypatch):
    """In process (typer's runner over the real app): each refusal comes before any row is touched."""
    from typer.testing import CliRunner

    from arlctl.cli.main import app

    def prepare(*args: str):
        return CliRunner().invoke(app, ["swe", "prepare", *args])

    rows = _write_jsonl([_unprepared(BUILTIN_ID)], tmp_path / "rows.jsonl")
    usage = prepare(str(rows), "--out", str(tmp_path / "o1"), "--sandbox", "vm")
    assert usage.exit_code == 2 and "--sandbox must be one of bwrap, docker" in usage.output
    assert prepare(str(rows), "--out", str(tmp_path / "o1"), "-j", "0").exit_code == 2
    assert prepare(str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o2")).exit_code == 2
    (tmp_path / "bad.json").write_text('{"not": "a list"}')
    bad = prepare(str(tmp_path / "bad.json"), "--out", str(tmp_path / "o3"))
    assert bad.exit_code == 2 and "non-empty list of row objects" in bad.output
    image_row = {k: v for k, v in _unprepared(BUILTIN_ID).items() if k != "repo_snapshot"}
    image = _write_jsonl([{**image_row, "image": "swebench/x:latest"}], tmp_path / "image.jsonl")  # an image task
    wrong = prepare(str(image), "--out", str(tmp_path / "o4"))
    assert wrong.exit_code == 2 and "use --sandbox docker" in wrong.output
    listed = tmp_path / "rows.json"
    listed.write_text(json.dumps([_unprepared(BUILTIN_ID)]))
    # no bwrap on PATH: the sandbox is unavailable, exit 75 before anything is built or written
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    gone = prepare(str(listed), "--out", str(tmp_path / "o5"))
    assert gone.exit_code == 75, gone.output
    assert "bwrap sandbox is unavailable" in gone.output and not (tmp_path / "o5").exists()


# ---- integration: the verdicts both ways, and reward + filter through the real CLI ------------------------


@pytest.mark.integration
@pytest.mark.parametrize("task_id", [BUILTIN_ID, f"suite__{SWEBENCH_ID}", "calc__unittest"])
def test_probe_verdicts_equal_pytests_on_gold_and_buggy_code(prepared, bwrap, task_id):
    """Grade the prepared row (probe mode) and the unprepared copy (in-process: pytest's verdicts) on the gold
    and on the empty diff: every test's verdict is the same both ways, and only the gold diff scores 1."""
    _, _, rows, written, _ = prepared
    probe_row, pytest_row = written[task_id], rows[task_id]
    for diff, expected in ((pytest_row["patch"], 1.0), ("", 0.0)):
        probe_reward, _, probe = run(grade(probe_row, diff, bwrap))
        pytest_reward, _, inproc = run(grade(pytest_row, diff, bwrap))
        assert (probe["mode"], probe["trusted"]) == ("probe", True), probe
        assert (inproc["mode"], inproc["trusted"], inproc["records_authentic"]) == ("inprocess", False, True)
        assert probe_reward == pytest_reward == expected, (diff[:40], probe, inproc)
        assert {t: probe["outcomes"][t] == "passed" for t in _graded(probe_row)} == \
               {t: inproc["outcomes"][t] == "passed" for t in _graded(probe_row)}
    assert set(probe["failed"]) == set(ids_of(probe_row, "FAIL_TO_PASS")), probe  # buggy: exactly these fail


def _trajectory(group: str, idx: int, task: dict, diff: str) -> TrajectoryRow:
    return TrajectoryRow(group_id=group, sample_index=idx, task_id=task["task_id"], env="swe", env_version="1",
                         task=task, policy="p", prompt_text="", prompt_ids=[1, 2], response_ids=[3],
                         response_mask=[1], response_logprobs=[-0.5], turns=[], status="ok", policy_version=0,
                         policy_version_last=0, final_state=diff)


@pytest.mark.integration
def test_reward_then_filter_drop_the_untrusted_group(prepared, tmp_path):
    """Rows of a prepared task and of its unprepared copy (gold and empty diff each) through `arlctl reward
    --reward swe` and `arlctl filter`: the copy's group is dropped under `untrusted`, unless --keep-untrusted."""
    _, _, rows, written, _ = prepared
    task, copy = written["calc__unittest"], {**rows["calc__unittest"], "task_id": "copy", "instance_id": "copy"}
    run_dir = tmp_path / "run"
    table = rows_to_table([_trajectory("prepared", 0, task, task["patch"]), _trajectory("prepared", 1, task, ""),
                           _trajectory("copy", 0, copy, copy["patch"]), _trajectory("copy", 1, copy, "")])
    write_shard(table, str(run_dir / "rollouts" / "a.parquet"), Lineage("rollout"))
    reward = _cli(["reward", "--run", str(run_dir), "--reward", "swe", "--json"])
    assert reward.returncode == 0, reward.stderr[-3000:]
    got = {(r["group_id"], r["sample_index"]): (r["reward"], json.loads(r["reward_info"]))
           for r in pq.read_table(run_dir / "rewarded").to_pylist()}
    assert {k: (v[0], v[1]["mode"], v[1]["trusted"]) for k, v in got.items()} == {
        ("prepared", 0): (1.0, "probe", True), ("prepared", 1): (0.0, "probe", True),
        ("copy", 0): (1.0, "inprocess", False), ("copy", 1): (0.0, "inprocess", False)}
    assert "not prepared" in got[("copy", 0)][1]["untrusted_cause"]
    dropped = _cli(["filter", "--run", str(run_dir), "--json", "--dry-run"])
    assert dropped.returncode == 0, dropped.stderr[-3000:]
    result = json.loads(dropped.stdout.strip().splitlines()[-1])
    assert (result["rules"]["untrusted"], result["rows_kept"]) == (2, 2), result
    assert "untrusted" in dropped.stderr
    kept = _cli(["filter", "--run", str(run_dir), "--json", "--keep-untrusted"])
    assert kept.returncode == 0, kept.stderr[-3000:]
    result = json.loads(kept.stdout.strip().splitlines()[-1])
    assert (result["rules"]["untrusted"], result["rows_kept"]) == (0, 4), result
    assert sorted(r["group_id"] for r in pq.read_table(run_dir / "batches").to_pylist()) == ["copy"] * 2 + ["prepared"] * 2


# ---- slow: the whole suite ------------------------------------------------------------------------------------


@pytest.mark.sweep
@pytest.mark.parametrize("form", ["builtin", "swebench"])
def test_the_whole_suite_in_each_form(form, bases, tmp_path, bwrap):
    """All 42 built-in tasks with their probe fields removed, or the SWE-bench rows built from them: every row
    prepared, no probe verdict disagreeing with pytest's; the unconvertible tests counted with their causes
    (at the time of writing 2 of 187, both in backoff-037: a nested helper that raises is, statically, the
    same as a test failing by raising, so the row grades in-process)."""
    ids = suite_ids()
    # One form per test, so the two run side by side under xdist.
    rows = [_unprepared(i) for i in ids] if form == "builtin" else build_dataset(bases / "whole", ids)
    done, summary = _prepare(_write_jsonl(rows, tmp_path / f"{form}.jsonl"), tmp_path / form, timeout=3600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (summary["rows"], summary["prepared"], summary["failed"]) == (42, 42, []), form
    assert summary["tests"]["disagrees"] == summary["tests"]["broken"] == 0, summary["disagreements"]
    assert sum(summary["unconvertible_causes"].values()) == summary["tests"]["unconvertible"]
    assert f"{summary['tests']['unconvertible']} unconvertible" in done.stderr
    assert summary["probe_graded"] == sum(r["unconvertible"] == 0 for r in summary["results"]) >= 40
    assert sum(summary["tests"].values()) == sum(len(_graded(r)) for r in rows)
