"""`arlctl train`: batch shards -> optimizer steps -> checkpoints (thin layer over stages/train.py)."""

from __future__ import annotations

import sys
from typing import Any

import typer

from arlctl.cli.common import console, handle_errors, print_json
from arlctl.cli.options import config_command
from arlctl.rl.config import TrainConfig
from arlctl.stages.jobs import TrainOptions

HELP = """Train the policy on batch shards: one optimizer step per shard, in name order, each shard once.

Loss: PPO-clip on mask-1 tokens against the recorded behaviour log-probs, optional truncated importance sampling (--tis-cap) and k3 KL to the initial policy (--kl-coef), named aggregation (--loss-agg), per-row weights. Resumes from the newest checkpoint in --out by default. SIGTERM (or Ctrl-C) ends the run at a step boundary, with that step checkpointed. --dry-run names the batches it would train on, with the config, and writes nothing.

Non-finite values never reach the weights: a row with a bad value (NaN/inf log-prob, advantage or weight; token id outside the vocabulary; ...) is left out of its step, and a step whose gradient is still non-finite is skipped (its batch counts as consumed). Each event is a warning here, a count in --json (skipped_nonfinite, rows_dropped_invalid) and in the step's metrics (errors, last_error).

  arlctl train --run RUN --policy smollm2-135m

  arlctl train --in RUN/batches --policy RUN/policy --out RUN/checkpoints --lr 1e-6 --micro-tokens 4096

  arlctl train --run RUN --dry-run    # the batches it would train on; nothing written

  arlctl train --run s3://bucket/run --policy smollm2-135m    # checkpoints uploaded, state.json last

  arlctl train --run RUN --policy smollm2-135m --nproc 8 --precision bf16    # FSDP2 on 8 GPUs (launches torchrun)

  torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HEAD:29500 -m -- arlctl.cli.main train --run RUN

  arlctl train --run RUN --publish-every 1 --save-every 20    # weights-only versions; optimizer state every 20 steps

  arlctl train --run RUN --lora-rank 16 --lora-targets q_proj,v_proj    # train adapters only; publish merged weights

Many ranks (torchrun): each batch shard's rows are split across ranks by tokens and the loss is normalised by the whole shard's counts, so a step is the same step on any number of ranks. --strategy fsdp2 (the default on more than one rank) shards weights, gradients and optimizer state; ddp replicates them. Only rank 0 writes metrics and commits checkpoints; every rank writes its own shard files, and a checkpoint resumes on any number of ranks.
"""


def register(app: typer.Typer) -> None:
    @app.command("train", help=HELP)
    @handle_errors
    @config_command(TrainConfig, options=TrainOptions)
    def train_cmd(cfg: TrainConfig, opts: TrainOptions) -> None:
        from arlctl.stages import train_job

        job = train_job.plan_train(cfg, opts)
        if job.nproc:
            raise typer.Exit(train_job.launch_ranks(job.nproc, sys.argv[1:],
                                                    say=lambda line: console.print(line, markup=False, soft_wrap=True)))

        def show(result: Any) -> None:
            if job.dry_run:
                _dry_run(result, cfg, job.io, opts.as_json)
                return
            if result.steps or not job.watch:
                console.print(result.summary_line())
            if result.skipped_nonfinite or result.rows_dropped_invalid:
                console.print(f"[yellow]warning:[/] {result.skipped_nonfinite} steps skipped and "
                              f"{result.rows_dropped_invalid} rows dropped for bad values")
            if opts.as_json and (result.steps or not job.watch):
                print_json(result.to_json())

        train_job.run_job(job, on_step=_line, on_round=show)


def _dry_run(plan: Any, cfg: TrainConfig, io: Any, as_json: bool) -> None:
    """--dry-run: the batches `train` would take, from where, with which settings; nothing loaded or written."""
    import dataclasses

    start = f"checkpoint {plan.checkpoint}" if plan.checkpoint else f"the initial policy {io.policy}"
    console.print(f"dry run: would train {len(plan.batches)} steps from {start} into {io.out}", markup=False,
                  soft_wrap=True)
    for name in plan.batches:
        console.print(f"  {name}", markup=False)
    console.print(f"config: {dataclasses.asdict(cfg)}", markup=False, soft_wrap=True)
    if as_json:
        print_json({"dry_run": True, **plan.to_json(), "config": dataclasses.asdict(cfg)})


def _line(step: int, m: dict[str, Any]) -> None:
    console.print(
        f"step [bold]{step:>5}[/]  loss {m['loss']:+.4f}  reward {m['reward_mean']:.3f}  "
        f"adv|{m['advantage_abs_mean']:.3f}|  kl {m['approx_kl']:.2e}  ent {m['entropy']:.3f}  "
        f"clip {m['clip_frac_low']:.3f}/{m['clip_frac_high']:.3f}  gnorm {m['grad_norm']:.3f}  "
        f"lr {m['lr']:.1e}  {m['tokens_per_s']:.0f} tok/s"
    )
    if m.get("warning"):
        # markup=False: the text quotes values read from a shard.
        console.print(f"warning: step {step}: {m['warning']}", markup=False, style="yellow", soft_wrap=True)
