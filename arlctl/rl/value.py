"""PPO with a critic: generalised advantage estimation and the clipped value loss (DESIGN.md §9).

Pure functions over [B, T] tensors laid out like the loss mask (position t scores token t + 1). The time steps
of a row are its mask-1 positions in order: environment and tool tokens (mask 0) are not actions, so the step
after a sampled token is the next sampled token, across a tool call. After a row's last sampled token the
episode has ended and the next value is 0.

  gae                  Schulman et al. 2016: delta_k = r_k + gamma V_{k+1} - V_k, A_k = delta_k + gamma lam A_{k+1},
                       returns R_k = A_k + V_k (the value targets)
  value_loss           0.5 max((V - R)^2, (V_old + clip(V - V_old, +-c) - R)^2): PPO's clipped value loss
  explained_variance   1 - Var(R - V) / Var(R) over mask-1 tokens: how much of the returns the critic predicts

The critic itself is a linear value head on the policy's last hidden state (arlctl/rl/distributed.py
`ScoringModel`), trained with the policy and checkpointed with it; stages/train.py computes the values with
no gradient before the step (the "old" values), GAE from them, then the policy and value losses.
"""

from __future__ import annotations

import torch

from arlctl.rl.losses import zero_off_mask


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
        lam: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages [B, T], returns [B, T]) by GAE over each row's mask-1 positions; both 0 off the mask.

    rewards [B, T]: the reward received after each action (the outcome at a row's last sampled token, a
    turn's step reward at that turn's last one); values [B, T]: V of the state before each action.
    """
    on = mask.bool()
    rewards = zero_off_mask(rewards, mask)  # [B, T]
    values = zero_off_mask(values.detach(), mask)  # [B, T]
    advantages = torch.zeros_like(values)  # [B, T]
    next_value = torch.zeros(values.shape[0], dtype=values.dtype, device=values.device)  # [B] V_{k+1}
    next_adv = torch.zeros_like(next_value)  # [B] A_{k+1}
    for t in range(values.shape[-1] - 1, -1, -1):  # right to left; a mask-0 column carries the later step through
        here = on[:, t]  # [B]
        delta = rewards[:, t] + gamma * next_value - values[:, t]  # [B]
        adv = delta + gamma * lam * next_adv  # [B]
        advantages[:, t] = torch.where(here, adv, torch.zeros_like(adv))
        next_value = torch.where(here, values[:, t], next_value)
        next_adv = torch.where(here, adv, next_adv)
    returns = zero_off_mask(advantages + values, mask)  # [B, T]
    return advantages, returns


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-token loss [B, T], clipped [B, T] bool): 0.5 (V - R)^2, or with `clip` the larger of that and
    0.5 (V_old + clamp(V - V_old, -clip, clip) - R)^2 (the clipped branch was the larger one where clipped)."""
    values = zero_off_mask(values, mask)  # [B, T]
    old_values = zero_off_mask(old_values.detach(), mask)  # [B, T]
    returns = zero_off_mask(returns.detach(), mask)  # [B, T]
    unclipped = (values - returns) ** 2  # [B, T]
    if clip is None:
        return zero_off_mask(0.5 * unclipped, mask), torch.zeros_like(mask.bool())
    moved = old_values + torch.clamp(values - old_values, -clip, clip)  # [B, T]
    clipped = (moved - returns) ** 2  # [B, T]
    chosen = clipped > unclipped  # [B, T]
    return zero_off_mask(0.5 * torch.maximum(unclipped, clipped), mask), chosen & mask.bool()


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(R - V) / Var(R) over mask-1 positions (population variances); 0.0 when Var(R) is 0."""
    on = mask.bool()
    r, v = returns.detach()[on].double(), values.detach()[on].double()
    if r.numel() == 0:
        return 0.0
    var_r = r.var(unbiased=False)
    if float(var_r) <= 1e-12:
        return 0.0
    return float(1.0 - (r - v).var(unbiased=False) / var_r)
