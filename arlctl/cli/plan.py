"""`arlctl plan`: a capacity and cost ledger calibrated from a run's own shards and metrics."""

from __future__ import annotations

import typer

from arlctl.cli.common import console, handle_errors, print_json
from arlctl.cli.options import JsonOpt
from arlctl.render import plain

HELP = """Turn what a run measured into a capacity and cost ledger: per trajectory the generated and prefill tokens, turns, wall, policy, environment, sandbox and reward seconds and trained tokens; per optimizer step what each pool (inference GPUs, sandboxes, reward workers, trainer GPUs) must supply; the steps/hour each pool sustained as run and the bottleneck; the balance one inference GPU needs (trajectories in flight, sandboxes at in-flight ~= 1.3 x sandboxes); and, with --target-steps-per-hour, the pools and the dollars to reach it.

Rates come from the newest --last trajectory shards (RUN/rollouts, else RUN/rewarded) and the run's metrics rows (train, rollout, reward). What the run does not record is printed as "not recorded" with the reason, never guessed; --inference-tok-s and --rows-per-step supply a rate measured elsewhere (a GPU engine, a planned batch size).

  arlctl plan runs/r1

  arlctl plan runs/r1 --target-steps-per-hour 60 --gpu-hour-price 2.5 --cpu-hour-price 0.04

  arlctl plan runs/r1 --inference-tok-s 2500 --target-steps-per-hour 120 --json | jq .target
"""


def register(app: typer.Typer) -> None:
    @app.command("plan", help=HELP)
    @handle_errors
    def plan_cmd(
        run: str = typer.Argument(..., help="Run directory (local path or fsspec URL)."),
        target: float | None = typer.Option(None, "--target-steps-per-hour", help="Size every pool for this rate."),
        gpu_price: float | None = typer.Option(None, "--gpu-hour-price", help="$ per GPU-hour."),
        cpu_price: float | None = typer.Option(None, "--cpu-hour-price", help="$ per CPU-hour (sandboxes, reward)."),
        cpus_per_sandbox: float = typer.Option(1.0, "--cpus-per-sandbox", help="CPUs one sandbox is billed for."),
        inference_tok_s: float | None = typer.Option(
            None, "--inference-tok-s", help="Generated tokens/s of one inference GPU (default: this run's engine)."),
        rows_per_step: float | None = typer.Option(
            None, "--rows-per-step", help="Trajectories per optimizer step (default: the train metrics' rows)."),
        last: int = typer.Option(20, "--last", help="Newest trajectory shards and train steps to calibrate from."),
        as_json: JsonOpt = False,
    ) -> None:
        import dataclasses

        from arlctl.errors import UsageError
        from arlctl.io.fs import get_fs
        from arlctl.plan import Prices, calibrate, ledger, render

        fs, path = get_fs(run)
        if not fs.exists(path):
            raise UsageError(f"run directory {run} does not exist")
        for name, value in (("--target-steps-per-hour", target), ("--inference-tok-s", inference_tok_s),
                            ("--rows-per-step", rows_per_step)):
            if value is not None and value <= 0:
                raise UsageError(f"{name} must be > 0")
        if last < 1:
            raise UsageError("--last must be >= 1")
        rates = calibrate(run, last=last)
        overrides = {k: v for k, v in (("engine_tok_s", inference_tok_s), ("rows_per_step", rows_per_step)) if v}
        if overrides:
            sources = {**rates.sources, **{k: "given on the command line" for k in overrides}}
            rates = dataclasses.replace(rates, **overrides, sources=sources)
        result = ledger(rates, target, Prices(gpu_price, cpu_price, cpus_per_sandbox))
        if as_json:
            print_json({"run": run, **result.to_json()})
            return
        console.print(render(result, run))
        if gpu_price is None or cpu_price is None:
            console.print(plain("give --gpu-hour-price and --cpu-hour-price for the $ rows", style="dim"))
