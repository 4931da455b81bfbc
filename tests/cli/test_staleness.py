"""The staleness bound end to end (issue 27 item 5): `max-staleness S` means no row is trained more than S
versions after the version that generated it.

Backpressure projects a new group's lag at train time from what is queued in front of the trainer; a
recipe's `max-staleness` feeds rollout's --max-staleness and train's --max-lag; train drops (counted) or
refuses rows past the bound. Real run directories, real shards, the real CLI in process.
"""

from __future__ import annotations

import asyncio

import pytest

from arlctl.io.shards import Lineage, shard_name, write_shard
from arlctl.runstate import backlog
from arlctl.stages.rollout_daemon import Backpressure, projected_lag
from arlctl.synthetic import synthetic_table

G = 4  # group size of every synthetic shard here


class Pol:
    def __init__(self, version: int = 0):
        self.version = version


def write(run, directory: str, groups: int, prefix: str, inputs: list[str] | None = None) -> str:
    (run / directory).mkdir(parents=True, exist_ok=True)
    return write_shard(synthetic_table(groups, group_size=G), str(run / directory / shard_name(prefix)),
                       Lineage(stage="test", inputs=inputs or []))


def check(run, max_staleness: int, version: int = 0) -> tuple[str | None, str, int, int]:
    gate = Backpressure(str(run), G, Pol(version), in_flight=lambda: 0, max_staleness=max_staleness, poll_s=0.1)
    return asyncio.run(gate._check(fresh=True))


def test_eight_queued_batch_shards_block_a_group_even_at_trainer_lead_zero(tmp_path):
    """No checkpoint and no LATEST: trainer version 0 == the rollout's policy version 0 (lead 0). The
    trainer lead alone (the old rule) lets the group start; its rows would be trained after the 8 queued
    steps, at lag 8 > 2."""
    run = tmp_path / "run"
    for _ in range(8):
        write(run, "batches", 2, "batch")
    blocked, message, _, lag = check(run, max_staleness=2)
    assert (blocked, lag) == ("staleness", 8)
    assert "lag at train time would be 8 > max-staleness 2" in message and "8 batch shards waiting" in message
    state = backlog(str(run))
    assert state["trainer_version"] == 0 and state["batch_shards"] == 8


@pytest.mark.parametrize("queued, blocked", [(2, None), (3, "staleness")])
def test_the_bound_admits_exactly_s_queued_steps(tmp_path, queued, blocked):
    """Two steps queued: the group's rows train at version 0 + 2, lag 2 <= 2; a third is one too many."""
    run = tmp_path / "run"
    for _ in range(queued):
        write(run, "batches", 2, "batch")
    assert check(run, max_staleness=2)[0] == blocked


def test_rows_upstream_count_as_steps_at_the_filters_rows_per_step(tmp_path):
    """The filter turned one rewarded shard of 4 groups (16 rows) into one batch shard: 16 rows per step.
    With that batch still queued, 32 rows waiting at reward are 2 more steps: lag 0 + 1 + 2 = 3 > 2;
    16 rows are 1 more: lag 2, admitted. A newer policy (v1) takes one off."""
    run = tmp_path / "run"
    rewarded = write(run, "rewarded", 4, "part")
    write(run, "batches", 2, "batch", inputs=[rewarded])  # consumed rewarded/ by its lineage
    write(run, "rollouts", 4, "part")
    state = backlog(str(run))
    assert (state["rows_per_step"], state["batch_shards"], state["rollouts"]) == (16.0, 1, 16)
    assert projected_lag(state, 0) == (2, 2)
    assert check(run, max_staleness=2)[0] is None
    write(run, "rollouts", 4, "part")
    blocked, _, _, lag = check(run, max_staleness=2)
    assert (blocked, lag) == ("staleness", 3)
    assert check(run, max_staleness=2, version=1)[0] is None


def test_rows_in_flight_count_as_rows_upstream(tmp_path):
    run = tmp_path / "run"
    rewarded = write(run, "rewarded", 4, "part")
    write(run, "batches", 2, "batch", inputs=[rewarded])
    state = backlog(str(run), in_flight=48)  # this process's uncommitted groups land in front of the next one
    assert projected_lag(state, 0) == (1 + 3, 1 + 3)
