"""SWE-bench / SWE-Gym rows as swe tasks: JSONL and Parquet, a local git repository at base_commit.

`build_dataset` turns a few built-in suite tasks into SWE-bench rows the way the datasets hold them: each
repository is a real git repository whose first commit is the buggy state (`base_commit`) and whose HEAD
is a later commit holding the fix and the hidden tests (as an upstream clone would); patch, test_patch and
FAIL_TO_PASS / PASS_TO_PASS (JSON strings) come from the suite task; no probe fields, so the grader runs
the tests in-process with signed records, as for any SWE-bench row. The tests show the rows load alike
from JSONL and Parquet, the policy's snapshot is the base commit's tree with no history, bad rows are
refused naming the row, the grader's SWE-bench log cross-check agrees with the signed records and a
forged log line does not move the reward, and the real CLI gives 1.0 with `--policy oracle:gold` and 0.0
with `--policy oracle:empty`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from swe_helpers import make_diff, run

from arlctl.envs.swe.grader import grade, score
from arlctl.envs.swe.tasks import (
    SUITE_DIR,
    BadTaskRow,
    SnapshotRefused,
    check_task,
    load_suite_task,
    prepare_snapshot,
)
from arlctl.envs.swe.tasks import test_ids as ids_of  # renamed: pytest would collect a test_* name
from arlctl.envs.tasks import load_tasks
from arlctl.errors import TerminalError, UsageError

# The shared model cache (read before conftest's session fixture points ARLCTL_HOME elsewhere).
MODEL_HOME = os.environ.get("ARLCTL_HOME") or os.path.expanduser("~/.cache/arlctl")
SUITE_IDS = ["stockroom-001", "verscmp-027", "b64tools-019"]
FUTURE_MESSAGE = "Fix upstream (a future commit)"
_GIT = ["git", "-c", "user.name=dev", "-c", "user.email=dev@example.com", "-c", "commit.gpgsign=false",
        "-c", "init.defaultBranch=main"]


def _git(repo: Path, *args: str, stdin: str | None = None) -> str:
    return subprocess.run([*_GIT, "-C", str(repo), *args], input=stdin, capture_output=True, text=True,
                          check=True).stdout


def build_dataset(root: Path, suite_ids: list[str]) -> list[dict]:
    """SWE-bench rows (lists as JSON strings) over git repositories under root/repos, one per suite task."""
    rows = []
    for iid in suite_ids:
        task = load_suite_task(iid)
        repo = root / "repos" / iid
        shutil.copytree(SUITE_DIR / iid / "repo", repo, ignore=shutil.ignore_patterns("__pycache__"))
        _git(repo, "init", "-q")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", "base state")
        base = _git(repo, "rev-parse", "HEAD").strip()
        _git(repo, "apply", "-", stdin=task["patch"])
        _git(repo, "apply", "-", stdin=task["test_patch"])
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", FUTURE_MESSAGE)  # HEAD now holds the fix and the hidden tests
        rows.append({
            "instance_id": f"suite__{iid}", "repo": task["repo"], "base_commit": base, "patch": task["patch"],
            "test_patch": task["test_patch"], "problem_statement": task["problem_statement"], "hints_text": "",
            "created_at": "2024-01-01T00:00:00Z", "version": "1.0", "environment_setup_commit": base,
            "FAIL_TO_PASS": json.dumps(task["FAIL_TO_PASS"]), "PASS_TO_PASS": json.dumps(task["PASS_TO_PASS"]),
            "repo_path": str(repo),
        })
    return rows


def write_jsonl(rows: list[dict], path: Path) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_parquet(rows: list[dict], path: Path) -> Path:
    """As the `datasets` library writes a split (`Dataset.to_parquet`), or pyarrow where it is absent."""
    try:
        import datasets
    except ImportError:
        import pyarrow as pa

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        datasets.Dataset.from_list(rows).to_parquet(str(path))
    return path


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """(root, rows, jsonl path, parquet path); root is listed in ARLCTL_SNAPSHOT_BASES while it lives."""
    root = tmp_path_factory.mktemp("swebench-rows")
    rows = build_dataset(root, SUITE_IDS)
    saved = os.environ.get("ARLCTL_SNAPSHOT_BASES")
    os.environ["ARLCTL_SNAPSHOT_BASES"] = str(root)
    yield root, rows, write_jsonl(rows, root / "rows.jsonl"), write_parquet(rows, root / "rows.parquet")
    if saved is None:
        os.environ.pop("ARLCTL_SNAPSHOT_BASES", None)
    else:
        os.environ["ARLCTL_SNAPSHOT_BASES"] = saved


def _row(dataset, index: int = 0, **changes) -> dict:
    row = {**dataset[1][index], **changes}
    row["task_id"] = row["instance_id"]
    return {k: v for k, v in row.items() if v is not None}


# ---- loading and snapshots -------------------------------------------------------------------------------


def test_jsonl_and_parquet_rows_load_alike(dataset):
    _, rows, jsonl, parquet = dataset
    from_jsonl, from_parquet = load_tasks(str(jsonl), env="swe"), load_tasks(str(parquet), env="swe")
    assert from_jsonl == from_parquet
    assert [t["task_id"] for t in from_jsonl] == [f"suite__{i}" for i in SUITE_IDS]
    for task, iid in zip(from_parquet, SUITE_IDS, strict=True):
        assert isinstance(task["FAIL_TO_PASS"], str)  # as the datasets store it
        assert ids_of(task, "FAIL_TO_PASS") == load_suite_task(iid)["FAIL_TO_PASS"]
        assert ids_of(task, "PASS_TO_PASS") == load_suite_task(iid)["PASS_TO_PASS"]
        check_task(task)
    as_lists = {**from_jsonl[0], "FAIL_TO_PASS": json.loads(rows[0]["FAIL_TO_PASS"])}  # lists are fine too
    assert ids_of(as_lists, "FAIL_TO_PASS") == ids_of(from_jsonl[0], "FAIL_TO_PASS")


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".git" not in p.relative_to(root).parts and "__pycache__" not in p.parts}


def test_snapshot_is_the_base_commit_without_history(dataset):
    _, rows, _, _ = dataset
    row = _row(dataset)
    repo = Path(row["repo_path"])
    assert FUTURE_MESSAGE in _git(repo, "log", "-1", "--format=%s")  # the repository stands after the fix
    (repo / "untracked_notes.txt").write_text("work in progress\n")  # not committed: never exported
    snapshot = Path(prepare_snapshot(row))
    assert snapshot.is_relative_to(Path(os.environ["ARLCTL_HOME"]))
    # Exactly the suite's buggy files: not HEAD's, not the working tree's.
    assert _files(snapshot) == _files(SUITE_DIR / "stockroom-001" / "repo")
    assert _git(snapshot, "rev-list", "--all").split() == [_git(snapshot, "rev-parse", "HEAD").strip()]
    assert _git(snapshot, "rev-parse", "HEAD").strip() != row["base_commit"]  # a fresh one-commit history
    objects = subprocess.run(["git", "-C", str(snapshot), "cat-file", "--batch-all-objects", "--batch"],
                             capture_output=True).stdout.decode("utf-8", "replace")
    # Lines the fix and the hidden tests add that the buggy files do not already hold, and the hidden names.
    buggy = b"".join(_files(SUITE_DIR / "stockroom-001" / "repo").values()).decode()
    added = [line[1:].strip() for line in (row["patch"] + row["test_patch"]).splitlines()
             if line.startswith("+") and not line.startswith("+++") and len(line.strip()) > 8]
    secrets = [line for line in added if line not in buggy] + [i.split("::")[1] for i in ids_of(row, "FAIL_TO_PASS")]
    assert len(secrets) > 5
    for secret in [*secrets, FUTURE_MESSAGE, row["base_commit"]]:
        assert secret not in objects, secret
    assert Path(prepare_snapshot(row)) == snapshot  # built once per tree id


def test_modes_and_links_survive_the_export(dataset, tmp_path):
    root = dataset[0]
    repo = root / "repos" / "modes"
    repo.mkdir()
    (repo / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (repo / "run.sh").chmod(0o755)
    (repo / "notes.txt").write_text("plain\n")
    (repo / "latest").symlink_to("notes.txt")
    (repo / ".gitattributes").write_text("notes.txt export-ignore\n*.txt filter=never-run\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    row = _row(dataset, repo_path=str(repo), base_commit=_git(repo, "rev-parse", "HEAD").strip(),
               instance_id="modes-1")
    snapshot = Path(prepare_snapshot(row))
    assert os.access(snapshot / "run.sh", os.X_OK) and not os.access(snapshot / "notes.txt", os.X_OK)
    assert (snapshot / "latest").is_symlink() and os.readlink(snapshot / "latest") == "notes.txt"
    assert (snapshot / "notes.txt").read_text() == "plain\n"  # attributes do not apply: exact blob bytes


def test_repo_path_outside_the_allowed_bases_is_refused(dataset, tmp_path):
    outside = tmp_path / "elsewhere"
    shutil.copytree(dataset[1][0]["repo_path"], outside, symlinks=True)
    with pytest.raises(SnapshotRefused, match="suite__stockroom-001.*repo_path .* outside the allowed"):
        prepare_snapshot(_row(dataset, repo_path=str(outside)))


def _bad_rows(dataset) -> dict[str, tuple[dict, str]]:
    root = dataset[0]
    plain_dir = root / "not-a-repo"
    plain_dir.mkdir(exist_ok=True)
    return {
        "f2p-not-json": (_row(dataset, FAIL_TO_PASS='["tests/a.py::t"'), "FAIL_TO_PASS is not valid JSON"),
        "f2p-not-a-list": (_row(dataset, FAIL_TO_PASS='{"tests/a.py::t": 1}'), "must be a list of test id"),
        "p2p-not-strings": (_row(dataset, PASS_TO_PASS="[1, 2]"), "PASS_TO_PASS must be a list"),
        "f2p-empty": (_row(dataset, FAIL_TO_PASS="[]"), "has no FAIL_TO_PASS tests"),
        "f2p-option": (_row(dataset, FAIL_TO_PASS='["-p evil.py::t"]'), "is not a pytest node id"),
        "f2p-escape": (_row(dataset, FAIL_TO_PASS='["../outside.py::t"]'), "is not a pytest node id"),
        "f2p-django-style": (_row(dataset, FAIL_TO_PASS='["test_x (app.tests.T)"]'), "is not a pytest node id"),
        "no-base-commit": (_row(dataset, base_commit=None), "has repo_path but no usable base_commit"),
        "option-base-commit": (_row(dataset, base_commit="--output=/tmp/x"), "no usable base_commit"),
        "unknown-base-commit": (_row(dataset, base_commit="0" * 40), f"has no commit '{'0' * 40}'"),
        "not-a-repository": (_row(dataset, repo_path=str(plain_dir)), "is not a usable git repository"),
        "inside-another-repository": (_row(dataset, repo_path=str(Path(dataset[1][0]["repo_path"]) / "tests")),
                                      "is not a git repository of its own"),
        "unknown-parser": (_row(dataset, log_parser="junit"), "unknown log_parser 'junit'"),
        "patch-not-text": (_row(dataset, test_patch=["diff"]), "test_patch must be a diff string"),
    }


def test_bad_rows_are_refused_naming_the_row(dataset):
    """Each bad row is a BadTaskRow naming it: a row-level TerminalError (the rollout ends that row as
    env_error, the reward stage scores it null with the cause), not a UsageError that stops the stage."""
    for name, (row, reason) in _bad_rows(dataset).items():
        with pytest.raises(BadTaskRow) as err:
            prepare_snapshot(row)
        assert reason in str(err.value) and "suite__stockroom-001" in str(err.value), (name, str(err.value))
        assert isinstance(err.value, TerminalError) and not isinstance(err.value, UsageError)
        assert "\n" not in str(err.value)
    # The grader refuses it before any sandbox starts (here: no sandbox backend would even be valid).
    row, _ = _bad_rows(dataset)["f2p-not-json"]
    with pytest.raises(BadTaskRow, match="FAIL_TO_PASS is not valid JSON"):
        run(score("", row, sandbox="no-such-backend"))


def test_unsafe_paths_in_the_base_tree_are_refused(dataset):
    """git mktree accepts `.git` and `..` entries; a checkout would refuse them, and so does the export."""
    repo = dataset[0] / "repos" / "crafted"
    repo.mkdir()
    _git(repo, "init", "-q")
    blob = _git(repo, "hash-object", "-w", "--stdin", stdin="x = 1\n").strip()
    inner = _git(repo, "mktree", stdin=f"100644 blob {blob}\tconfig\n").strip()
    for name in (".git", "..", ".GIT"):
        tree = _git(repo, "mktree", stdin=f"100644 blob {blob}\tok.py\n040000 tree {inner}\t{name}\n").strip()
        commit = _git(repo, "commit-tree", tree, "-m", "crafted").strip()
        row = _row(dataset, repo_path=str(repo), base_commit=commit, instance_id=f"crafted{name}")
        with pytest.raises(BadTaskRow, match="unsafe path"):
            prepare_snapshot(row)


# ---- grading: gold, empty, the log cross-check, a forged log --------------------------------------------


@pytest.mark.slow
def test_gold_and_empty_patches_with_the_log_cross_check(dataset, bwrap):
    row = _row(dataset)
    gold, components, info = run(grade(row, row["patch"], bwrap))
    assert gold == 1.0 and info["mode"] == "inprocess" and info["records_authentic"] and not info["trusted"], info
    check = info["swebench"]
    assert (check["signed_resolution"], check["log_resolution"], check["agree"]) == ("RESOLVED_FULL",) * 2 + (True,)
    assert set(check["log_statuses"].values()) == {"PASSED"} and check["disagree"] == []
    assert info["log_disagrees"] is False
    empty, components, info = run(grade(row, "", bwrap))
    assert empty == 0.0 and components["f2p"] == 0.0 and components["p2p"] == 1.0
    check = info["swebench"]
    assert (check["signed_resolution"], check["log_resolution"]) == ("RESOLVED_NO", "RESOLVED_NO")
    f2p = ids_of(row, "FAIL_TO_PASS")
    assert {i: check["log_statuses"][i] for i in f2p} == dict.fromkeys(f2p, "FAILED")


def test_a_forged_log_line_does_not_flip_the_reward(dataset, bwrap):
    """Package code prints `PASSED <id>` for every FAIL_TO_PASS test at exit (after pytest's summary, with a
    decoy FAILED line so SWE-bench's exit-code check does not catch it). SWE-bench's own log grading is
    fooled; the signed records are not, so the reward stays 0 and the disagreement is flagged. The static
    scan is off so the signed records stand on their own (with it on, `import atexit` is refused first)."""
    from swebench.harness.grading import get_eval_tests_report, get_logs_eval, get_resolution_status
    from swebench.harness.log_parsers.python import parse_log_pytest  # noqa: F401  (the parser named below)

    row = _row(dataset)
    f2p, p2p = ids_of(row, "FAIL_TO_PASS"), ids_of(row, "PASS_TO_PASS")
    forge = ("\nimport atexit\n\n\ndef _forge():\n    print('FAILED tests/decoy.py::test_decoy')\n"
             + "".join(f"    print('PASSED {nodeid}')\n" for nodeid in f2p) + "\n\natexit.register(_forge)\n")
    diff = make_diff(row, {"stockroom/__init__.py": lambda text: text + forge})
    value, components, info = run(grade(row, diff, bwrap, scan=False))
    assert value == 0.0 and components["f2p"] == 0.0 and info["records_authentic"] and info["exit_code"] == 1
    assert {i: info["outcomes"][i] for i in f2p} == dict.fromkeys(f2p, "failed")  # the signed truth
    check = info["swebench"]
    assert (check["signed_resolution"], check["log_resolution"]) == ("RESOLVED_NO", "RESOLVED_FULL")
    assert info["log_disagrees"] is True and sorted(check["log_claims_pass"]) == sorted(f2p)
    # What SWE-bench's harness concludes from the same lines in its eval log: resolved (it was fooled).
    lines = {i: check["log_statuses"][i] for i in f2p + p2p}
    log = "".join(f"{status} {nodeid}\n" for nodeid, status in lines.items()) + "FAILED tests/decoy.py::test_decoy\n"
    eval_log = dataset[0] / "forged-eval.log"
    eval_log.write_text(f"+ : '>>>>> Start Test Output'\n{log}+ : '>>>>> End Test Output'\n>>>>> Test Exit Code: 1\n")
    statuses, found = get_logs_eval(type("Spec", (), {"log_parser": "parse_log_pytest"})(), str(eval_log))
    report = get_eval_tests_report(statuses, {"FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p})
    assert found and get_resolution_status(report) == "RESOLVED_FULL"
    # With the scan on (the default), the forging code never runs: tamper, reward 0, no log at all.
    value, _, info = run(grade(row, diff, bwrap))
    assert value == 0.0 and info["tamper"] and "swebench" not in info


EXTRA_TESTS = """import pytest


@pytest.mark.xfail(reason="known bug")
def test_expected_failure():
    assert False


@pytest.mark.xfail(reason="fixed already")
def test_unexpected_pass():
    pass


@pytest.mark.skip(reason="not on this platform")
def test_skipped():
    pass
"""
EXTRA = "tests/test_extra_outcomes.py"


def _with_extra_tests(row: dict, pass_to_pass: list[str]) -> dict:
    """The row with a hidden test file of xfail / xpass / skip tests, some of them listed in PASS_TO_PASS."""
    body = EXTRA_TESTS.splitlines(keepends=True)
    patch = (f"diff --git a/{EXTRA} b/{EXTRA}\nnew file mode 100644\n--- /dev/null\n+++ b/{EXTRA}\n"
             f"@@ -0,0 +1,{len(body)} @@\n" + "".join("+" + line for line in body))
    listed = ids_of(row, "PASS_TO_PASS") + [f"{EXTRA}::{name}" for name in pass_to_pass]
    return {**row, "test_patch": row["test_patch"] + patch, "PASS_TO_PASS": json.dumps(listed)}


@pytest.mark.slow
def test_xfail_xpass_and_skip_under_both_rules(dataset, bwrap):
    """The gold fix with an XFAIL and a skipped PASS_TO_PASS test: SWE-bench's rules resolve it from the
    signed outcomes; its -rA log has no line naming the skipped test, so the log says no; the reward,
    which counts neither as a pass, is 0. An xpass (signed "xpass", no SWE-bench status) fails both."""
    row = _with_extra_tests(_row(dataset), ["test_expected_failure", "test_skipped"])
    value, _, info = run(grade(row, row["patch"], bwrap))
    assert value == 0.0 and info["records_authentic"] and info["exit_code"] == 0
    assert info["outcomes"][f"{EXTRA}::test_expected_failure"] == "xfail"
    assert info["outcomes"][f"{EXTRA}::test_skipped"] == "skipped"
    check = info["swebench"]
    assert (check["signed_resolution"], check["log_resolution"]) == ("RESOLVED_FULL", "RESOLVED_NO")
    assert check["disagree"] == [f"{EXTRA}::test_skipped"] and check["log_claims_pass"] == []
    assert check["log_statuses"][f"{EXTRA}::test_expected_failure"] == "XFAIL"
    row = _with_extra_tests(_row(dataset), ["test_unexpected_pass"])
    value, _, info = run(grade(row, row["patch"], bwrap))
    assert value == 0.0 and info["outcomes"][f"{EXTRA}::test_unexpected_pass"] == "xpass"
    check = info["swebench"]
    assert (check["signed_resolution"], check["log_resolution"], check["agree"]) == ("RESOLVED_NO",) * 2 + (True,)
    assert check["log_statuses"][f"{EXTRA}::test_unexpected_pass"] == "missing"


def test_a_report_cut_at_the_output_cap_is_no_verdict(dataset, bwrap):
    """A sandbox whose output cap cuts the driver's report line: reward null with the cause, never 0."""
    from arlctl.envs.swe.grader import sandbox_factory

    row = _row(dataset)
    value, _, info = run(grade(row, row["patch"], sandbox_factory("bwrap", max_output_bytes=2000)))
    assert value is None and info["infra"] is True and "produced no report" in info["error"]


def _signed(records: list[dict], key: bytes) -> str:
    lines = []
    for seq, record in enumerate(records):
        record = {"seq": seq, **record}
        payload = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
        lines.append(json.dumps({**record, "mac": hmac.new(key, payload, hashlib.sha256).hexdigest()}))
    return "\n".join(lines)


def test_exit_code_one_from_an_unlisted_test_still_scores():
    """As in SWE-bench, a failing test outside FAIL_TO_PASS / PASS_TO_PASS (pytest exit 1) does not matter;
    pytest interrupted (2) or broken (3, 4) is no verdict for the listed tests, whatever they say."""
    from arlctl.envs.swe.grader import outcomes_from, score_report, verify_records

    key = b"k" * 32
    task = {"task_id": "t", "FAIL_TO_PASS": '["t.py::fix"]', "PASS_TO_PASS": '["t.py::keep"]'}
    phases = [{"kind": "report", "nodeid": nodeid, "when": when, "outcome": outcome, "tampered": False}
              for nodeid, call in (("t.py::fix", "passed"), ("t.py::keep", "passed"), ("t.py::other", "failed"))
              for when, outcome in (("setup", "passed"), ("call", call), ("teardown", "passed"))]
    for exit_code, expected in ((1, 1.0), (0, 1.0), (2, 0.0), (3, 0.0)):
        records = [{"kind": "start", "pid": 1}, *phases,
                   {"kind": "session", "exitstatus": exit_code, "hashed": [], "tampered": False}]
        report = {"apply_ok": True, "exit_code": exit_code, "results": _signed(records, key)}
        reward, _, info = score_report(task, report, key)
        assert (reward, info["records_authentic"], info["trusted"]) == (expected, True, False), exit_code
    xpass = [{"kind": "report", "nodeid": "t.py::x", "when": when, "outcome": outcome}
             for when, outcome in (("setup", "passed"), ("call", "xpass"), ("teardown", "passed"))]
    assert outcomes_from(xpass) == {"t.py::x": "xpass"}
    assert verify_records(_signed([{"kind": "start", "pid": 1}], key), key)[1] == "no session record (pytest did not finish)"


def test_oracle_empty_only_submits(tokenizer):
    from arlctl.envs.swe.oracle import load_oracle

    policy = load_oracle("oracle:empty", tokenizer)
    assert policy.name == "oracle:empty"
    assert policy.script("Repository: r (task anything-at-all)") == '<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call>'
    with pytest.raises(UsageError, match="unknown oracle policy 'oracle:silver'") as err:
        load_oracle("oracle:silver", tokenizer)
    assert "oracle:gold and oracle:empty" in str(err.value.hint)


# ---- the real CLI ---------------------------------------------------------------------------------------


def _cli(args: list[str], env: dict) -> subprocess.CompletedProcess:
    arlctl = str(Path(sys.executable).with_name("arlctl"))
    return subprocess.run([arlctl, *args], env=env, capture_output=True, text=True, timeout=600)


def _rewarded(run_dir: Path) -> dict[str, dict]:
    table = pq.read_table(run_dir / "rewarded").to_pylist()
    return {row["task_id"]: row for row in table}


@pytest.mark.integration
@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_cli_rollout_and_reward_of_swebench_rows(dataset, tmp_path, fmt):
    """`arlctl rollout --tasks rows.FMT --policy oracle:gold` then `arlctl reward`: 1.0 for every row, with a
    bad row among them ending env_error and reward null with its cause; `--policy oracle:empty`: 0.0."""
    root, rows, jsonl, parquet = dataset
    bad = {**rows[0], "instance_id": "suite__bad-row", "FAIL_TO_PASS": "[not json"}
    tasks = (write_jsonl([*rows, bad], tmp_path / "rows.jsonl") if fmt == "jsonl"
             else write_parquet([*rows, bad], tmp_path / "rows.parquet"))
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(Path(MODEL_HOME) / "models")  # the tokenizer cache, not its snapshots
    env = {**os.environ, "ARLCTL_HOME": str(home), "ARLCTL_SNAPSHOT_BASES": str(root)}
    for policy, expected in (("oracle:gold", 1.0), ("oracle:empty", 0.0)):
        run_dir = tmp_path / policy.replace(":", "-")
        rollout = _cli(["rollout", "--env", "swe", "--tasks", str(tasks), "--policy", policy, "--sandboxes", "2",
                        "--group-size", "1", "--max-top-up", "0", "--run", str(run_dir), "--quiet", "--json"], env)
        assert rollout.returncode == 0, rollout.stderr[-3000:]
        reward = _cli(["reward", "--run", str(run_dir), "--reward", "swe", "--json"], env)
        assert reward.returncode == 0, reward.stderr[-3000:]
        got = _rewarded(run_dir)
        assert sorted(got) == sorted([r["instance_id"] for r in rows] + ["suite__bad-row"])
        for row in rows:
            done = got[row["instance_id"]]
            assert (done["status"], done["finish_reason"]) == ("ok", "submit"), done["task_id"]
            info = json.loads(done["reward_info"])
            assert done["reward"] == expected, (policy, done["task_id"], info)
            assert info["swebench"]["agree"] is True
            assert info["swebench"]["signed_resolution"] == ("RESOLVED_FULL" if expected else "RESOLVED_NO")
        failed = got["suite__bad-row"]
        assert failed["status"] == "env_error" and failed["reward"] is None
        assert "FAIL_TO_PASS is not valid JSON" in json.loads(failed["reward_info"])["error"]
        summary = json.loads(reward.stdout)
        assert summary["mean_reward"] == expected, summary
