"""The policy-gradient loss as small pure tensor functions (DESIGN.md §9), in the manner of verl's core_algos.

Shapes: B rows (trajectories) by T response positions. `mask` is 1 on tokens the policy sampled and 0 on
environment / template / padding tokens; nothing outside the mask contributes to a loss or a metric.

Pieces, composed by `policy_loss`:
  token_logprobs          log pi(token) from logits, gathered without materialising a full log_softmax copy
  entropy_from_logits     per-position entropy of the categorical distribution
  ppo_clip_loss           -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), r = exp(logp - old_logp)
  gspo_loss               the same clip on one length-normalised ratio per sequence (GSPO, Zheng et al. 2025)
  cispo_loss              -sg(clip(r)) A log pi: a clipped, detached IS weight (CISPO, MiniMax-M1 2025)
  truncated_is_weights    min(exp(proximal_logp - behaviour_logp), cap): rollout/trainer mismatch correction
                          (token level; the sequence and geometric levels and masking: arlctl/rl/correction.py)
  kl_k3                   k3 estimator of KL(pi || pi_ref) = exp(ref - logp) - (ref - logp) - 1
  aggregate_loss          token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm,
                          every denominator clamped
  sft_loss                negative log-likelihood of the mask-1 tokens (`train --loss sft`: a cold start on
                          rows a filter kept), aggregated by the same modes; advantages take no part

Gradient accumulation is exact: `aggregate_loss` takes the denominators of the whole optimizer batch
(`num_tokens`, `num_seqs`) so that summing the micro-batch losses gives the full-batch loss.

Non-finite numbers never reach the weights (DESIGN.md §9). `policy_loss` zeroes every mask-0 position of
its inputs before any arithmetic, because 0 * NaN is NaN and the backward pass of exp, mul and min
multiplies by the forward values: a NaN or -inf recorded off the mask would otherwise poison the whole
gradient. Every log-ratio is clamped to +-LOG_RATIO_CLAMP before exp, so a -inf behaviour log-prob gives a
large finite ratio rather than inf. A non-finite value *on* the mask is not repaired here: `train` drops such
rows under a counted rule and skips a step whose gradient is still non-finite.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from arlctl.rl.config import TrainConfig
from arlctl.settings import field_default

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
POLICY_LOSSES = ("ppo-clip", "gspo", "cispo")  # the objectives of policy_loss
LOSS_KINDS = (*POLICY_LOSSES, "sft")  # `train --loss`: policy_loss | sft_loss
# The aggregation modes each objective is defined under. GSPO's objective is a mean over sequences of one
# term per sequence: only seq-mean-token-mean turns its per-token form back into that.
LOSS_AGG_FOR = {"gspo": ("seq-mean-token-mean",)}
# exp(20) ~ 4.9e8: far outside any PPO clip band, far inside float32 (as verl clamps its log-ratios).
LOG_RATIO_CLAMP = 20.0
# The loss's defaults are `arlctl train`'s (TrainConfig owns them).
_TRAIN_DEFAULTS = {f.name: field_default(f) for f in fields(TrainConfig)}
EPS_LOW, EPS_HIGH = _TRAIN_DEFAULTS["eps_low"], _TRAIN_DEFAULTS["eps_high"]


def clamped_exp(log_ratio: torch.Tensor) -> torch.Tensor:
    """exp of a log-ratio clamped to +-LOG_RATIO_CLAMP: finite for every finite or infinite input (NaN stays)."""
    return torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def zero_off_mask(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """values where mask is 1, exactly 0 elsewhere (even where values hold NaN or inf). Broadcasts [B] -> [B, T].

    `torch.where`, not a product: 0 * NaN is NaN, and where's backward sends no gradient to the off branch.
    """
    if values.dim() == 1 and mask.dim() == 2:
        values = values.unsqueeze(-1)  # [B, 1]
    return torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))


def token_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Log-probability of each label under the logits. logits [B, T, V], labels [B, T] -> [B, T] float32."""
    logits = logits.float()
    picked = torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1)  # [B, T]
    return picked - torch.logsumexp(logits, dim=-1)  # [B, T]


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy H = logsumexp(z) - sum softmax(z) z per position. logits [B, T, V] -> [B, T] float32."""
    logits = logits.float()
    probs = torch.softmax(logits, dim=-1)  # [B, T, V]
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)  # [B, T]


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of values over mask-1 positions; 0 when the mask is empty. Off-mask NaN/inf take no part."""
    return zero_off_mask(values, mask).sum() / mask.to(values.dtype).sum().clamp(min=1)


