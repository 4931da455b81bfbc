"""The reward stage: fills the reward columns, 1:1 names, idempotent through lineage."""

from __future__ import annotations

import json
import os

import pyarrow.compute as pc

from arlctl.envs.registry import get_reward
from arlctl.io.shards import Lineage, read_lineage, read_shard, write_shard
from arlctl.schemas.rows import TrajectoryRow, Turn, rows_to_table
from arlctl.stages.reward import reward_dir


def math_row(task_id, answer_text, gold, final_state):
    text = f"the result is <answer>{answer_text}</answer>" if answer_text is not None else "I think 4"
    return TrajectoryRow(group_id="g-" + task_id, sample_index=0, task_id=task_id, env="math", env_version="math-1",
                         task={"task_id": task_id, "question": "q?", "answer": gold}, policy="p", prompt_text="p",
                         prompt_ids=[1, 2], response_ids=[3, 4], response_mask=[1, 1], response_logprobs=[-0.1, -0.2],
                         turns=[Turn(0, 0, 2, 0, text)], final_state=final_state)


def write_rollouts(directory):
    rows = [math_row("a", "12", "12", "12"), math_row("b", "7/2", "3.5", "7/2"), math_row("c", "5", "6", "5"),
            math_row("d", None, "4", None)]
    path = write_shard(rows_to_table(rows), os.path.join(directory, "part-1.parquet"), Lineage(stage="rollout"))
    write_shard(rows_to_table([math_row("e", "1", "1", "1")]), os.path.join(directory, "part-2.parquet"),
                Lineage(stage="rollout"))
    return path


def test_reward_fills_columns_and_records_lineage(tmp_path):
    src = write_rollouts(str(tmp_path / "rollouts"))
    summary = reward_dir(str(tmp_path / "rollouts"), str(tmp_path / "rewarded"), get_reward("math"))
    assert summary.rows == 5 and len(summary.written) == 2
    out = read_shard(str(tmp_path / "rewarded" / "part-1.parquet"))
    rows = {r["task_id"]: r for r in out.to_pylist()}
    # 12 == 12, 7/2 == 3.5 -> correct; 5 != 6 -> wrong; no answer -> 0 with format 0
    assert [rows[k]["reward"] for k in "abcd"] == [1.0, 1.0, 0.0, 0.0]
    assert dict(rows["a"]["reward_components"]) == {"correct": 1.0, "format": 1.0}
    assert dict(rows["d"]["reward_components"])["format"] == 0.0
    assert all(r["reward_version"] == "math-1" for r in rows.values())
    assert json.loads(rows["c"]["reward_info"])
    # every other column is exactly the input
    original = read_shard(src)
    for name in original.schema.names:
        if not name.startswith("reward"):
            assert out.column(name).equals(original.column(name)), name
    assert read_lineage(str(tmp_path / "rewarded" / "part-1.parquet")).inputs == [src]


def test_reward_is_idempotent_and_resumes(tmp_path):
    write_rollouts(str(tmp_path / "rollouts"))
    first = reward_dir(str(tmp_path / "rollouts"), str(tmp_path / "rewarded"), get_reward("math"))
    before = {p: os.path.getmtime(p) for p in first.written}
    again = reward_dir(str(tmp_path / "rollouts"), str(tmp_path / "rewarded"), get_reward("math"))
    assert again.skipped_consumed == 2 and again.written == [] and again.rows == 0
    assert {p: os.path.getmtime(p) for p in first.written} == before
    # A crash that lost one output: the re-run redoes exactly that one, with the same name and values.
    lost = str(tmp_path / "rewarded" / "part-2.parquet")
    kept = read_shard(lost)
    os.unlink(lost)
    third = reward_dir(str(tmp_path / "rollouts"), str(tmp_path / "rewarded"), get_reward("math"))
    assert third.skipped_consumed == 1 and [os.path.basename(p) for p in third.written] == ["part-2.parquet"]
    assert read_shard(lost).equals(kept)
    assert sorted(os.listdir(tmp_path / "rewarded")) == ["part-1.parquet", "part-2.parquet"]


def test_rereward_with_another_version_into_another_directory(tmp_path):
    write_rollouts(str(tmp_path / "rollouts"))
    reward_dir(str(tmp_path / "rollouts"), str(tmp_path / "rewarded"), get_reward("math"))
    v2 = reward_dir(str(tmp_path / "rollouts"), str(tmp_path / "rewarded-v2"), get_reward("math", format_weight=0.1))
    assert v2.rows == 5
    out = read_shard(str(tmp_path / "rewarded-v2" / "part-1.parquet"))
    assert set(out.column("reward_version").to_pylist()) == {"math-1+format_weight=0.1"}
    # correct and well-formatted: 1 + 0.1 * 1
    assert pc.max(out.column("reward")).as_py() == 1.100000023841858
