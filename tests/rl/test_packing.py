"""Packed micro-batches (train --pack, issue 29): the plan and layout by hand, then packed = padded on a
real random Llama (loss and gradients to 1e-5 in every aggregation mode, with the KL reference), the probe
caught by an attention that leaks across rows, and the careless user's model that cannot pack."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

from arlctl.errors import UsageError
from arlctl.rl import packing
from arlctl.rl.batching import collate, score_tokens
from arlctl.rl.config import TrainConfig
from arlctl.rl.distributed import ScoringModel
from arlctl.rl.trainer_state import load_model
from arlctl.schemas.rows import TrajectoryRow, rows_to_table
from arlctl.stages.train import forward_backward, train
from arlctl.synthetic import synthetic_table
from tests.distributed.common import (
    make_uneven_batches,
    max_diff,
    near_policy,
    set_column,
    small_init_model,
    weights,
)

CPU = torch.device("cpu")
AGGS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def test_plan_packed_is_first_fit_decreasing_under_the_budget():
    # longest first: 9(1) -> g0; 8(3): 17 > 12 -> g1; 5(0): 14, 13 > 12 -> g2; 3(2): g0 = 12; 2(4): g0 14, g1 = 10
    assert packing.plan_packed([5, 9, 3, 8, 2], 12) == [[1, 2], [3, 4], [0]]
    assert packing.plan_packed([50, 4], 10) == [[0], [1]]  # a row over the budget goes alone


def test_pack_lays_rows_end_to_end_and_indexes_the_trained_tokens():
    long = TrajectoryRow(group_id="g", sample_index=0, task_id="t", env="e", env_version="1", task={}, policy="p",
                         prompt_text="", prompt_ids=[11, 12], response_ids=[21, 22, 23], response_mask=[1, 0, 1],
                         response_logprobs=[-0.1, 0.0, -0.3], reward=1.0, advantage=0.5)
    short = TrajectoryRow(group_id="g", sample_index=1, task_id="t", env="e", env_version="1", task={}, policy="p",
                          prompt_text="", prompt_ids=[11], response_ids=[31], response_mask=[1],
                          response_logprobs=[-0.2], reward=0.0, advantage=-0.5)
    mb = collate(rows_to_table([long, short]), [0, 1], packed=True)
    p = mb.packed
    assert p.input_ids.tolist() == [[11, 12, 21, 22, 23, 11, 31]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1]]
    assert p.cu_seq_lens.tolist() == [0, 5, 7] and p.max_length == 5
    # loss_mask [[F, T, F, T], [T, F, F, F]]: packed states 1, 3 (row 0) and 5 (row 1) predict 21, 23, 31
    assert p.index.tolist() == [1, 3, 5]
    assert p.input_ids[0, p.index + 1].tolist() == [21, 23, 31]
    assert mb.forward_tokens == 7 and collate(rows_to_table([long, short]), [0, 1]).forward_tokens == 10


def gqa_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    model = LlamaForCausalLM(config).float()
    assert packing.use_rows_attention(model, CPU) is None
    return model


def test_packed_log_probs_equal_padded_ones_with_grouped_query_attention():
    model = gqa_llama()
    table = synthetic_table(3, group_size=3, seed=5, mean_turns=3, tokens_per_turn=12)
    cols = {k: table.column(k).to_pylist() for k in ("prompt_ids", "response_ids", "response_mask",
                                                      "response_logprobs", "advantage", "weight")}
    cols["prompt_ids"] = [[t % 300 for t in ids] for ids in cols["prompt_ids"]]
    cols["response_ids"] = [[t % 300 for t in ids] for ids in cols["response_ids"]]
    rows = list(range(table.num_rows))
    padded, packed = collate(cols, rows), collate(cols, rows, packed=True)
    assert packed.forward_tokens < padded.forward_tokens  # the lengths differ: padding was there to save
    with torch.no_grad():
        torch.testing.assert_close(score_tokens(model, packed)[0], score_tokens(model, padded)[0],
                                   atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("packing")
    model_dir = small_init_model(root)
    table = near_policy(synthetic_table(4, group_size=3, seed=3, mean_turns=3, tokens_per_turn=16), model_dir)
    table = set_column(table, "advantage", [(-1.0) ** i * (0.5 + 0.1 * i) for i in range(table.num_rows)])
    table = set_column(table, "weight", [0.5 + 0.25 * (i % 4) for i in range(table.num_rows)])
    lengths = [p + r for p, r in zip(table.column("prompt_tokens").to_pylist(),
                                     table.column("response_tokens").to_pylist(), strict=True)]
    assert max(lengths) > 2 * min(lengths), "the rows must differ in length for padding to matter"
    return root, model_dir, table


@pytest.mark.slow
@pytest.mark.parametrize("agg", AGGS)
def test_packed_loss_and_gradient_equal_padded_in_every_aggregation_mode(small, agg):
    _, model_dir, table = small
    cfg = TrainConfig(loss_agg=agg, kl_coef=0.05, micro_tokens=256, device="cpu")
    grads, losses = {}, {}
    for packed in (False, True):
        model = load_model(model_dir)
        assert packing.use_rows_attention(model, CPU) is None
        ref = copy.deepcopy(model).requires_grad_(False).eval()
        out = forward_backward(model, ref, table, cfg, packed=packed)
        losses[packed], grads[packed] = out, {n: p.grad.clone() for n, p in model.named_parameters()}
    assert losses[True]["forward_tokens"] < losses[False]["forward_tokens"]
    assert losses[True]["seq_tokens"] == losses[False]["seq_tokens"]
    assert losses[True]["micro_batches"] < losses[False]["micro_batches"]
    assert abs(losses[True]["loss"] - losses[False]["loss"]) < 1e-5
    largest = max(float(g.abs().max()) for g in grads[False].values())
    assert largest > 1e-3, "the gradient must be large enough for the comparison to mean something"
    gap = max_diff(grads[True], grads[False])
    print(f"{agg}: loss {losses[True]['loss']:.6f}, max |grad packed - padded| = {gap:.2e} (largest {largest:.2e})")
    assert gap < 1e-5


def leaky_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """An attention that ignores the row boundaries: one causal pass over the whole packed sequence."""
    if kwargs.get("cu_seq_lens_q") is None:
        return packing.rows_attention(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling,
                                                           enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


def test_the_probe_passes_a_packing_model_and_catches_attention_across_rows():
    module = ScoringModel(gqa_llama())
    assert packing.check_packing(module, CPU) is None
    AttentionInterface.register(packing.ROWS, leaky_attention)
    try:
        why = packing.check_packing(module, CPU)
    finally:
        AttentionInterface.register(packing.ROWS, packing.rows_attention)
    assert why is not None and "attention crosses rows" in why
    assert module.training  # the probe restores the mode it found
    # bf16 weights: packed rows still agree bit for bit; the padded path, rounded differently, is not compared
    assert packing.check_packing(ScoringModel(gqa_llama().to(torch.bfloat16)), CPU, "bf16") is None


@pytest.fixture(scope="module")
def sliding_model(tmp_path_factory):
    from transformers import AutoTokenizer

    from arlctl.models import tiny_model_dir

    dest = tmp_path_factory.mktemp("sliding") / "mistral"
    torch.manual_seed(0)
    config = MistralConfig(vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1, sliding_window=8)
    MistralForCausalLM(config).save_pretrained(dest)
    AutoTokenizer.from_pretrained(tiny_model_dir()).save_pretrained(dest)
    return dest


@pytest.mark.slow
def test_a_sliding_window_model_is_padded_under_auto_and_refused_under_on(small, sliding_model, tmp_path):
    root, _, _ = small
    batches = make_uneven_batches(tmp_path, small_init_model(root), n_batches=1)
    assert "sliding-window" in packing.use_rows_attention(load_model(sliding_model), CPU)
    summary = train(batches, str(sliding_model), str(tmp_path / "auto"), TrainConfig(device="cpu", max_steps=1))
    assert summary["steps"] == 1
    assert summary["packing"].startswith("padded: the policy model cannot pack (sliding-window attention")
    with pytest.raises(UsageError, match="--pack on: the policy model cannot pack"):
        train(batches, str(sliding_model), str(tmp_path / "on"), TrainConfig(device="cpu", pack="on"))


@pytest.mark.slow
def test_train_packs_by_default_and_reaches_the_padded_weights(small, tmp_path):
    root, model_dir, _ = small
    batches = make_uneven_batches(tmp_path, model_dir, n_batches=2)
    settings = dict(device="cpu", lr=3e-4, kl_coef=0.05, micro_tokens=160)
    runs = {}
    for pack in ("auto", "off"):
        summary = train(batches, str(model_dir), str(tmp_path / pack), TrainConfig(pack=pack, **settings))
        assert summary["steps"] == 2
        runs[pack] = summary
    assert runs["auto"]["packing"] == "packed" and runs["off"]["packing"] == "padded (--pack off)"
    from arlctl.io.ledger import latest_checkpoint

    gap = max_diff(weights(latest_checkpoint(tmp_path / "auto")[1]), weights(latest_checkpoint(tmp_path / "off")[1]))
    print(f"2 steps packed vs padded: max |w| gap {gap:.2e}")
    assert gap < 1e-5
