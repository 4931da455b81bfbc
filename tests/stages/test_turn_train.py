"""train with per-turn advantages, and outcome-only training unchanged on version-1 shards (tiny model, CPU)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from arlctl.io.ledger import latest_checkpoint
from arlctl.io.shards import Lineage, read_shard, scan, write_shard
from arlctl.models import tiny_model_dir
from arlctl.rl.batching import collate, score_tokens
from arlctl.rl.config import TrainConfig
from arlctl.rl.trainer_state import load_model
from arlctl.schemas.rows import TrajectoryRow, Turn, rows_to_table
from arlctl.schemas.trajectory import SCHEMAS, set_turn_advantages
from arlctl.stages.configs import FilterConfig
from arlctl.stages.filter import run_filter
from arlctl.stages.train import train, train_step


def two_turn_row(sample: int, reward: float, advantage: float = 0.0) -> TrajectoryRow:
    # prompt 1 2 3 | turn 0 samples 10+s 11 (mask 1) | env 12 (mask 0) | turn 1 samples 13 14+s (mask 1)
    ids = [10 + sample, 11, 12, 13, 14 + sample]
    mask = [1, 1, 0, 1, 1]
    return TrajectoryRow(group_id="g", sample_index=sample, task_id="t", env="e", env_version="1", task={},
                         policy="p", prompt_text="", prompt_ids=[1, 2, 3], response_ids=ids, response_mask=mask,
                         response_logprobs=[-0.5 if m else 0.0 for m in mask],
                         turns=[Turn(0, 0, 2, 1, "a", reward_step=float(sample % 2)), Turn(1, 3, 2, 0, "b")],
                         reward=reward, advantage=advantage, weight=1.0)


def on_policy(table: pa.Table, model) -> pa.Table:
    """The rows' behaviour log-probs replaced by the model's own, as its rollout would have recorded them."""
    mb = collate(table, list(range(table.num_rows)))
    with torch.no_grad():
        logp, _ = score_tokens(model, mb)  # [B, L-1]
    p = table.column("prompt_tokens").to_pylist()
    r = table.column("response_tokens").to_pylist()
    values = [logp[b, p[b] - 1 : p[b] - 1 + r[b]].tolist() for b in range(table.num_rows)]
    i = table.schema.get_field_index("response_logprobs")
    return table.set_column(i, table.schema.field(i), pa.array(values, pa.list_(pa.float32())))


def one_step(batch: pa.Table, lr: float = 1e-2) -> torch.nn.Module:
    torch.manual_seed(0)
    model = load_model(tiny_model_dir())
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    metrics = train_step(model, None, optimizer, scheduler, batch, TrainConfig(lr=lr))
    assert metrics["skipped_nonfinite"] == 0 and metrics["rows_dropped_invalid"] == 0, metrics["warning"]
    return model


def turn_logp(model, batch: pa.Table) -> torch.Tensor:
    """Summed log-prob of each turn's sampled tokens: [B, 2]."""
    mb = collate(batch, list(range(batch.num_rows)))
    with torch.no_grad():
        logp, _ = score_tokens(model, mb)  # [B, L-1]; response token k of a 3-token prompt is position 2 + k
    return torch.stack([logp[:, 2:4].sum(-1), logp[:, 5:7].sum(-1)], dim=-1)


def test_each_turn_moves_the_way_its_own_advantage_says():
    model = load_model(tiny_model_dir())
    batch = on_policy(rows_to_table([two_turn_row(0, 1.0), two_turn_row(1, 0.0)]), model)
    before = turn_logp(model, batch)
    # row advantage 0 everywhere; per turn: row 0 turn 0 +1, turn 1 -1; row 1 the opposite
    pushed = set_turn_advantages(batch, [1.0, -1.0, -1.0, 1.0])
    delta = turn_logp(one_step(pushed), batch) - before  # [B, 2]
    assert delta[0, 0] > 0 > delta[0, 1] and delta[1, 1] > 0 > delta[1, 0], delta
    # with only the row advantages (all 0) nothing moves: the turns' values were what moved the weights
    still = turn_logp(one_step(batch), batch) - before
    assert torch.equal(still, torch.zeros_like(still))


def test_turn_advantages_equal_to_the_row_advantage_train_exactly_like_it():
    model = load_model(tiny_model_dir())
    batch = on_policy(rows_to_table([two_turn_row(0, 1.0, 0.7), two_turn_row(1, 0.0, -0.7)]), model)
    same = set_turn_advantages(batch, [0.7, 0.7, -0.7, -0.7])
    a, b = one_step(batch).state_dict(), one_step(same).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a), "per-token values equal to the row's must give the same step"


def as_v1(table: pa.Table) -> pa.Table:
    rows = table.to_pylist()
    for row in rows:
        row["schema_version"] = 1
        for turn in row["turns"]:
            del turn["advantage"]
    return pa.Table.from_pylist(rows, schema=SCHEMAS[1])


@pytest.mark.slow
def test_outcome_only_training_is_bit_identical_on_version_1_shards(tmp_path):
    model = load_model(tiny_model_dir())
    rows = [two_turn_row(s, float(s % 2)) for s in range(4)]
    table = on_policy(rows_to_table(rows), model)
    for version, root in (("v1", tmp_path / "v1"), ("v2", tmp_path / "v2")):
        (root / "rewarded").mkdir(parents=True)
        if version == "v1":  # a rewarded shard as a version-1 arlctl wrote it
            pq.write_table(as_v1(table), root / "rewarded" / "part-1.parquet")
        else:
            write_shard(table, str(root / "rewarded" / "part-1.parquet"), Lineage("reward"))
        run_filter(str(root / "rewarded"), str(root / "batches"), FilterConfig(), 0)  # default: --adv group
        train(str(root / "batches"), str(tiny_model_dir()), str(root / "ckpt"), TrainConfig(lr=1e-2))
    batches = [read_shard(scan(str(tmp_path / v / "batches")).shards[0]) for v in ("v1", "v2")]
    assert batches[0].equals(batches[1])  # the v1 input's batch is a v2 shard like any other
    assert all(t["advantage"] is None for row in batches[0].column("turns").to_pylist() for t in row)
    a, b = (load_file(str(Path(latest_checkpoint(tmp_path / v / "ckpt")[1]) / "model.safetensors"))
            for v in ("v1", "v2"))
    initial = load_file(str(tiny_model_dir() / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], initial[k]) for k in a), "the step must have changed the weights"
