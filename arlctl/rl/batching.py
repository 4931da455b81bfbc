"""Turning a batch shard into micro-batches, and scoring response tokens with a causal LM.

Micro-batches hold whole rows under a token budget, rows taken longest first: padded, rows x longest row
<= micro_tokens, so that rows of similar length share a micro-batch and padding stays small; packed
(`train --pack`, arlctl/rl/packing.py), the rows' real tokens <= micro_tokens, run as one sequence with
attention confined to each row. Either way the loss reads the same padded [B, L-1] layout.

Scoring runs the decoder once over prompt_ids + response_ids and applies the LM head only at positions
whose next token is a trained (mask-1) token: in agentic rows most response tokens are environment
output, and the [tokens x vocab] head and softmax dominate a small model's cost.

Per-turn rows (`rollout --history per-turn`): each row is its own sequence (its prompt_ids are the
template's rendering of the conversation before that turn) trained with its trajectory's advantage.
`trajectory_shares` says how many trajectories a batch holds and what share of its trajectory's trained
tokens each row has, so that the sequence-mean loss modes count a trajectory once, not once per turn.

`row_lags` is each row's staleness at the moment of training (DESIGN.md §10): the trainer's version minus
the row's `policy_version` (its first turn's), taken over the oldest row of its trajectory so that a per-turn
trajectory's rows share one lag, as in `filter`'s staleness rule.

`nonfinite_rows` names the rows a trainer must not use: a NaN or infinite number where the loss reads it
(a mask-1 behaviour log-prob, the advantage, a turn's advantage, the weight). Off-mask values are never
read (losses.py).

Turn-level credit (schema v2, `filter --adv turn`): a row whose turns carry turns[].advantage has its
advantage per token. Turn t's sampled tokens, response positions [gen_start, gen_start + gen_len), get
A_t; any other position of the row (and every position of a row without per-turn advantages) gets the
row's `advantage`. Only when no row of a micro-batch has per-turn advantages is `advantages` the plain
[B] vector: outcome-only training runs exactly the computation it always did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import torch

from arlctl.rl.config import HEAD_CHUNK_MB
from arlctl.rl.losses import entropy_from_logits, token_logprobs
from arlctl.rl.packing import Packed, pack, plan_packed


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # [B, L] prompt + response, right-padded with 0
    attention_mask: torch.Tensor  # [B, L] 1 on real tokens
    loss_mask: torch.Tensor  # [B, L-1] True where the token at position t+1 is a trained response token
    behaviour_logp: torch.Tensor  # [B, L-1] recorded log-prob of token t+1 (0 off the mask)
    advantages: torch.Tensor  # [B] per row, or [B, L-1] per token (of token t+1) when turns carry advantages
    weights: torch.Tensor  # [B]
    rows: list[int]  # indices into the batch shard
    real_tokens: int  # non-padding tokens
    old_values: torch.Tensor | None = None  # [B, L-1] the critic's values before the step (GAE batches)
    returns: torch.Tensor | None = None  # [B, L-1] the value targets (GAE batches)
    packed: Packed | None = None  # the rows end to end: what the decoder runs on when set (packing.py)

    def to(self, device: torch.device | str) -> MicroBatch:
        tensors = ("input_ids", "attention_mask", "loss_mask", "behaviour_logp", "advantages", "weights",
                   "old_values", "returns")
        for name in tensors:
            if getattr(self, name) is not None:
                setattr(self, name, getattr(self, name).to(device, non_blocking=True))
        if self.packed is not None:
            self.packed.to(device)
        return self

    @property
    def forward_tokens(self) -> int:
        """Tokens the decoder runs on: the real ones when packed, rows x width when padded."""
        return self.real_tokens if self.packed is not None else self.input_ids.numel()


def plan_micro_batches(lengths: list[int], micro_tokens: int, packed: bool = False) -> list[list[int]]:
    """Group row indices so each group's rows x longest length <= micro_tokens (a longer row goes alone), or
    with `packed` so that each group's real tokens sum to <= micro_tokens (packing.plan_packed).

    Rows are taken longest first, so the padded cost of each group is set by its first row.
    """
    if packed:
        return plan_packed(lengths, micro_tokens)
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    for i in order:
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= micro_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


COLLATE_COLUMNS = ("prompt_ids", "response_ids", "response_mask", "response_logprobs", "advantage", "weight")
TurnSpan = tuple[int, int, float]  # (gen_start, gen_len, advantage) of one turn


def batch_columns(table: pa.Table) -> dict[str, list]:
    """The columns collate needs, as Python lists: convert once per batch, not once per micro-batch.
    `turn_advantages` holds turn_spans(table)."""
    cols = {name: table.column(name).to_pylist() for name in COLLATE_COLUMNS}
    cols["turn_advantages"] = turn_spans(table)
    return cols


def turn_spans(table: pa.Table) -> list[list[TurnSpan] | None]:
    """Per row, (gen_start, gen_len, advantage) of each turn with a per-turn advantage; None for a row with
    none (every row of a v1 shard or of an outcome-mode batch). Read from the struct fields only: the turns'
    text and observations are never converted."""
    import pyarrow.compute as pc

    turns = table.column("turns")
    if "advantage" not in [f.name for f in turns.type.value_type]:
        return [None] * table.num_rows
    lengths = [n or 0 for n in pc.list_value_length(turns).to_pylist()]  # [N]
    flat = pc.list_flatten(turns)  # [T]
    starts, lens, advs = (pc.struct_field(flat, k).to_pylist() for k in ("gen_start", "gen_len", "advantage"))
    out: list[list[TurnSpan] | None] = []
    at = 0
    for n in lengths:
        spans = [(starts[k], lens[k], advs[k]) for k in range(at, at + n) if advs[k] is not None]
        out.append(spans or None)
        at += n
    return out


def trajectory_shares(table: pa.Table) -> tuple[list[float], int]:
    """(share per row, number of trajectories) of a batch shard.

    A whole-trajectory row is one trajectory with share 1. The rows of a per-turn trajectory (same
    trajectory_id, arlctl/turn_rows.py) count as one trajectory together, and row r's share is its mask-1
    tokens over the trajectory's: sum_r share_r * token_mean_r is then the token mean over the trajectory.
    """
    from arlctl.turn_rows import CONTINUED, first_turn_indices

    ids = table.column("trajectory_id").to_pylist()
    reasons = table.column("finish_reason").to_pylist()
    tokens = table.column("generated_tokens").to_pylist()
    per_turn = [r == CONTINUED or i > 0 for r, i in zip(reasons, first_turn_indices(table), strict=True)]
    traj_tokens: dict[str, int] = {}
    for tid, turn, n in zip(ids, per_turn, tokens, strict=True):
        if turn:
            traj_tokens[tid] = traj_tokens.get(tid, 0) + n
    turn_ids = {tid for tid, turn in zip(ids, per_turn, strict=True) if turn}
    shares = [(n / traj_tokens[tid] if traj_tokens[tid] else 0.0) if tid in turn_ids else 1.0
              for tid, n in zip(ids, tokens, strict=True)]
    whole = sum(1 for tid in ids if tid not in turn_ids)
    return shares, whole + len(turn_ids)


def row_lags(table: pa.Table, version: int) -> list[int]:
    """Lag of each row when trained at policy `version`: version - the oldest policy_version among its
    trajectory's rows in the batch, never below 0 (a row cannot be newer than the weights it trains).

    A null policy_version counts as version 0, the oldest there is: an unknown age is never taken as fresh.
    """
    ids = table.column("trajectory_id").to_pylist()
    versions = [v or 0 for v in table.column("policy_version").to_pylist()]
    oldest: dict[str, int] = {}
    for tid, v in zip(ids, versions, strict=True):
        oldest[tid] = min(oldest.get(tid, v), v)
    return [max(version - oldest[tid], 0) for tid in ids]


def nonfinite_rows(cols: dict[str, list]) -> dict[int, str]:
    """{row index: why} for rows with a non-finite trained input; takes `batch_columns` output.

    Checked: the advantage, each per-turn advantage and the weight (null means 0 and 1, as in `collate`),
    and the behaviour log-prob of every mask-1 token. A mask-0 log-prob may be anything: the loss never reads it.
    """
    bad: dict[int, str] = {}
    spans = cols.get("turn_advantages") or [None] * len(cols["advantage"])
    rows = zip(cols["advantage"], cols["weight"], cols["response_mask"], cols["response_logprobs"], spans, strict=True)
    for i, (adv, weight, mask, logprobs, turns) in enumerate(rows):
        turn_bad = next((f"turn advantage {a} at response token {s}" for s, _, a in turns or [] if not math.isfinite(a)),
                        None)
        if adv is not None and not math.isfinite(adv):
            bad[i] = f"advantage {adv}"
        elif turn_bad:
            bad[i] = turn_bad
        elif weight is not None and not math.isfinite(weight):
            bad[i] = f"weight {weight}"
        else:
            for t, (m, lp) in enumerate(zip(mask, logprobs, strict=False)):
                if m and (lp is None or not math.isfinite(lp)):
                    bad[i] = f"behaviour log-prob {lp} at response token {t}"
                    break
    return bad


def collate(table: pa.Table | dict[str, list], rows: list[int], packed: bool = False) -> MicroBatch:
    """Build the padded tensors of one micro-batch from rows of a batch shard (or its batch_columns); with
    `packed`, also its packed form, which the decoder then runs on (the loss reads the padded layout)."""
    cols = batch_columns(table) if isinstance(table, pa.Table) else table
    prompts, responses = cols["prompt_ids"], cols["response_ids"]
    masks, logprobs = cols["response_mask"], cols["response_logprobs"]
    adv, weight = cols["advantage"], cols["weight"]
    row_adv = torch.tensor([0.0 if a is None else a for a in (adv[i] for i in rows)], dtype=torch.float32)  # [B]
    spans = cols.get("turn_advantages")  # absent in a hand-built column dict: no per-turn advantages
    width = max(len(prompts[i]) + len(responses[i]) for i in rows)
    input_ids = torch.zeros(len(rows), width, dtype=torch.long)  # [B, L]
    attention = torch.zeros(len(rows), width, dtype=torch.long)  # [B, L]
    loss_mask = torch.zeros(len(rows), width, dtype=torch.bool)  # [B, L], shifted below
    behaviour = torch.zeros(len(rows), width, dtype=torch.float32)  # [B, L]
    for b, i in enumerate(rows):
        p, r = len(prompts[i]), len(responses[i])
        input_ids[b, : p + r] = torch.tensor(prompts[i] + responses[i], dtype=torch.long)
        attention[b, : p + r] = 1
        loss_mask[b, p : p + r] = torch.tensor(masks[i], dtype=torch.bool)
        behaviour[b, p : p + r] = torch.tensor(logprobs[i], dtype=torch.float32)
    per_token = {name: response_layout(cols[name], rows, prompts, width) if name in cols else None
                 for name in ("token_advantage", "old_values", "returns")}  # train-side estimators' [B, L-1]
    if per_token["token_advantage"] is not None:
        advantages = per_token["token_advantage"]  # [B, L-1]
    elif spans is not None and any(spans[i] for i in rows):
        advantages = token_advantages(row_adv, [len(prompts[i]) for i in rows], [spans[i] for i in rows], width)
    else:
        advantages = row_adv  # [B]: the outcome-only path, unchanged
    lengths = [len(prompts[i]) + len(responses[i]) for i in rows]
    return MicroBatch(
        input_ids=input_ids,
        attention_mask=attention,
        packed=pack(input_ids, lengths, loss_mask[:, 1:]) if packed else None,
        loss_mask=loss_mask[:, 1:],  # [B, L-1]: logits at t predict token t+1
        behaviour_logp=behaviour[:, 1:],  # [B, L-1]
        advantages=advantages,
        weights=torch.tensor([1.0 if w is None else w for w in (weight[i] for i in rows)], dtype=torch.float32),
        rows=list(rows),
        real_tokens=int(attention.sum()),
        old_values=per_token["old_values"],
        returns=per_token["returns"],
    )


def response_layout(per_row: list[list[float]], rows: list[int], prompts: list[list[int]], width: int) -> torch.Tensor:
    """Per-row values of the response tokens (per_row[i]: a list as long as row i's response_ids) for the micro-batch
    rows `rows`, laid out like loss_mask [B, L-1] of a batch `width` tokens wide: position t holds token t + 1's."""
    out = torch.zeros(len(rows), width, dtype=torch.float32)  # [B, L]
    for b, i in enumerate(rows):
        p = len(prompts[i])
        out[b, p : p + len(per_row[i])] = torch.tensor(per_row[i], dtype=torch.float32)
    return out[:, 1:]  # [B, L-1]


def response_values(values: torch.Tensor, mb: MicroBatch, prompt_lens: list[int],
                    response_lens: list[int]) -> list[list[float]]:
    """The inverse of the layout: [B, L-1] values -> per row, one float per response token (row order of mb)."""
    out = []
    for b, (p, r) in enumerate(zip(prompt_lens, response_lens, strict=True)):
        out.append(values[b, p - 1 : p - 1 + r].tolist())
    return out


def turn_layout(table: pa.Table) -> list[list[tuple[int, int, float | None]]]:
    """Per row, (gen_start, gen_len, reward_step) of each turn, response-relative: where GAE places step rewards
    and, at --gae-level turn, its steps. A row without turns is one turn over its whole response."""
    import pyarrow.compute as pc

    turns = table.column("turns")
    lengths = [n or 0 for n in pc.list_value_length(turns).to_pylist()]  # [N]
    flat = pc.list_flatten(turns)  # [T]
    starts, lens, rewards = (pc.struct_field(flat, k).to_pylist() for k in ("gen_start", "gen_len", "reward_step"))
    responses = table.column("response_tokens").to_pylist()
    out, at = [], 0
    for n, total in zip(lengths, responses, strict=True):
        spans = [(starts[k], lens[k], rewards[k]) for k in range(at, at + n) if lens[k]]
        out.append(spans or [(0, total, None)])
        at += n
    return out


def token_advantages(row_adv: torch.Tensor, prompt_lens: list[int], spans: list[list[TurnSpan] | None],
                     width: int) -> torch.Tensor:
    """Per-token advantages [B, L-1] laid out like loss_mask: position t holds the advantage of token t+1.

    Every position starts at its row's advantage; turn k's tokens, prompt_len + gen_start .. + gen_len,
    get A_k. Positions off the mask are never read by the loss.
    """
    adv = row_adv.unsqueeze(-1).repeat(1, width)  # [B, L]
    for b, (p, row_spans) in enumerate(zip(prompt_lens, spans, strict=True)):
        for start, length, value in row_spans or []:
            adv[b, p + start : p + start + length] = value
    return adv[:, 1:]  # [B, L-1]


HEAD_CHUNK_BYTES = HEAD_CHUNK_MB << 20  # train --head-chunk-mb's default


def _head_piece(head: Any, hidden: torch.Tensor, labels: torch.Tensor, temperature: float,
                with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    logits = head(hidden)  # [n, V]
    if temperature != 1.0:
        logits = logits / temperature
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = entropy_from_logits(logits.detach())  # [n]
    return token_logprobs(logits, labels), entropy  # [n] float32


def head_logprobs(head: Any, hidden: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0,
                  with_entropy: bool = False, chunk_bytes: int = HEAD_CHUNK_BYTES) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(labels) under head(hidden) / temperature, and the entropies with `with_entropy`: [N] each.

    Where the fp32 logits [N, V] would pass `chunk_bytes`, the rows go through the head in chunks of about
    that size, each under activation checkpointing: its logits are dropped after the log-probs are taken
    and computed again in the backward, so at most one chunk's logits (and their softmax) are alive at a
    time, for the head's forward run twice: the fused linear + cross-entropy of Liger and others, built of
    plain torch ops, so it runs on any device. chunk_bytes 0: one piece."""
    vocab = head.weight.shape[0] if hasattr(head, "weight") else head(hidden[:1]).shape[-1]
    rows = hidden.shape[0] if chunk_bytes <= 0 else max(1, chunk_bytes // (4 * vocab))
    if hidden.shape[0] <= rows:
        return _head_piece(head, hidden, labels, temperature, with_entropy)
    from torch.utils.checkpoint import checkpoint

    logps, entropies = [], []
    for start in range(0, hidden.shape[0], rows):
        h, y = hidden[start : start + rows], labels[start : start + rows]
        if torch.is_grad_enabled():
            logp, entropy = checkpoint(_head_piece, head, h, y, temperature, with_entropy, use_reentrant=False)
        else:
            logp, entropy = _head_piece(head, h, y, temperature, with_entropy)
        logps.append(logp)
        entropies.append(entropy)
    return torch.cat(logps), (torch.cat(entropies) if with_entropy else None)


def score_tokens(model: Any, mb: MicroBatch, with_entropy: bool = False, temperature: float = 1.0,
                 value_head: Any | None = None, head_chunk_bytes: int = HEAD_CHUNK_BYTES) -> tuple[torch.Tensor, ...]:
    """Log-probs (and optionally entropies) of the trained tokens, laid out densely as [B, L-1].

    Positions off the mask hold 0. Only the selected hidden states go through the LM head, in chunks of
    about `head_chunk_bytes` of logits (head_logprobs); `temperature`
    must be the sampling temperature the behaviour log-probs were recorded at. Models whose head does more
    than a linear map (logit soft-capping) are not supported by this shortcut.
    With a value head (a critic, arlctl/rl/value.py) the values of the same states come third, [B, L-1] float32:
    position t holds V of the state that sampled token t + 1.
    """
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.base_model
    if mb.packed is not None:  # one sequence of the rows end to end, attention within each row
        hidden = decoder(**mb.packed.decoder_kwargs()).last_hidden_state[0]  # [T, H]
        selected = hidden[mb.packed.index]  # [N, H]
        labels = mb.packed.input_ids[0, mb.packed.index + 1]  # [N]
    else:
        hidden = decoder(input_ids=mb.input_ids, attention_mask=mb.attention_mask).last_hidden_state  # [B, L, H]
        selected = hidden[:, :-1][mb.loss_mask]  # [N, H]
        labels = mb.input_ids[:, 1:][mb.loss_mask]  # [N]
    logp_flat, ent_flat = head_logprobs(model.get_output_embeddings(), selected, labels, temperature, with_entropy,
                                        head_chunk_bytes)  # [N], [N] | None
    logp = torch.zeros(mb.loss_mask.shape, dtype=logp_flat.dtype, device=logp_flat.device)  # [B, L-1]
    logp = logp.masked_scatter(mb.loss_mask, logp_flat)  # [B, L-1]
    entropy = None
    if with_entropy:
        entropy = torch.zeros_like(logp).masked_scatter(mb.loss_mask, ent_flat)  # [B, L-1]
    if value_head is None:
        return logp, entropy
    values_flat = value_head(selected).squeeze(-1).float()  # [N]
    values = torch.zeros(mb.loss_mask.shape, dtype=values_flat.dtype, device=values_flat.device)  # [B, L-1]
    return logp, entropy, values.masked_scatter(mb.loss_mask, values_flat)
