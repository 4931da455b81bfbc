"""The train stage's job: what `arlctl train` does, callable without the CLI.

plan_train checks the settings, then the IO (--in/--out or --run: the batches it reads, the checkpoints it
writes, the run's metrics), and writes nothing. run_job trains what is pending under the stage's run lock,
once or as a daemon (io/stage_loop.py), or on every rank of a torchrun world (rank 0 holds the lock and
reports; every rank steps), and checkpoints the trainer kept in memory at the end. launch_ranks re-runs a
train command line under torchrun on this machine (`--nproc N`). torch is imported by run_job only.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from arlctl.errors import UsageError
from arlctl.rl.config import TrainConfig
from arlctl.stages.jobs import StageLoop, TrainOptions, loop_of
from arlctl.stages.results import TrainIO, TrainResult

StepHook = Callable[[int, dict[str, Any]], None]
RoundHook = Callable[[TrainResult], None]


@dataclass(kw_only=True)
class TrainJob(StageLoop):
    """One invocation: the settings, where batches come from and checkpoints go, and how it runs."""

    cfg: TrainConfig
    io: TrainIO
    dry_run: bool = False
    nproc: int = 0  # > 0: launch_ranks runs the command under torchrun instead


def plan_train(cfg: TrainConfig, opts: TrainOptions) -> TrainJob:
    """Check the settings, then the IO (a wrong setting is named before the IO is looked at); nothing is
    written."""
    from arlctl.io.run import RunLayout, resolve_io

    if opts.run is None and (opts.in_url is None or opts.out is None):
        raise UsageError("give --in and --out, or --run RUN")
    if opts.nproc < 0:
        raise UsageError(f"--nproc must be >= 1, not {opts.nproc}", hint="0 (the default) trains in this process")
    cfg.check()
    in_url, out = resolve_io("train", opts.run, opts.in_url, opts.out, watch=opts.watch)
    metrics = opts.metrics or (RunLayout(opts.run).metrics if opts.run else None)  # no --run: only where asked
    io = TrainIO(in_url=in_url, out=out, policy=opts.policy, metrics=metrics, resume=opts.resume)
    return TrainJob(cfg=cfg, io=io, dry_run=opts.dry_run, nproc=opts.nproc, **loop_of(opts))


def run_job(job: TrainJob, on_step: StepHook | None = None, on_round: RoundHook | None = None) -> list[TrainResult]:
    """Train what is pending (with --watch: every --poll s until SIGTERM/SIGINT; a signal ends the run at a
    step boundary, checkpointed); each round's result, in order. A dry run returns the plan alone. Under
    torchrun every rank runs this and only rank 0 calls the hooks."""
    from arlctl.io.stage_loop import run_stage
    from arlctl.rl.distributed import launched_by_torchrun
    from arlctl.stages import train as stage  # torch

    if job.dry_run:
        planned = stage.plan(job.cfg, job.io)
        if on_round is not None:
            on_round(planned)
        return [planned]
    main_rank = os.environ.get("RANK", "0") == "0"
    results: list[TrainResult] = []

    def once(stop: Any) -> dict[str, Any]:
        result = stage.run(job.cfg, job.io, stop, on_step=on_step if main_rank else None, keep=job.watch)
        results.append(result)
        if main_rank and on_round is not None:
            on_round(result)
        return result.to_json()

    ranks = int(os.environ.get("WORLD_SIZE", "1")) if launched_by_torchrun() else 1
    if ranks > 1:
        _run_ranks(job, once)
        return results
    try:
        run_stage(once, out=job.io.out, lock_name="train", watch=job.watch, poll=job.poll, lock_wait=job.lock_wait,
                  units=lambda summary: summary["steps"])
    finally:
        stage.finish(job.io.out, job.io.policy)
    return results


def _run_ranks(job: TrainJob, once: Callable[[Any], dict[str, Any]]) -> None:
    """One rank of a torchrun world: rank 0 holds the run lock; every rank runs each cycle (they agree on
    stopping at every step boundary, so a SIGTERM seen by one rank stops them all); the trainer's last state
    is checkpointed at the end."""
    import threading

    import torch.distributed as dist

    from arlctl.io.lock import RunLock
    from arlctl.io.watch import GracefulStop
    from arlctl.rl.distributed import init_dist
    from arlctl.stages import train as stage

    d = init_dist()
    stop = threading.Event()
    lock = RunLock(job.io.out, "train", wait_s=job.lock_wait) if d.is_main else contextlib.nullcontext()
    with lock, GracefulStop(stop):
        try:
            while True:
                summary = once(stop)
                if not job.watch or d.any(stop.is_set()):
                    break
                if not summary["steps"]:
                    stop.wait(job.poll)
            stage.finish(job.io.out, job.io.policy)
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()


def launch_ranks(nproc: int, argv: list[str], say: Callable[[str], None] = print) -> int:
    """`arlctl train --nproc N ...`: the command line `argv` (without the program name) run again under
    torchrun with N ranks on this machine, without its --nproc; returns torchrun's exit code."""
    import subprocess

    if nproc < 1:
        raise UsageError(f"--nproc must be >= 1, not {nproc}")
    args, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            args.append(arg)
    env = dict(os.environ)
    if nproc > 1:
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    # `-m --`: torchrun's own parser would take train's `--run` as an abbreviation of its `--run-path`.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "--", "arlctl.cli.main", *args]
    say(f"launching: {' '.join(cmd[2:])}")
    return subprocess.call(cmd, env=env)
