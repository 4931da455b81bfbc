"""Staleness at train time (issue 15 item 7, DESIGN.md §10) on the tiny model with hand-built batch shards.

The trainer's policy version is the step its weights are at (checkpoint step-N is what `sync` publishes as
vN), so every test starts from a step-3 checkpoint and trains one hand-built batch whose trajectories were
sampled at versions 3, 2 and 0: lags 0, 1 and 3.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from arlctl.cli.main import app
from arlctl.io.ledger import latest_checkpoint, read_state
from arlctl.io.shards import Lineage, write_shard
from arlctl.models import tiny_model_dir
from arlctl.rl.batching import row_lags
from arlctl.rl.config import TrainConfig
from arlctl.rl.trainer_state import load_model
from arlctl.stages.train import apply_staleness, forward_backward, train
from arlctl.synthetic import synthetic_table
from tests.stages.test_train import make_batches, on_policy, set_column

VERSIONS = [3, 3, 2, 2, 0, 0]  # two rows (one group) per version
LAGS = [0, 0, 1, 1, 3, 3]  # at trainer version 3
WEIGHTS = [1.0, 0.5, 1.0, 0.5, 1.0, 0.5]  # filter's weights, which the train-time rule multiplies


@pytest.fixture(scope="module")
def at_step_3(tmp_path_factory) -> Path:
    """A checkpoint directory whose newest checkpoint is step 3 (the trainer is at policy version 3)."""
    root = tmp_path_factory.mktemp("warm")
    train(make_batches(root, 3), str(tiny_model_dir()), str(root / "checkpoints"), TrainConfig(lr=1e-3))
    assert latest_checkpoint(root / "checkpoints")[0] == 3
    return root / "checkpoints"


def stale_batch(versions: list[int]) -> pa.Table:
    """One batch shard's rows: groups of 2 on-policy rows with advantages +-1, sampled at `versions`."""
    table = synthetic_table(len(versions) // 2, group_size=2, seed=7, mean_turns=2, tokens_per_turn=12)
    n = table.num_rows
    table = set_column(table, "reward", pa.array([float(i % 2) for i in range(n)], pa.float32()))
    table = set_column(table, "status", pa.array(["ok"] * n))
    table = set_column(table, "advantage", pa.array([1.0 if i % 2 else -1.0 for i in range(n)], pa.float32()))
    table = set_column(table, "weight", pa.array(WEIGHTS[:n], pa.float32()))
    table = set_column(table, "policy_version", pa.array(versions, pa.int64()))
    table = set_column(table, "policy_version_last", pa.array(versions, pa.int64()))
    return on_policy(table)


def start(tmp_path: Path, at_step_3: Path, versions: list[int]) -> tuple[str, str]:
    """(batches dir holding the hand-built shard, a copy of the step-3 checkpoints to train on from)."""
    ckpts = tmp_path / "checkpoints"
    shutil.copytree(at_step_3, ckpts)
    write_shard(stale_batch(versions), str(tmp_path / "batches" / "batch-stale.parquet"), Lineage("filter"))
    return str(tmp_path / "batches"), str(ckpts)


def step_metrics(tmp_path: Path) -> dict:
    return pq.read_table(tmp_path / "metrics" / "train-step-000004.parquet").to_pylist()[0]


def reference_loss(ckpts: str, table: pa.Table) -> float:
    """The loss the step-3 weights give `table` with the train defaults: what step 4 must have computed."""
    model = load_model(Path(ckpts) / "step-000003")
    return forward_backward(model, None, table, TrainConfig())["loss"]


def test_row_lags_take_the_trainer_version_minus_the_oldest_row_of_a_trajectory():
    table = stale_batch(VERSIONS)
    assert row_lags(table, 3) == LAGS
    assert row_lags(table, 1) == [0, 0, 0, 0, 1, 1]  # never below 0
    # Two rows of one per-turn trajectory (same trajectory_id) share the lag of the older one.
    ids = table.column("trajectory_id").to_pylist()
    same = set_column(table, "trajectory_id", pa.array([ids[0], ids[0], *ids[2:]]))
    same = set_column(same, "policy_version", pa.array([3, 1, 2, 2, 0, 0], pa.int64()))
    assert row_lags(same, 3) == [2, 2, 1, 1, 3, 3]


@pytest.mark.slow
def test_max_lag_leaves_out_the_stale_rows_and_counts_them(tmp_path, at_step_3):
    batches, ckpts = start(tmp_path, at_step_3, VERSIONS)
    summary = train(batches, None, ckpts, TrainConfig(max_lag=1), metrics_url=str(tmp_path / "metrics"))
    assert summary["steps"] == 1 and summary["step"] == 4
    assert summary["rows_dropped_stale"] == 2 and summary["skipped_stale"] == 0 and summary["max_lag"] == 3
    assert summary["mean_lag"] == pytest.approx(8 / 6)  # (0 + 0 + 1 + 1 + 3 + 3) / 6
    m = step_metrics(tmp_path)
    assert (m["rows"], m["rows_dropped_stale"], m["rows_decayed_stale"], m["policy_version"]) == (4, 2, 0, 3)
    assert m["rows_dropped_invalid"] == 0 and m["warning"] == "" and m["skipped_nonfinite"] == 0

    # The kept rows train with their weights as filter wrote them: the step's loss is the loss of rows 0-3.
    kept = stale_batch(VERSIONS).slice(0, 4)
    assert m["loss"] == pytest.approx(reference_loss(ckpts, kept), rel=1e-5, abs=1e-7)
    assert reference_loss(ckpts, stale_batch(VERSIONS)) != pytest.approx(m["loss"], rel=1e-3)  # the rule mattered
    table, stats = apply_staleness(stale_batch(VERSIONS), 3, TrainConfig(max_lag=1))
    assert table.column("weight").to_pylist() == WEIGHTS[:4] and stats["rows_dropped_stale"] == 2


@pytest.mark.slow
def test_lag_decay_multiplies_the_weights_by_exp_minus_decay_times_lag(tmp_path, at_step_3):
    batches, ckpts = start(tmp_path, at_step_3, VERSIONS)
    summary = train(batches, None, ckpts, TrainConfig(lag_decay=0.5), metrics_url=str(tmp_path / "metrics"))
    assert summary["rows_decayed_stale"] == 4 and summary["rows_dropped_stale"] == 0
    m = step_metrics(tmp_path)
    assert (m["rows"], m["rows_decayed_stale"]) == (6, 4)

    # exp(-0.5 * 0) = 1, exp(-0.5 * 1) = 0.60653066, exp(-0.5 * 3) = 0.22313016, times filter's 1.0 / 0.5:
    expected = [1.0, 0.5, 0.60653066, 0.30326533, 0.22313016, 0.11156508]
    table, _ = apply_staleness(stale_batch(VERSIONS), 3, TrainConfig(lag_decay=0.5))
    assert table.column("weight").to_pylist() == pytest.approx(expected, rel=1e-6)
    hand = set_column(stale_batch(VERSIONS), "weight", pa.array(expected, pa.float32()))
    assert m["loss"] == pytest.approx(reference_loss(ckpts, hand), rel=1e-5, abs=1e-7)

    # With --max-lag 1 only the rows beyond it are down-weighted, instead of being left out.
    table, stats = apply_staleness(stale_batch(VERSIONS), 3, TrainConfig(max_lag=1, lag_decay=0.5))
    assert table.column("weight").to_pylist() == pytest.approx([*WEIGHTS[:4], *expected[4:]], rel=1e-6)
    assert (stats["rows_decayed_stale"], stats["rows_dropped_stale"]) == (2, 0)
    assert math.isclose(expected[4], math.exp(-1.5), rel_tol=1e-7)


@pytest.mark.slow
def test_an_all_stale_batch_is_consumed_with_a_warning_and_no_weight_changes(tmp_path, at_step_3):
    batches, ckpts = start(tmp_path, at_step_3, [0] * 6)  # every row at lag 3
    before = load_file(str(Path(ckpts) / "step-000003" / "model.safetensors"))
    res = CliRunner().invoke(app, ["train", "--in", batches, "--out", ckpts, "--metrics", str(tmp_path / "metrics"),
                                   "--max-lag", "1", "--lr", "1e-2", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 1 and summary["skipped_stale"] == 1  # in the --json summary too
    warnings = [line for line in res.stderr.splitlines() if line.startswith("warning: step 4:")]
    assert len(warnings) == 1 and "every row is stale: 6 rows over --max-lag 1" in warnings[0], res.stderr

    step, location = latest_checkpoint(ckpts)
    after = load_file(str(location / "model.safetensors"))
    assert step == 4 and all(torch.equal(after[k], before[k]) for k in before)
    state = read_state(location)
    assert state["consumed_batches"][-1] == "batch-stale.parquet"  # consumed: never retried
    assert state["bad_values"]["events"][-1]["warning"].startswith("every row is stale")
    m = step_metrics(tmp_path)
    assert (m["skipped_stale"], m["rows_dropped_stale"], m["rows"], m["skipped_nonfinite"]) == (1, 6, 0, 0)

    again = train(batches, None, ckpts, TrainConfig(max_lag=1))  # nothing left: the batch is not retried
    assert again["steps"] == 0


def test_bad_staleness_settings_are_usage_errors():
    from arlctl.errors import UsageError

    for cfg in (TrainConfig(max_lag=-1), TrainConfig(lag_decay=-0.5), TrainConfig(lag_decay=float("inf"))):
        with pytest.raises(UsageError):
            cfg.check()
