"""`filter --adv turn | turn-mean`: per-turn advantages from step rewards, by hand (arithmetic in comments)."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from arlctl.cli.main import app
from arlctl.io.shards import Lineage, read_shard, scan, write_shard
from arlctl.schemas.rows import TrajectoryRow, Turn, rows_to_table
from arlctl.stages.configs import FilterConfig
from arlctl.stages.filter import apply_rules, pack_batches, plan_invocation, run_filter


def trajectory(group: str, sample: int, steps: list[float | None], reward: float, info: dict | None = None,
               tid: str | None = None) -> TrajectoryRow:
    """A whole-trajectory row: one sampled token per turn, one environment token between turns."""
    ids, mask, turns = [], [], []
    for k, step in enumerate(steps):
        obs = 1 if k < len(steps) - 1 else 0
        turns.append(Turn(k, len(ids), 1, obs, f"turn {k}", reward_step=step))
        ids += [100 + k] + [7] * obs
        mask += [1] + [0] * obs
    return TrajectoryRow(group_id=group, sample_index=sample, task_id=group, env="e", env_version="1", task={},
                         policy="p", prompt_text="", prompt_ids=[1, 2], response_ids=ids, response_mask=mask,
                         response_logprobs=[-0.5 if m else 0.0 for m in mask], turns=turns, reward=reward,
                         reward_info=json.dumps(info or {}), **({"trajectory_id": tid} if tid else {}))


def per_turn_rows(row: TrajectoryRow) -> list[TrajectoryRow]:
    """The same trajectory as `rollout --history per-turn` writes it: row k holds turn k only."""
    from dataclasses import replace

    out = []
    for k, turn in enumerate(row.turns):
        last = k == len(row.turns) - 1
        out.append(replace(row, prompt_ids=[1, 2] + [9] * k, response_ids=[100 + k], response_mask=[1],
                           response_logprobs=[-0.5], turns=[replace(turn, gen_start=0, obs_len=0)],
                           finish_reason="stop" if last else "continued"))
    return out


def batch_of(rows: list[TrajectoryRow], **cfg) -> tuple[pa.Table, dict]:
    table = rows_to_table(rows)
    config = FilterConfig(batch_groups=100, **cfg)
    result = apply_rules(table, config, current_version=0)
    kept = np.flatnonzero(result.keep)
    batches, _ = pack_batches(table.take(pa.array(kept, pa.int64())), result.weight[kept], config)
    return (batches[0] if batches else None), result.counts


def turn_advantages(batch: pa.Table) -> list[list[float | None]]:
    return [[t["advantage"] for t in turns] for turns in batch.column("turns").to_pylist()]


def test_turn_mean_is_the_return_minus_the_groups_mean_at_that_turn():
    # gamma 0.5. A: steps 1, 0, outcome 0 -> R_1 = 0 + 0 = 0, R_0 = 1 + 0.5 * 0 = 1
    #            B: steps 1, 1, outcome 1 -> R_1 = 1 + 1 = 2, R_0 = 1 + 0.5 * 2 = 2
    # turn 0: mean (1 + 2) / 2 = 1.5 -> A -0.5, B +0.5;  turn 1: mean (0 + 2) / 2 = 1 -> A -1, B +1
    batch, _ = batch_of([trajectory("g", 0, [1.0, 0.0], 0.0), trajectory("g", 1, [1.0, 1.0], 1.0)],
                        adv="turn-mean", gamma=0.5)
    assert turn_advantages(batch) == [[-0.5, -1.0], [0.5, 1.0]]
    # the `advantage` column keeps its outcome meaning: group-mean of rewards 0, 1 -> -0.5, +0.5
    assert batch.column("advantage").to_pylist() == [-0.5, 0.5]


def test_turn_divides_by_the_std_at_that_turn():
    # same returns; turn 0: 1, 2 -> mean 1.5, Bessel std sqrt(2 * 0.25 / 1) = 0.707107 -> +-0.5 / 0.707107
    # = +-0.707107;  turn 1: 0, 2 -> mean 1, std sqrt(2) = 1.414214 -> +-1 / 1.414214 = +-0.707107
    batch, _ = batch_of([trajectory("g", 0, [1.0, 0.0], 0.0), trajectory("g", 1, [1.0, 1.0], 1.0)],
                        adv="turn", gamma=0.5)
    assert np.allclose(turn_advantages(batch), [[-0.707107, -0.707107], [0.707107, 0.707107]], atol=1e-5)
    # the `advantage` column: GRPO of rewards 0, 1 (mean .5, std .707107) -> -+0.707107
    assert np.allclose(batch.column("advantage").to_pylist(), [-0.707107, 0.707107], atol=1e-5)


def test_equal_outcomes_are_still_a_signal_when_the_step_rewards_differ():
    rows = [trajectory("h", 0, [1.0, 0.0], 0.0), trajectory("h", 1, [0.0, 0.0], 0.0),  # different steps
            trajectory("u", 0, [1.0, 0.0], 0.0), trajectory("u", 1, [1.0, 0.0], 0.0)]  # nothing differs
    _, outcome_counts = batch_of(rows, adv="group")
    assert outcome_counts["zero_variance"] == 4  # outcome modes: both groups are all-zero outcomes
    batch, counts = batch_of(rows, adv="turn-mean", gamma=1.0)
    assert counts["zero_variance"] == 2 and set(batch.column("group_id").to_pylist()) == {"h"}
    # gamma 1: R = [1 + 0 + 0, 0 + 0] = [1, 0] and [0, 0] -> turn 0 mean .5 -> +-0.5; turn 1 equal -> 0
    assert turn_advantages(batch) == [[0.5, 0.0], [-0.5, 0.0]]
    assert batch.column("advantage").to_pylist() == [0.0, 0.0]


def test_a_judges_step_rewards_fill_the_turns_the_env_did_not_score():
    rows = [trajectory("g", 0, [None, None], 1.0, {"step_rewards": [0.5, 1.0]}),
            trajectory("g", 1, [0.25, None], 1.0, {"step_rewards": [0.0, 0.0]})]  # the env's 0.25 wins
    # gamma 1. A: steps .5, 1 -> R_1 = 1 + 1 = 2, R_0 = .5 + 2 = 2.5
    #          B: steps .25, 0 -> R_1 = 0 + 1 = 1, R_0 = .25 + 1 = 1.25
    # turn 0: mean 1.875 -> +.625, -.625;  turn 1: mean 1.5 -> +.5, -.5
    batch, _ = batch_of(rows, adv="turn-mean")
    assert turn_advantages(batch) == [[0.625, 0.5], [-0.625, -0.5]]


def test_unusable_step_rewards_are_dropped_as_invalid_values_in_the_turn_modes_only():
    rows = [trajectory("g", 0, [None, None], 1.0, {"step_rewards": [0.5, 1.0, 0.0]}),  # 3 entries, 2 turns
            trajectory("g", 1, [math.nan, 0.0], 0.0),
            trajectory("g", 2, [1.0, 0.0], 0.0), trajectory("g", 3, [0.0, 1.0], 1.0)]
    plan = plan_invocation(["rewarded/part-1.parquet"], FilterConfig(adv="turn"), 0, [rows_to_table(rows)])
    assert plan.counts["invalid_values"] == 2
    assert any("step rewards unusable: reward_info step_rewards has 3 entries for 2 turns" in line
               for line in plan.invalid)
    assert any("turn 0 has reward_step nan" in line for line in plan.invalid)
    outcome = plan_invocation(["rewarded/part-1.parquet"], FilterConfig(adv="group"), 0, [rows_to_table(rows)])
    assert outcome.counts["invalid_values"] == 0  # step rewards play no part there


def test_a_step_the_judge_could_not_grade_drops_the_trajectory_as_incomplete():
    rows = [trajectory("g", 0, [None, None], 1.0, {"step_rewards": [0.5, None], "step_errors": {"1": "timeout"}}),
            trajectory("g", 1, [None, None], 0.0, {"step_rewards": [0.5, 0.0]}),
            trajectory("g", 2, [None, None], 1.0, {"step_rewards": [1.0, 1.0]})]
    batch, counts = batch_of(rows, adv="turn-mean")
    assert counts["completeness"] == 1 and counts["invalid_values"] == 0
    assert batch.column("sample_index").to_pylist() == [1, 2]
    # gamma 1. sample 1: R = [.5 + 0 + 0, 0 + 0] = [.5, 0]; sample 2: R = [1 + 1 + 1, 1 + 1] = [3, 2]
    # turn 0: mean 1.75 -> -1.25, +1.25;  turn 1: mean 1 -> -1, +1
    assert turn_advantages(batch) == [[-1.25, -1.0], [1.25, 1.0]]


def test_per_turn_rows_get_the_advantages_of_their_turn():
    whole = [trajectory("g", 0, [1.0, 0.0, 0.5], 0.0, tid="a"), trajectory("g", 1, [0.0, 1.0, 0.0], 1.0, tid="b")]
    expected, _ = batch_of(whole, adv="turn", gamma=0.9)
    split = [row for t in whole for row in per_turn_rows(t)]
    batch, counts = batch_of(split, adv="turn", gamma=0.9)
    assert counts["completeness"] == 0 and batch.num_rows == 6
    by_turn = {(row["trajectory_id"], row["turns"][0]["index"]): row["turns"][0]["advantage"]
               for row in batch.to_pylist()}
    for row in expected.to_pylist():
        for turn in row["turns"]:
            assert by_turn[(row["trajectory_id"], turn["index"])] == pytest.approx(turn["advantage"])
    assert [r["advantage"] for r in batch.to_pylist()] == [expected.column("advantage")[0].as_py()] * 3 + \
        [expected.column("advantage")[1].as_py()] * 3


def test_the_cli_takes_adv_turn_and_gamma(tmp_path):
    rows = [trajectory("g", 0, [1.0, 0.0], 0.0), trajectory("g", 1, [1.0, 1.0], 1.0)]
    write_shard(rows_to_table(rows), str(tmp_path / "rewarded" / "part-1.parquet"), Lineage("reward"))
    runner = CliRunner()
    base = ["filter", "--in", str(tmp_path / "rewarded"), "--out", str(tmp_path / "batches"),
            "--metrics", str(tmp_path / "metrics")]
    bad = runner.invoke(app, [*base, "--adv", "turn", "--gamma", "1.5"])
    assert bad.exit_code == 2 and "--gamma is a discount in [0, 1], not 1.5" in bad.output
    ok = runner.invoke(app, [*base, "--adv", "turn-mean", "--gamma", "0.5", "--json"])
    assert ok.exit_code == 0, ok.output
    batch = read_shard(scan(str(tmp_path / "batches")).shards[0])
    assert turn_advantages(batch) == [[-0.5, -1.0], [0.5, 1.0]]  # as in the first test


def test_run_filter_reads_a_version_1_shard_in_turn_mode(tmp_path):
    import pyarrow.parquet as pq

    from arlctl.schemas.trajectory import SCHEMAS

    rows = rows_to_table([trajectory("g", 0, [1.0, 0.0], 0.0), trajectory("g", 1, [1.0, 1.0], 1.0)]).to_pylist()
    for row in rows:  # as a version-1 writer wrote it: reward_step existed, turns[].advantage did not
        row["schema_version"] = 1
        for turn in row["turns"]:
            del turn["advantage"]
    (tmp_path / "rewarded").mkdir()
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMAS[1]), tmp_path / "rewarded" / "part-1.parquet")
    summary = run_filter(str(tmp_path / "rewarded"), str(tmp_path / "batches"),
                         FilterConfig(adv="turn-mean", gamma=0.5), 0)
    batch = read_shard(scan(str(tmp_path / "batches")).shards[0])
    assert summary["rows_kept"] == 2 and batch.column("schema_version").to_pylist() == [3, 3]
    assert turn_advantages(batch) == [[-0.5, -1.0], [0.5, 1.0]]
