"""`arlctl rollout`'s job is assembled below the CLI (stages/rollout_job.plan_rollout) from the declared
RolloutOptions: the Python API checks and builds what the command runs, and nothing is made on a failed check."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from arlctl.cli.main import app
from arlctl.errors import UsageError
from arlctl.stages.agent_loop import RolloutConfig
from arlctl.stages.jobs import RolloutOptions
from arlctl.stages.rollout_job import plan_rollout

TASKS = "builtin:math?n=8&seed=0"


def test_the_plan_is_the_workers_share_with_its_own_lock_and_the_policy_resolved(tmp_path):
    out = tmp_path / "rollouts"
    opts = RolloutOptions(env="math", tasks=[TASKS], policy="tiny", out=str(out), worker="1/2", top_up=True)
    job = plan_rollout(RolloutConfig(group_size=2), opts)
    every = plan_rollout(RolloutConfig(group_size=2), RolloutOptions(env="math", tasks=[TASKS], policy="tiny",
                                                                        out=str(out)))
    assert len(every.tasks) == 8 and 0 < len(job.tasks) < 8  # worker 1 of 2 takes its share only
    assert job.lock_name == "rollout-worker1of2" and every.lock_name == "rollout"
    assert (job.policy.spec, job.policy.version, job.cfg.max_top_up) == ("tiny", 0, 2)
    assert job.out == str(out) and not out.exists()  # planning makes nothing


def test_a_missing_policy_is_a_usage_error_and_makes_no_output(tmp_path):
    out = tmp_path / "rollouts"
    with pytest.raises(UsageError, match="policy 'nope' not found"):
        plan_rollout(RolloutConfig(), RolloutOptions(env="math", tasks=[TASKS], policy="nope", out=str(out)))
    assert not out.exists()


@pytest.mark.slow
def test_a_dry_run_of_a_scripted_policy_shows_the_first_prompt_with_its_tokenizer():
    done = CliRunner().invoke(app, ["rollout", "--env", "math", "--tasks", TASKS, "--policy", "oracle:calculator",
                                    "--dry-run"])
    assert done.exit_code == 0, done.output
    assert "first prompt" in done.output and "would roll out 8 tasks; nothing written" in done.output
