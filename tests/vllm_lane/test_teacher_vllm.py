"""`train --teacher URL`: a real `vllm serve` process scores the student's tokens for on-policy distillation.

The engine's prompt log-probs of a row equal transformers' own scores of the same ids (to the lane's 2e-3),
laid out like the trainer's loss mask; the distillation advantages from the engine equal those from the same
model scored in process; and a `train` step on a batch filtered with --adv distill runs against the URL.
"""

from __future__ import annotations

import os
import signal

import pyarrow as pa
import pytest
import torch
from test_openai_vllm_serve import _free_port, _start, _wait_healthy
from test_vllm_policy import TOL
from transformers import AutoModelForCausalLM

from arlctl.io.shards import Lineage, write_shard
from arlctl.rl.batching import collate, score_tokens
from arlctl.rl.config import TrainConfig
from arlctl.rl.distill import distill_advantages
from arlctl.rl.teacher import EngineTeacher
from arlctl.stages.train import train
from arlctl.synthetic import synthetic_table

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm.engine.arg_utils", reason="the vllm lane needs .venv-vllm (.ci/vllm_lane.sh)")


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("teacher-log") / "serve.log"
    port = _free_port()
    proc = _start(model_dir, port, log)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, log)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)


def rows(n: int = 2) -> pa.Table:
    table = synthetic_table(1, group_size=n, seed=5, mean_turns=3, tokens_per_turn=40, envs=("math",))
    return table.set_column(table.schema.get_field_index("status"), "status", pa.array(["ok"] * n))


def test_engine_teacher_scores_equal_transformers_and_drive_distillation(server, model_dir, tmp_path):
    teacher = EngineTeacher(server)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    table = rows()
    mb = collate(table, list(range(table.num_rows)))
    engine = teacher.score_micro_batch(mb)  # [B, L-1]
    with torch.no_grad():
        local, _ = score_tokens(model, mb)  # [B, L-1]
    on = mb.loss_mask
    assert int(on.sum()) > 10 and bool((engine[~on] == 0).all())
    gap = float((engine[on] - local[on]).abs().max())
    print(f"max |engine - transformers| over {int(on.sum())} trained tokens: {gap:.2e}")
    assert gap < TOL
    adv_engine = distill_advantages(engine, mb.behaviour_logp, on)
    adv_local = distill_advantages(local, mb.behaviour_logp, on)
    assert float((adv_engine - adv_local).abs().max()) < TOL

    batches = tmp_path / "batches"
    table = table.set_column(table.schema.get_field_index("advantage"), "advantage",
                             pa.array([0.0] * table.num_rows, pa.float32()))
    write_shard(table, str(batches / "batch-0.parquet"), Lineage("filter", extra={"config": {"adv": "distill"}}))
    summary = train(str(batches), str(model_dir), str(tmp_path / "ckpt"),
                    TrainConfig(device="cpu", lr=1e-5, teacher=server, micro_tokens=4096))
    assert summary["steps"] == 1 and summary["skipped_nonfinite"] == 0
