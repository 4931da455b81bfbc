"""Per-turn advantages reach exactly their turn's sampled tokens (arlctl/rl/batching.py), checked by hand."""

from __future__ import annotations

import math

import pytest
import torch

from arlctl.rl.batching import batch_columns, collate, nonfinite_rows, turn_spans
from arlctl.rl.losses import LossConfig, policy_loss
from arlctl.schemas.rows import TrajectoryRow, Turn, rows_to_table


def make_row(prompt, response, mask, turns, advantage, sample_index=0, finish_reason="stop", tid=None):
    extra = {"trajectory_id": tid} if tid else {}
    return TrajectoryRow(group_id="g", sample_index=sample_index, task_id="t", env="e", env_version="1", task={},
                         policy="p", prompt_text="", prompt_ids=prompt, response_ids=response, response_mask=mask,
                         response_logprobs=[-0.5 if m else 0.0 for m in mask], turns=turns, reward=1.0,
                         advantage=advantage, weight=1.0, finish_reason=finish_reason, **extra)


# Row 0: prompt 11 12 | turn 0 samples 21 22 (mask 1), the env answers 23 24 (mask 0) | turn 1 samples 25.
TWO_TURNS = make_row([11, 12], [21, 22, 23, 24, 25], [1, 1, 0, 0, 1],
                     [Turn(0, 0, 2, 2, "a", advantage=1.5), Turn(1, 4, 1, 0, "b", advantage=-2.0)], advantage=0.25)
# Row 1: one turn without a per-turn advantage (an outcome-mode row): its row advantage everywhere.
PLAIN = make_row([11], [31], [1], [Turn(0, 0, 1, 0, "c")], advantage=0.5, sample_index=1)


def test_each_turns_tokens_get_that_turns_advantage():
    mb = collate(rows_to_table([TWO_TURNS, PLAIN]), [0, 1])
    # width 2 + 5 = 7; position t holds the advantage of token t + 1 (as loss_mask does):
    # row 0 unshifted [.25, .25, 1.5, 1.5, .25, .25, -2] -> shifted [.25, 1.5, 1.5, .25, .25, -2]
    assert mb.advantages.tolist() == [[0.25, 1.5, 1.5, 0.25, 0.25, -2.0], [0.5] * 6]
    assert mb.loss_mask.tolist() == [[False, True, True, False, False, True], [True] + [False] * 5]
    # on the mask: row 0's turn-0 tokens (21, 22) get 1.5, its turn-1 token (25) -2; row 1's token 0.5
    assert mb.advantages[mb.loss_mask].tolist() == [1.5, 1.5, -2.0, 0.5]


def test_without_turn_advantages_the_row_vector_is_used_unchanged():
    plain_two = make_row([11, 12], [21, 22, 23, 24, 25], [1, 1, 0, 0, 1],
                         [Turn(0, 0, 2, 2, "a"), Turn(1, 4, 1, 0, "b")], advantage=0.25)
    mb = collate(rows_to_table([plain_two, PLAIN]), [0, 1])
    assert mb.advantages.shape == (2,) and mb.advantages.tolist() == [0.25, 0.5]
    # a micro-batch of only the plain row, out of a batch that has per-turn advantages: also [B]
    assert collate(rows_to_table([TWO_TURNS, PLAIN]), [1]).advantages.tolist() == [0.5]
    assert turn_spans(rows_to_table([TWO_TURNS, PLAIN])) == [[(0, 2, 1.5), (4, 1, -2.0)], None]


def test_per_turn_history_rows_carry_their_own_turns_advantage():
    # --history per-turn: row k is the template's prompt for turn k plus that turn's sampled ids only.
    first = make_row([11, 12], [21, 22], [1, 1], [Turn(0, 0, 2, 0, "a", advantage=1.5)], advantage=0.25,
                     finish_reason="continued", tid="traj")
    second = make_row([11, 12, 21, 22, 23, 24], [25], [1], [Turn(1, 0, 1, 0, "b", advantage=-2.0)],
                      advantage=0.25, tid="traj")
    mb = collate(rows_to_table([first, second]), [0, 1])
    # width max(2 + 2, 6 + 1) = 7. Row 0: tokens 21 22 at positions 2 3 -> shifted 1 2.
    # Row 1: token 25 at position 6 -> shifted 5; every other position holds the row advantage .25
    assert mb.advantages.tolist() == [[0.25, 1.5, 1.5, 0.25, 0.25, 0.25], [0.25] * 5 + [-2.0]]
    assert mb.advantages[mb.loss_mask].tolist() == [1.5, 1.5, -2.0]


def test_the_loss_weighs_each_token_by_its_own_advantage():
    mb = collate(rows_to_table([TWO_TURNS, PLAIN]), [0, 1])
    # at ratio 1 (current = behaviour log-probs) the PPO-clip loss of a token is -A; token-mean over the
    # 4 trained tokens: -(1.5 + 1.5 - 2.0 + 0.5) / 4 = -1.5 / 4 = -0.375
    loss, _ = policy_loss(mb.behaviour_logp.clone(), mb.behaviour_logp, mb.advantages, mb.loss_mask, LossConfig())
    assert float(loss) == pytest.approx(-0.375)
    # the same tokens with one row advantage each would give -(3 * 0.25 + 0.5) / 4 = -0.3125: it differs
    row_only, _ = policy_loss(mb.behaviour_logp.clone(), mb.behaviour_logp, torch.tensor([0.25, 0.5]),
                              mb.loss_mask, LossConfig())
    assert float(row_only) == pytest.approx(-0.3125)


def test_a_non_finite_turn_advantage_condemns_its_row():
    bad = make_row([11], [21, 22], [1, 1], [Turn(0, 0, 1, 0, "a", advantage=0.5),
                                           Turn(1, 1, 1, 0, "b", advantage=math.inf)], advantage=0.25)
    cols = batch_columns(rows_to_table([PLAIN, bad]))
    assert nonfinite_rows(cols) == {1: "turn advantage inf at response token 1"}
