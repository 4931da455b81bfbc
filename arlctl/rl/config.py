"""The train stage's settings: `TrainConfig`, every default written once, torch-free.

It lives with the trainer (arlctl/rl/trainer_state.py reads it) so that rl never imports the stages;
stages/configs.py lists it with the other stages' settings, stages/train.py runs it, and `arlctl train`
derives its options from its fields (arlctl/cli/options.py). Checks that need torch import it late.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from arlctl.errors import UsageError
from arlctl.settings import setting

HEAD_CHUNK_MB = 256  # --head-chunk-mb's default: the LM head's logits a chunk (batching.head_logprobs, memory_plan)

LR_SCHEDULES = ("constant", "cosine")
PRECISIONS = ("auto", "fp32", "bf16")
STRATEGIES = ("auto", "fsdp2", "ddp", "single")
PUBLISH_DTYPES = ("fp32", "bf16")
PUBLISH_FORMATS = ("merged", "adapter")
GAE_LEVELS = ("token", "turn")
PACK_MODES = ("auto", "on", "off")
DISTILL_BASELINES = ("batch", "none")


@dataclass
class TrainConfig:
    lr: float = setting(1e-6, "Peak learning rate (AdamW).")
    weight_decay: float = setting(0.0, "AdamW weight decay.")
    adam_betas: tuple[float, float] = setting((0.9, 0.999), "AdamW betas.", cli=False)
    warmup_steps: int = setting(0, "Linear warmup steps from 0 to --lr.")
    lr_schedule: str = setting("constant", "constant | cosine (after warmup).")
    cosine_steps: int = setting(1000, "Cosine horizon in steps.")
    min_lr_ratio: float = setting(0.0, "Floor of the cosine decay as a fraction of --lr.", cli=False)
    grad_clip: float = setting(1.0, "Max gradient norm.")
    eps_low: float = setting(0.2, "PPO clip below: ratio >= 1 - eps_low.")
    eps_high: float = setting(0.2, "PPO clip above: ratio <= 1 + eps_high.")
    tis_cap: float | None = setting(None, "Rollout correction: the upper threshold of the importance weight "
                                          "pi_trainer / pi_rollout (truncated there, or masked above it with "
                                          "--is-mode mask). Unset: no correction.")
    is_level: str = setting("token", "Rollout correction level: token (one weight per token) | sequence (the row's "
                                     "likelihood ratio) | geometric (its per-token geometric mean). Needs --tis-cap.")
    is_mode: str = setting("truncate", "Rollout correction: truncate (w = min(w, --tis-cap)) | mask (tokens, or rows "
                                       "at the sequence levels, with w outside [--is-low, --tis-cap] leave the loss).")
    is_low: float | None = setting(None, "Lower threshold of --is-mode mask (default 1 / --tis-cap).")
    kl_coef: float = setting(0.0, "k3 KL to the initial policy.")
    kl_in_reward: float = setting(0.0, "REINFORCE++ (batches filtered with --adv reinforce++): the KL to the initial "
                                       "policy as a per-token reward penalty with this coefficient; the returns are "
                                       "recomputed and batch-normalised per token.")
    loss_agg: str = setting("token-mean", "token-mean | seq-mean-token-sum | seq-mean-token-mean | "
                                          "seq-mean-token-sum-norm (Dr. GRPO: sum / (sequences x --loss-norm-tokens)).")
    loss_norm_tokens: int | None = setting(None, "The constant length L of seq-mean-token-sum-norm (default: the "
                                                 "batch's longest trained response).")
    loss: str = setting("ppo-clip", "ppo-clip: the clipped policy gradient on advantages (GRPO/PPO) | gspo: one "
                                    "length-normalised ratio per sequence, clipped per sequence (needs --loss-agg "
                                    "seq-mean-token-mean) | cispo: the clipped IS weight, detached, times log-prob "
                                    "(clipped tokens keep a gradient) | sft: negative log-likelihood of the mask-1 "
                                    "tokens (a cold start on rows a filter kept, e.g. --where 'reward = 1'); "
                                    "advantages and behaviour log-probs unused, --loss-agg, row weights and "
                                    "--kl-coef apply.")
    value_coef: float = setting(0.0, "PPO with a critic: a value head on the policy, trained with this weight on its "
                                     "loss; batches filtered with --adv gae get GAE advantages from it. 0: no critic.")
    value_clip: float | None = setting(None, "Clip of the value loss: V stays within V_old +- this (unset: unclipped).")
    gae_gamma: float = setting(1.0, "GAE discount gamma.")
    gae_lambda: float = setting(1.0, "GAE lambda.")
    gae_level: str = setting("token", "GAE steps: token (every sampled token) | turn (one step per assistant turn, "
                                      "its value at the turn's first token, its step reward at its end).")
    gae_whiten: bool = setting(True, "Normalise GAE advantages over the batch's trained tokens (mean 0, std 1).")
    teacher: str | None = setting(None, "On-policy distillation: the teacher, a model directory (scored in this "
                                        "process) or an engine URL (OpenAI-compatible completions with prompt "
                                        "log-probs, e.g. vllm serve). Same tokenizer as the policy.")
    distill_coef: float = setting(1.0, "Batches filtered with --adv distill: advantage += this x (teacher - "
                                       "student) log-prob per token.")
    distill_task_coef: float = setting(0.0, "Batches filtered with --adv distill: the weight of the task-reward "
                                            "advantage filter wrote (0: distillation alone).")
    distill_baseline: str = setting("batch", "Batches filtered with --adv distill: batch (subtract the mean of "
                                             "teacher - student over the batch's trained tokens: a baseline, "
                                             "unbiased, far lower variance) | none.")
    teacher_kl_coef: float = setting(0.0, "k3 KL to the --teacher's log-probs as a loss term.")
    micro_tokens: int = setting(8192, "Tokens per micro-batch: the rows' real tokens when packed, rows x the longest "
                                      "row when padded.")
    pack: str = setting("auto", "auto | on | off. Packed micro-batches: rows end to end with attention confined to "
                                "each row, no padding (arlctl/rl/packing.py). auto: packed where the model proves "
                                "it packs before the first step, padded otherwise (said in the log); on: refuse a "
                                "model that does not.")
    precision: str = setting("auto", "auto | fp32 | bf16. bf16: bf16 weights and compute with fp32 master weights and "
                                     "optimizer state (FSDP2: MixedPrecisionPolicy, fp32 gradient reduction). auto: "
                                     "bf16 on a CUDA device that has it, fp32 on CPU.")
    strategy: str = setting("auto", "auto | fsdp2 | ddp | single. auto: fsdp2 under torchrun with more than one "
                                    "rank, else single.")
    offload: bool = setting(False, "FSDP2: keep parameters, gradients and optimizer state in CPU memory.")
    grad_checkpoint: bool = setting(False, "Activation checkpointing: recompute each decoder layer in backward.")
    compile: bool = setting(False, "torch.compile each decoder layer (dynamic shapes; the packed attention runs "
                                   "eager between compiled parts). The first steps pay the compile.")
    head_chunk_mb: int = setting(HEAD_CHUNK_MB, "The LM head's logits of the trained tokens in chunks of about this many MiB "
                                      "(fp32), each recomputed in the backward, so a long micro-batch never holds "
                                      "all [tokens x vocabulary] logits at once (a fused linear + log-prob). 0: one "
                                      "piece.")
    publish_every: int = setting(0, "Every N steps write weights only (an HF directory `sync` publishes, no "
                                    "optimizer state); full checkpoints only every --save-every steps and at the "
                                    "end. 0: every checkpoint is full.")
    publish_dtype: str = setting("fp32", "fp32 | bf16: dtype of the published (HF) weights.")
    publish_format: str = setting("merged", "With LoRA: merged (base + adapters, one HF directory) | adapter "
                                            "(the adapter directory beside the base, for vLLM's LoRA loading).")
    lora_rank: int = setting(0, "LoRA rank (peft); 0: train every weight. Only the adapters are trained and "
                                "checkpointed; the --kl-coef reference is the model with adapters disabled.")
    lora_alpha: float = setting(16.0, "LoRA alpha (scale alpha / rank).")
    lora_targets: str = setting("q_proj,k_proj,v_proj,o_proj", "Comma-separated module names LoRA adapts.")
    temperature: float = setting(1.0, "Sampling temperature of the rollouts.")
    save_every: int = setting(1, "Checkpoint every N steps (and at the end).")
    keep_checkpoints: int = setting(0, "Keep only the newest N checkpoints (0: keep all; 2+ while `arlctl sync "
                                       "--watch` copies them).")
    max_steps: int | None = setting(None, "At most N steps in this invocation (default: every pending batch).")
    max_lag: int | None = setting(None, "Leave out rows whose lag when trained (the trainer's step - the row's "
                                        "policy_version) exceeds this; counted in the step metrics.")
    lag_decay: float = setting(0.0, "With it, rows over --max-lag (every row without it) are kept at weight "
                                    "*= exp(-lag_decay * lag) instead of being left out.")
    stale: str = setting("drop", "Rows over --max-lag: drop (left out of their step, counted as rows_dropped_stale) "
                                 "| refuse (stop before their batch shard, unconsumed, and exit 1 naming it).")
    seed: int = setting(0, "Torch random seed of the invocation.")
    device: str = setting("auto", "auto (cuda when available) | cpu | cuda:N.")
    extra: dict[str, Any] = setting(help="Extra settings recorded with the checkpoint.", cli=False, factory=dict)

    def torch_device(self) -> Any:
        import torch

        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def for_device(self, device: Any) -> TrainConfig:
        """This config with `auto` settings made concrete for `device` (a torch.device): --precision auto is
        bf16 on a CUDA device with bf16 support, fp32 anywhere else."""
        import dataclasses

        if self.precision != "auto":
            return self
        import torch

        bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return dataclasses.replace(self, precision="bf16" if bf16 else "fp32")

    def check(self) -> None:
        from arlctl.rl.losses import LOSS_AGG_FOR, LOSS_AGG_MODES, LOSS_KINDS  # torch: import late

        if self.loss_agg not in LOSS_AGG_MODES:
            raise UsageError(f"--loss-agg must be one of {', '.join(LOSS_AGG_MODES)}, not {self.loss_agg!r}")
        if self.loss not in LOSS_KINDS:
            raise UsageError(f"--loss must be one of {', '.join(LOSS_KINDS)}, not {self.loss!r}")
        if self.loss in LOSS_AGG_FOR and self.loss_agg not in LOSS_AGG_FOR[self.loss]:
            raise UsageError(f"--loss {self.loss} is defined over sequences, not with --loss-agg {self.loss_agg}",
                             hint=f"use --loss-agg {' or '.join(LOSS_AGG_FOR[self.loss])}")
        self._check_algorithms()
        if self.lr_schedule not in LR_SCHEDULES:
            raise UsageError(f"--lr-schedule must be one of {', '.join(LR_SCHEDULES)}")
        if self.pack not in PACK_MODES:
            raise UsageError(f"--pack must be one of {', '.join(PACK_MODES)}")
        if self.precision not in PRECISIONS:
            raise UsageError(f"--precision must be one of {', '.join(PRECISIONS)}")
        for flag, value, allowed in (("--strategy", self.strategy, STRATEGIES),
                                     ("--publish-dtype", self.publish_dtype, PUBLISH_DTYPES),
                                     ("--publish-format", self.publish_format, PUBLISH_FORMATS)):
            if value not in allowed:
                raise UsageError(f"{flag} must be one of {', '.join(allowed)}, not {value!r}")
        if self.publish_every < 0 or self.lora_rank < 0 or self.head_chunk_mb < 0:
            raise UsageError("--publish-every, --lora-rank and --head-chunk-mb must be >= 0")
        if self.lora_rank and not self.lora_target_list():
            raise UsageError("--lora-targets names no module", hint="e.g. --lora-targets q_proj,v_proj")
        if self.publish_format == "adapter" and not self.lora_rank:
            raise UsageError("--publish-format adapter needs --lora-rank", hint="without LoRA the weights are "
                             "published whole")
        if self.micro_tokens < 1 or self.save_every < 1:
            raise UsageError("--micro-tokens and --save-every must be >= 1")
        if self.max_lag is not None and self.max_lag < 0:
            raise UsageError(f"--max-lag must be >= 0, not {self.max_lag}")
        if self.stale not in ("drop", "refuse"):
            raise UsageError(f"--stale must be drop or refuse, not {self.stale!r}")
        if self.stale == "refuse" and (self.max_lag is None or self.lag_decay):
            raise UsageError("--stale refuse needs --max-lag and no --lag-decay",
                             hint="the bound it refuses past is --max-lag; --lag-decay keeps stale rows instead")
        if self.keep_checkpoints < 0:
            raise UsageError("--keep-checkpoints must be >= 0 (0 keeps every checkpoint)")
        self._check_numbers()

    def _check_algorithms(self) -> None:
        """The rollout-correction, critic and teacher options: known names, and no option without what it needs."""
        from arlctl.rl.correction import IS_LEVELS, IS_MODES

        for flag, value, allowed in (("--is-level", self.is_level, IS_LEVELS), ("--is-mode", self.is_mode, IS_MODES),
                                     ("--gae-level", self.gae_level, GAE_LEVELS),
                                     ("--distill-baseline", self.distill_baseline, DISTILL_BASELINES)):
            if value not in allowed:
                raise UsageError(f"{flag} must be one of {', '.join(allowed)}, not {value!r}")
        if self.tis_cap is None and (self.is_level != "token" or self.is_mode != "truncate" or self.is_low is not None):
            raise UsageError("--is-level, --is-mode and --is-low shape the rollout correction, which needs --tis-cap",
                             hint="e.g. --tis-cap 2 --is-level sequence --is-mode mask")
        if self.is_low is not None and not (math.isfinite(self.is_low) and 0 < self.is_low < (self.tis_cap or 0)):
            raise UsageError(f"--is-low must be a number in (0, --tis-cap), not {self.is_low}")
        if self.loss_norm_tokens is not None and self.loss_norm_tokens < 1:
            raise UsageError(f"--loss-norm-tokens must be >= 1, not {self.loss_norm_tokens}")
        if self.loss_norm_tokens is not None and self.loss_agg != "seq-mean-token-sum-norm":
            raise UsageError("--loss-norm-tokens is the length of --loss-agg seq-mean-token-sum-norm")
        for name, value in (("--gae-gamma", self.gae_gamma), ("--gae-lambda", self.gae_lambda)):
            if not 0.0 <= value <= 1.0:  # NaN fails this too
                raise UsageError(f"{name} must be in [0, 1], not {value}")
        if self.value_clip is not None and not (math.isfinite(self.value_clip) and self.value_clip > 0):
            raise UsageError(f"--value-clip must be a finite number > 0, not {self.value_clip}")
        for name, value in (("--distill-coef", self.distill_coef), ("--distill-task-coef", self.distill_task_coef)):
            if not math.isfinite(value):
                raise UsageError(f"{name} must be a finite number, not {value}")
        if self.teacher_kl_coef and self.teacher is None:
            raise UsageError("--teacher-kl-coef needs a --teacher")
        if self.loss == "sft" and (self.value_coef or self.teacher or self.kl_in_reward):
            raise UsageError("--loss sft trains on no advantage: --value-coef, --teacher and --kl-in-reward do not apply")

    def needs_reference(self) -> bool:
        """The frozen initial policy is loaded for the KL loss term and for REINFORCE++'s KL reward."""
        return bool(self.kl_coef or self.kl_in_reward)

    def _check_numbers(self) -> None:
        """Every float option is a finite number in its range: --lr inf would write inf weights."""
        at_least_zero = {"--lr": self.lr, "--weight-decay": self.weight_decay, "--eps-low": self.eps_low,
                         "--eps-high": self.eps_high, "--kl-coef": self.kl_coef, "--min-lr-ratio": self.min_lr_ratio,
                         "--lag-decay": self.lag_decay, "--kl-in-reward": self.kl_in_reward,
                         "--value-coef": self.value_coef, "--teacher-kl-coef": self.teacher_kl_coef}
        if self.lora_rank:
            at_least_zero["--lora-alpha"] = self.lora_alpha
        above_zero = {"--grad-clip": self.grad_clip, "--temperature": self.temperature}
        if self.tis_cap is not None:
            above_zero["--tis-cap"] = self.tis_cap
        for name, value in {**at_least_zero, **above_zero}.items():
            if not math.isfinite(value) or value < 0 or (name in above_zero and value == 0):
                bound = "> 0" if name in above_zero else ">= 0"
                raise UsageError(f"{name} must be a finite number {bound}, not {value}")

    def lora_target_list(self) -> list[str]:
        return [t.strip() for t in self.lora_targets.split(",") if t.strip()]

    def loss_config(self) -> Any:
        from arlctl.rl.losses import LossConfig

        return LossConfig(eps_low=self.eps_low, eps_high=self.eps_high, tis_cap=self.tis_cap,
                          kl_coef=self.kl_coef, loss_agg=self.loss_agg, kind=self.loss, is_level=self.is_level,
                          is_mode=self.is_mode, is_low=self.is_low, teacher_kl_coef=self.teacher_kl_coef)
