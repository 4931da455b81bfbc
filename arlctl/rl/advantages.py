"""Group-relative advantages for GRPO-style training (DESIGN.md §9), per trajectory or per turn.

Pure functions over tensors and lists. `filter` calls them once per batch and writes the result into the
`advantage` column (and, in the turn modes, into turns[].advantage); `train` only reads them.

Outcome modes, one value per trajectory from its reward r:
  group       (r - mean_g) / (std_g + eps)           GRPO (DeepSeekMath); std with Bessel's correction
  group-mean  r - mean_g                              no std scaling (removes difficulty bias)
  dr-grpo     r - mean_g                              Dr. GRPO (Liu et al. 2025): the same advantage; its other
                                                      half is the loss's constant length normaliser
                                                      (`train --loss-agg seq-mean-token-sum-norm`)
  rloo        r - mean_{g, j != i} r_j                RLOO (Ahmadian et al. 2024): the baseline of each sample is
                                                      the mean of the others, = G / (G - 1) (r - mean_g)
  batch       (r - mean_B) / (std_B + eps)            batch-normalised: the baseline is the whole batch, so a
                                                      kept all-fail group acts as negatives
  reinforce++ (r - mean_B) / (std_B + eps)            REINFORCE++ (Hu 2025) without its KL reward: every token's
                                                      return is the outcome, normalised over the batch. With
                                                      `train --kl-in-reward B` train recomputes it per token
                                                      with the KL penalty in the reward
                                                      (`reinforce_pp_token_advantages`)

Train-side estimators, which need what only the trainer has (a critic's values, a teacher's log-probs):
  gae         filter writes the group advantage as a placeholder; train replaces it by GAE over the critic's
              values (arlctl/rl/value.py), see stages/train.py
  distill     filter writes the group advantage of the task reward; train adds the teacher's per-token
              reverse-KL advantage (arlctl/rl/distill.py)

`overlong_penalty` is DAPO's soft length penalty (Yu et al. 2025), added to the reward by `reward
--overlong-penalty L_max,L_cache` as the component `overlong`.

Turn modes (process rewards, turn-level credit), one value per turn t of trajectory i from its step rewards
r_{i,t} and its outcome o_i (the `reward` column):
  returns     R_{i,t} = r_{i,t} + gamma * R_{i,t+1},  R_{i,last} = r_{i,last} + o_i    (`discounted_returns`)
  turn        (R_{i,t} - mean_{g,t}) / (std_{g,t} + eps)   the statistics over the group's trajectories that
  turn-mean   R_{i,t} - mean_{g,t}                         have a turn t: a baseline per (group, turn index)
That is the group / group-mean rule applied to returns with groups keyed by (group, turn index), so the
same edge cases hold. With no step rewards and one turn, `turn` gives exactly what `group` gives.

NaN-safe: a NaN reward takes no part in any statistic and gets advantage 0. In the group modes a group
with a single (finite) sample has no baseline and gets 0, and a zero-variance group gets exactly 0; in the
turn modes the same holds per (group, turn index): a turn index only one trajectory of its group reached
gets 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

OUTCOME_MODES = ("group", "group-mean", "dr-grpo", "rloo", "batch", "reinforce++")
TURN_MODES = {"turn": "group", "turn-mean": "group-mean"}  # turn mode -> the rule of its per-turn baseline
# Estimators train completes (values, teacher log-probs) -> the outcome rule filter writes for them.
TRAIN_SIDE_MODES = {"gae": "group", "distill": "group"}
ADVANTAGE_MODES = (*OUTCOME_MODES, *TURN_MODES, *TRAIN_SIDE_MODES)


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
    if mode not in OUTCOME_MODES:
        raise ValueError(f"unknown advantage mode {mode!r}; expected one of {', '.join(OUTCOME_MODES)}")
    rewards = rewards.to(torch.float64)  # statistics in float64: groups of equal rewards stay exactly 0
    if rewards.numel() == 0:
        return torch.zeros(0, dtype=torch.float32)
    valid = torch.isfinite(rewards)  # [N]
    mean, std, count, uniform = _group_stats(rewards, group_index, valid)  # [N] each
    has_baseline = valid & (count > 1) & ~uniform  # [N]
    centred = torch.where(has_baseline, rewards - mean, torch.zeros_like(rewards))  # [N]
    if mode in ("group-mean", "dr-grpo"):
        adv = centred
    elif mode == "rloo":  # r - (sum_g - r) / (G - 1) = G / (G - 1) * (r - mean_g)
        adv = centred * count / (count - 1).clamp(min=1)
    elif mode == "group":
        adv = centred / (std + eps)
    else:  # batch, reinforce++: one mean and std over every valid reward of the batch
        finite = rewards[valid]
        if finite.numel() < 2 or bool((finite == finite[0]).all()):
            return torch.zeros_like(rewards, dtype=torch.float32)
        adv = torch.where(valid, (rewards - finite.mean()) / (finite.std() + eps), torch.zeros_like(rewards))
    return adv.to(torch.float32)


def reinforce_pp_returns(outcome: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, beta: float) -> torch.Tensor:
    """REINFORCE++'s returns per token, before normalisation: token rewards r_t = -beta * kl_t plus the outcome
    at the row's last trained token, G_t = sum_{s >= t} r_s over the row's trained tokens. [B], [B, T] -> [B, T]
    float64, 0 off the mask. A NaN outcome counts as 0 (such a row was dropped upstream)."""
    on = mask.bool()
    kl = torch.where(on, kl.to(torch.float64), torch.zeros((), dtype=torch.float64))  # NaN/inf off the mask: gone
    rewards = -beta * kl  # [B, T]
    last = _last_true(on)  # [B], -1 for an empty row
    rows = torch.nonzero(last >= 0).squeeze(-1)
    finite = torch.nan_to_num(outcome.to(torch.float64), nan=0.0)  # [B]
    rewards[rows, last[rows]] += finite[rows]
    returns = torch.flip(torch.cumsum(torch.flip(rewards, [-1]), -1), [-1])  # [B, T] sum over s >= t
    return torch.where(on, returns, torch.zeros_like(returns))


def normalise_tokens(values: torch.Tensor, mask: torch.Tensor, total: float, total_sq: float, count: float,
                     eps: float = 1e-6) -> torch.Tensor:
    """(v - mean) / (std + eps) at mask-1 positions, 0 elsewhere, from the batch's sums (so ranks can add theirs
    first): mean = total / count, Bessel's std. Fewer than two values, or all equal, give 0. [B, T] -> float32."""
    on = mask.bool()
    if count < 2:
        return torch.zeros(values.shape, dtype=torch.float32, device=values.device)
    mean = total / count
    var = max((total_sq - count * mean * mean) / (count - 1), 0.0)
    if var <= 1e-20:
        return torch.zeros(values.shape, dtype=torch.float32, device=values.device)
    out = (values.to(torch.float64) - mean) / (math.sqrt(var) + eps)
    return torch.where(on, out, torch.zeros_like(out)).to(torch.float32)


