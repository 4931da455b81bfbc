"""The trainer version has one owner (arlctl/io/ledger.py `trainer_version`): filter's staleness "now", status's
waiting lag and the rollout daemon's projected lag all read the same number from the same run directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arlctl.errors import TerminalError
from arlctl.io.ledger import trainer_version
from arlctl.io.shards import Lineage, write_shard
from arlctl.runstate import backlog, run_state
from arlctl.stages import filter as filter_stage
from arlctl.stages.configs import FilterConfig
from arlctl.stages.results import FilterIO
from arlctl.stages.rollout_daemon import projected_lag
from arlctl.synthetic import synthetic_table


def checkpoint(run: Path, step: int, complete: bool = True) -> None:
    """A checkpoint as the ledger sees one: complete once its state.json is there."""
    step_dir = run / "checkpoints" / f"step-{step:06d}"
    step_dir.mkdir(parents=True)
    if complete:
        (step_dir / "state.json").write_text(json.dumps({"step": step, "consumed_batches": []}))


def latest(run: Path, text: str) -> None:
    (run / "policy").mkdir(parents=True, exist_ok=True)
    (run / "policy" / "LATEST").write_text(text)


def version_of(run: Path) -> int:
    return trainer_version(str(run / "policy"), str(run / "checkpoints"))


def test_the_newer_of_latest_and_the_newest_complete_checkpoint(tmp_path):
    assert version_of(tmp_path) == 0  # nothing trained, nothing published
    latest(tmp_path, "v000002\n")
    assert version_of(tmp_path) == 2
    checkpoint(tmp_path, 3)
    checkpoint(tmp_path, 5, complete=False)  # still being written: not the trainer's version yet
    assert version_of(tmp_path) == 3  # the checkpoint is ahead of sync
    latest(tmp_path, "v000004\n")
    assert version_of(tmp_path) == 4  # a weights-only publish ahead of the newest full checkpoint
    assert trainer_version(None, str(tmp_path / "checkpoints")) == 3  # a directory not given is not read
    assert trainer_version(str(tmp_path / "policy"), None) == 4
    latest(tmp_path, "not a version\n")
    assert version_of(tmp_path) == 3  # a malformed LATEST names nothing


@pytest.mark.parametrize("where", ["latest", "checkpoint"])
def test_a_version_beyond_any_real_run_is_an_error_naming_where(tmp_path, where):
    if where == "latest":
        latest(tmp_path, "v9999999999\n")
    else:
        checkpoint(tmp_path, 10**9 + 1)
    with pytest.raises(TerminalError, match="beyond any real run") as err:
        version_of(tmp_path)
    assert ("LATEST" if where == "latest" else "step-1000000001") in str(err.value)


def test_filter_status_and_backpressure_see_the_same_version(tmp_path):
    run = tmp_path / "run"
    checkpoint(run, 6)
    latest(run, "v000004\n")
    (run / "rewarded").mkdir()
    table = synthetic_table(8, seed=1)  # rows at policy versions well behind 6
    write_shard(table, str(run / "rewarded" / "a.parquet"), Lineage("reward"))
    io = FilterIO(in_url=str(run / "rewarded"), out=str(run / "batches"), policy_dir=str(run / "policy"),
                  ckpt_dir=str(run / "checkpoints"), dry_run=True)
    result = filter_stage.run(FilterConfig(), io)
    state = backlog(str(run))
    assert result.current_version == state["trainer_version"] == run_state(str(run))["trainer_version"] == 6
    assert projected_lag(state, policy_version=4) == (6 + 0 - 4, 0)  # nothing queued in front of the trainer
