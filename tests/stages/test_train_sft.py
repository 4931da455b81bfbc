"""`train --loss sft`: the negative log-likelihood of the mask-1 tokens, aggregated like the policy loss.

The loss of a tiny-model batch equals the mean NLL computed here from the model's logits by hand (no
collate, no score_tokens); advantages take no part; a few steps on the same rows raise their likelihood,
with every weight trained or with LoRA adapters.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from arlctl.errors import TerminalError, UsageError
from arlctl.io.ledger import latest_checkpoint
from arlctl.io.shards import Lineage, read_shard, scan, write_shard
from arlctl.models import tiny_model_dir
from arlctl.rl.config import TrainConfig
from arlctl.rl.losses import LossConfig, sft_loss
from arlctl.rl.trainer_state import load_model
from arlctl.stages.train import forward_backward, train
from tests.stages.test_train import make_batches, set_column


def row_nlls(model, table: pa.Table) -> list[list[float]]:
    """-log p of each mask-1 response token of each row, from one plain forward pass per row."""
    out = []
    with torch.no_grad():
        for row in table.to_pylist():
            ids = row["prompt_ids"] + row["response_ids"]
            logprobs = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)  # [L, V]
            p = len(row["prompt_ids"])
            out.append([-float(logprobs[p + j - 1, tok]) for j, (tok, m)
                        in enumerate(zip(row["response_ids"], row["response_mask"], strict=True)) if m == 1])
    return out


@pytest.fixture(scope="module")
def batch_dir(tmp_path_factory) -> str:
    return make_batches(tmp_path_factory.mktemp("sft"), 1, groups_per_batch=2)


def test_sft_loss_on_hand_values():
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -4.0, float("nan")]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    cfg = LossConfig(kind="sft")
    # token-mean: (1 + 2 + 0.5) / 3 tokens = 3.5 / 3; the NaN and the -3 lie off the mask
    assert float(sft_loss(logp, mask, cfg)[0]) == pytest.approx(3.5 / 3)
    # seq-mean-token-mean: ((1 + 2) / 2 + 0.5 / 1) / 2 rows = (1.5 + 0.5) / 2 = 1.0
    assert float(sft_loss(logp, mask, LossConfig(loss_agg="seq-mean-token-mean"))[0]) == pytest.approx(1.0)
    # seq-mean-token-sum with the whole batch's 4 sequences: (3 + 0.5) / 4 = 0.875
    assert float(sft_loss(logp, mask, LossConfig(loss_agg="seq-mean-token-sum"), num_seqs=4)[0]) == pytest.approx(0.875)
    # row weights scale each row's tokens: (0.5 * (1 + 2) + 2 * 0.5) / 3 = 2.5 / 3
    weighted, sums = sft_loss(logp, mask, cfg, weights=torch.tensor([0.5, 2.0]))
    assert float(weighted) == pytest.approx(2.5 / 3) and float(sums["nll"]) == pytest.approx(3.5)
    assert float(sums["clip_frac_low"] + sums["clip_frac_high"]) == 0.0  # nothing is clipped in SFT


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean"])
def test_sft_loss_is_the_mean_nll_of_the_mask_one_tokens(batch_dir, loss_agg):
    batch = read_shard(scan(batch_dir).shards[0])
    model = load_model(tiny_model_dir())
    nlls = row_nlls(model, batch)
    assert len(nlls) == 4 and all(nlls)
    if loss_agg == "token-mean":
        expected = sum(map(sum, nlls)) / sum(map(len, nlls))
    else:
        expected = sum(sum(n) / len(n) for n in nlls) / len(nlls)
    cfg = TrainConfig(loss="sft", loss_agg=loss_agg, device="cpu", micro_tokens=80)  # several micro-batches
    out = forward_backward(model, None, batch, cfg)
    assert out["micro_batches"] > 1
    assert out["loss"] == pytest.approx(expected, rel=1e-5)
    # Advantages take no part: other advantages, the same loss.
    flipped = set_column(batch, "advantage", pa.array([-5.0, 3.0, 0.0, 7.0], pa.float32()))
    model.zero_grad()
    assert forward_backward(model, None, flipped, cfg)["loss"] == pytest.approx(expected, rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("lora_rank", [0, 4])
def test_sft_steps_raise_the_likelihood_of_the_rows(batch_dir, tmp_path, lora_rank):
    # The same rows three times: three optimizer steps on them.
    src = scan(batch_dir).shards[0]
    repeated = tmp_path / "batches"
    repeated.mkdir()
    for k in range(3):
        shutil.copy(src, repeated / f"batch-{k}.parquet")
    rows = read_shard(src)
    before = row_nlls(load_model(tiny_model_dir()), rows)
    losses: list[float] = []
    cfg = TrainConfig(loss="sft", lr=1e-3 if lora_rank == 0 else 1e-2, lora_rank=lora_rank, device="cpu",
                      save_every=10)
    summary = train(str(repeated), str(tiny_model_dir()), str(tmp_path / "ckpt"), cfg,
                    on_step=lambda step, m: losses.append(m["loss"]))
    assert summary["steps"] == 3 and summary["skipped_nonfinite"] == 0
    assert losses[0] == pytest.approx(sum(map(sum, before)) / sum(map(len, before)), rel=1e-4)
    assert losses[0] > losses[1] > losses[2]
    after = row_nlls(load_model(Path(latest_checkpoint(tmp_path / "ckpt")[1])), rows)
    assert sum(map(sum, after)) < sum(map(sum, before)) - 1.0  # every row's tokens, together, more likely


def test_sft_reads_no_advantage_and_an_unknown_loss_is_refused(batch_dir, tmp_path):
    unfiltered = tmp_path / "batches"
    table = read_shard(scan(batch_dir).shards[0])
    write_shard(set_column(table, "advantage", pa.nulls(table.num_rows, pa.float32())),
                str(unfiltered / "batch-0.parquet"), Lineage("filter"))
    with pytest.raises(TerminalError, match="without an advantage"):
        train(str(unfiltered), str(tiny_model_dir()), str(tmp_path / "pg"), TrainConfig(device="cpu"))
    assert train(str(unfiltered), str(tiny_model_dir()), str(tmp_path / "sft"),
                 TrainConfig(loss="sft", device="cpu"))["steps"] == 1
    with pytest.raises(UsageError, match="--loss must be one of ppo-clip, gspo, cispo, sft"):
        TrainConfig(loss="dpo").check()
