"""The loss pieces against hand-computed values (the arithmetic is in the comments)."""

from __future__ import annotations

import math

import pytest
import torch

from arlctl.rl.losses import (
    LossConfig,
    aggregate_loss,
    entropy_from_logits,
    finalize_metrics,
    kl_k3,
    policy_loss,
    ppo_clip_loss,
    token_logprobs,
    truncated_is_weights,
)

LN = math.log


def test_ppo_clip_both_sides_and_gradients():
    # ratios r = exp(logp - 0) and per-token advantages; eps_low = 0.2 -> [0.8, ...], eps_high = 0.3 -> [..., 1.3]
    ratios = [1.5, 0.5, 1.1, 0.9, 1.5, 0.5]
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0, -1.0, 1.0]])
    logp = torch.tensor([[LN(r) for r in ratios]], requires_grad=True)
    loss, ratio = ppo_clip_loss(logp, torch.zeros(1, 6), adv, eps_low=0.2, eps_high=0.3)
    expected = [
        -1.3,  # r=1.5, A=+1: min(1.5, clip 1.3) = 1.3 -> clipped above
        0.8,  # r=0.5, A=-1: min(-0.5, -0.8) = -0.8 -> clipped below
        -1.1,  # r=1.1, A=+1: inside the band
        0.9,  # r=0.9, A=-1: inside the band
        1.5,  # r=1.5, A=-1: min(-1.5, -1.3) = -1.5: the pessimistic side is never clipped
        -0.5,  # r=0.5, A=+1: min(0.5, 0.8) = 0.5: never clipped either
    ]
    torch.testing.assert_close(loss, torch.tensor([expected]), atol=1e-6, rtol=0)
    torch.testing.assert_close(ratio, torch.tensor([ratios]), atol=1e-6, rtol=0)
    loss.sum().backward()
    # d(-r A)/d logp = -A r where unclipped; 0 where the clipped branch is active.
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 0.0, -1.1, 0.9, 1.5, -0.5]]), atol=1e-6, rtol=0)


def test_ppo_clip_broadcasts_row_advantages():
    # One advantage per row is broadcast over that row's tokens.
    logp = torch.zeros(2, 3)
    loss, _ = ppo_clip_loss(logp, torch.zeros(2, 3), torch.tensor([2.0, -0.5]))
    torch.testing.assert_close(loss, torch.tensor([[-2.0] * 3, [0.5] * 3]))


PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 7.0 / 3.0),  # (1 + 2 + 4) / 3 masked tokens
        ("seq-mean-token-sum", 3.5),  # ((1 + 2) + 4) / 2 rows
        ("seq-mean-token-mean", 2.75),  # ((1 + 2) / 2 + 4 / 1) / 2 rows
    ],
)
def test_aggregation_modes_use_only_masked_tokens(mode, expected):
    assert aggregate_loss(PER_TOKEN, MASK, mode).item() == pytest.approx(expected)


def test_aggregation_with_global_denominators_and_empty_masks():
    # token-mean with the whole batch's token count 6: 7 / 6
    assert aggregate_loss(PER_TOKEN, MASK, "token-mean", num_tokens=6).item() == pytest.approx(7 / 6)
    # seq-mean-token-sum over 4 rows in the optimizer batch: 7 / 4
    assert aggregate_loss(PER_TOKEN, MASK, "seq-mean-token-sum", num_seqs=4).item() == pytest.approx(1.75)
    # An all-zero mask: every denominator clamps to 1, the loss is 0, never NaN.
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):
        assert aggregate_loss(PER_TOKEN, torch.zeros(2, 3), mode).item() == 0.0


def test_unknown_aggregation_mode_raises():
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        aggregate_loss(PER_TOKEN, MASK, "sum")


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_micro_batches_sum_to_the_full_batch_loss(mode):
    torch.manual_seed(0)
    per_token = torch.randn(5, 7)
    mask = (torch.rand(5, 7) > 0.4).int()
    full = aggregate_loss(per_token, mask, mode)
    parts = sum(
        aggregate_loss(per_token[rows], mask[rows], mode, num_tokens=mask.sum(), num_seqs=5)
        for rows in ([0, 1], [2], [3, 4])
    )
    torch.testing.assert_close(parts, full)


def test_token_logprobs_and_entropy():
    logits = torch.tensor([[[0.0, LN(3.0)], [0.0, 0.0]]])  # probs [0.25, 0.75] and [0.5, 0.5]
    lp = token_logprobs(logits, torch.tensor([[1, 0]]))
    torch.testing.assert_close(lp, torch.tensor([[LN(0.75), LN(0.5)]]))
    # H = -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.562335; H(uniform of 2) = ln 2
    ent = entropy_from_logits(logits)
    torch.testing.assert_close(ent, torch.tensor([[-(0.25 * LN(0.25) + 0.75 * LN(0.75)), LN(2.0)]]))


