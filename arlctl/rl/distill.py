"""On-policy distillation: a teacher's log-probs of the tokens the student sampled (DESIGN.md §9).

The student samples (rollout), the teacher scores the same tokens, and each token is pushed toward what the
teacher would have said: the per-token advantage is the negative reverse-KL estimate
  A_t = coef * (log pi_teacher(y_t) - log pi_student(y_t))
(Agarwal et al. 2024, GKD; Thinking Machines, "On-policy distillation", 2025), which is dense, needs no
reward, and mixes with a task advantage by addition. train subtracts a baseline, the batch's mean of
teacher - student (`--distill-baseline batch`, the default): unbiased (the expected score-function gradient of a
constant is 0) and, where a student starts far from its teacher, the difference between learning and not (on
the toy of docs/learning/algorithms.md every sampled token's gap is about -10 nats; without the baseline each
step only pushes sampled tokens down). `train --adv` of a batch filtered with `--adv distill`
adds it to the row's task advantage (scaled by `--distill-task-coef`); `--teacher-kl-coef` instead adds
the k3 KL to the teacher as a loss term (arlctl/rl/losses.py `policy_loss`).

The teacher is a model directory scored in the trainer's process (sharded like the KL reference under FSDP2)
or an engine URL (an OpenAI-compatible server that returns prompt log-probs: `teacher_logprobs_http`).
"""

from __future__ import annotations

import torch

from arlctl.rl.losses import LOG_RATIO_CLAMP, zero_off_mask


def distill_advantages(teacher_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor,
                       coef: float = 1.0) -> torch.Tensor:
    """coef * (teacher - student) log-prob per trained token [B, T], clamped to +-LOG_RATIO_CLAMP; 0 off the mask."""
    gap = zero_off_mask(teacher_logp, mask) - zero_off_mask(behaviour_logp, mask)  # [B, T]
    return zero_off_mask(coef * gap.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP), mask)
