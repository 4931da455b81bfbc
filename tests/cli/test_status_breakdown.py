"""Per-env and per-cause breakdowns of `arlctl status` and `arlctl inspect`, on real shards and real
metrics files in a temporary run directory, through the real CLI."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from arlctl.cli.main import app
from arlctl.io.shards import Lineage, write_shard, write_table_atomic
from arlctl.synthetic import synthetic_table

runner = CliRunner()


def arlctl(*args: str):
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result


def _shard(run, kind: str, name: str, table: pa.Table, inputs: list[str]) -> None:
    write_shard(table, str(run / kind / name), Lineage(stage=kind, inputs=inputs))


def _metrics(run, name: str, **columns) -> None:
    write_table_atomic(pa.table({k: [v] for k, v in columns.items()}), str(run / "metrics" / name))


def _mean(rows: list[dict], env: str) -> float:
    rewards = [r["reward"] for r in rows if r["env"] == env and r["reward"] is not None]
    return sum(rewards) / len(rewards)


@pytest.fixture
def mixed_run(tmp_path):
    """rollouts/part-a (math 2 + swe 2 rows) rewarded; rollouts/part-b (math 6 rows) waiting at reward;
    metrics: an old rollout file without error_causes, two rollout files and one reward file with it."""
    run = tmp_path / "run"
    part_a = synthetic_table(2, 2, seed=3, envs=("math", "swe"), mean_turns=2, tokens_per_turn=4)
    part_b = synthetic_table(3, 2, seed=4, envs=("math",), mean_turns=2, tokens_per_turn=4, rewarded=False)
    rewarded = synthetic_table(2, 2, seed=3, envs=("math", "swe"), mean_turns=2, tokens_per_turn=4)
    _shard(run, "rollouts", "part-a.parquet", part_a, [])
    _shard(run, "rollouts", "part-b.parquet", part_b, [])
    _shard(run, "rewarded", "part-a.parquet", rewarded, ["part-a.parquet"])
    _metrics(run, "rollout-20260101T000000000000Z-00000000.parquet", errors=1.0, last_error="old")
    _metrics(run, "rollout-20260101T000001000000Z-00000001.parquet", errors=3.0, last_error="x",
             error_causes=json.dumps({"infra:sandbox_died": 2, "policy_error": 1}))
    _metrics(run, "rollout-20260101T000002000000Z-00000002.parquet", errors=4.0, last_error="y",
             error_causes=json.dumps({"infra:sandbox_died": 1, "infra:reset_failed": 3}))
    _metrics(run, "reward-20260101T000003000000Z-00000003.parquet", errors=4.0, last_error="z",
             error_causes=json.dumps({"reward_error": 1, "infra:grader_no_pytest": 4}))
    return run, rewarded.to_pylist()


def test_status_json_breaks_rows_and_recent_reward_down_per_env(mixed_run):
    run, rewarded_rows = mixed_run
    state = json.loads(arlctl("status", str(run), "--json").stdout)
    by_env = state["by_env"]
    assert list(by_env) == ["math", "swe"]
    # math: 2 rows in part-a (consumed by reward) + 6 in part-b (waiting); swe: 2 rows in part-a only
    assert by_env["math"]["rollouts"] == {"rows": 8, "waiting_rows": 6}
    assert by_env["swe"]["rollouts"] == {"rows": 2, "waiting_rows": 0}
    # rewarded/part-a is not consumed by any filter yet: all its rows wait at the filter
    assert by_env["math"]["rewarded"] == {"rows": 2, "waiting_rows": 2}
    assert by_env["swe"]["rewarded"] == {"rows": 2, "waiting_rows": 2}
    assert by_env["swe"]["batches"] == {"rows": 0, "waiting_rows": 0}
    for env in ("math", "swe"):
        recent = by_env[env]["recent_reward"]
        assert recent["rows"] == 2 and recent["mean_reward"] == pytest.approx(_mean(rewarded_rows, env))
    # per-env rows add up to the stage totals
    assert sum(e["rollouts"]["rows"] for e in by_env.values()) == state["stages"]["rollout"]["output_rows"]
    assert sum(e["rollouts"]["waiting_rows"] for e in by_env.values()) == state["stages"]["reward"]["waiting_rows"]


def test_status_sums_error_causes_over_all_metrics_files_infra_first(mixed_run):
    run, _ = mixed_run
    state = json.loads(arlctl("status", str(run), "--json").stdout)
    causes = state["error_causes"]
    assert causes["rollout"] == {"infra:reset_failed": 3, "infra:sandbox_died": 3, "policy_error": 1}
    assert list(causes["rollout"]) == ["infra:reset_failed", "infra:sandbox_died", "policy_error"]
    assert list(causes["reward"].items()) == [("infra:grader_no_pytest", 4), ("reward_error", 1)]
    assert state["errors"]["rollout"]["errors"] == 4.0  # the newest file still drives "errors"


def test_status_human_output_shows_causes_and_the_env_table(mixed_run):
    run, _ = mixed_run
    text = arlctl("status", str(run)).output
    assert "error causes rollout" in text and "error causes reward" in text
    assert "infra:grader_no_pytest=4" in text and "infra:reset_failed=3" in text
    assert text.index("infra:sandbox_died=3") < text.index("policy_error=1")  # infra first
    assert "by env" in text and "recent reward" in text and "8/6 waiting" in text


def test_status_of_a_single_env_run_has_no_env_table_and_no_causes(tmp_path):
    run = tmp_path / "run"
    _shard(run, "rollouts", "part-a.parquet", synthetic_table(2, 2, seed=1, envs=("math",), mean_turns=1,
                                                              tokens_per_turn=4), [])
    _metrics(run, "rollout-20260101T000000000000Z-00000000.parquet", errors=0.0, last_error=None)
    state = json.loads(arlctl("status", str(run), "--json").stdout)
    assert list(state["by_env"]) == ["math"] and state["by_env"]["math"]["rollouts"]["waiting_rows"] == 4
    assert state["by_env"]["math"]["recent_reward"] == {"rows": 0, "mean_reward": None}
    assert state["error_causes"] == {}  # the only metrics file has no error_causes column
    text = arlctl("status", str(run)).output
    assert "by env" not in text and "error causes" not in text


def test_status_error_causes_tolerate_bad_values(tmp_path):
    """A causes value that is not a JSON object of counts adds nothing; the good ones still count."""
    run = tmp_path / "run"
    (run / "rollouts").mkdir(parents=True)
    _metrics(run, "rollout-20260101T000000000000Z-00000000.parquet", error_causes="not json")
    _metrics(run, "rollout-20260101T000001000000Z-00000001.parquet", error_causes='["a"]')
    _metrics(run, "rollout-20260101T000002000000Z-00000002.parquet", error_causes='{"crash": 2, "x": "many"}')
    state = json.loads(arlctl("status", str(run), "--json").stdout)
    assert state["error_causes"] == {"rollout": {"crash": 2}}


# ---------------------------------------------------------------------------------------------- inspect
def test_inspect_breaks_a_mixed_input_down_per_env(tmp_path):
    table = synthetic_table(4, 3, seed=5, envs=("math", "swe"), mean_turns=3, tokens_per_turn=4)
    write_shard(table, str(tmp_path / "in" / "part-0.parquet"), Lineage(stage="test"))
    rows = table.to_pylist()
    stats = json.loads(arlctl("inspect", str(tmp_path / "in"), "--json").stdout)
    by_env = stats["by_env"]
    assert list(by_env) == ["math", "swe"]
    for env in ("math", "swe"):
        mine = [r for r in rows if r["env"] == env]
        info = by_env[env]
        assert info["rows"] == info["trajectories"] == 6 and info["groups"] == 2
        statuses: dict[str, int] = {}
        for r in mine:
            statuses[r["status"]] = statuses.get(r["status"], 0) + 1
        assert info["status"] == statuses
        assert info["rewarded"] == 6 and info["mean_reward"] == pytest.approx(_mean(rows, env), abs=1e-4)
        assert info["mean_turns"] == pytest.approx(sum(r["num_turns"] for r in mine) / 6, abs=1e-4)
    text = arlctl("inspect", str(tmp_path / "in")).output
    assert "by env" in text and "mean turns" in text


def test_inspect_counts_per_turn_rows_once_per_trajectory(tmp_path):
    """Rows sharing a trajectory_id (per-turn history) add rows and turns, not trajectories."""
    table = synthetic_table(2, 2, seed=6, envs=("math",), mean_turns=2, tokens_per_turn=4)
    doubled = pa.concat_tables([table, table])  # every trajectory as two rows
    write_shard(doubled, str(tmp_path / "in" / "part-0.parquet"), Lineage(stage="test"))
    rows = table.to_pylist()
    info = json.loads(arlctl("inspect", str(tmp_path / "in"), "--json").stdout)["by_env"]["math"]
    assert info["rows"] == 8 and info["trajectories"] == 4 and info["groups"] == 2
    assert info["mean_turns"] == pytest.approx(2 * sum(r["num_turns"] for r in rows) / 4, abs=1e-4)
    assert info["mean_reward"] == pytest.approx(_mean(rows, "math"), abs=1e-4)


def test_inspect_single_env_unrewarded_keeps_the_human_output(tmp_path):
    table = synthetic_table(2, 2, seed=7, envs=("math",), mean_turns=1, tokens_per_turn=4, rewarded=False)
    write_shard(table, str(tmp_path / "in" / "part-0.parquet"), Lineage(stage="test"))
    info = json.loads(arlctl("inspect", str(tmp_path / "in"), "--json").stdout)["by_env"]
    assert info["math"]["rewarded"] == 0 and info["math"]["mean_reward"] is None
    text = arlctl("inspect", str(tmp_path / "in")).output
    assert "by env" not in text and "per env" in text