def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: float = EPS_LOW,
    eps_high: float = EPS_HIGH,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO-clip loss and ratio. logp, old_logp [B, T]; advantages [B] or [B, T].

    loss = -min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A) with r = exp(logp - old_logp), the log-ratio
    clamped to +-LOG_RATIO_CLAMP first (no gradient flows through a clamped log-ratio).
    Asymmetric bounds (eps_high > eps_low, "clip-higher" from DAPO) let rare good tokens grow faster.
    Returns (loss [B, T], ratio [B, T]).
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)  # [B, 1], broadcast over tokens
    ratio = clamped_exp(logp - old_logp)  # [B, T]
    unclipped = ratio * advantages  # [B, T]
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * advantages  # [B, T]
    return -torch.min(unclipped, clipped), ratio


def gspo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = EPS_LOW,
    eps_high: float = EPS_HIGH,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token GSPO loss and the sequence ratios. logp, old_logp, mask [B, T]; advantages [B] or [B, T].

    GSPO (Zheng et al. 2025) clips one ratio per sequence, the geometric mean of its token ratios:
      s_i = exp(sum_t m_it (logp_it - old_it) / |y_i|)
    Written per token ("GSPO-token"): s_it = sg[s_i] * exp(logp_it - sg[logp_it]), whose value is s_i and whose
    gradient is s_i * grad logp_it; loss_it = -min(s_it A_it, clip(s_it, 1 - eps_low, 1 + eps_high) A_it).
    Every token of a row shares the clip decision. Averaged per sequence (seq-mean-token-mean) and with one
    advantage per row, this is the paper's objective -1/G sum_i min(s_i A_i, clip(s_i) A_i), value and
    gradient. Returns (loss [B, T], sequence ratio [B]).
    """
    logp = zero_off_mask(logp, mask)  # [B, T]: nothing off the mask reaches the forward or the backward
    advantages = zero_off_mask(advantages, mask)  # [B, T]
    mask_f = mask.to(logp.dtype)  # [B, T]
    log_ratio = zero_off_mask(logp - old_logp, mask)  # [B, T]
    seq_log_ratio = log_ratio.sum(dim=-1) / mask_f.sum(dim=-1).clamp(min=1)  # [B]
    seq_log_ratio = seq_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # [B]
    token_ratio = torch.exp(seq_log_ratio.detach().unsqueeze(-1) + logp - logp.detach())  # [B, T]
    unclipped = token_ratio * advantages  # [B, T]
    clipped = torch.clamp(token_ratio, 1.0 - eps_low, 1.0 + eps_high) * advantages  # [B, T]
    return zero_off_mask(-torch.min(unclipped, clipped), mask), torch.exp(seq_log_ratio.detach())


def cispo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: float = EPS_LOW,
    eps_high: float = EPS_HIGH,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token CISPO loss and ratio. logp, old_logp [B, T]; advantages [B] or [B, T].

    CISPO (MiniMax-M1, 2025) clips the importance weight instead of the update and detaches it:
      loss_t = -sg[clip(r_t, 1 - eps_low, 1 + eps_high)] * A_t * logp_t,   r_t = exp(logp_t - old_t)
    so a token whose ratio left the band still gets gradient (weighted at the bound), where PPO-clip would
    drop it. MiniMax-M1 bounds only the top: pass a large eps_low for that. Returns (loss [B, T], ratio [B, T]).
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)  # [B, 1]
    ratio = clamped_exp(logp - old_logp)  # [B, T]
    weight = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high).detach()  # [B, T]
    return -weight * advantages * logp, ratio


def truncated_is_weights(proximal_logp: torch.Tensor, behaviour_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance weights min(pi_trainer / pi_rollout, cap), detached. [B, T] -> [B, T].

    Corrects for numeric mismatch between the inference engine that sampled (behaviour) and the
    trainer's own forward pass of the same weights (proximal); the cap bounds the variance.
    """
    return clamped_exp(proximal_logp.detach() - behaviour_logp).clamp(max=cap)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(pi || pi_ref) per token: exp(d) - d - 1 with d = ref_logp - logp. Always >= 0.

    d is clamped to +-LOG_RATIO_CLAMP like every log-ratio, so the estimate stays finite.
    """
    delta = (ref_logp - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # [B, T]
    return torch.exp(delta) - delta - 1.0


def aggregate_loss(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | torch.Tensor | None = None,
    norm_tokens: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce a [B, T] per-token loss to a scalar over mask-1 tokens.

    token-mean:               sum(l * m) / N_tokens              every token counts the same
    seq-mean-token-sum:       sum_b(sum_t l * m) / N_seqs        long sequences weigh more
    seq-mean-token-mean:      sum_b(sum_t l * m / T_b) / N_seqs   every sequence counts the same (GRPO paper)
    seq-mean-token-sum-norm:  sum(l * m) / (N_seqs * L)          Dr. GRPO (Liu et al. 2025): one constant
                                                                  length L (norm_tokens; default: this tensor's
                                                                  T) for every sequence, so no length bias

    N_tokens / N_seqs default to this tensor's own counts; pass the whole optimizer batch's counts when
    accumulating micro-batches. Every denominator is clamped to >= 1. An unknown mode raises ValueError.
    Mask-0 positions are selected away (not multiplied by 0), so a NaN there cannot reach the sum.
    """
    masked = zero_off_mask(per_token, mask)  # [B, T]
    mask = mask.to(per_token.dtype)
    if mode == "token-mean":
        denom = mask.sum() if num_tokens is None else torch.as_tensor(num_tokens, dtype=per_token.dtype)
        return masked.sum() / denom.clamp(min=1)
    seqs = torch.as_tensor(per_token.shape[0] if num_seqs is None else num_seqs, dtype=per_token.dtype)
    if mode == "seq-mean-token-sum":
        return masked.sum() / seqs.clamp(min=1)
    if mode == "seq-mean-token-mean":
        per_seq = masked.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)  # [B]
        return per_seq.sum() / seqs.clamp(min=1)
    if mode == "seq-mean-token-sum-norm":
        length = torch.as_tensor(per_token.shape[-1] if norm_tokens is None else norm_tokens, dtype=per_token.dtype)
        return masked.sum() / (seqs.clamp(min=1) * length.clamp(min=1))
    raise ValueError(f"unknown loss aggregation {mode!r}; expected one of {', '.join(LOSS_AGG_MODES)}")


