"""Micro-batch planning, collation offsets and the LR schedule, with hand-computed expectations."""

from __future__ import annotations

import math

import pytest
import torch

from arlctl.rl.batching import collate, plan_micro_batches
from arlctl.rl.config import TrainConfig
from arlctl.rl.trainer_state import lr_lambda
from arlctl.schemas.rows import TrajectoryRow, rows_to_table


def test_plan_micro_batches_sorts_and_respects_the_budget():
    # lengths 5, 9, 3, 8, 2 sorted longest first: 9(1), 8(3), 5(0), 3(2), 2(4)
    # budget 20: [9, 8] costs 2 x 9 = 18; adding 5 -> 3 x 9 = 27 > 20 -> new group [5, 3, 2]: 3 x 5 = 15
    assert plan_micro_batches([5, 9, 3, 8, 2], 20) == [[1, 3], [0, 2, 4]]
    # a row longer than the budget goes alone
    assert plan_micro_batches([50, 4], 10) == [[0], [1]]


def test_collate_aligns_labels_masks_and_behaviour_logprobs():
    row = TrajectoryRow(group_id="g", sample_index=0, task_id="t", env="e", env_version="1", task={}, policy="p",
                        prompt_text="", prompt_ids=[11, 12], response_ids=[21, 22, 23],
                        response_mask=[1, 0, 1], response_logprobs=[-0.1, 0.0, -0.3], reward=1.0, advantage=0.5,
                        weight=2.0)
    short = TrajectoryRow(group_id="g", sample_index=1, task_id="t", env="e", env_version="1", task={}, policy="p",
                          prompt_text="", prompt_ids=[11], response_ids=[31], response_mask=[1],
                          response_logprobs=[-0.2], reward=0.0, advantage=-0.5, weight=1.0)
    mb = collate(rows_to_table([row, short]), [0, 1])
    assert mb.input_ids.tolist() == [[11, 12, 21, 22, 23], [11, 31, 0, 0, 0]]
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    # position t predicts token t + 1: row 0 predicts 21 at t=1 (mask 1), 22 at t=2 (mask 0), 23 at t=3
    assert mb.loss_mask.tolist() == [[False, True, False, True], [True, False, False, False]]
    torch.testing.assert_close(mb.behaviour_logp, torch.tensor([[0.0, -0.1, 0.0, -0.3], [-0.2, 0.0, 0.0, 0.0]]))
    assert mb.advantages.tolist() == [0.5, -0.5] and mb.weights.tolist() == [2.0, 1.0]
    assert mb.real_tokens == 7


def test_lr_schedule_warmup_then_cosine():
    f = lr_lambda(TrainConfig(warmup_steps=3, lr_schedule="cosine", cosine_steps=4, min_lr_ratio=0.1))
    # warmup (s + 1) / 4: .25, .5, .75; then 0.1 + 0.9 * 0.5 * (1 + cos(pi * k / 4)) for k = 0..4
    expected = [0.25, 0.5, 0.75] + [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * k / 4)) for k in range(5)]
    assert [f(s) for s in range(8)] == pytest.approx(expected)
    assert f(100) == pytest.approx(0.1)
    assert lr_lambda(TrainConfig(lr_schedule="constant"))(50) == 1.0
