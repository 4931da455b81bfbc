"""The algorithm functions of issue 32 against small hand-computed values (the arithmetic is in the comments).

GSPO / CISPO / the Dr. GRPO aggregation (arlctl/rl/losses.py), rollout correction and ESS (correction.py),
the dr-grpo / rloo / reinforce++ advantages and DAPO's overlong penalty (advantages.py), GAE and the value
loss (value.py), the distillation advantage (distill.py). Then the edge cases (empty mask, single-sample and
uniform groups, NaN rewards), and the hostile inputs: NaN / +-inf / 1e30 at mask-0 positions must change
neither a result nor its gradient, and a -inf behaviour log-prob on the mask must give a finite loss and
gradient (every log-ratio is clamped to +-20).
"""

from __future__ import annotations

import math

import pytest
import torch

from arlctl.rl.advantages import (
    compute_advantages,
    overlong_penalty,
    reinforce_pp_returns,
    reinforce_pp_token_advantages,
)
from arlctl.rl.correction import ess_fraction, ess_sums, rollout_is_weights, rollout_log_weights
from arlctl.rl.distill import distill_advantages
from arlctl.rl.losses import LossConfig, aggregate_loss, cispo_loss, gspo_loss, policy_loss
from arlctl.rl.value import explained_variance, gae, value_loss

LN = math.log
NAN, INF = float("nan"), float("inf")
HOSTILE = [NAN, INF, -INF, 1e30]


def close(actual, expected, atol=1e-5):
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float64),
                               torch.as_tensor(expected, dtype=torch.float64), atol=atol, rtol=0)


# ----------------------------------------------------------------------------------------------- losses


def test_gspo_sequence_ratio_clip_and_gradient():
    # row 0: log-ratios [ln 2, 0] on the mask -> s = exp((ln 2 + 0) / 2) = sqrt 2 = 1.414214, A = +1
    # row 1: log-ratios [ln 1.1, -, ln 1.1] (a hole at t=1) -> s = exp(2 ln 1.1 / 2) = 1.1, A = +1
    # row 2: as row 0 but A = -1
    logp = torch.tensor([[LN(2), 0.0, 0.0], [LN(1.1), 5.0, LN(1.1)], [LN(2), 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 1], [1, 1, 0]])
    loss, seq_ratio = gspo_loss(logp, torch.zeros(3, 3), torch.tensor([1.0, 1.0, -1.0]), mask, 0.2, 0.2)
    close(seq_ratio, [math.sqrt(2), 1.1, math.sqrt(2)])
    close(loss, [[-1.2, -1.2, 0.0],  # min(1.414, clip 1.2) = 1.2: clipped above, per sequence
                 [-1.1, 0.0, -1.1],  # inside the band: -s A = -1.1; 0 at the hole
                 [1.414214, 1.414214, 0.0]])  # min(-1.414, -1.2) = -1.414: the pessimistic side, not clipped
    loss.sum().backward()
    # d(-s_it A)/d logp_it = -A s_i where unclipped (s_it = sg[s_i] exp(logp - sg logp)), 0 where clipped
    close(logp.grad, [[0.0, 0.0, 0.0], [-1.1, 0.0, -1.1], [1.414214, 1.414214, 0.0]])


def test_gspo_token_form_with_per_token_advantages():
    # GSPO-token: s_it = sg[s_i] exp(logp_it - sg logp_it), so token t's gradient is -A_it s_i (not shared)
    # row 0: log-ratios [ln 1.1, -, 0] -> s = exp(ln 1.1 / 2) = sqrt 1.1 = 1.048809, inside [0.8, 1.2]
    # row 1: log-ratios [ln 2, 0, -] -> s = sqrt 2 = 1.414214, above 1.2; the side is chosen per token by A's sign
    logp = torch.tensor([[LN(1.1), 7.0, 0.0], [LN(2), 0.0, 7.0]], requires_grad=True)
    adv = torch.tensor([[0.5, 9.0, -2.0], [1.0, -1.0, 9.0]])
    mask = torch.tensor([[1, 0, 1], [1, 1, 0]])
    loss, _ = gspo_loss(logp, torch.zeros(2, 3), adv, mask, 0.2, 0.2)
    close(loss, [[-0.524404, 0.0, 2.097618],  # -s A = -1.048809 * 0.5 and -1.048809 * -2
                 [-1.2, 1.414214, 0.0]])  # A = +1: min(1.414, 1.2) clipped; A = -1: min(-1.414, -1.2) = -1.414
    loss.sum().backward()
    # -A_it s_i where unclipped; 0 on the clipped token and off the mask (an un-detached s_i would spread the
    # row's mean advantage over its tokens instead: -1.048809 * (0.5 - 2) / 2 = 0.786607 on both of row 0)
    close(logp.grad, [[-0.524404, 0.0, 2.097618], [0.0, 1.414214, 0.0]])


