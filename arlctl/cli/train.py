"""`arlctl train`: batch shards -> optimizer steps -> checkpoints (thin layer over stages/train.py)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from arlctl.cli.common import console, handle_errors, print_json
from arlctl.cli.daemon import run_stage
from arlctl.cli.options import (
    DryRunOpt,
    InOpt,
    JsonOpt,
    LockWaitOpt,
    MetricsOpt,
    OutOpt,
    PollOpt,
    RunOpt,
    WatchOpt,
    config_command,
)
from arlctl.errors import UsageError
from arlctl.io.run import RunLayout
from arlctl.stages.configs import TrainConfig

HELP = """Train the policy on batch shards: one optimizer step per shard, in name order, each shard once.

Loss: PPO-clip on mask-1 tokens against the recorded behaviour log-probs, optional truncated importance sampling (--tis-cap) and k3 KL to the initial policy (--kl-coef), named aggregation (--loss-agg), per-row weights. Resumes from the newest checkpoint in --out by default. SIGTERM (or Ctrl-C) ends the run at a step boundary, with that step checkpointed. --dry-run names the batches it would train on, with the config, and writes nothing.

Non-finite values never reach the weights: a row with a bad value (NaN/inf log-prob, advantage or weight; token id outside the vocabulary; ...) is left out of its step, and a step whose gradient is still non-finite is skipped (its batch counts as consumed). Each event is a warning here, a count in --json (skipped_nonfinite, rows_dropped_invalid) and in the step's metrics (errors, last_error).

  arlctl train --run RUN --policy smollm2-135m

  arlctl train --in RUN/batches --policy RUN/policy --out RUN/checkpoints --lr 1e-6 --micro-tokens 4096

  arlctl train --run RUN --dry-run    # the batches it would train on; nothing written

  arlctl train --run s3://bucket/run --policy smollm2-135m    # checkpoints uploaded, state.json last
"""


def register(app: typer.Typer) -> None:
    @app.command("train", help=HELP)
    @handle_errors
    @config_command(TrainConfig)
    def train_cmd(
        cfg: TrainConfig,
        in_url: InOpt = None,
        out: OutOpt = None,
        policy: Annotated[str | None, typer.Option(
            "--policy", help="Initial weights: HF dir, policy dir or model name.")] = None,
        run: RunOpt = None,
        metrics: MetricsOpt = None,
        resume: Annotated[bool, typer.Option("--resume/--no-resume",
                                             help="Continue from the newest checkpoint.")] = True,
        dry_run: DryRunOpt = False,
        watch: WatchOpt = False,
        poll: PollOpt = 5.0,
        lock_wait: LockWaitOpt = 0.0,
        as_json: JsonOpt = False,
    ) -> None:
        # torch comes with the stage: import late so `arlctl --help` stays fast
        from arlctl.stages import train as stage
        from arlctl.stages.results import TrainIO

        if run is None and (in_url is None or out is None):
            raise UsageError("give --in and --out, or --run RUN")
        layout = RunLayout(run) if run else None
        io = TrainIO(in_url=in_url or layout.batches, out=out or layout.checkpoints, policy=policy,
                     metrics=metrics or (layout.metrics if layout else None), resume=resume)
        if dry_run:
            _dry_run(stage.plan(cfg, io), cfg, io, as_json)
            return

        def once(stop) -> dict:
            result = stage.run(cfg, io, stop, on_step=_line)
            if result.steps or not watch:
                console.print(result.summary_line())
            if result.skipped_nonfinite or result.rows_dropped_invalid:
                console.print(f"[yellow]warning:[/] {result.skipped_nonfinite} steps skipped and "
                              f"{result.rows_dropped_invalid} rows dropped for bad values")
            if as_json and (result.steps or not watch):
                print_json(result.to_json())
            return result.to_json()

        run_stage(once, out=io.out, lock_name="train", watch=watch, poll=poll, lock_wait=lock_wait,
                  units=lambda summary: summary["steps"])


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
