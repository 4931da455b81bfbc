"""The LM head in chunks (batching.head_logprobs, train --head-chunk-mb): the rows' logits are taken a
chunk at a time under activation checkpointing, so the [N, V] logits are never all alive, and the log-probs,
entropies and gradients equal the one-piece head's."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from arlctl.rl.batching import head_logprobs

N, H, V = 37, 16, 1000


def run(chunk_bytes: int, temperature: float = 0.7):
    torch.manual_seed(0)
    head = nn.Linear(H, V, bias=False)
    hidden = torch.randn(N, H, requires_grad=True)
    labels = torch.randint(0, V, (N,))
    weights = torch.rand(N)
    saved = []

    def pack(t):  # every tensor autograd keeps for the backward
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logp, entropy = head_logprobs(head, hidden, labels, temperature, True, chunk_bytes)
    (logp * weights).sum().backward()
    return logp.detach(), entropy, hidden.grad, head.weight.grad, max(saved), sum(saved)


@pytest.mark.parametrize("rows", [1, 5, 8, 36])
def test_chunked_head_equals_one_piece_and_keeps_no_whole_logits(rows):
    whole = run(0)
    chunked = run(rows * 4 * V)
    for name, a, b in zip(("logp", "entropy", "hidden grad", "weight grad"), whole[:4], chunked[:4], strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5), (name, (a - b).abs().max())
    logits = N * V * 4
    assert whole[4] >= logits  # one piece keeps the whole [N, V] logits (and their softmax) for the backward
    assert chunked[4] < logits and chunked[5] < logits  # chunked: no tensor, nor all together, is that large


def test_no_grad_scoring_is_chunked_too_and_a_zero_chunk_is_one_piece():
    head = nn.Linear(H, V, bias=False)
    hidden, labels = torch.randn(N, H), torch.randint(0, V, (N,))
    with torch.no_grad():
        one, _ = head_logprobs(head, hidden, labels, 1.0, False, 0)
        pieces, none = head_logprobs(head, hidden, labels, 1.0, False, 4 * 4 * V)
    assert none is None and torch.allclose(one, pieces, atol=1e-6)
