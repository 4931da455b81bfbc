"""`arlctl rollout --watch`: epochs over the tasks, policy reloads at turn boundaries, clean SIGTERM.

The tiny model; the epochs run in process, the SIGTERM test is a real process (e2e). A "new policy version" is the tiny model copied into RUN/policy as
v000001 with a version.json, laid out the way `arlctl sync` publishes (stages/sync.py): the weights are
the same, the version the backend records per turn is what the test follows.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from inprocess import arlctl

from arlctl.io.lock import RunLock
from arlctl.io.shards import list_shards, read_shard
from arlctl.models import tiny_model_dir

ARLCTL = [sys.executable, "-m", "arlctl.cli.main"]


def publish(policy_dir: Path, version: int) -> None:
    """Publish the tiny model as vNNNNNN the way sync does: build hidden, rename, then replace LATEST."""
    name = f"v{version:06d}"
    tmp = policy_dir / f".{name}.tmp"
    shutil.copytree(tiny_model_dir(), tmp)
    (tmp / "version.json").write_text(json.dumps({"version": version, "step": version}))
    os.replace(tmp, policy_dir / name)
    (policy_dir / ".LATEST.tmp").write_text(name + "\n")
    os.replace(policy_dir / ".LATEST.tmp", policy_dir / "LATEST")


def rows_of(out: str, columns: list[str]) -> list[dict]:
    return [r for s in list_shards(out) for r in read_shard(s).select(columns).to_pylist()]


def no_partial_files(out: str) -> bool:
    return not [f for f in os.listdir(out) if f.startswith(".") and f.endswith(".tmp")]


def test_max_epochs_runs_every_task_once_per_epoch_with_different_samples(tmp_path):
    run = str(tmp_path / "run")
    command = ["rollout", "--watch", "--max-epochs", "2", "--env", "first-token",
               "--tasks", "builtin:first-token?n=3&seed=0", "--policy", "tiny", "--run", run, "-G", "2",
               "--max-new-tokens", "6", "--seed", "0", "--flush-groups", "1", "--poll", "0.5", "--json", "-q"]
    with RunLock(f"{run}/rollouts", "rollout"):  # another rollout daemon holds the output
        busy = arlctl(*command)
    assert busy.returncode == 75 and "another `arlctl rollout` holds" in busy.stderr
    assert list_shards(f"{run}/rollouts") == []
    result = arlctl(*command)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["epochs"] == 2 and summary["groups"] == 6 and summary["rows_written"] == 12
    rows = rows_of(f"{run}/rollouts", ["task_id", "group_id", "sample_index", "response_ids", "status"])
    groups_per_task = Counter(task for task, _ in {(r["task_id"], r["group_id"]) for r in rows})
    assert groups_per_task == {"ft-0-0": 2, "ft-0-1": 2, "ft-0-2": 2}  # every task once per epoch
    assert all(r["status"] in ("ok", "truncated") for r in rows)  # truncated: a reply the 6-token budget cut
    # Epoch 1 is seeded differently from epoch 0: the same (task, sample) does not repeat its reply.
    by_key: dict[tuple, list] = {}
    for r in rows:
        by_key.setdefault((r["task_id"], r["sample_index"]), []).append(tuple(r["response_ids"]))
    assert all(len(v) == 2 for v in by_key.values())
    assert any(a != b for a, b in by_key.values())
    # The run lock was taken on the output and released.
    assert os.path.isdir(f"{run}/rollouts/_locks") and no_partial_files(f"{run}/rollouts")


@pytest.mark.e2e
def test_reloads_a_new_version_at_turn_boundaries_and_stops_cleanly_on_sigterm(tmp_path):
    run = tmp_path / "run"
    policy_dir = run / "policy"
    policy_dir.mkdir(parents=True)
    publish(policy_dir, 0)
    out = str(run / "rollouts")
    proc = subprocess.Popen(
        [*ARLCTL, "rollout", "--watch", "--env", "math", "--tasks", "builtin:math?n=50&seed=3",
         "--policy", str(policy_dir), "--run", str(run), "-G", "2", "-c", "4", "--max-turns", "3",
         "--max-new-tokens", "8", "--seed", "0", "--flush-groups", "1", "--poll", "0.2", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and not list_shards(out):
            time.sleep(0.2)
        assert list_shards(out), "no shard before the new version was published"
        publish(policy_dir, 1)
        while time.time() < deadline and not any(  # a committed trajectory with a turn on v1
                r["policy_version_last"] == 1 for r in rows_of(out, ["policy_version_last"])):
            time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    summary = json.loads(stdout)
    assert summary["interrupted"] is True and summary["reloads"] == 1 and summary["policy_version"] == 1
    assert "policy reloaded: v0 -> v1" in stderr

    rows = rows_of(out, ["group_id", "status", "policy_version", "policy_version_last", "turns"])
    assert len(rows) == summary["rows_written"]
    assert all(c == 2 for c in Counter(r["group_id"] for r in rows).values())  # only whole groups
    assert no_partial_files(out)
    spanning = 0
    for r in rows:
        versions = [t["policy_version"] for t in r["turns"]]
        if not versions:
            continue
        assert versions == sorted(versions), versions  # a trajectory's versions never decrease
        assert r["policy_version"] == versions[0] and r["policy_version_last"] == versions[-1]
        spanning += versions[0] != versions[-1]
    turn_versions = Counter(t["policy_version"] for r in rows for t in r["turns"])
    assert set(turn_versions) == {0, 1} and turn_versions[1] > 0
    # Groups finish in any order, but none that started on v1 ever went back to v0.
    assert all(r["policy_version_last"] == 1 for r in rows if r["policy_version"] == 1)
    print(f"turns per version {dict(turn_versions)}; trajectories spanning both versions: {spanning}")
