"""Group advantages for every mode, with the arithmetic in the comments."""

from __future__ import annotations

import math

import pytest
import torch

from arlctl.rl.advantages import compute_advantages, group_ids_to_index


def adv(rewards, groups, mode):
    return compute_advantages(torch.tensor(rewards, dtype=torch.float64), group_ids_to_index(groups), mode).tolist()


def test_group_mode_mean_and_unbiased_std():
    # rewards 1,0,0,1: mean 0.5; unbiased std = sqrt(4 * 0.25 / 3) = 0.57735; 0.5 / 0.57735 = 0.866025
    out = adv([1, 0, 0, 1], ["a"] * 4, "group")
    assert out == pytest.approx([0.866025, -0.866025, -0.866025, 0.866025], abs=1e-5)


def test_group_mean_mode_is_dr_grpo():
    # No std scaling: r - mean. Group a: 3,1 (mean 2) -> 1,-1; group b: 0,0,3 (mean 1) -> -1,-1,2
    assert adv([3, 1, 0, 0, 3], ["a", "a", "b", "b", "b"], "group-mean") == pytest.approx([1, -1, -1, -1, 2])


def test_batch_mode_normalises_over_the_batch():
    # rewards 1,0 | 1,1: batch mean 0.75; deviations .25,-.75,.25,.25; unbiased var = .75 / 3 = .25 -> std .5
    # -> .5, -1.5, .5, .5 (the all-success group still gets signal against the batch)
    out = adv([1, 0, 1, 1], ["a", "a", "b", "b"], "batch")
    assert out == pytest.approx([0.5, -1.5, 0.5, 0.5], abs=1e-5)


@pytest.mark.parametrize("mode", ["group", "group-mean"])
def test_single_sample_and_zero_variance_groups_get_exactly_zero(mode):
    # "solo" has no baseline; "same" has three equal rewards (0.1 + 0.1 + 0.1 is not exactly 0.3 in float)
    out = adv([5.0, 0.1, 0.1, 0.1, 1.0, 0.0], ["solo", "same", "same", "same", "mixed", "mixed"], mode)
    assert out[:4] == [0.0, 0.0, 0.0, 0.0]
    assert out[4] > 0 > out[5]


def test_nan_rewards_are_ignored_and_get_zero():
    # group [1, nan, 0]: statistics over 1 and 0 only: mean .5, std sqrt(.5) = .707107 -> +-.707107
    out = adv([1.0, float("nan"), 0.0], ["g"] * 3, "group")
    assert out == pytest.approx([0.707107, 0.0, -0.707107], abs=1e-5)
    assert not any(math.isnan(x) for x in adv([float("nan")] * 2, ["g"] * 2, "batch"))


def test_uniform_batch_and_unknown_mode():
    assert adv([1.0, 1.0, 1.0], ["a", "a", "b"], "batch") == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="unknown advantage mode"):
        adv([1.0], ["a"], "grpo-plus")


def test_group_ids_to_index_keeps_first_appearance_order():
    assert group_ids_to_index(["x", "y", "x", "z"]).tolist() == [0, 1, 0, 2]
