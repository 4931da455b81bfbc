"""`--reward genrm`: a generative reward model compares the members of one GRPO group (arlctl/rewards/genrm.py).

`score_group` is driven directly with a scripted OpenAI-compatible judge (a real aiohttp server whose
replies each test decides): the gold member wins, ties, position bias cancelled by both orders, failed
comparisons dropped and counted, a group of 1. Win rates and Bradley–Terry scores are checked against
values computed by hand.
"""

from __future__ import annotations

import asyncio
import re

import pytest
from scripted_judge import Fail, ScriptedJudge

from arlctl.envs.registry import get_reward
from arlctl.errors import UsageError
from arlctl.rewards import genrm
from arlctl.rewards.genrm import Comparison, bradley_terry, win_rates

TASK = {"task_id": "t1", "question": "What is 6 * 7?", "answer": "42"}


def members(*answers: str) -> list[dict]:
    return [{"final_state": a, "task": TASK, "response_text": f"I worked it out: {a}", "trajectory_id": f"t{k}"}
            for k, a in enumerate(answers)]


def group(server: ScriptedJudge, items: list[dict], **options) -> list[tuple]:
    options = {"server": server.url, "model": "scripted-rm", "backoff": 0.0, **options}
    return asyncio.run(genrm.score_group(items, **options))


def shown(messages: list[dict]) -> tuple[str, str]:
    """(final answer of A, final answer of B) in a pairwise request."""
    text = messages[-1]["content"]
    return (re.search(r"Final answer of A: (.*)", text).group(1), re.search(r"Final answer of B: (.*)", text).group(1))


def prefer_gold(messages: list[dict]) -> str:
    a, b = shown(messages)
    if "GOLD" in a:
        return "A has it right.\nPREFERRED: A"
    if "GOLD" in b:
        return "B has it right.\nPREFERRED: B"
    return "Both are wrong.\nPREFERRED: TIE"


def test_the_gold_member_gets_the_top_score(scripted):
    server = scripted(prefer_gold)
    results = group(server, members("41", "42 GOLD", "40"))
    # Pairs (0,1) (0,2) (1,2), once each. Gold beats both; 0 and 2 tie each other.
    # win rate: gold 2/2 = 1.0; member 0: (0 + 0.5) / 2 = 0.25; member 2: (0.5 + 0) / 2 = 0.25
    assert [r[0] for r in results] == [0.25, 1.0, 0.25] and server.calls == 3
    gold = results[1][2]
    assert (gold["wins"], gold["losses"], gold["ties"], gold["comparisons"]) == (2, 0, 0, 2)
    assert results[0][2]["ties"] == 1 and results[0][2]["losses"] == 1
    assert results[1][1] == {"genrm": 1.0}
    assert {v["vs"] for v in gold["verdicts"]} == {"t0", "t2"}


def test_bradley_terry_on_the_same_group(scripted):
    results = group(scripted(prefer_gold), members("41", "42 GOLD", "40"), aggregate="bt")
    # With one virtual tie per pair: W_gold = 2 + 0.5 + 0.5 = 3, W_0 = W_2 = 0.5 (tie) + 0.5 + 0.5 = 1.5, every
    # pair compared twice (1 real + 1 virtual). By symmetry p_0 = p_2 = q; the gold update
    # r = 3 / (2/(r+q) + 2/(r+q)) gives r = 3q. Scores: gold mean(3/4, 3/4) = 0.75; 0: mean(1/4, 1/2) = 0.375.
    assert [r[0] for r in results] == pytest.approx([0.375, 0.75, 0.375], abs=1e-6)
    assert results[1][2]["aggregate"] == "bt"


def test_both_orders_cancel_a_judge_that_always_prefers_the_first(scripted):
    server = scripted(lambda messages: "PREFERRED: A")
    biased = group(server, members("1", "2", "3"))
    # One order: member 0 is always A (wins 2/2), member 2 always B (0/2), member 1 wins 1 of 2.
    assert [r[0] for r in biased] == [1.0, 0.5, 0.0] and server.calls == 3
    fair = group(server, members("1", "2", "3"), both_orders=1)
    # Each pair asked as AB and BA: each member wins exactly the half where it is shown first.
    assert [r[0] for r in fair] == [0.5, 0.5, 0.5] and server.calls == 3 + 6
    assert all(r[2]["comparisons"] == 4 for r in fair)


def test_a_judge_that_always_ties(scripted):
    results = group(scripted(lambda messages: "Equally good. PREFERRED: TIE"), members("1", "2"))
    assert [r[0] for r in results] == [0.5, 0.5]
    assert results[0][2]["ties"] == 1 and results[0][2]["wins"] == 0


def test_failed_comparisons_are_dropped_and_counted(scripted):
    def reply(messages):
        a, b = shown(messages)
        if "BROKEN" in a or "BROKEN" in b:
            return Fail(500, "judge fell over")
        return prefer_gold(messages)

    results = group(scripted(reply), members("41", "42 GOLD", "BROKEN"), retries=0)
    # Only (0,1) succeeds: gold 1/1 = 1.0, member 0 0/1 = 0.0; member 2 has no successful comparison.
    assert [r[0] for r in results] == [0.0, 1.0, None]
    assert results[0][2]["comparisons"] == 1 and results[0][2]["comparisons_failed"] == 1
    assert results[0][2]["first_error"] == "genrm: judge server answered HTTP 500: judge fell over"
    assert results[2][2]["error"] == ("genrm: none of this member's 2 comparisons succeeded (first: genrm: judge "
                                      "server answered HTTP 500: judge fell over)")


