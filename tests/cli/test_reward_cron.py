"""`arlctl reward` as cron and daemons run it: a run lock, worker shares, and --watch with SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from inprocess import arlctl

from arlctl.io.lock import RunLock
from arlctl.io.shards import Lineage, list_shards, read_shard, write_shard
from arlctl.synthetic import synthetic_table

ARLCTL = [sys.executable, "-m", "arlctl.cli.main"]


def make_rollouts(directory, n):
    for i in range(n):
        table = synthetic_table(2, 2, seed=i, envs=("first-token",), rewarded=False, mean_turns=2, tokens_per_turn=20)
        write_shard(table, os.path.join(directory, f"part-{i:03d}.parquet"), Lineage(stage="rollout"))


def reward(*args):
    """`arlctl reward` in its own process: for the tests where copies overlap in time."""
    return subprocess.run([*ARLCTL, "reward", "--reward", "first-token", "--json", *args],
                          capture_output=True, text=True, timeout=300)


def reward_in_process(*args):
    return arlctl("reward", "--reward", "first-token", "--json", *args)


def outputs(directory):
    return {os.path.basename(p): read_shard(p).column("reward").to_pylist() for p in list_shards(directory)}


@pytest.mark.e2e
def test_overlapping_cron_runs_wait_or_exit_and_match_a_single_run(tmp_path):
    rollouts, out, single = str(tmp_path / "rollouts"), str(tmp_path / "rewarded"), str(tmp_path / "single")
    make_rollouts(rollouts, 4)
    assert reward("--in", rollouts, "--out", single).returncode == 0

    with RunLock(out, "reward"):  # another copy is running
        busy = reward("--in", rollouts, "--out", out)
        assert busy.returncode == 75
        assert "another `arlctl reward` holds" in busy.stderr and "--lock-wait" in busy.stderr
        assert list_shards(out) == []
        # a copy told to wait queues behind the holder and runs once it is gone
        waiting = subprocess.Popen([*ARLCTL, "reward", "--reward", "first-token", "--in", rollouts, "--out", out,
                                    "--lock-wait", "60", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
        time.sleep(2)
        assert waiting.poll() is None
    stdout, _ = waiting.communicate(timeout=120)
    assert waiting.returncode == 0 and json.loads(stdout)["rows"] == 16
    again = reward("--in", rollouts, "--out", out)  # the next cron tick has nothing left to do
    assert again.returncode == 0 and json.loads(again.stdout)["skipped_consumed"] == 4
    assert outputs(out) == outputs(single)


def test_workers_split_the_inputs_without_overlap(tmp_path):
    rollouts, out = str(tmp_path / "rollouts"), str(tmp_path / "rewarded")
    make_rollouts(rollouts, 12)
    done = []
    for worker in ("0/3", "1/3", "2/3"):
        result = reward_in_process("--in", rollouts, "--out", out, "--worker", worker)
        assert result.returncode == 0, result.stderr
        done.append({os.path.basename(p) for p in json.loads(result.stdout)["written"]})
    assert sum(len(d) for d in done) == 12 and len(set().union(*done)) == 12
    assert reward_in_process("--in", rollouts, "--out", out, "--worker", "3/3").returncode == 2


@pytest.mark.e2e
def test_watch_rewards_new_shards_and_stops_cleanly_on_sigterm(tmp_path):
    rollouts, out = str(tmp_path / "rollouts"), str(tmp_path / "rewarded")
    make_rollouts(rollouts, 1)
    proc = subprocess.Popen([*ARLCTL, "reward", "--reward", "first-token", "--in", rollouts, "--out", out,
                             "--watch", "--poll", "0.2", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.time() + 120

    def wait_for(n):
        while time.time() < deadline and len(list_shards(out)) < n:
            time.sleep(0.1)
        return len(list_shards(out))

    assert wait_for(1) == 1
    threading.Thread(target=make_rollouts, args=(rollouts, 3)).start()  # new work arrives
    assert wait_for(3) == 3
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert json.loads(stdout)["shards_written"] == 3
    assert not [f for f in os.listdir(out) if f.startswith(".") and f.endswith(".tmp")]
