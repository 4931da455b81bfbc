"""A daemon pipeline under `arlctl up` with `max-staleness: 2` (issue 27 item 5): no row is trained more
than 2 versions after the policy version that generated it, and every row the bound left out is counted.

The tiny policy on first-token with one group per batch shard: rollout outruns the trainer, so batch
shards queue in front of it (the case that trained rows 9 versions stale, mean 5.9, when backpressure
looked only at the trainer's lead; on this recipe that rule gives max 47, mean 23.5).
"""

from __future__ import annotations

import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import yaml

pytestmark = pytest.mark.integration

ARLCTL = [sys.executable, "-m", "arlctl.cli.main"]


def test_trained_lag_never_exceeds_the_recipes_max_staleness(tmp_path):
    run = tmp_path / "run"
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"run": str(run), "max-staleness": 2, "refresh_s": 1, "stages": {
        "rollout": {"args": {"env": "first-token", "tasks": "builtin:first-token?n=16", "policy": "tiny",
                             "group-size": 4, "concurrency": 8, "max-new-tokens": 4, "flush-groups": 2,
                             "max-epochs": 1, "max-pending": 256, "poll": 0.5, "seed": 0}},
        "reward": {"args": {"reward": "first-token", "poll": 0.5}},
        "filter": {"args": {"batch-groups": 1, "keep-status": ["ok", "truncated"], "keep-uniform": 1,
                            "adv": "batch", "poll": 0.5}},
        "train": {"args": {"policy": "tiny", "lr": 1e-3, "save-every": 1, "poll": 0.5}},
        "sync": {"args": {"poll": 0.5}}}}))
    done = subprocess.run([*ARLCTL, "up", str(path), "--until-drained", "--for", "400"], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0 and "stopped (drained)" in done.stderr, done.stderr[-3000:]

    steps = [pq.read_table(f).to_pylist()[0] for f in sorted((run / "metrics").glob("train-step-*.parquet"))]
    batch_rows = sum(pq.ParquetFile(f).metadata.num_rows for f in (run / "batches").glob("batch-*.parquet"))
    assert len(steps) == len(list((run / "batches").glob("batch-*.parquet"))) > 0
    assert max(s["max_lag_trained"] for s in steps if s["rows"]) <= 2
    # every batch row was trained or counted as dropped (as stale, or for a bad value: none here)
    assert sum(s["rows"] + s["rows_dropped_stale"] for s in steps) == batch_rows
    assert sum(s["rows_dropped_invalid"] for s in steps) == 0
    assert all("--max-lag 2" in line for line in (run / "logs" / "train-0.log").read_text().splitlines()
               if "arlctl up starts" in line)
