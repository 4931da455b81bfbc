"""Run under torchrun by test_sharded_load.py: build the trainer (and its KL reference) on every rank and
report what loading cost this rank: the bytes it read from the weight files (sharded_load.LOAD_STATS), the
growth of its peak RSS over the RSS just before, and whether every local shard equals that slice of the
file's tensor (checked only with --check, reading whole tensors after the measurement). With --step, one
packed training step follows (a batch of two short rows, so that the state, not the activations, sets the
peak) and the peak RSS after it is reported too."""

from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path

import torch

from arlctl.rl import distributed as dd
from arlctl.rl.config import TrainConfig
from arlctl.rl.lora import file_key
from arlctl.rl.sharded_load import LOAD_STATS
from arlctl.rl.trainer_state import TrainerState


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main() -> None:
    policy, out, settings, check = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), "--check" in sys.argv
    d = dd.init_dist("cpu")
    before = rss_bytes()
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    trainer = TrainerState.open(out, None, {"step": 0}, Path(policy), TrainConfig(device="cpu", **settings), d)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    report = {"rank": d.rank, "world": d.world, "strategy": trainer.strategy, **LOAD_STATS,
              "rss_before": before, "peak_before": peak_before, "peak": peak, "reference": trainer.ref is not None, "lora": trainer.lora}
    if "--step" in sys.argv:
        report.update(one_step(trainer))
    if check:
        from safetensors.torch import load_file

        full = load_file(str(Path(policy) / "model.safetensors"))
        if trainer.lora:  # the adapters one process draws: every rank's slice of them must be these
            from arlctl.rl.lora import apply_lora, init_adapters
            from arlctl.rl.trainer_state import load_model

            one = apply_lora(load_model(Path(policy)), trainer.cfg.lora_rank, trainer.cfg.lora_alpha,
                             trainer.cfg.lora_target_list())
            init_adapters(one, trainer.cfg.seed)
            full.update({k: v for k, v in one.state_dict().items() if ".lora_" in k})
            report["adapters"] = sum(".lora_" in k for k in full)
        wrong = []
        for model in (trainer.master, trainer.ref) if isinstance(trainer.ref, torch.nn.Module) else (trainer.master,):
            for name, param in model.named_parameters():
                local = param.to_local() if hasattr(param, "to_local") else param
                key = name.removeprefix("lm.")
                key = key if ".lora_" in key else file_key(key)
                if key not in full:
                    continue
                from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

                shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
                want = full[key][tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))]
                if not torch.equal(local.detach(), want):
                    wrong.append(name)
        report["wrong"] = wrong
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def one_step(trainer: TrainerState) -> dict:
    import pyarrow as pa

    from arlctl.stages.train import train_step
    from arlctl.synthetic import synthetic_table

    batch = synthetic_table(1, group_size=2, seed=0, mean_turns=1, tokens_per_turn=8)
    batch = batch.set_column(batch.schema.get_field_index("advantage"), batch.schema.field("advantage"),
                             pa.array([1.0, -1.0], batch.schema.field("advantage").type))
    metrics = train_step(trainer.module, trainer.ref, trainer.optimizer, trainer.scheduler, batch, trainer.cfg,
                         version=0, trainer=trainer)
    return {"step_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "packed": metrics["packed"],
            "skipped": metrics["skipped_nonfinite"]}


if __name__ == "__main__":
    main()
