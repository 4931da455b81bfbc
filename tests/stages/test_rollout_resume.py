"""Rollout resume (issue 27 item 3): a rollout stopped part-way and run again with the same settings rolls
out only the (task, epoch, sample) units it has not written, so across both invocations every unit has
exactly one trajectory that is not aborted; a changed setting is another configuration and resumes nothing.

Through `run_rollout` (the job API the CLI drives) with the first-token env and a scripted policy that counts
its calls and, at a chosen call, stops the run the way Ctrl-C does; and through the real CLI in process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections import Counter

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from arlctl import models
from arlctl.audit import audit_run
from arlctl.cli.main import app
from arlctl.envs.tasks import load_tasks
from arlctl.inference.scripted import ScriptedPolicy
from arlctl.io.shards import Lineage, list_shards, read_shard, write_shard
from arlctl.stages.agent_loop import RolloutConfig
from arlctl.stages.rollout_job import EnvPicker, RolloutJob, run_rollout

TASKS = "builtin:first-token?n=6&seed=0"
G = 4


class CountingPolicy(ScriptedPolicy):
    """Replies " yes" and counts its calls; the call numbered `stop_at` sets the stop event (Ctrl-C) and
    never answers, so that trajectory and its siblings in flight end aborted."""

    def __init__(self, stop: asyncio.Event | None = None, stop_at: int | None = None):
        super().__init__(models.smollm2_tokenizer(), "scripted-yes", lambda prompt: " yes")
        self.calls, self.stop, self.stop_at = 0, stop, stop_at

    async def generate(self, prompt_ids, sampling):
        self.calls += 1
        if self.stop_at is not None and self.calls >= self.stop_at:
            self.stop.set()
            await asyncio.Event().wait()  # cancelled by the abort
        return await super().generate(prompt_ids, sampling)


def roll(out: str, stop_at: int | None = None, **settings):
    cfg = RolloutConfig(env="first-token", group_size=G, concurrency=G, max_turns=1, max_new_tokens=8, seed=0)
    cfg = dataclasses.replace(cfg, **settings)
    tasks = load_tasks(TASKS)
    picker = EnvPicker({})
    picker.check(tasks, "first-token")
    job = RolloutJob(cfg=cfg, tasks=tasks, envs=picker, out=out, sources=[TASKS], policy_spec="scripted-yes",
                     flush_groups=1)
    lines: list[str] = []

    async def go():
        stop = asyncio.Event()
        pol = CountingPolicy(stop, stop_at)
        result = await run_rollout(job, pol, stop, log=lines.append)
        return result, pol.calls

    result, calls = asyncio.run(go())
    return result, calls, lines


def rows_of(out: str) -> list[dict]:
    columns = ["trajectory_id", "group_id", "sample_index", "task_id", "status"]
    return [r for shard in list_shards(out) for r in read_shard(shard, columns=columns).to_pylist()]


@pytest.mark.slow
def test_a_stopped_rollout_rerun_rolls_out_only_what_it_has_not_written(tmp_path):
    out = str(tmp_path / "run" / "rollouts")
    # Call 11 stops the run: groups 0 and 1 (8 calls) are written whole; group 2 has answered 2 of its
    # samples when its third waits on call 11: it is written with 2 ok and 2 aborted rows.
    first, first_calls, _ = roll(out, stop_at=11)
    assert first.interrupted and first_calls >= 11
    written = rows_of(out)
    assert first.rows_written == len(written) and first.status["aborted"] > 0  # the summary counts the shards
    done_first = {(r["group_id"], r["sample_index"]) for r in written if r["status"] != "aborted"}

    second, second_calls, lines = roll(out)
    rows = rows_of(out)
    assert not second.interrupted and second.samples_skipped == len(done_first)
    assert second_calls == 6 * G - len(done_first)  # one turn each: one call per unit not yet written
    assert second.rows_written == len(rows) - len(written) == 6 * G - len(done_first)
    assert any(line.startswith(f"resume: {len(done_first)} samples already written") for line in lines)

    # Exactly once: every (task, sample) has one non-aborted trajectory, in the group of its task.
    usable = [r for r in rows if r["status"] != "aborted"]
    assert Counter((r["task_id"], r["sample_index"]) for r in usable) == {
        (t["task_id"], i): 1 for t in load_tasks(TASKS) for i in range(G)}
    assert len({r["group_id"] for r in rows}) == 6  # a re-run's members join the interrupted run's groups
    split = {r["group_id"] for r in usable if (r["group_id"], r["sample_index"]) in done_first} & {
        r["group_id"] for r in usable if (r["group_id"], r["sample_index"]) not in done_first}
    assert split, "no group was completed across the two invocations"
    report = audit_run(str(tmp_path / "run"), drained=False)
    assert report.problems == [] and report.units == 6 * G and report.aborted == first.status["aborted"]

    # A third run finds nothing to do: no call, no shard, not a failure.
    third, third_calls, _ = roll(out)
    assert third_calls == 0 and third.rows_written == 0 and third.samples_skipped == 6 * G
    assert third.groups_skipped == 6 and third.failure(6, 0.5) is None


def test_a_changed_setting_is_another_configuration_and_resumes_nothing(tmp_path):
    out = str(tmp_path / "rollouts")
    roll(out)
    second, calls, lines = roll(out, temperature=0.5)
    assert second.samples_skipped == 0 and calls == second.rows_written == 6 * G
    assert any("written with other settings" in line and "not resumed" in line for line in lines)
    rows = rows_of(out)
    assert len({r["group_id"] for r in rows}) == 12  # two configurations: two groups per task


def test_the_audit_reports_a_unit_rolled_out_twice(tmp_path):
    """Before resume, a re-run gave the finished tasks a second trajectory per sample; with the same group
    id (a re-run of that kind on the same settings) the audit names it."""
    out = str(tmp_path / "run" / "rollouts")
    roll(out)
    shard = list_shards(out)[0]
    table = read_shard(shard)
    copy = table.set_column(table.schema.get_field_index("trajectory_id"), "trajectory_id",
                            pa.array([f"again-{i}" for i in range(table.num_rows)], pa.string()))
    write_shard(copy, f"{out}/part-20990101T000000000000Z-00000001.parquet", Lineage(stage="rollout"))
    report = audit_run(str(tmp_path / "run"), drained=False)
    twice = [p for p in report.problems if "was rolled out twice" in p]
    assert len(twice) == table.num_rows, report.problems


runner = CliRunner()


@pytest.fixture
def replies(tmp_path):
    path = tmp_path / "replies.jsonl"
    path.write_text("".join(json.dumps({"task_id": t["task_id"], "reply": " yes"}) + "\n" for t in load_tasks(TASKS)))
    return str(path)


@pytest.mark.slow
def test_the_cli_rerun_of_a_finished_rollout_writes_nothing_and_says_so(tmp_path, replies):
    out = str(tmp_path / "rollouts")
    argv = ["rollout", "--env", "first-token", "--tasks", TASKS, "--policy", f"oracle:replies={replies}",
            "--out", out, "-G", str(G), "--max-turns", "1", "--flush-groups", "2", "--json"]  # no -q: the summary
    first = runner.invoke(app, argv)
    assert first.exit_code == 0, first.output
    shards = list_shards(out)
    again = runner.invoke(app, argv)
    assert again.exit_code == 0, again.output
    summary = json.loads(again.stdout[again.stdout.index("{"):again.stdout.rindex("}") + 1])
    assert summary["rows_written"] == 0 and summary["samples_skipped"] == 6 * G and summary["groups_skipped"] == 6
    assert list_shards(out) == shards
    assert "0 rows (0 trajectories, 0 truncated)" in again.output and f"{6 * G} samples already written" in again.output
    changed = runner.invoke(app, [*argv, "--temperature", "0.7"])
    assert changed.exit_code == 0, changed.output
    assert "written with other settings" in changed.output
    assert json.loads(changed.stdout[changed.stdout.index("{"):changed.stdout.rindex("}") + 1])["rows_written"] == 6 * G
