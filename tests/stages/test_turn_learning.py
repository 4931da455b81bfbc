"""The turn-credit toy loop's mechanics (benchmarks/toy_loop.py), on a few steps of both arms.

Which arm learns faster is not asserted here: the curves follow the float arithmetic, and over a few seeds
the ratio moved from 1.68x to 1.13x between two machines on the same tree. That comparison is a benchmark
over enough seeds for a confidence interval (benchmarks/credit_compare.py, docs/learning/turn_credit.md).
What is asserted holds whatever tokens get sampled: the curve's shape, that both arms see the same first
rollouts, and that the turn arm trains on per-turn advantages while the outcome arm trains on one per
trajectory. Three small rollout + train steps per arm: a few seconds of CPU.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from benchmarks.toy_loop import GROUP_SIZE, TASKS_PER_STEP, run_arm, steps_to_target

STEPS = 3
ROLLOUTS_PER_STEP = TASKS_PER_STEP * GROUP_SIZE  # 4 x 8 = 32


@pytest.fixture(scope="module")
def arms(tmp_path_factory):
    """adv -> (curve, batches trained on), seed 0, STEPS optimizer steps whatever the outcome reaches."""
    out = {}
    for adv in ("turn", "group"):
        batches: list = []
        curve = run_arm(adv, 0, tmp_path_factory.mktemp(adv), max_steps=STEPS, stop_at_target=False, batches=batches)
        out[adv] = (curve, batches)
    return out


@pytest.mark.slow
def test_curve_has_one_mean_outcome_per_rollout_step(arms):
    for curve, _ in arms.values():
        assert len(curve) == STEPS + 1  # the rollout before each of the STEPS steps, and one after the last
        for value in curve:
            assert 0.0 <= value <= 1.0
            # A mean of 32 outcomes that are each 0 or 1: a whole number of 32nds.
            assert value * ROLLOUTS_PER_STEP == pytest.approx(round(value * ROLLOUTS_PER_STEP))


@pytest.mark.slow
def test_both_arms_start_from_the_same_rollouts(arms):
    # Same weights, tasks and sampling seed before the first optimizer step: the arms differ only after it.
    assert arms["turn"][0][0] == arms["group"][0][0]


def test_turn_arm_gives_each_turn_its_own_advantage(arms):
    _, batches = arms["turn"]
    assert batches
    for batch in batches:
        # gamma 0: turn 1's return is its own step reward, so within a group its advantage depends on that
        # reward alone (not on turn 2 or the outcome): positive for a right reply, negative for a wrong one
        # when the group is mixed, 0 when every reply in the group is alike.
        first_turn: dict[str, dict[float, set[float]]] = defaultdict(lambda: defaultdict(set))
        for row in batch.select(["group_id", "turns"]).to_pylist():
            assert [t["index"] for t in row["turns"]] == [0, 1]
            assert all(t["advantage"] is not None for t in row["turns"])
            turn = row["turns"][0]
            first_turn[row["group_id"]][turn["reward_step"]].add(round(turn["advantage"], 5))
        for by_reward in first_turn.values():
            assert all(len(values) == 1 for values in by_reward.values())  # one value per step reward
            (right,) = by_reward.get(1.0, {None})
            (wrong,) = by_reward.get(0.0, {None})
            if right is not None and wrong is not None:
                assert right > 0 > wrong
            else:
                assert (right if right is not None else wrong) == 0


def test_outcome_arm_gives_one_advantage_per_trajectory(arms):
    _, batches = arms["group"]
    assert batches
    for batch in batches:
        by_group: dict[str, dict[float, set[float]]] = defaultdict(lambda: defaultdict(set))
        for row in batch.select(["group_id", "reward", "advantage", "turns"]).to_pylist():
            assert all(t["advantage"] is None for t in row["turns"])  # train gives every token `advantage`
            by_group[row["group_id"]][row["reward"]].add(round(row["advantage"], 5))
        for by_reward in by_group.values():
            assert all(len(values) == 1 for values in by_reward.values())  # one value per outcome
            if len(by_reward) == 2:  # filter drops the groups whose outcomes are all alike
                (right,), (wrong,) = by_reward[1.0], by_reward[0.0]
                assert right > 0 > wrong


def test_steps_to_target_counts_the_steps_before_the_first_rollout_at_the_target():
    assert steps_to_target([0.1, 0.5, 0.9, 1.0]) == 2  # two optimizer steps before the rollout at 0.9
    assert steps_to_target([0.95]) == 0
    assert steps_to_target([0.1, 0.89]) is None
    assert steps_to_target([0.1, 0.5], target=0.5) == 1
