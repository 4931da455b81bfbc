"""Composite rewards (`--reward 'math + 0.5*format'`), group scoring in the reward stage (`score_group`),
and the `format` reward: hand-computed components and totals, on real shards through the real stage."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from arlctl.cli.main import app
from arlctl.envs.registry import get_reward
from arlctl.errors import UsageError
from arlctl.io.shards import Lineage, read_shard, write_shard
from arlctl.rewards.composite import build_reward, parse_expression
from arlctl.schemas.rows import TrajectoryRow, Turn, rows_to_table
from arlctl.stages.reward import reward_dir, reward_table

SPEC = __name__  # this module as a plugin: f"{SPEC}:picky" names a reward defined below


def math_row(task_id: str, answer_text: str | None, gold: str, final_state: str | None, group: str | None = None,
             text: str | None = None, **task: object) -> TrajectoryRow:
    """A math row whose one turn says `the result is <answer>X</answer>` (or `I think 4` without an answer)."""
    if text is None:
        text = f"the result is <answer>{answer_text}</answer>" if answer_text is not None else "I think 4"
    return TrajectoryRow(group_id=group or f"g-{task_id}", sample_index=0, task_id=task_id, env="math",
                         env_version="math-1", task={"task_id": task_id, "question": "q?", "answer": gold, **task},
                         policy="p", prompt_text="p", prompt_ids=[1, 2], response_ids=[3, 4], response_mask=[1, 1],
                         response_logprobs=[-0.1, -0.2], turns=[Turn(0, 0, 2, 0, text)], final_state=final_state,
                         trajectory_id=f"t-{task_id}")


def by_task(table) -> dict[str, dict]:
    return {r["task_id"]: r for r in table.to_pylist()}


# ---- test rewards, loaded as module:attribute plugins ----

def picky(final_state, task, response_text):
    """1.0, except that it cannot grade task "c" (reward None with its cause)."""
    if task["task_id"] == "c":
        return None, None, {"error": "picky cannot grade c"}
    return 1.0, {"seen": 1.0}, {}


picky.version = "picky-1"
GROUP_CALLS: list[list[str]] = []


def longest(final_state, task, response_text, *, scale=1.0):
    raise AssertionError("a group reward is scored per group, never per row")


async def _longest_group(items, *, scale=1.0):
    """scale for the group's longest response(s), 0 for the others; fails on a group holding a task with boom."""
    GROUP_CALLS.append([item["trajectory_id"] for item in items])
    assert all(set(item) == {"final_state", "task", "response_text", "trajectory_id"} for item in items)
    if any(item["task"].get("boom") for item in items):
        raise RuntimeError("the comparison model exploded")
    top = max(len(item["response_text"]) for item in items)
    return [(scale * float(len(item["response_text"]) == top), {"longest": float(len(item["response_text"]) == top)},
             {"group_size": len(items)}) for item in items]


longest.score_group = _longest_group
longest.version = "longest-1"


def turn_count(final_state, task, response_text, *, turns=None):
    """A reward that declares `turns`: the stage passes each turn's text."""
    return float(len(turns)), {}, {"turns": turns}


# ---- parsing ----

def test_expressions_parse_into_weighted_terms():
    assert parse_expression("swe + 0.2*judge + 0.1*format") == [(1.0, "swe"), (0.2, "judge"), (0.1, "format")]
    # a hyphen inside a name is part of it; " - " with spaces subtracts; the weight may follow the name
    assert parse_expression("first-token - 0.5*format + math*2") == [(1.0, "first-token"), (-0.5, "format"),
                                                                     (2.0, "math")]
    assert parse_expression("-judge + pkg.mod:score") == [(-1.0, "judge"), (1.0, "pkg.mod:score")]
    assert parse_expression("0.5*http://grader:8100/swe") == [(0.5, "http://grader:8100/swe")]
    for bad in ("math +", "0.5*0.2", "2*math*3", "math + + format"):
        with pytest.raises(UsageError):
            parse_expression(bad)