def reinforce_pp_token_advantages(outcome: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, beta: float,
                                  eps: float = 1e-6) -> torch.Tensor:
    """REINFORCE++ (Hu 2025) per token: `reinforce_pp_returns` normalised over every trained token of the batch,
    (G - mean) / (std + eps) with Bessel's std. outcome [B]; kl, mask [B, T] -> [B, T] float32, 0 off the mask."""
    returns = reinforce_pp_returns(outcome, kl, mask, beta)  # [B, T]
    on = mask.bool()
    values = returns[on]
    return normalise_tokens(returns, mask, float(values.sum()), float((values * values).sum()), float(on.sum()), eps)


def _last_true(on: torch.Tensor) -> torch.Tensor:
    """Index of the last True of each row [B, T] -> [B]; -1 where a row has none."""
    positions = torch.arange(on.shape[-1], device=on.device).expand_as(on)  # [B, T]
    return torch.where(on, positions, torch.full_like(positions, -1)).max(dim=-1).values


def overlong_penalty(lengths: Sequence[int], l_max: int, l_cache: int) -> list[float]:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13) for response lengths |y|:
    0 up to l_max - l_cache, then falling linearly to -1 at l_max, and -1 beyond."""
    if not 0 < l_cache <= l_max:
        raise ValueError(f"the overlong penalty needs 0 < L_cache <= L_max, not L_max={l_max}, L_cache={l_cache}")
    safe = l_max - l_cache
    return [0.0 if n <= safe else ((safe - n) / l_cache if n <= l_max else -1.0) for n in lengths]


# ----------------------------------------------------------------------------------------------- per turn


def discounted_returns(step_rewards: Sequence[float], outcome: float, gamma: float) -> list[float]:
    """Return-to-go of each turn: R_t = r_t + gamma * R_{t+1}, and R_last = r_last + outcome.

    step_rewards: r_0..r_{n-1}, one per assistant turn; outcome: the trajectory's reward, received at its
    last turn (undiscounted there). A trajectory without turns has no returns ([]).
    """
    returns: list[float] = []
    later: float | None = None  # R_{t+1}; None before the last turn is reached
    for reward in reversed(step_rewards):
        later = float(reward) + (float(outcome) if later is None else gamma * later)
        returns.append(later)
    return returns[::-1]


def turn_advantages(returns: Sequence[Sequence[float]], group_index: torch.Tensor, mode: str = "turn",
                    eps: float = 1e-6) -> list[list[float]]:
    """Per-turn advantages of N trajectories from their returns (`discounted_returns`).

    returns: per trajectory, R_t of each of its turns; group_index: [N] long, dense group ids.
    Each R_{i,t} is compared with the R_{j,t} of its group's trajectories that have a turn t: the
    `group` (turn) or `group-mean` (turn-mean) rule of compute_advantages over those. Returns a list per
    trajectory, as long as its returns.
    """
    if mode not in TURN_MODES:
        raise ValueError(f"unknown turn advantage mode {mode!r}; expected one of {', '.join(TURN_MODES)}")
    keys: dict[tuple[int, int], int] = {}
    flat: list[float] = []
    key_index: list[int] = []
    for i, trajectory in enumerate(returns):
        for t, value in enumerate(trajectory):
            key_index.append(keys.setdefault((int(group_index[i]), t), len(keys)))
            flat.append(float(value))
    adv = compute_advantages(torch.tensor(flat, dtype=torch.float64), torch.tensor(key_index, dtype=torch.long),
                             TURN_MODES[mode], eps).tolist()  # [sum of turns]
    out, start = [], 0
    for trajectory in returns:
        out.append(adv[start : start + len(trajectory)])
        start += len(trajectory)
    return out


def step_rewards(recorded: Sequence[float | None], indices: Sequence[int], judged: Any) -> list[float | None]:
    """The step reward of each turn: the env's `turns[].reward_step`, else the judge's
    `reward_info["step_rewards"][turn index]`, else 0 when there is no judge's list at all.

    recorded: reward_step of each turn; indices: each turn's index in its trajectory (a per-turn row holds
    one turn, with its own index); judged: the step_rewards value of reward_info, or None.
    None for a turn the judge could not grade (its entry is None, or its list is empty: no step was
    graded): a missing measurement, which must not enter a baseline as 0 (the caller drops the row).
    Raises ValueError naming what is wrong: a non-finite reward_step, or a step_rewards that is not a list
    of finite numbers (or None) or has no entry for a turn that needs one.
    """
    scores = _judged_scores(judged)
    out: list[float | None] = []
    for index, value in zip(indices, recorded, strict=True):
        if value is not None:
            if not math.isfinite(value):
                raise ValueError(f"turn {index} has reward_step {value}, not a finite number")
            out.append(float(value))
        elif scores is None:
            out.append(0.0)
        elif not scores:
            out.append(None)
        elif index < len(scores):
            out.append(scores[index])
        else:
            raise ValueError(f"reward_info step_rewards has {len(scores)} entries; turn {index} has none")
    return out


def _judged_scores(judged: Any) -> list[float | None] | None:
    if judged is None:
        return None
    if not isinstance(judged, list) or not all(x is None or (
            isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)) for x in judged):
        raise ValueError(f"reward_info step_rewards is not a list of finite numbers: {str(judged)[:80]}")
    return [None if x is None else float(x) for x in judged]
