"""LoRA (arlctl/rl/lora.py) on a tiny random Llama: what trains, the base policy as KL reference, the merged
weights against peft's own merge, and the adapter directory peft loads back."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from arlctl.errors import UsageError
from arlctl.rl.batching import collate, score_tokens
from arlctl.rl.lora import (
    adapter_state_dict,
    apply_lora,
    is_lora,
    merged_state_dict,
    reference_scope,
    write_adapter_dir,
)

pytest.importorskip("peft")

RANK, ALPHA, TARGETS = 4, 8.0, ["q_proj", "v_proj", "down_proj"]


def tiny_llama(tied: bool, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         initializer_range=0.2, tie_word_embeddings=tied)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def micro_batch():
    # two rows; the loss covers response tokens whose mask is 1
    cols = {"prompt_ids": [[5, 17, 42], [9, 8]], "response_ids": [[100, 7, 250, 3], [64, 65, 66]],
            "response_mask": [[1, 0, 1, 1], [1, 1, 1]], "response_logprobs": [[0.0] * 4, [0.0] * 3],
            "advantage": [1.0, -1.0], "weight": [1.0, 1.0]}
    return collate(cols, [0, 1])


def logits(model, mb):
    with torch.no_grad():
        return model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits  # [B, L, V]


def train_one_step(model, mb):
    """One AdamW step on an advantage-weighted log-likelihood computed through score_tokens."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    logp, _ = score_tokens(model, mb)  # [B, L-1]
    loss = -(logp * mb.advantages[:, None]).sum() / mb.loss_mask.sum()
    loss.backward()
    optimizer.step()


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def trained(request):
    """(plain base model, LoRA model after one step, LoRA state dict before the step, micro-batch)."""
    base = tiny_llama(request.param)
    torch.manual_seed(1)
    model = apply_lora(tiny_llama(request.param), RANK, ALPHA, TARGETS)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    mb = micro_batch()
    train_one_step(model, mb)
    return base, model.eval(), before, mb


def test_only_the_adapters_require_grad_and_change(trained):
    _, model, before, _ = trained
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    # 2 layers x 3 targets x (A, B)
    assert len(trainable) == 2 * 3 * 2
    after = model.state_dict()
    assert after.keys() == before.keys()
    for key, tensor in after.items():
        if ".lora_" in key:
            assert not torch.equal(tensor, before[key]), f"{key} did not train"
        else:
            assert torch.equal(tensor, before[key]), f"{key} changed"


def test_adapter_init_is_drawn_from_the_torch_rng():
    def adapters(seed: int) -> dict[str, torch.Tensor]:
        model = tiny_llama(True)  # seeds the RNG itself: seed the adapters after it
        torch.manual_seed(seed)
        return apply_lora(model, RANK, ALPHA, TARGETS).state_dict()

    first, second, third = adapters(3), adapters(3), adapters(4)
    assert all(torch.equal(first[k], second[k]) for k in first)
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight"
    assert not torch.equal(first[key], third[key])


def test_score_tokens_on_the_peft_model_matches_its_full_forward(trained):
    _, model, _, mb = trained
    with torch.no_grad():
        logp, _ = score_tokens(model, mb)  # [B, L-1]
    full = torch.log_softmax(logits(model, mb)[:, :-1], dim=-1)  # [B, L-1, V]
    expected = full.gather(-1, mb.input_ids[:, 1:, None])[..., 0] * mb.loss_mask  # [B, L-1]
    torch.testing.assert_close(logp, expected, rtol=0, atol=1e-5)


def test_reference_scope_computes_the_base_model(trained):
    base, model, _, mb = trained
    assert is_lora(model) and not is_lora(base)
    adapted = logits(model, mb)
    assert (adapted - logits(base, mb)).abs().max() > 1e-3  # the step moved the policy
    requires_grad = [p.requires_grad for p in model.parameters()]
    with torch.no_grad(), reference_scope(model):
        torch.testing.assert_close(logits(model, mb), logits(base, mb), rtol=0, atol=1e-6)
        ref_logp, _ = score_tokens(model, mb)
    torch.testing.assert_close(ref_logp, score_tokens(base, mb)[0].detach(), rtol=0, atol=1e-6)
    # adapters back on, and the same parameters train
    torch.testing.assert_close(logits(model, mb), adapted, rtol=0, atol=0)
    assert [p.requires_grad for p in model.parameters()] == requires_grad


def test_reference_scope_refuses_a_model_without_lora():
    with pytest.raises(TypeError, match="LoRA"), reference_scope(tiny_llama(True)):
        pass