def test_gspo_empty_row_is_zero():
    logp = torch.full((1, 3), -1.0, requires_grad=True)
    loss, seq_ratio = gspo_loss(logp, torch.zeros(1, 3), torch.tensor([1.0]), torch.zeros(1, 3))
    close(seq_ratio, [1.0])  # exp(0 / max(0, 1)) = 1
    loss.sum().backward()
    close(loss, torch.zeros(1, 3))
    close(logp.grad, torch.zeros(1, 3))


def test_cispo_detached_clipped_weight():
    # r = [1.5, 0.5, 1.1], A = [+1, -1, +1], eps 0.2 -> sg weights [1.2, 0.8, 1.1]
    logp = torch.tensor([[LN(1.5), LN(0.5), LN(1.1)]], requires_grad=True)
    loss, ratio = cispo_loss(logp, torch.zeros(1, 3), torch.tensor([[1.0, -1.0, 1.0]]), 0.2, 0.2)
    close(ratio, [[1.5, 0.5, 1.1]])
    close(loss, [[-0.486558,  # -1.2 * 1 * ln 1.5 = -1.2 * 0.405465
                  -0.554518,  # -0.8 * -1 * ln 0.5 = 0.8 * -0.693147
                  -0.104841]])  # -1.1 * 1 * ln 1.1 = -1.1 * 0.095310
    loss.sum().backward()
    # the weight is detached: d/dlogp = -w A, so clipped tokens still get gradient (PPO-clip would give 0)
    close(logp.grad, [[-1.2, 0.8, -1.1]])


PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


@pytest.mark.parametrize("kwargs, expected", [
    ({}, 7.0 / 6.0),  # (1 + 2 + 4) / (2 seqs * L = T = 3)
    ({"norm_tokens": 10}, 0.35),  # 7 / (2 * 10)
    ({"norm_tokens": 10, "num_seqs": 4}, 0.175),  # 7 / (4 * 10): the optimizer batch's count
    ({"norm_tokens": 0}, 3.5),  # L clamped to 1: 7 / (2 * 1)
])
def test_aggregate_seq_mean_token_sum_norm(kwargs, expected):
    close(aggregate_loss(PER_TOKEN, MASK, "seq-mean-token-sum-norm", **kwargs), expected)


def test_aggregate_norm_empty_mask_and_unknown_mode():
    close(aggregate_loss(PER_TOKEN, torch.zeros(2, 3), "seq-mean-token-sum-norm"), 0.0)  # 0 / (2 * 3)
    with pytest.raises(ValueError):
        aggregate_loss(PER_TOKEN, MASK, "seq-mean-token-max")


def test_policy_loss_dispatch_and_unknown_kind():
    logp = torch.tensor([[LN(1.5), LN(0.5), 0.0]], requires_grad=True)
    adv, mask = torch.tensor([1.0]), torch.tensor([[1, 1, 0]])
    loss, _ = policy_loss(logp, torch.zeros(1, 3), adv, mask, LossConfig(kind="cispo"))
    close(loss, (-1.2 * LN(1.5) - 0.8 * LN(0.5)) / 2)  # token-mean of -w A logp, w = [1.2, 0.8]
    loss, _ = policy_loss(logp, torch.zeros(1, 3), adv, mask, LossConfig(kind="gspo", loss_agg="seq-mean-token-mean"))
    close(loss, -0.866025)  # s = exp((ln 1.5 + ln 0.5) / 2) = sqrt(0.75), inside the band: -s A
    with pytest.raises(ValueError):
        policy_loss(logp, torch.zeros(1, 3), adv, mask, LossConfig(kind="ppo-kl"))


# ----------------------------------------------------------------------------------------------- correction

PROX = torch.tensor([[LN(3), LN(0.25), 7.0], [LN(1.5), 0.0, 0.0]])
CMASK = torch.tensor([[1, 1, 0], [1, 1, 0]])


