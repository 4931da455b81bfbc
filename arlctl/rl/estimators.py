"""Advantage estimators that only the trainer can complete: GAE over its critic, REINFORCE++ with a KL reward,
and on-policy distillation against a teacher (DESIGN.md §9).

`filter --adv gae | distill | reinforce++` writes batches whose `advantage` column holds an outcome rule's value
(arlctl/rl/advantages.py); the trainer reads which estimator a batch was filtered with from its lineage
(`lineage_estimator`: a name compared with a fixed list, never code) and finishes the job with what it holds:

  gae          a no-gradient pass over the batch's micro-batches gives the critic's values ("old" values); token
               rewards are the outcome at each row's last trained token plus each turn's step reward at that
               turn's last token; GAE (arlctl/rl/value.py) gives per-token advantages and value targets, whitened
               over the whole batch (all ranks) with --gae-whiten. --gae-level turn takes one step per turn
               instead: its value at the turn's first token, its step reward at its end, its advantage and
               return on every token of the turn
  reinforce++  with --kl-in-reward B: a no-gradient pass of the reference gives kl_t = behaviour - reference
               log-prob (k1); returns with the KL penalty (advantages.reinforce_pp_returns), normalised over
               every trained token of the batch (all ranks)
  distill      a no-gradient pass of the teacher gives its log-probs of every trained token; the advantage is
               task coef x the row's advantage + distill coef x ((teacher - behaviour) - b) per token, with
               b the mean of teacher - behaviour over the batch's trained tokens (all ranks) under
               --distill-baseline batch, 0 under none (arlctl/rl/distill.py)

Each rank computes its own rows; the whitening and normalisation statistics are summed over ranks, so N ranks
give what one process would. The passes run as many micro-batches on every rank (collectives under FSDP2).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import torch

from arlctl.errors import TerminalError
from arlctl.rl import distributed as dd
from arlctl.rl.advantages import ADVANTAGE_MODES, normalise_tokens, reinforce_pp_returns
from arlctl.rl.batching import (
    MicroBatch,
    collate,
    response_layout,
    response_values,
    score_tokens,
    turn_layout,
)
from arlctl.rl.distill import distill_advantages
from arlctl.rl.losses import aggregate_loss
from arlctl.rl.value import gae, value_loss


def lineage_estimator(lineage: Any) -> str | None:
    """The --adv a batch shard was filtered with, from its lineage; None when it does not say (or says
    something unknown: such a batch is trained on the advantages it holds, as before)."""
    if lineage is None or getattr(lineage, "stage", None) != "filter":
        return None
    config = (lineage.extra or {}).get("config") if isinstance(lineage.extra, dict) else None
    adv = config.get("adv") if isinstance(config, dict) else None
    return adv if isinstance(adv, str) and adv in ADVANTAGE_MODES else None


def check_batch_fits(estimator: str | None, model: Any, teacher: Any, ref: Any, cfg: Any) -> None:
    """A batch whose estimator needs what this trainer lacks stops the run with the fix, never trains wrongly."""
    if estimator == "gae" and not dd.has_value_head(model):
        raise TerminalError("this batch was filtered with --adv gae, whose advantages come from a critic",
                            hint="train with --value-coef 0.5 (a value head on the policy), or filter with --adv group")
    if estimator == "distill" and teacher is None:
        raise TerminalError("this batch was filtered with --adv distill, which needs the teacher's log-probs",
                            hint="train with --teacher MODEL_DIR_OR_URL")
    if estimator == "reinforce++" and cfg.kl_in_reward and ref is None:
        raise TerminalError("--kl-in-reward needs the frozen initial policy, and this trainer holds none",
                            hint="train through `arlctl train` (it loads the reference), or pass ref_model")


Lens = tuple[list[int], list[int]]  # (prompt lengths, response lengths) of a micro-batch's rows


def _no_grad_pass(columns: dict[str, list], plan: list[list[int]], steps: int, device: torch.device,
                  score: Callable[[MicroBatch], torch.Tensor]) -> Iterator[tuple[list[int], MicroBatch, Lens, torch.Tensor]]:
    """The pre-pass of every estimator: `score` on each of `steps` micro-batches without a gradient (a rank with
    fewer rows runs empty ones: each is a collective under FSDP2); yields (rows, mb, lens, scored) of the real ones."""
    prompt_lens = [len(p) for p in columns["prompt_ids"]]
    response_lens = [len(r) for r in columns["response_ids"]]
    with torch.no_grad():
        for k in range(steps):
            rows = plan[k] if k < len(plan) else None
            mb = (collate(columns, rows) if rows else dd.empty_micro_batch()).to(device)
            scored = score(mb)  # [B, L-1]
            if rows:
                yield rows, mb, ([prompt_lens[i] for i in rows], [response_lens[i] for i in rows]), scored


# ----------------------------------------------------------------------------------------------- GAE


def gae_columns(values_of: Callable[[MicroBatch], torch.Tensor], batch: pa.Table, columns: dict[str, list],
                plan: list[list[int]], steps: int, cfg: Any, d: dd.Dist, device: torch.device) -> dict[int, dict]:
    """Fill columns["token_advantage" | "old_values" | "returns"] for this rank's rows (GAE over the critic's
    values); returns {row: {"values", "returns", "advantages"}} of those rows, response-aligned."""
    from arlctl.rl.batching import trajectory_shares
    from arlctl.turn_rows import CONTINUED

    if any(r == CONTINUED for r in batch.column("finish_reason").to_pylist()) or \
            trajectory_shares(batch)[1] != batch.num_rows:
        raise TerminalError("--adv gae needs whole-trajectory rows: a per-turn row's return continues in another row",
                            hint="roll out with --history full (the default) for GAE, or filter with --adv turn")
    layouts = turn_layout(batch)  # read once: the rewards' places and, at turn level, the steps
    rewards_per_row = _token_rewards(batch, layouts, cfg.gae_level)
    masks = columns["response_mask"]
    values_rows: list[list[float]] = [[] for _ in masks]
    adv_rows: list[list[float]] = [[] for _ in masks]
    ret_rows: list[list[float]] = [[] for _ in masks]
    for rows, mb, lens, values in _no_grad_pass(columns, plan, steps, device, values_of):
        values = values.float()  # [B, L-1]
        width = mb.input_ids.shape[1]
        rewards = response_layout(rewards_per_row, rows, columns["prompt_ids"], width).to(device)  # [B, L-1]
        if cfg.gae_level == "turn":
            starts = {i: _turn_starts(layouts[i], masks[i]) for i in rows}
            steps_mask = response_layout(starts, rows, columns["prompt_ids"], width).to(device).bool() & mb.loss_mask
            adv, ret = gae(rewards, values, steps_mask, cfg.gae_gamma, cfg.gae_lambda)
            adv, ret = (_spread_turns(x, steps_mask, mb.loss_mask) for x in (adv, ret))
        else:
            adv, ret = gae(rewards, values, mb.loss_mask, cfg.gae_gamma, cfg.gae_lambda)  # [B, L-1] x2
        for target, tensor in ((values_rows, values), (adv_rows, adv), (ret_rows, ret)):
            for i, vals in zip(rows, response_values(tensor, mb, *lens), strict=True):
                target[i] = vals
    if cfg.gae_whiten:
        adv_rows = _whiten(adv_rows, masks, d)
    columns.update(token_advantage=adv_rows, old_values=values_rows, returns=ret_rows)
    mine = [i for group in plan for i in group]
    return {i: {"values": values_rows[i], "returns": ret_rows[i], "advantages": adv_rows[i]} for i in mine}


def _token_rewards(batch: pa.Table, layouts: list[list[tuple[int, int, Any]]], level: str) -> list[list[float]]:
    """Per row, response-aligned: each turn's step reward at its last token (turn level: at its first), and the
    row's reward (the outcome) at its last trained token (turn level: its last turn's first)."""
    out = []
    for spans, reward, mask in zip(layouts, batch.column("reward").to_pylist(), batch.column("response_mask").to_pylist(),
                                   strict=True):
        rewards = [0.0] * len(mask)
        trained = [t for t, m in enumerate(mask) if m]
        for start, length, step_reward in spans:
            inside = [t for t in range(start, min(start + length, len(mask))) if mask[t]]
            if step_reward is not None and inside:
                rewards[inside[0] if level == "turn" else inside[-1]] += float(step_reward)
        if trained:
            last_turn_start = _turn_first_trained(spans[-1], mask) if level == "turn" else None
            rewards[trained[-1] if last_turn_start is None else last_turn_start] += float(reward or 0.0)
        out.append(rewards)
    return out


def _turn_first_trained(span: tuple[int, int, Any], mask: list[int]) -> int | None:
    start, length, _ = span
    return next((t for t in range(start, min(start + length, len(mask))) if mask[t]), None)


def _turn_starts(spans: list[tuple[int, int, Any]], mask: list[int]) -> list[float]:
    """1.0 at the first trained token of each turn of a row (the steps of --gae-level turn), response-aligned."""
    starts = [0.0] * len(mask)
    for span in spans:
        first = _turn_first_trained(span, mask)
        if first is not None:
            starts[first] = 1.0
    return starts


def _spread_turns(values: torch.Tensor, steps_mask: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Each step's value carried right over the trained tokens after it, up to the next step. [B, T]."""
    out = torch.zeros_like(values)
    current = torch.zeros(values.shape[0], dtype=values.dtype, device=values.device)
    for t in range(values.shape[-1]):
        current = torch.where(steps_mask[:, t], values[:, t], current)
        out[:, t] = torch.where(loss_mask[:, t], current, torch.zeros_like(current))
    return out