def test_merged_state_dict_by_hand():
    # W = [[1, 2], [3, 4]] (bf16), A = [[1, 0]] (rank 1), B = [[0.5], [1]], alpha 2 -> scale 2 / 1 = 2
    # B @ A = [[0.5, 0], [1, 0]]; W' = W + 2 * B @ A = [[2, 2], [5, 4]]
    sd = {"base_model.model.mlp.up.base_layer.weight": torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.bfloat16),
          "base_model.model.mlp.up.base_layer.bias": torch.tensor([7.0, 8.0]),
          "base_model.model.mlp.up.lora_A.default.weight": torch.tensor([[1.0, 0.0]]),
          "base_model.model.mlp.up.lora_B.default.weight": torch.tensor([[0.5], [1.0]]),
          "base_model.model.norm.weight": torch.tensor([1.5])}
    merged = merged_state_dict(sd, alpha=2.0, rank=1)
    assert list(merged) == ["mlp.up.weight", "mlp.up.bias", "norm.weight"]
    assert merged["mlp.up.weight"].dtype == torch.bfloat16
    assert merged["mlp.up.weight"].tolist() == [[2.0, 2.0], [5.0, 4.0]]
    assert merged["mlp.up.bias"].tolist() == [7.0, 8.0] and merged["norm.weight"].tolist() == [1.5]
    with pytest.raises(ValueError, match="without a base weight"):  # an adapter-only state dict
        merged_state_dict(adapter_state_dict(sd), alpha=2.0, rank=1)


def test_merged_state_dict_equals_peft_merge_and_the_lora_model(trained):
    base, model, _, mb = trained
    merged = merged_state_dict(model.state_dict(), ALPHA, RANK)
    assert merged.keys() == base.state_dict().keys()  # plain HF names, lm_head kept as the input had it
    # independently: W + (alpha / rank) * B @ A in float64 for every adapted module
    adapted = 0
    for name, module in model.named_modules():
        if hasattr(module, "lora_A") and "default" in module.lora_A:
            w = module.base_layer.weight.double()
            delta = module.lora_B["default"].weight.double() @ module.lora_A["default"].weight.double()
            key = name.removeprefix("base_model.model.") + ".weight"
            torch.testing.assert_close(merged[key].double(), w + ALPHA / RANK * delta, rtol=0, atol=1e-6)
            adapted += 1
    assert adapted == 2 * len(TARGETS)
    # the merged weights in a plain model give the LoRA model's logits
    plain = tiny_llama(base.config.tie_word_embeddings, seed=9)
    plain.load_state_dict(merged, strict=True)
    torch.testing.assert_close(logits(plain, mb), logits(model, mb), rtol=0, atol=1e-5)
    # and equal peft's own merge
    peft_merged = copy.deepcopy(model).merge_and_unload().state_dict()
    assert peft_merged.keys() == merged.keys()
    for key, tensor in peft_merged.items():
        torch.testing.assert_close(merged[key], tensor, rtol=0, atol=1e-6)


def test_adapter_dir_round_trips_through_peft(trained, tmp_path):
    from peft import PeftModel
    from safetensors.torch import load_file

    base, model, _, mb = trained
    adapter = adapter_state_dict(model.state_dict())
    # the names peft's own save_pretrained writes
    model.save_pretrained(tmp_path / "peft")
    peft_saved = load_file(tmp_path / "peft" / "adapter_model.safetensors")
    assert adapter.keys() == peft_saved.keys()
    assert all(torch.equal(adapter[k], peft_saved[k]) for k in adapter)
    assert adapter_state_dict(adapter).keys() == adapter.keys()  # idempotent: the trainer may pass either

    directory = tmp_path / "adapter"
    write_adapter_dir(directory, adapter, "/policies/base", RANK, ALPHA, TARGETS)
    config = json.loads((directory / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (RANK, ALPHA, "LORA")
    assert sorted(config["target_modules"]) == sorted(TARGETS)
    assert config["base_model_name_or_path"] == "/policies/base" and config["bias"] == "none"

    loaded = PeftModel.from_pretrained(copy.deepcopy(base), directory).eval()
    torch.testing.assert_close(logits(loaded, mb), logits(model, mb), rtol=0, atol=1e-5)


@pytest.mark.parametrize("target", ["gate_prj", "embed_tokens"])
def test_a_target_that_is_no_linear_module_is_a_usage_error(target):
    with pytest.raises(UsageError, match=target) as raised:
        apply_lora(tiny_llama(False), RANK, ALPHA, ["q_proj", target])
    for name in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"):
        assert name in str(raised.value)


def test_a_tied_lm_head_is_no_target():
    with pytest.raises(UsageError, match="tied"):
        apply_lora(tiny_llama(True), RANK, ALPHA, ["lm_head"])
    assert is_lora(apply_lora(tiny_llama(False), RANK, ALPHA, ["lm_head"]))  # untied: an ordinary linear layer