def test_options_go_to_their_component_and_a_bare_option_is_refused():
    reward = build_reward("math + 0.5*format", ["math.format_weight=0.1"])
    # the version names every part and its weight (1 is not written)
    assert reward.version == "composite(math-1+format_weight=0.1+0.5*format-1)"
    with pytest.raises(UsageError, match="COMPONENT.KEY=VALUE"):
        build_reward("math + 0.5*format", ["format_weight=0.1"])
    with pytest.raises(UsageError, match="more than once"):
        build_reward("math + math", [])
    with pytest.raises(UsageError, match="bad option"):
        build_reward("math + 0.5*format", ["format.nope=1"])


# ---- scoring ----

def test_composite_components_and_total_are_the_weighted_sum(tmp_path):
    rows = [math_row("a", "12", "12", "12"), math_row("c", "5", "6", "5"), math_row("d", None, "4", None)]
    out = by_task(reward_table(rows_to_table(rows), build_reward("math + 0.5*format", ["math.format_weight=0.1"])))
    a, c, d = out["a"], out["c"], out["d"]
    # a: math = correct 1 + 0.1 * format 1 = 1.1; format = 1; total = 1.1 + 0.5 * 1 = 1.6
    assert a["reward"] == pytest.approx(1.6)
    assert dict(a["reward_components"]) == pytest.approx({"math": 1.1, "math.correct": 1.0, "math.format": 1.0,
                                                          "format": 1.0})
    # c: wrong answer in a tag: math = 0 + 0.1 * 1 = 0.1; format = 1; total = 0.1 + 0.5 = 0.6
    assert c["reward"] == pytest.approx(0.6)
    assert dict(c["reward_components"])["math"] == pytest.approx(0.1)
    # d: no tag at all: math = 0, format = 0; total = 0
    assert d["reward"] == 0.0 and dict(d["reward_components"])["format"] == 0.0
    info = json.loads(a["reward_info"])
    assert info["weights"] == {"math": 1.0, "format": 0.5} and info["parts"]["math"]["gold"] == "12"
    assert {r["reward_version"] for r in out.values()} == {"composite(math-1+format_weight=0.1+0.5*format-1)"}


def test_a_missing_component_makes_the_total_null_and_names_the_component():
    rows = [math_row("a", "12", "12", "12"), math_row("c", "6", "6", "6")]
    out = by_task(reward_table(rows_to_table(rows), build_reward(f"2*math - 0.5*{SPEC}:picky", [])))
    # a: 2 * 1 - 0.5 * 1 = 1.5
    assert out["a"]["reward"] == pytest.approx(1.5)
    assert dict(out["a"]["reward_components"])[f"{SPEC}:picky.seen"] == 1.0
    # c: math gives 1 but picky gives nothing: the total is null, not 2 * 1 - 0.5 * 0 = 2
    assert out["c"]["reward"] is None and out["c"]["reward_components"] is None
    info = json.loads(out["c"]["reward_info"])
    assert info["error"] == f"component {SPEC}:picky gave no reward (picky cannot grade c)"
    assert info["scored_components"]["math"] == 1.0


def test_group_reward_is_called_once_per_group_in_row_order_with_options_bound():
    GROUP_CALLS.clear()
    rows = [math_row("a", "12", "12", "12", group="g1", text="<answer>12</answer> long"),
            math_row("x", "5", "6", "5", group="g2"),
            math_row("b", "12", "12", "12", group="g1", text="<answer>12</answer>"),
            math_row("y", "6", "6", "6", group="g2", text="<answer>6</answer> and a longer explanation")]
    out = by_task(reward_table(rows_to_table(rows), get_reward(f"{SPEC}:longest", scale=2.0)))
    assert GROUP_CALLS == [["t-a", "t-b"], ["t-x", "t-y"]]  # one call per group, members in row order
    # scale=2 reached score_group: the longest of each group gets 2, the other 0
    assert [out[k]["reward"] for k in "abxy"] == [2.0, 0.0, 0.0, 2.0]
    assert json.loads(out["a"]["reward_info"]) == {"group_size": 2}
    assert out["a"]["reward_version"] == "longest-1+scale=2.0"


