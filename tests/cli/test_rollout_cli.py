"""`arlctl rollout` and `arlctl reward` as a user runs them, the tiny model: in process, except Ctrl-C, which
needs a real signal to a real process (e2e)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pyarrow.compute as pc
import pytest
from inprocess import arlctl

from arlctl.io.shards import list_shards, read_shard

ARLCTL = [sys.executable, "-m", "arlctl.cli.main"]


@pytest.mark.slow
def test_rollout_then_reward_then_inspect(tmp_path):
    run = str(tmp_path / "run")
    result = arlctl("rollout", "--env", "math", "--tasks", "builtin:math?n=4&seed=0", "--policy", "tiny",
                    "--run", run, "-G", "2", "--max-turns", "2", "--max-new-tokens", "12", "--seed", "0",
                    "--flush-groups", "2", "--json", "-q")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["trajectories"] == 8 and summary["groups"] == 4 and summary["shards_written"] == 2
    shards = list_shards(f"{run}/rollouts")
    assert len(shards) == 2
    # one metrics row per invocation in RUN/metrics, with the backend's own counters
    import pyarrow.parquet as pq

    metrics = pq.read_table(summary["metrics"]).to_pylist()[0]
    assert summary["metrics"].startswith(f"{run}/metrics/rollout-")
    assert metrics["trajectories"] == 8 and metrics["backend_generated_tokens"] == summary["generated_tokens"]
    assert 0.0 <= metrics["backend_idle_ratio"] <= 1.0 and metrics["backend_tokens_per_s"] > 0
    for shard in shards:
        table = read_shard(shard)
        counts = pc.value_counts(table.column("group_id")).to_pylist()
        assert all(c["counts"] == 2 for c in counts)  # a group is never split across shards

    result = arlctl("reward", "--run", run, "--reward", "math", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["rows"] == 8
    result = arlctl("reward", "--run", run, "--reward", "math", "--json")
    assert json.loads(result.stdout)["skipped_consumed"] == 2

    result = arlctl("inspect", f"{run}/rewarded", "--json")
    stats = json.loads(result.stdout)
    assert stats["rows"] == 8 and stats["reward"]["n"] == 8


@pytest.mark.slow
def test_backend_options_reach_the_backend_and_typos_are_usage_errors(tmp_path):
    base = ["rollout", "--env", "math", "--tasks", "builtin:math?n=1", "--policy", "tiny", "--out", str(tmp_path / "o")]
    bad_value = arlctl(*base, "--backend-opt", "dtype=float64")  # reaches HFPolicy, which rejects the dtype
    assert bad_value.returncode == 2 and "unknown dtype 'float64'" in bad_value.stderr
    typo = arlctl(*base, "--backend-opt", "max_bacth=2")
    assert typo.returncode == 2 and "no option 'max_bacth'" in typo.stderr and "max_batch" in typo.stderr
    malformed = arlctl(*base, "--backend-opt", "enforce_eager")
    assert malformed.returncode == 2 and "--backend-opt expects KEY=VALUE" in malformed.stderr
    ok = arlctl(*base, "--backend-opt", "max_batch_tokens=4096", "-G", "2", "--max-new-tokens", "4", "--json", "-q")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["trajectories"] == 2


def test_rollout_dry_run_writes_nothing(tmp_path):
    result = arlctl("rollout", "--env", "math", "--tasks", "builtin:math?n=2", "--policy", "tiny",
                    "--out", str(tmp_path / "out"), "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "calculator" in result.stderr and "first prompt" in result.stderr
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.e2e
def test_ctrl_c_flushes_completed_and_aborts_in_flight(tmp_path):
    out = str(tmp_path / "out")
    proc = subprocess.Popen([*ARLCTL, "rollout", "--env", "math", "--tasks", "builtin:math?n=400&seed=1",
                             "--policy", "tiny", "--out", out, "-G", "2", "-c", "8", "--max-turns", "4",
                             "--max-new-tokens", "16", "--flush-groups", "1", "--json", "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and not list_shards(out):
        time.sleep(0.2)
    assert list_shards(out), "no shard was written before the interrupt"
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    summary = json.loads(stdout)
    assert summary["interrupted"] is True and summary["groups"] < 400
    rows = [r for s in list_shards(out) for r in read_shard(s).select(["group_id", "status"]).to_pylist()]
    assert len(rows) == summary["rows_written"] == 2 * summary["groups"]
    groups = {}
    for r in rows:
        groups.setdefault(r["group_id"], []).append(r["status"])
    assert all(len(v) == 2 for v in groups.values())
    assert any("aborted" in v for v in groups.values())
    assert not [f for f in os.listdir(out) if f.startswith(".")]  # no temp file left behind


@pytest.mark.slow
def test_rollout_with_run_reads_its_fleet_file_and_without_one_says_so(tmp_path):
    """`--backend openai --run RUN` without --server takes its engines from RUN/fleet.json (`arlctl fleet add`);
    with no fleet file either, it is a usage error naming the fix, before any work."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "serve"))
    from serve_helpers import ServeProcess

    run = tmp_path / "run"
    base = ["rollout", "--run", str(run), "--backend", "openai", "--env", "first-token", "--policy", "tiny",
            "-G", "2", "--limit", "2", "--max-new-tokens", "4", "-q", "--json"]
    empty = arlctl(*base)
    assert empty.returncode == 2 and "no server" in empty.stderr and "arlctl fleet add" in empty.stderr
    engine = ServeProcess(tmp_path / "rec")
    try:
        added = arlctl("fleet", "add", str(run), engine.url)
        assert added.returncode == 0, added.stderr
        done = arlctl(*base)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["trajectories"] == 4
        served = engine.health()
    finally:
        engine.stop()
    assert served["requests"] >= 4, served  # every turn went to the engine the fleet file named
