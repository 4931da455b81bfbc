"""Padding-free micro-batches: rows laid end to end in one sequence, each attending only to itself.

A padded micro-batch of B rows costs B x longest tokens in every layer; agent trajectories differ in length
by 10x and more, so most of that is padding. A packed micro-batch is one sequence [1, T] of its rows' real
tokens (T = the sum of their lengths) with per-row position ids restarting at 0, and attention confined
to each row.

How attention is confined: the trainer's models use the attention implementation `ROWS` (registered with
transformers' AttentionInterface when this module is imported). Given the packed rows' boundaries
(`cu_seq_lens_q`, the keyword transformers' flash-attention path reads), it runs causal SDPA on each row's
slice of the sequence and nothing across rows: compute and memory are sum(L_i^2), never T^2, and no dense
block-diagonal mask is ever built. Without boundaries (a padded micro-batch, generation) it is plain SDPA
with transformers' own mask, so one model serves both paths. On CUDA with flash-attn installed the
trainer chooses `flash_attention_2` instead, whose varlen kernel reads the same boundaries.

Whether a model packs is not assumed from its class: `check_packing` proves it on the model's own
weights before the first step (a row's log-probs are bit-identical whatever its neighbour holds, agree
wherever in the sequence it is packed, and in fp32 equal the padded path's). Sliding-window attention and soft-capped logits are refused up front: a probe too
short to reach the window could not tell.

The loss never sees the packing: `score_tokens` gathers the trained positions of the packed sequence and
scatters their log-probs into the padded [B, L-1] layout every loss mode reads (`Packed.index`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

ROWS = "arlctl_rows"


@dataclass
class Packed:
    """The packed form of a micro-batch (MicroBatch.packed)."""

    input_ids: torch.Tensor  # [1, T] the rows' tokens end to end
    position_ids: torch.Tensor  # [1, T] 0..len-1 within each row
    cu_seq_lens: torch.Tensor  # [B+1] int32 row boundaries in the packed sequence
    max_length: int  # the longest row
    index: torch.Tensor  # [N] packed position of the state predicting each trained token, loss_mask's order

    def to(self, device: torch.device | str) -> Packed:
        for name in ("input_ids", "position_ids", "cu_seq_lens", "index"):
            setattr(self, name, getattr(self, name).to(device, non_blocking=True))
        return self

    def decoder_kwargs(self) -> dict[str, Any]:
        return {"input_ids": self.input_ids, "position_ids": self.position_ids, "attention_mask": None,
                "cu_seq_lens_q": self.cu_seq_lens, "cu_seq_lens_k": self.cu_seq_lens,
                "max_length_q": self.max_length, "max_length_k": self.max_length}


def pack(input_ids: torch.Tensor, lengths: list[int], loss_mask: torch.Tensor) -> Packed:
    """Packed form of right-padded `input_ids` [B, L] whose row b has lengths[b] real tokens;
    loss_mask [B, L-1] is the padded micro-batch's (True where token t+1 is trained)."""
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    ids = torch.cat([input_ids[b, :n] for b, n in enumerate(lengths)]).unsqueeze(0)  # [1, T]
    positions = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)  # [1, T]
    rows, cols = loss_mask.nonzero(as_tuple=True)  # row-major: masked_scatter's order
    offsets = torch.tensor(starts[:-1], dtype=torch.long)  # [B]
    return Packed(input_ids=ids, position_ids=positions, cu_seq_lens=torch.tensor(starts, dtype=torch.int32),
                  max_length=max(lengths), index=offsets[rows] + cols)


def plan_packed(lengths: list[int], micro_tokens: int) -> list[list[int]]:
    """Row indices grouped so that each group's real tokens sum to <= micro_tokens (a longer row goes alone):
    longest first, each row into the first group it fits (first-fit decreasing)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    loads: list[int] = []
    for i in order:
        for g, load in enumerate(loads):
            if load + lengths[i] <= micro_tokens:
                groups[g].append(i)
                loads[g] += lengths[i]
                break
        else:
            groups.append([i])
            loads.append(lengths[i])
    return groups


# ------------------------------------------------------------------------------ the attention implementation


@torch.compiler.disable  # a Python loop over the rows: run eager inside a compiled layer (train --compile)
def rows_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                   **kwargs: Any) -> tuple[torch.Tensor, None]:
    """query [1, Hq, T, D], key/value [1, Hkv, T, D] -> ([1, T, Hq, D], None): causal SDPA within each packed
    row, or transformers' SDPA when no row boundaries are given."""
    bounds = kwargs.get("cu_seq_lens_q")
    if bounds is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    gqa = query.shape[1] != key.shape[1]
    p = dropout if module.training else 0.0
    edges = bounds.tolist()
    out = torch.cat([F.scaled_dot_product_attention(query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], dropout_p=p,
                                                    is_causal=True, scale=scaling, enable_gqa=gqa)
                     for s, e in zip(edges[:-1], edges[1:], strict=True)], dim=2)  # [1, Hq, T, D]
    return out.transpose(1, 2).contiguous(), None


