"""Sharded checkpoints on an object store (issue 15): 2 ranks write to S3 (moto on 127.0.0.1), each uploading
its own shard files, rank 0 committing state.json last; one process resumes from there."""

from __future__ import annotations

import json

import fsspec
import pytest
from safetensors.torch import load_file

from arlctl.io.ledger import latest_checkpoint, read_state
from arlctl.rl.config import TrainConfig
from arlctl.stages.train import train
from tests.distributed.common import make_uneven_batches, max_diff, small_init_model, torchrun, weights

pytestmark = pytest.mark.distributed

SETTINGS = dict(lr=3e-4, micro_tokens=160, save_every=1)


def test_two_ranks_checkpoint_to_s3_and_one_process_resumes(s3_bucket, tmp_path):
    model = small_init_model(tmp_path)
    batches = make_uneven_batches(tmp_path, model, n_batches=4)
    remote = f"{s3_bucket}/run/checkpoints"
    res = torchrun(["tests/distributed/worker.py", batches, str(model), remote, "fsdp2", "token-mean",
                    json.dumps({**SETTINGS, "max_steps": 2})])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    step, newest = latest_checkpoint(f"{remote}/token-mean")
    state = read_state(newest)
    assert step == 2 and state["world_size"] == 2
    fs, root = fsspec.core.url_to_fs(f"{remote}/token-mean")
    keys = {k.split("/token-mean/", 1)[1] for k in fs.find(root)}
    assert {"step-000002/trainer/__0_0.distcp", "step-000002/trainer/__1_0.distcp",
            "step-000002/trainer/.metadata", "step-000002/state.json"} <= keys
    assert sorted(state["files"]) == sorted(k.split("/", 1)[1] for k in keys
                                            if k.startswith("step-000002/") and not k.endswith("state.json"))
    assert not [k for k in keys if k.startswith(".")], "no staging left on the store"
    resumed = train(batches, None, f"{remote}/token-mean", TrainConfig(strategy="single", device="cpu", **SETTINGS))
    assert resumed["resumed_from"] == 2 and resumed["step"] == 4
    straight = tmp_path / "straight"
    train(batches, str(model), str(straight), TrainConfig(strategy="single", device="cpu", **SETTINGS))
    with fsspec.open(f"{latest_checkpoint(f'{remote}/token-mean')[1]}/model.safetensors", "rb") as fh:
        (tmp_path / "remote.safetensors").write_bytes(fh.read())
    diff = max_diff(weights(latest_checkpoint(straight)[1]), load_file(str(tmp_path / "remote.safetensors")))
    print(f"2 ranks to S3, resumed on 1 process: max |w - straight| = {diff:.2e}")
    assert diff < 1e-5
