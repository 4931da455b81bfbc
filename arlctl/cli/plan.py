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

With --model instead of a run: each training mode's bytes on one rank (weights, gradients, AdamW, extra copies, the KL reference, activations of a micro-batch), from the model's config.json built on the meta device, before anything is loaded; whether it trains and loads on --gpus GPUs of --gpu-mem GiB, and the largest model of its proportions each mode could train there.

  arlctl plan --model ~/.cache/arlctl/models/smollm2-135m --gpus 1 --gpu-mem 24

  arlctl plan --model path/to/Llama-3-8B --gpus 8 --gpu-mem 80 --grad-checkpoint --kl
"""


def register(app: typer.Typer) -> None:
    @app.command("plan", help=HELP)
    @handle_errors
    def plan_cmd(
        run: str | None = typer.Argument(None, help="Run directory (local path or fsspec URL)."),
        model: str | None = typer.Option(None, "--model", rich_help_panel="Memory (--model)",
                                         help="Plan training memory for this model (a directory, its config.json or a pulled name) instead of a run."),
        gpus: int = typer.Option(1, "--gpus", rich_help_panel="Memory (--model)", help="Ranks (GPUs) to train on."),
        gpu_mem: float = typer.Option(80.0, "--gpu-mem", rich_help_panel="Memory (--model)", help="GiB on each GPU."),
        micro_tokens: int = typer.Option(8192, "--micro-tokens", rich_help_panel="Memory (--model)",
                                         help="Tokens in one micro-batch (the activations)."),
        kl: bool = typer.Option(False, "--kl", rich_help_panel="Memory (--model)", help="Hold the KL reference (--kl-coef)."),
        grad_checkpoint: bool = typer.Option(False, "--grad-checkpoint", rich_help_panel="Memory (--model)",
                                             help="Activations with gradient checkpointing."),
        lora_rank: int = typer.Option(16, "--lora-rank", rich_help_panel="Memory (--model)", help="Rank of the lora mode's adapters."),
        reserve_gb: float = typer.Option(6.0, "--reserve-gb", rich_help_panel="Memory (--model)",
                                         help="GiB a rank keeps for the CUDA context, the allocator and NCCL."),
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

        if model is not None:
            if run is not None:
                raise UsageError("give a run directory or --model, not both")
            from arlctl.rl import memory_plan

            planned = memory_plan.plan(model, gpus, gpu_mem, micro_tokens, kl, grad_checkpoint, lora_rank, reserve_gb)
            print_json(planned) if as_json else console.print(memory_plan.render(planned))
            return
        if run is None:
            raise UsageError("give a run directory, or --model to plan training memory")
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