def rows_mask(**kwargs: Any) -> torch.Tensor | None:
    """The mask of `ROWS`: none for a packed sequence (rows_attention confines attention itself), SDPA's for
    a padded batch."""
    if kwargs.get("attention_mask") is None:
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(**kwargs)


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ROWS, rows_attention)
    AttentionMaskInterface.register(ROWS, rows_mask)


_register()


def unsupported(config: Any) -> str | None:
    """Why a model of this config cannot pack, or None."""
    window = getattr(config, "sliding_window", None)
    if window and getattr(config, "use_sliding_window", True) is not False:
        return f"sliding-window attention ({window} tokens)"
    if getattr(config, "attn_logit_softcapping", None):
        return "soft-capped attention logits"
    return None


def attention_for(device: torch.device) -> str:
    """The attention implementation the trainer's models use: flash-attention's varlen kernel on CUDA where
    flash-attn is installed, else ROWS (SDPA per packed row)."""
    if device.type == "cuda":
        import importlib.util

        if importlib.util.find_spec("flash_attn") is not None:
            return "flash_attention_2"
    return ROWS


def use_rows_attention(lm: Any, device: torch.device) -> str | None:
    """Switch an HF model to `attention_for(device)`; returns why it cannot pack, or None once switched."""
    lm = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
    why = unsupported(lm.config)
    if why is not None:
        return why
    try:
        lm.set_attn_implementation(attention_for(device))
    except (ValueError, ImportError, AttributeError) as exc:
        return f"{type(lm).__name__} takes no custom attention ({exc})"
    return None


# How far the probe's log-probs may move where only summation order differs: a row packed first vs packed
# second (both precisions), and packed vs padded (fp32 only: in bf16 the padded path's masked SDPA rounds
# differently, 0.22 nats apart on SmolLM2 where packed rows agree bit for bit). A row attending to its
# neighbour is caught bit-exactly, not by these.
PROBE_TOL = {"fp32": 1e-4, "bf16": 5e-2}
PADDED_TOL = {"fp32": 1e-4, "bf16": None}


def probe_columns(vocab: int, first: int) -> dict[str, list]:
    """Two rows of fixed tokens (the first row's ids offset by `first`): 5 + 6 and 3 + 9 tokens, every
    response token trained."""
    def ids(n: int, at: int) -> list[int]:
        return [(at + 7 * k) % vocab for k in range(n)]

    prompts, responses = [ids(5, first), ids(3, 11)], [ids(6, first + 3), ids(9, 17)]
    return {"prompt_ids": prompts, "response_ids": responses, "response_mask": [[1] * len(r) for r in responses],
            "response_logprobs": [[0.0] * len(r) for r in responses], "advantage": [0.0, 0.0], "weight": [1.0, 1.0]}


def _reshard(module: Any) -> None:
    """FSDP2 keeps a root's gathered parameters after a forward, for the backward that follows; the probe
    has none, so give them back (a no-op for any other module)."""
    from torch.distributed.fsdp import FSDPModule

    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def check_packing(module: Any, device: torch.device, precision: str = "fp32") -> str | None:
    """Prove that the trainer's scoring module packs, on its own weights; returns why not, or None.

    Two rows A, B are scored packed as [A, B]; then as [A', B] with A's tokens changed, where B's log-probs
    must be bit-identical (attention never crosses rows); then as [B, A], where B, now at offset 0, must
    agree within PROBE_TOL (its positions restart); in fp32 also the padded path, within PADDED_TOL. Four
    forwards of 23 tokens or fewer; under FSDP2 every rank runs them."""
    from arlctl.rl.batching import collate
    from arlctl.rl.distributed import unwrap

    vocab = unwrap(module).lm.get_input_embeddings().num_embeddings
    training = module.training
    module.eval()
    try:
        with torch.no_grad():
            cols, other = probe_columns(vocab, 3), probe_columns(vocab, 29)
            packed = module(collate(cols, [0, 1], packed=True).to(device))[0]  # [2, L-1]
            neighbour = module(collate(other, [0, 1], packed=True).to(device))[0]
            swapped = module(collate(cols, [1, 0], packed=True).to(device))[0]
            padded = module(collate(cols, [0, 1]).to(device))[0] if PADDED_TOL[precision] else None
    finally:
        module.train(training)
        _reshard(module)
    if not torch.equal(packed[1], neighbour[1]):
        return "a row's log-probs change with the row packed beside it: attention crosses rows"
    gap = float((packed[1] - swapped[0]).abs().max())
    if not gap <= PROBE_TOL[precision]:
        return f"a row's log-probs move by {gap:.2e} when it is packed first: its positions do not restart"
    if padded is not None:
        gap = float((packed - padded).abs().max())
        if not gap <= PADDED_TOL[precision]:
            return f"packed log-probs differ from padded ones by {gap:.2e} (more than {PADDED_TOL[precision]:g})"
    return None
