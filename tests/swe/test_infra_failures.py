"""An infrastructure failure is never a model failure: a grader that cannot run the tests gives reward null.

Real graders in real sandboxes: a docker image whose interpreter lacks pytest (built from the base image
in the test), through `arlctl reward` on a shard of gold-patch rows: null rewards with the cause, exit 1;
the same rows graded in the base image score 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from swe_helpers import grading_factory, run

from arlctl.envs.swe.grader import grade
from arlctl.envs.swe.tasks import load_suite_task
from arlctl.io.shards import Lineage, read_shard, write_shard
from arlctl.schemas.rows import TrajectoryRow, rows_to_table

NO_PYTEST_IMAGE = "arlctl/test-nopytest:1"
# One worker builds and removes the image: two would race on the engine (one's teardown removes the other's).
pytestmark = pytest.mark.xdist_group("no-pytest-image")


@pytest.fixture(scope="module")
def no_pytest_image():
    """The base sandbox image with pytest removed, built on the test's engine (no registry needed)."""
    grading_factory("docker")  # skips without an engine and its base image
    import io

    from arlctl.sandbox.docker import DEFAULT_IMAGE, docker_client

    client = docker_client(timeout=120)
    dockerfile = (f"FROM {DEFAULT_IMAGE}\nUSER root\n"
                  "RUN rm -rf /usr/lib/python3/dist-packages/pytest /usr/lib/python3/dist-packages/_pytest\n")
    client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=NO_PYTEST_IMAGE, rm=True)
    yield NO_PYTEST_IMAGE
    client.images.remove(NO_PYTEST_IMAGE, force=True)
    client.close()


def _gold_rows(task, n: int) -> list[TrajectoryRow]:
    return [TrajectoryRow(group_id="g", sample_index=i, task_id=task["task_id"], env="swe", env_version="swe-1",
                          task=task, policy="oracle", prompt_text="fix it", prompt_ids=[1, 2], response_ids=[3],
                          response_mask=[1], response_logprobs=[-0.1], final_state=task["patch"], finish_reason="submit")
            for i in range(n)]


def _reward(run_dir, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "arlctl.cli.main", "reward", "--run", str(run_dir), "--reward", "swe",
                           "--reward-opt", "sandbox=docker", *options, "--json"], capture_output=True, text=True,
                          timeout=600)


@pytest.mark.docker
def test_a_grader_without_pytest_gives_null_rewards_and_exit_1(tmp_path, no_pytest_image):
    task = load_suite_task("stockroom-001")
    run_dir = tmp_path / "run"
    write_shard(rows_to_table(_gold_rows(task, 2)), str(run_dir / "rollouts" / "part-a.parquet"), Lineage("rollout"))

    broken = _reward(run_dir, "--reward-opt", f"image={no_pytest_image}")
    assert broken.returncode == 1, broken.stderr
    assert "no row got a reward" in broken.stderr and "cannot import pytest" in broken.stderr
    table = read_shard(str(run_dir / "rewarded" / "part-a.parquet"))
    assert table.column("reward").to_pylist() == [None, None]  # never a 0 inside the group
    for info in map(json.loads, table.column("reward_info").to_pylist()):
        assert info["infra"] is True and "cannot import pytest" in info["error"]
    metrics = [p for p in (run_dir / "metrics").iterdir() if p.name.startswith("reward-")]
    [causes] = pq.read_table(metrics[0]).column("error_causes").to_pylist() if len(metrics) == 1 else [None]
    assert json.loads(causes) == {"infra:grader_no_pytest": 2}  # RUN/metrics says why, by cause

    healthy = tmp_path / "healthy"
    write_shard(rows_to_table(_gold_rows(task, 1)), str(healthy / "rollouts" / "part-a.parquet"), Lineage("rollout"))
    fine = _reward(healthy)
    assert fine.returncode == 0, fine.stderr
    assert read_shard(str(healthy / "rewarded" / "part-a.parquet")).column("reward").to_pylist() == [1.0]


@pytest.mark.docker
def test_grade_reports_the_missing_pytest_before_running_anything(no_pytest_image):
    from arlctl.envs.swe.grader import sandbox_factory

    task = load_suite_task("stockroom-001")
    value, _, info = run(grade(task, task["patch"], sandbox_factory("docker", image=no_pytest_image)))
    assert value is None and info["infra"] is True and info["exit_code"] is None
    assert "cannot import pytest" in info["error"]


