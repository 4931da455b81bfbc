"""Run under torchrun by test_streamed_export.py: one step of `train` under FSDP2 (the checkpoint's HF
weights, LoRA's merged weights or adapters, streamed tensor by tensor), then, on every rank, the gathered full state dict the export replaced
(TrainerState.hf_state_dict, a collective); rank 0 compares the two and reports what the export held."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from arlctl.io.ledger import latest_checkpoint
from arlctl.rl.config import TrainConfig
from arlctl.rl.streamed_export import EXPORT_STATS
from arlctl.stages import train as stage


def main() -> None:
    batches, policy, out, settings = sys.argv[1:5]
    cfg = TrainConfig(**{"device": "cpu", "max_steps": 1, "save_every": 1, **json.loads(settings)})
    stage.train(batches, policy, out, cfg, keep=True)
    trainer = stage._TRAINERS[out]
    gathered = trainer.hf_state_dict()  # every rank takes part; rank 0 gets the tensors
    if int(os.environ.get("RANK", "0")) != 0:
        return
    directory = Path(latest_checkpoint(out)[1])
    written = load_file(str(directory / ("adapter_model.safetensors" if cfg.publish_format == "adapter"
                                         else "model.safetensors")))
    if getattr(trainer.lm.config, "tie_word_embeddings", False):
        gathered.pop("lm_head.weight", None)
    report = {"streamed": True, "keys_equal": sorted(written) == sorted(gathered),
              "different": [k for k in gathered if k in written and not torch.equal(written[k], gathered[k])],
              "dtypes": sorted({str(v.dtype) for v in written.values()}),
              "largest_tensor": max(v.numel() * v.element_size() for v in written.values()),
              "total": sum(v.numel() * v.element_size() for v in written.values()), **EXPORT_STATS}
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