@dataclass
class LossConfig:
    eps_low: float = EPS_LOW
    eps_high: float = EPS_HIGH
    tis_cap: float | None = None  # None: no rollout correction; the ratio is taken against the behaviour log-probs
    kl_coef: float = _TRAIN_DEFAULTS["kl_coef"]
    loss_agg: str = _TRAIN_DEFAULTS["loss_agg"]
    kind: str = _TRAIN_DEFAULTS["loss"]  # one of LOSS_KINDS: which objective train_step takes (policy_loss or sft_loss)
    is_level: str = _TRAIN_DEFAULTS["is_level"]  # rollout correction (arlctl/rl/correction.py): token | sequence | geometric
    is_mode: str = _TRAIN_DEFAULTS["is_mode"]  # truncate | mask
    is_low: float | None = None  # the mask mode's lower threshold (default 1 / tis_cap)
    teacher_kl_coef: float = _TRAIN_DEFAULTS["teacher_kl_coef"]  # k3 KL to a teacher's log-probs as a loss term (on-policy distillation)


def policy_loss(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    weights: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | torch.Tensor | None = None,
    norm_tokens: float | torch.Tensor | None = None,
    teacher_logp: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The full policy-gradient objective for one (micro-)batch. Returns (scalar loss, metric sums).

    logp [B, T] current policy (with grad); behaviour_logp [B, T] recorded at rollout; advantages [B] per
    row, or [B, T] per token (turn-level credit, GAE, distillation: each token carries its own advantage);
    mask [B, T]; weights [B] per-row (staleness x balance); ref_logp [B, T] frozen reference or None;
    teacher_logp [B, T] a teacher's log-probs of the same tokens (with cfg.teacher_kl_coef) or None.

    cfg.kind names the objective: ppo-clip (`ppo_clip_loss`), gspo (`gspo_loss`) or cispo (`cispo_loss`).
    Without `tis_cap` its ratio is pi_theta / pi_behaviour. With it, the objective is decoupled (verl's
    TIS/MIS, TRL's vLLM importance-sampling correction): the ratio is taken against the trainer's own
    detached log-probs (pi_old; equal to pi_theta at the one optimizer step per batch) and each token is
    weighted by the rollout-correction weight of pi_old / pi_behaviour at cfg.is_level, truncated at
    tis_cap or masked outside [is_low, tis_cap] (arlctl/rl/correction.py).

    Metrics are returned as *sums over mask-1 tokens* (plus `tokens`) so micro-batches can be added up
    and divided once; see `finalize_metrics`.

    Every input is zeroed at mask-0 positions before any arithmetic (see the module docstring): the loss
    and its gradient do not depend on what lies off the mask, NaN and inf included.
    """
    from arlctl.rl.correction import ess_sums, rollout_is_weights  # correction builds on this module

    if cfg.kind not in POLICY_LOSSES:
        raise ValueError(f"unknown policy loss {cfg.kind!r}; expected one of {', '.join(POLICY_LOSSES)}")
    mask_f = mask.to(logp.dtype)  # [B, T]
    # 0. Zero the off-mask positions first: nothing recorded there may take part in the arithmetic.
    logp = zero_off_mask(logp, mask)  # [B, T]
    behaviour_logp = zero_off_mask(behaviour_logp, mask)  # [B, T]
    advantages = zero_off_mask(advantages, mask)  # [B, T]
    if weights is not None:
        weights = zero_off_mask(weights.to(logp.dtype), mask)  # [B, T]
    if ref_logp is not None:
        ref_logp = zero_off_mask(ref_logp, mask)  # [B, T]
    # 1. The objective, on the ratio to the behaviour policy (or to pi_old under rollout correction).
    corrected = cfg.tis_cap is not None
    old_logp = logp.detach() if corrected else behaviour_logp  # [B, T]
    if cfg.kind == "gspo":
        per_token, seq_ratio = gspo_loss(logp, old_logp, advantages, mask, cfg.eps_low, cfg.eps_high)  # [B, T], [B]
        ratio = seq_ratio.unsqueeze(-1).expand_as(logp)  # [B, T]: the clip decision is the sequence's
    elif cfg.kind == "cispo":
        per_token, ratio = cispo_loss(logp, old_logp, advantages, cfg.eps_low, cfg.eps_high)  # [B, T] x2
    else:
        per_token, ratio = ppo_clip_loss(logp, old_logp, advantages, cfg.eps_low, cfg.eps_high)  # [B, T] x2
    # 2. Rollout correction, then the KL terms and the row weights.
    is_weights = masked = None
    if corrected:
        is_weights, masked = rollout_is_weights(logp, behaviour_logp, mask, cfg.is_level, cfg.is_mode,
                                                cfg.tis_cap, cfg.is_low)  # [B, T] x2
        per_token = per_token * is_weights  # [B, T]
    kl = torch.zeros_like(logp) if ref_logp is None else kl_k3(logp, ref_logp)  # [B, T]
    if cfg.kl_coef:
        per_token = per_token + cfg.kl_coef * kl  # [B, T]
    teacher_kl = None
    if teacher_logp is not None and cfg.teacher_kl_coef:
        teacher_kl = kl_k3(logp, zero_off_mask(teacher_logp, mask))  # [B, T] k3 of KL(pi || pi_teacher)
        per_token = per_token + cfg.teacher_kl_coef * teacher_kl  # [B, T]
    if weights is not None:
        per_token = per_token * weights.to(per_token.dtype)  # [B, T]
    loss = aggregate_loss(per_token, mask, cfg.loss_agg, num_tokens=num_tokens, num_seqs=num_seqs,
                          norm_tokens=norm_tokens)
    sums = _metric_sums(logp, behaviour_logp, ratio, advantages, mask_f, kl, cfg)
    if is_weights is not None:
        sums.update(ess_sums(is_weights, mask_f), is_masked=(masked.to(mask_f.dtype) * mask_f).sum())
    if teacher_kl is not None:
        sums["teacher_kl"] = (teacher_kl.detach() * mask_f).sum()
    return loss, sums


def sft_loss(
    logp: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    weights: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | torch.Tensor | None = None,
    behaviour_logp: torch.Tensor | None = None,
    norm_tokens: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Supervised fine-tuning: the negative log-likelihood of the mask-1 tokens. Returns (loss, metric sums).

    per-token loss = -logp (+ kl_coef * k3 KL to the reference), times the row weight, reduced by
    `aggregate_loss` with the whole batch's denominators, exactly like `policy_loss`; so token-mean is the
    mean NLL per trained token and gradient accumulation over micro-batches and ranks stays exact.
    Advantages and rewards take no part: which rows to imitate was decided upstream (`filter --where
    'reward = 1'`). behaviour_logp, when given, only feeds the ratio metrics (how far the trained policy is
    from the one that wrote the rows); without it the ratio is reported as 1.
    """
    mask_f = mask.to(logp.dtype)  # [B, T]
    logp = zero_off_mask(logp, mask)  # [B, T]
    behaviour_logp = logp.detach() if behaviour_logp is None else zero_off_mask(behaviour_logp, mask)  # [B, T]
    per_token = -logp  # [B, T]
    kl = torch.zeros_like(logp) if ref_logp is None else kl_k3(logp, zero_off_mask(ref_logp, mask))  # [B, T]
    if cfg.kl_coef:
        per_token = per_token + cfg.kl_coef * kl  # [B, T]
    if weights is not None:
        per_token = per_token * zero_off_mask(weights.to(logp.dtype), mask)  # [B, T]
    loss = aggregate_loss(per_token, mask, cfg.loss_agg, num_tokens=num_tokens, num_seqs=num_seqs,
                          norm_tokens=norm_tokens)
    ratio = clamped_exp((logp - behaviour_logp).detach())  # [B, T]
    no_advantage = torch.zeros(logp.shape[0], dtype=logp.dtype, device=logp.device)  # [B]: nothing is clipped
    return loss, _metric_sums(logp, behaviour_logp, ratio, no_advantage, mask_f, kl, cfg)


def _metric_sums(logp, behaviour_logp, ratio, advantages, mask_f, kl, cfg: LossConfig) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages  # [B, 1] or [B, T]
        # A token is "clipped" when the clipped branch is the active (gradient-free) one; under CISPO when its
        # IS weight was cut to a bound (it still gets gradient, at the bound's weight).
        below, above = ratio < 1.0 - cfg.eps_low, ratio > 1.0 + cfg.eps_high  # [B, T]
        if cfg.kind != "cispo":
            below, above = below & (adv < 0), above & (adv > 0)
        clip_low, clip_high = below.to(mask_f.dtype), above.to(mask_f.dtype)  # [B, T]
        log_ratio = (logp - behaviour_logp).detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # [B, T]
        behaviour_ratio = torch.exp(log_ratio)  # [B, T]
        approx_kl = behaviour_ratio - 1.0 - log_ratio  # [B, T] k3 of KL(pi_behaviour || pi_theta)
        on = mask_f > 0
        return {
            "tokens": mask_f.sum(),
            "nll": (-logp.detach() * mask_f).sum(),
            "clip_frac_low": (clip_low * mask_f).sum(),
            "clip_frac_high": (clip_high * mask_f).sum(),
            "approx_kl": (approx_kl * mask_f).sum(),
            "ref_kl": (kl.detach() * mask_f).sum(),
            "ratio_mean": (behaviour_ratio * mask_f).sum(),
            "ratio_max": behaviour_ratio[on].max() if on.any() else torch.tensor(1.0),
            "ratio_min": behaviour_ratio[on].min() if on.any() else torch.tensor(1.0),
        }


# Metric sums that micro-batches and ranks add up (the ratio extremes are a max and a min). The optional ones
# are there only when their term is: rollout correction (is_*), a teacher (teacher_kl), a critic (value_*).
METRIC_SUMS = ("tokens", "nll", "clip_frac_low", "clip_frac_high", "approx_kl", "ref_kl", "ratio_mean")
OPTIONAL_SUMS = ("is_w_sum", "is_w_sq_sum", "is_n", "is_masked", "teacher_kl", "value_loss", "value_sq_err",
                 "value_clip_frac", "value_mean", "return_mean", "return_sq")


def finalize_metrics(sums: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    """Combine per-micro-batch metric sums into per-token means (max/min for the ratio extremes).

    With rollout correction: is_ess (ESS / n of the correction weights) and is_masked_frac; with a teacher:
    teacher_kl; with a critic: value_loss, value_clip_frac, value_mean, return_mean and explained_var."""
    from arlctl.rl.correction import ess_fraction

    tokens = max(sum(float(s["tokens"]) for s in sums), 1.0)
    out: dict[str, float] = {"tokens": tokens}
    for key in METRIC_SUMS[1:]:
        out[key] = sum(float(s[key]) for s in sums) / tokens
    extra = {key: sum(float(s[key]) for s in sums) for key in OPTIONAL_SUMS if any(key in s for s in sums)}
    if "is_n" in extra:
        out["is_ess"] = ess_fraction(extra["is_w_sum"], extra["is_w_sq_sum"], extra["is_n"])
        out["is_masked_frac"] = extra["is_masked"] / max(extra["is_n"], 1.0)
    if "teacher_kl" in extra:
        out["teacher_kl"] = extra["teacher_kl"] / tokens
    if "value_loss" in extra:
        for key in ("value_loss", "value_clip_frac", "value_mean", "return_mean"):
            out[key] = extra[key] / tokens
        # 1 - Var(R - V) / Var(R), population variances, as arlctl/rl/value.py `explained_variance`
        return_var = extra["return_sq"] / tokens - out["return_mean"] ** 2
        error_var = extra["value_sq_err"] / tokens - (out["return_mean"] - out["value_mean"]) ** 2
        out["explained_var"] = 1.0 - error_var / return_var if return_var > 1e-12 else 0.0
    out["ratio_max"] = max((float(s["ratio_max"]) for s in sums), default=1.0)
    out["ratio_min"] = min((float(s["ratio_min"]) for s in sums), default=1.0)
    return out
