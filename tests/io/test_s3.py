"""Shards on a real S3 endpoint (moto's server on 127.0.0.1): write, list, read, query."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from arlctl.cli.main import app
from arlctl.io.ledger import consumed_inputs
from arlctl.io.shards import Lineage, list_shards, read_shard, write_shard
from arlctl.synthetic import synthetic_table


def test_s3_write_list_read_query(s3_bucket):
    table = synthetic_table(4, 2, seed=7)
    url = write_shard(table, f"{s3_bucket}/run/rollouts/part-1.parquet", Lineage(stage="rollout", inputs=["t"]))
    assert url.startswith("s3://")
    write_shard(synthetic_table(2, 2, seed=8), f"{s3_bucket}/run/rollouts/part-2.parquet", Lineage(stage="rollout"))
    shards = list_shards(f"{s3_bucket}/run/rollouts")
    assert [s.rsplit("/", 1)[1] for s in shards] == ["part-1.parquet", "part-2.parquet"]
    assert read_shard(shards[0]).equals(table)
    assert consumed_inputs(f"{s3_bucket}/run/rollouts") == {"t"}

    result = CliRunner().invoke(app, ["query", "select count(*) as n, count(distinct group_id) as g from trajectories",
                                      f"{s3_bucket}/run/rollouts", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip()) == {"n": 12, "g": 6}
