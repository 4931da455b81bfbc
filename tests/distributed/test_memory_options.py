"""--grad-checkpoint and --offload change where memory goes, not the step (issue 15)."""

from __future__ import annotations

import json

import pytest

from arlctl.io.ledger import latest_checkpoint
from arlctl.rl.config import TrainConfig
from arlctl.stages.train import train
from tests.distributed.common import make_uneven_batches, max_diff, small_init_model, torchrun, weights

pytestmark = pytest.mark.distributed

SETTINGS = dict(lr=3e-4, kl_coef=0.05, micro_tokens=160, save_every=2, max_steps=2, loss_agg="token-mean")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("memory")
    model = small_init_model(root)
    batches = make_uneven_batches(root, model)
    train(batches, str(model), str(root / "plain"), TrainConfig(strategy="single", device="cpu", **SETTINGS))
    return root, batches, model, weights(latest_checkpoint(root / "plain")[1])


def test_grad_checkpoint_gives_the_same_step(reference, tmp_path):
    root, batches, model, expected = reference
    train(batches, str(model), str(tmp_path / "gc"),
          TrainConfig(strategy="single", device="cpu", grad_checkpoint=True, **SETTINGS))
    assert max_diff(expected, weights(latest_checkpoint(tmp_path / "gc")[1])) < 1e-6


def test_fsdp2_offload_with_grad_checkpoint_on_two_ranks_gives_the_same_step(reference, tmp_path):
    root, batches, model, expected = reference
    settings = {k: v for k, v in SETTINGS.items() if k != "loss_agg"}
    res = torchrun(["tests/distributed/worker.py", batches, str(model), str(tmp_path / "off"), "fsdp2", "token-mean",
                    json.dumps({**settings, "offload": True, "grad_checkpoint": True})])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    diff = max_diff(expected, weights(latest_checkpoint(tmp_path / "off" / "token-mean")[1]))
    print(f"fsdp2 --offload --grad-checkpoint x2 vs 1 process: {diff:.2e}")
    assert diff < 1e-5
