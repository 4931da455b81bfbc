"""The train recipe: batch shards -> optimizer steps -> checkpoints (DESIGN.md §5, §9).

Reads top to bottom like a torchtune recipe:

  setup     resolve the starting weights (newest checkpoint, else --policy), build the model, the frozen
            reference (only with --kl-coef), AdamW and the LR schedule; restore their states and the RNG
  loop      one batch shard = one optimizer step, in name order, skipping shards already consumed:
            micro-batches under a token budget -> masked policy loss (--loss ppo-clip | gspo | cispo, with
            rollout correction at --is-level, arlctl/rl/losses.py) -> backward -> clip -> step.
            A batch filtered with --adv gae | distill | reinforce++ has its advantages completed first by
            what only the trainer holds (its critic, a teacher, the reference: arlctl/rl/estimators.py)
            (`--loss sft`: the NLL of the mask-1 tokens instead, for a cold start on rows a filter kept,
            e.g. `filter --where 'reward = 1'`; same batches, strategies, LoRA, aggregation and checkpoints)
  save      every --save-every steps and at the end: step-NNNNNN/ with weights, optimizer, scheduler, RNG
            and state.json {step, consumed_batches, config}; built in a temp dir and renamed

Resuming continues exactly: the same next batch, the same weights, optimizer moments, LR and RNG, so K
steps straight and K/2 + resume + K/2 give identical weights.

Per-turn rows (`rollout --history per-turn`) are separate sequences, each trained with its trajectory's
advantage (or, after `filter --adv turn`, its turn's: turns[].advantage reaches the tokens of its turn,
arlctl/rl/batching.py `token_advantages`; rows without per-turn advantages train exactly as before). The loss weighs them per token: under token-mean (the default, like verl's token-mean) a
trajectory counts by its sampled tokens whether it arrives as one row or as ten, so a 10-turn trajectory
does not count 10x; the seq-mean modes count a per-turn trajectory as ONE sequence (N_seqs = trajectories)
and, for seq-mean-token-mean, scale each row by its share of the trajectory's tokens so the trajectory's
token mean is what enters the sequence mean (arlctl/rl/batching.py `trajectory_shares`).

Non-finite numbers never reach the weights (DESIGN.md §9), and no bad row blocks the run, by two counted
rules:
  rows      a row that breaks a value rule of the schema (schemas/values.py: NaN/inf log-probs, advantage
            or weight, token ids outside the vocabulary, masks outside {0, 1}, ...) or has a non-finite
            trained input is left out of its step (`rows_dropped_invalid`)
  steps     a step whose loss or gradient norm is still non-finite (or that has no row left) is skipped:
            no optimizer update, the batch still counts as consumed so the run never sticks on it
            (`skipped_nonfinite`)
Rows too stale to train on (DESIGN.md §10) are a third counted rule, applied when the step is taken: a
row's lag is the trainer's policy version (the step its weights are at, which `sync` publishes as vN) minus
the row's policy_version (arlctl/rl/batching.py `row_lags`). `--max-lag L` leaves out rows with lag > L
(`rows_dropped_stale`); with `--lag-decay D` those rows (every row without --max-lag) are kept at
weight *= exp(-D * lag) instead (`rows_decayed_stale`). A batch whose every row is stale is consumed
without an optimizer step and with a warning (`skipped_stale`). `filter --max-lag` still drops stale rows
earlier; this rule catches the rows that aged while they waited in batches/. With `--stale refuse` a batch
holding a row past --max-lag is not trained at all: train checkpoints what it trained before it and exits
1 naming the shard, which stays unconsumed. A recipe's `max-staleness: S` sets --max-lag S (arlctl up).
Each event is a warning in the step's metrics (`errors`, `last_error`: what `arlctl status` shows) and in
the checkpoint's state.json under `bad_values`, and is counted in the summary.

--out may be an object-store URL (s3://bucket/run/checkpoints): checkpoints are then built locally and
uploaded with state.json last, and a resume downloads the newest complete one (arlctl/rl/checkpoint.py).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from warnings import catch_warnings, filterwarnings

import pyarrow as pa
import torch

from arlctl.errors import TerminalError, UsageError
from arlctl.io import ledger as run_ledger
from arlctl.io.fs import basename
from arlctl.io.metrics import write_metrics_row
from arlctl.io.shards import read_lineage, read_shard, scan
from arlctl.rl import checkpoint as ckpt
from arlctl.rl import distributed as dd
from arlctl.rl import estimators
from arlctl.rl.batching import (
    batch_columns,
    collate,
    nonfinite_rows,
    plan_micro_batches,
    row_lags,
    score_tokens,
    trajectory_shares,
)
from arlctl.rl.config import TrainConfig
from arlctl.rl.losses import METRIC_SUMS, OPTIONAL_SUMS, finalize_metrics, policy_loss, sft_loss
from arlctl.rl.trainer_state import LORA_REFERENCE, TrainerState, full_checkpoint_state
from arlctl.schemas.values import find_bad_values
from arlctl.stages.results import TrainIO, TrainResult

# ----------------------------------------------------------------------------------------------- one step


def forward_backward(model: Any, ref_model: Any | None, batch: pa.Table, cfg: TrainConfig,
                     d: dd.Dist | None = None, teacher: Any | None = None, estimator: str | None = None,
                     packed: bool = False) -> dict[str, Any]:
    """Accumulate the gradient of the batch loss into .grad over token-budget micro-batches.

    model: an HF causal LM, or the trainer's module (a ScoringModel, possibly under DDP / FSDP2; with a value
    head when the trainer has a critic).
    ref_model: None, a frozen model of either kind, or LORA_REFERENCE (the model with adapters disabled).
    teacher: None, a frozen model of either kind, or an engine scorer (arlctl/rl/teacher.py).
    estimator: the batch's --adv (from its lineage); gae, distill and reinforce++ (with --kl-in-reward) have
    their advantages completed here (see the module docstring).
    d: on more than one rank, this rank trains its token-balanced share of the rows; the loss carries the
    whole batch's denominators and the returned sums are the whole batch's (reduced over ranks).
    packed: micro-batches of real tokens, run packed (arlctl/rl/packing.py; the models' attention must be
    packing.ROWS or flash-attention's); else padded.
    """
    d = d or dd.Dist()
    critic = dd.has_value_head(model)
    loss_cfg = cfg.loss_config()
    device = next(model.parameters()).device
    autocast = nullcontext()
    if cfg.precision == "bf16" and next(model.parameters()).dtype == torch.float32 and not _is_fsdp(model):
        autocast = torch.autocast(device.type, dtype=torch.bfloat16)  # fp32 weights (ddp, or a bare model)

    # 1. Plan micro-batches of this rank's rows: whole rows, longest first, rows x longest <= micro_tokens
    #    (padded) or the rows' tokens <= micro_tokens (packed).
    lengths = [p + r for p, r in zip(batch.column("prompt_tokens").to_pylist(),
                                     batch.column("response_tokens").to_pylist(), strict=True)]
    mine = dd.split_rows(lengths, d.world)[d.rank] if d.active else list(range(len(lengths)))
    plan = [[mine[j] for j in group]
            for group in plan_micro_batches([lengths[i] for i in mine], cfg.micro_tokens, packed=packed)]
    # Every rank runs as many micro-batches as the busiest one: each is a collective under FSDP2.
    steps = int(d.max([float(len(plan))])[0])

    # 2. Denominators of the whole batch, so that the micro-batch losses of all ranks sum to the batch loss.
    #    A per-turn trajectory's rows are one sequence of the seq-mean modes (see the module docstring).
    num_tokens = float(sum(sum(m) for m in batch.column("response_mask").to_pylist()))
    shares, num_trajectories = trajectory_shares(batch)
    num_seqs = float(num_trajectories)
    columns = batch_columns(batch)
    if cfg.loss_agg == "seq-mean-token-mean":
        columns["weight"] = [(1.0 if w is None else w) * share for w, share in zip(columns["weight"], shares, strict=True)]
    norm_tokens = float(cfg.loss_norm_tokens or longest_trajectory(batch))  # seq-mean-token-sum-norm's L

    # 2b. Estimators that need the trainer's models: a no-gradient pass over the same micro-batches first
    #     (GAE: the critic's values; REINFORCE++ with --kl-in-reward: the reference's log-probs), whose
    #     per-token advantages (and value targets) then replace the batch's.
    token_values: dict[int, dict[str, list[float]]] = {}
    if estimator == "gae":
        token_values = estimators.gae_columns(lambda mb: _score(model, mb, with_values=True,
                                                                 temperature=cfg.temperature)[2],
                                              batch, columns, plan, steps, cfg, d, device)
    elif estimator == "distill":
        estimators.distill_columns(teacher, columns, plan, steps, cfg, d, device)
    elif estimator == "reinforce++" and cfg.kl_in_reward:
        estimators.reinforce_pp_columns(lambda mb: _reference_logp(model, ref_model, mb, cfg, force=True),
                                        batch, columns, plan, steps, cfg, d, device)

    # 3. Forward and backward each micro-batch; gradients accumulate in .grad and are reduced across ranks
    #    (summed) in the backward of the last one.
    model.train()
    scale = dd.loss_scale(model, d)
    out: dict[str, Any] = {"loss": 0.0, "entropy_sum": 0.0, "sums": [], "seq_tokens": 0, "forward_tokens": 0,
                           "micro_batches": len(plan), "token_values": token_values}
    denominators = {"num_tokens": num_tokens, "num_seqs": num_seqs, "norm_tokens": norm_tokens}
    use_teacher = teacher is not None and bool(cfg.teacher_kl_coef)  # the loss term (distill's pass ran above)
    for k in range(steps):
        rows = plan[k] if k < len(plan) else None
        mb = (collate(columns, rows, packed=packed) if rows else dd.empty_micro_batch(packed)).to(device)
        with dd.grad_sync_scope(model, last=k == steps - 1), autocast:
            ref_logp = _reference_logp(model, ref_model, mb, cfg)
            teacher_logp = estimators.teacher_logp(teacher, mb, cfg.temperature) if use_teacher else None  # [B, L-1]
            scored = _score(model, mb, with_entropy=True, temperature=cfg.temperature, with_values=critic)
            logp, entropy = scored[0], scored[1]  # [B, L-1] x2
            if loss_cfg.kind == "sft":  # imitation of the kept rows: no advantage, no ratio in the loss
                loss, sums = sft_loss(logp, mb.loss_mask, loss_cfg, weights=mb.weights, ref_logp=ref_logp,
                                      behaviour_logp=mb.behaviour_logp, **denominators)
            else:
                loss, sums = policy_loss(logp, mb.behaviour_logp, mb.advantages, mb.loss_mask, loss_cfg,
                                         weights=mb.weights, ref_logp=ref_logp, teacher_logp=teacher_logp,
                                         **denominators)
            if critic:  # the value loss, or a zero that keeps the head in every rank's graph (a collective)
                loss = loss + estimators.critic_loss(scored[2], mb, cfg, sums, denominators)
            (loss * scale if scale != 1.0 else loss).backward()
        if rows:
            out["loss"] += float(loss.detach())
            out["entropy_sum"] += float((entropy * mb.loss_mask).sum())
            out["sums"].append(sums)
            out["seq_tokens"] += mb.real_tokens
            out["forward_tokens"] += mb.forward_tokens
    return _reduce_over_ranks(out, d) if d.active else out


def _score(model: Any, mb: Any, with_values: bool = False, **kwargs: Any) -> tuple[torch.Tensor, ...]:
    if isinstance(dd.unwrap(model), dd.ScoringModel):
        return model(mb, with_values=with_values, **kwargs)
    return score_tokens(model, mb, **kwargs)


def _reference_logp(model: Any, ref_model: Any, mb: Any, cfg: TrainConfig, force: bool = False) -> torch.Tensor | None:
    """The KL reference's log-probs of the trained tokens, without a gradient (for the KL loss term, or with
    `force` for REINFORCE++'s KL reward)."""
    if ref_model is None or not (cfg.kl_coef or force):
        return None
    with torch.no_grad():
        if ref_model is LORA_REFERENCE:
            from arlctl.rl.lora import reference_scope

            inner = dd.unwrap(model)
            lm = inner.lm if isinstance(inner, dd.ScoringModel) else inner
            with reference_scope(lm):
                return _score(inner, mb, temperature=cfg.temperature)[0]
        return _score(ref_model, mb, temperature=cfg.temperature)[0]  # [B, L-1]


def _bare_packing(lm: Any, cfg: TrainConfig) -> bool:
    """A step on a bare model (no trainer state, so no probe): packed only with --pack on."""
    if cfg.pack != "on":
        return False
    from arlctl.rl.packing import use_rows_attention

    why = use_rows_attention(lm, next(lm.parameters()).device)
    if why is not None:
        raise UsageError(f"--pack on: the model cannot pack: {why}", hint="--pack auto or off")
    return True


def _is_fsdp(model: Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def longest_trajectory(batch: pa.Table) -> int:
    """The most trained (mask-1) tokens of one trajectory in the batch: seq-mean-token-sum-norm's default L."""
    per_trajectory: dict[str, int] = {}
    for tid, mask in zip(batch.column("trajectory_id").to_pylist(), batch.column("response_mask").to_pylist(),
                         strict=True):
        per_trajectory[tid] = per_trajectory.get(tid, 0) + sum(mask)
    return max(per_trajectory.values(), default=1)


def _reduce_over_ranks(out: dict[str, Any], d: dd.Dist) -> dict[str, Any]:
    """The whole batch's loss and metric sums from every rank's share (what one process would have)."""
    # The optional sums (rollout correction, teacher, critic): those any rank has (a rank with no row has none).
    present = {k for part in d.gather_objects([k for k in OPTIONAL_SUMS if any(k in s for s in out["sums"])])
               for k in part}
    optional = [k for k in OPTIONAL_SUMS if k in present]
    keys = (*METRIC_SUMS, *optional)
    sums = {k: sum(float(s.get(k, 0.0)) for s in out["sums"]) for k in keys}
    totals = d.sum([out["loss"], out["entropy_sum"], float(out["seq_tokens"]), float(out["micro_batches"]),
                    float(out["forward_tokens"]), *sums.values()])
    high = d.max([max((float(s["ratio_max"]) for s in out["sums"]), default=-math.inf)])[0]
    low = d.min([min((float(s["ratio_min"]) for s in out["sums"]), default=math.inf)])[0]
    merged = {k: torch.tensor(v) for k, v in zip(keys, totals[5:], strict=True)}
    merged.update(ratio_max=torch.tensor(high if math.isfinite(high) else 1.0),
                  ratio_min=torch.tensor(low if math.isfinite(low) else 1.0))
    token_values = {row: v for part in d.gather_objects(out["token_values"]) for row, v in part.items()}
    return {"loss": totals[0], "entropy_sum": totals[1], "seq_tokens": int(totals[2]), "micro_batches": int(totals[3]),
            "forward_tokens": int(totals[4]), "sums": [merged] if totals[5] else [], "token_values": token_values}


def rows_to_drop(batch: pa.Table, vocab_size: int | None) -> dict[int, str]:
    """{row: why} for the rows no step may train on.

    A row breaks a value rule of the schema (what `arlctl validate` refuses), or one of its trained inputs
    is not a finite number (nonfinite_rows: the one rule the loss itself depends on, also for rows that
    bypassed the readers).
    """
    dropped: dict[int, str] = {}
    for problem in find_bad_values(batch, vocab_size):
        dropped.setdefault(problem.row, problem.reason)
    for row, why in nonfinite_rows(batch_columns(batch)).items():
        dropped.setdefault(row, why)
    return dropped


def apply_staleness(batch: pa.Table, version: int | None, cfg: TrainConfig) -> tuple[pa.Table, dict[str, Any]]:
    """The batch with --max-lag / --lag-decay applied at trainer `version`, and the staleness metrics.

    Without a version (a caller that does not say which step the weights are at) no lag is known: the
    batch is returned as it is, with zero lags.
    """
    lags = row_lags(batch, version) if version is not None and batch.num_rows else [0] * batch.num_rows
    stats: dict[str, Any] = {"policy_version": -1 if version is None else version,
                             "mean_lag": sum(lags) / len(lags) if lags else 0.0, "max_lag": max(lags, default=0),
                             "rows_dropped_stale": 0, "rows_decayed_stale": 0}
    stats.update(_trained_lags(lags))
    if version is None or (cfg.max_lag is None and not cfg.lag_decay):
        return batch, stats
    over = [lag > (cfg.max_lag or 0) for lag in lags]
    if not cfg.lag_decay:
        stats["rows_dropped_stale"] = sum(over)
        stats.update(_trained_lags([lag for lag, o in zip(lags, over, strict=True) if not o]))
        return batch.filter(pa.array([not o for o in over], pa.bool_())), stats
    # Down-weight instead of dropping; a null weight means 1 (collate), so it becomes the factor itself.
    weights = batch.column("weight").to_pylist()
    decayed = [(1.0 if w is None else w) * math.exp(-cfg.lag_decay * lag) if o else w
               for w, lag, o in zip(weights, lags, over, strict=True)]
    stats["rows_decayed_stale"] = sum(over)
    i = batch.schema.get_field_index("weight")
    field_ = batch.schema.field(i)
    return batch.set_column(i, field_, pa.array(decayed, field_.type)), stats


def _trained_lags(lags: list[int]) -> dict[str, Any]:
    """The lags of the rows that enter the loss (mean_lag and max_lag are of the whole batch, dropped rows
    included): what a staleness bound promises, what the dashboard shows as lag at train time."""
    return {"max_lag_trained": max(lags, default=0), "mean_lag_trained": sum(lags) / len(lags) if lags else 0.0}


def stale_refusal(batch: pa.Table, version: int, cfg: TrainConfig, url: str) -> str | None:
    """With --stale refuse: why the batch shard at `url` may not be trained at `version`, else None."""
    if cfg.stale != "refuse" or cfg.max_lag is None or not batch.num_rows:
        return None
    lags = row_lags(batch, version)
    over = sum(lag > cfg.max_lag for lag in lags)
    if not over:
        return None
    return (f"batch shard {basename(url)}: {over} of {batch.num_rows} rows would be trained {max(lags)} versions "
            f"after the version that generated them (trainer version {version}), past --max-lag {cfg.max_lag}; "
            f"--stale refuse stops before it")


def train_step(model: Any, ref_model: Any | None, optimizer: Any, scheduler: Any, batch: pa.Table,
               cfg: TrainConfig, version: int | None = None, trainer: TrainerState | None = None,
               estimator: str | None = None, teacher: Any | None = None) -> dict[str, Any]:
    """One optimizer step over one batch shard, or a recorded skip when its gradient is not finite or every
    row is stale.

    version: the trainer's policy version (the step the weights are at), against which rows' lag is taken.
    trainer: the trainer state (ranks, fp32 master weights); without it, `model` is one plain process's.
    Besides the numbers, the metrics hold `rows_dropped_invalid` (rows left out), `skipped_nonfinite`
    (1 when the optimizer did not step), the staleness counts of `apply_staleness`, `skipped_stale` (1 when
    every row was stale) and `warning` (what happened, "" when nothing did).
    estimator: the --adv the batch was filtered with (`train` reads it from the shard's lineage; None: the
    batch's advantages are trained as they are). teacher: for distillation, when no trainer
    holds one. With a critic and a GAE batch, `token_values` holds each row's values, returns and advantages.
    """
    started = time.perf_counter()
    teacher = trainer.teacher if trainer is not None else teacher
    estimators.check_batch_fits(estimator, model, teacher, ref_model, cfg)
    lr = optimizer.param_groups[0]["lr"]
    d = trainer.d if trainer is not None else dd.Dist()
    lm = trainer.lm if trainer is not None else getattr(dd.unwrap(model), "lm", model)
    packed = trainer.decide_packing() if trainer is not None else _bare_packing(lm, cfg)

    # 1. Leave out rows no step may read; the rule is counted, never silent. Every rank reads the whole
    #    batch and drops the same rows.
    dropped = rows_to_drop(batch, lm.get_input_embeddings().num_embeddings)
    warnings = []
    if dropped:
        first = min(dropped)
        warnings.append(f"dropped {len(dropped)} of {batch.num_rows} rows with a bad value "
                        f"(row {first}: {dropped[first]})")
        batch = batch.filter(pa.array([i not in dropped for i in range(batch.num_rows)], pa.bool_()))
    rows_before = batch.num_rows
    batch, stale = apply_staleness(batch, version, cfg)
    all_stale = rows_before > 0 and batch.num_rows == 0
    if all_stale:  # consumed, never retried: these rows only get older
        warnings.append(f"every row is stale: {rows_before} rows over --max-lag {cfg.max_lag} (max lag "
                        f"{stale['max_lag']} at policy version {version}); batch consumed, weights unchanged")

    # 2. Gradient of the whole batch's loss, accumulated over micro-batches (and ranks); then clip its norm.
    skip = None
    if batch.num_rows == 0:
        acc = {"loss": 0.0, "entropy_sum": 0.0, "sums": [], "seq_tokens": 0, "forward_tokens": 0, "micro_batches": 0,
               "token_values": {}}
        grad_norm = torch.tensor(0.0)
        skip = None if all_stale else "no row left to train on"
    else:
        acc = forward_backward(model, ref_model, batch, cfg, d, teacher=teacher, estimator=estimator, packed=packed)
        if trainer is not None:
            trainer.after_backward()
        params = [p for p in (trainer.master if trainer is not None else model).parameters() if p.requires_grad]
        grad_norm = dd.total_norm(torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip))
        if not math.isfinite(acc["loss"]):
            skip = f"non-finite loss {acc['loss']}"
        elif not bool(torch.isfinite(grad_norm)):
            skip = f"non-finite gradient (norm {float(grad_norm)})"

    # 3. Step the optimizer, unless the gradient is unusable: then the weights and the optimizer's moments
    #    stay as they are. The schedule advances either way, so the LR stays a function of the step number.
    if skip is None and not all_stale:
        optimizer.step()
        if trainer is not None:
            trainer.after_step()
    elif skip is not None:
        warnings.append(f"optimizer step skipped: {skip}; weights unchanged")
    with catch_warnings():
        # torch warns when the schedule steps before any optimizer step: here that is a skipped step.
        filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")
        scheduler.step()
    if trainer is not None:
        trainer.zero_grad()
    else:
        optimizer.zero_grad(set_to_none=True)

    # 4. Metrics of this step.
    elapsed = time.perf_counter() - started
    metrics: dict[str, Any] = finalize_metrics(acc["sums"])
    rewards = torch.tensor([r for r in batch.column("reward").to_pylist() if r is not None], dtype=torch.float64)
    advantages = torch.tensor([a or 0.0 for a in batch.column("advantage").to_pylist()], dtype=torch.float64)
    metrics.update({
        "loss": acc["loss"], "entropy": acc["entropy_sum"] / max(metrics["tokens"], 1.0),
        "grad_norm": float(grad_norm), "lr": lr, "rows": batch.num_rows, "micro_batches": acc["micro_batches"],
        "seq_tokens": acc["seq_tokens"], "forward_tokens": acc["forward_tokens"], "packed": int(packed),
        "step_time_s": elapsed, "tokens_per_s": acc["seq_tokens"] / max(elapsed, 1e-9),
        "reward_mean": float(rewards.mean()) if rewards.numel() else float("nan"),
        "advantage_mean": float(advantages.mean()) if advantages.numel() else 0.0,
        "advantage_abs_mean": float(advantages.abs().mean()) if advantages.numel() else 0.0,
        "rows_dropped_invalid": len(dropped), "skipped_nonfinite": int(skip is not None),
        **stale, "skipped_stale": int(all_stale),
        "warning": "; ".join(warnings),
    })
    if acc["token_values"]:  # the critic's numbers of this step, per row (written beside the metrics)
        ids = batch.column("trajectory_id").to_pylist()
        metrics["token_values"] = {ids[row]: v for row, v in sorted(acc["token_values"].items())}
    return metrics


# ----------------------------------------------------------------------------------------------- recipe


def pending_batches(in_url: str, consumed: set[str]) -> list[str]:
    """Batch shards in name order that no checkpoint has consumed yet."""
    return [url for url in scan(in_url).shards if basename(url) not in consumed]


# The trainer of each checkpoint directory this process trains, kept between `train --watch` cycles so that
# only the first cycle loads the model and optimizer (DESIGN.md §9).
_TRAINERS: dict[str, TrainerState] = {}


def train(in_url: str, policy: str | None, ckpt_dir: str, cfg: TrainConfig, metrics_url: str | None = None,
          resume: bool = True, on_step: Callable[[int, dict[str, float]], None] | None = None,
          stop: threading.Event | None = None, keep: bool = False) -> dict[str, Any]:
    """Train on every pending batch shard (or --max-steps of them). Returns a summary dict.

    stop: checked before each step (all ranks agree); once set (SIGTERM), the step in progress finishes and
    the trainer is checkpointed.
    keep: keep the trainer in memory for the next call (`train --watch`); its last state is then saved by
    the next call or by `finish`, and a checkpoint at the end of this call may be weights-only.
    Under torchrun every rank calls this; rank 0 decides what to train and is the only one that writes
    metrics and commits checkpoints.
    """
    cfg.check()
    d = dd.init_dist(cfg.device)
    cfg = cfg.for_device(d.device)  # --precision auto: bf16 on CUDA, fp32 on CPU
    torch.manual_seed(cfg.seed)

    # 1. Where do we start? Rank 0 reads the ledger; every rank gets its answer. The trainer kept in memory
    #    from the last cycle is used while it is at the newest checkpoint; else the newest *full* checkpoint
    #    (weights-only ones hold no optimizer state), else the initial policy.
    cached = _TRAINERS.get(str(ckpt_dir))
    where = d.broadcast(_where(in_url, ckpt_dir, cfg, policy, resume, cached) if d.is_main else None)
    if isinstance(where, Exception):
        raise where
    state, latest_full, todo = where["state"], where["full"], where["todo"]
    if not where["cached"]:
        _TRAINERS.pop(str(ckpt_dir), None)
        cached = None
    step = int(state["step"])
    ledger = BadValueLedger.from_state(state)
    summary = {"steps": 0, "step": step, "batches": [basename(u) for u in todo],
               "checkpoint": where["latest"], "resumed_from": step if where["latest"] else None,
               "skipped_nonfinite": 0, "rows_dropped_invalid": 0, "bad_value_events": [], **STALE_SUMMARY,
               "world_size": d.world, "packing": None}
    if not todo:
        return summary

    # 2. Model, optimizer and schedule (and the frozen reference for the KL term: the initial policy).
    initial_policy = cached.initial_policy if cached else _initial_policy(state, policy)
    trainer = cached or TrainerState.open(ckpt_dir, latest_full, state, initial_policy, cfg, d)
    if keep:
        _TRAINERS[str(ckpt_dir)] = trainer
    trainer.ledger = ledger

    # 3. The loop: one batch shard, one optimizer step.
    history: list[dict[str, float]] = []
    saved_at, save_s = step, 0.0
    last_url = todo[0]
    refusal = None
    for url in todo:
        if d.any(stop is not None and stop.is_set()):  # a step boundary on every rank at once
            break
        batch = read_shard(url, bad_values="keep")  # bad rows are dropped, counted, by train_step
        if cfg.loss != "sft" and batch.column("advantage").null_count:  # sft reads no advantage
            raise TerminalError(f"{url} has rows without an advantage", hint="batch shards come from `arlctl filter`")
        refusal = stale_refusal(batch, step, cfg, url)  # every rank reads the same batch: they agree
        if refusal is not None:
            break
        last_url = url
        metrics = train_step(trainer.module, trainer.ref, trainer.optimizer, trainer.scheduler, batch, cfg,
                             version=step, trainer=trainer, estimator=estimators.lineage_estimator(read_lineage(url)))
        step += 1
        trainer.step = step
        trainer.consumed.append(basename(url))
        metrics.update(step=step, **ledger.record(step, basename(url), metrics))
        history.append(metrics)
        token_values = metrics.pop("token_values", None)
        if d.is_main and metrics_url:
            _write_metrics(metrics_url, step, basename(url), metrics)
            if token_values:
                estimators.write_token_values(metrics_url, step, token_values)
        if d.is_main and on_step:
            on_step(step, metrics)
        full = step % cfg.save_every == 0
        if full or (cfg.publish_every and step % cfg.publish_every == 0):
            save_s += _save(trainer, ckpt_dir, url, policy, full=full)
            saved_at = step

    if not history:  # stopped before the first step: nothing new to save or report
        _refuse(refusal)
        return summary
    # 4. Leave the state where a restart finds it: a full checkpoint at the end (a weights-only one between
    #    --watch cycles when --publish-every is set: the trainer in memory holds the rest).
    if step != saved_at or (not keep and trainer.last_full != step):
        save_s += _save(trainer, ckpt_dir, last_url, policy, full=not (keep and cfg.publish_every))
    _refuse(refusal)
    events = [e for e in ledger.events if e["step"] > int(state["step"])]  # this invocation's
    return {
        **summary, "steps": len(history), "step": step, "save_s": save_s, "packing": trainer.packing,
        "checkpoint": run_ledger.checkpoint_location(ckpt_dir, step),
        "loss_mean": _mean(h["loss"] for h in history), "reward_mean": _mean(h["reward_mean"] for h in history),
        "tokens_per_s": _mean(h["tokens_per_s"] for h in history),
        "skipped_nonfinite": sum(h["skipped_nonfinite"] for h in history),
        "rows_dropped_invalid": sum(h["rows_dropped_invalid"] for h in history), "bad_value_events": events,
        **_stale_summary(history),
    }


def _refuse(refusal: str | None) -> None:
    if refusal is not None:
        raise TerminalError(refusal, hint="the shard stays unconsumed; --stale drop trains its other rows and "
                                          "counts the stale ones (rows_dropped_stale)")


def finish(ckpt_dir: str, policy: str | None = None) -> float:
    """End of `train --watch`: a full checkpoint of the trainer kept in memory, if its newest is not one."""
    trainer = _TRAINERS.pop(str(ckpt_dir), None)
    if trainer is None or trainer.last_full == trainer.step or not trainer.consumed:
        return 0.0
    return _save(trainer, ckpt_dir, trainer.consumed[-1], policy, full=True)


def _where(in_url: str, ckpt_dir: str, cfg: TrainConfig, policy: str | None, resume: bool,
           cached: TrainerState | None) -> dict[str, Any] | Exception:
    """Rank 0's reading of the ledger: the state to start from, its full checkpoint and the batches to train.

    An error is returned, not raised, so that every rank raises it (a rank that raised alone would leave the
    others waiting for it)."""
    try:
        latest = run_ledger.latest_checkpoint(ckpt_dir)
        if latest is not None and not resume:
            raise UsageError(f"{ckpt_dir} already holds checkpoints and --no-resume was given",
                             hint="resume (the default), or train into an empty --out")
        if latest is None and policy is None:
            raise UsageError("no checkpoint to resume from and no --policy given")
        use_cache = (cached is not None and latest is not None and cached.step == latest[0]
                     and cached.cfg == cfg)
        if use_cache:
            state = {**cached.state, "step": cached.step, "consumed_batches": list(cached.consumed),
                     "bad_values": cached.ledger.to_state()}
            full = None
        else:
            full = latest_full_checkpoint(ckpt_dir)
            state = run_ledger.read_state(full[1]) if full else {"step": 0, "consumed_batches": []}
        todo = pending_batches(in_url, set(state["consumed_batches"]))
        if cfg.max_steps is not None:
            todo = todo[: cfg.max_steps]
        return {"state": state, "full": full[1] if full else None, "todo": todo, "cached": use_cache,
                "latest": str(latest[1]) if latest else None}
    except Exception as err:  # noqa: BLE001 (handed to every rank, raised there)
        return err


def latest_full_checkpoint(ckpt_dir: str) -> tuple[int, Any] | None:
    """The newest checkpoint with optimizer state (a weights-only one cannot be resumed from)."""
    for step, location in reversed(run_ledger.list_checkpoints(ckpt_dir)):
        if full_checkpoint_state(run_ledger.read_state(location)):
            return step, location
    return None


STALE_SUMMARY = {"rows_dropped_stale": 0, "rows_decayed_stale": 0, "skipped_stale": 0, "mean_lag": None, "max_lag": None}


def _stale_summary(history: list[dict[str, Any]]) -> dict[str, Any]:
    """This invocation's staleness: rows left out or down-weighted, batches skipped, and the lags seen."""
    return {"rows_dropped_stale": sum(h["rows_dropped_stale"] for h in history),
            "rows_decayed_stale": sum(h["rows_decayed_stale"] for h in history),
            "skipped_stale": sum(h["skipped_stale"] for h in history),
            "mean_lag": _mean(h["mean_lag"] for h in history), "max_lag": max(h["max_lag"] for h in history)}


@dataclass
class BadValueLedger:
    """Every step skipped and row dropped for a bad or non-finite value since step 0, kept in state.json.

    The counts are exact; only the newest MAX_EVENTS events are kept, so state.json stays small.
    """

    MAX_EVENTS = 100
    events: list[dict[str, Any]] = field(default_factory=list)  # {step, batch, rows_dropped, skipped, warning}
    rows_dropped: int = 0
    steps_skipped: int = 0

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> BadValueLedger:
        saved = state.get("bad_values") or {}
        return cls(events=list(saved.get("events", [])), rows_dropped=int(saved.get("rows_dropped", 0)),
                   steps_skipped=int(saved.get("steps_skipped", 0)))

    def record(self, step: int, batch_name: str, metrics: dict[str, Any]) -> dict[str, Any]:
        """Add this step's events; returns the run-wide `errors` count and `last_error` for its metrics row."""
        if metrics["warning"]:
            self.rows_dropped += metrics["rows_dropped_invalid"]
            self.steps_skipped += metrics["skipped_nonfinite"]
            self.events.append({"step": step, "batch": batch_name, "rows_dropped": metrics["rows_dropped_invalid"],
                                "skipped": bool(metrics["skipped_nonfinite"]), "warning": metrics["warning"]})
            del self.events[: -self.MAX_EVENTS]
        last = self.events[-1] if self.events else None
        return {"errors": self.rows_dropped + self.steps_skipped,
                "last_error": f"step {last['step']} ({last['batch']}): {last['warning']}" if last else ""}

    def to_state(self) -> dict[str, Any]:
        return {"events": self.events, "rows_dropped": self.rows_dropped, "steps_skipped": self.steps_skipped}


def _initial_policy(state: dict[str, Any], policy: str | None) -> Path:
    """The initial weights (KL reference, tokenizer fallback): the recorded directory when it is on this
    machine, else the recorded --policy spec resolved here (a run resumed elsewhere from an object store)."""
    recorded = state.get("initial_policy")
    if recorded and Path(recorded).exists():
        return Path(recorded)
    spec = state.get("policy_spec") or policy
    if spec is None:
        if not recorded:
            raise UsageError("no initial policy: this run records none and no --policy was given",
                             hint="give --policy (the model the run starts from)")
        return Path(recorded)  # nothing to resolve; the loaders say what is missing
    return ckpt.resolve_policy_path(spec)


def _save(trainer: TrainerState, ckpt_dir: str, last_url: str, policy: str | None, full: bool) -> float:
    """Write a checkpoint (full, or weights only) on every rank; returns the seconds it took (on an object
    store: mostly the upload)."""
    cfg = trainer.cfg
    state = {"step": trainer.step, "consumed_batches": list(trainer.consumed), "last_batch": basename(last_url),
             "config": asdict(cfg), "initial_policy": str(trainer.initial_policy), "policy_spec": policy,
             "created_at": time.time(), "bad_values": trainer.ledger.to_state(), "world_size": trainer.d.world,
             "strategy": trainer.strategy}
    seconds = trainer.save(ckpt_dir, state, full=full)
    if cfg.keep_checkpoints and trainer.d.is_main:
        ckpt.prune_checkpoints(ckpt_dir, cfg.keep_checkpoints)
    return seconds


COUNT_METRICS = ("errors", "rows_dropped_invalid", "skipped_nonfinite", "rows_dropped_stale", "rows_decayed_stale",
                 "skipped_stale", "max_lag", "max_lag_trained", "policy_version")  # integers in the metrics rows


def _write_metrics(metrics_url: str, step: int, batch_name: str, metrics: dict[str, Any]) -> None:
    # One file per step with a deterministic name: a replay after a crash overwrites, never duplicates.
    row = {"step": step, "batch": batch_name, "time": time.time(),
           **{k: v if isinstance(v, str) else int(v) if k in COUNT_METRICS else float(v)
              for k, v in metrics.items() if k != "step"}}
    write_metrics_row(row, metrics_url, f"train-step-{step:06d}.parquet")


def _mean(values) -> float | None:
    values = [v for v in values if v == v]  # drop NaN
    return sum(values) / len(values) if values else None


__all__ = ["forward_backward", "train", "train_step"]


def run(cfg: TrainConfig, io: TrainIO, stop: threading.Event | None = None,
        on_step: Callable[[int, dict[str, float]], None] | None = None, keep: bool = False) -> TrainResult:
    """The stage's entry point: `train` on `io`, stopping at a step boundary once `stop` is set.

    keep: keep the trainer in memory for the next call (`--watch`); `finish` checkpoints it at the end."""
    return TrainResult.from_summary(train(io.in_url, io.policy, io.out, cfg, metrics_url=io.metrics,
                                          resume=io.resume, on_step=on_step, stop=stop, keep=keep))


def plan(cfg: TrainConfig, io: TrainIO) -> TrainResult:
    """What `run` would train on (--dry-run): the pending batches from the newest checkpoint; nothing loaded
    or written."""
    cfg.check()
    latest = latest_full_checkpoint(io.out)
    state: dict[str, Any] = run_ledger.read_state(latest[1]) if latest else {"step": 0, "consumed_batches": []}
    todo = pending_batches(io.in_url, set(state["consumed_batches"]))
    if cfg.max_steps is not None:
        todo = todo[: cfg.max_steps]
    return TrainResult(steps=0, step=int(state["step"]), batches=[basename(u) for u in todo],
                       checkpoint=str(latest[1]) if latest else None,
                       resumed_from=int(state["step"]) if latest else None)