def test_group_reward_as_a_component_and_a_failing_group_nulls_only_that_group():
    GROUP_CALLS.clear()
    rows = [math_row("a", "12", "12", "12", group="g1", text="<answer>12</answer> long"),
            math_row("b", "12", "12", "12", group="g1", text="<answer>12</answer>"),
            math_row("x", "6", "6", "6", group="g2", boom=True),
            math_row("y", "6", "6", "6", group="g2")]
    out = by_task(reward_table(rows_to_table(rows), build_reward(f"math + 0.5*{SPEC}:longest", [])))
    assert len(GROUP_CALLS) == 2  # the group reward per group, math per row
    # a: 1 + 0.5 * 1 = 1.5; b: 1 + 0.5 * 0 = 1.0
    assert out["a"]["reward"] == pytest.approx(1.5) and out["b"]["reward"] == pytest.approx(1.0)
    for key in "xy":  # the whole failing group is null with the cause, the shard is not lost
        assert out[key]["reward"] is None
        assert "the group reward failed on this group (RuntimeError: the comparison model exploded)" in \
            json.loads(out[key]["reward_info"])["error"]


def test_a_score_function_declaring_turns_gets_each_turns_text():
    row = math_row("a", "12", "12", "12")
    row.turns = [Turn(0, 0, 1, 0, "first step"), Turn(1, 1, 2, 0, "then <answer>12</answer>")]
    out = reward_table(rows_to_table([row]), get_reward(f"{SPEC}:turn_count")).to_pylist()[0]
    assert out["reward"] == 2.0
    assert json.loads(out["reward_info"]) == {"turns": ["first step", "then <answer>12</answer>"]}


def test_format_reward_default_rule_and_pattern():
    score = get_reward("format").score
    assert score(None, {}, "so <answer>3.5</answer>")[0] == 1.0
    assert score(None, {}, "\\boxed{\\frac{7}{2}}")[0] == 1.0
    assert score(None, {}, "<answer>seven</answer>")[0] == 0.0  # a tag, but not a number
    assert score(None, {}, "it is 7")[0] == 0.0
    pattern = get_reward("format", pattern=r"^```python\n.*```$")
    assert pattern.version == "format-1+pattern=^```python\\n.*```$"
    assert pattern.score(None, {}, "```python\nprint(1)\n```")[0] == 1.0
    assert pattern.score(None, {}, "print(1)")[0] == 0.0


def test_cli_composite_reward_end_to_end(tmp_path):
    rollouts = tmp_path / "run" / "rollouts"
    write_shard(rows_to_table([math_row("a", "12", "12", "12"), math_row("c", "5", "6", "5")]),
                os.path.join(rollouts, "part-1.parquet"), Lineage(stage="rollout"))
    runner = CliRunner()
    result = runner.invoke(app, ["reward", "--run", str(tmp_path / "run"), "--reward", "math + 0.5*format",
                                 "--reward-opt", "math.format_weight=0.1", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["reward_version"] == "composite(math-1+format_weight=0.1+0.5*format-1)"
    # (1.6 + 0.6) / 2 = 1.1
    assert summary["mean_reward"] == pytest.approx(1.1)
    out = by_task(read_shard(str(tmp_path / "run" / "rewarded" / "part-1.parquet")))
    assert out["a"]["reward"] == pytest.approx(1.6)
    bad = runner.invoke(app, ["reward", "--run", str(tmp_path / "run"), "--reward", "math + 0.5*format",
                              "--reward-opt", "format_weight=0.1"])
    assert bad.exit_code == 2 and "COMPONENT.KEY=VALUE" in bad.output


def test_reward_dir_with_a_composite_records_its_version_in_the_lineage(tmp_path):
    write_shard(rows_to_table([math_row("a", "12", "12", "12")]), str(tmp_path / "in" / "part-1.parquet"),
                Lineage(stage="rollout"))
    reward = build_reward("math + 0.1*format", [])
    summary = reward_dir(str(tmp_path / "in"), str(tmp_path / "out"), reward)
    assert summary.rows == 1 and summary.cache_hits == summary.cache_misses == 0  # no cache given
    from arlctl.io.shards import read_lineage

    assert read_lineage(summary.written[0]).extra == {"reward": "composite",
                                                      "reward_version": "composite(math-1+0.1*format-1)"}
