"""The train recipe: batch shards -> optimizer steps -> checkpoints (DESIGN.md §5, §9).

Reads top to bottom like a torchtune recipe:

  setup     resolve the starting weights (newest checkpoint, else --policy), build the model, the frozen
            reference (only with --kl-coef), AdamW and the LR schedule; restore their states and the RNG
  loop      one batch shard = one optimizer step, in name order, skipping shards already consumed:
            micro-batches under a token budget -> masked PPO-clip loss -> backward -> clip -> step
  save      every --save-every steps and at the end: step-NNNNNN/ with weights, optimizer, scheduler, RNG
            and state.json {step, consumed_batches, config}; built in a temp dir and renamed

Resuming continues exactly: the same next batch, the same weights, optimizer moments, LR and RNG, so K
steps straight and K/2 + resume + K/2 give identical weights.

--out may be an object-store URL (s3://bucket/run/checkpoints): checkpoints are then built locally and
uploaded with state.json last, and a resume downloads the newest complete one (arlctl/rl/checkpoint.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch

from arlctl.errors import TerminalError, UsageError
from arlctl.io.fs import basename, join
from arlctl.io.shards import read_shard, scan, write_table_atomic
from arlctl.rl import checkpoint as ckpt
from arlctl.rl.batching import batch_columns, collate, plan_micro_batches, score_tokens
from arlctl.rl.losses import LOSS_AGG_MODES, LossConfig, finalize_metrics, policy_loss

LR_SCHEDULES = ("constant", "cosine")
PRECISIONS = ("fp32", "bf16")


@dataclass
class TrainConfig:
    lr: float = 1e-6
    weight_decay: float = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0
    lr_schedule: str = "constant"
    cosine_steps: int = 1000  # horizon of the cosine decay (after warmup)
    min_lr_ratio: float = 0.0
    grad_clip: float = 1.0
    eps_low: float = 0.2
    eps_high: float = 0.2
    tis_cap: float | None = None
    kl_coef: float = 0.0
    loss_agg: str = "token-mean"
    micro_tokens: int = 8192
    precision: str = "fp32"
    temperature: float = 1.0
    save_every: int = 1
    keep_checkpoints: int = 0  # after each save, delete all but the newest N complete checkpoints; 0 keeps all
    max_steps: int | None = None  # steps in this invocation; None: every pending batch
    seed: int = 0
    device: str = "auto"  # auto: cuda when available, else cpu
    extra: dict[str, Any] = field(default_factory=dict)

    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def check(self) -> None:
        if self.loss_agg not in LOSS_AGG_MODES:
            raise UsageError(f"--loss-agg must be one of {', '.join(LOSS_AGG_MODES)}, not {self.loss_agg!r}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise UsageError(f"--lr-schedule must be one of {', '.join(LR_SCHEDULES)}")
        if self.precision not in PRECISIONS:
            raise UsageError(f"--precision must be one of {', '.join(PRECISIONS)}")
        if self.micro_tokens < 1 or self.save_every < 1:
            raise UsageError("--micro-tokens and --save-every must be >= 1")
        if self.keep_checkpoints < 0:
            raise UsageError("--keep-checkpoints must be >= 0 (0 keeps every checkpoint)")

    def loss(self) -> LossConfig:
        return LossConfig(eps_low=self.eps_low, eps_high=self.eps_high, tis_cap=self.tis_cap,
                          kl_coef=self.kl_coef, loss_agg=self.loss_agg)


def lr_lambda(cfg: TrainConfig) -> Callable[[int], float]:
    """LR multiplier per step: linear warmup, then constant or cosine down to min_lr_ratio."""

    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / (cfg.warmup_steps + 1)
        if cfg.lr_schedule == "constant":
            return 1.0
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.cosine_steps))
        return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def load_model(path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True)
    model.config.use_cache = False
    return model


def load_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError):
        return None  # a weights-only directory: checkpoints are then weights-only too


# ----------------------------------------------------------------------------------------------- one step


def forward_backward(model: Any, ref_model: Any | None, batch: pa.Table, cfg: TrainConfig) -> dict[str, Any]:
    """Accumulate the gradient of the batch loss into .grad over token-budget micro-batches."""
    loss_cfg = cfg.loss()
    device = next(model.parameters()).device
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if cfg.precision == "bf16" else nullcontext()

    # 1. Plan micro-batches: whole rows, longest first, rows x longest <= micro_tokens.
    lengths = [p + r for p, r in zip(batch.column("prompt_tokens").to_pylist(),
                                     batch.column("response_tokens").to_pylist(), strict=True)]
    plan = plan_micro_batches(lengths, cfg.micro_tokens)

    # 2. Denominators of the whole batch, so that the micro-batch losses sum to the batch loss.
    num_tokens = float(sum(sum(m) for m in batch.column("response_mask").to_pylist()))
    num_seqs = float(batch.num_rows)

    # 3. Forward and backward each micro-batch; gradients accumulate in .grad.
    columns = batch_columns(batch)
    model.train()
    out: dict[str, Any] = {"loss": 0.0, "entropy_sum": 0.0, "sums": [], "seq_tokens": 0, "micro_batches": len(plan)}
    for rows in plan:
        mb = collate(columns, rows).to(device)
        with autocast:
            logp, entropy = score_tokens(model, mb, with_entropy=True, temperature=cfg.temperature)  # [B, L-1]
            ref_logp = None
            if ref_model is not None:
                with torch.no_grad():
                    ref_logp, _ = score_tokens(ref_model, mb, temperature=cfg.temperature)  # [B, L-1]
        loss, sums = policy_loss(logp, mb.behaviour_logp, mb.advantages, mb.loss_mask, loss_cfg,
                                 weights=mb.weights, ref_logp=ref_logp, num_tokens=num_tokens, num_seqs=num_seqs)
        loss.backward()
        out["loss"] += float(loss.detach())
        out["entropy_sum"] += float((entropy * mb.loss_mask).sum())
        out["sums"].append(sums)
        out["seq_tokens"] += mb.real_tokens
    return out


def train_step(model: Any, ref_model: Any | None, optimizer: Any, scheduler: Any, batch: pa.Table,
               cfg: TrainConfig) -> dict[str, float]:
    """One optimizer step over one batch shard."""
    started = time.perf_counter()

    # 1. Gradient of the whole batch's loss, accumulated over micro-batches.
    acc = forward_backward(model, ref_model, batch, cfg)

    # 2. Clip the gradient norm, step the optimizer and the schedule, clear the gradients.
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)

    # 3. Metrics of this step.
    elapsed = time.perf_counter() - started
    metrics = finalize_metrics(acc["sums"])
    rewards = torch.tensor([r for r in batch.column("reward").to_pylist() if r is not None], dtype=torch.float64)
    advantages = torch.tensor([a or 0.0 for a in batch.column("advantage").to_pylist()], dtype=torch.float64)
    metrics.update({
        "loss": acc["loss"], "entropy": acc["entropy_sum"] / max(metrics["tokens"], 1.0),
        "grad_norm": float(grad_norm), "lr": lr, "rows": batch.num_rows, "micro_batches": acc["micro_batches"],
        "seq_tokens": acc["seq_tokens"], "step_time_s": elapsed, "tokens_per_s": acc["seq_tokens"] / max(elapsed, 1e-9),
        "reward_mean": float(rewards.mean()) if rewards.numel() else float("nan"),
        "advantage_mean": float(advantages.mean()) if advantages.numel() else 0.0,
        "advantage_abs_mean": float(advantages.abs().mean()) if advantages.numel() else 0.0,
    })
    return metrics


# ----------------------------------------------------------------------------------------------- recipe


def pending_batches(in_url: str, consumed: set[str]) -> list[str]:
    """Batch shards in name order that no checkpoint has consumed yet."""
    return [url for url in scan(in_url).shards if basename(url) not in consumed]


def train(in_url: str, policy: str | None, ckpt_dir: str, cfg: TrainConfig, metrics_url: str | None = None,
          resume: bool = True, on_step: Callable[[int, dict[str, float]], None] | None = None) -> dict[str, Any]:
    """Train on every pending batch shard (or --max-steps of them). Returns a summary dict."""
    cfg.check()
    torch.manual_seed(cfg.seed)

    # 1. Where do we start? The newest complete checkpoint, else the initial policy.
    latest = ckpt.latest_checkpoint(ckpt_dir)
    if latest is not None and not resume:
        raise UsageError(f"{ckpt_dir} already holds checkpoints and --no-resume was given",
                         hint="resume (the default), or train into an empty --out")
    if latest is None and policy is None:
        raise UsageError("no checkpoint to resume from and no --policy given")
    state: dict[str, Any] = ckpt.read_state(latest[1]) if latest else {"step": 0, "consumed_batches": []}

    # 2. Batches not yet consumed, in name order. Nothing to do is cheap: no model is loaded.
    step, consumed = int(state["step"]), list(state["consumed_batches"])
    todo = pending_batches(in_url, set(consumed))
    if cfg.max_steps is not None:
        todo = todo[: cfg.max_steps]
    summary = {"steps": 0, "step": step, "batches": [basename(u) for u in todo],
               "checkpoint": str(latest[1]) if latest else None, "resumed_from": step if latest else None}
    if not todo:
        return summary

    # 3. Model, tokenizer, optimizer and schedule; restore their states when resuming. A checkpoint on an
    #    object store is downloaded to a scratch directory for as long as this takes.
    initial_policy = _initial_policy(state, policy)
    device = cfg.torch_device()
    with ckpt.local_copy(latest[1] if latest else None) as resume_from:
        start_path = resume_from or initial_policy
        model = load_model(start_path).to(device)
        tokenizer = load_tokenizer(start_path) or load_tokenizer(initial_policy)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.adam_betas,
                                      weight_decay=cfg.weight_decay)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
        if resume_from is not None:
            optimizer.load_state_dict(torch.load(resume_from / "optimizer.pt", map_location=device, weights_only=False))
            scheduler.load_state_dict(torch.load(resume_from / "scheduler.pt", weights_only=False))
            ckpt.set_rng_state(torch.load(resume_from / "rng.pt", weights_only=False))

    # 4. The frozen reference for the KL term is always the initial policy, also after a resume.
    ref_model = None
    if cfg.kl_coef:
        ref_model = load_model(initial_policy).to(device).eval().requires_grad_(False)

    # 5. The loop: one batch shard, one optimizer step.
    history: list[dict[str, float]] = []
    saved_at, save_s = step, 0.0
    for url in todo:
        batch = read_shard(url)
        if batch.column("advantage").null_count:
            raise TerminalError(f"{url} has rows without an advantage", hint="batch shards come from `arlctl filter`")
        metrics = train_step(model, ref_model, optimizer, scheduler, batch, cfg)
        step += 1
        consumed.append(basename(url))
        metrics.update(step=step)
        history.append(metrics)
        if metrics_url:
            _write_metrics(metrics_url, step, basename(url), metrics)
        if on_step:
            on_step(step, metrics)
        if step % cfg.save_every == 0:
            save_s += _save(ckpt_dir, step, model, tokenizer, optimizer, scheduler, consumed, cfg, initial_policy,
                            url, policy)
            saved_at = step

    # 6. Always leave the final state in a checkpoint.
    if step != saved_at:
        save_s += _save(ckpt_dir, step, model, tokenizer, optimizer, scheduler, consumed, cfg, initial_policy,
                        todo[-1], policy)
    return {
        **summary, "steps": len(history), "step": step, "save_s": save_s,
        "checkpoint": ckpt.checkpoint_location(ckpt_dir, step),
        "loss_mean": _mean(h["loss"] for h in history), "reward_mean": _mean(h["reward_mean"] for h in history),
        "tokens_per_s": _mean(h["tokens_per_s"] for h in history),
    }


def _initial_policy(state: dict[str, Any], policy: str | None) -> Path:
    """The initial weights (KL reference, tokenizer fallback): the recorded directory when it is on this
    machine, else the recorded --policy spec resolved here (a run resumed elsewhere from an object store)."""
    recorded = state.get("initial_policy")
    if recorded and Path(recorded).exists():
        return Path(recorded)
    spec = state.get("policy_spec") or policy
    if spec is None:
        return Path(recorded)  # nothing to resolve; the loaders say what is missing
    return ckpt.resolve_policy_path(spec)


def _save(ckpt_dir, step, model, tokenizer, optimizer, scheduler, consumed, cfg, initial_policy, last_url,
          policy) -> float:
    """Write a checkpoint; returns the seconds it took (on an object store: mostly the upload)."""
    started = time.perf_counter()
    state = {"step": step, "consumed_batches": list(consumed), "last_batch": basename(last_url),
             "config": asdict(cfg), "initial_policy": str(initial_policy), "policy_spec": policy,
             "created_at": time.time()}
    ckpt.save_checkpoint(ckpt_dir, step, model, tokenizer, optimizer, scheduler, state)
    if cfg.keep_checkpoints:
        ckpt.prune_checkpoints(ckpt_dir, cfg.keep_checkpoints)
    return time.perf_counter() - started


def _write_metrics(metrics_url: str, step: int, batch_name: str, metrics: dict[str, float]) -> None:
    # One file per step with a deterministic name: a replay after a crash overwrites, never duplicates.
    row = {"step": step, "batch": batch_name, "time": time.time(), **{k: float(v) for k, v in metrics.items() if k != "step"}}
    write_table_atomic(pa.Table.from_pylist([row]), join(metrics_url, f"train-step-{step:06d}.parquet"))


def _mean(values) -> float | None:
    values = [v for v in values if v == v]  # drop NaN
    return sum(values) / len(values) if values else None


__all__ = ["TrainConfig", "forward_backward", "train", "train_step"]
