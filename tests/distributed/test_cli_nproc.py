"""`arlctl train --nproc 2` launches torchrun itself; rank 0 alone reports, writes metrics and commits."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from arlctl.io.ledger import list_checkpoints, read_state
from tests.distributed.common import REPO, make_uneven_batches, small_init_model

pytestmark = pytest.mark.distributed


def test_nproc_launches_two_ranks_and_only_rank_zero_writes(tmp_path):
    model = small_init_model(tmp_path)
    batches = make_uneven_batches(tmp_path, model, n_batches=2)
    out, metrics = tmp_path / "ckpt", tmp_path / "metrics"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"}
    run = tmp_path / "run"  # --run too: torchrun must not read it as its own --run-path
    run.mkdir()  # an existing run (train never starts one)
    res = subprocess.run([sys.executable, "-m", "arlctl.cli.main", "train", "--nproc", "2", "--run", str(run),
                          "--in", batches, "--out", str(out), "--policy", str(model), "--metrics", str(metrics), "--json",
                          "--save-every", "1"], capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "torch.distributed.run" in res.stderr + res.stdout and "--nproc-per-node=2" in res.stderr + res.stdout
    summaries = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{") and "world_size" in line]
    assert len(summaries) == 1, res.stdout  # rank 1 stays silent
    assert summaries[0]["world_size"] == 2 and summaries[0]["steps"] == 2
    assert [s for s, _ in list_checkpoints(out)] == [1, 2]
    state = read_state(list_checkpoints(out)[-1][1])
    assert state["world_size"] == 2 and state["strategy"] == "fsdp2"
    assert {"trainer/__0_0.distcp", "trainer/__1_0.distcp", "trainer/rng-0.pt", "trainer/rng-1.pt"} <= set(state["files"])
    assert not [p for p in out.iterdir() if p.name.startswith(".")], "no staging left behind"
    rows = pq.read_table(str(metrics)).to_pylist()
    assert sorted(r["step"] for r in rows) == [1, 2]  # one metrics row per step, from rank 0
