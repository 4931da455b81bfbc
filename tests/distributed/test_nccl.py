"""The equivalence test on GPUs over NCCL (issue 15): runs only where CUDA is (`benchmarks/gpu_check.sh`).

torchrun with one rank per visible GPU (at most 2; with one GPU, a 1-rank FSDP2 world still runs the NCCL
process group, the sharding wrapper and the DCP checkpoint), fp32, against one process on the first GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from arlctl.io.ledger import latest_checkpoint
from arlctl.rl.config import TrainConfig
from arlctl.stages.train import train
from tests.distributed.common import REPO, make_uneven_batches, max_diff, small_init_model, weights

pytestmark = [pytest.mark.distributed,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (NCCL)")]

SETTINGS = dict(lr=3e-4, kl_coef=0.05, tis_cap=2.0, micro_tokens=160, save_every=3, max_steps=3, device="auto")


@pytest.mark.parametrize("strategy", ["fsdp2", "ddp"])
def test_nccl_ranks_equal_one_gpu_process(tmp_path, strategy):
    ranks = min(2, torch.cuda.device_count())
    model = small_init_model(tmp_path)
    batches = make_uneven_batches(tmp_path, model)
    train(batches, str(model), str(tmp_path / "one" / "token-mean"),
          TrainConfig(strategy="single", loss_agg="token-mean", **SETTINGS))
    env = {**os.environ, "OMP_NUM_THREADS": "4", "HF_HUB_OFFLINE": "1"}
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
                          "tests/distributed/worker.py", batches, str(model), str(tmp_path / "many"), strategy,
                          "token-mean", json.dumps(SETTINGS)], capture_output=True, text=True, cwd=REPO, env=env,
                         timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    one = weights(latest_checkpoint(tmp_path / "one" / "token-mean")[1])
    many = weights(latest_checkpoint(tmp_path / "many" / "token-mean")[1])
    print(f"nccl {strategy} x{ranks} vs 1 GPU: {max_diff(one, many):.2e}")
    assert max_diff(one, many) < 1e-5
