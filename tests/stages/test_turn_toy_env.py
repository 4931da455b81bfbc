"""`two-first-tokens`: two turns, a step reward per turn, outcome 1 only when both turns start right."""

from __future__ import annotations

import asyncio
import json

import pytest

from arlctl.envs import toy
from arlctl.envs.base import Action
from arlctl.envs.registry import env_factory, get_reward, make_env
from arlctl.stages.agent_loop import RolloutConfig
from arlctl.stages.rollout import rollout


def play(*replies: str):
    env = make_env(toy.TWO_ENV_NAME)

    async def go():
        reset = await env.reset({"prompt": "hi"})
        return reset, [await env.step(Action(text=r)) for r in replies], await env.final_state()

    return asyncio.run(go())


def test_each_turn_earns_its_own_step_reward_and_the_outcome_needs_both():
    reset, (first, second), final = play(" apple", "Banana")
    assert reset.messages == [{"role": "user", "content": "hi"}] and reset.tools == []
    assert (first.reward_step, first.done) == (1.0, False)
    assert first.observations == [{"role": "user", "content": toy.SECOND_PROMPT}]
    assert (second.reward_step, second.done, second.finish_reason) == (1.0, True, "submit")
    assert json.loads(second.final_state) == [" apple", "Banana"] == json.loads(final)
    score = get_reward(toy.TWO_ENV_NAME).score
    assert score(second.final_state, {}, "") == (1.0, {"space_first": 1.0, "letter_first": 1.0},
                                                  {"first_chars": [" apple", "Banana"]})
    # one turn wrong: its step reward is 0 and the outcome is 0; the other turn keeps its step reward
    _, (first, second), _ = play(" apple", " banana")
    assert (first.reward_step, second.reward_step) == (1.0, 0.0)
    assert score(second.final_state, {}, "")[:2] == (0.0, {"space_first": 1.0, "letter_first": 0.0})


def test_an_episode_cut_after_one_turn_scores_zero_and_a_third_step_is_refused():
    _, _, final = play(" apple")
    score = get_reward(toy.TWO_ENV_NAME).score
    assert score(final, {}, "")[:2] == (0.0, {"space_first": 1.0, "letter_first": 0.0})
    with pytest.raises(RuntimeError, match="has 2 turns"):
        play("a", "b", "c")
    with pytest.raises(ValueError, match="not a JSON list of replies"):
        score('{"a": 1}', {}, "")


def roll_two_first_tokens(tasks: list, group_size: int) -> list:
    """The tiny model's rows of `two-first-tokens` tasks through the real rollout driver (one token a turn)."""
    from arlctl.inference.hf import HFPolicy
    from arlctl.models import tiny_model_dir

    policy = HFPolicy(tiny_model_dir())
    rows: list = []

    async def sink(group):
        rows.extend(group)

    cfg = RolloutConfig(env=toy.TWO_ENV_NAME, group_size=group_size, max_turns=2, max_new_tokens=1, seed=0)
    try:
        asyncio.run(rollout(tasks, policy, env_factory(toy.TWO_ENV_NAME), cfg, sink))
    finally:
        asyncio.run(policy.close())
    return rows


def test_rollout_records_both_turns_with_their_step_rewards():
    rows = roll_two_first_tokens(toy._builtin_two({"n": "2", "seed": "0"}), group_size=2)
    assert len(rows) == 4 and {r.status for r in rows} <= {"ok", "truncated"}  # truncated: a reply the budget cut
    for row in rows:
        assert [t.gen_len for t in row.turns] == [1, 1]  # one sampled token per turn
        for turn, (_, rule) in zip(row.turns, toy.TURN_RULES, strict=True):
            assert turn.reward_step == float(rule(turn.text))
