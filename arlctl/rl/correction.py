"""Rollout correction: importance weights for the mismatch between the engine that sampled and the trainer.

The engine that sampled a row (vLLM, an older policy version, another precision) is the behaviour policy;
the trainer's own detached scores of the same tokens are the proximal policy. Their ratio
w = pi_proximal / pi_behaviour corrects the policy gradient for the gap (verl's TIS/MIS, TRL's vLLM
importance sampling, AReaL's decoupled PPO). Pure functions over [B, T] tensors, every weight detached.

Levels (`train --is-level`), the log-weight of position t of row i:
  token      d_it = prox_it - beh_it                          one weight per token (TIS)
  sequence   sum_t m_it d_it                                  the whole row's likelihood ratio, broadcast
  geometric  sum_t m_it d_it / |y_i|                          its per-token geometric mean, broadcast
Modes (`train --is-mode`), with the upper threshold `cap` (`--tis-cap`) and the lower `low` (`--is-low`,
default 1 / cap):
  truncate   w = min(w, cap)                                  every token trained, high weights cut (TIS)
  mask       w kept as it is where low <= w <= cap, else 0    tokens (token level) or whole rows (sequence,
                                                              geometric) outside the band leave the loss (MIS)
Log-weights are clamped to +-LOG_RATIO_CLAMP before exp, so a -inf behaviour log-prob gives a large finite
weight (truncated or masked), never inf.

The effective sample size of the weights, ESS / n = (sum w)^2 / (n sum w^2) over mask-1 tokens, says how many
of the batch's tokens the weighted gradient is worth: 1 when every weight is equal, 1/n when one dominates.
`ess_sums` returns sums so micro-batches and ranks add up before `ess_fraction` divides once.
"""

from __future__ import annotations

import torch

from arlctl.rl.losses import LOG_RATIO_CLAMP, zero_off_mask

IS_LEVELS = ("token", "sequence", "geometric")
IS_MODES = ("truncate", "mask")


def rollout_log_weights(proximal_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor,
                        level: str) -> torch.Tensor:
    """Detached log importance weights [B, T] at `level` (broadcast over the row for sequence / geometric)."""
    if level not in IS_LEVELS:
        raise ValueError(f"unknown rollout-correction level {level!r}; expected one of {', '.join(IS_LEVELS)}")
    delta = zero_off_mask(proximal_logp.detach() - behaviour_logp, mask)  # [B, T]
    if level == "token":
        return delta.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    per_row = delta.sum(dim=-1)  # [B]
    if level == "geometric":
        per_row = per_row / mask.to(delta.dtype).sum(dim=-1).clamp(min=1)  # [B]
    return per_row.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).unsqueeze(-1).expand_as(delta)  # [B, T]


def rollout_is_weights(proximal_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor,
                       level: str = "token", mode: str = "truncate", cap: float = 2.0,
                       low: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [B, T], masked [B, T] bool): the correction weight of each trained token, 0 off the mask.

    masked marks the mask-1 positions the mask mode took out of the loss (all False under truncate).
    """
    if mode not in IS_MODES:
        raise ValueError(f"unknown rollout-correction mode {mode!r}; expected one of {', '.join(IS_MODES)}")
    on = mask.bool()
    weights = torch.exp(rollout_log_weights(proximal_logp, behaviour_logp, mask, level))  # [B, T]
    if mode == "truncate":
        return zero_off_mask(weights.clamp(max=cap), mask), torch.zeros_like(on)
    low = 1.0 / cap if low is None else low
    outside = ((weights > cap) | (weights < low)) & on  # [B, T]; per row at the row levels (w is broadcast)
    kept = torch.where(outside, torch.zeros_like(weights), weights)  # [B, T]
    return zero_off_mask(kept, mask), outside


def ess_sums(weights: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """sum w, sum w^2 and n over mask-1 positions (float64), for `ess_fraction` after adding micro-batches."""
    w = zero_off_mask(weights.detach().to(torch.float64), mask)  # [B, T]
    return {"is_w_sum": w.sum(), "is_w_sq_sum": (w * w).sum(), "is_n": mask.to(torch.float64).sum()}


def ess_fraction(w_sum: float, w_sq_sum: float, n: float) -> float:
    """ESS / n = (sum w)^2 / (n sum w^2), in (0, 1]; 1.0 when there is nothing to weigh."""
    if n <= 0 or w_sq_sum <= 0:
        return 1.0
    return float(min(1.0, (w_sum * w_sum) / (n * w_sq_sum)))
