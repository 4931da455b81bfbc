"""Group-relative advantages for GRPO-style training (DESIGN.md §9).

Pure functions over tensors, one value per trajectory. `filter` calls them once per batch and writes the
result into the `advantage` column; `train` only reads it.

Modes:
  group       (r - mean_g) / (std_g + eps)           GRPO (DeepSeekMath); std with Bessel's correction
  group-mean  r - mean_g                              Dr. GRPO: no std scaling (removes difficulty bias)
  batch       (r - mean_B) / (std_B + eps)            batch-normalised (REINFORCE++-style): the baseline is the
                                                      whole batch, so a kept all-fail group acts as negatives

NaN-safe: a NaN reward takes no part in any statistic and gets advantage 0. In the group modes a group
with a single (finite) sample has no baseline and gets 0, and a zero-variance group gets exactly 0.
"""

from __future__ import annotations

import torch

ADVANTAGE_MODES = ("group", "group-mean", "batch")


def group_ids_to_index(group_ids: list[str]) -> torch.Tensor:
    """Map arbitrary group id strings to dense indices 0..G-1 in order of first appearance. [N]"""
    seen: dict[str, int] = {}
    return torch.tensor([seen.setdefault(g, len(seen)) for g in group_ids], dtype=torch.long)


def _group_stats(rewards: torch.Tensor, index: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per-row group mean, unbiased std, count and all-equal flag over valid (finite) rewards only."""
    num_groups = int(index.max().item()) + 1 if index.numel() else 0
    r = torch.where(valid, rewards, torch.zeros_like(rewards))  # [N]
    w = valid.to(rewards.dtype)  # [N]
    count = torch.zeros(num_groups, dtype=rewards.dtype).index_add_(0, index, w)  # [G]
    total = torch.zeros(num_groups, dtype=rewards.dtype).index_add_(0, index, r)  # [G]
    mean = total / count.clamp(min=1)  # [G]
    sq_dev = torch.where(valid, (rewards - mean[index]) ** 2, torch.zeros_like(rewards))  # [N]
    var = torch.zeros(num_groups, dtype=rewards.dtype).index_add_(0, index, sq_dev) / (count - 1).clamp(min=1)
    # A group whose rewards are all equal must give exactly 0, not rounding noise over a tiny std.
    inf = torch.full((num_groups,), float("inf"), dtype=rewards.dtype)
    low = inf.scatter_reduce(0, index, torch.where(valid, rewards, inf[index]), "amin")  # [G]
    high = (-inf).scatter_reduce(0, index, torch.where(valid, rewards, -inf[index]), "amax")  # [G]
    uniform = low >= high  # [G]
    return mean[index], var.sqrt()[index], count[index], uniform[index]  # each [N]


def compute_advantages(
    rewards: torch.Tensor, group_index: torch.Tensor, mode: str = "group", eps: float = 1e-6
) -> torch.Tensor:
    """Advantages for one batch of trajectories.

    rewards: [N] float (NaN allowed); group_index: [N] long, dense group ids. Returns [N] float32.
    """
    if mode not in ADVANTAGE_MODES:
        raise ValueError(f"unknown advantage mode {mode!r}; expected one of {', '.join(ADVANTAGE_MODES)}")
    rewards = rewards.to(torch.float64)  # statistics in float64: groups of equal rewards stay exactly 0
    if rewards.numel() == 0:
        return torch.zeros(0, dtype=torch.float32)
    valid = torch.isfinite(rewards)  # [N]
    mean, std, count, uniform = _group_stats(rewards, group_index, valid)  # [N] each
    has_baseline = valid & (count > 1) & ~uniform  # [N]
    centred = torch.where(has_baseline, rewards - mean, torch.zeros_like(rewards))  # [N]
    if mode == "group-mean":
        adv = centred
    elif mode == "group":
        adv = centred / (std + eps)
    else:  # batch: one mean and std over every valid reward of the batch
        finite = rewards[valid]
        if finite.numel() < 2 or bool((finite == finite[0]).all()):
            return torch.zeros_like(rewards, dtype=torch.float32)
        adv = torch.where(valid, (rewards - finite.mean()) / (finite.std() + eps), torch.zeros_like(rewards))
    return adv.to(torch.float32)