@pytest.mark.parametrize("level, mode, weights, masked", [
    ("token", "truncate", [[2.0, 0.25, 0], [1.5, 1.0, 0]], [[0, 0, 0], [0, 0, 0]]),  # min(3, cap 2) = 2
    ("token", "mask", [[0.0, 0.0, 0], [1.5, 1.0, 0]], [[1, 1, 0], [0, 0, 0]]),  # 3 > 2, 0.25 < 1/2: out
    ("sequence", "truncate", [[0.75, 0.75, 0], [1.5, 1.5, 0]], [[0, 0, 0], [0, 0, 0]]),  # 3 * 0.25; 1.5 * 1
    ("geometric", "truncate", [[0.866025, 0.866025, 0], [1.224745, 1.224745, 0]],  # sqrt 0.75; sqrt 1.5
     [[0, 0, 0], [0, 0, 0]]),
    ("sequence", "mask", [[0.75, 0.75, 0], [1.5, 1.5, 0]], [[0, 0, 0], [0, 0, 0]]),  # both in [0.5, 2]
])
def test_rollout_is_weights(level, mode, weights, masked):
    w, m = rollout_is_weights(PROX, torch.zeros(2, 3), CMASK, level, mode, cap=2.0)
    close(w, weights)
    assert m.tolist() == [[bool(x) for x in row] for row in masked]


def test_rollout_mask_whole_row_and_low_threshold():
    # sequence level, cap 1.2, low 0.8: row 0 w = 0.75 < 0.8 -> whole row out; row 1 w = 1.5 > 1.2 -> out
    w, m = rollout_is_weights(PROX, torch.zeros(2, 3), CMASK, "sequence", "mask", cap=1.2, low=0.8)
    close(w, torch.zeros(2, 3))
    assert m.tolist() == [[True, True, False], [True, True, False]]
    # low 0.7 keeps row 0 at its unclipped weight 0.75
    w, _ = rollout_is_weights(PROX, torch.zeros(2, 3), CMASK, "sequence", "mask", cap=1.2, low=0.7)
    close(w, [[0.75, 0.75, 0], [0, 0, 0]])


def test_rollout_unknown_names_and_empty_mask():
    with pytest.raises(ValueError):
        rollout_is_weights(PROX, torch.zeros(2, 3), CMASK, "token", "clip", cap=2.0)
    with pytest.raises(ValueError):
        rollout_log_weights(PROX, torch.zeros(2, 3), CMASK, "segment")
    w, m = rollout_is_weights(PROX, torch.zeros(2, 3), torch.zeros(2, 3), "geometric", "mask", cap=2.0)
    close(w, torch.zeros(2, 3))  # log w = 0 / max(0, 1) = 0 -> w = 1, but 0 off the mask
    assert not m.any()


@pytest.mark.parametrize("weights, mask, expected", [
    ([[1.0, 1.0, 1.0, 1.0]], [[1, 1, 1, 1]], 1.0),  # 4^2 / (4 * 4)
    ([[2.0, 0.0, 0.0, 0.0]], [[1, 1, 1, 1]], 0.25),  # 2^2 / (4 * 4): one weight dominates -> 1/n
    ([[1.0, 3.0, 9.0, 0.0]], [[1, 1, 0, 0]], 0.8),  # (1 + 3)^2 / (2 * (1 + 9)) = 16 / 20; 9 is off the mask
    ([[0.0, 0.0]], [[1, 1]], 1.0),  # all 0: nothing to weigh
    ([[5.0, 5.0]], [[0, 0]], 1.0),  # n = 0
])
def test_ess(weights, mask, expected):
    sums = ess_sums(torch.tensor(weights), torch.tensor(mask))
    close(ess_fraction(float(sums["is_w_sum"]), float(sums["is_w_sq_sum"]), float(sums["is_n"])), expected)


# ----------------------------------------------------------------------------------------------- advantages

GROUPS = torch.tensor([0, 0, 0, 1, 2, 2, 3, 3])


