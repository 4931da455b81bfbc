"""Trainer modes of issue 15 on one process: bf16 with fp32 master weights, weights-only checkpoints
(--publish-every) and a resume from the newest full one, and the trainer kept in memory across --watch cycles."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from arlctl.io.ledger import latest_checkpoint, list_checkpoints, read_state
from arlctl.io.shards import scan
from arlctl.models import tiny_model_dir
from arlctl.rl import distributed as dd
from arlctl.rl.config import TrainConfig
from arlctl.rl.trainer_state import TrainerState
from arlctl.runstate import trainer_progress
from arlctl.stages import train as stage
from arlctl.stages.train import train
from tests.stages.test_train import make_batches

BASE = dict(lr=1e-3, device="cpu")


def weights(ckpt) -> dict[str, torch.Tensor]:
    return load_file(str(Path(ckpt) / "model.safetensors"))


def max_diff(a, b) -> float:
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.fixture(scope="module")
def batches(tmp_path_factory):
    return make_batches(tmp_path_factory.mktemp("modes"), 4)


@pytest.mark.slow
def test_bf16_single_runs_bf16_weights_with_an_fp32_master_copy(batches, tmp_path):
    cfg = TrainConfig(precision="bf16", save_every=1, **BASE)
    trainer = TrainerState.open(str(tmp_path / "x"), None, {"step": 0}, tiny_model_dir(), cfg, dd.Dist())
    assert {p.dtype for p in trainer.module.parameters()} == {torch.bfloat16}
    assert {p.dtype for g in trainer.optimizer.param_groups for p in g["params"]} == {torch.float32}
    assert trainer.master_copy

    straight = tmp_path / "straight"
    assert train(batches, str(tiny_model_dir()), str(straight), TrainConfig(max_steps=2, precision="bf16",
                                                                               save_every=1, **BASE))["steps"] == 2
    w = weights(latest_checkpoint(straight)[1])
    first = weights(latest_checkpoint(straight)[1].parent / "step-000001")
    # Published in fp32 from the master copy: values bf16 cannot hold, and they moved.
    assert all(v.dtype == torch.float32 for v in w.values())
    assert any(not torch.equal(v, v.to(torch.bfloat16).float()) for v in w.values())
    assert max_diff(w, first) > 1e-4
    # Resume: 1 step, then 1 more, == 2 straight (the master copy and AdamW state are in the checkpoint).
    split = tmp_path / "split"
    train(batches, str(tiny_model_dir()), str(split), TrainConfig(max_steps=1, precision="bf16", save_every=1, **BASE))
    train(batches, None, str(split), TrainConfig(max_steps=1, precision="bf16", save_every=1, **BASE))
    assert max_diff(w, weights(latest_checkpoint(split)[1])) < 1e-6


@pytest.mark.slow
def test_weights_only_checkpoints_and_resume_from_the_newest_full(batches, tmp_path):
    out = tmp_path / "ckpt"
    cfg = TrainConfig(save_every=3, publish_every=1, **BASE)
    # A --watch cycle (keep): steps 1, 2 weights-only, 3 full, 4 weights-only at the end of the cycle.
    assert train(batches, str(tiny_model_dir()), str(out), cfg, keep=True)["steps"] == 4
    kinds = {s: read_state(loc)["full"] for s, loc in list_checkpoints(out)}
    assert kinds == {1: False, 2: False, 3: True, 4: False}
    light = latest_checkpoint(out)[1]
    assert (light / "model.safetensors").is_file() and not (light / "trainer").exists()
    assert read_state(light)["consumed_batches"] == [Path(u).name for u in scan(batches).shards]
    assert trainer_progress(str(out))["resume_step"] == 3
    step4 = weights(light)
    # The process dies here (no finish): a new one resumes from step 3, the newest full checkpoint, and
    # redoes step 4 with the same result.
    stage._TRAINERS.clear()
    again = train(batches, None, str(out), cfg)
    assert again["resumed_from"] == 3 and again["steps"] == 1 and again["step"] == 4
    assert read_state(latest_checkpoint(out)[1])["full"] is True  # the end of a run is a full checkpoint
    assert max_diff(step4, weights(latest_checkpoint(out)[1])) < 1e-6


@pytest.mark.slow
def test_prune_keeps_the_newest_full_checkpoint(batches, tmp_path):
    out = tmp_path / "ckpt"
    train(batches, str(tiny_model_dir()), str(out), TrainConfig(save_every=2, publish_every=1, keep_checkpoints=1,
                                                                max_steps=3, **BASE), keep=True)
    stage._TRAINERS.clear()
    assert [(s, read_state(loc)["full"]) for s, loc in list_checkpoints(out)] == [(2, True), (3, False)]


@pytest.mark.slow
def test_watch_cycles_keep_the_trainer_in_memory(batches, tmp_path, monkeypatch):
    opened = []
    original = TrainerState.open.__func__

    def counting(cls, *args, **kwargs):
        opened.append(args[1])
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(TrainerState, "open", classmethod(counting))
    incoming = tmp_path / "batches"
    incoming.mkdir()
    shards = scan(batches).shards
    cfg = TrainConfig(save_every=1, **BASE)
    out = tmp_path / "ckpt"
    for first, last in ((0, 2), (2, 4)):  # two cycles, new batches arriving between them
        for url in shards[first:last]:
            shutil.copy(url, incoming / Path(url).name)
        assert train(str(incoming), str(tiny_model_dir()), str(out), cfg, keep=True)["steps"] == 2
    assert len(opened) == 1, "the second cycle must reuse the trainer in memory"
    assert stage.finish(str(out)) == 0.0  # its newest checkpoint is already full: nothing to add
    straight = tmp_path / "straight"
    train(batches, str(tiny_model_dir()), str(straight), cfg)
    assert max_diff(weights(latest_checkpoint(straight)[1]), weights(latest_checkpoint(out)[1])) < 1e-6
    stage._TRAINERS.clear()
