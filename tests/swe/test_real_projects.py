"""Real projects, real runners: SWE-bench-format tasks built from django's and sympy's own source releases
(recipes/swe_real_tasks.py), graded through the Docker backend with each repo's official log parser.

The recipe downloads the pinned sdists and their dependencies' wheels once (into the shared cache), injects
three bugs into each project, records FAIL_TO_PASS / PASS_TO_PASS with the project's own runner (django's
tests/runtests.py, sympy's sympy.testing.runtests) and builds one image per task on the local engine. Each
task is then graded three times: the gold patch (1.0), no patch (0.0) and a wrong fix (0.0); for every run,
reward_info.swebench must equal the swebench package's own get_eval_report on the same eval log,
computed here from the package's functions alone.
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
from arlctl.envs.swe.grader import RUNNER_CAUSE, grade, sandbox_factory

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
# The downloads are shared with later runs (read before conftest points ARLCTL_HOME at a temporary home).
CACHE = Path(os.environ.get("ARLCTL_HOME") or Path.home() / ".cache" / "arlctl") / "swe-real"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(rows by instance id, wrong fixes by instance id), from one run of the recipe."""
    from arlctl.sandbox.docker import docker_client

    try:
        docker_client().ping()
    except Exception as err:
        pytest.skip(f"no docker engine ({err}); run .ci/docker_setup.sh")
    out = tmp_path_factory.mktemp("swe-real")
    done = subprocess.run([sys.executable, str(ROOT / "recipes" / "swe_real_tasks.py"), "--out", str(out),
                           "--cache", str(CACHE), "--json"], capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["tasks"] == 6 and summary["images"] is True
    rows = {r["instance_id"]: r for r in map(json.loads, (out / "tasks.jsonl").read_text().splitlines())}
    wrong = {w["instance_id"]: w["patch"] for w in map(json.loads, (out / "wrong_fixes.jsonl").read_text().splitlines())}
    return rows, wrong


IDS = [f"{p}-arlctl-{n}" for p in ("django__django", "sympy__sympy") for n in (1, 2, 3)]
# make test grades one task of each project; the sweep tier (make test-sweeps, CI) grades the other four.
GRADED = [iid if iid.endswith("-1") else pytest.param(iid, marks=pytest.mark.sweep) for iid in IDS]


def test_the_recipe_writes_three_tasks_per_project_with_their_images(built):
    from arlctl.sandbox.docker import docker_client

    rows, wrong = built
    assert sorted(rows) == sorted(IDS) and sorted(wrong) == sorted(IDS)
    client = docker_client()
    for iid, row in rows.items():
        f2p, p2p = json.loads(row["FAIL_TO_PASS"]), json.loads(row["PASS_TO_PASS"])
        assert f2p and p2p and not set(f2p) & set(p2p), iid
        assert client.images.get(row["image"]).id  # built on this engine
        assert official.parser_for(row) == ("parse_log_django" if row["repo"] == "django/django" else "parse_log_sympy")
        if row["repo"] == "django/django":  # django's runner names a test `test_x (module.Class.test_x)`
            assert row["eval_script"] and "tests/runtests.py" in row["eval_script"] and "test_cmd" not in row
            assert all(" (utils_tests.test_text." in t for t in f2p + p2p)
        else:  # sympy's runner names a test by its function
            # No declared activation: as an image row it runs in the image's testbed env (the default).
            assert row["test_cmd"] and "activate" not in row and "eval_script" not in row
            assert all(t.startswith("test_") and "::" not in t for t in f2p + p2p)
        assert row["patch"].startswith("diff --git") and wrong[iid].startswith("diff --git") and wrong[iid] != row["patch"]
    client.close()


@pytest.mark.parametrize("iid", ["sympy__sympy-arlctl-1"])
def test_an_env_the_image_does_not_have_is_no_verdict(built, iid):
    """The row declares an activation the image cannot give (an env it lacks): the script stops before its
    tests (exit 97), so the gold patch gets no verdict, a null reward with the cause, not a 0 or a 1."""
    rows, _ = built
    row = {**rows[iid], "task_id": iid, "activate": "source /opt/miniconda3/bin/activate\nconda activate py27"}
    reward, _, info = run(grade(row, row["patch"], sandbox_factory("docker"), timeout=300))
    assert reward is None and info["infra"] is True, info
    assert "stopped before its tests started (exit 97)" in info["error"], info["error"]


def _package_report(row: dict, log: str, where: Path) -> dict:
    """The package's verdict on the eval log: its TestSpec from the row (make_test_spec) and its get_eval_report."""
    from swebench.harness.grading import get_eval_report
    from swebench.harness.utils import make_test_spec

    instance = {**row, "eval_script": row.get("eval_script") or "#!/bin/bash\n: '>>>>> End Test Output'\n"}
    spec = make_test_spec(instance)
    path = where / f"{row['instance_id']}.log"
    path.write_text(log, encoding="utf-8")
    prediction = {"instance_id": row["instance_id"], "model_name_or_path": "arlctl", "model_patch": "diff"}
    return get_eval_report(spec, prediction, str(path), include_tests_status=True)[row["instance_id"]]


@pytest.mark.parametrize("iid", GRADED)
def test_gold_empty_and_a_wrong_fix_as_the_official_harness_grades_them(built, iid, tmp_path):
    rows, wrong = built
    row = {**rows[iid], "task_id": iid}
    factory = sandbox_factory("docker")
    for name, diff, expected in (("gold", row["patch"], 1.0), ("empty", "", 0.0), ("wrong", wrong[iid], 0.0)):
        reward, components, info = run(grade(row, diff, factory, timeout=300, keep_log=True))
        assert reward == expected, (name, info.get("error"), info.get("log_tail", "")[-1500:])
        assert info["mode"] == "runner" and info["trusted"] is False and info["untrusted_cause"] == RUNNER_CAUSE
        verdict, log = info["swebench"], info["runner_log"]
        assert verdict["parser"] == official.parser_for(row) and verdict["log_found"] and not verdict["log_truncated"]
        assert ">>>>> Start Test Output" in log and ">>>>> Test Exit Code: " in log  # the package's framing
        # Run in the image's testbed env, entered as SWE-bench images are (bash -x echoes the command): the
        # dependencies are only there, so a gold 1.0 also shows it was entered.
        assert "conda activate testbed" in log.split(">>>>> Start Test Output")[0], log[:2000]
        theirs = _package_report(row, log, tmp_path)
        assert theirs["patch_successfully_applied"] is True
        assert verdict["tests_status"] == theirs["tests_status"], name
        assert verdict["resolved"] is theirs["resolved"] is (expected == 1.0), name
        f2p = json.loads(row["FAIL_TO_PASS"])
        if name == "gold":
            assert info["failed"] == [] and components["f2p"] == components["p2p"] == 1.0
        else:  # a FAIL_TO_PASS test still fails, and the PASS_TO_PASS tests still pass
            assert set(f2p) & set(info["failed"]) and components["f2p"] < 1.0 and components["p2p"] == 1.0, name