@pytest.mark.parametrize("mode, expected", [
    # group 0 [1, 0, 0] mean 1/3; group 1 a single sample; group 2 [1, 1] uniform; group 3 [1, NaN]
    ("dr-grpo", [2 / 3, -1 / 3, -1 / 3, 0, 0, 0, 0, 0]),  # r - mean_g, no std
    ("rloo", [1.0, -0.5, -0.5, 0, 0, 0, 0, 0]),  # 1 - mean(0, 0) = 1; 0 - mean(1, 0) = -0.5 (= 3/2 * -1/3)
])
def test_group_modes(mode, expected):
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, NAN])
    close(compute_advantages(rewards, GROUPS, mode), expected)


def test_rloo_ignores_nan_members():
    # finite [1, 0] of [1, NaN, 0]: 1 - 0 = 1, 0 - 1 = -1, NaN -> 0
    close(compute_advantages(torch.tensor([1.0, NAN, 0.0]), torch.tensor([0, 0, 0]), "rloo"), [1.0, 0.0, -1.0])


def test_reinforce_pp_batch_normalised():
    # mean 0.5; Bessel std = sqrt(4 * 0.25 / 3) = 0.57735; +-0.5 / 0.57735 = +-0.866025; NaN -> 0
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, NAN])
    close(compute_advantages(rewards, torch.tensor([0, 0, 1, 1, 2]), "reinforce++"),
          [0.866025, -0.866025, -0.866025, 0.866025, 0.0])
    close(compute_advantages(torch.tensor([2.0, 2.0]), torch.tensor([0, 1]), "reinforce++"), [0.0, 0.0])  # equal
    close(compute_advantages(torch.tensor([2.0, NAN]), torch.tensor([0, 1]), "reinforce++"), [0.0, 0.0])  # 1 finite
    with pytest.raises(ValueError):
        compute_advantages(rewards, GROUPS[:5], "reinforce")


def test_reinforce_pp_token_returns_and_advantages():
    # row 0: outcome 1, kl [0.2, 9 (off), 0.4], beta 0.5 -> r = [-0.1, -, -0.2 + 1 = 0.8] -> G = [0.7, 0, 0.8]
    # row 1: outcome 0, kl 0, mask [1, 1, 0] -> G = [0, 0, 0]
    outcome, kl = torch.tensor([1.0, 0.0]), torch.tensor([[0.2, 9.0, 0.4], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 0, 1], [1, 1, 0]])
    close(reinforce_pp_returns(outcome, kl, mask, 0.5), [[0.7, 0, 0.8], [0, 0, 0]])
    # tokens [0.7, 0.8, 0, 0]: mean 0.375, Bessel std sqrt((0.325^2 + 0.425^2 + 2 * 0.375^2) / 3) = 0.434933
    close(reinforce_pp_token_advantages(outcome, kl, mask, 0.5),
          [[0.747241, 0, 0.977163], [-0.862201, -0.862201, 0]])  # 0.325 / 0.434933, 0.425 / .., -0.375 / ..
    # a NaN outcome counts as 0; an empty mask gives zeros
    close(reinforce_pp_returns(torch.tensor([NAN]), torch.zeros(1, 2), torch.ones(1, 2), 0.5), [[0.0, 0.0]])
    close(reinforce_pp_token_advantages(outcome, kl, torch.zeros(2, 3), 0.5), torch.zeros(2, 3))


def test_overlong_penalty():
    # l_max 20, l_cache 4: safe up to 16; (16 - L) / 4 on (16, 20]; -1 beyond
    close(overlong_penalty([0, 16, 17, 18, 20, 21, 100], 20, 4), [0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0])
    with pytest.raises(ValueError):
        overlong_penalty([5], 20, 0)
    with pytest.raises(ValueError):
        overlong_penalty([5], 4, 8)


# ----------------------------------------------------------------------------------------------- value, distill


def test_gae_skips_mask_zero_steps():
    # mask [1, 0, 1]: steps are t=0 then t=2; gamma 0.9, lam 0.8
    # k=1 (t=2): delta = 1 + 0.9 * 0 - 0.8 = 0.2 -> A = 0.2, R = 1.0
    # k=0 (t=0): delta = 0 + 0.9 * 0.8 - 0.5 = 0.22 -> A = 0.22 + 0.9 * 0.8 * 0.2 = 0.364, R = 0.864
    adv, ret = gae(torch.tensor([[0.0, 3.0, 1.0]]), torch.tensor([[0.5, 9.0, 0.8]]), torch.tensor([[1, 0, 1]]),
                   gamma=0.9, lam=0.8)
    close(adv, [[0.364, 0.0, 0.2]])
    close(ret, [[0.864, 0.0, 1.0]])
    adv, ret = gae(torch.ones(1, 2), torch.ones(1, 2), torch.zeros(1, 2), 1.0, 1.0)  # empty mask
    close(adv, torch.zeros(1, 2))
    close(ret, torch.zeros(1, 2))


