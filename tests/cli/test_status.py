"""`arlctl status RUN` after a short loop: per-stage waiting/output counts, versions, backlog, staleness,
reward trend and errors, checked against numbers the loop makes certain.

Loop: rollout 4 tasks x G=2 (v0) -> reward -> filter (2 groups per batch: 2 batches) -> train (2 steps)
-> sync (v2) -> rollout 2 more tasks with RUN/policy (v2), not yet rewarded.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from arlctl.cli.main import app

runner = CliRunner()


def arlctl(*args: str):
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result


@pytest.mark.slow
def test_status_after_a_short_loop(tmp_path):
    run = str(tmp_path / "run")
    rollout = ["rollout", "--env", "first-token", "--run", run, "-G", "2", "--max-new-tokens", "4", "--seed", "0",
               "--flush-groups", "2", "-q"]
    arlctl(*rollout, "--tasks", "builtin:first-token?n=4&seed=0", "--policy", "tiny")
    arlctl("reward", "--run", run, "--reward", "first-token")
    arlctl("filter", "--run", run, "--batch-groups", "2", "--keep-uniform", "1", "--adv", "batch")
    arlctl("train", "--run", run, "--policy", "tiny", "--lr", "1e-3")
    arlctl("sync", "--run", run)
    arlctl(*rollout, "--tasks", "builtin:first-token?n=2&seed=1", "--policy", f"{run}/policy")

    state = json.loads(arlctl("status", run, "--json").stdout)
    assert set(state) >= {"run", "time", "policy_version", "trainer_step", "trainer_version", "backlog", "stages",
                          "staleness", "reward_trend", "errors", "corrupt_shards"}
    assert state["policy_version"] == 2 and state["trainer_step"] == 2 and state["trainer_version"] == 2
    stages = state["stages"]
    assert stages["rollout"] == {**stages["rollout"], "output_shards": 3, "output_rows": 12}
    assert (stages["reward"]["waiting_shards"], stages["reward"]["waiting_rows"]) == (1, 4)  # the v2 rollout
    assert (stages["reward"]["output_shards"], stages["reward"]["output_rows"]) == (2, 8)
    assert stages["filter"]["waiting_rows"] == 0 and stages["filter"]["output_shards"] == 2
    assert stages["train"] == {**stages["train"], "waiting_shards": 0, "output_checkpoints": 2, "step": 2}
    assert stages["sync"]["version"] == 2 and stages["sync"]["waiting_shards"] == 0
    assert all(stages[s]["last_output_at"] for s in ("rollout", "reward", "filter", "train", "sync"))
    assert state["backlog"] == {**state["backlog"], "rollouts": 4, "rewarded": 0, "batches": 0, "total": 4}
    # Batch 1 was trained at step 1 on v0 rows (lag 0), batch 2 at step 2 (its weights had seen 1 step: lag 1).
    trained = state["staleness"]["trained"]
    assert trained["hist"] == {"0": 4, "1": 4} and trained["max"] == 1 and trained["mean"] == 0.5
    assert [(s["step"], s["min"], s["max"]) for s in trained["per_step"]] == [(1, 0, 0), (2, 1, 1)]
    assert state["staleness"]["waiting"]["hist"] == {"0": 4}  # v2 rows, trainer at 2
    trend = state["reward_trend"]
    assert sum(p["rows"] for p in trend["per_shard"]) == 8
    assert [p["policy_version"] for p in trend["per_version"]] == [0] and trend["per_version"][0]["rows"] == 8
    assert 0.0 <= trend["per_version"][0]["mean_reward"] <= 1.0
    assert state["errors"]["rollout"]["errors"] == 0 and state["corrupt_shards"] == []

    text = arlctl("status", run).output
    assert "policy v2" in text and "trainer step 2" in text and "backlog 4 rows" in text
    for stage in ("rollout", "reward", "filter", "train", "sync"):
        assert stage in text
    assert runner.invoke(app, ["status", str(tmp_path / "missing")]).exit_code == 2


def test_backlog_and_staleness_follow_lineage_and_the_checkpoint(tmp_path):
    """Hand-built run: which rows count as waiting where, and the staleness arithmetic."""
    from arlctl.io.shards import Lineage, write_shard
    from arlctl.runstate import ShardCache, backlog, run_state
    from arlctl.synthetic import synthetic_table

    run = tmp_path / "run"

    def shard(kind: str, name: str, groups: int, version: int, inputs: list[str], **extra) -> None:
        table = synthetic_table(groups, 2, seed=len(name) + groups, envs=("first-token",), mean_turns=1,
                                tokens_per_turn=4, policy_version=version)
        write_shard(table, str(run / kind / name), Lineage(stage=kind, inputs=inputs, extra=extra))

    shard("rollouts", "part-a.parquet", 1, 0, [])  # 2 rows, rewarded
    shard("rollouts", "part-b.parquet", 2, 1, [])  # 4 rows, waiting at reward
    shard("rewarded", "part-a.parquet", 1, 0, ["part-a.parquet"])  # waiting at filter: 2 rows
    shard("batches", "batch-1.parquet", 3, 0, ["old.parquet"])  # 6 rows, trained at step 1 (lag 0)
    shard("batches", "batch-2.parquet", 1, 0, ["older.parquet"])  # 2 rows, trained at step 2 (lag 1)
    shard("batches", "batch-3.parquet", 1, 2, ["oldest.parquet"])  # 2 rows, waiting at train
    # Part 0 of 2 of a filter invocation over rewarded/part-a: until part 1 (or its manifest) is
    # committed, part-a still counts as waiting at the filter, and the part's 2 rows wait at train.
    shard("batches", "batch-p0.parquet", 1, 0, ["part-a.parquet"], invocation="inv9", part=0, parts=2)
    ckpt = run / "checkpoints" / "step-000002"
    ckpt.mkdir(parents=True)
    (ckpt / "state.json").write_text(json.dumps({"step": 2, "consumed_batches": ["batch-1.parquet",
                                                                                 "batch-2.parquet"]}))
    (run / "checkpoints" / "step-000003").mkdir()  # no state.json yet: not a checkpoint

    cache = ShardCache()
    b = backlog(str(run), cache, in_flight=3)
    # 4 (part-b) + 2 (rewarded part-a) + 2 (batch-3) + 2 (batch-p0) + 3 in flight
    assert (b["rollouts"], b["rewarded"], b["batches"], b["total"]) == (4, 2, 4, 13)
    assert b["trainer_version"] == 2 and b["policy_version"] is None

    # The invocation finishes (its manifest; its part 1 dropped every row, say).
    (run / "batches" / "_filter").mkdir()
    (run / "batches" / "_filter" / "inv9.json").write_text(json.dumps({"invocation": "inv9",
                                                                       "inputs": ["part-a.parquet"]}))
    state = run_state(str(run), cache)
    assert state["backlog"]["total"] == 8 and state["stages"]["filter"]["waiting_rows"] == 0
    trained = state["staleness"]["trained"]
    assert trained["hist"] == {"0": 6, "1": 2}  # step 1: 0 - 0; step 2: 1 - 0
    # waiting rows vs trainer version 2: part-b (v1) lag 1 x4, batch-3 (v2) lag 0 x2, batch-p0 (v0) lag 2 x2
    assert state["staleness"]["waiting"]["hist"] == {"0": 2, "1": 4, "2": 2}
    assert state["stages"]["train"]["output_checkpoints"] == 2 and state["trainer_step"] == 2


@pytest.mark.parametrize("committed_after", ["rewarded", "batches"])
def test_a_commit_between_listings_never_reads_as_drained(tmp_path, monkeypatch, committed_after):
    """Stages commit while status lists. Right after status's first listing of `committed_after`, a real
    `arlctl reward` (or `arlctl filter`) commits: its output and its consumption of the upstream shard
    appear at once. Status must then count the upstream shard as waiting (the commit came after its look),
    never take it as consumed by an output it did not count: a supervisor polling `up --until drained`
    stopped with batches untrained that way (the chaos tier's S3 run)."""
    import arlctl.io.shards as shards_module
    import arlctl.runstate as runstate
    from arlctl.supervisor import pipeline_drained

    run = tmp_path / "run"
    arlctl("rollout", "--env", "first-token", "--run", str(run), "-G", "2", "--max-new-tokens", "4", "--seed", "0",
           "-q", "--tasks", "builtin:first-token?n=2&seed=0", "--policy", "tiny")
    if committed_after == "batches":
        arlctl("reward", "--run", str(run), "--reward", "first-token")
    stage = {"rewarded": ["reward", "--run", str(run), "--reward", "first-token"],
             "batches": ["filter", "--run", str(run), "--batch-groups", "1", "--keep-uniform", "1", "--adv", "batch"]}
    watched = str(run / committed_after)
    real_scan, fired = shards_module.scan, []

    def scan_then_commit(url, *args, **kwargs):
        listing = real_scan(url, *args, **kwargs)
        if not fired and str(url).rstrip("/").endswith(watched.rstrip("/")):
            fired.append(url)
            arlctl(*stage[committed_after])  # the stage runs against the real scan, once
        return listing

    monkeypatch.setattr(shards_module, "scan", scan_then_commit)
    monkeypatch.setattr(runstate, "scan", scan_then_commit)
    racing = runstate.run_state(str(run))
    assert fired, "status never listed the watched directory"
    assert not pipeline_drained(racing)
    upstream = {"rewarded": "reward", "batches": "filter"}[committed_after]
    assert racing["stages"][upstream]["waiting_shards"] >= 1

    monkeypatch.setattr(shards_module, "scan", real_scan)
    monkeypatch.setattr(runstate, "scan", real_scan)
    settled = runstate.run_state(str(run))  # the next poll sees the commit whole
    assert settled["stages"][upstream]["waiting_shards"] == 0
    assert settled["stages"]["filter" if committed_after == "rewarded" else "train"]["waiting_shards"] >= 1
