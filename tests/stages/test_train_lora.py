"""`arlctl train --lora-rank` end to end (issue 15): only adapters train and are checkpointed, the KL
reference is the model with adapters disabled, and the published merged weights are base + (alpha/r) B A and
roll out with the hf backend."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import torch
from inprocess import arlctl
from safetensors.torch import load_file
from torch.distributed.checkpoint import FileSystemReader

from arlctl.io.ledger import latest_checkpoint, read_state
from arlctl.io.shards import list_shards, read_shard
from arlctl.models import tiny_model_dir
from arlctl.rl import distributed as dd
from arlctl.rl.config import TrainConfig
from arlctl.rl.trainer_state import TrainerState
from arlctl.stages.sync import sync
from arlctl.stages.train import train
from tests.stages.test_train import make_batches

LORA = dict(lora_rank=4, lora_alpha=8.0, lora_targets="q_proj,v_proj", lr=1e-2, kl_coef=0.1, device="cpu")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    batches = make_batches(root, 3)
    out, metrics = root / "ckpt", root / "metrics"
    summary = train(batches, str(tiny_model_dir()), str(out), TrainConfig(save_every=1, **LORA), metrics_url=str(metrics))
    assert summary["steps"] == 3 and summary["skipped_nonfinite"] == 0
    return root, batches, out, metrics


@pytest.mark.slow
def test_only_adapters_change_and_are_checkpointed(trained):
    _, _, out, _ = trained
    step, ckpt = latest_checkpoint(out)
    base, merged = load_file(str(tiny_model_dir() / "model.safetensors")), load_file(str(ckpt / "model.safetensors"))
    assert merged.keys() == base.keys()
    changed = {k for k in base if not torch.equal(base[k], merged[k])}
    assert changed and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in changed), changed
    assert len(changed) == 4  # q and v of both layers
    # The trainer's checkpoint holds the adapters and their optimizer state, nothing of the base.
    keys = FileSystemReader(str(ckpt / "trainer")).read_metadata().state_dict_metadata.keys()
    model_keys = [k for k in keys if k.startswith("model.")]
    assert model_keys and all(".lora_A." in k or ".lora_B." in k for k in model_keys), [
        k for k in model_keys if "lora" not in k]
    assert read_state(ckpt)["config"]["lora_rank"] == 4


@pytest.mark.slow
def test_published_merged_weights_are_base_plus_scaled_ba(trained):
    _, _, out, _ = trained
    step, ckpt = latest_checkpoint(out)
    # Resume the trainer from its checkpoint: its adapters are the trained ones.
    state = read_state(ckpt)
    trainer = TrainerState.open(str(out), ckpt, state, tiny_model_dir(), TrainConfig(save_every=1, **LORA), dd.Dist())
    params = dict(trainer.lm.named_parameters())
    base = load_file(str(tiny_model_dir() / "model.safetensors"))
    merged = load_file(str(ckpt / "model.safetensors"))
    scale = LORA["lora_alpha"] / LORA["lora_rank"]
    for layer in range(2):
        for proj in ("q_proj", "v_proj"):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            a, b = params[f"{prefix}.lora_A.default.weight"], params[f"{prefix}.lora_B.default.weight"]
            assert float(b.abs().max()) > 0, "B starts at 0: it must have trained"
            key = f"model.layers.{layer}.self_attn.{proj}.weight"
            expected = base[key].double() + scale * (b.double() @ a.double())
            assert float((merged[key].double() - expected).abs().max()) < 1e-6


def test_kl_reference_is_the_model_with_adapters_disabled(trained):
    _, _, _, metrics = trained
    rows = sorted(pq.read_table(str(metrics)).to_pylist(), key=lambda r: r["step"])
    # Step 1: B = 0, so the adapted model IS the base: KL to the reference exactly 0. Later: > 0.
    assert rows[0]["ref_kl"] == 0.0
    assert rows[-1]["ref_kl"] > 0.0


@pytest.mark.slow
def test_merged_policy_rolls_out_with_the_hf_backend(trained, tmp_path):
    root, _, out, _ = trained
    policy = tmp_path / "policy"
    assert sync(str(out), str(policy))["published"]
    result = arlctl("rollout", "--env", "math", "--tasks", "builtin:math?n=2&seed=0", "--policy", policy,
                    "--backend", "hf", "--out", tmp_path / "rollouts", "-G", "2", "--max-turns", "1",
                    "--max-new-tokens", "8", "--seed", "0", "--json", "-q")
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout)["trajectories"] == 4
    rows = [row for shard in list_shards(str(tmp_path / "rollouts")) for row in read_shard(shard).to_pylist()]
    assert {row["policy_version"] for row in rows} == {3}
    assert all(row["response_ids"] for row in rows)


@pytest.mark.slow
def test_lora_resume_gives_the_weights_of_a_straight_run(trained, tmp_path):
    _, batches, out, _ = trained
    split = tmp_path / "split"
    assert train(batches, str(tiny_model_dir()), str(split), TrainConfig(save_every=1, max_steps=2, **LORA))["steps"] == 2
    assert train(batches, None, str(split), TrainConfig(save_every=1, **LORA))["resumed_from"] == 2
    straight = load_file(str(latest_checkpoint(out)[1] / "model.safetensors"))
    resumed = load_file(str(latest_checkpoint(split)[1] / "model.safetensors"))
    assert max(float((straight[k] - resumed[k]).abs().max()) for k in straight) < 1e-6


@pytest.mark.slow
def test_publish_format_adapter_writes_a_peft_directory_that_sync_publishes(trained, tmp_path):
    from peft import PeftModel

    from arlctl.rl.trainer_state import load_model

    _, batches, out, _ = trained
    adapter_out, policy = tmp_path / "ckpt", tmp_path / "policy"
    train(batches, str(tiny_model_dir()), str(adapter_out), TrainConfig(save_every=1, publish_format="adapter", **LORA))
    step, ckpt = latest_checkpoint(adapter_out)
    assert (ckpt / "adapter_model.safetensors").is_file() and (ckpt / "adapter_config.json").is_file()
    assert not (ckpt / "model.safetensors").exists()
    summary = sync(str(adapter_out), str(policy))
    version = policy / f"v{step:06d}"
    info = json.loads((version / "version.json").read_text())
    assert summary["published"] and info["adapter"] is True and (version / "adapter_model.safetensors").is_file()
    # The published adapter on the base == the merged weights of the same training run.
    adapted = PeftModel.from_pretrained(load_model(tiny_model_dir()), str(version)).eval()
    merged = load_model(latest_checkpoint(out)[1]).eval()
    ids = torch.tensor([[1, 5, 9, 200, 3000, 7]])
    with torch.no_grad():
        a, m = adapted(input_ids=ids).logits, merged(input_ids=ids).logits
    # x W + s (x A^T) B^T vs x (W + s B A): the same up to float32 rounding, relative to the logits' size
    assert float((a - m).abs().max()) < 1e-6 * float(m.abs().max()) + 1e-5, (float((a - m).abs().max()),
                                                                           float(m.abs().max()))