def test_value_loss_clip_and_gradient():
    values = torch.tensor([[1.0, 2.0, 0.0, 7.0]], requires_grad=True)
    old, ret, mask = torch.tensor([[0.5, 2.5, 0.0, 0.0]]), torch.tensor([[0.0, 1.0, 1.0, 0.0]]), torch.tensor([[1, 1, 1, 0]])
    loss, clipped = value_loss(values, old, ret, mask, clip=0.2)
    close(loss, [[0.5,  # max((1-0)^2 = 1, (0.5 + 0.2 - 0)^2 = 0.49) / 2
                  0.845,  # max((2-1)^2 = 1, (2.5 - 0.2 - 1)^2 = 1.69) / 2: the clipped branch
                  0.5,  # (0 - 1)^2 / 2 both ways
                  0.0]])  # off the mask
    assert clipped.tolist() == [[False, True, False, False]]
    loss.sum().backward()
    close(values.grad, [[1.0, 0.0, -1.0, 0.0]])  # V - R; 0 through the clamped branch
    loss, clipped = value_loss(values, old, ret, mask, clip=None)
    close(loss, [[0.5, 0.5, 0.5, 0.0]])  # (V - R)^2 / 2
    assert not clipped.any()


def test_explained_variance():
    ret, mask = torch.tensor([[1.0, 2.0, 3.0, 50.0]]), torch.tensor([[1, 1, 1, 0]])
    close(explained_variance(ret, ret, mask), 1.0)  # perfect critic
    close(explained_variance(torch.zeros(1, 4), ret, mask), 0.0)  # 1 - Var(R) / Var(R)
    # R - V = [0, 1, 0]: Var = 2/9; Var(R) = 2/3 -> 1 - 1/3
    close(explained_variance(torch.tensor([[1.0, 1.0, 3.0, 0.0]]), ret, mask), 2 / 3)
    close(explained_variance(ret, torch.ones(1, 4), mask), 0.0)  # constant returns
    close(explained_variance(ret, ret, torch.zeros(1, 4)), 0.0)  # empty mask


def test_distill_advantages():
    teacher, student = torch.tensor([[-1.0, -2.0, -INF, 4.0]]), torch.tensor([[-1.5, -0.5, -1.0, NAN]])
    mask = torch.tensor([[1, 1, 1, 0]])
    # 2 * (-1 + 1.5) = 1; 2 * (-2 + 0.5) = -3; 2 * clamp(-inf, -20) = -40; 0 off the mask
    close(distill_advantages(teacher, student, mask, coef=2.0), [[1.0, -3.0, -40.0, 0.0]])


# ----------------------------------------------------------------------------------------------- hostile inputs

HMASK = torch.tensor([[1, 0, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]])  # a hole, padding, an empty row
OFF = ~HMASK.bool()


def inputs(seed, bad, dirty):
    """Named [B, T] tensors; those in `dirty` hold `bad` at every mask-0 position (0.0: the clean twin)."""
    g = torch.Generator().manual_seed(seed)
    spec = {"logp": (0.3, -1.0), "old": (0.3, -1.0), "ref": (0.3, -1.0), "teacher": (0.3, -1.0), "adv": (1.0, 0.0),
            "rew": (1.0, 0.0), "val": (1.0, 0.0), "val_old": (1.0, 0.0), "ret": (1.0, 0.0), "kl": (0.1, 0.0)}
    out = {}
    for name, (scale, shift) in spec.items():
        x = torch.randn(3, 4, generator=g, dtype=torch.float64) * scale + shift
        out[name] = torch.where(OFF, torch.full_like(x, bad), x) if dirty is None or name in dirty else x
    return out


