"""Filter after a resumed rollout: a rollout stopped part-way leaves aborted members in a group, the re-run
writes those samples again under new ids in the same group, and `arlctl filter` packs that group whole
(every sample index once, no aborted try) instead of dropping it under group_integrity.

A real interrupted-then-resumed rollout (the job API the CLI drives, first-token env, a scripted policy that
stops the run the way Ctrl-C does), then `arlctl reward` and `arlctl filter` through the real CLI in process.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from typer.testing import CliRunner

from arlctl.cli.main import app
from arlctl.envs.tasks import load_tasks
from arlctl.io.shards import list_shards, read_shard
from arlctl.stages.agent_loop import RolloutConfig
from arlctl.stages.rollout_job import EnvPicker, RolloutJob, run_rollout
from tests.stages.test_rollout_resume import CountingPolicy  # " yes", and Ctrl-C at call N

TASKS = "builtin:first-token?n=4&seed=0"
G = 4
COLUMNS = ["trajectory_id", "group_id", "sample_index", "status"]


def roll(out: str, stop_at: int | None = None):
    cfg = RolloutConfig(env="first-token", group_size=G, concurrency=G, max_turns=1, max_new_tokens=8, seed=0)
    tasks = load_tasks(TASKS)
    picker = EnvPicker({})
    picker.check(tasks, "first-token")
    job = RolloutJob(cfg=cfg, tasks=tasks, envs=picker, out=out, sources=[TASKS], policy_spec="scripted-yes",
                     flush_groups=1)

    async def go():
        stop = asyncio.Event()
        return await run_rollout(job, CountingPolicy(stop, stop_at), stop, log=lambda line: None)

    return asyncio.run(go())


def rows_of(directory: str) -> list[dict]:
    return [r for shard in list_shards(directory) for r in read_shard(shard, columns=COLUMNS).to_pylist()]


@pytest.mark.slow
def test_a_group_completed_by_a_resumed_rollout_is_filtered_whole(tmp_path):
    run = tmp_path / "run"
    # Call 7 stops the run: group 0 (4 calls) is whole, group 1 has answered 2 samples and is written with
    # 2 ok and 2 aborted rows; the re-run writes its 2 missing samples and groups 2 and 3.
    assert roll(str(run / "rollouts"), stop_at=7).interrupted
    assert not roll(str(run / "rollouts")).interrupted
    rolled = rows_of(str(run / "rollouts"))
    aborted = {r["trajectory_id"] for r in rolled if r["status"] == "aborted"}
    split = {r["group_id"] for r in rolled if r["status"] == "aborted"}
    assert aborted and len(split) == 1 and len(rolled) == 4 * G + len(aborted)

    runner = CliRunner()
    rewarded = runner.invoke(app, ["reward", "--run", str(run), "--reward", "auto", "--json"])
    assert rewarded.exit_code == 0, rewarded.output
    # One reply for every prompt: rewards are uniform within a group; keep those groups to see integrity.
    filtered = runner.invoke(app, ["filter", "--run", str(run), "--keep-uniform", "1", "--json"])
    assert filtered.exit_code == 0, filtered.output
    summary = json.loads(filtered.stdout.strip().splitlines()[-1])
    assert summary["rules"]["group_integrity"] == 0 and summary["rules"]["completeness"] == len(aborted)
    assert summary["groups_kept"] == 4

    packed = rows_of(str(run / "batches"))
    assert not aborted & {r["trajectory_id"] for r in packed}
    by_group: dict[str, list[int]] = {}
    for r in packed:
        by_group.setdefault(r["group_id"], []).append(r["sample_index"])
    assert {g: sorted(indices) for g, indices in by_group.items()} == {g: list(range(G)) for g in by_group}
    assert split <= set(by_group)  # the group completed across the two invocations is trained on
