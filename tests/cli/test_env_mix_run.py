"""Environment mixes end to end (issue 13 item 6): `arlctl rollout --env-mix` over two real, fast envs
with the real tiny model, then `reward --reward auto`, `inspect` and `status` per env.

1,000 groups (G=1, one token each, so the run stays ~30 s on two cores) must land within ±5% of the
requested ratio, every row must have been run by the env its task names (its prompt is that env's), and
the auto reward must score each row with its own env's reward.
"""

from __future__ import annotations

import json

import duckdb
import pytest
from typer.testing import CliRunner

from arlctl.cli.main import app

runner = CliRunner()


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("mix") / "run"
    result = runner.invoke(app, [
        "rollout", "--env-mix", "first-token:0.7,math:0.3", "--tasks", "first-token=builtin:first-token?n=64",
        "--tasks", "math=builtin:math?n=64", "--limit", "1000", "-G", "1", "--max-turns", "1",
        "--max-new-tokens", "1", "--policy", "tiny", "--run", str(run), "-c", "128", "--max-batch", "64",
        "--seed", "3", "--flush-groups", "250", "-q", "--json"])
    assert result.exit_code == 0, result.output
    return run, json.loads(result.stdout.strip().splitlines()[0])


@pytest.mark.slow
def test_a_1000_group_mix_lands_within_5_percent_of_the_ratio(mixed_run):
    run, summary = mixed_run
    assert summary["groups"] == 1000 and summary["rows_written"] == 1000 and summary["errors"] == 0
    rows = duckdb.sql(f"select env, task_id, prompt_text from '{run}/rollouts/*.parquet'").fetchall()
    counts = {"first-token": 0, "math": 0}
    for env, task_id, prompt in rows:
        counts[env] += 1
        # the row was run by the env its task names: its task ids and prompt are that env's
        assert task_id.startswith("ft-") == (env == "first-token")
        assert ("calculator" in prompt) == (env == "math")
    assert abs(counts["first-token"] / 1000 - 0.7) <= 0.05 * 0.7
    assert abs(counts["math"] / 1000 - 0.3) <= 0.05 * 0.3


@pytest.mark.slow
def test_reward_auto_inspect_and_status_break_the_mix_down_per_env(mixed_run):
    run, _ = mixed_run
    result = runner.invoke(app, ["reward", "--run", str(run), "--reward", "auto", "--json"])
    # a one-token math answer is never right, so rewards are 0 there, but every row must be scored
    assert result.exit_code == 0, result.output
    by_env = duckdb.sql(f"select env, count(*), count(reward), min(reward_version), max(reward_version) "
                        f"from '{run}/rewarded/*.parquet' group by env order by env").fetchall()
    assert [(env, n, scored) for env, n, scored, *_ in by_env] == [("first-token", 700, 700), ("math", 300, 300)]
    versions = {env: (low, high) for env, _, _, low, high in by_env}
    assert versions["first-token"][0] == versions["first-token"][1] and versions["first-token"][0].startswith("first-token")
    assert versions["math"][0].startswith("math")

    inspected = runner.invoke(app, ["inspect", f"{run}/rewarded", "--json"])
    assert inspected.exit_code == 0, inspected.output
    envs = json.loads(inspected.stdout)["by_env"]
    assert envs["first-token"]["rows"] == 700 and envs["math"]["rows"] == 300
    assert envs["math"]["mean_reward"] == 0.0 and 0.0 <= envs["first-token"]["mean_reward"] <= 1.0

    status = runner.invoke(app, ["status", str(run), "--json"])
    assert status.exit_code == 0, status.output
    state = json.loads(status.stdout)
    assert set(state["by_env"]) == {"first-token", "math"}
    assert state["by_env"]["math"]["rewarded"]["rows"] == 300
