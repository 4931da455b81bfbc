"""`--history per-turn` rows downstream of rollout: schema rules, reward once per trajectory, filter keeping
trajectories whole with one advantage each, and train on them (the tiny model), end to end on real shards."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from arlctl.envs.registry import Reward, get_reward
from arlctl.io.shards import Lineage, read_shard, scan, write_shard
from arlctl.models import tiny_model_dir
from arlctl.rl.batching import trajectory_shares
from arlctl.rl.config import TrainConfig
from arlctl.rl.trainer_state import load_model
from arlctl.schemas.rows import TrajectoryRow, Turn, rows_to_table
from arlctl.schemas.values import find_bad_values
from arlctl.stages.configs import FilterConfig
from arlctl.stages.filter import apply_rules, run_filter
from arlctl.stages.reward import reward_dir, reward_table
from arlctl.stages.train import forward_backward, train
from arlctl.synthetic import split_per_turn, synthetic_rows
from arlctl.turn_rows import is_turn_row, row_key, trajectories


def math_trajectory(group: str, sample: int, n_turns: int, answer: str, gold: str, tid: str | None = None,
                    status: str = "ok") -> TrajectoryRow:
    """A whole math trajectory of n_turns: calculator calls, then the answer in the last turn."""
    response, mask, logprobs, turns = [], [], [], []
    for k in range(n_turns):
        last = k == n_turns - 1
        gen = [100 + k, 200 + k, 300 + sample]
        obs = [] if last else [7, 8]
        turns.append(Turn(k, len(response), len(gen), len(obs), f"<answer>{answer}</answer>" if last else f"step {k}",
                          tool_calls=[] if last else [{"name": "calculator", "arguments": {"expr": f"{k}+1"}}],
                          observation=None if last else str(k + 1)))
        response += gen + obs
        mask += [1] * len(gen) + [0] * len(obs)
        logprobs += [-0.5] * len(gen) + [0.0] * len(obs)
    row = TrajectoryRow(group_id=group, sample_index=sample, task_id=f"t-{group}", env="math", env_version="math-1",
                        task={"task_id": f"t-{group}", "question": "q?", "answer": gold}, policy="p", prompt_text="p",
                        prompt_ids=[1, 2, 3], response_ids=response, response_mask=mask, response_logprobs=logprobs,
                        turns=turns, status=status, finish_reason="submit", final_state=answer)
    if tid:
        row.trajectory_id = tid
    return row


def per_turn(*rows: TrajectoryRow) -> list[TrajectoryRow]:
    return [part for row in rows for part in split_per_turn(row)]


def write(rows: list[TrajectoryRow], path) -> str:
    return write_shard(rows_to_table(rows), str(path), Lineage(stage="rollout"))


# ----------------------------------------------------------------------------------------------- schema


def test_per_turn_rows_are_valid_and_recognised():
    rows = per_turn(math_trajectory("g", 0, 3, "4", "4"))
    table = rows_to_table(rows)
    assert table.column("finish_reason").to_pylist() == ["continued", "continued", "submit"]
    assert find_bad_values(table) == []
    dicts = table.to_pylist()
    assert [is_turn_row(r) for r in dicts] == [True, True, True]
    assert [row_key(r)[1] for r in dicts] == [0, 1, 2]
    assert not is_turn_row(rows_to_table([math_trajectory("h", 0, 3, "4", "4")]).to_pylist()[0])
    (traj,) = trajectories(table).values()
    assert traj.incomplete_reason() is None and traj.last == 2
    # without its middle row the trajectory is incomplete; without its last it has no final row
    assert "not 0..1" in trajectories(table.take([0, 2]))[traj.trajectory_id].incomplete_reason()
    assert "no final row" in trajectories(table.take([0, 1]))[traj.trajectory_id].incomplete_reason()


def test_a_per_turn_row_with_several_turns_breaks_a_value_rule():
    whole = math_trajectory("g", 0, 2, "4", "4")
    continued = math_trajectory("g", 0, 2, "4", "4")
    continued.finish_reason = "continued"  # two turns but "continued": neither a per-turn nor a whole row
    late = math_trajectory("g", 0, 2, "4", "4")
    late.turns = [Turn(3, 0, 3, 2, "x"), Turn(4, 5, 3, 0, "y")]  # starts at turn 3 with two turns
    problems = find_bad_values(rows_to_table([whole, continued, late]))
    assert {(p.row, p.column) for p in problems} == {(1, "turns"), (2, "turns")}
    assert "per-turn row" in problems[0].reason


# ----------------------------------------------------------------------------------------------- reward


def test_reward_scores_each_trajectory_once_and_copies_it_onto_its_rows(tmp_path):
    calls = []
    math = get_reward("math")

    def counting(final_state, task, response_text):
        calls.append(response_text)
        return math.score(final_state, task, response_text)

    rows = per_turn(math_trajectory("g", 0, 3, "4", "4"), math_trajectory("g", 1, 2, "5", "4"))
    orphan = per_turn(math_trajectory("h", 0, 3, "4", "4"))[:2]  # its last row is in another shard
    whole = math_trajectory("w", 0, 2, "4", "4")
    out = reward_table(rows_to_table(rows + orphan + [whole]), Reward("counting", "counting-1", counting))
    got = out.to_pylist()
    assert len(calls) == 3  # two per-turn trajectories and one whole row; the orphan is not graded
    assert calls[0] == "step 0\nstep 1\n<answer>4</answer>"  # every turn of the trajectory, in order
    assert [r["reward"] for r in got[:5]] == [1.0, 1.0, 1.0, 0.0, 0.0]
    first, second = got[:3], got[3:5]
    for traj in (first, second):
        assert len({(json.dumps(dict(r["reward_components"])), r["reward_info"], r["reward_version"])
                    for r in traj}) == 1
    assert [r["reward"] for r in got[5:7]] == [None, None]
    assert "last row of this per-turn trajectory is not in this shard" in json.loads(got[5]["reward_info"])["error"]
    assert got[7]["reward"] == 1.0


# ----------------------------------------------------------------------------------------------- filter


def rewarded(rows: list[TrajectoryRow], rewards: dict[str, float]) -> list[TrajectoryRow]:
    for row in rows:
        row.reward = rewards[f"{row.group_id}/{row.sample_index}"]
        row.reward_components, row.reward_info, row.reward_version = {"correct": row.reward}, "{}", "math-1"
    return rows


def test_filter_counts_trajectories_and_gives_one_advantage_per_trajectory(tmp_path):
    # Group g: sample 0 has 3 turns (reward 1), sample 1 has 1 turn (reward 0). Per trajectory the group
    # is [1, 0]: mean 0.5, std (Bessel) sqrt(0.5) = 0.7071, advantages +-0.5/0.7071 = +-0.7071. Counting
    # rows instead would give [1, 1, 1, 0]: mean 0.75 and other advantages.
    rows = rewarded(per_turn(math_trajectory("g", 0, 3, "4", "4"), math_trajectory("g", 1, 1, "5", "4")),
                    {"g/0": 1.0, "g/1": 0.0})
    write(rows, tmp_path / "rewarded" / "part-1.parquet")
    summary = run_filter(str(tmp_path / "rewarded"), str(tmp_path / "batches"), FilterConfig(batch_groups=1), 0,
                         metrics_url=str(tmp_path / "metrics"))
    assert summary["rows_kept"] == 4 and summary["groups_kept"] == 1
    (batch,) = [read_shard(u) for u in scan(str(tmp_path / "batches")).shards]
    adv = batch.column("advantage").to_pylist()
    assert adv[:3] == pytest.approx([0.7071, 0.7071, 0.7071], abs=1e-3) and adv[3] == pytest.approx(-0.7071, abs=1e-3)
    assert set(batch.column("weight").to_pylist()) == {1.0}
    # a group of 2 trajectories is 2, not 4: --min-group-size 3 drops it
    table = rows_to_table(rows)
    result = apply_rules(table, FilterConfig(min_group_size=3), 0)
    assert not result.keep.any() and result.counts["group_integrity"] == 4


def test_filter_drops_an_incomplete_trajectory_whole_and_dedupes_by_row_key(tmp_path):
    g0 = per_turn(math_trajectory("g", 0, 3, "4", "4"))
    g1 = per_turn(math_trajectory("g", 1, 3, "5", "4"))
    g2 = per_turn(math_trajectory("g", 2, 2, "5", "4"))
    repeat = per_turn(math_trajectory("g", 0, 3, "4", "4", tid=g0[0].trajectory_id))[1]  # same (id, index 1)
    rows = rewarded(g0 + [repeat] + g1 + [g2[1]], {"g/0": 1.0, "g/1": 0.0, "g/2": 0.0})  # g2 lacks turn 0
    table = rows_to_table(rows)
    result = apply_rules(table, FilterConfig(), 0)
    outcome = dict.fromkeys(range(table.num_rows), "kept")
    outcome.update(dict(result.drops))
    assert [outcome[i] for i in range(table.num_rows)] == ["kept"] * 3 + ["duplicate"] + ["kept"] * 3 + ["completeness"]
    # a trajectory whose final row failed (reward null) goes whole, not just that row
    rows[2].reward = None
    result = apply_rules(rows_to_table(rows), FilterConfig(), 0)
    assert not result.keep[:4].any()


def test_filter_drops_a_trajectory_whole_when_a_where_rule_hits_one_row(tmp_path):
    g0 = per_turn(math_trajectory("g", 0, 3, "4", "4"))
    rows = rewarded(g0 + per_turn(math_trajectory("g", 1, 2, "5", "4"), math_trajectory("g", 2, 2, "4", "4")),
                    {"g/0": 1.0, "g/1": 0.0, "g/2": 1.0})
    result = apply_rules(rows_to_table(rows), FilterConfig(where="finish_reason = 'continued' or sample_index <> 0"), 0)
    assert result.keep.tolist() == [False] * 3 + [True] * 4
    assert result.counts["where"] == 3


def test_batches_never_split_a_trajectory(tmp_path):
    rows = [r for g in range(3) for s in range(2) for r in split_per_turn(math_trajectory(f"g{g}", s, 2 + g, "4", "4"))]
    rows = rewarded(rows, {f"g{g}/{s}": float(s) for g in range(3) for s in range(2)})
    write(rows, tmp_path / "rewarded" / "part-1.parquet")
    run_filter(str(tmp_path / "rewarded"), str(tmp_path / "batches"), FilterConfig(batch_groups=2), 0)
    batches = [read_shard(u) for u in scan(str(tmp_path / "batches")).shards]
    assert [b.num_rows for b in batches] == [2 * 2 + 2 * 3, 2 * 4]
    seen = [set(b.column("trajectory_id").to_pylist()) for b in batches]
    assert not seen[0] & seen[1] and sum(map(len, seen)) == 6


# ----------------------------------------------------------------------------------------------- train


def test_trajectory_shares_count_a_per_turn_trajectory_once():
    rows = per_turn(math_trajectory("g", 0, 3, "4", "4")) + [math_trajectory("w", 0, 2, "4", "4")]
    shares, n = trajectory_shares(rows_to_table(rows))
    # three rows of 3 sampled tokens each -> 1/3 each; the whole row -> 1; two trajectories
    assert shares == pytest.approx([1 / 3, 1 / 3, 1 / 3, 1.0]) and n == 2


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_per_turn_rows_train_like_their_whole_trajectory(loss_agg):
    """Split into per-turn rows (each turn's prompt = the whole row's prefix before it), a trajectory gives
    the loss its whole row gives: a 10-turn trajectory does not weigh 10 rows' worth in any loss mode."""
    whole = synthetic_rows(2, group_size=2, seed=3, mean_turns=3, tokens_per_turn=10)
    for i, row in enumerate(whole):
        row.status, row.advantage, row.weight = "ok", (-1.0) ** i, 1.0
    split = [part for row in whole for part in split_per_turn(row)]
    assert len(split) > len(whole)
    model = load_model(tiny_model_dir())
    cfg = TrainConfig(loss_agg=loss_agg, micro_tokens=4096)
    losses = []
    for rows in (whole, split):
        model.zero_grad()
        losses.append(forward_backward(model, None, rows_to_table(rows), cfg)["loss"])
    assert losses[1] == pytest.approx(losses[0], rel=1e-4, abs=1e-6)