def twin_check(fn, leaf_names, seed=0, dirty=None):
    """fn(dict of tensors) -> tensor or tuple; compares hostile vs clean, values and gradients of the leaves."""
    results = []
    for bad in (0.0, *HOSTILE):
        t = inputs(seed, bad, dirty)
        for name in leaf_names:
            t[name].requires_grad_(True)
        out = fn(t)
        outs = out if isinstance(out, tuple) else (out,)
        grads = []
        scalar = sum((o.double().sum() for o in outs if torch.is_tensor(o) and o.requires_grad), torch.zeros(()))
        if scalar.requires_grad:
            grads = torch.autograd.grad(scalar, [t[n] for n in leaf_names], allow_unused=True)
            grads = [torch.zeros(3, 4) if gr is None else gr for gr in grads]
        results.append(([torch.as_tensor(o).double() for o in outs], grads))
    (clean, clean_grads) = results[0]
    for outs, grads in results[1:]:
        for o, c in zip(outs, clean):
            torch.testing.assert_close(o, c, atol=0, rtol=0)
        for gr, c in zip(grads, clean_grads):
            assert torch.isfinite(gr).all()
            torch.testing.assert_close(gr, c, atol=0, rtol=0)


@pytest.mark.parametrize("cfg", [
    LossConfig(kind="ppo-clip"), LossConfig(kind="gspo", loss_agg="seq-mean-token-mean"),
    LossConfig(kind="cispo", loss_agg="seq-mean-token-sum"), LossConfig(kind="ppo-clip", kl_coef=0.1),
    LossConfig(kind="cispo", loss_agg="seq-mean-token-sum-norm", teacher_kl_coef=0.2),
    LossConfig(kind="ppo-clip", tis_cap=2.0, is_level="token", is_mode="truncate"),
    LossConfig(kind="gspo", tis_cap=2.0, is_level="geometric", is_mode="mask"),
    LossConfig(kind="cispo", tis_cap=2.0, is_level="sequence", is_mode="mask"),
], ids=lambda c: f"{c.kind}-{c.loss_agg}-{c.tis_cap}-{c.is_level}-{c.is_mode}")
def test_policy_loss_ignores_off_mask_garbage(cfg):
    twin_check(lambda t: policy_loss(t["logp"], t["old"], t["adv"], HMASK, cfg, weights=torch.ones(3),
                                     ref_logp=t["ref"], teacher_logp=t["teacher"])[0], ["logp"])


def test_gspo_loss_ignores_off_mask_garbage_in_old_logp():
    twin_check(lambda t: gspo_loss(t["logp"], t["old"], torch.ones(3), HMASK), ["logp"], dirty={"old"})


def test_gspo_loss_ignores_off_mask_garbage_in_logp_and_advantages():
    twin_check(lambda t: gspo_loss(t["logp"], t["old"], t["adv"], HMASK), ["logp"])


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                  "seq-mean-token-sum-norm"])
def test_aggregate_ignores_off_mask_garbage(mode):
    twin_check(lambda t: aggregate_loss(t["adv"], HMASK, mode), ["adv"])


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_correction_ignores_off_mask_garbage(level, mode):
    def fn(t):
        w, m = rollout_is_weights(t["logp"], t["old"], HMASK, level, mode, cap=2.0)
        sums = ess_sums(w, HMASK)
        lw = torch.where(HMASK.bool(), rollout_log_weights(t["logp"], t["old"], HMASK, level), 0.0)
        return w, m, lw, sums["is_w_sum"], sums["is_w_sq_sum"], sums["is_n"]
    twin_check(fn, [])


def test_value_functions_ignore_off_mask_garbage():
    twin_check(lambda t: (*gae(t["rew"], t["val"], HMASK, 0.9, 0.95),
                          *value_loss(t["val"], t["val_old"], t["ret"], HMASK, clip=0.2),
                          value_loss(t["val"], t["val_old"], t["ret"], HMASK)[0],
                          torch.tensor(explained_variance(t["val"], t["ret"], HMASK))), ["val"])


def test_distill_and_reinforce_pp_ignore_off_mask_garbage():
    twin_check(lambda t: (distill_advantages(t["teacher"], t["logp"], HMASK, 0.5),
                          reinforce_pp_returns(torch.tensor([1.0, 0.0, 1.0]), t["kl"], HMASK, 0.1),
                          reinforce_pp_token_advantages(torch.tensor([1.0, 0.0, NAN]), t["kl"], HMASK, 0.1)),
               ["teacher"])


