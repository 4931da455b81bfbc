"""Turn-level credit: discounted returns, the per-turn group baseline and step-reward precedence, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from arlctl.rl.advantages import (
    compute_advantages,
    discounted_returns,
    group_ids_to_index,
    step_rewards,
    turn_advantages,
)


def test_discounted_returns_add_the_outcome_at_the_last_turn():
    # r = 0.5, 0, 1; outcome 2; gamma 0.5:
    # R_2 = 1 + 2 = 3;  R_1 = 0 + 0.5 * 3 = 1.5;  R_0 = 0.5 + 0.5 * 1.5 = 1.25
    assert discounted_returns([0.5, 0.0, 1.0], 2.0, 0.5) == [1.25, 1.5, 3.0]
    # gamma 1: R_1 = 1 + 1 = 2, R_0 = 1 + 2 = 3;  gamma 0: every turn keeps its own step reward, the last
    # also the outcome: R_1 = 1 + 1 = 2, R_0 = 1
    assert discounted_returns([1.0, 1.0], 1.0, 1.0) == [3.0, 2.0]
    assert discounted_returns([1.0, 1.0], 1.0, 0.0) == [1.0, 2.0]
    assert discounted_returns([0.0], 0.7, 0.9) == [0.7]  # one turn: the outcome, undiscounted
    assert discounted_returns([], 1.0, 1.0) == []


def test_turn_mean_baselines_each_turn_index_within_its_group():
    # group a: returns [3, 2], [1, 0], [2] (a shorter trajectory); group b: [5, 5] alone.
    # a, turn 0: 3, 1, 2 -> mean 2 -> +1, -1, 0;   a, turn 1: 2, 0 -> mean 1 -> +1, -1
    # b: one trajectory per turn index -> no baseline -> 0, 0
    groups = group_ids_to_index(["a", "a", "a", "b"])
    out = turn_advantages([[3.0, 2.0], [1.0, 0.0], [2.0], [5.0, 5.0]], groups, "turn-mean")
    assert out == [[1.0, 1.0], [-1.0, -1.0], [0.0], [0.0, 0.0]]


def test_turn_mode_divides_by_the_per_turn_group_std():
    # a, turn 0: 3, 1, 2: mean 2, Bessel var (1 + 1 + 0) / 2 = 1 -> std 1 -> +-1 / (1 + 1e-6)
    # a, turn 1: 2, 0: mean 1, var (1 + 1) / 1 = 2 -> std 1.414214 -> +-0.707107
    groups = group_ids_to_index(["a", "a", "a"])
    out = turn_advantages([[3.0, 2.0], [1.0, 0.0], [2.0]], groups, "turn")
    assert out[0] == pytest.approx([1.0, 0.707107], abs=1e-5)
    assert out[1] == pytest.approx([-1.0, -0.707107], abs=1e-5)
    assert out[2] == [0.0]


def test_one_turn_without_step_rewards_is_exactly_grpo():
    rewards = [1.0, 0.0, 0.0, 1.0, 0.3, 0.9]
    groups = group_ids_to_index(["a"] * 4 + ["b"] * 2)
    per_turn = turn_advantages([discounted_returns([0.0], r, 1.0) for r in rewards], groups, "turn")
    outcome = compute_advantages(torch.tensor(rewards, dtype=torch.float64), groups, "group").tolist()
    assert [a for (a,) in per_turn] == outcome


def test_equal_returns_at_a_turn_index_give_exactly_zero_there():
    # turn 0 returns are 0.1 + 0.2 computed two ways (0.30000000000000004 both): equal -> exactly 0
    groups = group_ids_to_index(["g", "g"])
    out = turn_advantages([[0.1 + 0.2, 1.0], [0.1 + 0.2, 0.0]], groups, "turn")
    assert out[0][0] == 0.0 and out[1][0] == 0.0
    assert out[0][1] > 0 > out[1][1]


def test_unknown_modes_are_refused():
    with pytest.raises(ValueError, match="unknown turn advantage mode 'group'"):
        turn_advantages([[1.0]], group_ids_to_index(["a"]), "group")
    with pytest.raises(ValueError, match="unknown advantage mode 'turn'"):
        compute_advantages(torch.tensor([1.0]), group_ids_to_index(["a"]), "turn")


def test_step_rewards_prefer_the_env_then_the_judge_then_zero():
    # turn 0 has the env's 1.0; turns 1 and 2 take the judge's 0.2 and 0.3
    assert step_rewards([1.0, None, None], [0, 1, 2], [0.1, 0.2, 0.3]) == [1.0, 0.2, 0.3]
    assert step_rewards([1.0, None], [0, 1], None) == [1.0, 0.0]  # no judge: 0
    assert step_rewards([None], [2], [0.0, 0.5, 0.75]) == [0.75]  # a per-turn row: its own turn index
    # the judge could not grade turn 1 (null), or no step at all ([]): a missing score, never a 0
    assert step_rewards([None, None], [0, 1], [0.5, None]) == [0.5, None]
    assert step_rewards([None, 1.0], [0, 1], []) == [None, 1.0]


@pytest.mark.parametrize("recorded,indices,judged,message", [
    ([math.nan], [0], None, "reward_step nan"),
    ([None], [0], "0.5", "not a list of finite numbers"),
    ([None], [0], [math.inf], "not a list of finite numbers"),
    ([None], [0], [True], "not a list of finite numbers"),
    ([None, None], [0, 1], [0.5], "has 1 entries; turn 1 has none"),
])
def test_unusable_step_rewards_raise_with_the_cause(recorded, indices, judged, message):
    with pytest.raises(ValueError, match=message):
        step_rewards(recorded, indices, judged)