def test_unreadable_verdicts_are_failed_comparisons(scripted):
    results = group(scripted(lambda messages: "Both are fine, I suppose."), members("1", "2"))
    assert [r[0] for r in results] == [None, None]
    assert "unparseable verdict" in results[0][2]["error"] and results[0][2]["comparisons_failed"] == 1


def test_a_group_of_one_has_nothing_to_compare_with(scripted):
    server = scripted(prefer_gold)
    [(value, parts, info)] = group(server, members("42"))
    assert value is None and parts is None and info["error"] == "genrm: a group of 1 has nothing to compare with"
    assert server.calls == 0


def test_listwise_ranks_the_whole_group_in_one_request(scripted):
    server = scripted(lambda messages: "Response 2 is right, 3 is close.\nRANKING: 2 > 3 > 1")
    results = group(server, members("10", "42", "40"), rubric="listwise")
    # Member 1 (shown as 2) beats both: 1.0; member 2 beats member 0 only: 0.5; member 0 beats nobody: 0.0.
    assert [r[0] for r in results] == [0.0, 1.0, 0.5] and server.calls == 1
    text = server.contents()
    assert "There are 3 responses." in text and "Final answer of 2: 42" in text


def test_listwise_with_a_ranking_that_is_not_an_order_of_all_members(scripted):
    results = group(scripted(lambda messages: "RANKING: 1 > 1 > 2"), members("10", "42", "40"), rubric="listwise")
    assert [r[0] for r in results] == [None, None, None]
    assert "ranking '1 > 1 > 2' is not an order of 1..3" in results[0][2]["error"]


def test_a_row_alone_is_not_graded_and_the_version_names_rubric_and_judge():
    reward = get_reward("genrm", server="http://127.0.0.1:9", model="rm-1")
    value, parts, info = reward.score("42", TASK, "x")
    assert value is None and parts is None and info["error"].startswith("genrm scores groups")
    assert "+rubric:pairwise@" in reward.version and reward.version.endswith("+judge:rm-1")
    assert reward.score.func.score_group is genrm.score_group  # what the reward stage calls per group
    with pytest.raises(UsageError, match="bad option for reward 'genrm'"):
        get_reward("genrm", judge="tiny", agregate="bt")
    with pytest.raises(UsageError, match="aggregate must be one of winrate, bt"):
        get_reward("genrm", judge="tiny", aggregate="elo")
    with pytest.raises(UsageError, match="this reward takes pairwise or listwise"):
        get_reward("genrm", judge="tiny", rubric="math")


def test_win_rates_and_bradley_terry_by_hand():
    one_win = [Comparison(0, 1, 1.0, "AB")]
    assert win_rates(2, one_win) == [1.0, 0.0]
    # W_0 = 1 + 0.5 (virtual tie) = 1.5, W_1 = 0.5, n_01 = 2: p_0 / p_1 = 3, so 3/4 and 1/4.
    assert bradley_terry(2, one_win) == pytest.approx([0.75, 0.25])
    failed = [Comparison(0, 1, None, "AB", error="x"), Comparison(1, 2, 0.25, "AB")]
    # Member 1 earned 0.25 and member 2 0.75 of their one comparison; member 0 has none.
    assert win_rates(3, failed) == [None, 0.25, 0.75]
    assert bradley_terry(3, failed)[0] is None
    assert bradley_terry(2, []) == [None, None]


def test_cli_scores_each_group_through_the_reward_stage(scripted, tmp_path):
    from typer.testing import CliRunner

    from arlctl.cli.main import app
    from arlctl.io.shards import Lineage, read_shard, write_shard
    from arlctl.schemas.rows import TrajectoryRow, Turn, rows_to_table

    def row(group_id: str, index: int, answer: str) -> TrajectoryRow:
        return TrajectoryRow(group_id=group_id, sample_index=index, task_id=group_id, env="math", env_version="math-1",
                             task=TASK, policy="p", prompt_text="p", prompt_ids=[1], response_ids=[2],
                             response_mask=[1], response_logprobs=[-0.1], turns=[Turn(0, 0, 1, 0, answer)],
                             final_state=answer)

    # Group g1 interleaved with a group of one (g2): the stage must gather g1's members across rows.
    rows = [row("g1", 0, "41"), row("g2", 0, "7"), row("g1", 1, "42 GOLD"), row("g1", 2, "40")]
    write_shard(rows_to_table(rows), str(tmp_path / "rollouts" / "part-1.parquet"), Lineage(stage="rollout"))
    server = scripted(prefer_gold)
    result = CliRunner().invoke(app, ["reward", "--in", str(tmp_path / "rollouts"), "--out", str(tmp_path / "out"),
                                      "--reward", "genrm", "--reward-opt", f"server={server.url}",
                                      "--reward-opt", "model=rm"])
    assert result.exit_code == 0, result.output
    out = read_shard(str(tmp_path / "out" / "part-1.parquet")).to_pylist()
    # g1 as in test_the_gold_member_gets_the_top_score; g2 has one member: null with the cause.
    assert [r["reward"] for r in out] == [0.25, None, 1.0, 0.25] and server.calls == 3
    assert "a group of 1 has nothing to compare with" in out[1]["reward_info"]
    assert "no reward" in result.output