def test_advantages_drop_non_finite_rewards():
    # a NaN / inf reward takes no part: the others get what they would get without it, it gets 0
    for mode in ("dr-grpo", "rloo", "reinforce++", "group", "batch"):
        clean = compute_advantages(torch.tensor([1.0, 0.0, 3.0]), torch.tensor([0, 0, 0]), mode)
        for bad in HOSTILE[:3]:
            dirty = compute_advantages(torch.tensor([1.0, bad, 0.0, 3.0]), torch.tensor([0, 0, 0, 0]), mode)
            close(dirty, [clean[0], 0.0, clean[1], clean[2]], atol=0)


@pytest.mark.parametrize("kind", ["ppo-clip", "gspo", "cispo"])
@pytest.mark.parametrize("tis_cap", [None, 2.0])
def test_minus_inf_behaviour_logp_on_mask_is_finite(kind, tis_cap):
    # log-ratio logp - (-inf) = +inf is clamped to 20: the ratio exp(20) is large but finite
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, -1.1]], requires_grad=True)
    behaviour = torch.tensor([[-1.1, -INF, -0.4], [-INF, -INF, -INF]])
    for adv in (torch.tensor([1.0, -1.0]), torch.tensor([-1.0, 1.0])):
        for level in ("token", "sequence", "geometric"):
            for is_mode in ("truncate", "mask"):
                cfg = LossConfig(kind=kind, tis_cap=tis_cap, is_level=level, is_mode=is_mode,
                                 loss_agg="seq-mean-token-mean" if kind == "gspo" else "token-mean")
                loss, sums = policy_loss(logp, behaviour, adv, torch.ones(2, 3), cfg)
                (grad,) = torch.autograd.grad(loss, [logp])
                assert torch.isfinite(loss) and torch.isfinite(grad).all()
                assert all(torch.isfinite(v).all() for v in sums.values())


def test_minus_inf_behaviour_logp_in_the_correction_weights():
    # token level: log w = 0 - (-inf) -> clamped to 20: truncate gives the cap 2, mask drops the token
    prox, beh, mask = torch.zeros(1, 2), torch.tensor([[-INF, 0.0]]), torch.ones(1, 2)
    close(rollout_is_weights(prox, beh, mask, "token", "truncate", cap=2.0)[0], [[2.0, 1.0]])
    w, m = rollout_is_weights(prox, beh, mask, "token", "mask", cap=2.0)
    close(w, [[0.0, 1.0]])  # exp(20) > 2: out; exp(0) = 1 kept
    assert m.tolist() == [[True, False]]
    # geometric: (+inf + 0) / 2 = +inf -> clamped to 20 -> exp(20) > 2: the whole row is out
    w, m = rollout_is_weights(prox, beh, mask, "geometric", "mask", cap=2.0)
    close(w, [[0.0, 0.0]])
    assert m.tolist() == [[True, True]]


def test_ess_sums_ignore_off_mask_garbage():
    # weights [1, 3] on the mask, garbage off it: sums 4, 10, n 2 whatever the garbage
    for bad in HOSTILE:
        sums = ess_sums(torch.tensor([[1.0, bad, 3.0]]), torch.tensor([[1, 0, 1]]))
        close([float(sums["is_w_sum"]), float(sums["is_w_sq_sum"]), float(sums["is_n"])], [4.0, 10.0, 2.0], atol=0)


def test_step_metric_explained_var_is_value_explained_variance():
    """finalize_metrics builds explained_var from summed micro-batch pieces; it must equal the function's 1 - Var(R - V) / Var(R)."""
    from arlctl.rl.losses import METRIC_SUMS, finalize_metrics

    gen = torch.Generator().manual_seed(0)
    values, returns = torch.randn(3, 5, generator=gen), torch.randn(3, 5, generator=gen)
    mask = torch.rand(3, 5, generator=gen) > 0.3
    on = mask.double()
    v, r = values.double() * on, returns.double() * on
    sums = {k: torch.tensor(0.0) for k in METRIC_SUMS} | {
        "tokens": on.sum(), "ratio_max": torch.tensor(1.0), "ratio_min": torch.tensor(1.0),
        "value_loss": torch.tensor(0.0), "value_clip_frac": torch.tensor(0.0), "value_sq_err": ((v - r) ** 2).sum(),
        "value_mean": v.sum(), "return_mean": r.sum(), "return_sq": (r * r).sum()}
    close(finalize_metrics([sums])["explained_var"], explained_variance(values, returns, mask))
