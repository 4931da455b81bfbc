"""The exactly-once audit (arlctl.audit) on a run directory built by the real filter stage: clean when
every trajectory is trained once or dropped by a named rule, and each kind of damage is reported."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from arlctl.audit import audit_run
from arlctl.io.shards import Lineage, write_shard
from arlctl.stages.configs import FilterConfig
from arlctl.stages.filter import run_filter
from arlctl.synthetic import synthetic_table


def build_run(root) -> dict:
    """Two rollout shards (3 groups of 4 each), rewarded 1:1, filtered into batches of 1 group, all
    trained (a checkpoint's state.json lists every batch), published as v<steps>."""
    run = str(root)
    names = ["part-20260101T000000000000Z-00000001.parquet", "part-20260101T000001000000Z-00000002.parquet"]
    for seed, name in enumerate(names):
        table = synthetic_table(3, 4, seed=seed, mean_turns=2, tokens_per_turn=8)
        write_shard(table, f"{run}/rollouts/{name}", Lineage(stage="rollout"))
        write_shard(table, f"{run}/rewarded/{name}", Lineage(stage="reward", inputs=[f"{run}/rollouts/{name}"]))
    summary = run_filter(f"{run}/rewarded", f"{run}/batches", FilterConfig(batch_groups=1, keep_status=["ok", "truncated"]),
                         current_version=0, metrics_url=f"{run}/metrics")
    batches = summary["batches"]
    assert batches, summary  # the audit below must have something trained
    steps = len(batches)
    ckpt = root / "checkpoints" / f"step-{steps:06d}"
    ckpt.mkdir(parents=True)
    (ckpt / "state.json").write_text(json.dumps({"step": steps, "consumed_batches": batches}))
    version = root / "policy" / f"v{steps:06d}"
    version.mkdir(parents=True)
    (version / "version.json").write_text(json.dumps({"version": steps, "created_at": time.time()}))
    (root / "policy" / "LATEST").write_text(f"v{steps:06d}\n")
    return {"run": run, "batches": batches, "steps": steps, "rollouts": names, "dropped": summary["dropped"]}


@pytest.fixture
def built(tmp_path):
    return build_run(tmp_path / "run")


def test_clean_run_audits_clean(built):
    report = audit_run(built["run"], latest_history=[built["steps"]])
    assert report.problems == []
    assert report.trajectories == 24
    assert report.trained + sum(report.dropped.values()) == 24
    assert sum(report.dropped.values()) == built["dropped"]
    assert report.trainer_step == report.consumed_batches == len(built["batches"])


def _state(built) -> tuple[str, dict]:
    path = os.path.join(built["run"], "checkpoints", f"step-{built['steps']:06d}", "state.json")
    with open(path) as fh:
        return path, json.load(fh)


def test_batch_trained_twice_is_reported(built):
    batches = os.path.join(built["run"], "batches")
    first = built["batches"][0]
    copy = "batch-29990101T000000000000Z-ffffffff.parquet"
    shutil.copy(os.path.join(batches, first), os.path.join(batches, copy))
    path, state = _state(built)
    state["consumed_batches"].append(copy)
    with open(path, "w") as fh:
        json.dump(state, fh)
    problems = audit_run(built["run"]).problems
    assert any("in two batches" in p for p in problems), problems
    assert any("trainer step" in p and "consumed batches" in p for p in problems), problems


def test_untrained_batch_is_in_flight_only_when_not_drained(built):
    path, state = _state(built)
    state["consumed_batches"].pop()
    state["step"] -= 1
    with open(path, "w") as fh:
        json.dump(state, fh)
    drained = audit_run(built["run"], drained=True)
    assert any("neither trained nor dropped" in p for p in drained.problems), drained.problems
    live = audit_run(built["run"], drained=False)
    assert live.problems == [] and live.in_flight == 4  # one batch = one group of 4


def test_corrupt_stray_and_partial_files_are_reported(built):
    run = built["run"]
    victim = os.path.join(run, "rewarded", built["rollouts"][1])
    with open(victim, "r+b") as fh:
        fh.truncate(os.path.getsize(victim) // 2)
    open(os.path.join(run, "rollouts", "part-x.parquet.tmp"), "w").close()
    os.makedirs(os.path.join(run, "checkpoints", "step-000099"))  # no state.json under a final name
    problems = audit_run(run).problems
    assert any("rewarded: corrupt shard" in p for p in problems), problems
    assert any("visible non-shard file part-x.parquet.tmp" in p for p in problems), problems
    assert any("step-000099 has no state.json" in p for p in problems), problems


def test_policy_going_backwards_is_reported(built):
    problems = audit_run(built["run"], latest_history=[1, 3, 2]).problems
    assert any("went backwards" in p for p in problems), problems
    os.makedirs(os.path.join(built["run"], "policy", "v000050"))
    with open(os.path.join(built["run"], "policy", "v000050", "version.json"), "w") as fh:
        json.dump({"version": 50, "created_at": 1.0}, fh)  # newer version, published earlier
    problems = audit_run(built["run"]).problems
    assert any("published before an older one" in p for p in problems), problems
    assert any("LATEST names" in p for p in problems), problems
