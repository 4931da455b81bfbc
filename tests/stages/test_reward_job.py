"""The reward stage's job (stages/reward_job.py) does what `arlctl reward` does, without the CLI: the same
output, the metrics row (with its truncated count), and the verdict that decides the exit."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from arlctl.cli.main import app
from arlctl.errors import TerminalError, UsageError
from arlctl.io.shards import Lineage, read_shard, write_shard
from arlctl.schemas.rows import TrajectoryRow, Turn, rows_to_table
from arlctl.stages import reward_job
from arlctl.stages.configs import RewardConfig
from arlctl.stages.jobs import RewardOptions

runner = CliRunner()


def row(task_id: str, env: str, text: str, answer: str | None = "4", status: str = "ok") -> TrajectoryRow:
    task = {"task_id": task_id, "question": "2 + 2?"} | ({"answer": answer} if answer is not None else {})
    return TrajectoryRow(group_id="g-" + task_id, sample_index=0, task_id=task_id, env=env, env_version=f"{env}-1",
                         task=task, policy="p", prompt_text="p", prompt_ids=[1, 2], response_ids=[3, 4],
                         response_mask=[1, 1], response_logprobs=[-0.1, -0.2], turns=[Turn(0, 0, 2, 0, text)],
                         final_state=text.removeprefix("<answer>").removesuffix("</answer>") if env == "math" else text,
                         status=status,
                         finish_reason="length" if status == "truncated" else "stop")


def rollouts(run, rows) -> None:
    write_shard(rows_to_table(rows), os.path.join(run, "rollouts", "part-1.parquet"), Lineage(stage="rollout"))


def test_run_job_writes_what_the_cli_writes_and_a_metrics_row(tmp_path):
    rows = [row("a", "math", "<answer>4</answer>"), row("b", "math", "<answer>5</answer>"),
            row("c", "math", "<answer>4", status="truncated")]
    by_job, by_cli = str(tmp_path / "job"), str(tmp_path / "cli")
    rollouts(by_job, rows)
    rollouts(by_cli, rows)
    job = reward_job.plan_reward(RewardConfig(reward="math", on_truncated="zero"), RewardOptions(run=by_job))
    total = reward_job.run_job(job)
    assert reward_job.verdict(job, total) is None
    result = runner.invoke(app, ["reward", "--run", by_cli, "--reward", "math", "--on-truncated", "zero", "--json"])
    assert result.exit_code == 0, result.output
    cli = json.loads(result.stdout.strip().splitlines()[-1])
    job_summary = reward_job.summary(job, total)
    for key in ("rows", "mean_reward", "truncated", "on_truncated", "reward_version", "row_errors", "envs"):
        assert job_summary[key] == cli[key], key
    assert job_summary["rows"] == 3 and job_summary["truncated"] == 1 and job_summary["envs"] == ["math"]
    for run in (by_job, by_cli):
        rewards = read_shard(os.path.join(run, "rewarded", "part-1.parquet")).column("reward").to_pylist()
        assert rewards[0] > rewards[1] and rewards[2] == 0.0  # the cut reply: 0 by --on-truncated zero
        metrics = [f for f in os.listdir(os.path.join(run, "metrics")) if f.startswith("reward-")]
        assert len(metrics) == 1
        metric = pq.read_table(os.path.join(run, "metrics", metrics[0])).to_pylist()[0]
        assert (metric["rows"], metric["truncated"], metric["on_truncated"]) == (3, 1, "zero")
    assert total.metrics is not None and os.path.exists(total.metrics)


def test_verdict_names_the_rows_env_when_the_reward_is_not_theirs(tmp_path):
    # A careless default: first-token rows rewarded with math (the default --reward) all fail; the exit is 1
    # and the hint names their env and --reward auto, which scores them.
    run = str(tmp_path / "run")
    rollouts(run, [row(f"t{i}", "first-token", " yes", answer=None) for i in range(3)])
    job = reward_job.plan_reward(RewardConfig(), RewardOptions(run=run))
    total = reward_job.run_job(job)
    error = reward_job.verdict(job, total)
    assert isinstance(error, TerminalError) and "no row got a reward" in str(error)
    assert "first-token" in error.hint and "--reward auto" in error.hint
    # A weighted reward expression is meant for any env's rows: its hint does not name --reward auto.
    weighted = reward_job.plan_reward(RewardConfig(reward="1.0*math"),
                                      RewardOptions(in_url=f"{run}/rollouts", out=f"{run}/rewarded-weighted"))
    total = reward_job.run_job(weighted)
    assert total.rows == 3 and total.rewarded == 0
    assert "--reward auto" not in reward_job.verdict(weighted, total).hint
    # The same output again with --reward auto: the math-rewarded shard is kept, and that is an error, not a skip.
    again = runner.invoke(app, ["reward", "--run", run, "--reward", "auto", "--no-cache"])
    assert again.exit_code == 1 and "rewarded earlier with other reward settings" in again.output, again.output
    assert "(rewarded with math" in again.output and "new --out" in again.output
    fresh = runner.invoke(app, ["reward", "--run", run, "--reward", "auto", "--out", f"{run}/rewarded-auto"])
    assert fresh.exit_code == 0, fresh.output
    rewards = read_shard(os.path.join(run, "rewarded-auto", "part-1.parquet")).column("reward").to_pylist()
    assert rewards == [1.0, 1.0, 1.0]
    same = runner.invoke(app, ["reward", "--run", run, "--reward", "auto", "--out", f"{run}/rewarded-auto"])
    assert same.exit_code == 0 and "skipped 1 already consumed" in same.output, same.output


def test_plan_checks_before_anything_is_written(tmp_path):
    run = str(tmp_path / "run")
    rollouts(run, [row("a", "math", "<answer>4</answer>")])
    with pytest.raises(UsageError, match="worker"):
        reward_job.plan_reward(RewardConfig(), RewardOptions(run=run, worker="3"))
    with pytest.raises(UsageError):
        reward_job.plan_reward(RewardConfig(reward="auto", reward_opt=["sandbox=docker"]), RewardOptions(run=run))
    with pytest.raises(UsageError):
        reward_job.plan_reward(RewardConfig(), RewardOptions(in_url=str(tmp_path / "missing"),
                                                            out=str(tmp_path / "out")))
    assert sorted(os.listdir(run)) == ["rollouts"] and not (tmp_path / "out").exists()


def test_worker_shares_take_their_own_lock(tmp_path):
    run = str(tmp_path / "run")
    rollouts(run, [row("a", "math", "<answer>4</answer>")])
    assert reward_job.plan_reward(RewardConfig(), RewardOptions(run=run)).lock_name == "reward"
    assert reward_job.plan_reward(RewardConfig(), RewardOptions(run=run, worker="1/3")).lock_name == \
        "reward-worker1of3"