def _whiten(rows: list[list[float]], masks: list[list[int]], d: dd.Dist) -> list[list[float]]:
    """(a - mean) / std over every trained token of the batch, every rank's rows together."""
    trained = [a for vals, mask in zip(rows, masks, strict=True) if vals for a, m in zip(vals, mask, strict=True) if m]
    total, total_sq, count = d.sum([sum(trained), sum(a * a for a in trained), float(len(trained))])
    out = []
    for vals, mask in zip(rows, masks, strict=True):
        if not vals:
            out.append(vals)
            continue
        t = torch.tensor(vals, dtype=torch.float64).unsqueeze(0)
        m = torch.tensor(mask, dtype=torch.bool).unsqueeze(0)
        out.append(normalise_tokens(t, m, total, total_sq, count)[0].tolist())
    return out


def critic_loss(values: torch.Tensor, mb: MicroBatch, cfg: Any, sums: dict[str, torch.Tensor],
                denominators: dict[str, float]) -> torch.Tensor:
    """value_coef x the aggregated value loss of a GAE micro-batch (adding its metric sums to `sums`); a zero
    with the head in the graph for any other micro-batch."""
    if mb.returns is None:
        return 0.0 * values.sum()
    mask = mb.loss_mask
    per_token, clipped = value_loss(values, mb.old_values, mb.returns, mask, cfg.value_clip)  # [B, L-1] x2
    loss = aggregate_loss(per_token, mask, cfg.loss_agg, **denominators)
    on = mask.to(values.dtype)
    with torch.no_grad():
        v, r = values.detach() * on, mb.returns * on
        sums.update(value_loss=(per_token.detach() * on).sum(), value_sq_err=((v - r) ** 2).sum(),
                    value_clip_frac=(clipped.to(on.dtype) * on).sum(), value_mean=v.sum(), return_mean=r.sum(),
                    return_sq=(r * r).sum())
    return cfg.value_coef * loss