def test_kl_k3_values():
    # pi = 0.5, ref = 0.25: d = ln(0.25 / 0.5) = -ln 2; exp(d) - d - 1 = 0.5 + 0.693147 - 1 = 0.193147
    kl = kl_k3(torch.tensor([LN(0.5), LN(0.3)]), torch.tensor([LN(0.25), LN(0.3)]))
    torch.testing.assert_close(kl, torch.tensor([0.5 + LN(2.0) - 1.0, 0.0]))


def test_truncated_is_weights_cap():
    # pi_old / pi_behaviour = 3 -> capped at 2; 0.5 stays 0.5
    w = truncated_is_weights(torch.tensor([LN(3.0), LN(0.5)]), torch.zeros(2), cap=2.0)
    torch.testing.assert_close(w, torch.tensor([2.0, 0.5]))


def test_policy_loss_weights_per_row():
    # ratio 1 everywhere, A = -1 -> per-token loss 1; row weights 2 and 0.5; 4 tokens:
    # token-mean = (2 + 2 + 0.5 + 0.5) / 4 = 1.25
    zeros = torch.zeros(2, 2)
    loss, _ = policy_loss(zeros, zeros, torch.tensor([-1.0, -1.0]), torch.ones(2, 2), LossConfig(),
                          weights=torch.tensor([2.0, 0.5]))
    assert loss.item() == pytest.approx(1.25)


def test_policy_loss_tis_decouples_ratio_and_weights_tokens():
    # Trainer log-probs ln 3 and ln 0.5 against behaviour 0: IS weights min(3, 2) = 2 and 0.5.
    # With TIS the PPO ratio is against the detached trainer log-probs, so r = 1 (never clipped) and
    # per-token loss = -A * r * w = -2 and -0.5; token-mean = -1.25; d/dlogp = -A * w = [-2, -0.5] / 2 tokens.
    logp = torch.tensor([[LN(3.0), LN(0.5)]], requires_grad=True)
    cfg = LossConfig(tis_cap=2.0)
    loss, sums = policy_loss(logp, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), cfg)
    assert loss.item() == pytest.approx(-1.25)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.0, -0.25]]))
    # Without TIS the same tokens are clipped against the behaviour ratio: r = 3 -> 1.2, r = 0.5 -> 0.5
    # (A > 0 is clipped only above): (-1.2 - 0.5) / 2 = -0.85
    loss2, _ = policy_loss(logp.detach(), torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), LossConfig())
    assert loss2.item() == pytest.approx(-0.85)


def test_policy_loss_kl_term_and_mask():
    # ratio 1, A = 0 -> policy part 0. KL k3 per token: 0.193147 (pi .5 vs ref .25) on the masked token;
    # the second token is mask 0 and must not count. kl_coef 0.1 -> loss = 0.0193147
    logp = torch.tensor([[LN(0.5), LN(0.9)]])
    ref = torch.tensor([[LN(0.25), LN(0.1)]])
    cfg = LossConfig(kl_coef=0.1)
    loss, sums = policy_loss(logp, logp, torch.tensor([0.0]), torch.tensor([[1, 0]]), cfg, ref_logp=ref)
    assert loss.item() == pytest.approx(0.1 * (0.5 + LN(2.0) - 1.0), abs=1e-7)
    assert finalize_metrics([sums])["ref_kl"] == pytest.approx(0.5 + LN(2.0) - 1.0, abs=1e-6)


def test_policy_loss_metrics_clip_fractions():
    # Same six tokens as the clipping test: one clipped below (r=.5, A<0), one above (r=1.5, A>0) of 6.
    ratios = [1.5, 0.5, 1.1, 0.9, 1.5, 0.5]
    logp = torch.tensor([[LN(r) for r in ratios]])
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0, -1.0, 1.0]])
    _, sums = policy_loss(logp, torch.zeros(1, 6), adv, torch.ones(1, 6), LossConfig(eps_low=0.2, eps_high=0.3))
    m = finalize_metrics([sums])
    assert m["clip_frac_low"] == pytest.approx(1 / 6)
    assert m["clip_frac_high"] == pytest.approx(1 / 6)
    assert m["ratio_max"] == pytest.approx(1.5) and m["ratio_min"] == pytest.approx(0.5)
    assert m["ratio_mean"] == pytest.approx(sum(ratios) / 6)
    # approx KL(behaviour || theta), k3 per token: (r - 1) - ln r, averaged
    assert m["approx_kl"] == pytest.approx(sum((r - 1) - LN(r) for r in ratios) / 6, rel=1e-5)
