"""Cross-check: our train loss and gradient against TRL's GRPOTrainer on the same model and batch.

TRL's `GRPOTrainer._compute_loss` scores the completion with its own fused LM head and aggregates with its
`loss_type`; we run `stages.train.forward_backward` (micro-batching, masked scoring, `policy_loss`) on the
same rows written as trajectory rows. Settings map one to one:

  TRL loss_type "grpo"  <-> --loss-agg seq-mean-token-mean      TRL loss_type "bnpo" <-> token-mean
  epsilon / epsilon_high <-> eps_low / eps_high                 beta + ref model     <-> kl_coef (k3, initial policy;
                                                                                       use_bias_correction_kl=False)
  tool_mask              <-> response_mask 0 on env tokens      old_per_token_logps  <-> response_logprobs
  use_vllm + vllm_importance_sampling_correction (token_truncate, clip max) <-> --tis-cap
"""

from __future__ import annotations

import tempfile

import pytest
import torch

from arlctl.models import tiny_model_dir
from arlctl.rl.config import TrainConfig
from arlctl.rl.trainer_state import load_model
from arlctl.schemas.rows import TrajectoryRow, rows_to_table
from arlctl.stages.train import forward_backward

pytestmark = pytest.mark.slow  # importing TRL alone takes ~30 s on these shared cores

PROMPT_LEN = 6
COMPLETION_LENS = [10, 7, 12, 4]
ADVANTAGES = [1.0, -0.7, 0.4, -1.2]


@pytest.fixture(scope="module")
def setup():
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    path = tiny_model_dir()
    model = load_model(path)
    args = GRPOConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=4, num_generations=4,
                      beta=0.04, report_to=[], use_cpu=True, bf16=False, max_completion_length=16,
                      vllm_importance_sampling_mode="token_truncate",
                      use_bias_correction_kl=False)  # our k3 term is verl's: not multiplied by the ratio
    trainer = GRPOTrainer(model=model, reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
                          args=args, train_dataset=Dataset.from_list([{"prompt": "hi"}] * 4),
                          processing_class=AutoTokenizer.from_pretrained(path))
    trainer.current_gradient_accumulation_steps = 1  # set by the HF training loop, which we do not run
    # Move the policy away from the reference so the KL term is not zero.
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.02)

    # One batch: equal-length prompts (no left padding), right-padded completions with env spans masked.
    gen = torch.Generator().manual_seed(0)
    width = max(COMPLETION_LENS)
    prompt_ids = torch.randint(0, 5000, (4, PROMPT_LEN), generator=gen)
    completion_ids = torch.randint(0, 5000, (4, width), generator=gen)
    completion_mask = torch.zeros(4, width, dtype=torch.long)
    tool_mask = torch.ones(4, width, dtype=torch.long)
    for b, n in enumerate(COMPLETION_LENS):
        completion_mask[b, :n] = 1
        tool_mask[b, 2 : min(n, 5)] = 0  # an observation span inside the completion
    inputs = {"prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids),
              "completion_ids": completion_ids, "completion_mask": completion_mask, "tool_mask": tool_mask,
              "advantages": torch.tensor(ADVANTAGES)}
    with torch.no_grad():
        ids = torch.cat([prompt_ids, completion_ids], 1)
        attn = torch.cat([inputs["prompt_mask"], completion_mask], 1)
        trainer_logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attn, width)
        ref_logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.ref_model, ids, attn, width)
    # Behaviour log-probs as a rollout engine would record them: near the trainer's, with spread enough
    # that some ratios fall outside the clip band on both sides.
    mask = completion_mask * tool_mask
    behaviour = (trainer_logps + torch.randn(trainer_logps.shape, generator=gen) * 0.3) * mask
    rows = [
        TrajectoryRow(group_id="g", sample_index=b, task_id="t", env="test", env_version="1", task={}, policy="tiny",
                      prompt_text="", prompt_ids=prompt_ids[b].tolist(), response_ids=completion_ids[b, :n].tolist(),
                      response_mask=mask[b, :n].tolist(), response_logprobs=behaviour[b, :n].tolist(),
                      reward=0.0, advantage=ADVANTAGES[b], weight=1.0)
        for b, n in enumerate(COMPLETION_LENS)
    ]
    table = rows_to_table(rows)
    return trainer, inputs, behaviour, trainer_logps, ref_logps, table, load_model(path)


def _grads(model) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


CASES = [
    # (TRL loss_type, our loss_agg, eps_low, eps_high, beta, tis_cap)
    ("grpo", "seq-mean-token-mean", 0.2, 0.28, 0.0, None),
    ("bnpo", "token-mean", 0.2, 0.2, 0.0, None),
    ("grpo", "seq-mean-token-mean", 0.1, 0.3, 0.04, None),
    ("bnpo", "token-mean", 0.2, 0.28, 0.0, 1.5),
]


@pytest.mark.parametrize("loss_type, loss_agg, eps_low, eps_high, beta, tis_cap", CASES)
def test_loss_and_gradient_match_trl(setup, loss_type, loss_agg, eps_low, eps_high, beta, tis_cap):
    trainer, inputs, behaviour, trainer_logps, ref_logps, table, ref_model = setup
    trainer.loss_type, trainer.epsilon_low, trainer.epsilon_high, trainer.beta = loss_type, eps_low, eps_high, beta
    batch = dict(inputs, ref_per_token_logps=ref_logps)
    mask = inputs["completion_mask"] * inputs["tool_mask"]
    if tis_cap is None:
        trainer.use_vllm = trainer.vllm_importance_sampling_correction = False
        batch["old_per_token_logps"] = behaviour
    else:  # TRL's token_truncate path, as in _generate_and_score_completions
        trainer.use_vllm = trainer.vllm_importance_sampling_correction = True
        batch["old_per_token_logps"] = trainer_logps
        batch["importance_sampling_ratio"] = torch.exp((trainer_logps - behaviour) * mask).clamp(max=tis_cap)
    model = trainer.model
    model.zero_grad(set_to_none=True)
    trl_loss = trainer.compute_loss(model, batch)
    trl_loss.backward()
    trl_grad = _grads(model)

    model.zero_grad(set_to_none=True)
    # A small token budget splits the batch into several micro-batches: accumulation must be exact.
    cfg = TrainConfig(loss_agg=loss_agg, eps_low=eps_low, eps_high=eps_high, kl_coef=beta, tis_cap=tis_cap,
                      micro_tokens=36)
    ours = forward_backward(model, ref_model if beta else None, table, cfg)
    assert ours["micro_batches"] > 1
    our_grad = _grads(model)
    model.zero_grad(set_to_none=True)

    assert ours["loss"] == pytest.approx(trl_loss.item(), abs=1e-5)
    torch.testing.assert_close(our_grad, trl_grad, atol=1e-5, rtol=1e-4)
    clipped = sum(float(s["clip_frac_low"] + s["clip_frac_high"]) for s in ours["sums"])
    if tis_cap is None:
        assert clipped > 0, "the batch should exercise clipping"