def write_token_values(metrics_url: str, step: int, token_values: dict[str, dict[str, list[float]]]) -> None:
    """METRICS/train-values-step-NNNNNN.parquet: per trajectory, the critic's values, the returns and the GAE
    advantages of each response token of that step (a replay overwrites, as the step metrics do)."""
    from arlctl.io.fs import join
    from arlctl.io.shards import write_table_atomic

    ids = sorted(token_values)
    table = pa.table({"step": [step] * len(ids), "trajectory_id": ids,
                      **{key: pa.array([token_values[i][key] for i in ids], pa.list_(pa.float32()))
                         for key in ("values", "returns", "advantages")}})
    write_table_atomic(table, join(metrics_url, f"train-values-step-{step:06d}.parquet"))


# ----------------------------------------------------------------------------------------------- REINFORCE++


def reinforce_pp_columns(ref_logp_of: Callable[[MicroBatch], torch.Tensor], batch: pa.Table, columns: dict[str, list],
                         plan: list[list[int]], steps: int, cfg: Any, d: dd.Dist, device: torch.device) -> None:
    """Fill columns["token_advantage"] for this rank's rows: REINFORCE++ returns with the KL reward, normalised
    over the whole batch."""
    outcomes = [0.0 if r is None else float(r) for r in batch.column("reward").to_pylist()]
    returns_rows: list[list[float]] = [[] for _ in outcomes]
    for rows, mb, lens, ref_logp in _no_grad_pass(columns, plan, steps, device, ref_logp_of):
        kl = mb.behaviour_logp - ref_logp.float()  # [B, L-1] k1 of KL(pi_behaviour || pi_ref)
        returns = reinforce_pp_returns(torch.tensor([outcomes[i] for i in rows]), kl, mb.loss_mask,
                                       cfg.kl_in_reward)  # [B, L-1] float64
        for i, vals in zip(rows, response_values(returns, mb, *lens), strict=True):
            returns_rows[i] = vals
    columns["token_advantage"] = _whiten(returns_rows, columns["response_mask"], d)