def test_a_diff_that_does_not_apply_is_the_policys_zero_not_null(bwrap_grader):
    """The other side of the line: a broken diff is the policy's failure, so it scores 0."""
    task = load_suite_task("stockroom-001")
    broken = task["patch"].replace("-    return item.quantity < item.reorder_at", "-    return something else")
    value, _, info = run(grade(task, broken, bwrap_grader))
    assert value == 0.0 and info.get("infra") is None and info["apply_ok"] is False


@pytest.fixture(scope="module")
def bwrap_grader():
    return grading_factory("bwrap")


class _KilledMidEpisode:
    """A real SweEnv whose sandbox processes are SIGKILLed from outside before its second step."""

    def __init__(self):
        from arlctl.envs.swe.env import SweEnv

        self.inner, self.steps = SweEnv(sandboxes=1), 0
        self.name, self.version = "swe", self.inner.version if hasattr(self.inner, "version") else "swe-1"

    async def reset(self, task):
        return await self.inner.reset(task)

    async def step(self, action):
        import signal

        self.steps += 1
        if self.steps == 2:
            os.kill(self.inner.sandbox._proc.pid, signal.SIGKILL)  # bwrap, and with it everything inside
            await self.inner.sandbox._proc.wait()
        return await self.inner.step(action)

    async def final_state(self):
        return await self.inner.final_state()

    async def close(self):
        await self.inner.close()


def _oracle_rollout(tokenizer, env_factory, **options):
    """The real rollout stage on stockroom-001 with the oracle policy (its gold fix, as tool calls)."""
    from arlctl.envs.swe.oracle import OraclePolicy
    from arlctl.stages.agent_loop import RolloutConfig
    from arlctl.stages.rollout import rollout

    cfg = RolloutConfig(env="swe", group_size=1, concurrency=1, max_turns=6, max_new_tokens=256, **options)
    rows: list = []

    async def sink(group):
        rows.extend(group)

    async def go():  # each env here wraps a SweEnv of its own, which closes its own pool
        return await rollout([load_suite_task("stockroom-001")], OraclePolicy(tokenizer), env_factory, cfg, sink)

    return run(go()), rows


def test_a_sandbox_killed_mid_episode_is_env_error_and_filter_drops_it(tokenizer, bwrap_grader):
    """Not a tool error shown to the model, not a graded empty diff: the row is env_error, then dropped."""
    from arlctl.stages.configs import FilterConfig
    from arlctl.stages.filter import apply_rules

    stats, rows = _oracle_rollout(tokenizer, _KilledMidEpisode)
    [row] = rows
    assert (row.status, row.finish_reason) == ("env_error", "error"), (row.status, row.turns[-1].error)
    assert "sandbox" in (row.turns[-1].error or "") and stats.errors >= 1
    assert stats.causes.get("infra:env_failure") == 1 and stats.outcomes == {"env_error": 1}  # counted as infra
    assert len(row.turns) == 2  # it ended at the broken step; no error observation went back to the model
    row.reward = 0.0  # even a reward on it would not let it through
    result = apply_rules(rows_to_table(rows), FilterConfig(), 0)
    assert result.keep.tolist() == [False] and result.counts["completeness"] == 1


class _KilledOnce(_KilledMidEpisode):
    """Only the first env of the run has its sandbox killed; the resampled member gets a healthy one."""

    made = 0

    def __init__(self):
        super().__init__()
        type(self).made += 1
        if type(self).made > 1:
            self.steps = -10**6  # never reaches the kill


@pytest.mark.slow
def test_top_up_resamples_the_env_error_member_so_the_group_stays_whole(tokenizer, bwrap_grader):
    _KilledOnce.made = 0
    stats, rows = _oracle_rollout(tokenizer, _KilledOnce, max_top_up=1)
    [row] = rows
    task = load_suite_task("stockroom-001")  # one member: the failed attempt was replaced, not added
    assert (row.status, row.sample_index, stats.top_ups) == ("ok", 0, 1)
    value, _, info = run(grade(task, row.final_state, bwrap_grader))
    assert value == 1.0, info


@pytest.mark.slow
def test_max_top_up_must_not_be_negative(tmp_path):
    result = subprocess.run([sys.executable, "-m", "arlctl.cli.main", "rollout", "--env", "math", "--tasks",
                             "builtin:math?n=1", "--policy", "tiny", "--out", str(tmp_path / "out"), "--top-up",
                             "--max-top-up", "-1"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "--max-top-up must be >= 0" in result.stderr
