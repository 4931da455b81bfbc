"""`--policy oracle:calculator`: the math oracle calls the calculator on the question's expression, answers
with the tool's result, and its rows through the real rollout loop and the real math reward get reward 1.
Word problems and prompts without the calculator end as recorded errors, never as made-up calls."""

from __future__ import annotations

import asyncio
import json

import pytest
from typer.testing import CliRunner

from arlctl.envs.math import MathEnv
from arlctl.envs.math_gen import generate_tasks
from arlctl.envs.math_oracle import SPEC, CalculatorOracleScript, load_math_oracle, question_expression
from arlctl.envs.registry import env_factory, get_reward
from arlctl.errors import TerminalError, UsageError
from arlctl.io.shards import Lineage, read_shard, scan, write_shard
from arlctl.models import smollm2_tokenizer
from arlctl.schemas.rows import rows_to_table
from arlctl.stages.agent_loop import RolloutConfig, Stats
from arlctl.stages.reward import reward_dir
from arlctl.stages.rollout import rollout

MUL = [{"task_id": "mul-0", "env": "math", "question": "What is 347 * 829?", "answer": "287663"},
       {"task_id": "mul-1", "env": "math", "question": "Compute 905 * 118.", "answer": "106790"}]


def arithmetic_tasks() -> list[dict]:
    """Generated arithmetic of every kind the calculator must get right: parentheses, division, decimals."""
    return [t for d in (1, 2, 3) for t in generate_tasks(4, seed=7, difficulty=d, kinds=("arithmetic",))] + MUL


def run_rollout(tasks: list[dict], env_opts: dict | None = None) -> tuple[list, Stats]:
    policy = load_math_oracle(SPEC, smollm2_tokenizer(), tasks)
    rows: list = []

    async def sink(group):
        rows.extend(group)

    cfg = RolloutConfig(env="math", group_size=1, max_turns=3, max_new_tokens=96, seed=0)
    stats = asyncio.run(rollout(tasks, policy, env_factory("math", **(env_opts or {})), cfg, sink))
    return rows, stats


def test_question_expression_finds_the_arithmetic_and_nothing_else():
    assert question_expression("What is 347 * 829?") == "347 * 829"
    assert question_expression("Compute (12 + 7) * 3.") == "(12 + 7) * 3"  # the full stop is not the expression's
    assert question_expression("Evaluate 2.5 * 4 - 1.") == "2.5 * 4 - 1"
    assert question_expression("Maya has 12 apples and buys 7 more. How many?") is None


def test_oracle_rows_get_reward_one_through_the_real_rollout_and_reward(tmp_path):
    tasks = arithmetic_tasks()
    rows, _ = run_rollout(tasks)
    assert len(rows) == len(tasks) and {r.status for r in rows} == {"ok"}
    env = MathEnv()
    for row in rows:
        first, last = row.turns[0], row.turns[-1]
        assert len(row.turns) == 2 and row.num_tool_calls == 1 and row.finish_reason == "submit"
        # Turn 1 is a well-formed hermes call the env's own parser reads back as the calculator.
        (call,) = env.parse_action(first.text).tool_calls
        question = next(t["question"] for t in tasks if t["task_id"] == row.task_id)
        assert call.name == "calculator" and call.arguments == {"expression": question_expression(question)}
        assert [c["name"] for c in first.tool_calls] == ["calculator"]  # as recorded in the row
        assert last.text == f"<answer>{row.final_state}</answer>"
        # Sampled tokens are mask 1 (what `train --loss sft` learns); the tool's reply is mask 0.
        assert sum(row.response_mask) == sum(t.gen_len for t in row.turns) < len(row.response_ids)
    write_shard(rows_to_table(rows), str(tmp_path / "rollouts" / "part-1.parquet"), Lineage(stage="rollout"))
    summary = reward_dir(str(tmp_path / "rollouts"), str(tmp_path / "rewarded"), get_reward("math"))
    rewarded = read_shard(scan(str(tmp_path / "rewarded")).shards[0]).to_pylist()
    assert summary.rows == len(tasks) and [r["reward"] for r in rewarded] == [1.0] * len(tasks)


@pytest.mark.slow
def test_word_problems_and_prompts_without_the_tool_end_as_recorded_errors():
    word = generate_tasks(2, seed=3, difficulty=1, kinds=("word",))
    rows, stats = run_rollout(word)
    assert {r.status for r in rows} == {"policy_error"} and {r.num_tool_calls for r in rows} == {0}
    assert stats.causes == {"policy_error": 2} and "no arithmetic expression" in stats.last_error
    script = CalculatorOracleScript(MUL).script
    with pytest.raises(UsageError, match="needs the calculator tool"):
        script("<|im_start|>user\nWhat is 347 * 829?<|im_end|>\n<|im_start|>assistant\n")
    # After its call, a conversation without the tool's result is an error, not an answer the tool never gave.
    prompt = '"name": "calculator" What is 347 * 829?<tool_call>{}</tool_call><|im_start|>tool\nerror: boom'
    with pytest.raises(TerminalError, match="not in the conversation"):
        script(prompt)
    with pytest.raises(UsageError, match="unknown scripted policy"):
        load_math_oracle("oracle:calc", smollm2_tokenizer(), MUL)


@pytest.mark.integration
def test_cli_rollout_with_oracle_calculator_scores_one(tmp_path):
    from arlctl.cli.main import app

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in MUL))
    run = str(tmp_path / "run")
    rolled = CliRunner().invoke(app, ["rollout", "--env", "math", "--tasks", str(tasks), "--policy", SPEC,
                                      "--run", run, "-G", "2", "--max-turns", "2", "--max-new-tokens", "64", "-q"])
    assert rolled.exit_code == 0, rolled.output
    rewarded = CliRunner().invoke(app, ["reward", "--run", run, "--reward", "math", "--json"])
    assert rewarded.exit_code == 0, rewarded.output
    assert json.loads(rewarded.stdout)["mean_reward"] == 1.0
