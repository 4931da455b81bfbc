"""Cut replies through the real commands (issue 27 item 4), in process: `arlctl reward --on-truncated
grade|zero|null` on rows the agent loop cut, `arlctl filter --truncated drop` counting its rule, and the
`arlctl eval` table's truncated column."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from arlctl import models
from arlctl.cli.main import app
from arlctl.envs.registry import make_env
from arlctl.inference.scripted import ScriptedPolicy
from arlctl.io.shards import Lineage, list_shards, read_shard, write_shard
from arlctl.sandbox.bwrap import bwrap_available
from arlctl.schemas.rows import rows_to_table
from arlctl.stages.agent_loop import RolloutConfig
from arlctl.stages.rollout import rollout

runner = CliRunner()
LONG = " word" * 40  # cut at --max-new-tokens 8; starts with a space, so first-token grades it 1.0


def rolled_out(run: Path) -> list[str]:
    """RUN/rollouts with two groups of first-token rows (G=2): task a replies " ok" (ok), task b a long reply
    the budget cuts (truncated, "length"). Returns the trajectory statuses by task."""
    policy = ScriptedPolicy(models.smollm2_tokenizer(), "scripted",
                            lambda prompt: LONG if "LONG" in prompt else " ok")
    cfg = RolloutConfig(group_size=2, concurrency=2, max_turns=1, max_new_tokens=8, seed=0)
    rows: list = []

    async def sink(group):
        rows.extend(group)

    tasks = [{"task_id": "a", "prompt": "Say ok."}, {"task_id": "b", "prompt": "Say LONG things."}]
    asyncio.run(rollout(tasks, policy, lambda: make_env("first-token"), cfg, sink))
    table = rows_to_table(rows)
    write_shard(table, str(run / "rollouts" / "part-0.parquet"), Lineage(stage="rollout"))
    return table.column("status").to_pylist()


def rewarded(run: Path) -> dict[str, list]:
    rows = [r for s in list_shards(str(run / "rewarded")) for r in read_shard(s).to_pylist()]
    return {tid: [(r["status"], r["finish_reason"], r["reward"], json.loads(r["reward_info"]))
                  for r in rows if r["task_id"] == tid] for tid in ("a", "b")}


@pytest.fixture
def run(tmp_path) -> Path:
    run = tmp_path / "run"
    assert sorted(rolled_out(run)) == ["ok", "ok", "truncated", "truncated"]
    return run


def reward(run: Path, *extra: str, name: str = "first-token"):
    result = runner.invoke(app, ["reward", "--run", str(run), "--reward", name, "--json", *extra])
    summary = json.loads(result.stdout[result.stdout.index("{"):result.stdout.rindex("}") + 1]) \
        if "{" in result.stdout else None
    return result, summary


def test_on_truncated_grade_is_the_default_and_counts(run):
    result, summary = reward(run)
    assert result.exit_code == 0, result.output
    assert (summary["truncated"], summary["on_truncated"]) == (2, "grade")
    assert "2 truncated (graded)" in result.output
    rows = rewarded(run)
    assert [r[:3] for r in rows["b"]] == [("truncated", "length", 1.0)] * 2  # the cut text still starts " "
    assert [r[:3] for r in rows["a"]] == [("ok", "submit", 1.0)] * 2


def test_on_truncated_zero_gives_0_without_grading(run):
    result, summary = reward(run, "--on-truncated", "zero")
    assert result.exit_code == 0, result.output
    assert summary["truncated"] == 2 and "2 truncated (reward 0)" in result.output
    assert summary["mean_reward"] == 0.5  # (1 + 1 + 0 + 0) / 4
    rows = rewarded(run)
    assert [(r[2], r[3]) for r in rows["b"]] == [(0.0, {"truncated": "zero", "finish_reason": "length"})] * 2
    assert [r[2] for r in rows["a"]] == [1.0, 1.0]


def test_on_truncated_null_leaves_no_reward_with_its_cause(run):
    # 2 of 4 rows without a reward is not more than --max-error-frac 0.5: the command succeeds.
    result, summary = reward(run, "--on-truncated", "null")
    assert result.exit_code == 0, result.output
    assert summary["error_causes"] == {"truncated": 2} and len(summary["row_errors"]) == 2
    assert summary["mean_reward"] == 1.0  # over the 2 rows that got one
    rows = rewarded(run)
    for _, _, value, info in rows["b"]:
        assert value is None and info["truncated"] == "null"
        assert info["error"] == ("truncated: the reply was cut (finish_reason length) and --on-truncated null "
                                 "leaves it ungraded")
    assert "2 truncated (no reward)" in result.output


def test_on_truncated_rejects_an_unknown_mode(run):
    result, _ = reward(run, "--on-truncated", "skip")
    assert result.exit_code == 2 and "--on-truncated must be one of grade, zero, null" in result.output


def test_filter_truncated_drop_drops_and_counts(run):
    # zero makes group b's rewards uniform; grade keeps them equal too, so keep-uniform keeps both groups.
    assert reward(run)[0].exit_code == 0
    base = ["filter", "--run", str(run), "--keep-uniform", "1", "--adv", "batch", "--json"]
    kept = runner.invoke(app, [*base, "--dry-run"])
    assert kept.exit_code == 0, kept.output
    summary = json.loads(kept.stdout[kept.stdout.index("{"):kept.stdout.rindex("}") + 1])
    assert summary["rules"]["truncated"] == 0 and summary["rows_kept"] == 4  # default keep: trained on
    dropped = runner.invoke(app, [*base, "--truncated", "drop"])
    assert dropped.exit_code == 0, dropped.output
    summary = json.loads(dropped.stdout[dropped.stdout.index("{"):dropped.stdout.rindex("}") + 1])
    assert summary["rules"]["truncated"] == 2 and summary["rows_kept"] == 2
    batch = [r for s in list_shards(str(run / "batches")) for r in read_shard(s).to_pylist()]
    assert {r["task_id"] for r in batch} == {"a"}


@pytest.mark.slow
def test_eval_table_shows_the_truncated_rows(tmp_path):
    run = tmp_path / "run"
    result = runner.invoke(app, ["eval", "--run", str(run), "--policy", "tiny", "--tasks", "builtin:math?n=2&seed=7",
                                 "--max-turns", "1", "--max-new-tokens", "2", "--json"])  # no -q: it reads the table
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout[result.stdout.index("{"):result.stdout.rindex("}") + 1])
    statuses = [r["status"] for s in list_shards(summary["directory"]) for r in read_shard(s).to_pylist()]
    assert summary["truncated"] == statuses.count("truncated") == 2  # 2 tokens end no math answer
    header = next(line for line in result.output.splitlines() if "truncated" in line and "mode" in line)
    greedy = next(line for line in result.output.splitlines() if "greedy" in line and "│" in line)
    cells = [c.strip() for c in greedy.split("│") if c.strip()]
    assert "truncated" in header and cells[:5] == ["greedy", "2", "2", "0.000", "2"]


def _humaneval_rollout(run: Path) -> list[dict]:
    result = runner.invoke(app, ["rollout", "--env", "code", "--tasks", "humaneval:", "--policy", "oracle:humaneval",
                                 "-G", "1", "--run", str(run), "-q"])  # every other setting at its default
    assert result.exit_code == 0, result.output
    return [r for s in list_shards(str(run / "rollouts")) for r in read_shard(s).to_pylist()]


def _over_budget() -> set[str]:
    """The problems whose gold reply (the oracle's text plus its end-of-message token) exceeds the default
    --max-new-tokens: the ones the budget must cut."""
    from arlctl.envs.code_grader import problems
    from arlctl.envs.code_oracle import solution
    from arlctl.inference.scripted import end_of_message_ids

    tokenizer = models.smollm2_tokenizer()
    budget = RolloutConfig().max_new_tokens
    stop = len(end_of_message_ids(tokenizer))
    return {task_id for task_id in problems()
            if len(tokenizer(f"```python\n{solution(task_id)}```", add_special_tokens=False)["input_ids"]) + stop
            > budget}


@pytest.mark.slow
def test_humaneval_gold_replies_over_the_budget_are_truncated(tmp_path):
    rows = _humaneval_rollout(tmp_path / "run")
    over = _over_budget()
    assert len(rows) == 164 and len(over) == 36  # measured: 36 of 164 gold replies pass 256 tokens
    assert {r["task_id"] for r in rows if r["status"] == "truncated"} == over
    for r in rows:
        last = r["turns"][-1]
        if r["status"] == "truncated":
            assert r["finish_reason"] == "length" and last["gen_len"] == RolloutConfig().max_new_tokens
            assert last["error"].startswith("length: the reply reached --max-new-tokens (256 tokens)")
        else:  # no ok row ends on a cut turn
            assert (r["status"], r["finish_reason"]) == ("ok", "submit") and last["error"] is None


@pytest.mark.integration
@pytest.mark.skipif(not bwrap_available(), reason="bubblewrap is not installed")
def test_humaneval_every_ok_gold_reply_scores_1(tmp_path):
    run = tmp_path / "run"
    rows = _humaneval_rollout(run)
    result, summary = reward(run, "--on-truncated", "null", "--max-error-frac", "1", name="code")
    assert result.exit_code == 0, result.output
    graded = [r for s in list_shards(str(run / "rewarded")) for r in read_shard(s).to_pylist()]
    ok = [r["reward"] for r in graded if r["status"] == "ok"]
    assert len(ok) == 164 - len(_over_budget()) and set(ok) == {1.0}  # the gold answers that fit all pass
    assert summary["error_causes"] == {"truncated": 36} and len(rows) == 164
