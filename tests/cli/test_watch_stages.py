"""`--watch` daemons of filter, train and sync: each, started in its own process with --poll 0.5,
processes input that arrives while it runs, and exits 0 on SIGTERM leaving nothing partial.

(reward's daemon test lives in test_reward_cron.py; rollout's in tests/stages/test_rollout_daemon.py.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from arlctl.io.ledger import consumed_inputs
from arlctl.io.shards import Lineage, list_shards, read_shard, write_shard
from arlctl.models import tiny_model_dir
from arlctl.synthetic import synthetic_table

# A daemon in its own process, stopped by a real SIGTERM: e2e (make test runs it, the default tier does not).
pytestmark = pytest.mark.e2e

ARLCTL = [sys.executable, "-m", "arlctl.cli.main"]


def daemon(*args: str) -> subprocess.Popen:
    return subprocess.Popen([*ARLCTL, *args, "--watch", "--poll", "0.5"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for(predicate, proc: subprocess.Popen, what: str, timeout: float = 180.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            raise AssertionError(f"daemon exited {proc.returncode} waiting for {what}: {proc.stderr.read()[-2000:]}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def stop(proc: subprocess.Popen) -> tuple[str, str]:
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    return stdout, stderr


def hidden_leftovers(directory: str | Path) -> list[str]:
    return [n for n in os.listdir(directory) if n.startswith(".")]


def write_rewarded(directory: Path, index: int, groups: int = 4) -> str:
    table = synthetic_table(groups, 2, seed=100 + index, envs=("first-token",), rewarded=True, mean_turns=1,
                            tokens_per_turn=8)
    return write_shard(table, str(directory / f"part-{index:03d}.parquet"), Lineage(stage="reward"))


def make_batches(root: Path, start: int, n: int) -> str:
    """n batch shards through the real filter (one group of 2 rows each), as a filter daemon would write."""
    from arlctl.stages.configs import FilterConfig
    from arlctl.stages.filter import run_filter

    rewarded, batches = root / "rewarded", root / "batches"
    for i in range(start, start + n):
        write_rewarded(rewarded, i, groups=1)
    cfg = FilterConfig(batch_groups=1, keep_uniform=1.0, adv="batch", keep_status=["ok", "truncated", "timeout",
                                                                                    "env_error", "policy_error",
                                                                                    "aborted"])
    run_filter(str(rewarded), str(batches), cfg, 0)
    return str(batches)


def test_filter_watch_batches_new_rewarded_shards(tmp_path):
    rewarded, batches = tmp_path / "rewarded", tmp_path / "batches"
    write_rewarded(rewarded, 0)
    proc = daemon("filter", "--in", str(rewarded), "--out", str(batches), "--metrics", str(tmp_path / "metrics"),
                  "--batch-groups", "1", "--keep-uniform", "1", "--adv", "batch", "--current-version", "0")
    try:
        wait_for(lambda: consumed_inputs(str(batches)) == {"part-000.parquet"}, proc, "the first input")
        first = set(list_shards(str(batches)))
        assert first
        for i in (1, 2):  # new work arrives while it runs
            write_rewarded(rewarded, i)
        wait_for(lambda: len(consumed_inputs(str(batches))) == 3, proc, "the new inputs")
    finally:
        stop(proc) if proc.poll() is None else None
    shards = list_shards(str(batches))
    assert set(shards) > first
    ids = [i for s in shards for i in read_shard(s).column("trajectory_id").to_pylist()]
    assert len(ids) == len(set(ids))  # no trajectory in two batches
    assert not [n for n in hidden_leftovers(batches) if n.endswith(".tmp")]


def test_train_watch_trains_new_batches_and_stops_between_steps(tmp_path):
    batches = make_batches(tmp_path, 0, 1)
    ckpts = tmp_path / "checkpoints"
    proc = daemon("train", "--in", batches, "--out", str(ckpts), "--policy", str(tiny_model_dir()),
                  "--metrics", str(tmp_path / "metrics"), "--lr", "1e-4")
    try:
        wait_for(lambda: (ckpts / "step-000001" / "state.json").is_file(), proc, "step 1")
        make_batches(tmp_path, 1, 2)
        wait_for(lambda: (ckpts / "step-000003" / "state.json").is_file(), proc, "steps 2-3")
    finally:
        stop(proc) if proc.poll() is None else None
    state = json.loads((ckpts / "step-000003" / "state.json").read_text())
    assert state["step"] == 3
    assert sorted(state["consumed_batches"]) == sorted(os.path.basename(s) for s in list_shards(batches))
    assert all((d / "state.json").is_file() for d in ckpts.iterdir() if d.name.startswith("step-"))
    assert not hidden_leftovers(ckpts)  # no half-built checkpoint directory


def test_sync_watch_publishes_each_new_checkpoint(tmp_path):
    from arlctl.rl.config import TrainConfig
    from arlctl.stages.train import train

    batches = make_batches(tmp_path, 0, 2)
    ckpts, policy = str(tmp_path / "checkpoints"), tmp_path / "policy"
    train(batches, str(tiny_model_dir()), ckpts, TrainConfig(lr=1e-4, max_steps=1))
    proc = daemon("sync", "--ckpt", ckpts, "--policy-dir", str(policy))
    try:
        wait_for(lambda: (policy / "LATEST").is_file() and (policy / "LATEST").read_text().strip() == "v000001",
                 proc, "v1")
        train(batches, str(tiny_model_dir()), ckpts, TrainConfig(lr=1e-4, max_steps=1))  # the trainer moves on
        wait_for(lambda: (policy / "LATEST").read_text().strip() == "v000002", proc, "v2")
    finally:
        _, stderr = stop(proc) if proc.poll() is None else ("", "")
    assert "published v000002" in stderr.replace("[bold]", "")
    for version in (1, 2):
        info = json.loads((policy / f"v{version:06d}" / "version.json").read_text())
        assert info["version"] == version and (policy / f"v{version:06d}" / "model.safetensors").is_file()
    assert not hidden_leftovers(policy)
