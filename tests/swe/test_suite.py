"""The built-in swe suite: enough genuine, distinct tasks; loaders; snapshots that leak nothing."""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from arlctl.envs.swe.build_suite import SPEC_DIR, parse_specs
from arlctl.envs.swe.diffs import paths_in
from arlctl.envs.swe.tasks import SUITE_DIR, builtin_swe, load_suite_task, prepare_snapshot, suite_ids
from arlctl.envs.tasks import load_tasks
from arlctl.errors import UsageError

FIELDS = {"instance_id", "repo", "problem_statement", "FAIL_TO_PASS", "PASS_TO_PASS", "test_patch", "patch",
          "version", "hints_text"}


def test_suite_size_and_fields():
    ids = suite_ids()
    assert len(ids) >= 40
    packages, kinds = set(), set()
    for iid in ids:
        task = load_suite_task(iid)
        assert set(task) >= FIELDS, iid
        assert task["task_id"] == iid and task["env"] == "swe"
        assert task["FAIL_TO_PASS"], iid
        assert not set(task["FAIL_TO_PASS"]) & set(task["PASS_TO_PASS"]), iid
        assert task["hints_text"] == ""
        packages.add(task["repo"])
        kinds.add(task["bug_kind"])
        # a package with several modules and a visible tests/ directory
        repo = SUITE_DIR / iid / "repo"
        package = repo / task["repo"].split("/")[-1]
        assert len(list(package.glob("*.py"))) >= 3, iid
        assert list((repo / "tests").glob("test_*.py")), iid
    assert len(packages) == len(ids)  # one domain per task
    assert len(kinds) >= 25


def test_patches_touch_only_source_and_tests_only_tests():
    for iid in suite_ids():
        task = load_suite_task(iid)
        gold_paths = paths_in(task["patch"])
        assert gold_paths and all(not p.startswith("tests/") for p in gold_paths), iid
        assert all(p.startswith("tests/") for p in paths_in(task["test_patch"])), iid
        for node in task["FAIL_TO_PASS"]:
            assert node.split("::")[0] in paths_in(task["test_patch"]), (iid, node)


def test_problem_statement_does_not_give_the_fix():
    for iid in suite_ids():
        task = load_suite_task(iid)
        added = [line[1:].strip() for line in task["patch"].splitlines()
                 if line.startswith("+") and not line.startswith("+++") and len(line.strip()) > 12]
        for line in added:
            assert line not in task["problem_statement"], (iid, line)


def test_specs_and_suite_agree():
    specs = [t for f in sorted(SPEC_DIR.glob("*.spec")) for t in parse_specs(f.read_text())]
    assert sorted(s["instance_id"] for s in specs) == suite_ids()
    for spec in specs:
        repo = SUITE_DIR / spec["instance_id"] / "repo"
        for rel, content in spec["files"].items():
            assert (repo / rel).read_text() == content, (spec["instance_id"], rel)


def test_builtin_options():
    assert len(load_tasks("builtin:swe", env="swe")) == len(suite_ids())
    two = load_tasks("builtin:swe?n=2&start=3", env="swe")
    assert [t["task_id"] for t in two] == suite_ids()[3:5]
    picked = builtin_swe({"ids": "leapcal-031,stockroom-001"})
    assert [t["task_id"] for t in picked] == ["leapcal-031", "stockroom-001"]
    with pytest.raises(UsageError):
        load_tasks("builtin:swe?bogus=1", env="swe")
    with pytest.raises(UsageError):
        builtin_swe({"ids": "nope-999"})


def test_jsonl_tasks_with_dir_and_tarball_snapshots(tmp_path, monkeypatch):
    monkeypatch.setenv("ARLCTL_SNAPSHOT_BASES", str(tmp_path))  # a task file may only name allowed bases
    task = load_suite_task("stockroom-001")
    repo = SUITE_DIR / "stockroom-001" / "repo"
    tarball = tmp_path / "repo.tar.gz"
    with tarfile.open(tarball, "w:gz") as archive:
        archive.add(repo, arcname="stockroom")
    lines = []
    for n, snapshot in enumerate([str(repo), str(tarball)]):
        row = {k: task[k] for k in FIELDS}
        row["instance_id"] = f"custom-{n}"
        row["repo_snapshot"] = snapshot
        lines.append(json.dumps(row))
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(lines) + "\n")
    loaded = load_tasks(str(path), env="swe")
    assert [t["task_id"] for t in loaded] == ["custom-0", "custom-1"]
    snaps = [Path(prepare_snapshot(t)) for t in loaded]
    for snap in snaps:
        assert (snap / "stockroom" / "reorder.py").read_text() == (repo / "stockroom" / "reorder.py").read_text()
    # same content, same commit: the snapshot is deterministic
    heads = {subprocess.run(["git", "-C", str(s), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
             for s in snaps}
    assert len(heads) == 1


def _git(snapshot: str, *args: str) -> str:
    out = subprocess.run(["git", "-C", snapshot, *args], capture_output=True, check=True).stdout
    return out.decode("utf-8", "replace")  # tree objects are binary


def test_snapshots_hold_no_future():
    """One commit, the buggy state; no gold patch line and no hidden test anywhere in files or objects."""
    for iid in suite_ids():
        task = load_suite_task(iid)
        snapshot = prepare_snapshot(task)
        assert _git(snapshot, "rev-list", "--all").split() == [_git(snapshot, "rev-parse", "HEAD").strip()]
        assert _git(snapshot, "status", "--porcelain") == ""
        objects = _git(snapshot, "cat-file", "--batch-all-objects", "--batch")
        files = "\n".join(p.read_text() for p in Path(snapshot).rglob("*") if p.is_file() and ".git" not in p.parts)
        secrets = [line[1:] for line in task["patch"].splitlines() if line.startswith("+") and not line.startswith("+++")
                   and line[1:].strip() and line[1:] not in files]
        secrets += [n.split("::")[1] for n in task["FAIL_TO_PASS"]]
        assert secrets, iid
        for secret in secrets:
            assert secret not in objects and secret not in files, (iid, secret)
        for rel in paths_in(task["test_patch"]):
            assert not (Path(snapshot) / rel).exists(), (iid, rel)