# ----------------------------------------------------------------------------------------------- distillation


def teacher_logp(teacher: Any, mb: MicroBatch, temperature: float) -> torch.Tensor:
    """The teacher's log-probs of the micro-batch's trained tokens [B, L-1], no gradient: a model in this
    process (a ScoringModel, possibly FSDP2-sharded, or a plain HF model), or an engine scorer with `.score`."""
    with torch.no_grad():
        if hasattr(teacher, "score_micro_batch"):
            return teacher.score_micro_batch(mb).to(mb.behaviour_logp.device)
        if isinstance(dd.unwrap(teacher), dd.ScoringModel):
            return teacher(mb, temperature=temperature)[0]
        return score_tokens(teacher, mb, temperature=temperature)[0]


def distill_columns(teacher: Any, columns: dict[str, list], plan: list[list[int]], steps: int, cfg: Any,
                    d: dd.Dist, device: torch.device) -> None:
    """Fill columns["token_advantage"] for this rank's rows: the task advantage (x --distill-task-coef) plus
    --distill-coef x (teacher - behaviour - baseline) per trained token (see the module docstring)."""
    gaps: list[list[float]] = [[] for _ in columns["prompt_ids"]]
    tasks: list[list[float]] = [[] for _ in columns["prompt_ids"]]
    for rows, mb, lens, teacher_lp in _no_grad_pass(columns, plan, steps, device,
                                                    lambda mb: teacher_logp(teacher, mb, cfg.temperature)):
        gap = distill_advantages(teacher_lp.float(), mb.behaviour_logp, mb.loss_mask)  # [B, L-1]
        task = mb.advantages.unsqueeze(-1).expand_as(gap) if mb.advantages.dim() == 1 else mb.advantages
        for i, g, t in zip(rows, response_values(gap, mb, *lens), response_values(task, mb, *lens), strict=True):
            gaps[i], tasks[i] = g, t
    masks = columns["response_mask"]
    trained = [(g, m) for row, mask in zip(gaps, masks, strict=True) for g, m in zip(row, mask, strict=False)]
    total, count = d.sum([sum(g for g, m in trained if m), float(sum(m for _, m in trained))])
    baseline = total / count if cfg.distill_baseline == "batch" and count else 0.0
    columns["token_advantage"] = [
        [cfg.distill_task_coef * t + cfg.distill_coef * (g - baseline) if m else 0.0
         for g, t, m in zip(row_gap, row_task, mask, strict=False)] if row_gap else []
        for row_gap, row_task, mask in zip(gaps, tasks, masks, strict=True)]
