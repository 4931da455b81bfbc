"""Run under torchrun by test_memory_plan_ranks.py: two steps of `train` on every rank, the bytes this
rank's trainer holds counted at the second optimizer step (memory_plan.held_bytes), one JSON line a rank."""

from __future__ import annotations

import json
import os
import sys

from arlctl.rl.config import TrainConfig
from arlctl.rl.memory_plan import held_bytes
from arlctl.stages import train as stage


def main() -> None:
    batches, policy, out, settings = sys.argv[1:5]
    cfg = TrainConfig(**{"device": "cpu", "max_steps": 1, "save_every": 10, **json.loads(settings)})
    stage.train(batches, policy, out, cfg, keep=True)
    trainer = stage._TRAINERS[out]
    measured: list[dict[str, int]] = []
    trainer.optimizer.register_step_pre_hook(lambda *_: measured.append(held_bytes(trainer)))
    stage.train(batches, policy, out, cfg, keep=True)
    sys.stdout.write(json.dumps({"rank": int(os.environ.get("RANK", "0")), "strategy": trainer.strategy,
                                 "held": measured}) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