@pytest.mark.slow
def test_reward_filter_train_end_to_end_on_per_turn_rows(tmp_path):
    """rollouts (per-turn) -> reward math -> filter -> train on the tiny model: one finite step per batch."""
    trajs = [math_trajectory(f"g{g}", s, 2 + (g + s) % 3, answer, "4")
             for g in range(2) for s, answer in enumerate(["4", "5", "4", "7"])]
    write(per_turn(*trajs), tmp_path / "rollouts" / "part-1.parquet")
    summary = reward_dir(str(tmp_path / "rollouts"), str(tmp_path / "rewarded"), get_reward("math"))
    assert summary.rows == sum(len(t.turns) for t in trajs) and not summary.row_errors
    run_filter(str(tmp_path / "rewarded"), str(tmp_path / "batches"), FilterConfig(batch_groups=1), 0)
    batches = [read_shard(u) for u in scan(str(tmp_path / "batches")).shards]
    assert len(batches) == 2 and sum(b.num_rows for b in batches) == summary.rows
    for batch in batches:
        assert set(batch.column("finish_reason").to_pylist()) == {"continued", "submit"}
    result = train(str(tmp_path / "batches"), str(tiny_model_dir()), str(tmp_path / "ckpt"),
                   TrainConfig(lr=1e-3, micro_tokens=256), metrics_url=str(tmp_path / "metrics"))
    assert result["steps"] == 2 and result["skipped_nonfinite"] == 0
    metrics = pa.concat_tables([pq.read_table(os.path.join(tmp_path / "metrics", f))
                                for f in sorted(os.listdir(tmp_path / "metrics")) if f.startswith("train")])
    assert all(torch.isfinite(torch.tensor(metrics.column("loss").to_pylist())))
    assert metrics.column("rows").to_pylist() == [b.num_rows for b in batches]
