"""Run by train_scale.py (its `scale` part), one process or under torchrun: open the trainer on SmolLM2, train
two packed steps on a batch of two short rows (so that the state, not the activations, is what is held), save
a full checkpoint (the streamed HF export and the DCP shards), and print one JSON line per rank: its RSS
over the RSS before the trainer (`held`: after the second step, the state), and its peak over that before
the save (`step_peak`) and after it (`save_peak`), in bytes."""

from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path

import pyarrow as pa

from arlctl.rl import distributed as dd
from arlctl.rl.config import TrainConfig
from arlctl.rl.trainer_state import TrainerState
from arlctl.stages.train import train_step
from arlctl.synthetic import synthetic_table


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> None:
    policy, out, settings = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    d = dd.init_dist("cpu")
    start = max(rss(), peak())
    trainer = TrainerState.open(out, None, {"step": 0}, Path(policy), TrainConfig(device="cpu", **settings), d)
    batch = synthetic_table(1, group_size=2, seed=0, mean_turns=1, tokens_per_turn=8)
    batch = batch.set_column(batch.schema.get_field_index("advantage"), batch.schema.field("advantage"),
                             pa.array([1.0, -1.0], batch.schema.field("advantage").type))
    for version in (0, 1):
        metrics = train_step(trainer.module, trainer.ref, trainer.optimizer, trainer.scheduler, batch, trainer.cfg,
                             version=version, trainer=trainer)
        assert metrics["skipped_nonfinite"] == 0, metrics["warning"]
    held, step_peak = rss() - start, peak() - start
    trainer.step = 2
    trainer.save(out, {"step": 2, "consumed_batches": []}, full=True)
    sys.stdout.write(json.dumps({"rank": d.rank, "held": held, "step_peak": step_peak, "save_peak": peak() - start,
                                 "packed": metrics["packed"]}) + "\n")
    sys.stdout.flush()
    if d.world > 1:
        import torch.distributed

        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
