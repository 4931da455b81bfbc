"""train's side of the staleness bound (issue 27 item 5): rows past --max-lag are dropped and counted, the
lag of the rows actually trained is in the step metrics, and `--stale refuse` exits 1 naming the shard
and leaves it unconsumed. The tiny model from a step-3 checkpoint, one hand-built batch with lags
0, 0, 1, 1, 3, 3 (tests/stages/test_train_staleness.py), through the real CLI.
"""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from arlctl.cli.main import app
from arlctl.errors import UsageError
from arlctl.io.ledger import latest_checkpoint, read_state
from arlctl.rl.config import TrainConfig
from tests.stages.test_train_staleness import VERSIONS, at_step_3, start  # noqa: F401 (at_step_3: a fixture)


def train_cli(tmp_path, batches: str, ckpts: str, *options: str):
    return CliRunner().invoke(app, ["train", "--in", batches, "--out", ckpts, "--metrics", str(tmp_path / "metrics"),
                                    *options])


@pytest.mark.slow
def test_dropped_rows_are_counted_and_the_trained_lag_is_within_the_bound(tmp_path, at_step_3):  # noqa: F811
    batches, ckpts = start(tmp_path, at_step_3, VERSIONS)
    result = train_cli(tmp_path, batches, ckpts, "--max-lag", "1")
    assert result.exit_code == 0, result.output
    m = pq.read_table(tmp_path / "metrics" / "train-step-000004.parquet").to_pylist()[0]
    # lags at version 3: 0 0 1 1 3 3; the two rows at lag 3 are left out, the trained ones are at most 1
    assert (m["rows"], m["rows_dropped_stale"], m["max_lag"]) == (4, 2, 3)
    assert (m["max_lag_trained"], m["mean_lag_trained"]) == (1, pytest.approx(2 / 4))  # (0 + 0 + 1 + 1) / 4


@pytest.mark.slow
def test_stale_refuse_exits_1_naming_the_shard_and_leaves_it_unconsumed(tmp_path, at_step_3):  # noqa: F811
    batches, ckpts = start(tmp_path, at_step_3, VERSIONS)
    result = train_cli(tmp_path, batches, ckpts, "--max-lag", "1", "--stale", "refuse")
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())
    assert "batch shard batch-stale.parquet: 2 of 6 rows would be trained 3 versions after" in text, text
    assert "past --max-lag 1" in text
    step, location = latest_checkpoint(ckpts)
    assert step == 3 and "batch-stale.parquet" not in read_state(location)["consumed_batches"]
    # within the bound it trains as drop does
    assert train_cli(tmp_path, batches, ckpts, "--max-lag", "3", "--stale", "refuse").exit_code == 0
    assert latest_checkpoint(ckpts)[0] == 4


@pytest.mark.parametrize("cfg, message", [
    (TrainConfig(stale="refuse"), "--stale refuse needs --max-lag"),
    (TrainConfig(stale="refuse", max_lag=1, lag_decay=0.1), "no --lag-decay"),
    (TrainConfig(stale="warn"), "--stale must be drop or refuse"),
])
def test_stale_option_errors(cfg, message):
    with pytest.raises(UsageError, match=message):
        cfg.check()
