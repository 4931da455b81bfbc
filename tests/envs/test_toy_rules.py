"""`two-first-tokens` with its `rules` task option: each turn's own first-character class, chosen per task."""

from __future__ import annotations

import asyncio
import json

import pytest

from arlctl.envs import toy
from arlctl.envs.base import Action
from arlctl.envs.registry import get_reward, make_env
from arlctl.envs.tasks import load_tasks
from arlctl.errors import UsageError


def play(task: dict, *replies: str) -> list:
    env = make_env(toy.TWO_ENV_NAME)

    async def go():
        await env.reset(task)
        return [await env.step(Action(text=r)) for r in replies]

    return asyncio.run(go())


def test_the_rules_option_sets_each_turns_class_and_the_default_tasks_are_unchanged():
    plain = toy._builtin_two({"n": "3", "seed": "5"})
    ruled = toy._builtin_two({"n": "3", "seed": "5", "rules": "upper,lower"})
    assert all("rules" not in t for t in plain) and [t["task_id"] for t in plain] == ["tft-5-0", "tft-5-1", "tft-5-2"]
    assert [t["rules"] for t in ruled] == [["upper", "lower"]] * 3
    assert [t["task_id"] for t in ruled] == ["tft-5-0-upper-lower", "tft-5-1-upper-lower", "tft-5-2-upper-lower"]
    assert [t["prompt"] for t in ruled] == [t["prompt"] for t in plain]
    score = get_reward(toy.TWO_ENV_NAME).score
    task = ruled[0]
    # " apple" then "Banana" follows the default rules but neither of these: upper first, then lower
    first, second = play(task, " apple", "Banana")
    assert (first.reward_step, second.reward_step) == (0.0, 0.0)
    assert score(second.final_state, task, "")[:2] == (0.0, {"upper_first": 0.0, "lower_first": 0.0})
    first, second = play(task, "Apple", "banana")
    assert (first.reward_step, second.reward_step) == (1.0, 1.0)
    assert score(second.final_state, task, "")[:2] == (1.0, {"upper_first": 1.0, "lower_first": 1.0})
    first, second = play(task, "Apple", " banana")  # a space is not a lower-case letter
    assert (first.reward_step, second.reward_step) == (1.0, 0.0)
    assert score(second.final_state, task, "")[0] == 0.0
    assert json.loads(second.final_state) == ["Apple", " banana"]


def test_each_class_matches_exactly_its_first_characters():
    cases = {"space": " x", "letter": "x", "upper": "X", "lower": "x", "lower_or_space": " X", "a_to_m": "M",
             "n_to_z": "n"}
    for rule, good in cases.items():
        assert toy.follows(rule, good), rule
    assert not any(toy.follows(rule, "") for rule in toy.FIRST_CHAR_RULES)
    assert [toy.follows("upper", c) for c in ("É", "A", "a", "1")] == [False, True, False, False]  # ASCII only
    assert [toy.follows("lower_or_space", c) for c in (" ", "q", "Q", "\n")] == [True, True, False, False]
    assert [toy.follows("a_to_m", c) for c in ("a", "m", "n", "Z", "1")] == [True, True, False, False, False]


def test_bad_rules_are_refused_before_any_rollout():
    for bad in ("upper", "upper,upper", "upper,capital"):
        with pytest.raises(UsageError, match="rules="):
            toy._builtin_two({"rules": bad})
    with pytest.raises(UsageError, match="rules="):
        load_tasks("builtin:two-first-tokens?rules=digit,space")
    with pytest.raises(ValueError, match="distinct names"):
        play({"rules": ["space", "nope"]}, " a")
    # a tasks file may spell the rules as one string
    assert [s.reward_step for s in play({"rules": "upper,lower"}, "A", "b")] == [1.0, 1.0]


def test_a_rollout_carries_the_tasks_rules_to_the_step_rewards_and_the_reward():
    from arlctl.schemas.rows import rows_to_table
    from arlctl.stages.reward import reward_table
    from tests.stages.test_turn_toy_env import roll_two_first_tokens

    rows = roll_two_first_tokens(toy._builtin_two({"n": "2", "seed": "0", "rules": "upper,lower"}), group_size=4)
    table = reward_table(rows_to_table(rows), get_reward(toy.TWO_ENV_NAME))
    assert table.num_rows == 8
    for row, parts, reward in zip(rows, table.column("reward_components").to_pylist(),
                                  table.column("reward").to_pylist(), strict=True):
        first, second = row.turns
        assert (first.reward_step, second.reward_step) == (float(toy.follows("upper", first.text)),
                                                           float(toy.follows("lower", second.text)))
        assert dict(parts) == {"upper_first": first.reward_step, "lower_first": second.reward_step}
        assert reward == first.reward_step * second.reward_step
