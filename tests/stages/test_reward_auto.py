"""`arlctl reward --reward auto` (each row by its env's reward), --max-error-frac, and the reward metrics row,
through the real CLI on real shards."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from arlctl.cli.main import app
from arlctl.envs import registry
from arlctl.io.shards import Lineage, read_shard, write_shard
from arlctl.schemas.rows import TrajectoryRow, Turn, rows_to_table
from arlctl.stages.reward import error_cause

runner = CliRunner()


def row(env: str, task_id: str, answer: str, gold: str) -> TrajectoryRow:
    return TrajectoryRow(group_id="g-" + task_id, sample_index=0, task_id=task_id, env=env, env_version=f"{env}-1",
                         task={"task_id": task_id, "question": "q?", "answer": gold}, policy="p", prompt_text="p",
                         prompt_ids=[1, 2], response_ids=[3, 4], response_mask=[1, 1], response_logprobs=[-0.1, -0.2],
                         turns=[Turn(0, 0, 2, 0, f"<answer>{answer}</answer>")], final_state=answer)


def rollouts(run, rows: list[TrajectoryRow]) -> None:
    write_shard(rows_to_table(rows), str(run / "rollouts" / "part-1.parquet"), Lineage(stage="rollout"))


def cli(*args):
    return runner.invoke(app, [str(a) for a in args])


def metrics_row(run) -> dict:
    (path,) = (run / "metrics").glob("reward-*.parquet")
    (got,) = pq.read_table(path).to_pylist()
    return got


def test_auto_scores_each_row_with_its_env_reward_and_nulls_an_env_without_one(tmp_path, monkeypatch):
    # "plugged" stands for a plugin env whose package also registers a reward of the same name (what an
    # arlctl.rewards entry point does once loaded); "toyplugin" is a plugin env that registers none.
    monkeypatch.setitem(registry.REWARDS, "plugged", (lambda final_state, task, text: (0.25, {"p": 0.25}, {}),
                                                     "plugged-3"))
    run = tmp_path / "run"
    rollouts(run, [row("math", "a", "4", "4"), row("math", "b", "5", "4"), row("toyplugin", "c", "4", "4"),
                   row("plugged", "d", "4", "4"), row("math", "e", "4", "4")])
    result = cli("reward", "--run", run, "--reward", "auto", "--json")
    assert result.exit_code == 0, result.output
    out = {r["task_id"]: r for r in read_shard(str(run / "rewarded" / "part-1.parquet")).to_pylist()}
    assert [out[k]["reward"] for k in "abde"] == [1.0, 0.0, 0.25, 1.0]
    assert [out[k]["reward_version"] for k in "abde"] == ["math-1", "math-1", "plugged-3", "math-1"]
    assert out["c"]["reward"] is None  # not 0: nothing graded it
    assert json.loads(out["c"]["reward_info"])["error"] == "no reward registered for env toyplugin"
    metrics = metrics_row(run)
    assert (metrics["rows"], metrics["rewarded"], metrics["errors"]) == (5, 4, 1)
    assert json.loads(metrics["error_causes"]) == {"no_reward_for_env": 1}
    assert metrics["seconds"] >= 0


def test_auto_takes_per_env_options_and_refuses_unprefixed_ones(tmp_path):
    run = tmp_path / "run"
    rollouts(run, [row("math", "a", "4", "4")])
    result = cli("reward", "--run", run, "--reward", "auto", "--reward-opt", "format_weight=0.1")
    assert result.exit_code == 2 and "ENV.KEY=VALUE" in result.output
    result = cli("reward", "--run", run, "--reward", "auto", "--reward-opt", "math.format_weight=0.1")
    assert result.exit_code == 0, result.output
    (got,) = read_shard(str(run / "rewarded" / "part-1.parquet")).to_pylist()
    assert got["reward_version"] == "math-1+format_weight=0.1"


def test_max_error_frac_exits_1_after_writing_naming_the_most_common_cause(tmp_path):
    run = tmp_path / "run"
    rollouts(run, [row("toyplugin", "a", "4", "4"), row("toyplugin", "b", "4", "4"), row("toyplugin", "c", "4", "4"),
                   row("math", "d", "4", "4")])
    result = cli("reward", "--run", run, "--reward", "auto")
    assert result.exit_code == 1
    assert "3 of 4 rows got no reward" in result.output and "no_reward_for_env (3 rows)" in result.output
    out = read_shard(str(run / "rewarded" / "part-1.parquet")).to_pylist()  # written before the exit
    assert [r["reward"] for r in out] == [None, None, None, 1.0]
    assert json.loads(metrics_row(run)["error_causes"]) == {"no_reward_for_env": 3}
    # the same rows with a looser threshold pass (into a fresh output directory)
    result = cli("reward", "--in", run / "rollouts", "--out", run / "rewarded-2", "--reward", "auto",
                 "--max-error-frac", "0.8")
    assert result.exit_code == 0, result.output
    assert cli("reward", "--run", run, "--reward", "auto", "--max-error-frac", "2").exit_code == 2


def test_every_row_failing_still_exits_1(tmp_path):
    run = tmp_path / "run"
    rollouts(run, [row("toyplugin", "a", "4", "4")])
    result = cli("reward", "--run", run, "--reward", "auto", "--max-error-frac", "1")
    assert result.exit_code == 1 and "no row got a reward" in result.output


@pytest.mark.parametrize(("error", "infra", "cause"), [
    ("the sandbox interpreter /usr/bin/python3 cannot import pytest: ModuleNotFoundError", True,
     "infra:grader_no_pytest"),
    ("pytest did not start (exit 1): No module named 'pytest'", True, "infra:grader_no_pytest"),
    ("grading driver produced no report (exit 137): killed", True, "infra:grader_no_report"),
    ("test_patch does not apply: error: patch failed", True, "infra:grader_error"),
    ("the grading harness failed", True, "infra:grader_error"),
    ("the reward function failed on this row (ValueError: x)", False, "reward_error"),
    ("no reward registered for env toyplugin", False, "no_reward_for_env"),
    ("the last row of this per-turn trajectory is not in this shard", False, "incomplete_trajectory"),
])
def test_error_causes_follow_the_grader_texts(error, infra, cause):
    assert error_cause(error, infra) == cause


def test_auto_checks_per_env_options_before_any_row(tmp_path):
    run = tmp_path / "run"
    rollouts(run, [row("math", "a", "4", "4")])
    result = cli("reward", "--run", run, "--reward", "auto", "--reward-opt", "math.no_such_option=1")
    assert result.exit_code == 2 and "bad option for reward 'math'" in result.output
    assert not (run / "rewarded" / "part-1.parquet").exists()
